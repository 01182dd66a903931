/* SPDX-License-Identifier: Apache-2.0 */
/* copies.c - a tensor's copies off the device (a pinned buffer of the pool,
 * RAM, a range of the spill file) given back. Under the store's lock. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "store_impl.h"

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
        rs_spill_release(s->spill, t->soff, t->nbytes);
    }
    t->host = NULL;
    t->soff = 0;
}
