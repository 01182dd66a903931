/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_into.c - caller-owned destinations (ferry_load_into) through
 * every path, and copies cut where one device allocation meets the next. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ---- caller-owned destinations ---- */

static void load_into_case(ferry_ctx *ctx, ferry_device *d, const ferry_file *f, ferry_route p, uint32_t seed,
                           const char *what)
{
    dests x;
    bool setup = dests_new(d, f, seed, &x);
    CHECK(setup);
    usage before = use_of(d);
    ferry_load_opts o = small_opts(p);
    ferry_load_stats st = {.size = sizeof st};
    int rc = setup ? ferry_load_into(d, f, x.idx, x.dp, x.m, &o, &st) : -1;
    if (rc < 0) fprintf(stderr, "%s: %s\n", what, ferry_ctx_errmsg(ctx));
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        CHECK_EQ(st.route,
                 p == FERRY_ROUTE_AUTO ? (st.resident >= 0.5 ? FERRY_ROUTE_RING : FERRY_ROUTE_DIRECT) : p);
        CHECK_EQ(dests_verify(d, f, &x, what), 0);
        CHECK_EQ(st.bytes, x.bytes);
        CHECK(st.alloc_seconds == 0); /* the caller's memory */
        CHECK(st.setup_seconds > 0 && st.setup_seconds <= st.seconds);
    }
    usage after = use_of(d);
    CHECK_EQ(after.dev, before.dev); /* load_into allocates no device memory */
    CHECK_EQ(after.reg, 0);
    dests_free(d, &x);
    CHECK_EQ(use_of(d).dev, 0);
}

/* Tensors that follow one another in the file, loaded into two device
 * blocks that follow one another in the address space (the sim device, like
 * cuMemAlloc, hands out adjacent blocks): every path must cut its copies at
 * the blocks' edge, since the driver refuses one copy into two allocations
 * (CUDA_ERROR_INVALID_VALUE on the H200, bench/span_copy.py; the sim device
 * refuses it too). Before the cut, the ring failed here with "runs ... past
 * the end of the allocation". */
static void test_alloc_edges(ferry_ctx *ctx)
{
    ferry_route paths[] = {FERRY_ROUTE_RING, FERRY_ROUTE_PAGEABLE, FERRY_ROUTE_REGISTER, FERRY_ROUTE_DIRECT};
    const char *specs[] = {"sim:256MiB", "cpu"};
    for (int sp = 0; sp < 2; sp++) {
        ferry_device *d = open_dev(ctx, specs[sp]);
        if (!d) continue;
        fy_gpu *g = fy_device_gpu(d);
        ferry_file *f = open_file(ctx, "edge.safetensors");
        const uint64_t half = EDGE_N / 2 * 256 * KiB; /* 1 MiB: a block the sim carves from its arena */
        uint64_t b0 = 0, b1 = 0;
        CHECK_EQ(g->ops->mem_alloc(g, half, &b0), 0);
        CHECK_EQ(g->ops->mem_alloc(g, half, &b1), 0);
        CHECK_EQ(b1, b0 + half); /* adjacent, or this test tests nothing */
        for (size_t pi = 0; f && b1 == b0 + half && pi < sizeof paths / sizeof *paths; pi++) {
            if (paths[pi] == FERRY_ROUTE_DIRECT && !direct_ok) continue;
            if (sp == 1 && paths[pi] != FERRY_ROUTE_RING) continue; /* of these, the one cpu takes */
            int64_t idx[EDGE_N];
            uint64_t dp[EDGE_N];
            for (int i = 0; i < EDGE_N; i++)
                idx[i] = i, dp[i] = b0 + (uint64_t)i * 256 * KiB; /* 4..7 in b1 */
            ferry_load_opts o = small_opts(paths[pi]);
            o.ring_buffer_bytes =
                2 * MiB; /* a buffer holds the whole edge: the copies could merge across it */
            int rc = ferry_load_into(d, f, idx, dp, EDGE_N, &o, NULL);
            if (rc < 0)
                fprintf(stderr, "alloc_edges %s %s: %s\n", specs[sp], ferry_route_name(paths[pi]),
                        ferry_ctx_errmsg(ctx));
            CHECK_EQ(rc, 0);
            uint8_t *got = malloc(256 * KiB), *want = malloc(256 * KiB);
            for (int i = 0; rc == 0 && got && want && i < EDGE_N; i++) {
                CHECK_EQ(dev_read(d, dp[i], got, 256 * KiB), 0);
                CHECK_EQ(ferry_file_tensor_read(f, i, 0, want, 256 * KiB), 0);
                CHECK(memcmp(got, want, 256 * KiB) == 0);
            }
            free(got);
            free(want);
            CHECK_EQ(use_of(d).reg, 0);
        }
        if (b0) g->ops->mem_free(g, b0);
        if (b1) g->ops->mem_free(g, b1);
        ferry_file_close(f);
        ferry_device_close(d);
    }
}

