/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_paths.c - the transfer engine through a sim device: every path
 * (ring, direct, register, auto) on odd sizes, unaligned offsets, empty and
 * tiny tensors and a sharded checkpoint; auto on cold files and its sampled
 * residency; capacity; names and arguments; a tensor larger than the ring;
 * a file cut after it was opened. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ---- 1. every path, every shape of checkpoint ---- */

static void check_stats(const ferry_load_stats *st, ferry_route asked, const ferry_file *f)
{
    CHECK_EQ(st->bytes, ferry_file_total_bytes(f));
    CHECK(st->seconds >= 0);
    CHECK(st->why[0] != '\0');
    if (asked == FERRY_ROUTE_AUTO) {
        CHECK(st->resident >= 0 && st->resident <= 1);
        /* auto: ring for cached data, O_DIRECT for cold data */
        CHECK_EQ(st->route, st->resident >= 0.5 ? FERRY_ROUTE_RING : FERRY_ROUTE_DIRECT);
    } else {
        CHECK_EQ(st->route, asked);
        CHECK(st->resident == -1);
    }
}

static void test_paths(ferry_ctx *ctx)
{
    static const char *const files[] = {"odd.safetensors", "tiny.safetensors", "sh.safetensors.index.json",
                                        "small.safetensors", "empty.safetensors"};
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        ferry_file *f = open_file(ctx, files[k]);
        ferry_device *d = open_dev(ctx, "sim:256MiB");
        if (!f || !d) goto next;
        for (int pi = 0; pi < NPATHS; pi++) {
            ferry_route p = all_paths[pi];
            if (p == FERRY_ROUTE_DIRECT && !direct_ok) continue;
            /* small ring (tensors span many buffers, 3 readers share 2
             * buffers), many streams, and the defaults */
            for (int v = 0; v < 3; v++) {
                ferry_load_opts o = small_opts(p);
                if (v == 1) {
                    o.streams = 7;
                    o.threads = 1;
                    o.ring_buffer_bytes = 3 * PAGE + 1;
                }
                if (v == 2) {
                    memset(&o, 0, sizeof o);
                    o.size = sizeof o;
                    o.route = p;
                }
                ferry_loaded *l = NULL;
                ferry_load_stats st = {.size = sizeof st};
                memset(&st, 0x55, sizeof st);
                st.size = sizeof st;
                char what[160];
                snprintf(what, sizeof what, "%s --route %s (variant %d)", files[k], ferry_route_name(p), v);
                int rc = ferry_load(d, f, &o, &l, &st);
                if (rc < 0) fprintf(stderr, "%s: %s\n", what, ferry_ctx_errmsg(ctx));
                CHECK_EQ(rc, 0);
                if (rc < 0) continue;
                check_stats(&st, p, f);
                CHECK_EQ(verify_loaded(l, f, what), 0);
                usage u = use_of(d);
                uint64_t blocks = 0;
                for (int s = 0; s < ferry_file_shard_count(f); s++) {
                    /* one block per shard, spanning its tensors */
                    uint64_t lo = UINT64_MAX, hi = 0;
                    for (int64_t i = 0; i < ferry_file_tensor_count(f); i++) {
                        ferry_tensor_info ti = {.size = sizeof ti};
                        ferry_file_tensor_info(f, i, &ti);
                        if (ti.shard != s || ti.nbytes == 0) continue;
                        if (ti.offset < lo) lo = ti.offset;
                        if (ti.offset + ti.nbytes > hi) hi = ti.offset + ti.nbytes;
                    }
                    if (hi) blocks += hi - lo;
                }
                CHECK_EQ(u.dev, blocks);
                CHECK_EQ(u.reg, 0); /* register's temporary registration is gone */
                ferry_loaded_free(l);
                u = use_of(d);
                CHECK_EQ(u.dev, 0);
                CHECK_EQ(u.reg, 0);
                if (uses_ring(st.route)) { /* the device keeps this load's ring */
                    if (v == 0) CHECK_EQ(u.pinned, SMALL_RING);
                    if (v == 1) CHECK_EQ(u.pinned, ring_pinned(2, 4 * PAGE)); /* 3 pages + 1 rounds up */
                    if (v == 2) CHECK(u.pinned > 0);
                }
            }
        }
        /* stats may be NULL; opts may be NULL (auto, defaults) */
        ferry_loaded *l = NULL;
        CHECK_EQ(ferry_load(d, f, NULL, &l, NULL), 0);
        if (l) CHECK_EQ(verify_loaded(l, f, "opts NULL"), 0);
        ferry_loaded_free(l);
    next:
        ferry_device_close(d);
        ferry_file_close(f);
    }
}

