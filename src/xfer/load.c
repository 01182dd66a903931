/* SPDX-License-Identifier: Apache-2.0 */
/* load.c - the load API: running a load (the choice is choose.c's), and ferry_load / ferry_load_into / ferry_loaded_*. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xfer_impl.h"

/* ---- the pageable path ---- */

/* Copy plan p from the shards' mappings (pageable memory: the driver stages
 * it, the call returns once the bytes are read) on the streams in turn. As
 * on the ring's mapping reads, each batch's shard is checked to still reach
 * the batch first: a file cut before it is an error, not a SIGBUS; one cut
 * while it is copied is not guarded (README, "Truncated checkpoints"). */
static int run_pageable(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                        fy_stream **streams, uint32_t nstreams)
{
    fy_gpu *g = d->g;
    int rc = 0;
    uint64_t done = 0;
    uint32_t s = 0;
    for (int64_t b = 0; b < p->nbt && rc == 0; b++) {
        const batch *bt = &p->bt[b];
        const shard *sh = &f->shards[bt->shard];
        uint64_t now = 0;
        if ((rc = fy_fstat_size(sh->fd, &now)) < 0) {
            rc = fy_seterr(&d->err, rc, "%s: fstat: %s", sh->path, ferry_strerror(rc));
            break;
        }
        if (!sh->map || now < bt->off + bt->len) {
            rc = fy_seterr(&d->err, FERRY_E_CORRUPT,
                           "%s: the file is now %" PRIu64 " bytes, it was %" PRIu64
                           " when opened: truncated after it was opened?",
                           sh->path, now, sh->size);
            break;
        }
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0;) {
            /* tensors adjacent in the file and on the device go in one copy */
            uint64_t src, len;
            fy_dptr dst;
            xf_piece_run(p, bt, &q, &src, &len, &dst);
            rc = xf_copy_spread(g, true, dst, (uint8_t *)sh->map + src, len, streams, nstreams, &s);
            done += len;
        }
        if (o->progress && rc == 0) o->progress(o->opaque, done, p->bytes);
    }
    for (uint32_t k = 0; k < nstreams; k++) {
        int r = g->ops->stream_sync(g, streams[k]);
        if (rc == 0 && r < 0) rc = r;
    }
    return rc;
}

FERRY_API int ferry_device_prepare(ferry_device *d, const ferry_load_opts *opts, uint64_t bytes)
{
    if (!d) return FERRY_E_INVAL;
    ferry_load_opts o;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &d->err, "ferry_device_prepare"));
    xf_choice c;
    FY_TRY(xf_choose(d, NULL, &o, bytes, "ferry_device_prepare", &c));
    if (!c.ring) return 0; /* only the ring's routes use the ring; host memory has none */
    FY_TRY(d->g->ops->bind_thread(d->g));
    pthread_mutex_lock(&d->ring_lock);
    int rc = xf_ring_take(d, &o, &c, true, NULL, NULL);
    pthread_mutex_unlock(&d->ring_lock);
    return rc;
}

/* The bytes a load of items it[0..n-1] moves, as the choice counts them. */
static uint64_t items_bytes(const ferry_file *f, const item *it, int64_t n)
{
    uint64_t b = 0;
    for (int64_t k = 0; k < n; k++) b += f->tb.t[it[k].t].nbytes;
    return b;
}

