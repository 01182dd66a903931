/* SPDX-License-Identifier: Apache-2.0 */
/* test_store.c - the residency store on the sim device: the policy's tables,
 * tiers and budgets, clean drops and dirty saves (pinned, host, spill), make
 * room (possible, impossible, free all), groups, holds, faults (device
 * allocation, copies, fallocate, pwrite), a spill batch that fails for space
 * (all it reserved given back; on a real small file system where root can
 * loop-mount one), job statistics, kill -9 during a spill, and several
 * threads at once. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "ferry.h"
#include "io/io.h"
#include "resid/policy.h"
#include "xfer/xfer_test.h"

static char dir[256], spill_dir[300];

static uint8_t byte_at(uint32_t seed, int t, uint64_t j)
{
    return (uint8_t)((seed * 131u + (uint32_t)t * 7919u + j * 31u) >> 3);
}

/* Start a safetensors file dir/name: its header hdr (h bytes; hdr has room for
 * 7 more) padded to 8 bytes, then the open file for its data; path gets its
 * path. */
static FILE *start_checkpoint(const char *name, char *hdr, size_t h, char path[512])
{
    while (h % 8) hdr[h++] = ' ';
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    return f;
}

/* A safetensors file of nblk modules "blk.K" with a weight (wbytes) and a bias
 * (16 bytes), U8. */
static void write_model(const char *name, int nblk, uint64_t wbytes, uint32_t seed)
{
    char hdr[65536], path[512];
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int k = 0; k < nblk; k++) {
        h += (size_t)snprintf(
            hdr + h, sizeof hdr - h,
            "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64
            "]},\"blk.%d.b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
            k ? "," : "", k, wbytes, off, off + wbytes, k, off + wbytes, off + wbytes + 16);
        off += wbytes + 16;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = start_checkpoint(name, hdr, h, path);
    for (int k = 0; k < 2 * nblk; k++) {
        uint64_t n = k % 2 ? 16 : wbytes;
        for (uint64_t j = 0; j < n; j++) fputc(byte_at(seed, k, j), f);
    }
    fclose(f);
}

static ferry_file *open_model(ferry_ctx *ctx, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    return f;
}

/* every tensor of m reads back as expected: the file's bytes, or, for tensor
 * `mod` (>= 0), the file's XOR x */
static int verify(ferry_model *m, ferry_file *f, int64_t mod, uint8_t x)
{
    int bad = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        uint8_t *a = malloc(st.nbytes + 1), *b = malloc(st.nbytes + 1);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(f, i, 0, b, st.nbytes);
        if (i == mod)
            for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0) {
            fprintf(stderr, "verify: %s (tier %s) differs (%d %d)\n", st.name, ferry_tier_name(st.tier), r1,
                    r2);
            bad++;
        }
        free(a);
        free(b);
    }
    return bad;
}

static uint64_t tier_bytes(ferry_store *s, ferry_tier t)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.tier_bytes[t];
}

static int modify(ferry_model *m, int64_t t, uint8_t x)
{
    ferry_tensor_state st = {.size = sizeof st};
    ferry_model_tensor_state(m, t, &st);
    uint8_t *b = malloc(st.nbytes);
    int rc = ferry_model_read(m, t, b);
    for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
    if (rc == 0) rc = ferry_model_write(m, t, b);
    free(b);
    return rc;
}

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

static ferry_store *mk_store(ferry_device *d, uint64_t dev_budget, uint64_t host_budget,
                             uint64_t pinned_budget)
{
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = dev_budget,
                          .host_budget = host_budget,
                          .pinned_budget = pinned_budget,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2}; /* the host's real free memory does not decide here */
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
    o.load = &lo;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    return s;
}

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

static int files_in(const char *path)
{
    DIR *dd = opendir(path);
    if (!dd) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(dd);
    return n;
}