/* A cold file (page cache dropped): auto reads it with O_DIRECT. */
static void test_auto_cold(ferry_ctx *ctx)
{
    uint64_t sizes[8];
    for (int i = 0; i < 8; i++) sizes[i] = MiB + (uint64_t)i * 977;
    tdef *t = defs("cold", sizes, 8);
    write_st("cold.safetensors", t, 8, 7, 2);
    free(t);
    char p[512];
    path_of(p, sizeof p, "cold.safetensors");
    int fd = open(p, O_RDONLY);
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    ferry_file *f = open_file(ctx, "cold.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (f && d) {
        double r = ferry_file_resident(f);
        ferry_load_opts o = small_opts(FERRY_ROUTE_AUTO);
        o.ring_buffer_bytes = 256 * KiB;
        ferry_loaded *l = NULL;
        ferry_load_stats st = {.size = sizeof st};
        if (r >= 0.5)
            fprintf(stderr,
                    "note: page cache not droppable here (%.0f%% resident): auto->direct not tested\n",
                    r * 100);
        if (r < 0.5 && !direct_ok) {
            /* auto would pick O_DIRECT where it cannot work: not tested */
            fprintf(stderr, "note: cold file where O_DIRECT fails: auto not tested\n");
        } else {
            int rc = ferry_load(d, f, &o, &l, &st);
            if (rc < 0) fprintf(stderr, "auto cold: %s\n", ferry_ctx_errmsg(ctx));
            CHECK_EQ(rc, 0);
            if (rc == 0) {
                check_stats(&st, FERRY_ROUTE_AUTO, f);
                if (r < 0.5) {
                    CHECK_EQ(st.route, FERRY_ROUTE_DIRECT);
                    CHECK_STR_HAS(st.why, "O_DIRECT");
                }
                CHECK_EQ(verify_loaded(l, f, "auto cold"), 0);
            }
            ferry_loaded_free(l);
            /* now cached: ring */
            l = NULL;
            CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
            CHECK(ferry_file_resident(f) >= 0.5);
            CHECK_EQ(st.route, FERRY_ROUTE_RING);
            ferry_loaded_free(l);
        }
    }
    ferry_device_close(d);
    ferry_file_close(f);
}

/* auto's sampled residency (64 runs of 64 pages) against the exact count
 * over shards: all cached, none, the first half. */
static void test_resident_sampled(ferry_ctx *ctx)
{
    uint64_t sizes[6];
    for (int i = 0; i < 6; i++) sizes[i] = 3 * MiB + (uint64_t)i * 4099;
    tdef *t = defs("rs", sizes, 6);
    write_st("rs.safetensors", t, 6, 11, 0);
    free(t);
    ferry_file *f = open_file(ctx, "rs.safetensors");
    if (!f) return;
    double exact = ferry_file_resident(f), sampled = xf_resident_sampled(f);
    CHECK(exact > 0.99);
    CHECK(sampled > 0.99);
    char p[512];
    path_of(p, sizeof p, "rs.safetensors");
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0);
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    exact = ferry_file_resident(f);
    if (exact > 0.5) {
        fprintf(stderr, "note: page cache not droppable here (%.0f%% resident): cold sample not tested\n",
                exact * 100);
    } else {
        CHECK(xf_resident_sampled(f) < exact + 0.1);
        struct stat sb;
        CHECK_EQ(fstat(fd, &sb), 0);
        static char buf[1 << 20];
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* no readahead past the half */
        for (off_t off = 0; off < sb.st_size / 2; off += (off_t)sizeof buf)
            CHECK(pread(fd, buf, sizeof buf, off) > 0);
        exact = ferry_file_resident(f), sampled = xf_resident_sampled(f);
        if (!(exact > 0.4 && exact < 0.7 && sampled > exact - 0.1 && sampled < exact + 0.1))
            fprintf(stderr, "half read: exact %.3f, sampled %.3f\n", exact, sampled);
        CHECK(exact > 0.4 && exact < 0.7);
        CHECK(sampled > exact - 0.1 && sampled < exact + 0.1);
    }
    close(fd);
    ferry_file_close(f);
}

