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
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->ring_lock, NULL);
    d->reg_piece = REG_PIECE;
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
    if (d->lane) d->g->ops->stream_free(d->g, d->lane); /* waits for what is still queued on it */
    fy_gpu_close(d->g);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->ring_lock);
    fy_err_destroy(&d->err);
    fy_free(&d->ctx->mem, d);
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