int xf_load_items(ferry_device *d, const ferry_file *f, item *it, int64_t n, const ferry_load_opts *opts,
                  const xf_choice *pre, ferry_load_stats *stats, double t0)
{
    ferry_load_opts o;
    ferry_load_stats st = {.size = sizeof st};
    const ferry_allocator *m = &d->ctx->mem;
    fy_err *err = &d->err;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, err, "ferry_load"));
    FY_RETURN_IF(stats && stats->size < FERRY_STRUCT_MIN, err, FERRY_E_INVAL,
                 "ferry_load: stats->size is %u: set it to sizeof(ferry_load_stats)", stats->size);
    uint32_t nstreams = o.streams ? o.streams : 4;
    if (nstreams < 2) nstreams = 2;
    if (nstreams > MAX_STREAMS) nstreams = MAX_STREAMS;

    double now = fy_now();
    if (t0 <= 0 || t0 > now) t0 = now;
    st.alloc_seconds = now - t0;
    xf_choice c;
    if (pre) c = *pre;
    else FY_TRY(xf_choose(d, f, &o, items_bytes(f, it, n), "ferry_load", &c));
    st.route = c.route;
    st.why = c.why;
    st.resident = c.resident;
    uint32_t nthreads = c.nthreads, nbuf = 0;
    plan p;
    int rc = xf_plan_build(m, f, it, n, st.route == FERRY_ROUTE_REGISTER ? UINT64_MAX / 2 : c.bufsz, &p);
    if (rc < 0) return fy_seterr(err, rc, "ferry_load: out of memory for the plan of %" PRId64 " tensors", n);
    fy_stream *streams[MAX_STREAMS] = {0};
    rc = d->g->ops->bind_thread(d->g);
    for (uint32_t s = 0; s < nstreams && rc == 0; s++) rc = xf_stream_take(d, &streams[s]);
    if (rc == 0) {
        st.setup_seconds = fy_now() - t0; /* the ring's case sets it again, with the ring */
        if (d->g->host_visible) {
            rc = xf_run_host(d, f, &p, &o, nthreads);
        } else if (st.route == FERRY_ROUTE_REGISTER) {
            rc = xf_run_register(d, f, &p, &o, streams, nstreams, &st);
        } else if (st.route == FERRY_ROUTE_PAGEABLE) {
            rc = run_pageable(d, f, &p, &o, streams, nstreams);
        } else {
            pthread_mutex_lock(&d->ring_lock);
            rc = xf_ring_take(d, &o, &c, false, &nbuf, &st.pin_seconds);
            /* no more readers than batches: a thread with nothing to read
             * costs its start (a 25 MB file has 7 batches of 4 MiB) */
            if (p.nbt < (long long)nthreads) nthreads = p.nbt > 0 ? (uint32_t)p.nbt : 1;
            st.setup_seconds = fy_now() - t0;
            if (rc == 0)
                rc = xf_run_ring(d, f, &p, st.route == FERRY_ROUTE_DIRECT, &o, streams, nstreams, nthreads,
                                 nbuf);
            if (rc == -EINVAL && st.route == FERRY_ROUTE_DIRECT && o.route == FERRY_ROUTE_AUTO) {
                /* auto chose O_DIRECT on a file system without it (tmpfs, some FUSE): buffered reads */
                st.route = FERRY_ROUTE_RING;
                st.why = "cold, but the file system refuses O_DIRECT: buffered reads";
                rc = xf_run_ring(d, f, &p, false, &o, streams, nstreams, nthreads, nbuf);
            }
            pthread_mutex_unlock(&d->ring_lock);
        }
    }
    for (uint32_t s = 0; s < nstreams; s++) { /* (a load that worked waited for its copies: they are idle) */
        if (!streams[s]) continue;
        if (rc < 0) d->g->ops->stream_free(d->g, streams[s]);
        else xf_stream_give(d, streams[s]);
    }
    st.bytes = p.bytes;
    st.seconds = fy_now() - t0;
    xf_plan_free(m, &p);
    if (stats) fy_struct_out(stats, &st, sizeof st);
    return rc;
}

FERRY_API int ferry_load_into(ferry_device *d, const ferry_file *f, const int64_t *idx, const uint64_t *dptrs,
                              int64_t n, const ferry_load_opts *opts, ferry_load_stats *stats)
{
    if (!d || !f || n < 0 || (n && (!idx || !dptrs))) return FERRY_E_INVAL;
    item *it = fy_calloc(&d->ctx->mem, (size_t)(n ? n : 1), sizeof *it);
    if (!it) return fy_seterr(&d->err, -ENOMEM, "ferry_load_into: out of memory for %" PRId64 " tensors", n);
    for (int64_t k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= f->tb.n) {
            fy_free(&d->ctx->mem, it);
            return fy_seterr(&d->err, FERRY_E_INVAL, "ferry_load_into: tensor index %" PRId64 " out of range",
                             idx[k]);
        }
        it[k].t = idx[k];
        it[k].dst = dptrs[k];
    }
    xf_items_alloc_ends(d, it, n); /* the caller's memory: where its allocations end */
    int rc = xf_load_items(d, f, it, n, opts, NULL, stats, 0);
    fy_free(&d->ctx->mem, it);
    return rc;
}

/* ferry_load pins the ring on the device's pool while it allocates the device
 * memory, where it will need a ring and none is pinned (a fresh process's
 * first load: the pinning, 5-7 ms on the H200, and cuMemAlloc, ~3 ms for
 * 10 GB, one after the other before). The load then pins nothing; if the
 * helper could not pin, the load fails with its error, as it would have. */
typedef struct pin_ahead {
    ferry_device *d;
    const ferry_load_opts *o;
    const xf_choice *c;
    double seconds; /* the pinning's, for ferry_load_stats.pin_seconds */
    int rc;
} pin_ahead;

static void pin_ahead_main(void *arg)
{
    pin_ahead *a = arg;
    double t = fy_now();
    a->rc = a->d->g->ops->bind_thread(a->d->g);
    if (a->rc == 0) {
        pthread_mutex_lock(&a->d->ring_lock);
        a->rc = xf_ring_take(a->d, a->o, a->c, true, NULL, NULL);
        pthread_mutex_unlock(&a->d->ring_lock);
    }
    a->seconds = fy_now() - t;
}