static void test_spill(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    if (!d || !fa) goto out;
    /* a host budget of 1 byte: dirty tensors must spill */
    ferry_store *s = mk_store(d, 0, 1, 1);
    ferry_model *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    if (!ma) goto free_store;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(modify(ma, 2, 0x33), 0);
    CHECK_EQ(modify(ma, 3, 0x33 ^ 0x33), 0); /* written with equal bytes: still dirty */

    /* faults while spilling: fallocate (no space) then pwrite (I/O error): nothing is lost */
    int errs[] = {ENOSPC, EIO};
    for (int e = 0; e < 2; e++) {
        for (long nth = 1; nth < 40; nth++) {
            fy_fault_arm(nth, errs[e]);
            int rc = ferry_model_evict(ma, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (!fired) {
                CHECK_EQ(rc, 0);
                break;
            }
            CHECK(rc < 0);
            ferry_tensor_state w = {.size = sizeof w};
            ferry_model_tensor_state(ma, 2, &w);
            CHECK_EQ(w.tier, FERRY_TIER_DEVICE); /* the dirty tensor stayed */
            CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
            CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        }
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        ferry_store_stats st = {.size = sizeof st};
        ferry_store_get_stats(s, &st);
        CHECK(st.bytes_written >= w.nbytes);
        CHECK(st.spill_file_bytes >= w.nbytes);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0); /* back from the spill file */
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        ferry_store_get_stats(s, &st);
        CHECK(st.spill_file_bytes >= w.nbytes); /* kept allocated for the next spill ... */
        CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
        ferry_store_get_stats(s, &st);
        CHECK_EQ(st.spill_file_bytes, 0); /* ... until make_room gives it back: the file is cut */
    }
    CHECK_EQ(files_in(spill_dir), 0); /* the spill file has no name */
    /* a read error while bringing a spilled tensor back: a clean error, the
     * tensor stays in the spill file, nothing allocated stays behind */
    {
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        for (long nth = 1; nth < 200; nth++) {
            fy_fault_arm(nth, EIO);
            int rc = ferry_model_to_device(ma, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (!fired) {
                CHECK_EQ(rc, 0);
                break;
            }
            CHECK(rc < 0);
            ferry_model_tensor_state(ma, 2, &w);
            CHECK_EQ(w.tier, FERRY_TIER_SPILL);
            CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), 0);
            CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        }
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
    }
    /* a failed reservation for one tensor must not release another tensor's
     * spilled range (the simulate scenarios reach this too) */
    {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
        CHECK_EQ(modify(ma, 0, 0x0F), 0); /* blk.0.w (already modified 2 stays dirty) */
        int64_t g0 = 0, g1 = 2;
        CHECK_EQ(ferry_model_evict(ma, &g0, 1), 0); /* blk.0 spilled */
        fy_fault_arm(1, ENOSPC);
        CHECK(ferry_model_evict(ma, &g1, 1) < 0); /* blk.1's reservation fails */
        fy_fault_arm(0, 0);
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 0, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        uint8_t *a = malloc(w.nbytes), *b = malloc(w.nbytes);
        CHECK_EQ(ferry_model_read(ma, 0, a), 0);
        CHECK_EQ(ferry_file_tensor_read(fa, 0, 0, b, w.nbytes), 0);
        for (uint64_t j = 0; j < w.nbytes; j++) b[j] ^= 0x0F;
        CHECK(memcmp(a, b, w.nbytes) == 0);
        free(a);
        free(b);
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        ferry_model_tensor_state(ma, 0, &w);
        CHECK(w.dirty);
    }
free_store:
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_device_close(d);
}

static void test_refused_tmpfs(ferry_ctx *ctx)
{
    if (access("/dev/shm", W_OK) != 0) return;
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = "/dev/shm",
                          .spill_below = 1,
                          .spill_above = 2};
    ferry_store *s = NULL;
    ferry_model *ma = NULL;
    if (d && fa && ferry_store_new(d, &o, &s) == 0 && ferry_store_add(s, "a", &fa, 1, 0, &ma) == 0) {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(modify(ma, 0, 0x11), 0);
        CHECK(ferry_model_evict(ma, NULL, 0) < 0);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "tmpfs");
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 0, &w);
        CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
        CHECK_EQ(verify(ma, fa, 0, 0x11), 0);
    }
    ferry_store_free(s);
    ferry_file_close(fa);
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

/* ---- a spill batch that fails for space ---- */

/* The store's spill file: this process's descriptor whose link is in sd (an
 * O_TMPFILE shows as "sd/#ino (deleted)"), or -1. */
static int spill_fd_in(const char *sd)
{
    DIR *dd = opendir("/proc/self/fd");
    if (!dd) return -1;
    int fd = -1;
    size_t n = strlen(sd);
    struct dirent *e;
    while (fd < 0 && (e = readdir(dd))) {
        char link[300], target[1024];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = '\0';
        if (strncmp(target, sd, n) == 0 && target[n] == '/') fd = atoi(e->d_name);
    }
    closedir(dd);
    return fd;
}

/* Bytes of data the spill file in sd has allocated, 0 when there is none:
 * its extents (FIEMAP), so that the file system's own metadata is not
 * counted (ext4 keeps an extent-tree block once a file had more than four
 * extents, after a truncate too); st_blocks where FIEMAP is missing. With
 * FIEMAP, st_blocks is checked to be within two blocks of metadata of it. */
