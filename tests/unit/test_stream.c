/* SPDX-License-Identifier: Apache-2.0 */
/* test_stream.c - a model larger than its budget, pass after pass, on the sim
 * device with modelled copy bandwidth: the plan, the stable resident set, the
 * window, pinned copies of streamed blocks, dirty blocks, faults in the middle
 * of a pass, budget changes, and prefetch and release from two threads.
 *
 * A pass runs like the PyTorch hooks run one: before block i, its move is
 * queued (unless a prefetch queued it) and held, a "compute" stream is ordered
 * after it, and a kernel stand-in (a device-to-host copy of the block on that
 * stream, which takes modelled time) reads it; then the block is released
 * after that stream and the next blocks are prefetched. Every kernel's bytes
 * are checked against the checkpoint: a block read before its copy landed, or
 * whose memory was reused before its release event, reads wrong bytes. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "io/io.h"
#include "xfer/xfer_test.h"

enum { NB = 12, WB = 1 << 20, FIXED = 64 << 10, BIAS = 16 };

static char dir[256], spill_dir[300], path[512];

static uint8_t byte_at(int t, uint64_t j)
{
    return (uint8_t)((uint32_t)t * 7919u + j * 31u + (j >> 9));
}

/* "embed.w" (FIXED bytes, outside the blocks), then NB blocks "blocks.K" of
 * a weight (WB) and a bias (BIAS), U8; tensor k's bytes are byte_at(k, j). */
static void write_model(void)
{
    char hdr[8192];
    size_t h = 0;
    uint64_t off = FIXED;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                          "{\"embed.w\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[0,%d]}", FIXED,
                          FIXED);
    for (int k = 0; k < NB; k++) {
        h += (size_t)snprintf(
            hdr + h, sizeof hdr - h,
            ",\"blocks.%d.w\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%" PRIu64 ",%" PRIu64
            "]},\"blocks.%d.b\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
            k, WB, off, off + WB, k, BIAS, off + WB, off + WB + BIAS);
        off += WB + BIAS;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int t = 0; t < 1 + 2 * NB; t++) {
        uint64_t n = t == 0 ? FIXED : t % 2 ? WB : BIAS;
        for (uint64_t j = 0; j < n; j++) fputc(byte_at(t, j), f);
    }
    fclose(f);
}

/* ---- a model on a store, run pass after pass ---- */

typedef struct run {
    ferry_ctx *ctx;
    ferry_device *d;
    fy_gpu *g;
    ferry_file *f;
    ferry_store *s;
    ferry_model *m;
    fy_stream *compute;
    int64_t blk[NB][2]; /* the tensors (weight, bias) of each block, in the model */
    int64_t embed;
    ferry_op *ops[NB];           /* queued and not yet waited for */
    uint8_t *kbuf[NB];           /* what each block's kernel read */
    uint8_t dirty_x[1 + 2 * NB]; /* per file tensor: XOR of its bytes made in place (0: clean) */
    int prefetch;
} run;

static ferry_store_stats stats(run *r)
{
    ferry_store_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_stats(r->s, &st), 0);
    return st;
}

static ferry_tensor_state tstate(run *r, int64_t t)
{
    ferry_tensor_state st = {.size = sizeof st};
    CHECK_EQ(ferry_model_tensor_state(r->m, t, &st), 0);
    return st;
}

static int open_run(run *r, ferry_ctx *ctx, const char *spec, uint64_t dev_budget, uint64_t host_budget,
                    uint64_t pinned_budget)
{
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    r->prefetch = 2;
    if (ferry_device_open(ctx, spec, &r->d) || ferry_file_open(ctx, path, 0, &r->f)) return -1;
    r->g = fy_device_gpu(r->d);
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = dev_budget,
                          .host_budget = host_budget,
                          .pinned_budget = pinned_budget,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2};
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 256 << 10};
    o.load = &lo;
    if (ferry_store_new(r->d, &o, &r->s) || ferry_store_add(r->s, "dit", &r->f, 1, 0, &r->m)) return -1;
    if (r->g->ops->stream_new(r->g, &r->compute)) return -1;
    r->embed = ferry_model_find(r->m, "embed.w");
    for (int k = 0; k < NB; k++) {
        char n[64];
        snprintf(n, sizeof n, "blocks.%d.w", k);
        r->blk[k][0] = ferry_model_find(r->m, n);
        snprintf(n, sizeof n, "blocks.%d.b", k);
        r->blk[k][1] = ferry_model_find(r->m, n);
        if (r->blk[k][0] < 0 || r->blk[k][1] < 0) return -1;
        if (!(r->kbuf[k] = malloc(WB))) return -1;
    }
    return 0;
}

static void close_run(run *r)
{
    for (int k = 0; k < NB; k++) {
        if (r->ops[k]) ferry_op_wait(r->ops[k]);
        free(r->kbuf[k]);
    }
    if (r->compute) r->g->ops->stream_free(r->g, r->compute);
    ferry_store_free(r->s);
    ferry_file_close(r->f);
    ferry_device_close(r->d);
}

/* open_run with the host budgets every case uses; on failure the case
 * fails and has nothing left to free */
static bool start(run *r, ferry_ctx *ctx, const char *spec, uint64_t dev_budget)
{
    if (open_run(r, ctx, spec, dev_budget, 64 << 20, 32 << 20) == 0) return true;
    CHECK(0);
    close_run(r);
    return false;
}

static int plan(run *r, int64_t window, uint64_t budget, int pinned_cache, ferry_plan *out)
{
    int64_t blocks[NB];
    for (int k = 0; k < NB; k++) blocks[k] = r->blk[k][0];
    ferry_plan_opts o = {.size = sizeof o,
                         .blocks = blocks,
                         .nblocks = NB,
                         .window = window,
                         .budget = budget,
                         .pinned_cache = pinned_cache};
    out->size = sizeof *out;
    return ferry_model_plan(r->m, &o, out);
}

/* Queue block k's move and hold it (both tensors). */
static int queue_block(run *r, int k)
{
    if (r->ops[k]) return 0;
    int rc = ferry_model_to_device_async(r->m, r->blk[k], 2, &r->ops[k]);
    if (rc < 0) return rc;
    CHECK_EQ(ferry_model_hold(r->m, r->blk[k][0]), 0);
    CHECK_EQ(ferry_model_hold(r->m, r->blk[k][1]), 0);
    return 0;
}

static void unhold_block(run *r, int k)
{
    CHECK_EQ(ferry_model_release(r->m, r->blk[k][0]), 0);
    CHECK_EQ(ferry_model_release(r->m, r->blk[k][1]), 0);
}

/* The weight's file tensor number (for byte_at): 1 + 2k. */
static int bad_kernel_bytes(run *r, int k)
{
    int t = 1 + 2 * k;
    for (uint64_t j = 0; j < WB; j++)
        if (r->kbuf[k][j] != (uint8_t)(byte_at(t, j) ^ r->dirty_x[t])) {
            fprintf(stderr, "block %d: byte %" PRIu64 " read %u, want %u\n", k, j, r->kbuf[k][j],
                    (uint8_t)(byte_at(t, j) ^ r->dirty_x[t]));
            return 1;
        }
    return 0;
}

/* One pass over the blocks, prefetching cyclically (the next pass's first
 * blocks at the end). 0, or the first error (its op waited, the pass stops). */
