/* SPDX-License-Identifier: Apache-2.0 */
/* fetch.c - moves to the device: room first (under the store's lock), then
 * each tier's tensors through its move with the lock dropped (the checkpoint
 * through the loader, pinned and RAM copies by DMA, the spill file through the
 * ring), then, once the copies are done, the new tiers committed under the
 * lock again ("landing"). ferry_model_to_device is a queued move landed at
 * once; ferry_model_to_device_async hands the landing to the caller. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* Read the tensors a move caches from their checkpoints into their pinned
 * buffers (the lock dropped; the buffers are the op's until it lands), in
 * pieces shared by a few threads: one thread's pread from the page cache is
 * a fraction of what the copy engine takes, and this is a first pass's cost. */
enum { CACHE_PIECE = 16u << 20, CACHE_THREADS_MAX = 8 };

typedef struct cache_read {
    ferry_op *op;
    ferry_model *m;
    const int64_t *ci;
    int64_t nc;
    uint64_t *start;    /* start[k]: piece index where tensor ci[k] begins; start[nc] = total */
    atomic_ullong next; /* the next piece */
    atomic_int rc;      /* the first failure (its thread alone writes op->msg) */
} cache_read;

static void *cache_reader(void *arg)
{
    cache_read *c = arg;
    for (;;) {
        uint64_t p = atomic_fetch_add(&c->next, 1);
        if (p >= c->start[c->nc] || atomic_load(&c->rc) < 0) return NULL;
        int64_t lo = 0, hi = c->nc - 1; /* the tensor holding piece p */
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (c->start[mid] <= p) lo = mid;
            else hi = mid - 1;
        }
        rtensor *t = &c->m->t[c->ci[lo]];
        uint64_t off = (p - c->start[lo]) * CACHE_PIECE;
        uint64_t len = t->nbytes - off < CACHE_PIECE ? t->nbytes - off : CACHE_PIECE;
        int rc =
            ferry_file_tensor_read(c->m->files[t->file], t->idx, off, (uint8_t *)t->host + off, (size_t)len);
        int ok = 0;
        if (rc < 0 && atomic_compare_exchange_strong(&c->rc, &ok, rc))
            snprintf(c->op->msg, sizeof c->op->msg, "%s", ferry_file_errmsg(c->m->files[t->file]));
    }
}

static void read_cached(ferry_op *op, ferry_store *s, ferry_model *m, const int64_t *ci, int64_t nc)
{
    if (nc == 0) return;
    cache_read c = {.op = op, .m = m, .ci = ci, .nc = nc};
    c.start = fy_calloc(s->m, (size_t)nc + 1, sizeof *c.start);
    if (!c.start) {
        op->rc = -ENOMEM;
        snprintf(op->msg, sizeof op->msg, "reading %" PRId64 " tensors into pinned RAM: out of memory", nc);
        return;
    }
    uint64_t bytes = 0;
    for (int64_t k = 0; k < nc; k++) {
        uint64_t n = m->t[ci[k]].nbytes;
        c.start[k + 1] = c.start[k] + (n + CACHE_PIECE - 1) / CACHE_PIECE;
        bytes += n;
    }
    atomic_init(&c.next, 0);
    atomic_init(&c.rc, 0);
    uint64_t pieces = c.start[nc];
    int nt = s->load.threads ? (int)s->load.threads : 4;
    if (nt > CACHE_THREADS_MAX) nt = CACHE_THREADS_MAX;
    if ((uint64_t)nt > pieces) nt = (int)pieces;
    pthread_t th[CACHE_THREADS_MAX];
    int started = 0;
    for (; started < nt - 1; started++) /* the calling thread is one of them */
        if (pthread_create(&th[started], NULL, cache_reader, &c) != 0) break;
    cache_reader(&c);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    int rc = atomic_load(&c.rc);
    if (rc < 0) op->rc = rc;
    op->read += bytes;
    fy_free(s->m, c.start);
}

/* The transfers of a MOVING op, with the lock dropped: the moving tensors'
 * old copies (their file ranges, host copies, spill ranges) cannot go
 * meanwhile. Then QUEUED: others may land it. */
