/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_moves.c - the device's copy rates (ferry_device_copy_rate) and the
 * moves resid/ asks for (xfer.h), with and without a completion. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ferry_device_copy_rate: both rates, nothing left behind, even when it fails. */
static void test_copy_rate(ferry_ctx *ctx)
{
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!d) return;
    double up = 0, down = 0;
    CHECK_EQ(ferry_device_copy_rate(d, 1, &up, &down), 0);
    CHECK(up > 0 && down > 0);
    CHECK_EQ(ferry_device_copy_rate(d, 1, NULL, NULL), 0);
    CHECK_EQ(ferry_device_copy_rate(NULL, 1, &up, &down), FERRY_E_INVAL);
    usage u = use_of(d);
    CHECK(u.dev == 0 && u.pinned == 0 && u.reg == 0);
    static const struct {
        fy_gpu_op op;
        long nth;
        int rc;
    } c[] = {
        {FY_OP_MEM_ALLOC, 1, -ENOMEM},   {FY_OP_HOST_ALLOC, 1, -ENOMEM}, {FY_OP_COPY, 1, FERRY_E_DEVICE},
        {FY_OP_COPY, 4, FERRY_E_DEVICE}, {FY_OP_ANY, 3, FERRY_E_DEVICE},
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        fy_gpu_sim_fault(fy_device_gpu(d), c[k].op, c[k].nth);
        CHECK_EQ(ferry_device_copy_rate(d, 1, &up, &down), c[k].rc);
        CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), c[k].op, 0), 0);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "injected failure");
        u = use_of(d);
        CHECK(u.dev == 0 && u.pinned == 0 && u.reg == 0);
    }
    /* a device too small for its 256 MiB buffer */
    ferry_device *s = open_dev(ctx, "sim:1MiB");
    if (s) {
        CHECK_EQ(ferry_device_copy_rate(s, 1, &up, &down), -ENOMEM);
        u = use_of(s);
        CHECK(u.dev == 0 && u.pinned == 0 && u.reg == 0);
    }
    ferry_device_close(s);
    ferry_device_close(d);
}

/* ---- the moves resid/ asks for (xfer.h), with and without a completion ---- */

