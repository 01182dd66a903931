/* SPDX-License-Identifier: Apache-2.0 */
/* cache.c - cache admission: which tensors keep a clean pinned copy when
 * read from their checkpoint (a streamed block's under its plan, any
 * tensor's of a model with pinned_cache on), whether the budgets admit one,
 * and dropping copies for room. A decision over the pinned pool (pinpool.c),
 * used by the moves, the eviction and the models. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

bool rs_wants_cache(const ferry_model *m, const rtensor *t)
{
    return t->streams ? m->plan && m->plan->pinned_cache : m->pinned_cache;
}

bool rs_cache_admits(ferry_store *s, uint64_t n, uint64_t avail)
{
    return s->pool.used + n <= s->o.pinned_budget && s->host_used + s->pool.used + n <= s->o.host_budget &&
           avail >= s->o.spill_below + n;
}

void rs_uncache(ferry_store *s, rtensor *t)
{
    if (!t->cached) return;
    t->cached = false;
    if (t->dirty && t->tier != FERRY_TIER_DEVICE) { /* its only copy: kept as a plain saved one */
        s->cache_used -= t->nbytes;
        return;
    }
    rs_cache_buffer_free(s, t);
    if (t->tier == FERRY_TIER_PINNED) t->tier = FERRY_TIER_SOURCE;
}

uint64_t rs_uncache_bytes(ferry_store *s, uint64_t want)
{
    uint64_t got = 0;
    /* first the copies beside a device copy (only speed is lost), then those
     * that are a tensor's only copy off the checkpoint */
    for (int pass = 0; pass < 2 && got < want; pass++)
        for (int i = 0; i < s->nmodels && got < want; i++)
            for (int64_t j = 0; j < s->models[i]->n && got < want; j++) {
                rtensor *t = &s->models[i]->t[j];
                if (!t->cached || t->moving || t->holds || t->busy ||
                    (t->dirty && t->tier != FERRY_TIER_DEVICE))
                    continue;
                if ((t->tier == FERRY_TIER_DEVICE) != (pass == 0)) continue;
                got += t->nbytes;
                rs_uncache(s, t);
            }
    return got;
}