static void run_transfers(ferry_store *s, ferry_op *op)
{
    ferry_model *m = op->m;
    int64_t *idx = op->idx;
    uint64_t *dp = op->dp;
    rs_op_fail(op, s, fy_xfer_bind(s->dev)); /* (the mover's thread) */
    /* what the keeper holds is copied from it, and not read (t->kept) */
    uint64_t kept = op->rc == 0 ? rs_kept_fetch(s, op) : 0;
    int64_t nc = 0;
    for (int64_t k = 0; k < op->nc; k++)
        if (!m->t[idx[k]].kept) idx[nc++] = idx[k];
    if (op->rc == 0) read_cached(op, s, m, idx, nc);
    uint64_t cached_read = op->read;
    /* Streamed blocks are read with pread, never through a mapping of the
     * load's own: a file in tmpfs is otherwise mapped and faulted in page by
     * page on every move, every pass (a page table for each block's bytes,
     * torn down after it), where pread copies the same pages straight out */
    ferry_load_opts lo = s->load;
    for (int64_t k = 0; k < op->nt; k++)
        if (m->t[op->ti[k]].streams) {
            lo.flags |= FERRY_LOAD_PREAD;
            break;
        }
    for (int k = 0; k < m->nfiles && op->rc == 0; k++) { /* SOURCE: file by file, through the loader */
        int64_t cnt = 0;
        for (int64_t q = 0; q < op->nt; q++) {
            rtensor *t = &m->t[op->ti[q]];
            if (t->file == k && t->tier == FERRY_TIER_SOURCE && !t->caching && !t->kept && t->nbytes) {
                idx[cnt] = t->idx;
                dp[cnt++] = t->dptr;
                op->moved += t->nbytes;
            }
        }
        if (cnt) rs_op_fail(op, s, ferry_load_into(s->dev, m->files[k], idx, dp, cnt, &lo, NULL));
    }
    op->read = op->moved + cached_read;
    op->moved += kept;
    if (op->rc == 0 && op->nf)
        rs_op_fail(
            op, s,
            fy_xfer_fd_to_device(s->dev, op->spill_fd, s->spill_dir, op->fr, op->nf, &s->load, NULL, NULL));
    if (op->rc == 0 && op->nh)
        rs_op_fail(op, s, fy_xfer_host_to_device(s->dev, op->hr, op->nh, &op->xop)); /* queued */
    rs_pin_yield(s, -1);   /* taken in queue_moves, before the allocations */
    rs_kept_finish(s, op); /* the keeper fed what was read (its copies to the device run meanwhile) */
    for (int64_t i = 0; i < op->nh; i++) op->moved += op->hr[i].len;
    for (int64_t i = 0; i < op->nf; i++) op->moved += op->fr[i].len, op->read += op->fr[i].len;
    fy_free(s->m, op->idx);
    fy_free(s->m, op->dp);
    fy_free(s->m, op->hr);
    fy_free(s->m, op->fr);
    op->idx = NULL, op->dp = NULL, op->hr = NULL, op->fr = NULL;
    pthread_mutex_lock(&s->lock);
    op->state = OP_QUEUED; /* others may land it now */
    pthread_cond_broadcast(&s->landed);
    pthread_mutex_unlock(&s->lock);
}

static void *mover_main(void *arg)
{
    ferry_store *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->mq && !s->mover_stop) pthread_cond_wait(&s->mq_cv, &s->lock);
        ferry_op *op = s->mq;
        if (!op) break; /* stopping, nothing left */
        s->mq = op->mnext;
        if (!s->mq) s->mq_tail = &s->mq;
        pthread_mutex_unlock(&s->lock);
        run_transfers(s, op);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Hand op's transfers to the mover (under the lock), starting it on first
 * use; < 0 when no thread can be made (the caller runs them itself). */
static int mover_queue(ferry_store *s, ferry_op *op)
{
    if (!s->mover_on) {
        if (pthread_create(&s->mover, NULL, mover_main, s) != 0) return -EAGAIN;
        s->mover_on = true;
    }
    op->mnext = NULL;
    *s->mq_tail = op;
    s->mq_tail = &op->mnext;
    pthread_cond_signal(&s->mq_cv);
    return 0;
}