static void test_moves(ferry_ctx *ctx)
{
    ferry_device *d = open_dev(ctx, "sim:64MiB");
    if (!d) return;
    CHECK_EQ(fy_xfer_bind(d), 0);
    const uint64_t n = 3 << 20; /* more than one copy piece per stream is not needed: 3 MiB */
    void *pin = NULL;
    fy_dptr dev = 0;
    CHECK_EQ(fy_xfer_pinned_alloc(d, n, &pin), 0);
    CHECK_EQ(fy_xfer_dev_alloc(d, n, &dev), 0);
    uint8_t *back = malloc(n);
    if (!pin || !dev || !back) goto out;
    for (uint64_t i = 0; i < n; i++) ((uint8_t *)pin)[i] = (uint8_t)(i * 13 + 1);
    /* queued: returns with a completion; waiting gives the bytes */
    fy_hostrange r = {pin, dev, n};
    fy_xfer_op *op = NULL;
    CHECK_EQ(fy_xfer_host_to_device(d, &r, 1, &op), 0);
    CHECK(op != NULL);
    int q = fy_xfer_op_query(op);
    CHECK(q == 0 || q == 1);
    CHECK_EQ(fy_xfer_op_wait(op), 0);
    fy_hostrange rb = {back, dev, n};
    CHECK_EQ(fy_xfer_device_to_host(d, &rb, 1, NULL), 0); /* NULL: waits before returning */
    CHECK(memcmp(back, pin, n) == 0);
    /* a file move finishes before returning and hands back a completed op */
    char path[600];
    snprintf(path, sizeof path, "%s/moves.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) {
        fy_fdrange fr = {4096, n, dev};
        op = NULL;
        CHECK_EQ(fy_xfer_device_to_fd(d, fd, path, &fr, 1, NULL, &op), 0);
        CHECK(op != NULL);
        CHECK_EQ(fy_xfer_op_query(op), 1);
        CHECK_EQ(fy_xfer_op_wait(op), 0);
        memset(back, 0, n);
        CHECK_EQ(fy_xfer_fd_to_host(d, fd, 4096, back, n), 0);
        CHECK(memcmp(back, pin, n) == 0);
        /* and back to the device through the ring, into a second block */
        fy_dptr dev2 = 0;
        CHECK_EQ(fy_xfer_dev_alloc(d, n, &dev2), 0);
        fy_fdrange fr2 = {4096, n, dev2};
        op = NULL;
        CHECK_EQ(fy_xfer_fd_to_device(d, fd, path, &fr2, 1, NULL, NULL, &op), 0);
        CHECK_EQ(fy_xfer_op_wait(op), 0);
        memset(back, 0, n);
        fy_hostrange rb2 = {back, dev2, n};
        CHECK_EQ(fy_xfer_device_to_host(d, &rb2, 1, NULL), 0);
        CHECK(memcmp(back, pin, n) == 0);
        fy_xfer_dev_free(d, dev2);
        /* a read past the end of the file is an error, with no op to wait on */
        CHECK_EQ(fy_xfer_fd_to_host(d, fd, 4096 + n, back, 16), FERRY_E_CORRUPT);
        close(fd);
        unlink(path);
    }
    /* ordering another stream after a queued move, on a device whose copies
     * take modelled time (64 MiB at 0.5 GB/s: at least 0.13 s) */
    {
        ferry_device *slow = open_dev(ctx, "sim:256MiB,0.5GB/s");
        if (slow) {
            CHECK_STR_HAS(ferry_device_desc(slow), "copies at 0.5 GB/s");
            fy_gpu *g = fy_device_gpu(slow);
            const uint64_t big = 64ull << 20;
            void *src = NULL, *dst = NULL;
            fy_dptr dbig = 0;
            fy_stream *theirs = NULL; /* stands in for the caller's (PyTorch's) stream */
            CHECK_EQ(fy_xfer_bind(slow), 0);
            CHECK_EQ(fy_xfer_pinned_alloc(slow, big, &src), 0);
            CHECK_EQ(fy_xfer_pinned_alloc(slow, big, &dst), 0);
            CHECK_EQ(fy_xfer_dev_alloc(slow, big, &dbig), 0);
            CHECK_EQ(g->ops->stream_new(g, &theirs), 0);
            if (src && dst && dbig && theirs) {
                for (uint64_t i = 0; i < big; i += 4096) ((uint8_t *)src)[i] = (uint8_t)(i >> 12 | 1);
                memset(dst, 0, big);
                double t0 = fy_now();
                fy_hostrange in = {src, dbig, big};
                fy_xfer_op *mv = NULL;
                CHECK_EQ(fy_xfer_host_to_device(slow, &in, 1, &mv), 0);
                /* their stream reads the block back only after the move landed,
                 * though nothing on the host waited for it */
                CHECK_EQ(fy_xfer_op_order(mv, g->ops->stream_raw(g, theirs)), 0);
                CHECK_EQ(g->ops->copy_dtoh(g, dst, dbig, (size_t)big, theirs), 0);
                CHECK_EQ(g->ops->stream_sync(g, theirs), 0);
                CHECK(memcmp(dst, src, big) == 0);
                CHECK(fy_now() - t0 >= 0.12); /* the modelled rate held: 64 MiB in, 64 MiB out */
                CHECK_EQ(fy_xfer_op_query(mv), 1);
                CHECK_EQ(fy_xfer_op_wait(mv), 0);
                /* raw 0 on sim: the caller's own thread waits */
                mv = NULL;
                CHECK_EQ(fy_xfer_host_to_device(slow, &in, 1, &mv), 0);
                CHECK_EQ(fy_xfer_op_order(mv, 0), 0);
                CHECK_EQ(fy_xfer_op_query(mv), 1);
                CHECK_EQ(fy_xfer_op_wait(mv), 0);
                CHECK(fy_xfer_op_order(NULL, 0) == FERRY_E_INVAL);
            }
            if (theirs) g->ops->stream_free(g, theirs);
            if (dbig) fy_xfer_dev_free(slow, dbig);
            if (dst) fy_xfer_pinned_free(slow, dst);
            if (src) fy_xfer_pinned_free(slow, src);
            ferry_device_close(slow);
        }
        ferry_device *bad = NULL;
        CHECK_EQ(ferry_device_open(ctx, "sim:64MiB,fast", &bad), FERRY_E_INVAL);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "copy rate");
        CHECK_EQ(ferry_device_open(ctx, "sim:64MiB,0GB/s", &bad), FERRY_E_INVAL);
        CHECK_EQ(ferry_device_open(ctx, "sim:64MiB,25GB", &bad), FERRY_E_INVAL);
        CHECK(bad == NULL);
    }
    /* a queued copy that fails: the call waits for what it queued, no op */
    CHECK(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 1) >= 0);
    op = (fy_xfer_op *)(uintptr_t)1;
    CHECK(fy_xfer_host_to_device(d, &r, 1, &op) < 0);
    CHECK(op == NULL);
    CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 0), 0);
    CHECK_EQ(fy_xfer_op_wait(NULL), FERRY_E_INVAL);
    CHECK_EQ(fy_xfer_op_query(NULL), FERRY_E_INVAL);
out:
    free(back);
    usage before = use_of(d);
    if (dev) fy_xfer_dev_free(d, dev);
    if (pin) fy_xfer_pinned_free(d, pin);
    usage u = use_of(d);
    CHECK_EQ(u.dev, 0);                   /* every block went back */
    CHECK(before.pinned - u.pinned >= n); /* (what stays pinned is the device's ring) */
    ferry_device_close(d);
}

#define CASES(CASE)                      \
    CASE(copy_rate, test_copy_rate(ctx)) \
    CASE(moves, test_moves(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
