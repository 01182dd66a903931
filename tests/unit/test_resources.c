/* SPDX-License-Identifier: Apache-2.0 */
/* test_resources.c - the store's resources, each alone through its own
 * header and nothing of the store: the device arena (arena.h), the pinned
 * pool with its pinner (pinpool.h) and the release fences (fences.h) on a
 * sim device (xfer_test.h gives the fences a stream), the ordered lists of
 * make-room's candidates (lru.h), the spill file (spill.h), and the keeper
 * connection (keeper.h) against a keeper served on a thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "resid/arena.h"
#include "resid/fences.h"
#include "resid/keeper.h"
#include "resid/lru.h"
#include "resid/pinpool.h"
#include "resid/spill.h"
#include "xfer/xfer_test.h"

#define MiB ((uint64_t)1 << 20)

static char dir[256];

static int drains;
static void count_drain(void *arg)
{
    (void)arg;
    drains++;
}

static uint64_t dev_free(ferry_device *d)
{
    uint64_t fr = 0, tot = 0;
    CHECK_EQ(ferry_device_mem_info(d, &fr, &tot), 0);
    return fr;
}

/* what the segments hold agrees with the arena's counts */
static void arena_books(const rs_arena *a, uint64_t carved)
{
    uint64_t freeb = 0, used = 0;
    for (int i = 0; i < a->nsegs; i++) {
        freeb += a->segs[i].size - a->segs[i].used;
        used += a->segs[i].used;
        if (i) CHECK(a->segs[i - 1].base + a->segs[i - 1].size <= a->segs[i].base); /* sorted, apart */
    }
    CHECK_EQ(freeb, a->cached);
    CHECK_EQ(used, carved);
}

/* The arena: carving, reuse without a driver call, streamed pieces kept
 * apart, small requests in their own segments, lookups, a bad free
 * reported on its message slot, the budget's slack (RS_FRAGMENTED when
 * strict), the drain before memory goes back, and everything given back. */
