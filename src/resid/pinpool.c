/* SPDX-License-Identifier: Apache-2.0 */
/* pinpool.c - the pinned pool (pinpool.h): chunks pinned once, best-fit
 * ranges, trimmed by make_room, and the pinner that pins a reserve ahead. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinpool.h"

void rs_pinpool_init(rs_pinpool *p, ferry_device *dev, const ferry_allocator *m, fy_err *err,
                     pthread_mutex_t *outer, uint64_t budget, uint64_t target)
{
    *p = (rs_pinpool){.dev = dev,
                      .m = m,
                      .err = err,
                      .outer = outer,
                      .budget = budget,
                      .target = (target < budget ? target : budget) & ~4095ull};
}

/* ---- pinned pool ---- */

/* The best-fitting free range for n bytes over every chunk: its chunk (-1:
 * none) and index in *bi. */
static int pool_best(const rs_pinpool *s, uint64_t n, size_t *bi)
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
static int chunk_make(rs_pinpool *s, uint64_t size, bool reserved, rs_pchunk *c)
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

static void chunk_drop(rs_pinpool *s, rs_pchunk *c)
{
    fy_xfer_pinned_free(s->dev, c->base);
    fy_ranges_free(&c->fr, s->m);
}

/* c into the pool; false when the list of chunks cannot grow. */
static bool chunk_add(rs_pinpool *s, const rs_pchunk *c)
{
    rs_pchunk *nc = fy_realloc(s->m, s->chunks, (size_t)(s->nchunks + 1) * sizeof *nc);
    if (!nc) return false;
    s->chunks = nc;
    nc[s->nchunks++] = *c;
    s->bytes += c->size;
    return true;
}

bool rs_pinpool_adopt(rs_pinpool *s)
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
static uint64_t pin_owed(rs_pinpool *s)
{
    if (!s->pinner_on) return 0;
    pthread_mutex_lock(&s->pin_lock);
    uint64_t owed = s->pin_left;
    for (int k = 0; k < s->pin_nready; k++) owed += s->pin_ready[k].size;
    pthread_mutex_unlock(&s->pin_lock);
    return owed;
}

int rs_pinpool_alloc(rs_pinpool *s, uint64_t n, void **out)
{
    n = (n + 4095) & ~4095ull;
    size_t bi = 0;
    int bc;
    for (;;) {
        bool stuck = !rs_pinpool_adopt(s);
        if ((bc = pool_best(s, n, &bi)) >= 0) break;
        /* the reserve is still being pinned and n fits one of its pieces:
         * wait for the next piece (pinning one of our own beside it would
         * only halve the rate of both), with the store's lock dropped */
        if (stuck || !s->pinner_on || n > RS_RCHUNK) break;
        pthread_mutex_unlock(s->outer);
        pthread_mutex_lock(&s->pin_lock);
        s->pin_wanted++; /* the pinner stops yielding to transfers */
        pthread_cond_broadcast(&s->pin_cv);
        while (s->pin_left > 0 && s->pin_nready == 0) pthread_cond_wait(&s->pin_cv, &s->pin_lock);
        s->pin_wanted--;
        bool more = s->pin_nready > 0;
        pthread_mutex_unlock(&s->pin_lock);
        pthread_mutex_lock(s->outer);
        if (!more && (bc = pool_best(s, n, &bi)) < 0)
            break; /* the pinner is done and every piece was looked at */
        if (bc >= 0) break;
    }
    if (bc < 0) { /* grow: pinned with the lock dropped, the bytes promised meanwhile */
        uint64_t size = n > RS_PCHUNK ? (n + (2u << 20) - 1) & ~((2ull << 20) - 1) : RS_PCHUNK;
        uint64_t held = s->bytes + pin_owed(s) + s->growing;
        if (held + size > s->budget) {
            if (held + n > s->budget) return FERRY_E_BUDGET;
            size = n; /* the last bit of the budget */
        }
        s->growing += size;
        pthread_mutex_unlock(s->outer);
        rs_pchunk c;
        int rc = chunk_make(s, size, false, &c);
        pthread_mutex_lock(s->outer);
        s->growing -= size;
        if (rc < 0) return rc;
        if (!chunk_add(s, &c)) {
            pthread_mutex_unlock(s->outer);
            chunk_drop(s, &c);
            pthread_mutex_lock(s->outer);
            return -ENOMEM;
        }
        bc = s->nchunks - 1;
        bi = 0;
    }
    rs_pchunk *c = &s->chunks[bc];
    *out = c->base + c->fr.v[bi].off;
    fy_ranges_take(&c->fr, bi, n);
    s->used += n;
    return 0;
}

/* Never fails: when the chunk's free list cannot grow, the range is lost to
 * fragmentation until the store is freed. */
void rs_pinpool_free(rs_pinpool *s, void *p, uint64_t n)
{
    n = (n + 4095) & ~4095ull;
    for (int ci = 0; ci < s->nchunks; ci++) {
        rs_pchunk *c = &s->chunks[ci];
        if ((uint8_t *)p < c->base || (uint8_t *)p >= c->base + c->size) continue;
        (void)fy_ranges_give(&c->fr, s->m, (uint64_t)((uint8_t *)p - c->base), n);
        break;
    }
    s->used -= n;
}