static int pass(run *r)
{
    uint64_t raw = r->g->ops->stream_raw(r->g, r->compute);
    int rc = ferry_model_to_device(r->m, &r->embed, 1); /* the tensors outside blocks */
    if (rc < 0) return rc;
    for (int i = 0; i < NB; i++) {
        if ((rc = queue_block(r, i)) < 0) return rc;
        ferry_tensor_state st = tstate(r, r->blk[i][0]);
        CHECK(st.dptr != 0);
        if ((rc = ferry_op_stream_wait(r->ops[i], raw)) < 0) { /* its copies failed */
            ferry_op_wait(r->ops[i]);
            r->ops[i] = NULL;
            r->g->ops->stream_sync(r->g, r->compute); /* the releases queued so far complete */
            return rc;
        }
        memset(r->kbuf[i], 0xEE, WB);
        CHECK_EQ(r->g->ops->copy_dtoh(r->g, r->kbuf[i], st.dptr, WB, r->compute), 0); /* the kernel */
        CHECK_EQ(ferry_model_release_after(r->m, r->blk[i][0], raw), 0);
        CHECK_EQ(ferry_model_release_after(r->m, r->blk[i][1], raw), 0);
        rc = ferry_op_wait(r->ops[i]);
        r->ops[i] = NULL;
        if (rc < 0) {
            r->g->ops->stream_sync(r->g, r->compute);
            return rc;
        }
        for (int j = 1; j <= r->prefetch; j++)
            if ((rc = queue_block(r, (i + j) % NB)) < 0) {
                r->g->ops->stream_sync(r->g, r->compute);
                return rc;
            }
    }
    CHECK_EQ(r->g->ops->stream_sync(r->g, r->compute), 0);
    int bad = 0;
    for (int i = 0; i < NB; i++) bad += bad_kernel_bytes(r, i);
    CHECK_EQ(bad, 0);
    return 0;
}

/* Wait for the prefetches a pass left queued (and drop their holds). */
static void drain(run *r)
{
    for (int k = 0; k < NB; k++)
        if (r->ops[k]) {
            ferry_op_wait(r->ops[k]);
            r->ops[k] = NULL;
            unhold_block(r, k);
        }
}

/* every tensor reads back as the checkpoint, XOR the in-place changes */
static int verify(run *r)
{
    int bad = 0;
    uint8_t *b = malloc(WB);
    for (int64_t i = 0; i < ferry_model_tensor_count(r->m); i++) {
        ferry_tensor_state st = tstate(r, i);
        int t = (int)ferry_model_find(r->m, st.name); /* file order == model order here */
        if (ferry_model_read(r->m, i, b) != 0) {
            bad++;
            continue;
        }
        for (uint64_t j = 0; j < st.nbytes; j++)
            if (b[j] != (uint8_t)(byte_at(t, j) ^ r->dirty_x[t])) {
                fprintf(stderr, "verify: %s (tier %s) byte %" PRIu64 " differs\n", st.name,
                        ferry_tier_name(st.tier), j);
                bad++;
                break;
            }
    }
    free(b);
    return bad;
}

static uint64_t block_bytes(void)
{
    return WB + BIAS;
}

/* ---- cases ---- */

static void test_plan(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:64MiB", 64 << 20)) return;
    ferry_plan p;
    /* it fits: everything resident */
    CHECK_EQ(plan(&r, 3, 0, 0, &p), 0);
    CHECK_EQ(p.resident_blocks, NB);
    CHECK_EQ(p.streamed_blocks, 0);
    CHECK_EQ(p.streamed_bytes, 0);
    CHECK_EQ(p.fixed_bytes, FIXED);
    CHECK_EQ(ferry_model_block_streams(r.m, 0), 0);
    /* room for the fixed tensors, a window of 3 and 4 more: 5 stream, spread out */
    uint64_t budget = FIXED + 7 * block_bytes();
    CHECK_EQ(plan(&r, 3, budget, 0, &p), 0);
    CHECK_EQ(p.resident_blocks, 4);
    CHECK_EQ(p.streamed_blocks, NB - 4);
    CHECK_EQ(p.window_bytes, 3 * block_bytes());
    CHECK_EQ(p.streamed_bytes, (NB - 4) * block_bytes());
    CHECK_EQ(p.resident_bytes, FIXED + 4 * block_bytes());
    int runs = 0, longest = 0, streamed = 0;
    for (int k = 0; k < NB; k++) {
        int st = ferry_model_block_streams(r.m, k);
        CHECK(st == 0 || st == 1);
        streamed += st;
        runs = st ? runs + 1 : 0;
        longest = runs > longest ? runs : longest;
        CHECK_EQ(tstate(&r, r.blk[k][1]).streams, st); /* the bias is the weight's group */
    }
    CHECK_EQ(streamed, NB - 4);
    CHECK(longest <= 2); /* 8 streamed among 12: never three in a row */
    ferry_plan g = {.size = sizeof g};
    CHECK_EQ(ferry_model_get_plan(r.m, &g), 0);
    CHECK_EQ(g.streamed_blocks, p.streamed_blocks);
    /* a dry run with a window of 1 says one more block would stay (and a
     * window too large for the budget says why), and changes nothing */
    {
        int64_t blocks[NB];
        for (int k = 0; k < NB; k++) blocks[k] = r.blk[k][0];
        ferry_plan_opts d = {
            .size = sizeof d, .blocks = blocks, .nblocks = NB, .window = 2, .budget = budget, .dry_run = 1};
        ferry_plan q = {.size = sizeof q};
        int before[NB];
        for (int k = 0; k < NB; k++) before[k] = tstate(&r, r.blk[k][1]).streams;
        CHECK_EQ(ferry_model_plan(r.m, &d, &q), 0);
        for (int k = 0; k < NB; k++)
            CHECK_EQ(tstate(&r, r.blk[k][1]).streams, before[k]); /* no tensor marked */
        CHECK_EQ(q.resident_blocks, 5);
        CHECK_EQ(q.window_bytes, 2 * block_bytes());
        d.window = 8; /* more than the budget holds beside the fixed tensors: a smaller window */
        CHECK_EQ(ferry_model_plan(r.m, &d, &q), 0);
        CHECK_EQ(q.window, 7);
        CHECK_EQ(q.resident_blocks, 0);
        CHECK_EQ(q.minimum_bytes, FIXED + block_bytes());
        CHECK_EQ(ferry_model_get_plan(r.m, &g), 0);
        CHECK_EQ(g.streamed_blocks, p.streamed_blocks);
        CHECK_EQ(g.window_bytes, 3 * block_bytes());
        int now = 0;
        for (int k = 0; k < NB; k++) now += ferry_model_block_streams(r.m, k) == 1;
        CHECK_EQ(now, NB - 4);
    }
    /* too small for the window: a window of what fits, down to one block */
    CHECK_EQ(plan(&r, 3, FIXED + 2 * block_bytes(), 0, &p), 0);
    CHECK_EQ(p.window, 2);
    CHECK_EQ(plan(&r, 3, FIXED + block_bytes(), 0, &p), 0);
    CHECK_EQ(p.window, 1);
    /* below the minimum: BUDGET, naming it and the budget */
    CHECK_EQ(plan(&r, 3, FIXED + block_bytes() - 1, 0, &p), FERRY_E_BUDGET);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "streaming needs at least");
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "the largest block");
    /* a reserve counts against the budget */
    CHECK_EQ(plan(&r, 3, 0, 0, &p), 0);
    ferry_plan_opts o = {.size = sizeof o};
    int64_t two[2] = {r.blk[0][0], r.blk[0][1]}; /* one block named twice */
    o.blocks = two;
    o.nblocks = 2;
    CHECK_EQ(ferry_model_plan(r.m, &o, NULL), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "two blocks are one group");
    int64_t oob[1] = {999};
    o.blocks = oob;
    o.nblocks = 1;
    CHECK_EQ(ferry_model_plan(r.m, &o, NULL), FERRY_E_INVAL);
    o.nblocks = 0; /* removes the plan */
    CHECK_EQ(ferry_model_plan(r.m, &o, NULL), 0);
    CHECK_EQ(ferry_model_get_plan(r.m, &g), FERRY_E_NOTFOUND);
    CHECK_EQ(ferry_model_block_streams(r.m, 0), FERRY_E_NOTFOUND);
    close_run(&r);
}

/* A cyclic pass over a model three times its window streams only what does
 * not fit, every pass; the resident set never leaves; with room in pinned
 * RAM a pass after the first reads no file. */
