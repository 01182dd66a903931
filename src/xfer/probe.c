/* SPDX-License-Identifier: Apache-2.0 */
/* probe.c - ferry_device_copy_rate: the pinned copy rate each way;
 * ferry_device_probe_cufile: whether GPUDirect Storage could read a file. */
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

FERRY_API int ferry_device_copy_rate(ferry_device *d, uint64_t bytes, double *htod, double *dtoh)
{
    if (!d) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    /* 256 MiB, or half the bytes asked for (in 2 MiB) where that is less:
     * a small probe fits a small device */
    size_t chunk = 256u << 20;
    if (bytes / 2 < chunk)
        chunk = bytes / 2 < (2u << 20) ? (2u << 20)
                                       : (size_t)((bytes / 2 + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1));
    void *h = NULL;
    fy_dptr dp = 0;
    fy_stream *s[2] = {0};
    int rc = g->ops->bind_thread(g);
    /* and at most a quarter of the device's free memory (a sim:64MiB device) */
    uint64_t free_b = 0;
    if (rc == 0 && g->ops->mem_info(g, &free_b, NULL) == 0 && free_b / 4 < chunk)
        chunk = free_b / 4 < (2u << 20) ? (2u << 20) : (size_t)(free_b / 4 & ~(uint64_t)((2u << 20) - 1));
    if (rc == 0) rc = g->ops->host_alloc(g, chunk, &h);
    if (rc == 0) rc = g->ops->mem_alloc(g, chunk, &dp);
    for (int k = 0; k < 2 && rc == 0; k++) rc = g->ops->stream_new(g, &s[k]);
    if (rc == 0) memset(h, 0x5A, chunk);
    for (int dir = htod ? 0 : 1; dir < (dtoh ? 2 : 1) && rc == 0; dir++) {
        /* one untimed copy per stream first: the first copy pays for setup */
        for (int k = 0; k < 2 && rc == 0; k++) /* each stream its own half: no two copies write one byte */
            rc = dir == 0 ? g->ops->copy_htod(g, dp + (fy_dptr)(k * (chunk / 2)), (char *)h + k * (chunk / 2),
                                              chunk / 2, s[k])
                          : g->ops->copy_dtoh(g, (char *)h + k * (chunk / 2), dp + (fy_dptr)(k * (chunk / 2)),
                                              chunk / 2, s[k]);
        for (int k = 0; k < 2 && rc == 0; k++) rc = g->ops->stream_sync(g, s[k]);
        double t0 = fy_now();
        uint64_t moved = 0;
        for (int k = 0; moved < bytes && rc == 0; k ^= 1) {
            /* two halves on two streams, like the ring's copies */
            size_t half = chunk / 2;
            rc = dir == 0 ? g->ops->copy_htod(g, dp + (fy_dptr)(k * half), (char *)h + k * half, half, s[k])
                          : g->ops->copy_dtoh(g, (char *)h + k * half, dp + (fy_dptr)(k * half), half, s[k]);
            moved += half;
        }
        for (int k = 0; k < 2; k++) {
            int r = g->ops->stream_sync(g, s[k]);
            if (rc == 0) rc = r;
        }
        double gbps = (double)moved / (fy_now() - t0) / 1e9;
        if (dir == 0 && htod) *htod = gbps;
        if (dir == 1 && dtoh) *dtoh = gbps;
    }
    for (int k = 0; k < 2; k++)
        if (s[k]) g->ops->stream_free(g, s[k]);
    if (dp) g->ops->mem_free(g, dp);
    if (h) g->ops->host_free(g, h);
    return rc;
}


FERRY_API int ferry_device_probe_cufile(ferry_device *d, const ferry_file *f, char *why, size_t len)
{
    if (why && len) why[0] = 0;
    if (!d) return FERRY_E_INVAL;
    char buf[256];
    int rc = fy_cufile_probe(d->g, f && f->nshards ? f->shards[0].fd : -1, buf, sizeof buf);
    if (why && len)
        snprintf(why, len, "%s%s%s", f && f->nshards ? f->shards[0].path : "", f && f->nshards ? ": " : "",
                 buf);
    return rc;
}
