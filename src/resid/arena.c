/* SPDX-License-Identifier: Apache-2.0 */
/* arena.c - the device arena (arena.h): blocks from the driver (segments),
 * carved into tensors and kept after their tensors leave, for reuse without a
 * driver call, until ferry_store_make_room (or the budget) gives them back.
 *
 * Why carve: a streamed pass frees and allocates a window's worth of tensors
 * at every block. With one driver block per tensor, a tensor reused only a
 * freed block of about its size; where a model's blocks differ in shape
 * (Flux: 19 double and 38 single blocks) every pass then made tens of
 * cuMemAlloc/cuMemFree calls, and each of those serialises the device's
 * streams, so the copies stopped overlapping compute. Carving a freed block
 * (best fit, neighbours merged when freed) serves any shape from the memory
 * the window just gave back, and a steady pass makes no driver call
 * (tests/py/test_binding_stream.py, test_steady_passes_make_no_driver_calls).
 *
 * Requests under SMALL bytes come from their own 2 MiB segments, so that a
 * bias never splits a large block for good (a resident one would sit in
 * the middle of a streamed block's memory and keep it from merging). A large
 * segment is 64 MiB (at most 1/32 of the budget, in 2 MiB granules, the
 * driver's), or its first request rounded up to a granule where that is
 * larger; either is just the request where the extra would be more than 1/32
 * of the budget (small budgets) or take the store past it. A segment made to
 * one tensor's measure is carved like any other. While a segment holds
 * tensors of streamed blocks it takes no others, and the other way round:
 * the window's pieces then merge among themselves as its blocks come and go.
 * Free space inside segments that still hold a tensor cannot go back to the
 * driver; device_cached counts it (it is the store's, reusable), and
 * rs_arena_release gives back whole free segments only. The tensors alone
 * never pass the budget (the eviction sees to that), and the free pieces may
 * take the store up to 1/16 past it: a move whose tensor fits in no free
 * piece and whose new segment would go further evicts more first (fetch.c),
 * until pieces merge or whole segments come free; only when nothing more
 * can go does it take the segment anyway. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"

enum {
    SMALL = 1 << 20,  /* requests below this come from small segments */
    LARGE = 64 << 20, /* a large segment's size, at least, ... */
    ROOMY = 32,       /* ... where that is at most 1/ROOMY of the budget */
    SLACK = 16,       /* free pieces may take the store 1/SLACK past its budget */
    GRANULE = 2 << 20 /* segment sizes are multiples of this */
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

void rs_arena_init(rs_arena *a, ferry_device *dev, const ferry_allocator *m, fy_err *err, uint64_t budget)
{
    *a = (rs_arena){.dev = dev, .m = m, .err = err, .budget = budget};
}

/* Index of the segment holding address p, else -1 (segments sorted by base). */
static int seg_find(const rs_arena *a, uint64_t p)
{
    int lo = 0, hi = a->nsegs - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const rs_seg *g = &a->segs[mid];
        if (p < g->base) hi = mid - 1;
        else if (p >= g->base + g->size) lo = mid + 1;
        else return mid;
    }
    return -1;
}

static void seg_remove(rs_arena *a, int i)
{
    rs_seg *g = &a->segs[i];
    fy_xfer_dev_free(a->dev, (fy_dptr)g->base);
    a->frees++;
    a->cached -= g->size;
    fy_ranges_free(&g->fr, a->m);
    memmove(g, g + 1, (size_t)(a->nsegs - i - 1) * sizeof *g);
    a->nsegs--;
}

uint64_t rs_arena_release(rs_arena *a, uint64_t want)
{
    uint64_t got = 0;
    bool drained = false;
    while (got < want) {
        int best = -1;
        for (int i = 0; i < a->nsegs; i++)
            if (a->segs[i].used == 0 && (best < 0 || a->segs[i].size > a->segs[best].size)) best = i;
        if (best < 0) break;
        if (!drained && a->drain) a->drain(a->drain_arg); /* kernels may still read what it held */
        drained = true;
        got += a->segs[best].size;
        seg_remove(a, best);
    }
    return got;
}

/* Carve n bytes out of the free space of segments of the request's kind
 * (small or not, streamed or not; best fit, the lowest address among
 * equals): 0 and *p, or -1 when none has room. */
static int carve(rs_arena *a, uint64_t n, bool small, bool streams, fy_dptr *p)
{
    int bs = -1;
    size_t br = 0;
    for (int i = 0; i < a->nsegs; i++) {
        rs_seg *g = &a->segs[i];
        if (g->small != small || g->size - g->used < n || (g->used && g->streams != streams)) continue;
        size_t r = fy_ranges_best(&g->fr, n);
        if (r == g->fr.n) continue;
        if (bs < 0 || g->fr.v[r].len < a->segs[bs].fr.v[br].len) bs = i, br = r;
    }
    if (bs < 0) return -1;
    rs_seg *g = &a->segs[bs];
    /* a live piece splits at most one free range in two: with room for
     * nlive + 2 ranges, freeing any of them never needs memory */
    if (fy_ranges_reserve(&g->fr, a->m, (size_t)g->nlive + 2) < 0) return -1;
    *p = (fy_dptr)g->fr.v[br].off;
    g->streams = streams; /* (a free segment changes sides) */
    fy_ranges_take(&g->fr, br, n);
    g->used += n;
    g->nlive++;
    a->cached -= n;
    return 0;
}

