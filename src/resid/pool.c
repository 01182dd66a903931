/* SPDX-License-Identifier: Apache-2.0 */
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

/* The best-fitting free range for n bytes over every chunk: its chunk (-1:
 * none) and index in *bi. */
static int pool_best(const ferry_store *s, uint64_t n, size_t *bi)
{
    int bc = -1;
    for (int c = 0; c < s->nchunks; c++) {
        const fy_ranges *fr = &s->chunks[c].fr;
        size_t i = fy_ranges_best(fr, n);
        if (i < fr->n && (bc < 0 || fr->v[i].len < s->chunks[bc].fr.v[*bi].len)) bc = c, *bi = i;
    }
    return bc;
}

/* A chunk of size bytes, pinned and all free (any thread: the pinner's too). */
static int chunk_make(ferry_store *s, uint64_t size, bool reserved, pchunk *c)
{
    memset(c, 0, sizeof *c);
    if (fy_ranges_give(&c->fr, s->m, 0, size) < 0) return -ENOMEM;
    int rc = fy_xfer_pinned_alloc(s->dev, size, (void **)&c->base);
    if (rc < 0) {
        fy_ranges_free(&c->fr, s->m);
        return rc;
    }
    c->size = size;
    c->reserved = reserved;
    return 0;
}

void rs_chunk_drop(ferry_store *s, pchunk *c)
{
    fy_xfer_pinned_free(s->dev, c->base);
    fy_ranges_free(&c->fr, s->m);
}

/* c into the pool; false when the list of chunks cannot grow. */
static bool chunk_add(ferry_store *s, const pchunk *c)
{
    pchunk *nc = fy_realloc(s->m, s->chunks, (size_t)(s->nchunks + 1) * sizeof *nc);
    if (!nc) return false;
    s->chunks = nc;
    nc[s->nchunks++] = *c;
    s->pool_bytes += c->size;
    return true;
}

bool rs_pool_adopt(ferry_store *s)
{
    if (!s->pinner_on) return true;
    pthread_mutex_lock(&s->pin_lock);
    /* (a piece that cannot be added waits in pin_ready for the next call, or the store's end) */
    while (s->pin_nready > 0 && chunk_add(s, &s->pin_ready[s->pin_nready - 1])) s->pin_nready--;
    bool all = s->pin_nready == 0;
    pthread_mutex_unlock(&s->pin_lock);
    return all;
}

/* Bytes the pinner has yet to hand over (pinning or pinned), which the
 * budget already promised to the reserve. */
static uint64_t pin_owed(ferry_store *s)
{
    if (!s->pinner_on) return 0;
    pthread_mutex_lock(&s->pin_lock);
    uint64_t owed = s->pin_left;
    for (int k = 0; k < s->pin_nready; k++) owed += s->pin_ready[k].size;
    pthread_mutex_unlock(&s->pin_lock);
    return owed;
}

