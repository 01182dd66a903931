/* SPDX-License-Identifier: Apache-2.0 */
/* test_store_tiers.c - the residency store on the sim device: the policy's
 * tables (with the spill hysteresis), tiers and budgets, clean drops and
 * dirty saves to pinned RAM, make room (possible, impossible, free all),
 * groups, holds, device faults (allocation, copies), job statistics, empty
 * tensors, a group kept whole when a save fails, and ferry_store_add under
 * every allocation failure. */
#define _GNU_SOURCE
#include "store_common.h"
#include "resid/policy.h"

/* ---- the policy, as tables ---- */

static void test_policy(void)
{
    /* priority first, then least recently used, then id */
    rs_cand c[] = {
        {.priority = 1, .last_use = 5, .bytes = 100, .id = 0},
        {.priority = 0, .last_use = 9, .bytes = 50, .id = 1},
        {.priority = 0, .last_use = 2, .bytes = 30, .id = 2},
        {.priority = 0, .last_use = 1, .bytes = 500, .protect = true, .id = 3},
        {.priority = 2, .last_use = 0, .bytes = 0, .id = 4},
    };
    int64_t out[5];
    uint64_t freed = 0;
    struct {
        uint64_t need;
        int64_t count;
        uint64_t freed;
        int64_t first[3];
    } rows[] = {
        {0, 0, 0, {-1}}, /* nothing asked: nothing evicted */
        {1, 1, 30, {2}}, /* lowest priority, oldest */
        {30, 1, 30, {2}},
        {31, 2, 80, {2, 1}}, /* whole groups: overshoot allowed */
        {81, 3, 180, {2, 1, 0}},
        {180, 3, 180, {2, 1, 0}},
        {181, -1, 180, {-1}},            /* impossible: nothing, says what could be */
        {UINT64_MAX, 3, 180, {2, 1, 0}}, /* free all: everything evictable, protected stays */
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        int64_t k = rs_policy_choose(c, 5, rows[r].need, out, &freed);
        CHECK_EQ(k, rows[r].count);
        CHECK_EQ(freed, rows[r].freed);
        for (int64_t q = 0; q < k && q < 3; q++) CHECK_EQ(out[q], rows[r].first[q]);
        /* the same request again gives the same answer: no loop, no drift */
        int64_t k2 = rs_policy_choose(c, 5, rows[r].need, out, &freed);
        CHECK_EQ(k2, k);
    }
    /* nothing evictable at all, and a request: impossible with 0 */
    rs_cand p[] = {{.bytes = 10, .protect = true}};
    CHECK_EQ(rs_policy_choose(p, 1, 5, out, &freed), -1);
    CHECK_EQ(freed, 0);
    CHECK_EQ(rs_policy_choose(p, 1, UINT64_MAX, out, &freed), 0);
    CHECK_EQ(rs_policy_choose(NULL, 0, UINT64_MAX, out, &freed), 0);

    /* dirty destinations with hysteresis */
    const uint64_t G = 1ull << 30;
    rs_hoststate h = {.host_budget = 4 * G,
                      .pinned_budget = G,
                      .available = 10 * G,
                      .spill_below = 2 * G,
                      .spill_above = 3 * G};
    CHECK_EQ(rs_policy_dest(&h, G / 2), RS_DEST_PINNED);
    h.pinned_used = G;
    CHECK_EQ(rs_policy_dest(&h, G / 2), RS_DEST_HOST); /* pinned budget spent: pageable */
    h.host_used = 4 * G;
    CHECK_EQ(rs_policy_dest(&h, 1), RS_DEST_SPILL); /* host budget spent */
    h.host_used = 0, h.pinned_used = 0;
    h.available = 2 * G - 1; /* below spill_below: spilling starts */
    CHECK_EQ(rs_policy_dest(&h, 1), RS_DEST_SPILL);
    CHECK(h.spilling);
    h.available = 2 * G + G / 2; /* between the thresholds: still spilling */
    CHECK_EQ(rs_policy_dest(&h, 1), RS_DEST_SPILL);
    h.available = 3 * G + 1; /* above spill_above: back to RAM */
    CHECK_EQ(rs_policy_dest(&h, 1), RS_DEST_PINNED);
    CHECK(!h.spilling);
    h.available = 2 * G + G / 2; /* between again, coming from RAM: stays RAM */
    CHECK_EQ(rs_policy_dest(&h, 1), RS_DEST_PINNED);
    h.available = G / 4; /* the tensor itself does not fit in what is available */
    CHECK_EQ(rs_policy_dest(&h, G / 2), RS_DEST_SPILL);
}

/* ---- the store on sim ---- */