static uint64_t spill_blocks_in(const char *sd)
{
    int fd = spill_fd_in(sd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return 0;
    const uint64_t blocks = (uint64_t)st.st_blocks * 512;
    union {
        struct fiemap f;
        char b[sizeof(struct fiemap) + 64 * sizeof(struct fiemap_extent)];
    } u;
    uint64_t data = 0, start = 0;
    for (;;) {
        memset(&u, 0, sizeof u);
        u.f.fm_start = start;
        u.f.fm_length = FIEMAP_MAX_OFFSET;
        u.f.fm_flags = FIEMAP_FLAG_SYNC;
        u.f.fm_extent_count = 64;
        if (ioctl(fd, FS_IOC_FIEMAP, &u.f) < 0) return blocks;
        if (u.f.fm_mapped_extents == 0) break;
        const struct fiemap_extent *e = u.f.fm_extents;
        for (uint32_t i = 0; i < u.f.fm_mapped_extents; i++) data += e[i].fe_length;
        const struct fiemap_extent *last = &e[u.f.fm_mapped_extents - 1];
        if (last->fe_flags & FIEMAP_EXTENT_LAST) break;
        start = last->fe_logical + last->fe_length;
    }
    CHECK(blocks >= data && blocks <= data + 2 * (uint64_t)st.st_blksize);
    return data;
}

static uint64_t spill_file_bytes(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.spill_file_bytes;
}

/* fallocate through the table: reservations (mode 0) counted, the
 * falloc_fail_at-th of them failing with ENOSPC (0: none); punches pass. */
static atomic_int falloc_calls, falloc_fail_at;
static int nth_fallocate(int fd, int mode, off_t off, off_t len)
{
    if (mode == 0 && atomic_fetch_add(&falloc_calls, 1) + 1 == atomic_load(&falloc_fail_at)) {
        errno = ENOSPC;
        return -1;
    }
    return fallocate(fd, mode, off, len);
}

/* fstatfs through the table: the real answer, with fake_free bytes free when
 * fake_free is set, or fake_extra bytes more than the real free space. */
static _Atomic uint64_t fake_free, fake_extra;
static int fake_fstatfs(int fd, struct statfs *sf)
{
    if (fstatfs(fd, sf) < 0) return -1;
    uint64_t f = atomic_load(&fake_free);
    sf->f_bavail +=
        (fsblkcnt_t)(atomic_load(&fake_extra) / (uint64_t)(sf->f_frsize ? sf->f_frsize : sf->f_bsize));
    if (f) {
        sf->f_frsize = 4096;
        sf->f_bavail = (fsblkcnt_t)(f / 4096);
    }
    return 0;
}

/* Every tensor of m makes its file's bytes XOR x; and, as tensors < nb
 * (every one when nb < 0), it is in tier t. */
static int check_xor(ferry_model *m, ferry_file *f, uint8_t x, int64_t nb, ferry_tier t)
{
    int bad = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        uint8_t *a = malloc(st.nbytes + 1), *b = malloc(st.nbytes + 1);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(f, i, 0, b, st.nbytes);
        for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0 || ((nb < 0 || i < nb) && st.tier != t)) {
            fprintf(stderr, "check_xor: %s (tier %s) differs (%d %d)\n", st.name, ferry_tier_name(st.tier),
                    r1, r2);
            bad++;
        }
        free(a);
        free(b);
    }
    return bad;
}

/* Mark every tensor of m dirty by changing it (XOR x); returns the bytes its
 * spill needs (each tensor rounded up to the spill file's 4 KiB). */
static uint64_t dirty_all(ferry_model *m, uint8_t x)
{
    uint64_t need = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        CHECK_EQ(modify(m, i, x), 0);
        need += (st.nbytes + 4095) / 4096 * 4096;
    }
    return need;
}

/* The N-th reservation of a batch fails with ENOSPC, for every N: the batch
 * gives back all it reserved before returning (the spill file's blocks as
 * before; while freed ranges were held for reuse, those go back too), every
 * tensor stays on the device with its bytes, another model's spilled tensor is
 * untouched, and the message gives the batch's total. */
static void test_spill_batch_enospc(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    ferry_store *s = d ? mk_store(d, 0, 1, 1) : NULL;
    ferry_model *ma = NULL, *mb = NULL;
    if (!s || !fa || !fb) goto out;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 0, &mb), 0);
    if (!ma || !mb) goto out;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    /* b's first weight is spilled first: the batch reserves around it */
    CHECK_EQ(modify(mb, 0, 0x77), 0);
    int64_t g0 = 0;
    CHECK_EQ(ferry_model_evict(mb, &g0, 1), 0);
    const uint64_t b_bytes = spill_file_bytes(s), b_blocks = spill_blocks_in(spill_dir);
    CHECK_EQ(b_bytes, (130001 + 4095) / 4096 * 4096);
    CHECK(b_blocks >= b_bytes);
    uint8_t x = 0x5A;
    const uint64_t total = dirty_all(ma, x);
    const int64_t nt = ferry_model_tensor_count(ma);
    char want[64];
    snprintf(want, sizeof want, "%" PRId64 " dirty tensors (%" PRIu64 " bytes", nt, total);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    for (int held = 0; held < 2; held++) {
        int nth;
        for (nth = 1; nth < 64; nth++) {
            if (held) { /* a spilled and back: its ranges are free, their blocks kept for the next spill */
                atomic_store(&falloc_fail_at, 0);
                CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
                CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
                CHECK_EQ(spill_file_bytes(s), b_bytes + total);
                CHECK(spill_blocks_in(spill_dir) >= b_bytes + total);
            }
            const uint64_t blocks0 = spill_blocks_in(spill_dir), bytes0 = spill_file_bytes(s);
            atomic_store(&falloc_calls, 0);
            atomic_store(&falloc_fail_at, nth);
            int rc = ferry_model_evict(ma, NULL, 0);
            atomic_store(&falloc_fail_at, 0);
            if (atomic_load(&falloc_calls) < nth) { /* no reservation failed */
                CHECK_EQ(rc, 0);
                CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_SPILL), 0);
                CHECK_EQ(spill_file_bytes(s), b_bytes + total);
                CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
                break;
            }
            CHECK_EQ(rc, -ENOSPC);
            const char *m = ferry_ctx_errmsg(ctx);
            CHECK_STR_HAS(m, want); /* the batch's total, not what was left */
            CHECK_STR_HAS(m, spill_dir);
            CHECK_STR_HAS(m, "stay on the device");
            /* everything the batch reserved is given back; held ranges too */
            CHECK_EQ(spill_blocks_in(spill_dir), held ? b_blocks : blocks0);
            CHECK_EQ(spill_file_bytes(s), held ? b_bytes : bytes0);
            CHECK_EQ(tier_bytes(s, FERRY_TIER_SPILL), 130001);
            CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_DEVICE), 0);
            CHECK_EQ(verify(mb, fb, 0, 0x77), 0);
        }
        CHECK_EQ(nth, nt + 1); /* one reservation a tensor */
    }
    fy_sys_reset();
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_SPILL), 0);
    CHECK_EQ(verify(mb, fb, 0, 0x77), 0);