static void cyclic(ferry_ctx *ctx, int pinned_cache)
{
    run r;
    uint64_t budget = FIXED + 7 * block_bytes(); /* window 3 (= NB / 4), 4 resident */
    if (!start(&r, ctx, "sim:64MiB,0.4GB/s", budget)) return;
    ferry_plan p;
    CHECK_EQ(plan(&r, 3, 0, pinned_cache, &p), 0);
    CHECK_EQ(p.streamed_blocks, NB - 4);
    uint64_t h0 = stats(&r).bytes_htod, rd0 = stats(&r).bytes_read;
    CHECK_EQ(pass(&r), 0);
    ferry_store_stats a = stats(&r);
    CHECK_EQ(a.bytes_htod - h0, FIXED + NB * block_bytes()); /* the first pass brings everything once */
    CHECK_EQ(a.bytes_read - rd0, FIXED + NB * block_bytes());
    CHECK(a.tier_bytes[FERRY_TIER_DEVICE] <= budget);
    if (pinned_cache == 0) CHECK_EQ(a.pinned_cache_bytes, p.streamed_bytes);
    else CHECK_EQ(a.pinned_cache_bytes, 0);
    ferry_store_stats f0 = stats(&r);
    for (int n = 0; n < 4; n++) {
        ferry_store_stats b = stats(&r);
        CHECK_EQ(pass(&r), 0);
        ferry_store_stats c = stats(&r);
        CHECK_EQ(c.bytes_htod - b.bytes_htod, p.streamed_bytes); /* exactly the streamed blocks */
        CHECK_EQ(c.bytes_read - b.bytes_read, pinned_cache == 0 ? 0 : p.streamed_bytes);
        for (int k = 0; k < NB; k++)
            if (!ferry_model_block_streams(r.m, k)) CHECK_EQ(tstate(&r, r.blk[k][0]).tier, FERRY_TIER_DEVICE);
    }
    /* each "kernel" (a 1 MiB read at 0.4 GB/s on the compute stream) still
     * runs when the next blocks' moves need its block's memory: from pinned
     * RAM the lane waits for it on the device and the host never does (the
     * kernels read what they should: pass() checks every byte); a move
     * through the ring (no cache) is never ordered so: its host waits, if
     * anything is still running then */
    /* every block's addresses in one call: tensor_state's dptr, inside its segment */
    for (int k = 0; k < NB; k++) {
        uint64_t ad[6] = {1, 1, 1, 1, 1, 1};
        CHECK_EQ(ferry_model_device_addrs(r.m, r.blk[k], 2, ad), 0);
        for (int j = 0; j < 2; j++) {
            ferry_tensor_state st = tstate(&r, r.blk[k][j]);
            CHECK_EQ(ad[3 * j], st.dptr);
            if (st.dptr)
                CHECK(ad[3 * j + 1] <= st.dptr && st.dptr + st.nbytes <= ad[3 * j + 1] + ad[3 * j + 2]);
            else CHECK(ad[3 * j + 1] == 0 && ad[3 * j + 2] == 0);
        }
    }
    int64_t bad[1] = {ferry_model_tensor_count(r.m)};
    uint64_t junk[3];
    CHECK_EQ(ferry_model_device_addrs(r.m, bad, 1, junk), FERRY_E_INVAL);
    /* Whether a kernel still runs when its memory is reused is timing: on a
     * slow host (TSan, a loaded CI machine) four passes once had every
     * kernel done in time, and nothing to order. More passes, until one is
     * ordered (a host that never gets one fails below). */
    for (int extra = 0; pinned_cache == 0 && extra < 16 && stats(&r).fence_orders == f0.fence_orders; extra++)
        CHECK_EQ(pass(&r), 0);
    ferry_store_stats f1 = stats(&r);
    if (pinned_cache == 0) {
        CHECK(f1.fence_orders > f0.fence_orders);
        CHECK_EQ(f1.fence_waits, f0.fence_waits);
    } else {
        CHECK_EQ(f1.fence_orders, f0.fence_orders);
    }
    for (int k = 0; k < NB; k++)
        if (ferry_model_block_streams(r.m, k) && tstate(&r, r.blk[k][0]).tier != FERRY_TIER_DEVICE)
            CHECK_EQ(tstate(&r, r.blk[k][0]).tier, pinned_cache == 0 ? FERRY_TIER_PINNED : FERRY_TIER_SOURCE);
    drain(&r);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

static void test_cyclic(ferry_ctx *ctx)
{
    cyclic(ctx, 0);
}
static void test_cyclic_nocache(ferry_ctx *ctx)
{
    cyclic(ctx, -1);
}

/* A block released after the compute stream while "kernels" there still
 * read it (and change a dirty member in place), and another block's move
 * needing its memory: a move through the ring (a file read on streams of its
 * own) starts only after the host waited for them, and a group with a dirty
 * member is read back only after them, though only its clean leader was held
 * and released (as the PyTorch hooks hold a block). */
static void test_reuse_ordered(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:64MiB,0.05GB/s", FIXED + WB + WB / 2)) return; /* 1 MiB: 20 ms */
    uint64_t raw = r.g->ops->stream_raw(r.g, r.compute);
    enum { K = 4 };
    uint8_t *sink[K];
    for (int k = 0; k < K; k++) sink[k] = malloc(WB);
    for (int dirty = 0; dirty < 2; dirty++) {
        int a = dirty ? 1 : 0, b = dirty ? 0 : 1; /* block a is read while block b's move needs its room */
        CHECK_EQ(ferry_model_to_device(r.m, r.blk[a], 2), 0);
        uint8_t x[BIAS], y[BIAS], back[BIAS];
        memset(x, 0x11, sizeof x);
        memset(y, 0x22, sizeof y);
        ferry_tensor_state sw = tstate(&r, r.blk[a][0]), sb = tstate(&r, r.blk[a][1]);
        if (dirty) CHECK_EQ(ferry_model_write(r.m, r.blk[a][1], x), 0);
        CHECK_EQ(ferry_model_hold(r.m, r.blk[a][0]), 0); /* the leader only */
        for (int k = 0; k < K; k++) CHECK_EQ(r.g->ops->copy_dtoh(r.g, sink[k], sw.dptr, WB, r.compute), 0);
        if (dirty) CHECK_EQ(r.g->ops->copy_htod(r.g, sb.dptr, y, BIAS, r.compute), 0); /* changed in place */
        CHECK_EQ(ferry_model_release_after(r.m, r.blk[a][0], raw), 0);
        ferry_store_stats s0 = stats(&r);
        CHECK_EQ(ferry_model_to_device(r.m, r.blk[b], 2), 0); /* from the checkpoint, through the ring */
        ferry_store_stats s1 = stats(&r);
        CHECK(tstate(&r, r.blk[a][0]).tier != FERRY_TIER_DEVICE); /* evicted for it */
        CHECK_EQ(r.g->ops->stream_sync(r.g, r.compute), 0);
        for (int k = 0; k < K; k++)
            for (uint64_t j = 0; j < WB; j += 4099) CHECK_EQ(sink[k][j], byte_at(1 + 2 * a, j));
        CHECK_EQ(s1.fence_orders, s0.fence_orders); /* never the lane for a ring read */
        CHECK(s1.fence_waits > s0.fence_waits);
        if (dirty) {
            CHECK_EQ(ferry_model_read(r.m, r.blk[a][1], back), 0);
            CHECK_EQ(back[0], 0x22);
            CHECK_EQ(back[BIAS - 1], 0x22);
        }
        CHECK_EQ(ferry_model_evict(r.m, r.blk[b], 2), 0);
    }
    for (int k = 0; k < K; k++) free(sink[k]);
    close_run(&r);
}

/* Plain LRU over the same pass (no plan) misses every block: the contrast
 * the plan exists for. */
static void test_lru_thrashes(ferry_ctx *ctx)
{
    run r;
    uint64_t budget = FIXED + 7 * block_bytes();
    if (!start(&r, ctx, "sim:64MiB", budget)) return;
    CHECK_EQ(pass(&r), 0);
    ferry_store_stats b = stats(&r);
    CHECK_EQ(pass(&r), 0);
    ferry_store_stats c = stats(&r);
    CHECK(c.bytes_htod - b.bytes_htod >= NB * block_bytes()); /* every block, every pass (and more) */
    drain(&r);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* Dirty blocks (a LoRA merged in place), streamed and resident, survive many
 * passes; a pinned copy of a block goes stale the moment it is changed. */
static void test_dirty(ferry_ctx *ctx)
{
    run r;
    uint64_t budget = FIXED + 7 * block_bytes();
    if (!start(&r, ctx, "sim:64MiB,1GB/s", budget)) return;
    ferry_plan p;
    CHECK_EQ(plan(&r, 3, 0, 0, &p), 0);
    CHECK_EQ(pass(&r), 0);
    drain(&r);
    int ks = -1, kr = -1;
    for (int k = 0; k < NB; k++)
        if (ferry_model_block_streams(r.m, k)) ks = k;
        else kr = k;
    uint8_t *b = malloc(WB);
    for (int q = 0; q < 2; q++) {
        int k = q ? kr : ks;
        int64_t t = r.blk[k][0];
        CHECK_EQ(ferry_model_to_device(r.m, &t, 1), 0);
        CHECK_EQ(ferry_model_read(r.m, t, b), 0);
        for (int j = 0; j < WB; j++) b[j] ^= (uint8_t)(0x5A + q);
        CHECK_EQ(ferry_model_write(r.m, t, b), 0);
        CHECK_EQ(tstate(&r, t).cached, 0);
        r.dirty_x[1 + 2 * k] = (uint8_t)(0x5A + q);
    }
    free(b);
    for (int n = 0; n < 2; n++) CHECK_EQ(pass(&r), 0);
    /* the dirty streamed block is saved each time it leaves (the caller may
     * change it in place again unmarked), the resident one never */
    ferry_store_stats d0 = stats(&r);
    for (int n = 0; n < 4; n++) CHECK_EQ(pass(&r), 0);
    CHECK_EQ(stats(&r).bytes_dtoh - d0.bytes_dtoh, 4 * WB);
    CHECK_EQ(tstate(&r, r.blk[ks][0]).dirty, 1);
    CHECK(tstate(&r, r.blk[ks][0]).tier == FERRY_TIER_DEVICE ||
          tstate(&r, r.blk[ks][0]).tier == FERRY_TIER_PINNED);
    /* and a cache that must give way (host budget short) never drops its only copy */
    CHECK(ferry_store_make_room(r.s, UINT64_MAX, NULL) >= 0);
    CHECK_EQ(tstate(&r, r.blk[ks][0]).dirty, 1);
    CHECK_EQ(tstate(&r, r.blk[ks][0]).tier, FERRY_TIER_PINNED);
    drain(&r);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* A read error and a device allocation failure in the middle of a pass fail
 * that pass with a clear error and lose nothing; the next pass runs. */
static atomic_int fail_reads;
static ssize_t eio_pread(int fd, void *buf, size_t n, off_t off)
{
    if (atomic_load(&fail_reads)) {
        errno = EIO;
        return -1;
    }
    return pread(fd, buf, n, off);
}

static void test_faults(ferry_ctx *ctx)
{
    run r;
    uint64_t budget = FIXED + 7 * block_bytes();
    if (!start(&r, ctx, "sim:64MiB,1GB/s", budget)) return;
    ferry_plan p;
    CHECK_EQ(plan(&r, 3, 0, -1, &p), 0); /* no pinned copies: every pass reads the file */
    CHECK_EQ(pass(&r), 0);
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)eio_pread), 0);
    atomic_store(&fail_reads, 1);
    int rc = pass(&r);
    atomic_store(&fail_reads, 0);
    CHECK(rc < 0);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "dit");
    drain(&r);
    /* whatever the failed pass held goes back; nothing lost */
    CHECK_EQ(ferry_store_make_room(r.s, 0, NULL), 0); /* releases whose streams ran are dropped */
    for (int k = 0; k < NB; k++)
        while (tstate(&r, r.blk[k][0]).holds > 0) unhold_block(&r, k); /* the failed block's own */
    CHECK_EQ(verify(&r), 0);
    CHECK_EQ(pass(&r), 0);
    drain(&r);
    /* a device allocation failure (out of memory) in the middle of a pass:
     * the move evicts more and asks again, and the pass goes on */
    CHECK_EQ(ferry_model_evict(r.m, NULL, 0), 0);
    CHECK_EQ(ferry_store_make_room(r.s, 0, NULL), 0); /* the kept device blocks go: the next ones are new */
    uint64_t allocs = stats(&r).device_allocs;
    CHECK(fy_gpu_sim_fault(r.g, FY_OP_MEM_ALLOC, 5) >= 0);
    CHECK_EQ(pass(&r), 0);
    CHECK(stats(&r).device_allocs > allocs + 5); /* the failed call was made, and another after it */
    CHECK_EQ(fy_gpu_sim_fault(r.g, FY_OP_MEM_ALLOC, 0), 0);
    drain(&r);
    CHECK_EQ(ferry_store_make_room(r.s, 0, NULL), 0); /* releases whose streams ran are dropped */
    for (int k = 0; k < NB; k++)
        while (tstate(&r, r.blk[k][0]).holds > 0) unhold_block(&r, k); /* the failed block's own */
    CHECK_EQ(verify(&r), 0);
    CHECK_EQ(pass(&r), 0);
    drain(&r);
    CHECK_EQ(verify(&r), 0);
    fy_sys_reset();
    close_run(&r);
}