static void test_tiers(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    if (!d || !fa || !fb) goto out;
    const uint64_t A = ferry_file_total_bytes(fa), B = ferry_file_total_bytes(fb);
    /* the device holds either model, not both */
    ferry_store *s = mk_store(d, A + B - 1, 64 << 20, 32 << 20);
    if (!s) goto out;
    ferry_model *ma = NULL, *mb = NULL, *dup = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 0, &mb), 0);
    CHECK_EQ(ferry_store_add(s, "a", &fb, 1, 0, &dup), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "already");
    CHECK(ferry_store_find(s, "b") == mb);
    ferry_model_put(mb); /* the find's reference */
    CHECK(ferry_store_find(s, "zz") == NULL);
    CHECK_EQ(ferry_model_find(ma, "blk.3.b"), 7);
    CHECK_EQ(ferry_model_find(ma, "nope"), FERRY_E_NOTFOUND);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_SOURCE), A + B);

    /* groups: a weight and its bias */
    ferry_tensor_state w = {.size = sizeof w}, b = {.size = sizeof b};
    ferry_model_tensor_state(ma, 2, &w);
    ferry_model_tensor_state(ma, 3, &b);
    CHECK_EQ(w.group, b.group);
    ferry_model_tensor_state(ma, 4, &b);
    CHECK(w.group != b.group);

    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), A);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    /* one tensor of b: its group comes with it */
    int64_t one = 0;
    CHECK_EQ(ferry_model_to_device(mb, &one, 1), 0);
    ferry_model_tensor_state(mb, 1, &b);
    CHECK_EQ(b.tier, FERRY_TIER_DEVICE);
    /* all of b: a (least recently used) must make room; clean: dropped, 0 written */
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    CHECK_EQ(st.bytes_written, 0);
    CHECK(st.dropped > 0);
    CHECK_EQ(st.tier_bytes[FERRY_TIER_DEVICE] >= B, 1);
    CHECK(st.tier_bytes[FERRY_TIER_DEVICE] <= A + B - 1);
    CHECK_EQ(verify(mb, fb, -1, 0), 0);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);

    /* dirty: modified on the device, evicted to pinned RAM, back, still modified */
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(ferry_model_mark_dirty(mb, 0), FERRY_E_INVAL); /* b was evicted for a */
    CHECK_EQ(modify(ma, 2, 0x5A), 0);
    ferry_model_tensor_state(ma, 2, &w);
    CHECK(w.dirty);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    ferry_model_tensor_state(ma, 2, &w);
    CHECK_EQ(w.tier, FERRY_TIER_PINNED);
    ferry_model_tensor_state(ma, 4, &w);
    CHECK_EQ(w.tier, FERRY_TIER_SOURCE);
    CHECK_EQ(verify(ma, fa, 2, 0x5A), 0);
    ferry_store_get_stats(s, &st);
    CHECK_EQ(st.bytes_written, 0); /* pinned RAM, not disk */
    ferry_store_get_stats(s, &st);
    CHECK(st.device_cached >= A - 16 * 6); /* the evicted blocks are kept for reuse */
    uint64_t before_dev = 0;
    fy_gpu_sim_usage(fy_device_gpu(d), &before_dev, NULL, NULL);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    uint64_t after_dev = 0;
    fy_gpu_sim_usage(fy_device_gpu(d), &after_dev, NULL, NULL);
    CHECK_EQ(after_dev, before_dev); /* reused: no new device memory */
    CHECK_EQ(verify(ma, fa, 2, 0x5A), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), 0);
    ferry_store_get_stats(s, &st);
    CHECK(st.pinned_pool_bytes > 0); /* pinned once, kept for the next eviction ... */
    uint64_t pin_before = 0, pin_after = 0;
    fy_gpu_sim_usage(fy_device_gpu(d), NULL, &pin_before, NULL);
    CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
    ferry_store_get_stats(s, &st);
    CHECK_EQ(st.pinned_pool_bytes, 0); /* ... until make_room unpins it */
    fy_gpu_sim_usage(fy_device_gpu(d), NULL, &pin_after, NULL);
    CHECK(pin_after < pin_before);

    /* holds: never evicted; free-all frees the rest; impossible requests evict nothing */
    CHECK_EQ(ferry_model_hold(ma, 0), 0);
    uint64_t could = 0;
    int64_t r = ferry_store_make_room(s, A + B + 1, &could);
    CHECK_EQ(r, FERRY_E_BUDGET);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "nothing was evicted");
    CHECK(could > 0 && could <= A + B);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE) >= A, 1);
    r = ferry_store_make_room(s, UINT64_MAX, NULL);
    CHECK(r > 0);
    ferry_model_tensor_state(ma, 0, &w);
    CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
    ferry_model_tensor_state(ma, 1, &b);
    CHECK_EQ(b.tier, FERRY_TIER_DEVICE); /* same group as the held one */
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), w.nbytes + b.nbytes);
    /* again: nothing more to free, no loop */
    CHECK_EQ(ferry_store_make_room(s, UINT64_MAX, NULL), 0);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), FERRY_E_BUSY); /* held */
    CHECK_EQ(ferry_store_remove(ma), FERRY_E_BUSY);
    CHECK_EQ(ferry_model_release(ma, 0), 0);
    CHECK_EQ(ferry_model_release(ma, 0), FERRY_E_INVAL);
    /* possible room: just enough, least recently used first */
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    r = ferry_store_make_room(s, (A + B - 1) - tier_bytes(s, FERRY_TIER_DEVICE) + 1, NULL);
    CHECK(r > 0 && (uint64_t)r < B);
    CHECK_EQ(verify(ma, fa, 2, 0x5A), 0);
    CHECK_EQ(verify(mb, fb, -1, 0), 0);
    CHECK_EQ(ferry_store_remove(mb), 0);
    ferry_store_free(s);
    uint64_t dev = 1, pin = 1, reg = 1;
    fy_gpu_sim_usage(fy_device_gpu(d), &dev, &pin, &reg);
    CHECK_EQ(dev, 0);
    CHECK_EQ(reg, 0);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