/* Take the pool's chunks that hold nothing (not the reserve's) out of it. */
int rs_pinpool_trim_take(rs_pinpool *s, rs_pchunk **out)
{
    *out = NULL;
    int n = 0;
    for (int c = 0; c < s->nchunks; c++) {
        const rs_pchunk *ch = &s->chunks[c];
        n += !ch->reserved && ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size;
    }
    if (n == 0 || !(*out = fy_calloc(s->m, (size_t)n, sizeof **out)))
        return 0; /* (no memory: kept for now) */
    n = 0;
    for (int c = 0; c < s->nchunks;) {
        rs_pchunk *ch = &s->chunks[c];
        if (!ch->reserved && ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size) {
            (*out)[n++] = *ch;
            s->bytes -= ch->size;
            s->chunks[c] = s->chunks[--s->nchunks];
        } else {
            c++;
        }
    }
    return n;
}

void rs_pinpool_drop(rs_pinpool *s, rs_pchunk *v, int n)
{
    for (int k = 0; k < n; k++) chunk_drop(s, &v[k]);
    fy_free(s->m, v);
}

/* ---- the pinner: the reserve, pinned ahead ---- */

static void *pinner_run(void *arg)
{
    rs_pinpool *s = arg;
    fy_xfer_bind(s->dev);
    pthread_mutex_lock(&s->pin_lock);
    for (;;) {
        while (!s->pin_stop && s->pin_left > 0 && s->pin_busy > 0 && s->pin_wanted == 0)
            pthread_cond_wait(&s->pin_cv, &s->pin_lock); /* between transfers */
        if (s->pin_stop || s->pin_left == 0) break;
        uint64_t n = s->pin_left < RS_RCHUNK ? s->pin_left : RS_RCHUNK;
        pthread_mutex_unlock(&s->pin_lock);
        rs_pchunk c;
        int rc = chunk_make(s, n, true, &c);
        pthread_mutex_lock(&s->pin_lock);
        if (rc < 0) {
            s->pin_rc = rc;
            snprintf(s->pin_msg, sizeof s->pin_msg,
                     "pinning the pool ahead stopped after %" PRIu64 " of %" PRIu64 " bytes: %s", s->pin_done,
                     s->target, rc == -ENOMEM ? "out of memory" : ferry_device_errmsg(s->dev));
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

int rs_pinpool_start(rs_pinpool *s)
{
    if (!s->target) return 0;
    uint64_t pieces = (s->target + RS_RCHUNK - 1) / RS_RCHUNK;
    s->pin_ready = fy_calloc(s->m, (size_t)pieces, sizeof *s->pin_ready);
    if (!s->pin_ready)
        return fy_seterr(s->err, -ENOMEM,
                         "ferry_store_new: out of memory for the pinned reserve's %" PRIu64 " pieces",
                         pieces);
    pthread_mutex_init(&s->pin_lock, NULL);
    pthread_cond_init(&s->pin_cv, NULL);
    s->pin_left = s->target;
    int e = pthread_create(&s->pinner, NULL, pinner_run, s);
    if (e) {
        pthread_cond_destroy(&s->pin_cv);
        pthread_mutex_destroy(&s->pin_lock);
        fy_free(s->m, s->pin_ready);
        s->pin_ready = NULL;
        return fy_seterr(s->err, -e, "ferry_store_new: cannot start the thread that pins the reserve: %s",
                         ferry_strerror(-e));
    }
    s->pinner_on = true;
    return 0;
}

void rs_pinpool_yield(rs_pinpool *s, int d)
{
    if (!s->pinner_on) return;
    pthread_mutex_lock(&s->pin_lock);
    s->pin_busy += d;
    if (s->pin_busy == 0) pthread_cond_broadcast(&s->pin_cv);
    pthread_mutex_unlock(&s->pin_lock);
}

static void pinner_stop(rs_pinpool *s)
{
    if (!s->pinner_on) return;
    pthread_mutex_lock(&s->pin_lock);
    s->pin_stop = true;
    pthread_cond_broadcast(&s->pin_cv); /* (waiting for the transfers to end) */
    pthread_mutex_unlock(&s->pin_lock);
    pthread_join(s->pinner, NULL);
    for (int k = 0; k < s->pin_nready; k++) chunk_drop(s, &s->pin_ready[k]);
    fy_free(s->m, s->pin_ready);
    s->pin_ready = NULL;
    s->pin_nready = 0;
    pthread_cond_destroy(&s->pin_cv);
    pthread_mutex_destroy(&s->pin_lock);
    s->pinner_on = false;
}

int rs_pinpool_wait(rs_pinpool *s)
{
    if (!s->pinner_on) return 0; /* set before the pool is shared, cleared as it goes */
    pthread_mutex_lock(&s->pin_lock);
    while (s->pin_left > 0) pthread_cond_wait(&s->pin_cv, &s->pin_lock);
    int rc = s->pin_rc;
    char msg[FY_ERRMSG_MAX];
    if (rc < 0) memcpy(msg, s->pin_msg, sizeof msg);
    pthread_mutex_unlock(&s->pin_lock);
    if (rc < 0) fy_seterr(s->err, rc, "%s", msg);
    return rc;
}

uint64_t rs_pinpool_reserved(rs_pinpool *s)
{
    if (!s->pinner_on) return 0;
    pthread_mutex_lock(&s->pin_lock);
    uint64_t n = s->pin_done;
    pthread_mutex_unlock(&s->pin_lock);
    return n;
}

void rs_pinpool_destroy(rs_pinpool *s)
{
    pinner_stop(s);
    for (int c = 0; c < s->nchunks; c++) chunk_drop(s, &s->chunks[c]);
    fy_free(s->m, s->chunks);
    s->chunks = NULL;
    s->nchunks = 0;
    s->bytes = 0;
}
