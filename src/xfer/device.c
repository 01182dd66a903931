/* SPDX-License-Identifier: Apache-2.0 */
/* device.c - a device handle: opening and closing it, its memory figures,
 * the pinned ring it keeps between loads. */
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
#include "xfer_test.h"

/* ---- devices ---- */

enum {
    CACHED_STREAMS = 16, /* a waited move's 4, a load's, the spill writer's 4, with room */
    CACHED_EVENTS = 256, /* a queued move's end and a fence per block in flight, for a pass */
    WARM_STREAMS = 8,
    WARM_EVENTS = 64
};


FERRY_API int ferry_device_open(ferry_ctx *ctx, const char *spec, ferry_device **out)
{
    if (!ctx || !out) return FERRY_E_INVAL;
    *out = NULL;
    FY_RETURN_IF(!spec, &ctx->err, FERRY_E_INVAL, "ferry_device_open: no device given");
    ferry_device *d = fy_calloc(&ctx->mem, 1, sizeof *d);
    if (!d) return fy_seterr(&ctx->err, -ENOMEM, "ferry_device_open: out of memory (%zu bytes)", sizeof *d);
    d->ctx = ctx;
    fy_err_init_child(&d->err, &ctx->err); /* the backend's messages land here and on ctx */
    int rc = fy_gpu_open(spec, &ctx->mem, &d->err, &d->g);
    if (rc < 0) {
        fy_err_destroy(&d->err);
        fy_free(&ctx->mem, d);
        return rc;
    }
    d->free_streams = fy_calloc(&ctx->mem, CACHED_STREAMS, sizeof *d->free_streams);
    d->free_events = fy_calloc(&ctx->mem, CACHED_EVENTS, sizeof *d->free_events);
    if (!d->free_streams || !d->free_events) {
        fy_free(&ctx->mem, d->free_streams);
        fy_free(&ctx->mem, d->free_events);
        fy_gpu_close(d->g);
        fy_err_destroy(&d->err);
        fy_free(&ctx->mem, d);
        return fy_seterr(&ctx->err, -ENOMEM,
                         "ferry_device_open: out of memory (the cache of streams and events)");
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->ring_lock, NULL);
    d->reg_piece = REG_PIECE;
    d->pid = getpid();
    xf_pool_init(&d->pool);
    *out = d;
    return 0;
}

void xf_ring_free(ferry_device *d)
{
    for (uint32_t i = 0; i < d->nring; i++)
        if (d->ring[i].ev) d->g->ops->event_free(d->g, d->ring[i].ev);
    if (d->ring_base) d->g->ops->host_free(d->g, d->ring_base);
    fy_free(&d->ctx->mem, d->ring);
    d->ring = NULL;
    d->ring_base = NULL;
    d->nring = 0;
    d->ring_bytes = 0;
}

FERRY_API void ferry_device_close(ferry_device *d)
{
    if (!d) return;
    xf_pool_stop(&d->pool); /* every load has returned: what is left is unmapping */
    xf_reg_unwatch_all(d);  /* a file closed later must not call back into d */
    for (int i = 0; i < d->nregs; i++) d->g->ops->host_unregister(d->g, d->regs[i].base);
    fy_free(&d->ctx->mem, d->regs);
    xf_ring_free(d);
    xf_device_forked(d);
    if (d->lane) d->g->ops->stream_free(d->g, d->lane); /* waits for what is still queued on it */
    for (uint32_t i = 0; i < d->nfree_streams; i++) d->g->ops->stream_free(d->g, d->free_streams[i]);
    for (uint32_t i = 0; i < d->nfree_events; i++) d->g->ops->event_free(d->g, d->free_events[i]);
    fy_free(&d->ctx->mem, d->free_streams);
    fy_free(&d->ctx->mem, d->free_events);
    fy_gpu_close(d->g);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->ring_lock);
    fy_err_destroy(&d->err);
    fy_free(&d->ctx->mem, d);
}

/* ---- the cache of streams and events ---- */


void xf_device_forked(ferry_device *d)
{
    pid_t now = getpid();
    if (d->pid == now) return;
    d->pid = now;
    d->lane = NULL; /* (the parent's: never freed here) */
    d->nfree_streams = d->nfree_events = 0;
}

int xf_stream_take(ferry_device *d, fy_stream **out)
{
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    fy_stream *s = d->nfree_streams ? d->free_streams[--d->nfree_streams] : NULL;
    pthread_mutex_unlock(&d->lock);
    if (s) {
        *out = s;
        return 0;
    }
    return d->g->ops->stream_new(d->g, out);
}

