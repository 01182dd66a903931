/* SPDX-License-Identifier: Apache-2.0 */
/* moves.c - the moves the residency store asks for (xfer.h): device and
 * pinned blocks, copies between host memory and the device, and reads and
 * writes of a file (the spill file) through the ring. */
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

#define OP_STREAMS 4

/* ---- blocks ---- */

int fy_xfer_bind(ferry_device *d)
{
    return d ? d->g->ops->bind_thread(d->g) : FERRY_E_INVAL;
}

int fy_xfer_dev_alloc(ferry_device *d, uint64_t n, fy_dptr *out)
{
    if (!d || !out || n > SIZE_MAX) return FERRY_E_INVAL;
    return d->g->ops->mem_alloc(d->g, (size_t)n, out);
}

void fy_xfer_dev_free(ferry_device *d, fy_dptr p)
{
    if (d && p) d->g->ops->mem_free(d->g, p);
}

int fy_xfer_pinned_alloc(ferry_device *d, uint64_t n, void **out)
{
    if (!d || !out || n > SIZE_MAX) return FERRY_E_INVAL;
    return d->g->ops->host_alloc(d->g, (size_t)n, out);
}

void fy_xfer_pinned_free(ferry_device *d, void *p)
{
    if (d && p) d->g->ops->host_free(d->g, p);
}

/* ---- completions ---- */

/* Streams (and an event per stream) owned by one queued move until its wait;
 * a move finished before returning has none. */
struct fy_xfer_op {
    ferry_device *d;
    fy_stream *st[OP_STREAMS];
    fy_event *ev[OP_STREAMS];
    bool lane; /* st[0] is the device's lane (not the op's to free), ev[0] its end */
};

static int op_new(ferry_device *d, bool streams, fy_xfer_op **out)
{
    fy_xfer_op *op = fy_calloc(&d->ctx->mem, 1, sizeof *op);
    if (!op)
        return fy_seterr(&d->err, -ENOMEM, "out of memory (a transfer's completion, %zu bytes)", sizeof *op);
    op->d = d;
    int rc = 0;
    for (int k = 0; streams && k < OP_STREAMS && rc == 0; k++) {
        rc = xf_stream_take(d, &op->st[k]);
        if (rc == 0) rc = xf_event_take(d, &op->ev[k]);
    }
    if (rc < 0) {
        fy_xfer_op_wait(op);
        return rc;
    }
    *out = op;
    return 0;
}

int fy_xfer_op_wait(fy_xfer_op *op)
{
    if (!op) return FERRY_E_INVAL;
    ferry_device *d = op->d;
    fy_gpu *g = d->g;
    int rc = 0;
    if (op->lane) {
        if (op->ev[0]) {
            rc = g->ops->event_sync(g, op->ev[0]);
            xf_event_give(d, op->ev[0]);
        }
        fy_free(&d->ctx->mem, op);
        return rc;
    }
    for (int k = 0; k < OP_STREAMS; k++) {
        if (!op->st[k]) continue;
        int r = g->ops->stream_sync(g, op->st[k]);
        if (rc == 0 && r < 0) rc = r;
        xf_event_give(d, op->ev[k]);
        if (r < 0) g->ops->stream_free(g, op->st[k]); /* (a stream that failed is not reused) */
        else xf_stream_give(d, op->st[k]);
    }
    fy_free(&op->d->ctx->mem, op);
    return rc;
}

/* A queued move on the device's lane: its stream (made on first use) and an
 * event of the op's own that marks where the move ends. */