out:
    fy_sys_reset();
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* A batch larger than the free space (as fstatfs says) fails before any of it
 * is reserved, with a message naming the directory, the total and the bytes
 * free; one that fits goes through. */
static void test_spill_batch_room(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store *s = d ? mk_store(d, 0, 1, 1) : NULL;
    ferry_model *ma = NULL;
    if (!s || !fa) goto out;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    if (!ma) goto out;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    const uint64_t total = dirty_all(ma, 0x21);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    atomic_store(&fake_free, total - 4096);
    atomic_store(&falloc_calls, 0);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), -ENOSPC);
    CHECK_EQ(atomic_load(&falloc_calls), 0); /* nothing reserved */
    const char *m = ferry_ctx_errmsg(ctx);
    char want[96];
    CHECK_STR_HAS(m, spill_dir);
    snprintf(want, sizeof want, "%" PRIu64 " bytes needed, %" PRIu64 " bytes free", total, total - 4096);
    CHECK_STR_HAS(m, want);
    CHECK_STR_HAS(m, "stay on the device");
    CHECK_EQ(spill_blocks_in(spill_dir), 0);
    CHECK_EQ(spill_file_bytes(s), 0);
    CHECK_EQ(check_xor(ma, fa, 0x21, -1, FERRY_TIER_DEVICE), 0);
    /* exactly enough */
    atomic_store(&fake_free, total);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(atomic_load(&falloc_calls), (int)ferry_model_tensor_count(ma));
    CHECK_EQ(check_xor(ma, fa, 0x21, -1, FERRY_TIER_SPILL), 0);
    CHECK_EQ(spill_file_bytes(s), total);
out:
    fy_sys_reset();
    atomic_store(&fake_free, 0);
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_device_close(d);
}

/* The batch on a real, small file system (the case): a 64 MiB ext4
 * image, loop-mounted in a mount namespace of a child process of its own (it
 * goes when the child ends, however it ends). Needs root, mkfs.ext4 and loop
 * devices; skipped without them. */