void rs_mover_stop(ferry_store *s)
{
    pthread_mutex_lock(&s->lock);
    bool on = s->mover_on;
    s->mover_stop = true;
    pthread_cond_broadcast(&s->mq_cv);
    pthread_mutex_unlock(&s->lock);
    if (on) pthread_join(s->mover, NULL);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The groups of sel[0..nsel-1] were used at clock: those on the device
 * move to the back of m's device index in the order of their ids (the
 * policy's order among equals), so each finds its place at once; the others
 * keep clock for when they come. room: nsel entries of scratch. Costs the
 * request's size (and a sort of its groups), not the model's. */
static void touch_groups(ferry_model *m, const int64_t *sel, int64_t nsel, int64_t *room, uint64_t clock)
{
    int64_t ng = 0;
    uint64_t stamp = ++m->gstamp;
    for (int64_t k = 0; k < nsel; k++) {
        int64_t g = m->t[sel[k]].group;
        if (m->gmark[g] == stamp) continue;
        m->gmark[g] = stamp;
        if (rs_lru_listed(&m->dev, g)) room[ng++] = g;
        else rs_lru_touch(&m->dev, g, clock);
    }
    qsort(room, (size_t)ng, sizeof *room, cmp_i64);
    for (int64_t k = 0; k < ng; k++) rs_lru_touch(&m->dev, room[k], clock);
}

/* Queue the moves of tensors[0..n-1] and their groups; *out the op (its
 * tensors marked moving). background: a move that reads files runs on the
 * mover; else (and for copies from RAM alone) the transfers run here. */
static int queue_moves(ferry_model *m, const int64_t *tensors, int64_t n, bool background, ferry_op **out)
{
    ferry_store *s = m->s;
    *out = NULL;
    int64_t *sel = NULL, nsel = 0; /* the groups asked for: their tensors */
    int64_t *idx = NULL;
    uint64_t *dp = NULL;
    fy_hostrange *hr = NULL;
    fy_fdrange *fr = NULL;
    bool yielding = false; /* rs_pin_yield(+1) taken: run_transfers gives it back */
    bool marked = false;   /* op is in s->ops, its tensors marked moving */
    pthread_mutex_lock(&s->lock);
    int rc = rs_select(m, tensors, n, &sel, &nsel);
    if (rc < 0) {
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    size_t ns = (size_t)(nsel ? nsel : 1);
    ferry_op *op = fy_calloc(s->m, 1, sizeof *op);
    int64_t *ti = fy_calloc(s->m, ns, sizeof *ti);
    idx = fy_calloc(s->m, ns, sizeof *idx);
    dp = fy_calloc(s->m, ns, sizeof *dp);
    hr = fy_calloc(s->m, ns, sizeof *hr);
    fr = fy_calloc(s->m, ns, sizeof *fr);
    if (!op || !ti || !idx || !dp || !hr || !fr) {
        rc = rs_merr(m, -ENOMEM, "ferry_model_to_device: out of memory for the lists of %" PRId64 " tensors",
                     nsel);
        goto fail;
    }
    /* an earlier move of any of them lands first, an eviction of any of them
     * commits, a read of one ends */
    rs_settle(s, m, sel, nsel, true);
    m->last_use = ++s->clock;
    for (int64_t k = 0; k < nsel; k++) {
        m->t[sel[k]].use = s->clock; /* the groups asked for: used now */
        m->t[sel[k]].wanted++;       /* and not evicted while this call makes room */
    }
    touch_groups(m, sel, nsel, idx, s->clock); /* (idx is free until the transfers) */
    /* from here the tensors off the device are the op's: nobody evicts,
     * reads or moves them, while the room is made (evictions drop the lock)
     * and the transfers run */
    op->m = m;
    op->ti = ti;
    op->state = OP_MOVING;
    op->t0 = fy_now();
    uint64_t need = 0;
    for (int64_t k = 0; k < nsel; k++) {
        rtensor *t = &m->t[sel[k]];
        if (t->tier == FERRY_TIER_DEVICE) continue; /* what is on the device already is not this op's */
        t->moving = op;
        ti[op->nt++] = sel[k];
        need += t->nbytes;
    }
    op->next = s->ops;
    s->ops = op;
    marked = true;
    int64_t mr = need ? rs_make_room_locked(s, need, m, NULL, NULL) : 0; /* empty tensors need no room */
    if (mr < 0) {
        rc = (int)mr;
        char msg[FY_ERRMSG_MAX];
        fy_err_copy(&s->err, msg, sizeof msg);
        rs_merr(m, rc, "%s", msg);
        goto fail;
    }
    if ((rc = fy_xfer_bind(s->dev)) < 0) {
        rs_device_failed(s, m, rc);
        goto fail;
    }
    /* the pinner waits from here (the device allocations too: cuMemAlloc
     * waited behind its registrations) until run_transfers is done */
    rs_pin_yield(s, +1);
    yielding = true;
    /* allocate; on failure free what this call allocated */
    for (int64_t k = 0; k < op->nt && rc == 0; k++) {
        rtensor *t = &m->t[ti[k]];
        if (t->nbytes == 0) continue;
        rc = rs_dev_alloc(s, t, true);
        while (rc == -ENOMEM) {
            /* the driver has no segment for it though the budget has room
             * (the store's segments hold the device in scattered pieces, or
             * memory went to others): evict more, so that whole segments
             * come free and go back to the driver, until it gives one or
             * nothing more can go (then the move fails, nothing lost) */
            int64_t more = rs_make_room_ex(s, rs_room_now(s) + rs_dev_size(t->nbytes), m, NULL, NULL, false);
            if (more <= 0) break;
            rc = rs_dev_alloc(s, t, true);
        }
        while (rc == RS_FRAGMENTED) {
            /* t fits in no free piece and a new segment would take the store
             * more than 1/16 past its budget: evict more (never the plan's
             * resident set: that would stream it next pass, and again), so
             * that pieces merge or whole segments come free; when nothing
             * more can go, take the segment anyway (a move that fits by bytes
             * does not fail) */
            uint64_t room = s->o.device_budget > s->arena.used ? s->o.device_budget - s->arena.used : 0;
            int64_t more = rs_make_room_ex(s, room + rs_dev_size(t->nbytes), m, NULL, NULL, true);
            rc = rs_dev_alloc(s, t, more > 0);
        }
    }
    if (rc < 0) {
        rs_device_failed(s, m, rc);
        goto fail;
    }
    /* tensors read from the checkpoint that keep a pinned copy (streamed
     * blocks, a model with pinned_cache on) are kept in the pinned pool as
     * room allows (read there first, then copied like any pinned copy) */
    bool want_cache = false;
    for (int64_t k = 0; k < op->nt && !want_cache; k++) {
        const rtensor *t = &m->t[ti[k]];
        want_cache = rs_wants_cache(m, t) && t->tier == FERRY_TIER_SOURCE && t->nbytes;
    }
    uint64_t avail = 0;
    if (want_cache) { /* (a cgroup read: with the lock dropped, the tensors marked) */
        pthread_mutex_unlock(&s->lock);
        if (fy_host_available(&avail, NULL, 0) < 0) want_cache = false;
        pthread_mutex_lock(&s->lock);
    }
    int64_t nh = 0, nf = 0, nc = 0;
    bool files = false, ring = false; /* it reads files; it reads the checkpoint through the ring */
    for (int64_t k = 0; k < op->nt; k++) {
        rtensor *t = &m->t[ti[k]];
        if (!t->nbytes) continue;
        /* (rs_pool_alloc may pin with the lock dropped: the op's tensors stay its own) */
        if (want_cache && rs_wants_cache(m, t) && t->tier == FERRY_TIER_SOURCE &&
            rs_cache_admits(s, t->nbytes, avail) && rs_pool_alloc(s, t->nbytes, &t->host) == 0) {
            t->caching = true;
            s->cache_used += t->nbytes;
            avail -= t->nbytes;
            idx[nc++] = ti[k]; /* (idx is free until the checkpoint loads below) */
            hr[nh++] = (fy_hostrange){t->host, t->dptr, t->nbytes};
            files = true;
            continue;
        }
        if (t->tier == FERRY_TIER_PINNED || t->tier == FERRY_TIER_HOST)
            hr[nh++] = (fy_hostrange){t->host, t->dptr, t->nbytes};
        if (t->tier == FERRY_TIER_SPILL)
            fr[nf++] = (fy_fdrange){t->soff, t->nbytes, t->dptr}, files = ring = true;
        if (t->tier == FERRY_TIER_SOURCE) files = ring = true;
    }
    for (int64_t k = 0; k < nsel; k++) m->t[sel[k]].wanted--; /* (the op's own are moving now) */
    fy_free(s->m, sel);
    sel = NULL;
    /* memory that released tensors left while kernels may still read it:
     * this move's writes come after those kernels (on the device where all
     * its copies take the lane) */
    if (s->fences.reuse) (void)rs_reuse_order(s, !ring); /* (on failure the host has waited instead) */
    op->spill_fd = s->spill ? rs_spill_fd(s->spill) : -1;
    op->idx = idx, op->dp = dp, op->hr = hr, op->fr = fr;
    op->nh = nh, op->nf = nf, op->nc = nc;
    *out = op;
    if (background && files && mover_queue(s, op) == 0) { /* the mover reads them */
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    pthread_mutex_unlock(&s->lock);
    run_transfers(s, op);
    return 0;
fail:
    if (marked) { /* nothing was moved: unmark, and wake whoever waits for the op */
        for (int64_t k = 0; k < op->nt; k++) {
            rtensor *t = &m->t[ti[k]];
            t->moving = NULL;
            if (t->dptr) rs_dev_free(s, t);
        }
        for (ferry_op **p = &s->ops; *p; p = &(*p)->next)
            if (*p == op) {
                *p = op->next;
                break;
            }
        op->state = OP_LANDED;
        pthread_cond_broadcast(&s->landed);
    }
    for (int64_t k = 0; marked && k < nsel; k++) m->t[sel[k]].wanted--;
    pthread_mutex_unlock(&s->lock);
    if (yielding) rs_pin_yield(s, -1);
    fy_free(s->m, op);
    fy_free(s->m, sel);
    fy_free(s->m, ti);
    fy_free(s->m, idx);
    fy_free(s->m, dp);
    fy_free(s->m, hr);
    fy_free(s->m, fr);
    return rc;
}

FERRY_API int ferry_model_to_device_async(ferry_model *m, const int64_t *tensors, int64_t n, ferry_op **op)
{
    if (op) *op = NULL;
    if (!m || n < 0 || !op) return FERRY_E_INVAL; /* tensors NULL: all */
    return queue_moves(m, tensors, n, true, op);
}

FERRY_API int ferry_op_wait(ferry_op *op)
{
    if (!op) return FERRY_E_INVAL;
    ferry_store *s = op->m->s;
    pthread_mutex_lock(&s->lock);
    rs_op_land(s, op);
    int rc = op->rc;
    rs_op_free(s, op);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_op_query(ferry_op *op)
{
    if (!op) return FERRY_E_INVAL;
    ferry_store *s = op->m->s;
    pthread_mutex_lock(&s->lock);
    /* (the mover writes op->rc until the op leaves MOVING: look at the state first) */
    int rc = op->state == OP_MOVING || op->state == OP_LANDING ? 0
             : op->rc < 0                                      ? op->rc
             : op->state == OP_LANDED                          ? 1
             : op->xop                                         ? fy_xfer_op_query(op->xop)
                                                               : 1;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_op_stream_wait(ferry_op *op, uint64_t cu_stream)
{
    if (!op) return FERRY_E_INVAL;
    ferry_store *s = op->m->s;
    pthread_mutex_lock(&s->lock);
    /* a landed op (or one whose copies ran in the call) needs no ordering */
    /* being moved or landed by another thread: once landed, no ordering is needed */
    while (op->state == OP_MOVING || op->state == OP_LANDING) pthread_cond_wait(&s->landed, &s->lock);
    int rc = op->rc < 0                          ? op->rc
             : op->xop && op->state == OP_QUEUED ? fy_xfer_op_order(op->xop, cu_stream)
                                                 : 0;
    if (op->rc < 0) rs_merr(op->m, op->rc, "%s", op->msg); /* failed in the mover, not landed yet */
    else if (rc < 0) rs_device_failed(s, op->m, rc);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_model_to_device(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0) return FERRY_E_INVAL; /* tensors NULL: all */
    ferry_op *op = NULL;
    FY_TRY(queue_moves(m, tensors, n, false, &op));
    return ferry_op_wait(op);
}
