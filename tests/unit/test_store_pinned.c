/* SPDX-License-Identifier: Apache-2.0 */
/* test_store_pinned.c - the store's pinned pool: clean copies kept in it
 * (ferry_model_set_pinned_cache) and the reserve pinned ahead
 * (opts.pinned_reserve). */
#define _GNU_SOURCE
#include "store_common.h"

/* ferry_model_set_pinned_cache: a clean model that leaves the device keeps a
 * pinned copy, so coming back reads nothing from its checkpoint (a model
 * swap is one DMA); the copies give way when the budgets are short, go with
 * mark_dirty and when the flag goes off. */
static uint64_t cache_bytes(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.pinned_cache_bytes;
}

static void test_pinned_cache(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    if (!d || !fa || !fb) goto out;
    const uint64_t A = ferry_file_total_bytes(fa), B = ferry_file_total_bytes(fb);
    /* the device holds either model, not both; the pinned budget both */
    ferry_store *s =
        mk_store(d, (A > B ? A : B) + 4096, 64 << 20, A + B + (1 << 20)); /* (the pool rounds up) */
    if (!s) goto out;
    ferry_model *ma = NULL, *mb = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 0, &mb), 0);
    CHECK_EQ(ferry_model_set_pinned_cache(ma, 2), FERRY_E_INVAL);
    CHECK_EQ(ferry_model_set_pinned_cache(NULL, 1), FERRY_E_INVAL);
    CHECK_EQ(ferry_model_set_pinned_cache(ma, 1), 0);
    CHECK_EQ(ferry_model_set_pinned_cache(mb, 1), 0);

    /* first loads read the checkpoints, and keep copies beside the device's */
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(cache_bytes(s), A);
    ferry_tensor_state st = {.size = sizeof st};
    CHECK_EQ(ferry_model_tensor_state(ma, 0, &st), 0);
    CHECK(st.cached && st.tier == FERRY_TIER_DEVICE);
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0); /* a leaves: to PINNED, 0 bytes written */
    CHECK_EQ(cache_bytes(s), A + B);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), A);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    /* swaps after that read nothing */
    uint64_t r0 = bytes_read(s);
    for (int k = 0; k < 3; k++) {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), B);
        CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
        CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), A);
    }
    CHECK_EQ(bytes_read(s), r0);
    ferry_store_stats ss = {.size = sizeof ss};
    ferry_store_get_stats(s, &ss);
    CHECK_EQ(ss.bytes_written, 0);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    CHECK_EQ(verify(mb, fb, -1, 0), 0);

    /* a modified tensor's copy is stale: it goes, and the tensor is saved dirty */
    CHECK_EQ(modify(mb, 2, 0x33), 0);
    CHECK_EQ(ferry_model_tensor_state(mb, 2, &st), 0);
    CHECK(!st.cached && st.dirty);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(verify(mb, fb, 2, 0x33), 0);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);

    /* off: the copies go (a's device tensors lose theirs, b's clean pinned
     * ones go back to SOURCE, its dirty one stays saved) */
    CHECK_EQ(ferry_model_set_pinned_cache(ma, 0), 0);
    CHECK_EQ(ferry_model_set_pinned_cache(mb, 0), 0);
    CHECK_EQ(cache_bytes(s), 0);
    CHECK_EQ(ferry_model_tensor_state(mb, 2, &st), 0);
    CHECK(st.dirty && st.tier == FERRY_TIER_PINNED);
    CHECK_EQ(ferry_model_tensor_state(mb, 4, &st), 0);
    CHECK_EQ(st.tier, FERRY_TIER_SOURCE);
    CHECK_EQ(verify(mb, fb, 2, 0x33), 0);
    /* without the flag a swap reads the checkpoint again */
    r0 = bytes_read(s);
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK(bytes_read(s) > r0);
    CHECK_EQ(cache_bytes(s), 0);
    ferry_store_free(s);

    /* a pinned budget that holds one model: the other's copies are not made */
    s = mk_store(d, (A > B ? A : B) + 4096, 64 << 20, A + 4096);
    if (!s) goto out;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 0, &mb), 0);
    CHECK_EQ(ferry_model_set_pinned_cache(ma, 1), 0);
    CHECK_EQ(ferry_model_set_pinned_cache(mb, 1), 0);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    CHECK(cache_bytes(s) <= A + 4096);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    CHECK_EQ(verify(mb, fb, -1, 0), 0);
    /* a device copy fault while a cached model comes back: nothing lost */
    fy_gpu *g = fy_device_gpu(d);
    CHECK(fy_gpu_sim_fault(g, FY_OP_COPY, 1) >= 0);
    CHECK(ferry_model_to_device(ma, NULL, 0) < 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, 0), 0);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(verify(ma, fa, -1, 0), 0);
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* opts.pinned_reserve: the pool pinned ahead by the store's pinner, used by
 * dirty evictions without pinning more, kept through make_room, capped at
 * pinned_budget; a pinning failure stops the reserve, the store works on. */
