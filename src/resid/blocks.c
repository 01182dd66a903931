/* SPDX-License-Identifier: Apache-2.0 */
/* blocks.c - the store's device memory: blocks from the driver (segments),
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
 * rs_cache_release gives back whole free segments only. The tensors alone
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

#include "store_impl.h"

enum {
    SMALL = 1 << 20,      /* requests below this come from small segments */
    LARGE = 64 << 20,     /* a large segment's size, at least, ... */
    ROOMY = 32,           /* ... where that is at most 1/ROOMY of the budget */
    SLACK = 16,           /* free pieces may take the store 1/SLACK past its budget */
    GRANULE = 2 << 20     /* segment sizes are multiples of this */
};

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* Index of the segment holding address p, else -1 (segments sorted by base). */
static int seg_find(const ferry_store *s, uint64_t p)
{
    int lo = 0, hi = s->nsegs - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const dseg *g = &s->segs[mid];
        if (p < g->base) hi = mid - 1;
        else if (p >= g->base + g->size) lo = mid + 1;
        else return mid;
    }
    return -1;
}

static void seg_remove(ferry_store *s, int i)
{
    dseg *g = &s->segs[i];
    fy_xfer_dev_free(s->dev, (fy_dptr)g->base);
    s->c.dev_frees++;
    s->cached -= g->size;
    fy_ranges_free(&g->fr, s->m);
    memmove(g, g + 1, (size_t)(s->nsegs - i - 1) * sizeof *g);
    s->nsegs--;
}

/* Give whole free segments back to the driver until at least want bytes were
 * returned (UINT64_MAX: all of them), the largest first. */
uint64_t rs_cache_release(ferry_store *s, uint64_t want)
{
    uint64_t got = 0;
    while (got < want) {
        int best = -1;
        for (int i = 0; i < s->nsegs; i++)
            if (s->segs[i].used == 0 && (best < 0 || s->segs[i].size > s->segs[best].size)) best = i;
        if (best < 0) break;
        if (s->reuse) rs_reuse_wait_all(s); /* kernels may still read what it held */
        got += s->segs[best].size;
        seg_remove(s, best);
    }
    return got;
}

/* Carve n bytes out of the free space of segments of t's kind (small or not,
 * streamed or not; best fit, the lowest address among equals): 0, or -1 when
 * none has room. */
static int carve(ferry_store *s, uint64_t n, bool small, rtensor *t)
{
    int bs = -1;
    size_t br = 0;
    for (int i = 0; i < s->nsegs; i++) {
        dseg *g = &s->segs[i];
        if (g->small != small || g->size - g->used < n || (g->used && g->streams != t->streams)) continue;
        size_t r = fy_ranges_best(&g->fr, n);
        if (r == g->fr.n) continue;
        if (bs < 0 || g->fr.v[r].len < s->segs[bs].fr.v[br].len) bs = i, br = r;
    }
    if (bs < 0) return -1;
    dseg *g = &s->segs[bs];
    /* a live tensor splits at most one free range in two: with room for
     * nlive + 2 ranges, freeing any of them never needs memory */
    if (fy_ranges_reserve(&g->fr, s->m, (size_t)g->nlive + 2) < 0) return -1;
    t->dptr = (fy_dptr)g->fr.v[br].off;
    g->streams = t->streams; /* (a free segment changes sides) */
    fy_ranges_take(&g->fr, br, n);
    g->used += n;
    g->nlive++;
    s->cached -= n;
    return 0;
}

/* A new segment of size bytes from the driver, sorted in; on failure the free
 * segments are given back and the allocation tried once more. strict: not
 * when the store would hold more than 1/16 past its budget (RS_FRAGMENTED). */