static uint64_t fs_free(const char *path)
{
    struct statvfs sv;
    if (statvfs(path, &sv) != 0) return 0;
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

static void small_fs_child(const char *mnt)
{
    ferry_ctx *c2 = NULL;
    ferry_device *d = NULL;
    ferry_file *f = NULL;
    ferry_store *s = NULL;
    ferry_model *m = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    CHECK_EQ(ferry_ctx_new(NULL, &c2), 0);
    CHECK_EQ(ferry_device_open(c2, "sim:1GiB", &d), 0);
    CHECK_EQ(ferry_file_open(c2, path, 0, &f), 0);
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = mnt,
                          .spill_below = 1,
                          .spill_above = 2};
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (!s || !f) return;
    CHECK_EQ(ferry_store_add(s, "big", &f, 1, 0, &m), 0);
    if (!m) return;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    const uint64_t total = dirty_all(m, 0x3C), free0 = fs_free(mnt);
    printf("small_fs: %" PRIu64 " bytes to spill, %" PRIu64 " bytes free\n", total, free0);
    CHECK(total > free0);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    /* 1. the free-space check refuses the batch before reserving any of it */
    atomic_store(&falloc_calls, 0);
    CHECK_EQ(ferry_model_evict(m, NULL, 0), -ENOSPC);
    CHECK_EQ(atomic_load(&falloc_calls), 0);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), mnt);
    char want[64];
    snprintf(want, sizeof want, "%" PRIu64 " bytes needed", total);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), want);
    CHECK_EQ(fs_free(mnt), free0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    /* 2. a file system that says it has more than it has (or space taken by
     * someone else after the check): the file system's own ENOSPC, part-way */
    atomic_store(&fake_extra, 1ull << 30);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    atomic_store(&falloc_calls, 0);
    int rc = ferry_model_evict(m, NULL, 0);
    CHECK_EQ(rc, -ENOSPC);
    printf("small_fs: %d reservations, the last failed: %s\n", atomic_load(&falloc_calls),
           ferry_ctx_errmsg(c2));
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), "cannot reserve"); /* fallocate's own ENOSPC */
    CHECK(atomic_load(&falloc_calls) > 1);
    snprintf(want, sizeof want, "(%" PRIu64 " bytes in the spill file)", total);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), want);
    uint64_t free1 = fs_free(mnt);
    printf("small_fs: %" PRIu64 " bytes free after the failed batch\n", free1);
    CHECK_EQ(free1, free0);
    CHECK_EQ(spill_blocks_in(mnt), 0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    fy_sys_reset();
    /* 3. half the model fits: spilled, back, and the space returned */
    int64_t half[16];
    for (int i = 0; i < 16; i++) half[i] = i;
    CHECK_EQ(ferry_model_evict(m, half, 16), 0);
    CHECK(fs_free(mnt) < free0 - total / 3);
    CHECK_EQ(check_xor(m, f, 0x3C, 16, FERRY_TIER_SPILL), 0);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
    CHECK_EQ(fs_free(mnt), free0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    ferry_store_free(s);
    ferry_file_close(f);
    ferry_device_close(d);
    ferry_ctx_free(c2);
}

static void test_small_fs(void)
{
    if (geteuid() != 0) {
        check_skip("a small real file system needs root (a loop mount)");
        return;
    }
    char img[512], mnt[512], cmd[1200];
    snprintf(img, sizeof img, "%s/small.img", dir);
    snprintf(mnt, sizeof mnt, "%s/small", dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(120);
        int fd = open(img, O_CREAT | O_RDWR | O_TRUNC, 0600);
        bool ok = fd >= 0 && ftruncate(fd, 64 << 20) == 0;
        if (fd >= 0) close(fd);
        snprintf(cmd, sizeof cmd, "mkfs.ext4 -q -F '%s' >/dev/null 2>&1", img);
        ok = ok && mkdir(mnt, 0700) == 0 && system(cmd) == 0;
        /* a mount of our own: gone with this process */
        ok = ok && unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0;
        snprintf(cmd, sizeof cmd, "mount -o loop '%s' '%s' >/dev/null 2>&1", img, mnt);
        ok = ok && system(cmd) == 0;
        if (!ok) _exit(77);
        int failed0 = check_fail; /* (the cases before this one count too) */
        small_fs_child(mnt);
        fflush(NULL);
        _exit(check_fail > failed0 ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) check_skip("cannot make a loop-mounted ext4 here");
    else CHECK_EQ(WEXITSTATUS(status), 0);
    unlink(img);
    rmdir(mnt);
}

/* kill -9 in the middle of spilling: no file is left in the spill directory */
static void test_kill9(ferry_ctx *ctx)
{
    (void)ctx;
    int p[2];
    if (pipe(p) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        ferry_ctx *c2 = NULL;
        ferry_device *d = NULL;
        ferry_file *f = NULL;
        ferry_store *s = NULL;
        ferry_model *m = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/big.safetensors", dir);
        if (ferry_ctx_new(NULL, &c2) || ferry_device_open(c2, "sim:1GiB", &d) ||
            ferry_file_open(c2, path, 0, &f))
            _exit(3);
        ferry_store_opts o = {.size = sizeof o,
                              .host_budget = 1,
                              .pinned_budget = 1,
                              .spill_dir = spill_dir,
                              .spill_below = 1,
                              .spill_above = 2};
        if (ferry_store_new(d, &o, &s) || ferry_store_add(s, "big", &f, 1, 0, &m)) _exit(3);
        for (int round = 0;; round++) { /* spill and reload until killed */
            if (ferry_model_to_device(m, NULL, 0)) _exit(4);
            for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) ferry_model_mark_dirty(m, i);
            if (round == 1 && write(p[1], "x", 1) != 1) _exit(5);
            if (ferry_model_evict(m, NULL, 0)) _exit(6);
        }
    }
    close(p[1]);
    char x;
    bool started = read(p[0], &x, 1) == 1;
    CHECK(started);
    usleep(20000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(p[0]);
    CHECK_EQ(files_in(spill_dir), 0);
}

typedef struct targ {
    ferry_store *s;
    ferry_model *m;
    ferry_file *f;
    int bad;
} targ;

static void *worker(void *a)
{
    targ *t = a;
    for (int i = 0; i < 20; i++) {
        int rc = ferry_model_to_device(t->m, NULL, 0);
        if (rc == 0 && verify(t->m, t->f, -1, 0) != 0) t->bad++;
        if (i % 3 == 0) ferry_store_make_room(t->s, 1 << 20, NULL);
        ferry_model_evict(t->m, NULL, 0);
    }
    return NULL;
}

static void test_threads(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    if (!d || !fa || !fb) goto out;
    ferry_store *s =
        mk_store(d, ferry_file_total_bytes(fa) + ferry_file_total_bytes(fb) / 2, 64 << 20, 32 << 20);
    targ t[4] = {{0}};
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &t[0].m), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 1, &t[1].m), 0);
    t[0].f = t[2].f = fa;
    t[1].f = t[3].f = fb;
    for (int i = 0; i < 4; i++) t[i].s = s;
    t[2].m = t[0].m;
    t[3].m = t[1].m;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, &t[i]);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK_EQ(t[i].bad, 0);
    CHECK_EQ(verify(t[0].m, fa, -1, 0), 0);
    CHECK_EQ(verify(t[1].m, fb, -1, 0), 0);
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* ferry_store_find takes a reference: a model that other threads
 * found and are using is never freed under them; its owner's remove fails
 * with FERRY_E_BUSY until every reference is put back. Run under TSan/ASan:
 * a model freed while a finder is inside a call on it is reported there. */
typedef struct farg {
    ferry_store *s;
    atomic_int stop;
    atomic_long found, calls_bad;
} farg;