/* The budget shrinks (activations need room) and grows back mid-run: the
 * plan follows, the store stays within it, nothing is lost. */
static void test_budget(ferry_ctx *ctx)
{
    run r;
    uint64_t big = FIXED + 9 * block_bytes(), small = FIXED + 5 * block_bytes();
    if (!start(&r, ctx, "sim:64MiB,1GB/s", big)) return;
    ferry_plan p;
    CHECK_EQ(plan(&r, 3, 0, 0, &p), 0);
    CHECK_EQ(p.resident_blocks, 6);
    CHECK_EQ(pass(&r), 0);
    drain(&r);
    CHECK_EQ(ferry_store_set_device_budget(r.s, small), 0);
    CHECK(stats(&r).tier_bytes[FERRY_TIER_DEVICE] <= small);
    CHECK_EQ(stats(&r).device_budget, small);
    CHECK_EQ(ferry_model_get_plan(r.m, &p), 0);
    CHECK_EQ(p.resident_blocks, 2);
    CHECK_EQ(pass(&r), 0);
    for (int n = 0; n < 2; n++) {
        ferry_store_stats b = stats(&r);
        CHECK_EQ(pass(&r), 0);
        CHECK_EQ(stats(&r).bytes_htod - b.bytes_htod, p.streamed_bytes);
        CHECK(stats(&r).tier_bytes[FERRY_TIER_DEVICE] <= small);
    }
    drain(&r);
    CHECK_EQ(ferry_store_set_device_budget(r.s, big), 0);
    CHECK_EQ(ferry_model_get_plan(r.m, &p), 0);
    CHECK_EQ(p.resident_blocks, 6);
    CHECK_EQ(pass(&r), 0);
    ferry_store_stats b = stats(&r);
    CHECK_EQ(pass(&r), 0);
    CHECK_EQ(stats(&r).bytes_htod - b.bytes_htod, p.streamed_bytes);
    drain(&r);
    CHECK_EQ(ferry_store_set_device_budget(r.s, 0), FERRY_E_INVAL);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* Prefetch on one thread, compute and release on another (TSan runs this). */
typedef struct twin {
    run *r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ferry_op *q[NB];  /* queued by the prefetcher for the computer, per block */
    int next_compute; /* blocks the computer has finished */
    int total;
    int bad;
} twin;

static void *prefetcher(void *a)
{
    twin *w = a;
    for (int n = 0; n < w->total; n++) {
        int k = n % NB;
        pthread_mutex_lock(&w->mu);
        while (n - w->next_compute > w->r->prefetch || w->q[k]) pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        ferry_op *op = NULL;
        int rc = ferry_model_to_device_async(w->r->m, w->r->blk[k], 2, &op);
        if (rc == 0) {
            ferry_model_hold(w->r->m, w->r->blk[k][0]);
            ferry_model_hold(w->r->m, w->r->blk[k][1]);
        }
        pthread_mutex_lock(&w->mu);
        if (rc < 0) w->bad++;
        w->q[k] = op;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        if (rc < 0) break;
    }
    return NULL;
}

static void test_threads(ferry_ctx *ctx)
{
    run r;
    uint64_t budget = FIXED + 7 * block_bytes();
    if (!start(&r, ctx, "sim:64MiB,1GB/s", budget)) return;
    ferry_plan p;
    CHECK_EQ(plan(&r, 3, 0, 0, &p), 0);
    CHECK_EQ(ferry_model_to_device(r.m, &r.embed, 1), 0);
    twin w = {.r = &r, .total = 4 * NB};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, prefetcher, &w), 0);
    uint64_t raw = r.g->ops->stream_raw(r.g, r.compute);
    for (int n = 0; n < w.total; n++) {
        int k = n % NB;
        pthread_mutex_lock(&w.mu);
        while (!w.q[k] && !w.bad) pthread_cond_wait(&w.cv, &w.mu);
        ferry_op *op = w.q[k];
        pthread_mutex_unlock(&w.mu);
        if (!op) break;
        CHECK_EQ(ferry_op_stream_wait(op, raw), 0);
        ferry_tensor_state st = tstate(&r, r.blk[k][0]);
        CHECK_EQ(r.g->ops->copy_dtoh(r.g, r.kbuf[k], st.dptr, WB, r.compute), 0);
        CHECK_EQ(ferry_model_release_after(r.m, r.blk[k][0], raw), 0);
        CHECK_EQ(ferry_model_release_after(r.m, r.blk[k][1], raw), 0);
        CHECK_EQ(ferry_op_wait(op), 0);
        if (k == NB - 1) { /* a pass done: check what its kernels read */
            CHECK_EQ(r.g->ops->stream_sync(r.g, r.compute), 0);
            for (int i = 0; i < NB; i++) w.bad += bad_kernel_bytes(&r, i);
        }
        pthread_mutex_lock(&w.mu);
        w.q[k] = NULL;
        w.next_compute = n + 1;
        pthread_cond_broadcast(&w.cv);
        pthread_mutex_unlock(&w.mu);
    }
    pthread_join(th, NULL);
    CHECK_EQ(w.bad, 0);
    CHECK_EQ(r.g->ops->stream_sync(r.g, r.compute), 0);
    CHECK_EQ(verify(&r), 0);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    close_run(&r);
}