int rs_pool_alloc(ferry_store *s, uint64_t n, void **out)
{
    n = (n + 4095) & ~4095ull;
    size_t bi = 0;
    int bc;
    for (;;) {
        bool stuck = !rs_pool_adopt(s);
        if ((bc = pool_best(s, n, &bi)) >= 0) break;
        /* the reserve is still being pinned and n fits one of its pieces:
         * wait for the next piece (pinning one of our own beside it would
         * only halve the rate of both), with the store's lock dropped */
        if (stuck || !s->pinner_on || n > RCHUNK) break;
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_lock(&s->pin_lock);
        s->pin_wanted++; /* the pinner stops yielding to transfers */
        pthread_cond_broadcast(&s->pin_cv);
        while (s->pin_left > 0 && s->pin_nready == 0) pthread_cond_wait(&s->pin_cv, &s->pin_lock);
        s->pin_wanted--;
        bool more = s->pin_nready > 0;
        pthread_mutex_unlock(&s->pin_lock);
        pthread_mutex_lock(&s->lock);
        if (!more && (bc = pool_best(s, n, &bi)) < 0) break; /* the pinner is done and every piece was looked at */
        if (bc >= 0) break;
    }
    if (bc < 0) { /* grow: pinned with the lock dropped, the bytes promised meanwhile */
        uint64_t size = n > PCHUNK ? (n + (2u << 20) - 1) & ~((2ull << 20) - 1) : PCHUNK;
        uint64_t held = s->pool_bytes + pin_owed(s) + s->pool_growing;
        if (held + size > s->o.pinned_budget) {
            if (held + n > s->o.pinned_budget) return FERRY_E_BUDGET;
            size = n; /* the last bit of the budget */
        }
        s->pool_growing += size;
        pthread_mutex_unlock(&s->lock);
        pchunk c;
        int rc = chunk_make(s, size, false, &c);
        pthread_mutex_lock(&s->lock);
        s->pool_growing -= size;
        if (rc < 0) return rc;
        if (!chunk_add(s, &c)) {
            pthread_mutex_unlock(&s->lock);
            rs_chunk_drop(s, &c);
            pthread_mutex_lock(&s->lock);
            return -ENOMEM;
        }
        bc = s->nchunks - 1;
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

/* Take the pool's chunks that hold nothing (not the reserve's) out of it. */
int rs_pool_trim_take(ferry_store *s, pchunk **out)
{
    *out = NULL;
    int n = 0;
    for (int c = 0; c < s->nchunks; c++) {
        const pchunk *ch = &s->chunks[c];
        n += !ch->reserved && ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size;
    }
    if (n == 0 || !(*out = fy_calloc(s->m, (size_t)n, sizeof **out))) return 0; /* (no memory: kept for now) */
    n = 0;
    for (int c = 0; c < s->nchunks;) {
        pchunk *ch = &s->chunks[c];
        if (!ch->reserved && ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size) {
            (*out)[n++] = *ch;
            s->pool_bytes -= ch->size;
            s->chunks[c] = s->chunks[--s->nchunks];
        } else {
            c++;
        }
    }
    return n;
}

void rs_chunks_drop(ferry_store *s, pchunk *v, int n)
{
    for (int k = 0; k < n; k++) rs_chunk_drop(s, &v[k]);
    fy_free(s->m, v);
}

/* ---- the pinner: the reserve, pinned ahead ---- */

static void *pinner_run(void *arg)
{
    ferry_store *s = arg;
    fy_xfer_bind(s->dev);
    pthread_mutex_lock(&s->pin_lock);
    for (;;) {
        while (!s->pin_stop && s->pin_left > 0 && s->pin_busy > 0 && s->pin_wanted == 0)
            pthread_cond_wait(&s->pin_cv, &s->pin_lock); /* between transfers */
        if (s->pin_stop || s->pin_left == 0) break;
        uint64_t n = s->pin_left < RCHUNK ? s->pin_left : RCHUNK;
        pthread_mutex_unlock(&s->pin_lock);
        pchunk c;
        int rc = chunk_make(s, n, true, &c);
        pthread_mutex_lock(&s->pin_lock);
        if (rc < 0) {
            s->pin_rc = rc;
            snprintf(s->pin_msg, sizeof s->pin_msg,
                     "pinning the pool ahead stopped after %" PRIu64 " of %" PRIu64 " bytes: %s", s->pin_done,
                     s->pin_target, rc == -ENOMEM ? "out of memory" : ferry_device_errmsg(s->dev));
            s->pin_left = 0;
            break;
        }
        s->pin_ready[s->pin_nready++] = c;
        s->pin_left -= n;
        s->pin_done += n;
        pthread_cond_broadcast(&s->pin_cv);
    }
    s->pin_left = 0; /* done, failed or stopped */
    pthread_cond_broadcast(&s->pin_cv);
    pthread_mutex_unlock(&s->pin_lock);
    return NULL;
}

int rs_pinner_start(ferry_store *s)
{
    if (!s->pin_target) return 0;
    uint64_t pieces = (s->pin_target + RCHUNK - 1) / RCHUNK;
    s->pin_ready = fy_calloc(s->m, (size_t)pieces, sizeof *s->pin_ready);
    if (!s->pin_ready)
        return fy_seterr(&s->err, -ENOMEM, "ferry_store_new: out of memory for the pinned reserve's %" PRIu64 " pieces",
                         pieces);
    pthread_mutex_init(&s->pin_lock, NULL);
    pthread_cond_init(&s->pin_cv, NULL);
    s->pin_left = s->pin_target;
    int e = pthread_create(&s->pinner, NULL, pinner_run, s);
    if (e) {
        pthread_cond_destroy(&s->pin_cv);
        pthread_mutex_destroy(&s->pin_lock);
        fy_free(s->m, s->pin_ready);
        s->pin_ready = NULL;
        return fy_seterr(&s->err, -e, "ferry_store_new: cannot start the thread that pins the reserve: %s",
                         ferry_strerror(-e));
    }
    s->pinner_on = true;
    return 0;
}

void rs_pin_yield(ferry_store *s, int d)
{
    if (!s->pinner_on) return;
    pthread_mutex_lock(&s->pin_lock);
    s->pin_busy += d;
    if (s->pin_busy == 0) pthread_cond_broadcast(&s->pin_cv);
    pthread_mutex_unlock(&s->pin_lock);
}

void rs_pinner_stop(ferry_store *s)
{
    if (!s->pinner_on) return;
    pthread_mutex_lock(&s->pin_lock);
    s->pin_stop = true;
    pthread_cond_broadcast(&s->pin_cv); /* (waiting for the transfers to end) */
    pthread_mutex_unlock(&s->pin_lock);
    pthread_join(s->pinner, NULL);
    for (int k = 0; k < s->pin_nready; k++) rs_chunk_drop(s, &s->pin_ready[k]);
    fy_free(s->m, s->pin_ready);
    s->pin_ready = NULL;
    s->pin_nready = 0;
    pthread_cond_destroy(&s->pin_cv);
    pthread_mutex_destroy(&s->pin_lock);
    s->pinner_on = false;
}

FERRY_API int ferry_store_wait_pinned(ferry_store *s)
{
    if (!s) return FERRY_E_INVAL;
    if (!s->pinner_on) return 0; /* set before the store is shared, cleared as it goes */
    pthread_mutex_lock(&s->pin_lock);
    while (s->pin_left > 0) pthread_cond_wait(&s->pin_cv, &s->pin_lock);
    int rc = s->pin_rc;
    char msg[FY_ERRMSG_MAX];
    if (rc < 0) memcpy(msg, s->pin_msg, sizeof msg);
    pthread_mutex_unlock(&s->pin_lock);
    if (rc < 0) fy_seterr(&s->err, rc, "%s", msg);
    return rc;
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