void xf_stream_give(ferry_device *d, fy_stream *s)
{
    if (!s) return;
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    bool kept = d->nfree_streams < CACHED_STREAMS;
    if (kept) d->free_streams[d->nfree_streams++] = s;
    pthread_mutex_unlock(&d->lock);
    if (!kept) d->g->ops->stream_free(d->g, s);
}

int xf_event_take(ferry_device *d, fy_event **out)
{
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    fy_event *e = d->nfree_events ? d->free_events[--d->nfree_events] : NULL;
    pthread_mutex_unlock(&d->lock);
    if (e) {
        *out = e;
        return 0;
    }
    return d->g->ops->event_new(d->g, out);
}

void xf_event_give(ferry_device *d, fy_event *e)
{
    if (!e) return;
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    bool kept = d->nfree_events < CACHED_EVENTS;
    if (kept) d->free_events[d->nfree_events++] = e;
    pthread_mutex_unlock(&d->lock);
    if (!kept) d->g->ops->event_free(d->g, e);
}

int fy_xfer_warm(ferry_device *d)
{
    if (!d) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    int rc = g->ops->bind_thread(g);
    pthread_mutex_lock(&d->lock);
    xf_device_forked(d);
    if (rc == 0 && !d->lane) rc = g->ops->stream_new(g, &d->lane);
    uint32_t have_s = d->nfree_streams, have_e = d->nfree_events;
    pthread_mutex_unlock(&d->lock);
    fy_stream *st[WARM_STREAMS] = {0};
    fy_event *ev[WARM_EVENTS] = {0};
    uint32_t ns = have_s < WARM_STREAMS ? WARM_STREAMS - have_s : 0;
    uint32_t ne = have_e < WARM_EVENTS ? WARM_EVENTS - have_e : 0;
    for (uint32_t i = 0; i < ns && rc == 0; i++) rc = g->ops->stream_new(g, &st[i]);
    for (uint32_t i = 0; i < ne && rc == 0; i++) rc = g->ops->event_new(g, &ev[i]);
    for (uint32_t i = 0; i < ns; i++) xf_stream_give(d, st[i]); /* (made or not: what was made is kept) */
    for (uint32_t i = 0; i < ne; i++) xf_event_give(d, ev[i]);
    return rc;
}

fy_gpu *fy_device_gpu(ferry_device *d)
{
    return d ? d->g : NULL;
}
void fy_device_set_reg_piece(ferry_device *d, uint64_t bytes)
{
    d->reg_piece = bytes ? page_round(bytes) : REG_PIECE;
}
ferry_ctx *fy_device_ctx(ferry_device *d)
{
    return d ? d->ctx : NULL;
}

FERRY_API const char *ferry_device_errmsg(ferry_device *d)
{
    return d ? fy_err_public(&d->err) : "";
}

FERRY_API const char *ferry_device_desc(const ferry_device *d)
{
    return d ? d->g->desc : "";
}

FERRY_API int ferry_device_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (!d) return FERRY_E_INVAL;
    uint64_t f = 0, t = 0;
    int rc = d->g->ops->mem_info(d->g, &f, &t);
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return rc;
}

/* The ring: nbuf pinned buffers of bytes (+ slack for O_DIRECT alignment), kept
 * on the device between loads so repeated loads do not pay for pinning again.
 * One pinned block sliced into buffers: pinning is paid per call (24 separate
 * 4 MiB buffers took ~35 ms on the H200 host, a tenth of a 10 GB load). */
int xf_ring_get(ferry_device *d, uint32_t nbuf, uint64_t bytes)
{
    if (d->nring == nbuf && d->ring_bytes == bytes) return 0;
    xf_ring_free(d);
    uint64_t stride = bytes + 2 * ALIGN;
    d->ring = fy_calloc(&d->ctx->mem, nbuf, sizeof *d->ring);
    if (!d->ring) return fy_seterr(&d->err, -ENOMEM, "out of memory for a ring of %u buffers", nbuf);
    int rc = d->g->ops->host_alloc(d->g, (size_t)(stride * nbuf), (void **)&d->ring_base);
    if (rc < 0) {
        fy_free(&d->ctx->mem, d->ring);
        d->ring = NULL;
        return rc;
    }
    d->nring = nbuf;
    d->ring_bytes = bytes;
    for (uint32_t i = 0; i < nbuf; i++) {
        d->ring[i].stream = -1;
        d->ring[i].p = d->ring_base + stride * i;
        rc = d->g->ops->event_new(d->g, &d->ring[i].ev);
        if (rc < 0) {
            xf_ring_free(d);
            return rc;
        }
    }
    return 0;
}