/* ---- 4. capacity ---- */

static void test_capacity(ferry_ctx *ctx)
{
    static const struct {
        const char *file, *dev;
    } c[] = {
        {"odd.safetensors", "sim:64KiB"},
        {"sh.safetensors.index.json", "sim:64KiB"}, /* shard 1 fits, shard 2 does not */
        {"tiny.safetensors", "sim:1KiB"},
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        ferry_file *f = open_file(ctx, c[k].file);
        ferry_device *d = open_dev(ctx, c[k].dev);
        if (!f || !d) goto next;
        for (int pi = 0; pi < NPATHS; pi++) {
            if (all_paths[pi] == FERRY_ROUTE_DIRECT && !direct_ok) continue;
            ferry_load_opts o = small_opts(all_paths[pi]);
            ferry_loaded *l = (ferry_loaded *)&o; /* must be reset */
            int rc = ferry_load(d, f, &o, &l, NULL);
            CHECK(rc == -ENOMEM || rc == FERRY_E_BUDGET);
            CHECK(l == NULL);
            CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "out of device memory");
            usage u = use_of(d);
            CHECK_EQ(u.dev, 0);
            CHECK_EQ(u.reg, 0);
            uint64_t fr = 0, tot = 0;
            CHECK_EQ(ferry_device_mem_info(d, &fr, &tot), 0);
            CHECK_EQ(fr, tot);
        }
    next:
        ferry_device_close(d);
        ferry_file_close(f);
    }
}

/* ---- 5. names, arguments ---- */