static void *finder(void *a)
{
    farg *x = a;
    while (!atomic_load(&x->stop)) {
        ferry_model *m = ferry_store_find(x->s, "a");
        if (m) {
            atomic_fetch_add(&x->found, 1);
            if (strcmp(ferry_model_name(m), "a") != 0 || ferry_model_tensor_count(m) <= 0)
                atomic_fetch_add(&x->calls_bad, 1);
            if (ferry_model_to_device(m, NULL, 0) < 0) atomic_fetch_add(&x->calls_bad, 1);
            ferry_model_evict(m, NULL, 0);
            ferry_model_put(m);
        }
        struct timespec ts = {0, 300 * 1000}; /* leave the owner a window to remove */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_find_remove(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store *s = NULL;
    if (!d || !fa) goto out;
    s = mk_store(d, 64 << 20, 64 << 20, 32 << 20);
    if (!s) goto out;

    /* one thread: a reference blocks the remove, its put lets it through */
    ferry_model *m = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &m), 0);
    ferry_model *r1 = ferry_store_find(s, "a"), *r2 = ferry_store_find(s, "a");
    CHECK(r1 == m && r2 == m);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY);
    CHECK_STR_HAS(ferry_model_errmsg(m), "2 times");
    CHECK_STR_HAS(ferry_model_errmsg(m), "ferry_model_put");
    ferry_model_put(r1);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY); /* one still out */
    ferry_model_put(r2);
    ferry_model_put(r2); /* one too many: ignored */
    ferry_model_put(NULL);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0); /* still usable: nothing was removed */
    CHECK_EQ(verify(m, fa, -1, 0), 0);
    CHECK_EQ(ferry_store_remove(m), 0);
    CHECK(ferry_store_find(s, "a") == NULL);

    /* threads finding and using it while its owner removes and re-adds it */
    farg x = {.s = s};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_create(&th[i], NULL, finder, &x), 0);
    int removed = 0, busy = 0;
    for (int round = 0; round < 20; round++) {
        m = NULL;
        CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &m), 0);
        if (!m) break;
        struct timespec ts = {0, 500 * 1000}; /* let the finders get at it */
        nanosleep(&ts, NULL);
        int rc;
        for (long tries = 0; (rc = ferry_store_remove(m)) == FERRY_E_BUSY && tries < 100000; tries++) {
            busy++;
            struct timespec w = {0, 20 * 1000};
            nanosleep(&w, NULL);
        }
        CHECK_EQ(rc, 0);
        if (rc != 0) break; /* m is still in the store; the store's free takes it */
        removed++;
    }
    atomic_store(&x.stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_EQ(removed, 20);
    CHECK_EQ(atomic_load(&x.calls_bad), 0);
    CHECK(atomic_load(&x.found) > 0);
    fprintf(stderr, "find_remove: %ld finds, %d busy removes\n", (long)atomic_load(&x.found), busy);
out:
    ferry_store_free(s);
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

/* ---- queued moves (ferry_model_to_device_async) ---- */

typedef struct side {
    ferry_store *s;
    ferry_model *other;
    ferry_op *op;
    int stats_rc, evict_rc, query_after; /* what the other thread saw */
} side;

/* Another thread works on the store while a queued move is in flight: its
 * calls must not wait for the move (the lock is not held across it). */
static void *side_worker(void *a)
{
    side *x = a;
    ferry_store_stats st = {.size = sizeof st};
    x->stats_rc = ferry_store_get_stats(x->s, &st);
    x->evict_rc = ferry_model_evict(x->other, NULL, 0);
    x->query_after = ferry_op_query(x->op);
    return NULL;
}

static void test_async(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    /* copies take modelled time: 64 MiB at 0.25 GB/s is about 0.27 s */
    CHECK_EQ(ferry_device_open(ctx, "sim:512MiB,0.25GB/s", &d), 0);
    ferry_file *fb = open_model(ctx, "big.safetensors"), *fa = open_model(ctx, "a.safetensors");
    if (!d || !fb || !fa) goto out;
    ferry_store *s = mk_store(d, 256 << 20, 256 << 20, 128 << 20);
    ferry_model *m = NULL, *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "big", &fb, 1, 0, &m), 0);
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    /* the big model, dirty, into pinned RAM: the next move is DMA only */
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) CHECK_EQ(ferry_model_mark_dirty(m, i), 0);
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), ferry_file_total_bytes(fb));

    /* queued: returns with the copies in flight, blocks already assigned */
    ferry_op *op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    if (!op) goto free_store;
    ferry_tensor_state st = {.size = sizeof st};
    CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
    CHECK(st.dptr != 0);                  /* the block is there already */
    CHECK_EQ(st.tier, FERRY_TIER_PINNED); /* the old copy stays until the move lands */
    /* a caller's stream ordered after the move sees the bytes, before anyone waited */
    fy_gpu *g = fy_device_gpu(d);
    fy_stream *theirs = NULL;
    CHECK_EQ(g->ops->stream_new(g, &theirs), 0);
    uint8_t *back = malloc(st.nbytes);
    if (theirs && back) {
        CHECK_EQ(ferry_op_stream_wait(op, g->ops->stream_raw(g, theirs)), 0);
        CHECK_EQ(g->ops->copy_dtoh(g, back, st.dptr, (size_t)st.nbytes, theirs), 0);
        /* meanwhile another thread's calls on the store do not wait for the move */
        side x = {.s = s, .other = ma, .op = op, .query_after = -100};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, side_worker, &x), 0);
        pthread_join(th, NULL);
        CHECK_EQ(x.stats_rc, 0);
        CHECK_EQ(x.evict_rc, 0);
        CHECK_EQ(x.query_after, 0); /* the move was still in flight when they returned */
        CHECK_EQ(g->ops->stream_sync(g, theirs), 0);
        uint8_t *want = malloc(st.nbytes);
        CHECK(want && ferry_file_tensor_read(fb, 0, 0, want, st.nbytes) == 0 &&
              memcmp(back, want, st.nbytes) == 0);
        free(want);
    }
    /* the held-back tensors cannot leave while the move is queued */
    CHECK_EQ(ferry_store_make_room(s, UINT64_MAX, NULL) >= 0, 1);
    CHECK_EQ(ferry_op_wait(op), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), ferry_file_total_bytes(fb));
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), 0);
    CHECK_EQ(verify(m, fb, -1, 0), 0);
    CHECK_EQ(ferry_op_wait(NULL), FERRY_E_INVAL);

    /* a read of a tensor whose move is queued lands the move first; removing
     * the model while an op is not waited for is BUSY */
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0); /* dirty: back to pinned */
    op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY);
    CHECK_STR_HAS(ferry_model_errmsg(m), "ferry_op_wait");
    CHECK_EQ(ferry_model_read(m, 1, back), 0);
    CHECK_EQ(ferry_op_query(op), 1); /* landed by the read */
    CHECK_EQ(ferry_op_wait(op), 0);
    CHECK_EQ(verify(m, fb, -1, 0), 0);

    /* a copy that fails: the wait says so, every tensor stays where it was */
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0);
    CHECK(fy_gpu_sim_fault(g, FY_OP_COPY, 1) >= 0);
    op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    CHECK(op != NULL && ferry_op_query(op) < 0);
    CHECK(ferry_op_wait(op) < 0);
    CHECK(strlen(ferry_model_errmsg(m)) > 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, 0), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), ferry_file_total_bytes(fb));
    CHECK_EQ(verify(m, fb, -1, 0), 0); /* nothing lost */

    /* release after a stream: held until the work queued there has run */
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(ferry_model_release_after(m, 0, 0), FERRY_E_INVAL); /* not held */
    CHECK_EQ(ferry_model_hold(m, 0), 0);
    if (theirs && back) {
        /* a slow copy on their stream stands in for a kernel still reading */
        CHECK_EQ(g->ops->copy_dtoh(g, back, st.dptr, (size_t)st.nbytes, theirs), 0);
        CHECK_EQ(ferry_model_release_after(m, 0, g->ops->stream_raw(g, theirs)), 0);
        CHECK_EQ(ferry_model_release_after(m, 0, 0), FERRY_E_INVAL); /* its one hold is released already */
        CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
        CHECK_EQ(st.holds, 1); /* still held: the copy runs */
        /* make_room wants everything: it waits for the stream, then evicts */
        CHECK(ferry_store_make_room(s, UINT64_MAX, NULL) > 0);
        CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
        CHECK_EQ(st.holds, 0);
        CHECK(st.tier != FERRY_TIER_DEVICE);
        /* on the caller's own thread (raw 0 on sim) the hold goes at once */
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        CHECK_EQ(ferry_model_hold(m, 1), 0);
        CHECK_EQ(ferry_model_release_after(m, 1, 0), 0);
        CHECK_EQ(ferry_model_tensor_state(m, 1, &st), 0);
        CHECK_EQ(st.holds, 0);
    }
    CHECK_EQ(verify(m, fb, -1, 0), 0);
    if (theirs) g->ops->stream_free(g, theirs);
    free(back);