/* ---- regressions found in review ---- */

/* start() with the plan the cases below share (window 2, one block
 * resident) and k[0..n-1] = the first n blocks it streams (their moves go
 * through the lane); false, and the case failed, when there are not n. */
static bool start_streaming(run *r, ferry_ctx *ctx, const char *spec, int *k, int n)
{
    if (!start(r, ctx, spec, 64 << 20)) return false;
    ferry_plan p;
    CHECK_EQ(plan(r, 2, FIXED + 3 * block_bytes(), 0, &p), 0);
    int got = 0;
    for (int b = 0; b < NB && got < n; b++)
        if (ferry_model_block_streams(r->m, b) == 1) k[got++] = b;
    if (got == n) return true;
    CHECK(0);
    close_run(r);
    return false;
}

/* A queued move whose second copy fails while the lane is still busy with an
 * earlier move: the failed op must not return before the copies it did queue
 * have run, or one lands later in a device block another tensor reuses. */
static void test_lane_fault(ferry_ctx *ctx)
{
    run r;
    int k[2];
    if (!start_streaming(&r, ctx, "sim:64MiB,0.05GB/s", k, 2)) return; /* 1 MiB: 20 ms */
    ferry_op *a = NULL, *b = NULL;
    /* block k0 in pinned RAM first, so its move is DMA only: queued in the call */
    CHECK_EQ(ferry_model_to_device(r.m, r.blk[k[0]], 2), 0);
    CHECK_EQ(ferry_model_evict(r.m, r.blk[k[0]], 2), 0);
    CHECK_EQ(tstate(&r, r.blk[k[0]][0]).tier, FERRY_TIER_PINNED);
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[0]], 2, &a), 0); /* keeps the lane busy */
    CHECK(fy_gpu_sim_fault(r.g, FY_OP_COPY, 2) >= 0);                  /* the next bias copy fails */
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[1]], 2, &b), 0);
    /* ordered onto a stream (the PyTorch hooks' way): the failure and its cause */
    CHECK(ferry_op_stream_wait(b, r.g->ops->stream_raw(r.g, r.compute)) < 0);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "injected failure in copy");
    CHECK(ferry_op_wait(b) < 0);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "injected failure in copy");
    CHECK_EQ(fy_gpu_sim_fault(r.g, FY_OP_COPY, 0), 0);
    CHECK_EQ(tstate(&r, r.blk[k[1]][0]).tier, FERRY_TIER_SOURCE); /* rolled back */
    int res = 0; /* a resident block: loaded through the ring, into the freed device blocks */
    while (ferry_model_block_streams(r.m, res) != 0) res++;
    CHECK_EQ(ferry_model_to_device(r.m, r.blk[res], 2), 0);
    usleep(100 * 1000); /* the lane's leftovers would land now */
    CHECK_EQ(ferry_op_wait(a), 0);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* ferry_op_stream_wait while another thread is landing the op: the caller's
 * stream must still see the landed bytes. */
typedef struct reader_arg {
    run *r;
    int rc;
    int64_t t;
} reader_arg;
static void *land_by_reading(void *a)
{
    reader_arg *x = a;
    uint8_t *buf = malloc(WB);
    x->rc = buf ? ferry_model_read(x->r->m, x->t, buf) : -1;
    free(buf);
    return NULL;
}

static void test_stream_wait_while_landing(ferry_ctx *ctx)
{
    run r;
    int k[2];
    if (!start_streaming(&r, ctx, "sim:64MiB,0.05GB/s", k, 2)) return;
    ferry_op *a = NULL, *b = NULL;
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[0]], 2, &a), 0); /* 20 ms ahead on the lane */
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[1]], 2, &b), 0);
    reader_arg x = {.r = &r, .rc = -100, .t = r.blk[k[1]][0]};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, land_by_reading, &x), 0); /* lands b, waiting for its copies */
    usleep(5 * 1000);
    uint64_t raw = r.g->ops->stream_raw(r.g, r.compute);
    CHECK_EQ(ferry_op_stream_wait(b, raw), 0);
    ferry_tensor_state st = tstate(&r, r.blk[k[1]][0]);
    CHECK_EQ(r.g->ops->copy_dtoh(r.g, r.kbuf[k[1]], st.dptr, WB, r.compute), 0);
    CHECK_EQ(r.g->ops->stream_sync(r.g, r.compute), 0);
    pthread_join(th, NULL);
    CHECK_EQ(x.rc, 0);
    CHECK_EQ(bad_kernel_bytes(&r, k[1]), 0);
    CHECK_EQ(ferry_op_wait(b), 0);
    CHECK_EQ(ferry_op_wait(a), 0);
    close_run(&r);
}

/* A dirty streamed block changed in place again without a second mark
 * (ferry.h: dirty "from now on") keeps the later change when it leaves. */