FERRY_API int ferry_load(ferry_device *d, const ferry_file *f, const ferry_load_opts *opts,
                         ferry_loaded **out, ferry_load_stats *stats)
{
    if (!d || !f || !out) return FERRY_E_INVAL;
    double t0 = fy_now(); /* the device allocation below is part of the load's time */
    *out = NULL;
    /* the choice is made once, before the allocation: the ring it needs is
     * pinned meanwhile, and the load then runs what was chosen */
    ferry_load_opts o;
    xf_choice c;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &d->err, "ferry_load"));
    uint64_t bytes = 0;
    for (int64_t i = 0; i < f->tb.n; i++) bytes += f->tb.t[i].nbytes;
    FY_TRY(xf_choose(d, f, &o, bytes, "ferry_load", &c));
    pin_ahead pa = {.d = d, .o = &o, .c = &c};
    xf_task pin_task = {.fn = pin_ahead_main, .arg = &pa};
    xf_group pin_group;
    bool pinning = c.ring && c.pins;
    if (pinning) xf_pool_start(&d->pool, &pin_group, &pin_task, 1); /* (no worker: the wait pins) */
    const ferry_allocator *m = &d->ctx->mem;
    ferry_loaded *l = fy_calloc(m, 1, sizeof *l);
    item *it = fy_calloc(m, (size_t)(f->tb.n ? f->tb.n : 1), sizeof *it);
    int rc = 0;
    if (l) l->dev = d, l->f = f;
    if (!l || !it || !(l->block = fy_calloc(m, (size_t)f->nshards, sizeof(fy_dptr))) ||
        !(l->dptr = fy_calloc(m, (size_t)(f->tb.n ? f->tb.n : 1), sizeof(uint64_t)))) {
        rc = fy_seterr(&d->err, -ENOMEM, "ferry_load: out of memory for the lists of %" PRId64 " tensors",
                       f->tb.n);
        goto fail;
    }
    /* one block per shard spanning its tensors, laid out as in the file */
    rc = d->g->ops->bind_thread(d->g);
    for (int32_t s = 0; s < f->nshards && rc == 0; s++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int64_t i = 0; i < f->tb.n; i++) {
            const fy_tensor *t = &f->tb.t[i];
            if (t->shard != s || t->nbytes == 0) continue;
            if (t->offset < lo) lo = t->offset;
            if (t->offset + t->nbytes > hi) hi = t->offset + t->nbytes;
        }
        if (hi == 0) continue;
        rc = d->g->ops->mem_alloc(d->g, (size_t)(hi - lo), &l->block[s]);
        if (rc < 0) break;
        for (int64_t i = 0; i < f->tb.n; i++)
            if (f->tb.t[i].shard == s) {
                l->dptr[i] = l->block[s] + (f->tb.t[i].offset - lo);
                it[i].aend = l->block[s] + (hi - lo); /* the shard's block: its copies may merge */
            }
    }
    if (rc < 0) goto fail;
    for (int64_t i = 0; i < f->tb.n; i++) {
        it[i].t = i;
        it[i].dst = l->dptr[i];
    }
    bool pinned_ahead = false;
    if (pinning) {
        xf_pool_wait(&d->pool, &pin_group);
        pinning = false;
        /* its failure is the load's (the message is on the device already) */
        if ((rc = pa.rc) < 0) goto fail;
        pinned_ahead = true;
    }
    rc = xf_load_items(d, f, it, f->tb.n, &o, &c, stats, t0);
    if (rc < 0) goto fail;
    /* the ring was pinned for this load, beside its allocation */
    if (pinned_ahead && stats && stats->pin_seconds == 0 &&
        stats->size >= offsetof(ferry_load_stats, pin_seconds) + sizeof stats->pin_seconds)
        stats->pin_seconds = pa.seconds;
    fy_free(m, it);
    *out = l;
    return 0;
fail:
    if (pinning) xf_pool_wait(&d->pool, &pin_group);
    fy_free(m, it);
    ferry_loaded_free(l);
    return rc;
}

FERRY_API uint64_t ferry_loaded_ptr(const ferry_loaded *l, int64_t i)
{
    if (!l || i < 0 || i >= l->f->tb.n) return 0;
    return l->dptr[i];
}

FERRY_API int ferry_loaded_read(ferry_loaded *l, int64_t i, void *buf)
{
    if (!l || !buf || i < 0 || i >= l->f->tb.n) return FERRY_E_INVAL;
    fy_gpu *g = l->dev->g;
    uint64_t n = l->f->tb.t[i].nbytes;
    if (n == 0) return 0;
    fy_stream *s = NULL;
    int rc = g->ops->bind_thread(g);
    if (rc == 0) rc = xf_stream_take(l->dev, &s);
    if (rc < 0) return rc;
    rc = g->ops->copy_dtoh(g, buf, l->dptr[i], (size_t)n, s);
    int r2 = g->ops->stream_sync(g, s);
    if (r2 < 0) g->ops->stream_free(g, s);
    else xf_stream_give(l->dev, s);
    return rc < 0 ? rc : r2;
}

FERRY_API void ferry_loaded_free(ferry_loaded *l)
{
    if (!l) return;
    const ferry_allocator *m = &l->dev->ctx->mem;
    if (l->block) {
        l->dev->g->ops->bind_thread(l->dev->g);
        for (int32_t s = 0; s < l->f->nshards; s++)
            if (l->block[s]) l->dev->g->ops->mem_free(l->dev->g, l->block[s]);
    }
    fy_free(m, l->block);
    fy_free(m, l->dptr);
    fy_free(m, l);
}