free_store:
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* ferry_model_set_pinned_cache: a clean model that leaves the device keeps a
 * pinned copy, so coming back reads nothing from its checkpoint (a model
 * swap is one DMA); the copies give way when the budgets are short, go with
 * mark_dirty and when the flag goes off. */
static uint64_t bytes_read(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.bytes_read;
}

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

/* `test_store CASE` runs one of these, `--list` names them (check.h); main
 * writes the models and makes the ctx they share. */
/* ---- eviction's copies run without the store's lock ---- */

/* A checkpoint of n tensors "blk.K.w" of each bytes, U8, all zeros: a sparse
 * file (its data a hole), so 1 GiB costs neither the disk nor the time to
 * write it. */
static void write_sparse_model(const char *name, int n, uint64_t each)
{
    char hdr[8192], path[512];
    size_t h = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int k = 0; k < n; k++)
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64
                              "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              k ? "," : "", k, each, (uint64_t)k * each, (uint64_t)(k + 1) * each);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = start_checkpoint(name, hdr, h, path);
    long data = ftell(f);
    fclose(f);
    CHECK_EQ(truncate(path, (off_t)data + (off_t)((uint64_t)n * each)), 0);
}

typedef struct evictor {
    ferry_model *m;
    atomic_int started, done;
    double seconds;
    int rc;
} evictor;

static void *evict_all(void *a)
{
    evictor *e = a;
    atomic_store(&e->started, 1);
    double t0 = fy_now();
    e->rc = ferry_model_evict(e->m, NULL, 0);
    e->seconds = fy_now() - t0;
    atomic_store(&e->done, 1);
    return NULL;
}