static int op_new_lane(ferry_device *d, fy_xfer_op **out)
{
    fy_gpu *g = d->g;
    fy_xfer_op *op = fy_calloc(&d->ctx->mem, 1, sizeof *op);
    if (!op)
        return fy_seterr(&d->err, -ENOMEM, "out of memory (a transfer's completion, %zu bytes)", sizeof *op);
    op->d = d;
    op->lane = true;
    int rc = 0;
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    if (!d->lane) rc = g->ops->stream_new(g, &d->lane);
    op->st[0] = d->lane;
    pthread_mutex_unlock(&d->lock);
    if (rc == 0) rc = xf_event_take(d, &op->ev[0]);
    if (rc < 0) {
        fy_xfer_op_wait(op);
        return rc;
    }
    *out = op;
    return 0;
}

int fy_xfer_op_query(fy_xfer_op *op)
{
    if (!op) return FERRY_E_INVAL;
    fy_gpu *g = op->d->g;
    for (int k = 0; k < OP_STREAMS; k++) {
        if (!op->ev[k]) continue;
        int q = g->ops->event_query(g, op->ev[k]);
        if (q <= 0) return q;
    }
    return 1;
}

int fy_xfer_op_order(fy_xfer_op *op, uint64_t stream)
{
    if (!op) return FERRY_E_INVAL;
    fy_gpu *g = op->d->g;
    for (int k = 0; k < OP_STREAMS; k++) {
        if (!op->ev[k]) continue; /* a move that finished before returning needs no ordering */
        int rc = g->ops->stream_wait(g, stream, op->ev[k]);
        if (rc < 0) return rc;
    }
    return 0;
}

struct fy_xfer_fence {
    ferry_device *d;
    fy_event *ev;
};