static void test_arena(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    if (ferry_device_open(ctx, "sim:256MiB", &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(fy_xfer_bind(d), 0);
    uint64_t free0 = dev_free(d);
    fy_err err;
    fy_err_init(&err);
    rs_arena a;
    rs_arena_init(&a, d, &ctx->mem, &err, 128 * MiB); /* large segments: 128 MiB / 32 = 4 MiB */
    a.drain = count_drain;
    fy_dptr p[4] = {0};
    uint64_t ds[4] = {0};
    for (int k = 0; k < 3; k++) CHECK_EQ(rs_arena_alloc(&a, MiB, false, true, &p[k], &ds[k]), 0);
    CHECK_EQ(a.nsegs, 1);
    CHECK_EQ(a.allocs, 1);
    CHECK_EQ(a.segs[0].size, 4 * MiB);
    CHECK_EQ(a.used, 3 * MiB);
    CHECK_EQ(ds[0], MiB);
    CHECK(p[0] && p[1] && p[2] && p[0] != p[1] && p[1] != p[2]);
    arena_books(&a, 3 * MiB);
    CHECK_EQ(free0 - dev_free(d), 4 * MiB);
    /* a freed piece is carved again, no driver call */
    rs_arena_free(&a, p[1], ds[1], MiB);
    CHECK_EQ(a.used, 2 * MiB);
    arena_books(&a, 2 * MiB);
    fy_dptr q = 0;
    uint64_t dq = 0;
    CHECK_EQ(rs_arena_alloc(&a, MiB - 100, false, true, &q, &dq), 0);
    CHECK_EQ(dq, rs_dev_size(MiB - 100));
    CHECK_EQ(a.allocs, 1);
    CHECK(q == p[1] || q == p[0] + 3 * MiB); /* best fit: one of the two 1 MiB holes */
    p[1] = q, ds[1] = dq;
    /* a streamed piece goes to a segment of its own kind */
    CHECK_EQ(rs_arena_alloc(&a, MiB, true, true, &p[3], &ds[3]), 0);
    CHECK_EQ(a.nsegs, 2);
    CHECK_EQ(a.allocs, 2);
    uint64_t base = 0, size = 0;
    rs_arena_block(&a, (uint64_t)p[3] + 10, &base, &size);
    CHECK_EQ(base, (uint64_t)p[3]);
    CHECK_EQ(size, 4 * MiB);
    rs_arena_block(&a, 1, &base, &size);
    CHECK_EQ(size, 0);
    /* a small request: a 2 MiB segment of its own */
    fy_dptr sp = 0;
    uint64_t sd = 0;
    CHECK_EQ(rs_arena_alloc(&a, 100, false, true, &sp, &sd), 0);
    CHECK_EQ(sd, 512);
    CHECK_EQ(a.nsegs, 3);
    rs_arena_block(&a, (uint64_t)sp, &base, &size);
    CHECK_EQ(size, 2 * MiB);
    CHECK_EQ(a.used, 4 * MiB);
    /* a piece it never gave: reported, the books untouched */
    uint64_t cached = a.cached;
    rs_arena_free(&a, (fy_dptr)1, 512, 0);
    char msg[FY_ERRMSG_MAX];
    fy_err_copy(&err, msg, sizeof msg);
    CHECK_STR_HAS(msg, "is not one the store holds");
    CHECK_EQ(a.cached, cached);
    /* nothing free yet: releasing gives nothing back and drains nothing */
    CHECK_EQ(rs_arena_release(&a, UINT64_MAX), 0);
    CHECK_EQ(drains, 0);
    /* everything freed: whole segments go back, after one drain */
    for (int k = 0; k < 4; k++) rs_arena_free(&a, p[k], ds[k], k == 1 ? MiB - 100 : MiB);
    rs_arena_free(&a, sp, sd, 100);
    CHECK_EQ(a.used, 0);
    arena_books(&a, 0);
    CHECK_EQ(rs_arena_release(&a, UINT64_MAX), 10 * MiB);
    CHECK_EQ(drains, 1);
    CHECK_EQ(a.nsegs, 0);
    CHECK_EQ(a.frees, a.allocs);
    CHECK_EQ(dev_free(d), free0);
    rs_arena_destroy(&a);

    /* the budget's slack: 8 MiB of 1 MiB tensors, each a segment of its own
     * (a 2 MiB granule would waste more than 1/32 of the budget); strict, the
     * ninth would take the arena past 8.5 MiB: RS_FRAGMENTED, no driver call */
    rs_arena_init(&a, d, &ctx->mem, &err, 8 * MiB);
    fy_dptr v[10] = {0};
    uint64_t dv[10] = {0};
    for (int k = 0; k < 8; k++) CHECK_EQ(rs_arena_alloc(&a, MiB, false, true, &v[k], &dv[k]), 0);
    CHECK_EQ(a.nsegs, 8);
    CHECK_EQ(a.used, 8 * MiB);
    uint64_t allocs = a.allocs;
    CHECK_EQ(rs_arena_alloc(&a, MiB, false, true, &v[8], &dv[8]), RS_FRAGMENTED);
    CHECK_EQ(v[8], 0);
    CHECK_EQ(a.allocs, allocs);
    CHECK_EQ(rs_arena_alloc(&a, MiB, false, false, &v[8], &dv[8]), 0); /* not strict: taken anyway */
    CHECK_EQ(a.nsegs, 9);
    /* more than the device has: the driver's error, nothing kept */
    CHECK(rs_arena_alloc(&a, 512 * MiB, false, false, &v[9], &dv[9]) < 0);
    CHECK_EQ(a.nsegs, 9);
    CHECK_EQ(a.used, 9 * MiB);
    /* destroy gives back what is still carved too */
    rs_arena_destroy(&a);
    CHECK_EQ(a.nsegs, 0);
    CHECK_EQ(dev_free(d), free0);
    fy_err_destroy(&err);
    ferry_device_close(d);
}

/* The pinned pool under an owner's lock of its own: chunks pinned on demand
 * (the budget's last bits: exactly the request) and carved, a freed range
 * reused, the budget refused, idle chunks trimmed and unpinned; then the
 * pinner: a reserve pinned ahead in the background, adopted, given out
 * without pinning more, kept by trimming. */
static void test_pinpool(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    if (ferry_device_open(ctx, "sim:64MiB", &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(fy_xfer_bind(d), 0);
    fy_err err;
    fy_err_init(&err);
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    rs_pinpool p;
    rs_pinpool_init(&p, d, &ctx->mem, &err, &lock, 8 * MiB, 0);
    CHECK_EQ(rs_pinpool_start(&p), 0); /* no reserve: no pinner */
    CHECK(!p.pinner_on);
    pthread_mutex_lock(&lock);
    void *a = NULL, *b = NULL, *c = NULL, *x = NULL;
    CHECK_EQ(rs_pinpool_alloc(&p, 100, &a), 0); /* a chunk of 4 KiB (RS_PCHUNK is past the budget) */
    CHECK_EQ(p.nchunks, 1);
    CHECK_EQ(p.bytes, 4096);
    CHECK_EQ(p.used, 4096);
    CHECK_EQ(rs_pinpool_alloc(&p, MiB, &b), 0);
    CHECK_EQ(p.nchunks, 2);
    memset(a, 1, 4096); /* (real memory) */
    memset(b, 2, MiB);
    rs_pinpool_free(&p, a, 100);
    CHECK_EQ(p.used, MiB);
    CHECK_EQ(rs_pinpool_alloc(&p, 4000, &x), 0); /* the freed range again */
    CHECK(x == a);
    CHECK_EQ(p.nchunks, 2);
    CHECK_EQ(rs_pinpool_alloc(&p, 8 * MiB, &c), FERRY_E_BUDGET);
    CHECK_EQ(rs_pinpool_alloc(&p, 7 * MiB - 4096, &c), 0); /* the budget's rest, exactly */
    CHECK_EQ(p.bytes, 8 * MiB);
    CHECK_EQ(rs_pinpool_alloc(&p, 1, &x), FERRY_E_BUDGET);
    rs_pinpool_free(&p, a, 4000);
    rs_pinpool_free(&p, b, MiB);
    CHECK_EQ(p.used, 7 * MiB - 4096);
    rs_pchunk *idle = NULL;
    int n = rs_pinpool_trim_take(&p, &idle); /* the two idle chunks, not the one in use */
    CHECK_EQ(n, 2);
    CHECK_EQ(p.nchunks, 1);
    CHECK_EQ(p.bytes, 7 * MiB - 4096);
    pthread_mutex_unlock(&lock);
    rs_pinpool_drop(&p, idle, n); /* (unpinned without the owner's lock) */
    pthread_mutex_lock(&lock);
    rs_pinpool_free(&p, c, 7 * MiB - 4096);
    CHECK_EQ(p.used, 0);
    pthread_mutex_unlock(&lock);
    rs_pinpool_destroy(&p);
    CHECK_EQ(p.nchunks, 0);

    /* the pinner: 8 MiB ahead (one piece), in the background */
    rs_pinpool_init(&p, d, &ctx->mem, &err, &lock, 16 * MiB, 8 * MiB + 100);
    CHECK_EQ(p.target, 8 * MiB); /* (whole pages) */
    CHECK_EQ(rs_pinpool_start(&p), 0);
    CHECK(p.pinner_on);
    rs_pinpool_yield(&p, +1); /* a transfer: the pinner waits for it ... */
    rs_pinpool_yield(&p, -1); /* ... to end */
    CHECK_EQ(rs_pinpool_wait(&p), 0);
    CHECK_EQ(rs_pinpool_reserved(&p), 8 * MiB);
    pthread_mutex_lock(&lock);
    CHECK_EQ(rs_pinpool_alloc(&p, MiB, &a), 0); /* from the adopted piece: nothing pinned beside it */
    CHECK_EQ(p.nchunks, 1);
    CHECK_EQ(p.bytes, 8 * MiB);
    CHECK(p.chunks[0].reserved);
    rs_pinpool_free(&p, a, MiB);
    CHECK_EQ(rs_pinpool_trim_take(&p, &idle), 0); /* the reserve stays */
    CHECK_EQ(p.bytes, 8 * MiB);
    pthread_mutex_unlock(&lock);
    rs_pinpool_destroy(&p);
    pthread_mutex_destroy(&lock);
    fy_err_destroy(&err);
    ferry_device_close(d);
}

/* counts the items a fence let go */
static int gone[4];
static void fence_done(void *item, void *arg)
{
    (void)arg;
    gone[(int *)item - gone]++;
}
static bool fence_early(void *item, void *arg)
{
    return item == arg; /* (the one named lets go early) */
}

/* The release fences on a sim stream: pending per item, reaped once the
 * stream is done (each item let go once), one deferred early to the reuse
 * list and writes ordered after it, the rest waited for. */
static void test_fences(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    if (ferry_device_open(ctx, "sim:64MiB", &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(fy_xfer_bind(d), 0);
    fy_gpu *g = fy_device_gpu(d);
    fy_stream *st = NULL;
    CHECK_EQ(g->ops->stream_new(g, &st), 0);
    uint64_t raw = g->ops->stream_raw(g, st);
    rs_fences fs;
    rs_fences_init(&fs, d, &ctx->mem);
    bool device = true;
    for (int k = 0; k < 3; k++) CHECK_EQ(rs_fences_add(&fs, raw, &gone[k], &device), 0);
    CHECK(!device);
    CHECK_EQ(rs_fences_add(&fs, raw, &gone[0], &device), 0);
    CHECK_EQ(rs_fences_pending(&fs, &gone[0]), 2);
    CHECK_EQ(rs_fences_pending(&fs, &gone[3]), 0);
    CHECK_EQ(g->ops->stream_sync(g, st), 0);
    CHECK_EQ(rs_fences_reap(&fs, false, fence_done, NULL), 4); /* all done: no wait */
    CHECK_EQ(gone[0], 2);
    CHECK_EQ(gone[1], 1);
    CHECK_EQ(gone[2], 1);
    CHECK(fs.pending == NULL);
    CHECK_EQ(fs.waits, 0);
    /* one deferred: its item lets go now, its fence orders the next writes */
    CHECK_EQ(rs_fences_add(&fs, raw, &gone[1], &device), 0);
    CHECK_EQ(rs_fences_add(&fs, raw, &gone[2], &device), 0);
    CHECK_EQ(rs_fences_defer(&fs, fence_early, &gone[1]), 1);
    CHECK_EQ(rs_fences_pending(&fs, &gone[1]), 0);
    CHECK_EQ(rs_fences_pending(&fs, &gone[2]), 1);
    CHECK(fs.reuse != NULL);
    CHECK_EQ(rs_fences_order(&fs, true), 0); /* the lane waits for it (or it was done) */
    rs_fences_wait_all(&fs);
    CHECK(fs.reuse == NULL);
    CHECK_EQ(rs_fences_reap(&fs, true, fence_done, NULL), 1); /* waited for when not done */
    CHECK_EQ(gone[1], 1);                                     /* (the deferred one was not called back) */
    CHECK_EQ(gone[2], 2);
    CHECK(fs.pending == NULL);
    /* what is left at the end is waited for and freed */
    CHECK_EQ(rs_fences_add(&fs, raw, &gone[3], &device), 0);
    rs_fences_destroy(&fs);
    CHECK(fs.pending == NULL && fs.reuse == NULL);
    CHECK_EQ(gone[3], 0);
    g->ops->stream_free(g, st);
    ferry_device_close(d);
}

/* the ids of list li, front to back */
static int lru_list(const rs_lru *l, int li, int64_t *out, int max)
{
    int k = 0;
    for (int64_t id = rs_lru_first(l, li); id != RS_LRU_END && k < max; id = rs_lru_next(l, id))
        out[k++] = id;
    return k;
}

#define LIST_IS(l, li, ...)                                                           \
    do {                                                                              \
        const int64_t want_[] = {__VA_ARGS__};                                        \
        int64_t got_[64];                                                             \
        int n_ = lru_list((l), (li), got_, 64);                                       \
        CHECK_EQ(n_, (int)(sizeof want_ / sizeof want_[0]));                          \
        for (int i_ = 0; i_ < n_ && i_ < (int)(sizeof want_ / sizeof want_[0]); i_++) \
            CHECK_EQ(got_[i_], want_[i_]);                                            \
        CHECK_EQ((l)->count[li], (int64_t)(sizeof want_ / sizeof want_[0]));          \
    } while (0)

/* The candidates' lists: order by (key, id), references, touches, the two
 * lists apart, bulk listing and its sort. */
static void test_lru(ferry_ctx *ctx)
{
    rs_lru l;
    CHECK_EQ(rs_lru_init(&l, &ctx->mem, 16), 0);
    CHECK_EQ(rs_lru_first(&l, 0), RS_LRU_END);
    rs_lru_ref(&l, 5, 0, 10);
    rs_lru_ref(&l, 3, 0, 10); /* same key: by id */
    rs_lru_ref(&l, 9, 0, 7);  /* older: to the front */
    rs_lru_ref(&l, 1, 1, 10); /* the other list */
    LIST_IS(&l, 0, 9, 3, 5);
    LIST_IS(&l, 1, 1);
    /* references: listed from the first to the last */
    rs_lru_ref(&l, 3, 0, 99); /* (a second reference keeps its place and key) */
    rs_lru_unref(&l, 3);
    LIST_IS(&l, 0, 9, 3, 5);
    CHECK(rs_lru_listed(&l, 3));
    rs_lru_unref(&l, 3);
    CHECK(!rs_lru_listed(&l, 3));
    LIST_IS(&l, 0, 9, 5);
    rs_lru_unref(&l, 3); /* not listed: nothing */
    LIST_IS(&l, 0, 9, 5);
    /* a touch moves a listed id to its new place; an unlisted one keeps the key */
    rs_lru_touch(&l, 9, 11);
    LIST_IS(&l, 0, 5, 9);
    rs_lru_touch(&l, 4, 12);
    CHECK_EQ(l.key[4], 12);
    rs_lru_ref(&l, 2, 0, 11); /* between equals by id */
    LIST_IS(&l, 0, 5, 2, 9);
    rs_lru_touch(&l, 1, 20);
    LIST_IS(&l, 1, 1);
    /* bulk: appended out of order, then sorted */
    rs_lru_clear(&l);
    CHECK_EQ(rs_lru_first(&l, 0), RS_LRU_END);
    CHECK_EQ(rs_lru_first(&l, 1), RS_LRU_END);
    int64_t ids[] = {7, 2, 11, 0, 4, 13};
    uint64_t keys[] = {5, 5, 1, 9, 5, 1};
    for (int k = 0; k < 6; k++) rs_lru_append(&l, ids[k], k % 2 == 0 ? 0 : 1, keys[k], 1 + k % 2);
    rs_lru_sort(&l);
    LIST_IS(&l, 0, 11, 4, 7);
    LIST_IS(&l, 1, 13, 2, 0);
    rs_lru_unref(&l, 2); /* two references */
    LIST_IS(&l, 1, 13, 2, 0);
    rs_lru_unref(&l, 2);
    LIST_IS(&l, 1, 13, 0);
    rs_lru_destroy(&l);
    /* an id per clock tick, touched in order: a front-to-back walk sees the
     * oldest first, and placing each costs nothing (found at the back) */
    CHECK_EQ(rs_lru_init(&l, &ctx->mem, 1000), 0);
    for (int64_t id = 0; id < 1000; id++) rs_lru_ref(&l, id, 0, (uint64_t)id);
    for (int64_t id = 0; id < 1000; id += 2) rs_lru_touch(&l, id, 1000 + (uint64_t)id);
    int64_t prev = -1, k = 0;
    for (int64_t id = rs_lru_first(&l, 0); id != RS_LRU_END; id = rs_lru_next(&l, id), k++) {
        if (k < 500) CHECK_EQ(id, 2 * k + 1);
        else CHECK_EQ(id, 2 * (k - 500));
        CHECK(prev < 0 || l.key[prev] <= l.key[id]);
        prev = id;
    }
    CHECK_EQ(k, 1000);
    rs_lru_destroy(&l);
}

/* The spill file through spill.h alone: reservations, reuse of a released
 * range (held, then flushed in three steps), a batch taken back exactly. */
static void test_spill_file(void)
{
    fy_err err;
    fy_err_init(&err);
    rs_spill *sp = NULL;
    int rc = rs_spill_open(dir, NULL, &err, &sp);
    if (rc == FERRY_E_INVAL) { /* a tmpfs TMPDIR: spilling there is refused, rightly */
        fy_err_destroy(&err);
        exit(77);
    }
    CHECK_EQ(rc, 0);
    if (!sp) return;
    CHECK(rs_spill_fd(sp) >= 0);
    CHECK_EQ(strcmp(rs_spill_dir(sp), dir), 0);
    uint64_t off[3], res = 0, size = 0;
    for (int k = 0; k < 3; k++) CHECK_EQ(rs_spill_reserve(sp, 10000, &off[k]), 0);
    CHECK_EQ(off[0], 0);
    CHECK_EQ(off[1], 12288);
    CHECK_EQ(off[2], 24576);
    rs_spill_usage(sp, &res, &size);
    CHECK_EQ(res, 3 * 12288);
    CHECK_EQ(size, 3 * 12288);
    /* held: the middle range is free for reuse, not punched yet */
    rs_spill_hold(sp);
    rs_spill_release(sp, off[1], 10000);
    rs_spill_usage(sp, &res, &size);
    CHECK_EQ(res, 2 * 12288);
    uint64_t again = 0;
    CHECK_EQ(rs_spill_reserve(sp, 4096, &again), 0);
    CHECK_EQ(again, off[1]); /* best fit reuses it */
    rs_spill_release(sp, again, 4096);
    /* the flush in three steps: take, punch (no lock needed), give back */
    fy_range *r = NULL;
    size_t n = 0;
    CHECK_EQ(rs_spill_flush_take(sp, &r, &n), 0);
    CHECK(r != NULL && n >= 1);
    rs_spill_punch(rs_spill_fd(sp), r, n);
    rs_spill_flush_give(sp, r, n);
    /* a batch taken back last first leaves the file as it was */
    rs_spill_usage(sp, &res, &size);
    uint64_t res0 = res, size0 = size, b[2];
    CHECK_EQ(rs_spill_check_room(sp, 2 * 8192), 0);
    CHECK_EQ(rs_spill_reserve(sp, 8192, &b[0]), 0);
    CHECK_EQ(rs_spill_reserve(sp, 8192, &b[1]), 0);
    rs_spill_unreserve(sp, b[1], 8192);
    rs_spill_unreserve(sp, b[0], 8192);
    rs_spill_usage(sp, &res, &size);
    CHECK_EQ(res, res0);
    CHECK_EQ(size, size0);
    /* the tail released: the file shrinks to what is reserved */
    rs_spill_release(sp, off[2], 10000);
    rs_spill_usage(sp, &res, &size);
    CHECK_EQ(res, 12288);
    CHECK_EQ(size, 12288);
    CHECK_EQ(rs_spill_reserve(sp, 0, &again), FERRY_E_INVAL);
    rs_spill_close(sp);
    fy_err_destroy(&err);
}

/* A keeper served on a thread until its stop pipe is written. */
typedef struct served {
    ferry_keep_opts o;
    int rc;
} served;

static void *serve(void *arg)
{
    served *v = arg;
    char err[512];
    v->rc = ferry_keep_serve(&v->o, err, sizeof err);
    if (v->rc < 0) fprintf(stderr, "serve: %s\n", err);
    return NULL;
}

static int fill_from_file(void *arg, const rs_kreq *r, void *dst)
{
    return ferry_file_tensor_read(arg, r->index, 0, dst, (size_t)r->nbytes);
}

/* The keeper connection through keeper.h alone: no keeper there (an error,
 * nothing used), then one on a thread: misses, a feed, hits with the file's
 * bytes, released; the keeper stopped: the connection's loss recorded, no
 * hit, nothing fails. */
static void test_keeper(ferry_ctx *c)
{
    char sock[400], path[400], err[1400];
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    snprintf(path, sizeof path, "%s/k.safetensors", dir);
    static const char hdr[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[5000],\"data_offsets\":[0,5000]},"
                              "\"b\":{\"dtype\":\"U8\",\"shape\":[40],\"data_offsets\":[5000,5040]}}";
    FILE *fp = fopen(path, "wb");
    uint64_t hl = sizeof hdr - 1;
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    for (int i = 0; i < 5040; i++) fputc(i * 13 + 1, fp);
    fclose(fp);
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(c, path, 0, &f), 0);
    rs_keeper kp;
    rs_keeper_init(&kp, &c->mem);
    CHECK(rs_keeper_use(&kp, sock, 1000, err, sizeof err) < 0);
    CHECK_STR_HAS(err, sock);
    CHECK(!rs_keeper_used(&kp));
    int stop[2] = {-1, -1};
    CHECK_EQ(pipe(stop), 0);
    served v = {.o = {.socket = sock, .device = "sim", .budget = 1 << 20, .stop_fd = stop[0]}};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, serve, &v), 0);
    int rc = -1;
    for (int tries = 0; tries < 500 && rc < 0; tries++) {
        rc = rs_keeper_use(&kp, sock, 1000, err, sizeof err);
        if (rc < 0) usleep(10000);
    }
    CHECK_EQ(rc, 0);
    rs_kfile kf = {0};
    rs_kreq r[2] = {{.kf = &kf, .f = f, .name = "a", .index = 0, .nbytes = 5000},
                    {.kf = &kf, .f = f, .name = "b", .index = 1, .nbytes = 40}};
    ferry_store_keeper_stats st;
    CHECK_EQ(rs_keeper_get(&kp, r, 2), 0);
    CHECK(kf.known && kf.path && kf.size == 8 + hl + 5040);
    rs_keeper_feed(&kp, r, 2, fill_from_file, f);
    rs_keeper_stats(&kp, &st);
    CHECK_EQ(st.misses, 2);
    CHECK_EQ(st.bytes_fed, 5040);
    CHECK_EQ(rs_keeper_get(&kp, r, 2), 2);
    uint8_t want[5000];
    CHECK_EQ(ferry_file_tensor_read(f, 0, 0, want, 5000), 0);
    CHECK(r[0].kind == RS_KV_HOST && r[0].attached && memcmp(r[0].host, want, 5000) == 0);
    rs_keeper_detach(&kp, r, 2, true);
    CHECK(!r[0].attached && r[0].kind == RS_KV_HOST); /* (still a hit: a feed skips it) */
    rs_keeper_stats(&kp, &st);
    CHECK_EQ(st.hits, 2);
    CHECK_EQ(st.bytes_served, 5040);
    CHECK_EQ(st.connected, 1);
    /* the keeper gone: the next asks find no connection, and say why */
    CHECK_EQ(write(stop[1], "x", 1), 1);
    pthread_join(th, NULL);
    CHECK_EQ(v.rc, 0);
    CHECK_EQ(rs_keeper_get(&kp, r, 2), 0);
    rs_keeper_feed(&kp, r, 2, fill_from_file, f);
    rs_keeper_stats(&kp, &st);
    CHECK(st.errors >= 1);
    CHECK_EQ(st.connected, 0);
    CHECK_STR_HAS(st.last_error, sock);
    CHECK_EQ(st.bytes_fed, 5040);
    close(stop[0]);
    close(stop[1]);
    rs_kfile_clear(&kp, &kf, 1);
    CHECK(kf.path == NULL && !kf.known);
    rs_keeper_destroy(&kp);
    ferry_file_close(f);
}

static ferry_ctx *ctx;
#define CASES(CASE)                     \
    CASE(arena, test_arena(ctx))        \
    CASE(pinpool, test_pinpool(ctx))    \
    CASE(fences, test_fences(ctx))      \
    CASE(lru, test_lru(ctx))            \
    CASE(spill_file, test_spill_file()) \
    CASE(keeper, test_keeper(ctx))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "resources") < 0) return 1;
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