/* While one thread spills 1 GiB of dirty tensors from a device that copies
 * at 4 GB/s (a quarter of a second at least), another thread's
 * ferry_store_get_stats and ferry_store_make_room return at once: the
 * copies and the spill file's writes run without the store's lock. (With
 * them under it, each call waited for the whole spill: 0.3-0.6 s.) */
static void test_evict_unlocked(ferry_ctx *ctx)
{
    enum { N = 4 };
    const uint64_t each = 256ull << 20, limit_ms = 10;
    write_sparse_model("gig.safetensors", N, each);
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:2GiB,4GB/s", &d), 0);
    ferry_file *f = open_model(ctx, "gig.safetensors");
    if (!d || !f) goto out;
    ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 8 << 20};
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = 1536ull << 20,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2,
                          .load = &lo};
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    ferry_model *m = NULL;
    CHECK_EQ(ferry_store_add(s, "gig", &f, 1, 0, &m), 0);
    if (!s || !m) goto out_store;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    for (int64_t i = 0; i < N; i++) CHECK_EQ(ferry_model_mark_dirty(m, i), 0);
    evictor e = {.m = m};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, evict_all, &e), 0);
    while (!atomic_load(&e.started)) sched_yield();
    fy_sleep_until(fy_now() + 0.02); /* into its copies */
    double worst_stats = 0, worst_room = 0;
    int probes = 0, retried = 0;
    while (!atomic_load(&e.done)) {
        double ts = 0, tr = 0;
        /* a probe slower than the limit is tried again (up to 3 times)
         * while the spill still runs: this machine may be shared, and a
         * thread put off the CPU for a while is no lock held (under the
         * lock, the first try waits for the whole spill, and a slow try
         * after the spill ended stands) */
        for (int attempt = 0; attempt < 4; attempt++) {
            ferry_store_stats st = {.size = sizeof st};
            double t0 = fy_now();
            CHECK_EQ(ferry_store_get_stats(s, &st), 0);
            double t1 = fy_now();
            uint64_t could = 0;
            CHECK(ferry_store_make_room(s, 16 << 20, &could) >= 0);
            double t2 = fy_now();
            ts = t1 - t0, tr = t2 - t1;
            if ((ts < limit_ms * 1e-3 && tr < limit_ms * 1e-3) || atomic_load(&e.done)) break;
            retried++;
        }
        if (atomic_load(&e.done) && probes > 0 && ts < limit_ms * 1e-3 && tr < limit_ms * 1e-3)
            break; /* (this probe may have started after the spill) */
        worst_stats = ts > worst_stats ? ts : worst_stats;
        worst_room = tr > worst_room ? tr : worst_room;
        probes++;
        fy_sleep_until(fy_now() + 0.01);
    }
    pthread_join(th, NULL);
    fprintf(stderr,
            "evict_unlocked: the spill took %.0f ms; %d probes meanwhile (%d tried again), the slowest "
            "stats %.1f ms, make_room %.1f ms\n",
            e.seconds * 1e3, probes, retried, worst_stats * 1e3, worst_room * 1e3);
    CHECK_EQ(e.rc, 0);
    CHECK(e.seconds > 0.1); /* the spill was slow enough to tell */
    CHECK(probes >= 2);
    CHECK(worst_stats * 1e3 < (double)limit_ms);
    CHECK(worst_room * 1e3 < (double)limit_ms);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_SPILL), N * each);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), 0);
    /* nothing lost: the spilled copies read back as the checkpoint's zeros */
    uint8_t *buf = malloc(each);
    for (int64_t i = 0; i < N && buf; i++) {
        memset(buf, 0xa5, each);
        CHECK_EQ(ferry_model_read(m, i, buf), 0);
        bool zero = true;
        for (uint64_t j = 0; j < each && zero; j += 4096) zero = buf[j] == 0 && buf[j + 4095] == 0;
        CHECK(zero);
    }
    free(buf);
out_store:
    ferry_store_free(s);
out:
    ferry_file_close(f);
    ferry_device_close(d);
}

static ferry_ctx *ctx;
#define CASES(CASE)                                        \
    CASE(policy, test_policy())                            \
    CASE(tiers, test_tiers(ctx))                           \
    CASE(spill, test_spill(ctx))                           \
    CASE(spill_batch_enospc, test_spill_batch_enospc(ctx)) \
    CASE(spill_batch_room, test_spill_batch_room(ctx))     \
    CASE(small_fs, test_small_fs())                        \
    CASE(refused_tmpfs, test_refused_tmpfs(ctx))           \
    CASE(device_faults, test_device_faults(ctx))           \
    CASE(jobs, test_jobs(ctx))                             \
    CASE(kill9, test_kill9(ctx))                           \
    CASE(threads, test_threads(ctx))                       \
    CASE(find_remove, test_find_remove(ctx))               \
    CASE(review, test_review(ctx))                         \
    CASE(add_oom, test_add_oom())                          \
    CASE(async, test_async(ctx))                           \
    CASE(pinned_cache, test_pinned_cache(ctx))             \
    CASE(pinned_reserve, test_pinned_reserve(ctx))         \
    CASE(evict_unlocked, test_evict_unlocked(ctx))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "store") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    write_model("a.safetensors", 6, 100000, 1);
    write_model("b.safetensors", 5, 130001, 2);
    write_model("big.safetensors", 16, 4 << 20, 3);
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