static void test_pinned_reserve(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    if (!d || !fa) goto out;
    fy_gpu *g = fy_device_gpu(d);
    const uint64_t A = ferry_file_total_bytes(fa),
                   R = 3ull << 20; /* 3 MiB: room for a (0.6 MB) several times */
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = 64 << 20,
                          .pinned_budget = 32 << 20,
                          .pinned_reserve = R,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2};
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (!s) goto out;
    CHECK_EQ(ferry_store_wait_pinned(s), 0);
    CHECK_EQ(ferry_store_wait_pinned(s), 0); /* again: at once */
    ferry_store_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_stats(s, &st), 0);
    CHECK_EQ(st.pinned_reserve, R);
    CHECK_EQ(st.pinned_reserved, R);
    CHECK_EQ(st.pinned_pool_bytes, R);
    uint64_t pinned = 0;
    fy_gpu_sim_usage(g, NULL, &pinned, NULL);
    CHECK(pinned >= R);
    ferry_model *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    for (int cycle = 0; cycle < 2; cycle++) {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        for (int64_t t = 0; t < ferry_model_tensor_count(ma); t++)
            CHECK_EQ(modify(ma, t, (uint8_t)(0x30 + t)), 0);
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        /* every dirty byte landed in the reserve: nothing pageable, no more pinned */
        CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), A);
        CHECK_EQ(tier_bytes(s, FERRY_TIER_HOST), 0);
        uint64_t now = 0;
        fy_gpu_sim_usage(g, NULL, &now, NULL);
        CHECK_EQ(now, pinned);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        for (int64_t t = 0; t < ferry_model_tensor_count(ma); t++) { /* each modified once per cycle */
            ferry_tensor_state w = {.size = sizeof w};
            ferry_model_tensor_state(ma, t, &w);
            CHECK(w.dirty);
            uint8_t *a = malloc(w.nbytes + 1), *b = malloc(w.nbytes + 1);
            if (!a || !b) {
                free(a);
                free(b);
                CHECK(0);
                continue;
            }
            CHECK_EQ(ferry_model_read(ma, t, a), 0);
            CHECK_EQ(ferry_file_tensor_read(fa, t, 0, b, w.nbytes), 0);
            uint8_t x = cycle ? 0 : (uint8_t)(0x30 + t); /* modify XORs: twice is the file again */
            uint64_t bad = 0;
            for (uint64_t j = 0; j < w.nbytes; j++) bad += a[j] != (uint8_t)(b[j] ^ x);
            CHECK_EQ(bad, 0);
            free(a);
            free(b);
        }
        /* make_room unpins what the pool does not use, never the reserve */
        CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
        CHECK_EQ(ferry_store_get_stats(s, &st), 0);
        CHECK_EQ(st.pinned_pool_bytes, R);
    }
    ferry_store_free(s);
    s = NULL;
    uint64_t left = 1;
    fy_gpu_sim_usage(g, NULL, &left, NULL);
    CHECK_EQ(left, 0);

    /* capped at pinned_budget */
    o.pinned_budget = 1 << 20;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (s) {
        CHECK_EQ(ferry_store_wait_pinned(s), 0);
        CHECK_EQ(ferry_store_get_stats(s, &st), 0);
        CHECK_EQ(st.pinned_reserve, 1u << 20);
        CHECK_EQ(st.pinned_pool_bytes, 1u << 20);
        ferry_store_free(s);
        s = NULL;
    }

    /* the pinning fails: the reserve stops, wait_pinned says why, evictions
     * pin on demand, and nothing is left pinned at the end */
    o.pinned_budget = 32 << 20;
    CHECK(fy_gpu_sim_fault(g, FY_OP_HOST_ALLOC, 1) >= 0);
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (s) {
        CHECK(ferry_store_wait_pinned(s) < 0);
        CHECK_STR_HAS(ferry_store_errmsg(s), "pinning the pool ahead stopped after 0 of");
        CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_HOST_ALLOC, 0), 0);
        CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(modify(ma, 2, 0x44), 0);
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        CHECK(tier_bytes(s, FERRY_TIER_PINNED) > 0);
        CHECK_EQ(ferry_store_get_stats(s, &st), 0);
        CHECK_EQ(st.pinned_reserved, 0);
        CHECK_EQ(verify(ma, fa, 2, 0x44), 0);
        ferry_store_free(s);
        s = NULL;
    }
    fy_gpu_sim_fault(g, FY_OP_HOST_ALLOC, 0);

    /* an eviction while the reserve (twelve pieces) is still being pinned
     * waits for a piece rather than pinning its own: what is pinned in the
     * end is the reserve, no more, and nothing went to pageable RAM */
    o.pinned_budget = 4ull << 30;
    o.host_budget = 8ull << 30;
    o.pinned_reserve = 3ull << 30;
    CHECK_EQ(fy_gpu_sim_pin_rate(g, 4ull << 30), 0); /* a piece (256 MiB) takes 62 ms */
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (s) {
        CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(modify(ma, 1, 0x21), 0);
        CHECK_EQ(ferry_store_get_stats(s, &st), 0);
        CHECK(st.pinned_reserved < st.pinned_reserve); /* still pinning: the eviction has to wait */
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        CHECK(tier_bytes(s, FERRY_TIER_PINNED) > 0);
        CHECK_EQ(tier_bytes(s, FERRY_TIER_HOST), 0);
        CHECK_EQ(ferry_store_wait_pinned(s), 0);
        fy_gpu_sim_usage(g, NULL, &left, NULL);
        CHECK_EQ(left, 3ull << 30);
        CHECK_EQ(ferry_store_get_stats(s, &st), 0);
        CHECK_EQ(st.pinned_pool_bytes, 3ull << 30);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(verify(ma, fa, 1, 0x21), 0);
        ferry_store_free(s);
        s = NULL;
    }
    CHECK_EQ(fy_gpu_sim_pin_rate(g, 0), 0);

    /* the pinner pins between transfers, not beside them: a load that takes
     * 0.6 s (a modelled 1 MB/s) sees at most the piece under way when it
     * started finish (25 ms each, 0.3 s for all twelve), the rest after it */
    ferry_device *slow = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB,1MB/s", &slow), 0);
    if (slow) {
        CHECK_EQ(fy_gpu_sim_pin_rate(fy_device_gpu(slow), 10ull << 30), 0);
        CHECK_EQ(ferry_store_new(slow, &o, &s), 0);
        if (s) {
            CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
            CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
            CHECK_EQ(ferry_store_get_stats(s, &st), 0);
            CHECK(st.pinned_reserved <= 512ull << 20);
            CHECK_EQ(ferry_store_wait_pinned(s), 0);
            CHECK_EQ(ferry_store_get_stats(s, &st), 0);
            CHECK_EQ(st.pinned_reserved, 3ull << 30);
            ferry_store_free(s);
            s = NULL;
        }
        ferry_device_close(slow);
    }

    /* freed while the pinner still works (a reserve of many pieces): it stops, nothing leaks */
    o.pinned_budget = 8ull << 30;
    o.host_budget = 8ull << 30;
    o.pinned_reserve = 6ull << 30;
    ferry_device *big = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &big), 0);
    if (big) {
        CHECK_EQ(fy_gpu_sim_pin_rate(fy_device_gpu(big), 2ull << 30), 0); /* 0.125 s a piece, 3 s in all */
        double t0 = now_s();
        CHECK_EQ(ferry_store_new(big, &o, &s), 0);
        ferry_store_free(s);
        CHECK(now_s() - t0 <
              2.0); /* it stopped after the piece it was pinning (0.125 s), not after 24 (3 s) */
        s = NULL;
        fy_gpu_sim_usage(fy_device_gpu(big), NULL, &left, NULL);
        CHECK_EQ(left, 0);
        ferry_device_close(big);
    }
out:
    ferry_file_close(fa);
    ferry_device_close(d);
}

#define CASES(CASE)                            \
    CASE(pinned_cache, test_pinned_cache(ctx)) \
    CASE(pinned_reserve, test_pinned_reserve(ctx))
CHECK_CASES_MAIN(CASES, store_main)