static void test_dirty_changed_again(ferry_ctx *ctx)
{
    run r;
    int k[1];
    if (!start_streaming(&r, ctx, "sim:64MiB", k, 1)) return;
    int64_t t = r.blk[k[0]][0];
    uint8_t *b = malloc(WB);
    CHECK_EQ(ferry_model_to_device(r.m, &t, 1), 0);
    CHECK_EQ(ferry_model_read(r.m, t, b), 0);
    for (int j = 0; j < WB; j++) b[j] ^= 0x11;
    CHECK_EQ(ferry_model_write(r.m, t, b), 0); /* marked dirty */
    CHECK_EQ(ferry_model_evict(r.m, &t, 1), 0);
    CHECK_EQ(ferry_model_to_device(r.m, &t, 1), 0);
    for (int j = 0; j < WB; j++) b[j] ^= 0x22; /* changed in place again, not marked again */
    ferry_tensor_state st = tstate(&r, t);
    CHECK_EQ(r.g->ops->copy_htod(r.g, st.dptr, b, WB, r.compute), 0);
    CHECK_EQ(r.g->ops->stream_sync(r.g, r.compute), 0);
    CHECK_EQ(ferry_model_evict(r.m, &t, 1), 0);
    r.dirty_x[1 + 2 * k[0]] = 0x11 ^ 0x22;
    CHECK_EQ(verify(&r), 0);
    free(b);
    close_run(&r);
}


/* A queued move that reads the checkpoint returns before the reads ran (the
 * store's mover thread does them): reads held at a gate cannot have finished
 * when the call returns. */
static atomic_int gate_open, reads_done;
static ssize_t gated_pread(int fd, void *buf, size_t n, off_t off)
{
    for (int k = 0; k < 5000 && !atomic_load(&gate_open); k++) usleep(1000); /* at most 5 s */
    ssize_t got = pread(fd, buf, n, off);
    atomic_fetch_add(&reads_done, 1);
    return got;
}

static void test_async_file_reads(ferry_ctx *ctx)
{
    run r;
    int k[1];
    if (!start_streaming(&r, ctx, "sim:64MiB", k, 1)) return;
    atomic_store(&gate_open, 0);
    atomic_store(&reads_done, 0);
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)gated_pread), 0);
    ferry_op *op = NULL;
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[0]], 2, &op), 0);
    CHECK_EQ(atomic_load(&reads_done), 0); /* returned with its reads still to come */
    CHECK_EQ(ferry_op_query(op), 0);
    atomic_store(&gate_open, 1);
    CHECK_EQ(ferry_op_wait(op), 0);
    CHECK(atomic_load(&reads_done) > 0);
    fy_sys_reset();
    CHECK_EQ(tstate(&r, r.blk[k[0]][0]).tier, FERRY_TIER_DEVICE);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}


/* The same move's reads failing on the mover while the owner polls it: the
 * query says "not yet" until the op can report, then the error; the wait
 * names the file; nothing is lost. (TSan: the mover's writes to the op.) */
static void test_async_file_read_fails(ferry_ctx *ctx)
{
    run r;
    int k[1];
    if (!start_streaming(&r, ctx, "sim:64MiB", k, 1)) return;
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)eio_pread), 0);
    atomic_store(&fail_reads, 1);
    ferry_op *op = NULL;
    CHECK_EQ(ferry_model_to_device_async(r.m, r.blk[k[0]], 2, &op), 0);
    int q;
    while ((q = ferry_op_query(op)) == 0) usleep(100);
    CHECK(q < 0);
    CHECK(ferry_op_wait(op) < 0);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "dit.safetensors");
    atomic_store(&fail_reads, 0);
    fy_sys_reset();
    CHECK_EQ(tstate(&r, r.blk[k[0]][0]).tier, FERRY_TIER_SOURCE);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* ---- the streaming engine (ferry_streamer_*) ---- */

static ferry_streamer *engine(run *r, int64_t prefetch, uint64_t budget, uint64_t reserve, int copies)
{
    int64_t blocks[NB];
    for (int k = 0; k < NB; k++) blocks[k] = r->blk[k][0];
    ferry_streamer_opts o = {.size = sizeof o,
                             .blocks = blocks,
                             .nblocks = NB,
                             .prefetch = prefetch,
                             .budget = budget,
                             .reserve = reserve,
                             .copies = copies};
    ferry_streamer *st = NULL;
    int rc = ferry_streamer_new(r->m, &o, &st);
    if (rc < 0) fprintf(stderr, "ferry_streamer_new: %s\n", ferry_model_errmsg(r->m));
    CHECK_EQ(rc, 0);
    return st;
}

static ferry_streamer_stats estats(ferry_streamer *st)
{
    ferry_streamer_stats x = {.size = sizeof x};
    CHECK_EQ(ferry_streamer_get_stats(st, &x), 0);
    return x;
}

/* Streamed blocks whose moves are queued ahead (their leader held, their
 * block not running). */
static int in_flight(run *r, ferry_streamer *st, int running)
{
    int n = 0;
    for (int k = 0; k < NB; k++)
        if (k != running && ferry_streamer_block_streams(st, k) == 1 && tstate(r, r->blk[k][0]).holds) n++;
    return n;
}

/* A hook between a block's begin and its kernel (budget changes, competing
 * allocations): called with the block and the pass. */
typedef void (*mid_fn)(run *r, ferry_streamer *st, int k, void *arg);

/* One pass through the engine, blocks in order or in order[] when given,
 * each block's "kernel" a device-to-host copy on the compute stream read
 * back and checked. flights (may be NULL): the in-flight count after each
 * block_end of a streamed block, then at the pass's start. */
static int epass(run *r, ferry_streamer *st, const int *order, mid_fn mid, void *arg, int *flights)
{
    uint64_t raw = r->g->ops->stream_raw(r->g, r->compute);
    int rc = ferry_streamer_pass_begin(st, raw);
    if (rc < 0) return rc;
    if (flights) flights[NB] = in_flight(r, st, -1);
    CHECK_EQ(tstate(r, r->embed).tier, FERRY_TIER_DEVICE);
    for (int i = 0; i < NB; i++) {
        int k = order ? order[i] : i;
        if ((rc = ferry_streamer_block_begin(st, k, raw)) < 0) {
            ferry_streamer_pass_end(st, raw);
            r->g->ops->stream_sync(r->g, r->compute);
            return rc;
        }
        if (mid) mid(r, st, k, arg);
        ferry_tensor_state ts = tstate(r, r->blk[k][0]);
        CHECK(ts.dptr != 0 && ts.holds > 0); /* (its move may land later: the stream is ordered after it) */
        memset(r->kbuf[k], 0xEE, WB);
        CHECK_EQ(r->g->ops->copy_dtoh(r->g, r->kbuf[k], ts.dptr, WB, r->compute), 0); /* the kernel */
        if ((rc = ferry_streamer_block_end(st, k, raw)) < 0) {
            ferry_streamer_pass_end(st, raw);
            r->g->ops->stream_sync(r->g, r->compute);
            return rc;
        }
        if (flights && ferry_streamer_block_streams(st, k) == 1) flights[k] = in_flight(r, st, -1);
    }
    rc = ferry_streamer_pass_end(st, raw);
    CHECK_EQ(r->g->ops->stream_sync(r->g, r->compute), 0);
    int bad = 0;
    for (int k = 0; k < NB; k++) bad += bad_kernel_bytes(r, k);
    CHECK_EQ(bad, 0);
    return rc;
}

/* The engine streams exactly the plan's blocks each pass, keeps the window
 * full (prefetch + 1 in flight at a pass's start, prefetch after each
 * streamed block), and ordering and release on the caller's stream keep
 * every kernel's bytes right. */