static void test_device_faults(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    if (!d || !fa) goto out;
    ferry_store *s = mk_store(d, 0, 64 << 20, 32 << 20);
    ferry_model *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    fy_gpu *g = fy_device_gpu(d);
    /* allocation and copy failures while loading: clean error, nothing left */
    fy_gpu_op ops[] = {FY_OP_MEM_ALLOC, FY_OP_COPY, FY_OP_EVENT};
    for (int o = 0; o < 3; o++)
        for (long nth = 1; nth < 64; nth++) {
            fy_gpu_sim_fault(g, ops[o], nth);
            int rc = ferry_model_to_device(ma, NULL, 0);
            fy_gpu_sim_fault(g, ops[o], 0); /* disarm, whether it fired or not */
            if (rc == 0) {
                CHECK_EQ(verify(ma, fa, -1, 0), 0);
                CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
                break;
            }
            CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), 0);
            CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0); /* gives the kept blocks back */
            uint64_t dev = 1;
            fy_gpu_sim_usage(g, &dev, NULL, NULL);
            CHECK_EQ(dev, 0);
        }
    /* a copy failure while saving a dirty tensor: it stays on the device */
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(modify(ma, 4, 0x77), 0);
    fy_gpu_sim_fault(g, FY_OP_COPY, 1);
    CHECK(ferry_model_evict(ma, NULL, 0) < 0);
    fy_gpu_sim_fault(g, FY_OP_COPY, 0);
    ferry_tensor_state w = {.size = sizeof w};
    ferry_model_tensor_state(ma, 4, &w);
    CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
    CHECK_EQ(verify(ma, fa, 4, 0x77), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED) + tier_bytes(s, FERRY_TIER_HOST), 0);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(verify(ma, fa, 4, 0x77), 0);
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_device_close(d);
}

static void test_jobs(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    if (!d || !fa) goto out;
    ferry_store *s = mk_store(d, 0, 64 << 20, 32 << 20);
    ferry_model *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    ferry_job_stats js = {.size = sizeof js};
    CHECK_EQ(ferry_store_job_end(s, &js), FERRY_E_INVAL);
    CHECK_EQ(ferry_store_job_begin(s, "load"), 0);
    CHECK_EQ(ferry_store_job_begin(s, "again"), FERRY_E_BUSY);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(ferry_store_job_end(s, &js), 0);
    CHECK(ferry_store_job_name(s) && strcmp(ferry_store_job_name(s), "load") == 0);
    CHECK(js.seconds > 0);
    CHECK(js.rss.peak >= js.rss.start && js.rss.peak >= js.rss.end && js.rss.start > 0);
    CHECK(js.pss.peak > 0 && js.uss.peak > 0);
    CHECK_EQ(js.device_bytes, ferry_file_total_bytes(fa));
    CHECK_EQ(js.bytes_htod, ferry_file_total_bytes(fa));
    CHECK_EQ(js.bytes_read, ferry_file_total_bytes(fa));
    CHECK_EQ(js.bytes_written, 0);
    CHECK_EQ(ferry_store_job_begin(s, "drop"), 0);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(ferry_store_job_end(s, &js), 0);
    CHECK_EQ(js.evicted, (uint64_t)ferry_model_tensor_count(ma));
    CHECK_EQ(js.dropped, js.evicted);
    CHECK_EQ(js.bytes_dtoh, 0);
    CHECK_EQ(js.device_bytes, 0);
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_device_close(d);
}

/* Review findings (all fixed): a dirty tensor that could not be saved keeps
 * its whole group on the device; empty tensors move and evict without
 * spill ranges or pool slots; ferry_store_add survives every allocation
 * failure. */
