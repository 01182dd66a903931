/* SPDX-License-Identifier: Apache-2.0 */
/* spread.c - the chunked copies every pipeline queues (loads, queued
 * moves, registered mappings): a helper below device.c and register.c, so
 * neither reaches into the other for it. */
#define _GNU_SOURCE
#include <stdint.h>

#include "xfer_impl.h"

/* Queue a copy of len bytes between host and dev in pieces of at most
 * REG_CHUNK, round-robin over streams st[0..nst-1] from *next on: the host
 * memory must be page-locked for the copies to run asynchronously. */
int xf_copy_spread(fy_gpu *g, bool to_device, fy_dptr dev, void *host, uint64_t len, fy_stream **st,
                   uint32_t nst, uint32_t *next)
{
    int rc = 0;
    for (uint64_t off = 0; off < len && rc == 0; off += REG_CHUNK) {
        size_t n = (size_t)(len - off < REG_CHUNK ? len - off : REG_CHUNK);
        rc = to_device ? g->ops->copy_htod(g, dev + off, (uint8_t *)host + off, n, st[*next])
                       : g->ops->copy_dtoh(g, (uint8_t *)host + off, dev + off, n, st[*next]);
        *next = (*next + 1) % nst;
    }
    return rc;
}
