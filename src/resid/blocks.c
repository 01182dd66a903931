/* blocks.c - the device block cache: blocks of evicted tensors kept for
 * reuse (no driver call, memory the copy engine wrote before) until
 * ferry_store_make_room gives them back. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- the device block cache ---- */

/* Give cached device blocks back to the driver until at least want bytes
 * were returned (UINT64_MAX: all). */
uint64_t rs_cache_release(ferry_store *s, uint64_t want)
{
    uint64_t got = 0;
    while (s->ncache && got < want) {
        fy_range b = s->cache[--s->ncache];
        fy_xfer_dev_free(s->dev, (fy_dptr)b.off);
        s->cached -= b.len;
        got += b.len;
    }
    return got;
}

/* A device block of at least n bytes: a cached one that fits (not wasting
 * more than an eighth), else a new one; on failure the cache is given back and
 * the allocation tried once more. */
int rs_dev_alloc(ferry_store *s, rtensor *t)
{
    uint64_t n = t->nbytes;
    int best = -1;
    for (int i = 0; i < s->ncache; i++)
        if (s->cache[i].len >= n && s->cache[i].len - n <= n / 8 &&
            (best < 0 || s->cache[i].len < s->cache[best].len))
            best = i;
    if (best >= 0) {
        t->dptr = (fy_dptr)s->cache[best].off;
        t->dsize = s->cache[best].len;
        s->cached -= t->dsize;
        s->cache[best] = s->cache[--s->ncache];
    } else {
        uint64_t held = s->device_used + s->cached + n; /* the budget bounds what the store holds */
        if (held > s->o.device_budget) rs_cache_release(s, held - s->o.device_budget);
        int rc = fy_xfer_dev_alloc(s->dev, n, &t->dptr);
        if (rc < 0 && s->ncache) {
            rs_cache_release(s, UINT64_MAX);
            rc = fy_xfer_dev_alloc(s->dev, n, &t->dptr);
        }
        if (rc < 0) return rc;
        t->dsize = n;
    }
    s->device_used += t->dsize; /* what the store holds: a reused block may be larger */
    return 0;
}

void rs_dev_free(ferry_store *s, rtensor *t)
{
    if (t->dptr) {
        if (s->ncache == s->cap_cache) {
            int cap = s->cap_cache ? 2 * s->cap_cache : 64;
            fy_range *nc = fy_realloc(s->m, s->cache, (size_t)cap * sizeof *nc);
            if (nc) s->cache = nc, s->cap_cache = cap;
        }
        if (s->ncache < s->cap_cache) {
            s->cache[s->ncache++] = (fy_range){(uint64_t)t->dptr, t->dsize};
            s->cached += t->dsize;
        } else {
            fy_xfer_dev_free(s->dev, t->dptr); /* no room to remember it: give it back */
        }
    }
    s->device_used -= t->dsize;
    t->dptr = 0;
    t->dsize = 0;
}