static int seg_new(ferry_store *s, uint64_t size, bool small, bool strict, int *out)
{
    if (s->nsegs == s->cap_segs) {
        int cap = s->cap_segs ? 2 * s->cap_segs : 64;
        dseg *ns = fy_realloc(s->m, s->segs, (size_t)cap * sizeof *ns);
        if (!ns) return fy_seterr(&s->err, -ENOMEM, "store: out of host memory for the device block table");
        s->segs = ns, s->cap_segs = cap;
    }
    uint64_t held = s->device_used + s->cached + size; /* the budget bounds what the store holds */
    if (held > s->o.device_budget) rs_cache_release(s, held - s->o.device_budget);
    if (strict && s->device_used + s->cached + size > s->o.device_budget + s->o.device_budget / SLACK)
        return RS_FRAGMENTED;
    fy_dptr p = 0;
    int rc = fy_xfer_dev_alloc(s->dev, size, &p);
    s->c.dev_allocs++;
    if (rc < 0 && rs_cache_release(s, UINT64_MAX)) {
        rc = fy_xfer_dev_alloc(s->dev, size, &p);
        s->c.dev_allocs++;
    }
    if (rc < 0) return rc;
    int i = 0;
    while (i < s->nsegs && s->segs[i].base < (uint64_t)p) i++;
    memmove(&s->segs[i + 1], &s->segs[i], (size_t)(s->nsegs - i) * sizeof *s->segs);
    s->segs[i] = (dseg){.base = (uint64_t)p, .size = size, .small = small};
    s->nsegs++;
    /* the whole segment is free until carved: one range (room reserved for two) */
    if (fy_ranges_reserve(&s->segs[i].fr, s->m, 2) < 0 ||
        fy_ranges_give(&s->segs[i].fr, s->m, (uint64_t)p, size) < 0) {
        s->cached += size; /* seg_remove takes it off again */
        seg_remove(s, i);
        return fy_seterr(&s->err, -ENOMEM, "store: out of host memory for the device block table");
    }
    s->cached += size;
    *out = i;
    return 0;
}

int rs_dev_alloc(ferry_store *s, rtensor *t, bool strict)
{
    uint64_t n = rs_dev_size(t->nbytes ? t->nbytes : 1);
    bool small = n < SMALL;
    if (carve(s, n, small, t) < 0) {
        /* room for more tensors (the driver rounds to a granule anyway: a
         * tensor alone would leave the rest unused), where the extra is
         * little beside the budget and the budget has room for it; else
         * just the tensor */
        uint64_t held = s->device_used + s->cached, b = s->o.device_budget;
        uint64_t pool = small ? GRANULE : (b / ROOMY < LARGE ? b / ROOMY : LARGE) / GRANULE * GRANULE;
        uint64_t size = round_up(n, GRANULE);
        if (size < pool) size = pool;
        if (size - n > b / ROOMY || held + size > b) size = n;
        int i = 0;
        int rc = seg_new(s, size, small, strict, &i);
        if (rc != 0) return rc; /* an error, or RS_FRAGMENTED */
        if (carve(s, n, small, t) < 0) /* (room for the ranges was reserved) */
            return fy_seterr(&s->err, -ENOMEM, "store: a new device block did not take its tensor");
    }
    t->dsize = n;
    s->device_used += t->nbytes; /* (the alignment's padding counts nowhere, as the driver's own rounding) */
    return 0;
}

void rs_dev_block(const ferry_store *s, uint64_t p, uint64_t *base, uint64_t *size)
{
    int i = seg_find(s, p);
    *base = i >= 0 ? s->segs[i].base : 0;
    *size = i >= 0 ? s->segs[i].size : 0;
}

void rs_dev_free(ferry_store *s, rtensor *t)
{
    if (t->dptr) {
        int i = seg_find(s, (uint64_t)t->dptr);
        dseg *g = i >= 0 ? &s->segs[i] : NULL;
        if (g && fy_ranges_give(&g->fr, s->m, (uint64_t)t->dptr, t->dsize) >= 0) {
            g->used -= t->dsize;
            g->nlive--;
            s->cached += t->dsize;
        } else {
            /* not carved from a segment, or freed twice: a bug, reported
             * rather than corrupting the free lists */
            fy_seterr(&s->err, FERRY_E_INTERNAL, "store: device block 0x%" PRIx64 " (%" PRIu64 " bytes) is not one the store holds",
                      (uint64_t)t->dptr, t->dsize);
        }
    }
    s->device_used -= t->nbytes;
    t->dptr = 0;
    t->dsize = 0;
}

void rs_dev_release_all(ferry_store *s)
{
    rs_reuse_wait_all(s);
    while (s->nsegs) {
        s->cached += s->segs[s->nsegs - 1].used; /* (none, unless a tensor was never freed) */
        s->segs[s->nsegs - 1].used = 0;
        seg_remove(s, s->nsegs - 1);
    }
    fy_free(s->m, s->segs);
    s->segs = NULL;
    s->cap_segs = 0;
}
