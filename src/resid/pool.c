/* pool.c - the store's pinned pool (chunks pinned once, best-fit ranges,
 * trimmed by make_room) and the host copies of evicted tensors. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- pinned pool ---- */

int rs_pool_alloc(ferry_store *s, uint64_t n, void **out)
{
    n = (n + 4095) & ~4095ull;
    int bc = -1; /* best fit over every chunk */
    size_t bi = 0;
    for (int c = 0; c < s->nchunks; c++) {
        const fy_ranges *fr = &s->chunks[c].fr;
        size_t i = fy_ranges_best(fr, n);
        if (i < fr->n && (bc < 0 || fr->v[i].len < s->chunks[bc].fr.v[bi].len)) bc = c, bi = i;
    }
    if (bc < 0) { /* grow */
        uint64_t size = n > PCHUNK ? (n + (2u << 20) - 1) & ~((2ull << 20) - 1) : PCHUNK;
        if (s->pool_bytes + size > s->o.pinned_budget) {
            if (s->pool_bytes + n > s->o.pinned_budget) return FERRY_E_BUDGET;
            size = n; /* the last bit of the budget */
        }
        pchunk *nc = fy_realloc(s->m, s->chunks, (size_t)(s->nchunks + 1) * sizeof *nc);
        if (!nc) return -ENOMEM;
        s->chunks = nc;
        pchunk *c = &nc[s->nchunks];
        memset(c, 0, sizeof *c);
        if (fy_ranges_give(&c->fr, s->m, 0, size) < 0) return -ENOMEM;
        int rc = fy_xfer_pinned_alloc(s->dev, size, (void **)&c->base);
        if (rc < 0) {
            fy_ranges_free(&c->fr, s->m);
            return rc;
        }
        c->size = size;
        s->pool_bytes += size;
        bc = s->nchunks++;
        bi = 0;
    }
    pchunk *c = &s->chunks[bc];
    *out = c->base + c->fr.v[bi].off;
    fy_ranges_take(&c->fr, bi, n);
    s->pinned_used += n;
    return 0;
}

/* Never fails: when the chunk's free list cannot grow, the range is lost to
 * fragmentation until the store is freed. */
void rs_pool_free(ferry_store *s, void *p, uint64_t n)
{
    n = (n + 4095) & ~4095ull;
    for (int ci = 0; ci < s->nchunks; ci++) {
        pchunk *c = &s->chunks[ci];
        if ((uint8_t *)p < c->base || (uint8_t *)p >= c->base + c->size) continue;
        (void)fy_ranges_give(&c->fr, s->m, (uint64_t)((uint8_t *)p - c->base), n);
        break;
    }
    s->pinned_used -= n;
}

/* Unpin and free the pool's chunks that hold nothing. */
void rs_pool_trim(ferry_store *s)
{
    for (int c = 0; c < s->nchunks;) {
        pchunk *ch = &s->chunks[c];
        if (ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size) {
            fy_xfer_pinned_free(s->dev, ch->base);
            fy_ranges_free(&ch->fr, s->m);
            s->pool_bytes -= ch->size;
            s->chunks[c] = s->chunks[--s->nchunks];
        } else {
            c++;
        }
    }
}

/* ---- tensors' host copies ---- */

void rs_cache_buffer_free(ferry_store *s, rtensor *t)
{
    rs_pool_free(s, t->host, t->nbytes);
    s->cache_used -= t->nbytes;
    t->host = NULL;
}

/* Drop whatever copy t has off the device (after it came back, or on removal). */
void rs_release_copy(ferry_store *s, rtensor *t)
{
    if (t->cached) { /* a pinned copy kept beside the device copy, or the tensor's copy in PINNED */
        t->cached = false;
        rs_cache_buffer_free(s, t);
    } else if (t->tier == FERRY_TIER_PINNED) {
        rs_pool_free(s, t->host, t->nbytes);
    } else if (t->tier == FERRY_TIER_HOST) {
        fy_free(s->m, t->host);
        s->host_used -= t->nbytes;
    } else if (t->tier == FERRY_TIER_SPILL) {
        fy_spill_release(s->spill, t->soff, t->nbytes);
    }
    t->host = NULL;
    t->soff = 0;
}