static void test_api(ferry_ctx *ctx)
{
    for (int p = 0; p < FERRY_ROUTE_COUNT; p++) {
        const char *n = ferry_route_name((ferry_route)p);
        CHECK(n && strcmp(n, "unknown") != 0);
        CHECK_EQ(ferry_route_parse(n), p);
    }
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_AUTO), "auto") == 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_RING), "ring") == 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_DIRECT), "direct") == 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_REGISTER), "register") == 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_CUFILE), "cufile") == 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_COUNT), "unknown") == 0);
    CHECK(strcmp(ferry_route_name((ferry_route)-1), "unknown") == 0);
    CHECK_EQ(ferry_route_parse("nope"), -1);
    CHECK_EQ(ferry_route_parse(""), -1);
    CHECK_EQ(ferry_route_parse(NULL), -1);
    CHECK_EQ(ferry_route_parse("rin"), -1);
    CHECK_EQ(ferry_route_parse("ring "), -1);

    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:0", &d), FERRY_E_INVAL);
    CHECK(d == NULL);
    CHECK_EQ(ferry_device_open(ctx, "bogus:1", &d), FERRY_E_INVAL);
    CHECK_EQ(ferry_device_open(ctx, NULL, &d), FERRY_E_INVAL);
    CHECK_EQ(ferry_device_open(NULL, "sim:1MiB", &d), FERRY_E_INVAL);
    CHECK_EQ(ferry_device_open(ctx, "sim:1MiB", NULL), FERRY_E_INVAL);
    ferry_device_close(NULL);
    d = open_dev(ctx, "sim:256MiB");
    ferry_file *f = open_file(ctx, "small.safetensors");
    if (!d || !f) goto out;
    CHECK_STR_HAS(ferry_device_desc(d), "sim");
    uint64_t fr = 0, tot = 0;
    CHECK_EQ(ferry_device_mem_info(d, &fr, &tot), 0);
    CHECK_EQ(tot, 256 * MiB);
    CHECK_EQ(fr, tot);
    CHECK_EQ(ferry_device_mem_info(d, NULL, NULL), 0);
    CHECK_EQ(ferry_device_mem_info(NULL, &fr, &tot), FERRY_E_INVAL);

    ferry_loaded *l = NULL;
    ferry_load_opts o = small_opts(FERRY_ROUTE_CUFILE);
    ferry_load_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_load(d, f, &o, &l, &st), FERRY_E_UNSUPPORTED);
    CHECK(l == NULL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "cufile is not a route");
    CHECK_EQ(use_of(d).dev, 0);

    CHECK_EQ(ferry_load(NULL, f, NULL, &l, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_load(d, NULL, NULL, &l, NULL), FERRY_E_INVAL);
    CHECK(l == NULL);
    CHECK_EQ(ferry_load(d, f, NULL, NULL, NULL), FERRY_E_INVAL);
    static const uint32_t bad_sizes[] = {0, 3, sizeof(ferry_load_opts) + 1, 4096};
    for (size_t k = 0; k < sizeof bad_sizes / sizeof *bad_sizes; k++) {
        o = small_opts(FERRY_ROUTE_RING);
        o.size = bad_sizes[k];
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_INVAL);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "opts->size");
        CHECK(l == NULL);
    }
    static const int bad_paths[] = {FERRY_ROUTE_COUNT, FERRY_ROUTE_COUNT + 1, -1, 1000};
    for (size_t k = 0; k < sizeof bad_paths / sizeof *bad_paths; k++) {
        o = small_opts((ferry_route)bad_paths[k]);
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_INVAL);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "unknown route");
        CHECK(l == NULL);
    }
    usage u = use_of(d);
    CHECK_EQ(u.dev, 0);
    CHECK_EQ(u.reg, 0);
    /* an older, shorter opts struct: the fields it lacks take their defaults */
    o = small_opts(FERRY_ROUTE_REGISTER);
    o.size = (uint32_t)offsetof(ferry_load_opts, threads);
    o.pinned_budget = 1; /* beyond size: ignored */
    CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_REGISTER);
    o.size = (uint32_t)sizeof(uint32_t); /* size alone: auto */
    ferry_loaded *l2 = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l2, &st), 0);
    CHECK(st.route == FERRY_ROUTE_RING || st.route == FERRY_ROUTE_DIRECT || st.route == FERRY_ROUTE_PAGEABLE);
    /* the results */
    if (l) {
        uint8_t buf[16];
        CHECK_EQ(ferry_loaded_read(l, -1, buf), FERRY_E_INVAL);
        CHECK_EQ(ferry_loaded_read(l, 6, buf), FERRY_E_INVAL);
        CHECK_EQ(ferry_loaded_read(l, 0, NULL), FERRY_E_INVAL);
        CHECK_EQ(ferry_loaded_read(NULL, 0, buf), FERRY_E_INVAL);
        CHECK_EQ(ferry_loaded_read(l, 2, buf), 0); /* empty tensor */
        CHECK_EQ(ferry_loaded_ptr(l, -1), 0);
        CHECK_EQ(ferry_loaded_ptr(l, 6), 0);
        CHECK_EQ(ferry_loaded_ptr(NULL, 0), 0);
        CHECK(ferry_loaded_ptr(l, 0) != 0);
        CHECK(ferry_loaded_ptr(l, 1) == ferry_loaded_ptr(l, 0) + 1);
    }
    if (l2) CHECK(ferry_loaded_ptr(l2, 0) != ferry_loaded_ptr(l, 0));
    ferry_loaded_free(l);
    ferry_loaded_free(l2);
    ferry_loaded_free(NULL);
    CHECK_EQ(use_of(d).dev, 0);
    /* sim fault hooks refuse bad arguments */
    CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COUNT, 1), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, -1), FERRY_E_INVAL);
    CHECK(fy_device_gpu(NULL) == NULL);
out:
    ferry_file_close(f);
    ferry_device_close(d);
}

/* A tensor over register's 64 MiB copy size and over many default ring
 * buffers: sparse, with patterned bytes around every 4 MiB and 64 MiB edge. */