static void test_review(ferry_ctx *ctx)
{
    char p[512];
    snprintf(p, sizeof p, "%s/z.safetensors", dir);
    FILE *f = fopen(p, "wb");
    const char hdr[] = "{\"z.a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                       "\"z.b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}";
    uint64_t hl = sizeof hdr - 1;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    fwrite("01234567", 1, 8, f);
    fclose(f);
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fz = open_model(ctx, "z.safetensors"), *fa = open_model(ctx, "a.safetensors");
    if (!d || !fz || !fa) goto out;
    for (int ram = 0; ram < 2; ram++) {
        ferry_store *s = mk_store(d, 0, ram ? 64 << 20 : 1, ram ? 32 << 20 : 1);
        ferry_model *mz = NULL, *ma = NULL;
        CHECK_EQ(ferry_store_add(s, "z", &fz, 1, 0, &mz), 0);
        CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
        if (!mz || !ma) {
            ferry_store_free(s);
            continue;
        }
        /* only the empty tensor (its own group "z" holds both: a alone) */
        int64_t za = ferry_model_find(mz, "z.a");
        int64_t one[] = {za};
        CHECK_EQ(ferry_model_group(mz, NULL, 0), 0);
        CHECK_EQ(ferry_model_to_device(mz, one, 1), 0);
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(mz, za, &st);
        CHECK_EQ(st.tier, FERRY_TIER_DEVICE);
        CHECK_EQ(ferry_model_mark_dirty(mz, za), 0);
        CHECK_EQ(ferry_model_evict(mz, NULL, 0), 0); /* nothing to save: no spill range, no pool slot */
        CHECK_EQ(ferry_model_to_device(mz, NULL, 0), 0);
        CHECK_EQ(ferry_model_mark_dirty(mz, za), 0);
        CHECK_EQ(ferry_model_evict(mz, NULL, 0), 0);
        CHECK_EQ(verify(mz, fz, -1, 0), 0);
        if (ram) {
            CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
            ferry_store_stats ss = {.size = sizeof ss};
            ferry_store_get_stats(s, &ss);
            CHECK_EQ(ss.pinned_pool_bytes, 0);
        } else {
            /* a failed save keeps the group together: blk.0.w dirty, its bias clean */
            CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
            CHECK_EQ(modify(ma, 0, 0x42), 0);
            fy_fault_arm(1, ENOSPC);
            CHECK(ferry_model_evict(ma, NULL, 0) < 0);
            fy_fault_arm(0, 0);
            ferry_tensor_state w = {.size = sizeof w}, b = {.size = sizeof b};
            ferry_model_tensor_state(ma, 0, &w);
            ferry_model_tensor_state(ma, 1, &b);
            CHECK_EQ(w.group, b.group);
            CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
            CHECK_EQ(b.tier, FERRY_TIER_DEVICE); /* not dropped without its weight */
            CHECK_EQ(verify(ma, fa, 0, 0x42), 0);
            CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
            CHECK_EQ(verify(ma, fa, 0, 0x42), 0);
        }
        ferry_store_free(s);
    }
out:
    ferry_file_close(fz);
    ferry_file_close(fa);
    ferry_device_close(d);
}

static void test_add_oom(void)
{
    ferry_ctx_opts co = {.size = sizeof co, .allocator = COUNTING_ALLOCATOR_INIT};
    ferry_ctx *ctx = NULL;
    CHECK_EQ(ferry_ctx_new(&co, &ctx), 0);
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = ctx ? open_model(ctx, "a.safetensors") : NULL;
    ferry_store *s = d ? mk_store(d, 0, 64 << 20, 32 << 20) : NULL;
    int failures = 0;
    for (long nth = 1; s && fa && nth < 100; nth++) {
        ferry_model *m = NULL;
        alloc_arm(nth);
        int rc = ferry_store_add(s, "a", &fa, 1, 0, &m);
        alloc_arm(0);
        if (rc == 0) {
            CHECK(m != NULL);
            CHECK_EQ(ferry_store_remove(m), 0);
            break;
        }
        failures++;
        CHECK_EQ(rc, -ENOMEM);
        CHECK(m == NULL);
        CHECK(ferry_store_find(s, "a") == NULL);
    }
    CHECK(failures >= 4);
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_device_close(d);
    ferry_ctx_free(ctx);
    CHECK_EQ(atomic_load(&live), 0); /* every failed add gave back what it had */
}

#define CASES(CASE)                              \
    CASE(policy, test_policy())                  \
    CASE(tiers, test_tiers(ctx))                 \
    CASE(device_faults, test_device_faults(ctx)) \
    CASE(jobs, test_jobs(ctx))                   \
    CASE(review, test_review(ctx))               \
    CASE(add_oom, test_add_oom())
CHECK_CASES_MAIN(CASES, store_main)