/* A new segment of size bytes from the driver, sorted in; on failure the free
 * segments are given back and the allocation tried once more. strict: not
 * when the arena would hold more than 1/16 past its budget (RS_FRAGMENTED). */
static int seg_new(rs_arena *a, uint64_t size, bool small, bool strict, int *out)
{
    if (a->nsegs == a->cap_segs) {
        int cap = a->cap_segs ? 2 * a->cap_segs : 64;
        rs_seg *ns = fy_realloc(a->m, a->segs, (size_t)cap * sizeof *ns);
        if (!ns) return fy_seterr(a->err, -ENOMEM, "store: out of host memory for the device block table");
        a->segs = ns, a->cap_segs = cap;
    }
    uint64_t held = a->used + a->cached + size; /* the budget bounds what the arena holds */
    if (held > a->budget) rs_arena_release(a, held - a->budget);
    if (strict && a->used + a->cached + size > a->budget + a->budget / SLACK) return RS_FRAGMENTED;
    fy_dptr p = 0;
    int rc = fy_xfer_dev_alloc(a->dev, size, &p);
    a->allocs++;
    if (rc < 0 && rs_arena_release(a, UINT64_MAX)) {
        rc = fy_xfer_dev_alloc(a->dev, size, &p);
        a->allocs++;
    }
    if (rc < 0) return rc;
    int i = 0;
    while (i < a->nsegs && a->segs[i].base < (uint64_t)p) i++;
    memmove(&a->segs[i + 1], &a->segs[i], (size_t)(a->nsegs - i) * sizeof *a->segs);
    a->segs[i] = (rs_seg){.base = (uint64_t)p, .size = size, .small = small};
    a->nsegs++;
    /* the whole segment is free until carved: one range (room reserved for two) */
    if (fy_ranges_reserve(&a->segs[i].fr, a->m, 2) < 0 ||
        fy_ranges_give(&a->segs[i].fr, a->m, (uint64_t)p, size) < 0) {
        a->cached += size; /* seg_remove takes it off again */
        seg_remove(a, i);
        return fy_seterr(a->err, -ENOMEM, "store: out of host memory for the device block table");
    }
    a->cached += size;
    *out = i;
    return 0;
}

int rs_arena_alloc(rs_arena *a, uint64_t nbytes, bool streams, bool strict, fy_dptr *p, uint64_t *dsize)
{
    uint64_t n = rs_dev_size(nbytes ? nbytes : 1);
    bool small = n < SMALL;
    fy_dptr got = 0;
    if (carve(a, n, small, streams, &got) < 0) {
        /* room for more tensors (the driver rounds to a granule anyway: a
         * tensor alone would leave the rest unused), where the extra is
         * little beside the budget and the budget has room for it; else
         * just the tensor */
        uint64_t held = a->used + a->cached, b = a->budget;
        uint64_t pool = small ? GRANULE : (b / ROOMY < LARGE ? b / ROOMY : LARGE) / GRANULE * GRANULE;
        uint64_t size = round_up(n, GRANULE);
        if (size < pool) size = pool;
        if (size - n > b / ROOMY || held + size > b) size = n;
        int i = 0;
        int rc = seg_new(a, size, small, strict, &i);
        if (rc != 0) return rc;                    /* an error, or RS_FRAGMENTED */
        if (carve(a, n, small, streams, &got) < 0) /* (room for the ranges was reserved) */
            return fy_seterr(a->err, -ENOMEM, "store: a new device block did not take its tensor");
    }
    *p = got;
    *dsize = n;
    a->used += nbytes; /* (the alignment's padding counts nowhere, as the driver's own rounding) */
    return 0;
}

void rs_arena_block(const rs_arena *a, uint64_t p, uint64_t *base, uint64_t *size)
{
    int i = seg_find(a, p);
    *base = i >= 0 ? a->segs[i].base : 0;
    *size = i >= 0 ? a->segs[i].size : 0;
}

void rs_arena_free(rs_arena *a, fy_dptr p, uint64_t dsize, uint64_t nbytes)
{
    if (p) {
        int i = seg_find(a, (uint64_t)p);
        rs_seg *g = i >= 0 ? &a->segs[i] : NULL;
        if (g && fy_ranges_give(&g->fr, a->m, (uint64_t)p, dsize) >= 0) {
            g->used -= dsize;
            g->nlive--;
            a->cached += dsize;
        } else {
            /* not carved from a segment, or freed twice: a bug, reported
             * rather than corrupting the free lists */
            fy_seterr(a->err, FERRY_E_INTERNAL,
                      "store: device block 0x%" PRIx64 " (%" PRIu64 " bytes) is not one the store holds",
                      (uint64_t)p, dsize);
        }
    }
    a->used -= nbytes;
}

void rs_arena_destroy(rs_arena *a)
{
    if (a->nsegs && a->drain) a->drain(a->drain_arg);
    while (a->nsegs) {
        a->cached += a->segs[a->nsegs - 1].used; /* (none, unless a piece was never freed) */
        a->segs[a->nsegs - 1].used = 0;
        seg_remove(a, a->nsegs - 1);
    }
    fy_free(a->m, a->segs);
    a->segs = NULL;
    a->cap_segs = 0;
}