int fy_xfer_fence_new(ferry_device *d, uint64_t stream, fy_xfer_fence **out)
{
    if (!d || !out) return FERRY_E_INVAL;
    *out = NULL;
    fy_gpu *g = d->g;
    fy_xfer_fence *f = fy_calloc(&d->ctx->mem, 1, sizeof *f);
    if (!f) return fy_seterr(&d->err, -ENOMEM, "out of memory (a stream fence, %zu bytes)", sizeof *f);
    f->d = d;
    int rc = g->ops->bind_thread(g);
    if (rc == 0) rc = xf_event_take(d, &f->ev);
    if (rc == 0) rc = g->ops->event_record_raw(g, f->ev, stream);
    if (rc < 0) {
        fy_xfer_fence_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int fy_xfer_fence_query(fy_xfer_fence *f)
{
    return f ? f->d->g->ops->event_query(f->d->g, f->ev) : FERRY_E_INVAL;
}

int fy_xfer_fence_wait(fy_xfer_fence *f)
{
    return f ? f->d->g->ops->event_sync(f->d->g, f->ev) : FERRY_E_INVAL;
}

void fy_xfer_fence_free(fy_xfer_fence *f)
{
    if (!f) return;
    xf_event_give(f->d, f->ev);
    fy_free(&f->d->ctx->mem, f);
}

int fy_xfer_lane_wait(ferry_device *d, fy_xfer_fence *f)
{
    if (!d || !f) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    int rc = g->ops->bind_thread(g);
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    if (rc == 0 && !d->lane) rc = g->ops->stream_new(g, &d->lane);
    if (rc == 0) rc = g->ops->stream_wait(g, g->ops->stream_raw(g, d->lane), f->ev);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

/* A move that already ran: hand back a completed op, or nothing when the
 * caller waits (op NULL) or the move failed. */
static int done(ferry_device *d, int rc, fy_xfer_op **op)
{
    if (op) *op = NULL;
    if (rc < 0 || !op) return rc;
    return op_new(d, false, op);
}

/* ---- moves ---- */

static int host_copies(ferry_device *d, const fy_hostrange *r, int64_t n, bool to_device, fy_xfer_op **out)
{
    if (out) *out = NULL;
    if (!d || n < 0 || (n && !r)) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    fy_xfer_op *op = NULL;
    int rc = g->ops->bind_thread(g);
    /* queued: in order on the lane; waited for here: spread over streams of its own */
    if (rc == 0) rc = out ? op_new_lane(d, &op) : op_new(d, true, &op);
    if (rc < 0) return rc;
    uint32_t next = 0, nst = op->lane ? 1 : OP_STREAMS;
    for (int64_t k = 0; k < n && rc == 0; k++)
        rc = xf_copy_spread(g, to_device, r[k].dev, r[k].host, r[k].len, op->st, nst, &next);
    for (uint32_t k = 0; k < nst && rc == 0; k++) rc = g->ops->event_record(g, op->ev[k], op->st[k]);
    /* a lane move that failed part-way has no end event recorded: wait for
     * the lane itself, or copies it queued would land in memory the caller
     * reuses */
    if (rc < 0 && op->lane) (void)g->ops->stream_sync(g, op->st[0]);
    if (rc < 0 || !out) { /* wait: no copy may still be running when the caller reuses the memory */
        int r2 = fy_xfer_op_wait(op);
        return rc < 0 ? rc : r2;
    }
    *out = op;
    return 0;
}

int fy_xfer_host_to_device(ferry_device *d, const fy_hostrange *r, int64_t n, fy_xfer_op **op)
{
    return host_copies(d, r, n, true, op);
}

int fy_xfer_device_to_host(ferry_device *d, const fy_hostrange *r, int64_t n, fy_xfer_op **op)
{
    return host_copies(d, r, n, false, op);
}

/* A stand-in ferry_file whose one "shard" is fd, and whose tensors are the
 * ranges: the ring pipeline then reads any file (the spill file) unchanged. */
static int fd_to_device(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                        const ferry_load_opts *o, ferry_load_stats *st)
{
    if (!d || fd < 0 || n < 0 || (n && !r)) return FERRY_E_INVAL;
    if (n == 0) return 0;
    const ferry_allocator *m = &d->ctx->mem;
    shard sh = {.path = (char *)(uintptr_t)path, .fd = fd, .size = 0, .map = NULL};
    ferry_file f = {.ctx = d->ctx, .fmt = FERRY_FORMAT_UNKNOWN, .nshards = 1, .shards = &sh};
    f.tb.mem = m;
    f.tb.t = fy_calloc(m, (size_t)n, sizeof *f.tb.t);
    item *it = fy_calloc(m, (size_t)n, sizeof *it);
    int rc = 0;
    if (!f.tb.t || !it) {
        rc = fy_seterr(&d->err, -ENOMEM, "%s: out of memory for the plan of %" PRId64 " ranges", path, n);
    } else {
        f.tb.n = n;
        for (int64_t k = 0; k < n; k++) {
            f.tb.t[k].name = (char *)"";
            f.tb.t[k].offset = r[k].off;
            f.tb.t[k].nbytes = r[k].len;
            it[k].t = k;
            it[k].dst = r[k].dev;
        }
        xf_items_alloc_ends(d, it, n); /* the store's segments: a run must not cross one's end */
        ferry_load_opts lo = {0};
        if (o) memcpy(&lo, o, o->size && o->size <= sizeof lo ? o->size : 0);
        lo.size = sizeof lo;
        lo.route = FERRY_ROUTE_RING;
        rc = xf_load_items(d, &f, it, n, &lo, NULL, st, 0);
    }
    fy_free(m, f.tb.t);
    fy_free(m, it);
    return rc;
}

int fy_xfer_fd_to_device(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, ferry_load_stats *st, fy_xfer_op **op)
{
    if (op) *op = NULL;
    if (!d) return FERRY_E_INVAL;
    return done(d, fd_to_device(d, fd, path, r, n, o, st), op);
}

static int device_to_fd(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                        const ferry_load_opts *o)
{
    if (!d || fd < 0 || n < 0 || (n && !r)) return FERRY_E_INVAL;
    if (n == 0) return 0;
    fy_gpu *g = d->g;
    const ferry_load_opts none = {.size = sizeof none};
    uint32_t nthreads, nbuf;
    uint64_t bufsz;
    FY_TRY(xf_ring_geometry(d, o ? o : &none, false, &nthreads, &nbuf, &bufsz));
    fy_stream *st[4] = {0};
    int rc = g->ops->bind_thread(g);
    for (int k = 0; k < 4 && rc == 0; k++) rc = xf_stream_take(d, &st[k]);
    if (rc < 0) goto out_streams;
    pthread_mutex_lock(&d->ring_lock);
    rc = xf_ring_get(d, nbuf, bufsz);
    if (rc < 0) goto out;
    /* pending[b]: what buffer b holds once its event fires */
    struct pend {
        bool busy;
        uint64_t off, len;
    } pending[4096];
    uint32_t nb = d->nring < 4096 ? d->nring : 4096;
    memset(pending, 0, sizeof pending);
    uint32_t b = 0, s = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        for (uint64_t done = 0; done < r[k].len && rc == 0; done += bufsz) {
            uint64_t len = r[k].len - done < bufsz ? r[k].len - done : bufsz;
            ring_buf *rb = &d->ring[b];
            if (pending[b].busy) { /* the oldest buffer: wait for its copy, write it out */
                rc = g->ops->event_sync(g, rb->ev);
                if (rc == 0) {
                    rc = fy_pwrite_full(fd, rb->p, (size_t)pending[b].len, pending[b].off);
                    if (rc < 0)
                        fy_seterr(&d->err, rc, "%s: writing %" PRIu64 " bytes at %" PRIu64 ": %s", path,
                                  pending[b].len, pending[b].off, ferry_strerror(rc));
                }
                pending[b].busy = false;
                if (rc < 0) break;
            }
            rc = g->ops->copy_dtoh(g, rb->p, r[k].dev + done, (size_t)len, st[s]);
            if (rc == 0) rc = g->ops->event_record(g, rb->ev, st[s]);
            if (rc < 0) break;
            pending[b] = (struct pend){true, r[k].off + done, len};
            b = (b + 1) % nb;
            s = (s + 1) % 4;
        }
    }
    /* drain in order (on failure: still wait, so no copy lands in a reused buffer) */
    for (uint32_t k = 0; k < nb; k++) {
        uint32_t q = (b + k) % nb;
        if (!pending[q].busy) continue;
        int r2 = g->ops->event_sync(g, d->ring[q].ev);
        if (rc == 0 && r2 < 0) rc = r2;
        if (rc == 0) {
            rc = fy_pwrite_full(fd, d->ring[q].p, (size_t)pending[q].len, pending[q].off);
            if (rc < 0)
                fy_seterr(&d->err, rc, "%s: writing %" PRIu64 " bytes at %" PRIu64 ": %s", path,
                          pending[q].len, pending[q].off, ferry_strerror(rc));
        }
    }
out:
    /* no copy may still be landing in a ring buffer once the ring is let go
     * (a copy whose event could not be recorded is not in pending[]) */
    for (int k = 0; k < 4; k++)
        if (st[k]) g->ops->stream_sync(g, st[k]);
    pthread_mutex_unlock(&d->ring_lock);
out_streams:
    for (int k = 0; k < 4; k++) {
        if (!st[k]) continue;
        if (g->ops->stream_sync(g, st[k]) < 0) g->ops->stream_free(g, st[k]);
        else xf_stream_give(d, st[k]);
    }
    return rc;
}

int fy_xfer_device_to_fd(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, fy_xfer_op **op)
{
    if (op) *op = NULL;
    if (!d) return FERRY_E_INVAL;
    return done(d, device_to_fd(d, fd, path, r, n, o), op);
}

int fy_xfer_fd_to_host(ferry_device *d, int fd, uint64_t off, void *buf, uint64_t len)
{
    if (!d || fd < 0 || (len && !buf) || len > SIZE_MAX) return FERRY_E_INVAL;
    return len ? fy_pread_full(fd, buf, (size_t)len, off) : 0;
}