static void test_engine_cyclic(ferry_ctx *ctx)
{
    for (int prefetch = 1; prefetch <= 3; prefetch++) {
        run r;
        uint64_t budget = FIXED + 8 * block_bytes();
        if (!start(&r, ctx, "sim:64MiB,0.4GB/s", budget)) return;
        ferry_streamer *st = engine(&r, prefetch, 0, 0, FERRY_STREAM_COPIES_PINNED);
        ferry_streamer_stats e = estats(st);
        CHECK_EQ(e.prefetch, prefetch);
        CHECK_EQ(e.resident_blocks + e.streamed_blocks, NB);
        CHECK(e.streamed_blocks > prefetch + 1);
        CHECK_EQ(e.minimum_bytes, FIXED + block_bytes());
        CHECK_EQ(e.pinned_copies, 1);
        for (int n = 0; n < 5; n++) {
            int flights[NB + 1];
            memset(flights, -1, sizeof flights);
            CHECK_EQ(epass(&r, st, NULL, NULL, NULL, flights), 0);
            e = estats(st);
            if (n == 0) continue; /* the first pass learns the order: every block moves as it runs */
            CHECK_EQ(e.pass_htod, e.streamed_bytes);
            CHECK_EQ(e.pass_read, 0); /* the first pass left pinned copies of the streamed blocks */
            CHECK_EQ(flights[NB], prefetch + 1);
            for (int k = 0; k < NB; k++)
                if (flights[k] >= 0) CHECK(flights[k] >= prefetch - 1 && flights[k] <= prefetch + 1);
        }
        CHECK_EQ(e.shrinks, 0);
        CHECK_EQ(e.passes, 5);
        ferry_streamer_free(st);
        CHECK_EQ(ferry_store_make_room(r.s, 0, NULL), 0); /* releases whose streams ran are dropped */
        for (int k = 0; k < NB; k++) CHECK_EQ(tstate(&r, r.blk[k][0]).holds, 0);
        CHECK_EQ(tstate(&r, r.embed).holds, 0);
        CHECK_EQ(ferry_model_get_plan(r.m, &(ferry_plan){.size = sizeof(ferry_plan)}), FERRY_E_NOTFOUND);
        CHECK_EQ(verify(&r), 0);
        close_run(&r);
    }
}

/* The first pass learns the order the blocks run in; later passes prefetch
 * in that order. */
static void test_engine_order(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:64MiB", FIXED + 6 * block_bytes())) return;
    ferry_streamer *st = engine(&r, 2, 0, 0, FERRY_STREAM_COPIES_RING);
    int order[NB];
    for (int i = 0; i < NB; i++) order[i] = NB - 1 - i;
    for (int n = 0; n < 3; n++) CHECK_EQ(epass(&r, st, order, NULL, NULL, NULL), 0);
    for (int k = 0; k < NB; k++) CHECK_EQ(ferry_streamer_block_position(st, k), NB - 1 - k);
    ferry_streamer_stats e = estats(st);
    CHECK_EQ(e.pass_htod, e.streamed_bytes);
    CHECK_EQ(e.pass_read, e.streamed_bytes); /* no pinned copies: from the checkpoint every pass */
    CHECK_EQ(e.pinned_copies, 0);
    CHECK_EQ(stats(&r).pinned_cache_bytes, 0);
    CHECK_EQ(ferry_streamer_block_begin(st, NB, 0), FERRY_E_INVAL);
    CHECK_EQ(ferry_streamer_block_position(st, -1), FERRY_E_INVAL);
    ferry_streamer_free(st);
    close_run(&r);
}

/* A tight budget plans a smaller window instead of failing; the minimum
 * (fixed + the largest block + the reserve) runs with one block at a time;
 * below it, the error names the minimum and the budget. */
static void test_engine_minimum(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:64MiB", 64 << 20)) return;
    uint64_t reserve = 4096, min = FIXED + block_bytes() + reserve;
    uint64_t budgets[] = {min, min + block_bytes(), min + 2 * block_bytes()};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        CHECK_EQ(ferry_store_set_device_budget(r.s, budgets[i]), 0);
        ferry_streamer *st = engine(&r, 3, 0, reserve, FERRY_STREAM_COPIES_AUTO);
        ferry_streamer_stats e = estats(st);
        CHECK_EQ(e.prefetch, (int64_t)i); /* the window: what fits beside the fixed tensors */
        CHECK_EQ(e.minimum_bytes, min);
        for (int n = 0; n < 3; n++) CHECK_EQ(epass(&r, st, NULL, NULL, NULL, NULL), 0);
        CHECK(stats(&r).tier_bytes[FERRY_TIER_DEVICE] <= budgets[i]);
        ferry_streamer_free(st);
    }
    int64_t blocks[NB];
    for (int k = 0; k < NB; k++) blocks[k] = r.blk[k][0];
    CHECK_EQ(ferry_store_set_device_budget(r.s, 64 << 20), 0);
    ferry_streamer_opts o = {
        .size = sizeof o, .blocks = blocks, .nblocks = NB, .budget = min - 1, .reserve = reserve};
    ferry_streamer *st = NULL;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_BUDGET);
    CHECK(st == NULL);
    char want[64];
    snprintf(want, sizeof want, "at least %" PRIu64 " device bytes", min);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), want);
    snprintf(want, sizeof want, "budget is %" PRIu64, min - 1);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), want);
    CHECK_EQ(ferry_model_get_plan(r.m, &(ferry_plan){.size = sizeof(ferry_plan)}), FERRY_E_NOTFOUND);
    /* bad options */
    o.budget = 0;
    o.nblocks = 0;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    o.nblocks = NB;
    o.copies = 7;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    o.copies = 0;
    blocks[1] = r.blk[0][1]; /* two blocks of one group */
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "one group");
    CHECK(ferry_streamer_pass_begin(NULL, 0) == FERRY_E_INVAL);
    ferry_streamer_free(NULL);
    /* the caller's own tensors outside the blocks: none here, so the passes
     * never bring the embedding and the plan does not count it: a budget of
     * the blocks alone holds them all, where counting it streams some */
    blocks[1] = r.blk[1][0];
    uint64_t all_blocks = NB * block_bytes();
    o.budget = all_blocks;
    o.reserve = 0;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), 0);
    CHECK(estats(st).streamed_blocks > 0); /* (the embedding counted: it does not fit) */
    ferry_streamer_free(st);
    CHECK(ferry_store_make_room(r.s, UINT64_MAX, NULL) >= 0); /* (earlier passes left the embedding there) */
    int64_t none[1] = {0};
    o.fixed = none;
    o.nfixed = 0;
    st = NULL;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), 0);
    if (st) {
        ferry_streamer_stats e = estats(st);
        CHECK_EQ(e.streamed_blocks, 0);
        CHECK_EQ(e.fixed_bytes, 0);
        CHECK_EQ(e.minimum_bytes, block_bytes());
        CHECK_EQ(ferry_streamer_pass_begin(st, 0), 0); /* (a pass without epass's kernel, which reads it) */
        for (int k = 0; k < NB; k++) {
            CHECK_EQ(ferry_streamer_block_begin(st, k, 0), 0);
            CHECK_EQ(ferry_streamer_block_end(st, k, 0), 0);
        }
        CHECK_EQ(ferry_streamer_pass_end(st, 0), 0);
        CHECK_EQ(estats(st).pass_htod, all_blocks);
        ferry_tensor_state ts = {.size = sizeof ts};
        CHECK_EQ(ferry_model_tensor_state(r.m, r.embed, &ts), 0);
        CHECK(ts.tier != FERRY_TIER_DEVICE);
        ferry_streamer_free(st);
    }
    int64_t listed[1] = {r.embed}; /* listed: counted again */
    o.fixed = listed;
    o.nfixed = 1;
    st = NULL;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), 0);
    if (st) CHECK_EQ(estats(st).fixed_bytes, FIXED);
    ferry_streamer_free(st);
    listed[0] = r.blk[2][1]; /* a block's tensor is no fixed one */
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "is in block 2");
    listed[0] = 1 << 20;
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_model_errmsg(r.m), "out of range");
    o.fixed = NULL; /* a count without a list */
    CHECK_EQ(ferry_streamer_new(r.m, &o, &st), FERRY_E_INVAL);
    close_run(&r);
}

/* Room taken outside the store (activations, another library: they make
 * room through the store, then allocate from the driver): the store's budget
 * still says everything fits, the device does not. The next passes find no
 * room for some moves and shrink (moves ahead cancelled, the resident set
 * given back) and never fail; once the room returns the plan grows back. */