static void test_huge(ferry_ctx *ctx)
{
    uint64_t big = 64 * MiB + 4097;
    char hdr[512];
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"h.a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                      "\"h.b\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[3,%llu]},"
                      "\"h.c\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[%llu,%llu]}}",
                      (unsigned long long)big, (unsigned long long)(3 + big), (unsigned long long)(3 + big),
                      (unsigned long long)(8 + big));
    char p[512];
    path_of(p, sizeof p, "huge.safetensors");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t n = (uint64_t)hl, data = 8 + (uint64_t)hl, end = data + 8 + big;
    bool ok = fd >= 0 && pwrite(fd, &n, 8, 0) == 8 && pwrite(fd, hdr, (size_t)hl, 8) == hl &&
              ftruncate(fd, (off_t)end) == 0;
    uint8_t pat[8192];
    for (size_t i = 0; i < sizeof pat; i++) pat[i] = (uint8_t)(byte_at(9, 0, i) | 1);
    /* 8 KiB of bytes across each 4 MiB edge of h.b (h.a first, h.c last) */
    for (uint64_t edge = 0; edge <= big && ok; edge += 4 * MiB) {
        uint64_t at = edge < 4096 ? data : data + 3 + edge - 4096;
        uint64_t len = end - at < sizeof pat ? end - at : sizeof pat;
        ok = pwrite(fd, pat, (size_t)len, (off_t)at) == (ssize_t)len;
    }
    ok = ok && pwrite(fd, pat, 4096, (off_t)(end - 4096)) == 4096;
    if (fd >= 0) close(fd);
    CHECK(ok);
    ferry_file *f = open_file(ctx, "huge.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !d) goto out;
    for (int pi = 0; pi < NPATHS; pi++) {
        ferry_route pa = all_paths[pi];
        if (pa == FERRY_ROUTE_DIRECT && !direct_ok) continue;
        ferry_load_opts o;
        memset(&o, 0, sizeof o);
        o.size = sizeof o;
        o.route = pa;
        ferry_loaded *l = NULL;
        char what[64];
        snprintf(what, sizeof what, "64 MiB + 4097 bytes --route %s", ferry_route_name(pa));
        int rc = ferry_load(d, f, &o, &l, NULL);
        if (rc < 0) fprintf(stderr, "%s: %s\n", what, ferry_ctx_errmsg(ctx));
        CHECK_EQ(rc, 0);
        if (l) CHECK_EQ(verify_loaded(l, f, what), 0);
        ferry_loaded_free(l);
        usage u = use_of(d);
        CHECK_EQ(u.dev, 0);
        CHECK_EQ(u.reg, 0);
    }
out:
    ferry_device_close(d);
    ferry_file_close(f);
    unlink(p);
}

/* A file truncated after it was opened: the reading paths say so (no SIGBUS
 * from the mapping), and leave nothing behind. */
static void test_truncated(ferry_ctx *ctx)
{
    tdef *t = defs("trunc", SMALL, 6);
    write_st("trunc.safetensors", t, 6, 8, 0);
    free(t);
    ferry_file *f = open_file(ctx, "trunc.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    char p[512];
    path_of(p, sizeof p, "trunc.safetensors");
    if (!f || !d) goto out;
    CHECK_EQ(truncate(p, 3000), 0);
    for (int pi = 0; pi < 2; pi++) {
        ferry_route pa = pi ? FERRY_ROUTE_DIRECT : FERRY_ROUTE_RING;
        if (pa == FERRY_ROUTE_DIRECT && !direct_ok) continue;
        ferry_load_opts o = small_opts(pa);
        ferry_loaded *l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_CORRUPT);
        CHECK(l == NULL);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "ended early");
        usage u = use_of(d);
        CHECK_EQ(u.dev, 0);
        CHECK_EQ(u.reg, 0);
    }
out:
    ferry_device_close(d);
    ferry_file_close(f);
    unlink(p);
}

#define CASES(CASE)                                    \
    CASE(api, test_api(ctx))                           \
    CASE(paths, test_paths(ctx))                       \
    CASE(auto_cold, test_auto_cold(ctx))               \
    CASE(resident_sampled, test_resident_sampled(ctx)) \
    CASE(capacity, test_capacity(ctx))                 \
    CASE(huge, test_huge(ctx))                         \
    CASE(truncated, test_truncated(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