static void test_load_into(ferry_ctx *ctx)
{
    static const char *const files[] = {"odd.safetensors", "sh.safetensors.index.json", "tiny.safetensors"};
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!d) return;
    fy_gpu *g = fy_device_gpu(d);
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        ferry_file *f = open_file(ctx, files[k]);
        if (!f) continue;
        for (int pi = 0; pi < NPATHS; pi++) {
            if (all_paths[pi] == FERRY_ROUTE_DIRECT && !direct_ok) continue;
            if (k == 2 && all_paths[pi] != FERRY_ROUTE_RING) continue; /* 1300 tiny tensors: once is enough */
            char what[160];
            snprintf(what, sizeof what, "load_into %s --route %s", files[k], ferry_route_name(all_paths[pi]));
            load_into_case(ctx, d, f, all_paths[pi], (uint32_t)(k * 10 + (size_t)pi + 1), what);
        }
        ferry_file_close(f);
    }

    /* nothing to do */
    ferry_file *f = open_file(ctx, "small.safetensors");
    if (!f) goto out;
    ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
    CHECK_EQ(ferry_load_into(d, f, NULL, NULL, 0, &o, NULL), 0);
    o.route = FERRY_ROUTE_REGISTER;
    CHECK_EQ(ferry_load_into(d, f, NULL, NULL, 0, &o, NULL), 0);
    CHECK_EQ(use_of(d).reg, 0);

    /* bad arguments */
    int64_t idx[2] = {0, 3};
    uint64_t dp[2] = {0, 0};
    CHECK_EQ(g->ops->mem_alloc(g, 16 * KiB, &dp[0]), 0);
    CHECK_EQ(g->ops->mem_alloc(g, 16 * KiB, &dp[1]), 0);
    o.route = FERRY_ROUTE_RING;
    CHECK_EQ(ferry_load_into(NULL, f, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_load_into(d, NULL, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_load_into(d, f, NULL, dp, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_load_into(d, f, idx, NULL, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_load_into(d, f, idx, dp, -1, &o, NULL), FERRY_E_INVAL);
    idx[1] = 6;
    CHECK_EQ(ferry_load_into(d, f, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "tensor index 6 out of range");
    idx[1] = -1;
    CHECK_EQ(ferry_load_into(d, f, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "out of range");
    idx[1] = 3;
    o.size = 2;
    CHECK_EQ(ferry_load_into(d, f, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    o = small_opts(FERRY_ROUTE_COUNT);
    CHECK_EQ(ferry_load_into(d, f, idx, dp, 2, &o, NULL), FERRY_E_INVAL);
    o.route = FERRY_ROUTE_CUFILE;
    CHECK_EQ(ferry_load_into(d, f, idx, dp, 2, &o, NULL), FERRY_E_UNSUPPORTED);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "cufile");
    /* a destination too small (9000 bytes into 16 KiB is fine; into the
     * last 100 bytes of it is not), and one that is no device memory: a
     * clean error through every path, nothing left registered */
    for (int pi = 0; pi < NPATHS; pi++) {
        if (all_paths[pi] == FERRY_ROUTE_DIRECT && !direct_ok) continue;
        o = small_opts(all_paths[pi]);
        uint64_t bad[2] = {dp[0], dp[1] + 16 * KiB - 100};
        int rc = ferry_load_into(d, f, idx, bad, 2, &o, NULL);
        CHECK(rc < 0);
        /* (several ring workers may fail; the message is the last one's) */
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "copy_htod");
        bad[1] = 4096; /* not a device address */
        rc = ferry_load_into(d, f, idx, bad, 2, &o, NULL);
        CHECK(rc < 0);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "not in any live allocation");
        usage u = use_of(d);
        CHECK_EQ(u.reg, 0);
        CHECK_EQ(u.dev, 32 * KiB);
        /* and the device still works */
        rc = ferry_load_into(d, f, idx, dp, 2, &o, NULL);
        CHECK_EQ(rc, 0);
    }
    g->ops->mem_free(g, dp[0]);
    g->ops->mem_free(g, dp[1]);
    ferry_file_close(f);
out:
    CHECK_EQ(use_of(d).dev, 0);
    ferry_device_close(d);
}

#define CASES(CASE)                      \
    CASE(load_into, test_load_into(ctx)) \
    CASE(alloc_edges, test_alloc_edges(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