static void test_engine_squeeze(ferry_ctx *ctx)
{
    run r;
    /* a device of 16 MiB: the model (12.2 MiB) fits whole in the budget, but
     * not beside an 8 MiB allocation of someone else's */
    if (!start(&r, ctx, "sim:16MiB", 15 << 20)) return;
    ferry_streamer *st = engine(&r, 2, 0, 0, FERRY_STREAM_COPIES_RING);
    for (int n = 0; n < 2; n++) CHECK_EQ(epass(&r, st, NULL, NULL, NULL, NULL), 0);
    ferry_streamer_stats e = estats(st);
    CHECK_EQ(e.streamed_blocks, 0);
    fy_dptr raw = 0;
    CHECK(ferry_store_make_room(r.s, 15 << 20, NULL) > 0);
    CHECK_EQ(r.g->ops->mem_alloc(r.g, 8 << 20, &raw), 0);
    for (int n = 0; n < 3; n++) CHECK_EQ(epass(&r, st, NULL, NULL, NULL, NULL), 0);
    e = estats(st);
    CHECK(e.shrinks > 0);
    CHECK(e.retries > 0);
    CHECK(e.streamed_blocks > 0); /* the resident set gave way */
    /* room returns: the plan grows back (after two passes without a shrink) */
    CHECK_EQ(r.g->ops->mem_free(r.g, raw), 0);
    for (int n = 0; n < 4; n++) CHECK_EQ(epass(&r, st, NULL, NULL, NULL, NULL), 0);
    e = estats(st);
    CHECK(e.grows > 0);
    CHECK_EQ(e.streamed_blocks, 0);
    /* the store's budget cut below what the plan holds, between passes */
    uint64_t min = e.minimum_bytes;
    CHECK_EQ(ferry_store_set_device_budget(r.s, min + block_bytes()), 0);
    for (int n = 0; n < 3; n++) CHECK_EQ(epass(&r, st, NULL, NULL, NULL, NULL), 0);
    CHECK(stats(&r).tier_bytes[FERRY_TIER_DEVICE] <= min + block_bytes());
    ferry_streamer_free(st);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

/* Thousands of passes at random budgets between the minimum and the model's
 * size, with budget changes before and during passes, another model taking
 * room in the middle of passes and device memory taken outside the store:
 * every pass succeeds and every kernel reads the checkpoint's bytes. */
typedef struct soak {
    ferry_model *other;
    uint64_t seed;
    fy_dptr raw;
    uint64_t min, total;
    int events, squeezes;
} soak;

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

static void soak_mid(run *r, ferry_streamer *st, int k, void *arg)
{
    (void)k;
    soak *sk = arg;
    switch (rnd(&sk->seed) % 16) {
    case 0: /* another model comes to the device (it may not fit: its failure is its own) */
        (void)ferry_model_to_device(sk->other, NULL, 0);
        sk->events++;
        break;
    case 4: /* and leaves */ (void)ferry_model_evict(sk->other, NULL, 0); break;
    case 1: /* the budget the engine plans for changes mid-pass (applied at the next pass) */
        CHECK_EQ(ferry_streamer_set_budget(st, sk->min + rnd(&sk->seed) % (sk->total - sk->min + 1), 0), 0);
        sk->events++;
        break;
    case 2: /* memory taken outside the store (room made through it first, as
               * a framework's allocator does; mid-pass it may not be: held) */
        if (!sk->raw && ferry_store_make_room(r->s, 5 * block_bytes(), NULL) >= 0 &&
            r->g->ops->mem_alloc(r->g, 5 * block_bytes(), &sk->raw) < 0)
            sk->raw = 0;
        sk->squeezes += sk->raw != 0;
        sk->events++;
        break;
    case 3:
        if (sk->raw) CHECK_EQ(r->g->ops->mem_free(r->g, sk->raw), 0);
        sk->raw = 0;
        break;
    default: break;
    }
}

static void test_engine_soak(ferry_ctx *ctx)
{
    run r;
    uint64_t total = FIXED + NB * block_bytes();
    /* a budget that holds the model whole, on a device that does not hold
     * it beside the memory taken outside the store, and never both models */
    if (!start(&r, ctx, "sim:16MiB", 15 << 20)) return;
    ferry_model *other = NULL;
    CHECK_EQ(ferry_store_add(r.s, "other", &r.f, 1, 0, &other), 0);
    soak sk = {.other = other, .seed = 0x9E3779B97F4A7C15ull, .min = FIXED + block_bytes(), .total = total};
    const char *env = getenv("FERRY_SOAK_PASSES");
    int passes = env ? atoi(env) : 2000;
    ferry_streamer *st = engine(&r, 2, sk.min + block_bytes(), 0, FERRY_STREAM_COPIES_AUTO);
    int failed = 0;
    for (int n = 0; n < passes && !failed; n++) {
        if (rnd(&sk.seed) % 8 == 0)
            CHECK_EQ(ferry_streamer_set_budget(st, sk.min + rnd(&sk.seed) % (total - sk.min + 1), 0), 0);
        if (rnd(&sk.seed) % 8 == 0 && !sk.raw && ferry_store_make_room(r.s, 9 * block_bytes(), NULL) >= 0 &&
            r.g->ops->mem_alloc(r.g, 9 * block_bytes(), &sk.raw) == 0)
            sk.squeezes++; /* between passes the resident set is not held: it must give way */
        int rc = epass(&r, st, NULL, soak_mid, &sk, NULL);
        if (rc < 0) {
            fprintf(stderr, "soak pass %d: %s\n", n, ferry_model_errmsg(r.m));
            failed = 1;
        }
        CHECK_EQ(rc, 0);
    }
    ferry_streamer_stats e = estats(st);
    CHECK_EQ(e.passes, passes);
    CHECK(sk.events > passes / 4);
    fprintf(stderr,
            "soak: %d passes, %d events (%d squeezes), %" PRIu64 " retries, %" PRIu64 " shrinks, %" PRIu64
            " grows\n",
            passes, sk.events, sk.squeezes, e.retries, e.shrinks, e.grows);
    if (sk.raw) CHECK_EQ(r.g->ops->mem_free(r.g, sk.raw), 0);
    ferry_streamer_free(st);
    CHECK_EQ(ferry_store_remove(other), 0);
    CHECK_EQ(verify(&r), 0);
    close_run(&r);
}

static ferry_ctx *ctx;
#define CASES(CASE)                                                      \
    CASE(plan, test_plan(ctx))                                           \
    CASE(cyclic, test_cyclic(ctx))                                       \
    CASE(cyclic_nocache, test_cyclic_nocache(ctx))                       \
    CASE(lru_thrashes, test_lru_thrashes(ctx))                           \
    CASE(reuse_ordered, test_reuse_ordered(ctx))                         \
    CASE(dirty, test_dirty(ctx))                                         \
    CASE(faults, test_faults(ctx))                                       \
    CASE(budget, test_budget(ctx))                                       \
    CASE(threads, test_threads(ctx))                                     \
    CASE(lane_fault, test_lane_fault(ctx))                               \
    CASE(stream_wait_while_landing, test_stream_wait_while_landing(ctx)) \
    CASE(dirty_changed_again, test_dirty_changed_again(ctx))             \
    CASE(async_file_reads, test_async_file_reads(ctx))                   \
    CASE(async_file_read_fails, test_async_file_read_fails(ctx))         \
    CASE(engine_cyclic, test_engine_cyclic(ctx))                         \
    CASE(engine_order, test_engine_order(ctx))                           \
    CASE(engine_minimum, test_engine_minimum(ctx))                       \
    CASE(engine_squeeze, test_engine_squeeze(ctx))                       \
    CASE(engine_soak, test_engine_soak(ctx))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "stream") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    snprintf(path, sizeof path, "%s/dit.safetensors", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    write_model();
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
