/* SPDX-License-Identifier: Apache-2.0 */
/* releases.c - holds dropped once a caller's stream is done with a tensor
 * (ferry_model_release_after), on the store's release fences (fences.h):
 * a fence's item is a held tensor, dropped when it is done, or early when
 * the store is short of room (rs_defer_releases); the next writes into
 * released memory are ordered after the fences (rs_reuse_order). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* A fence's item is a held tensor: its hold drops once the fence is done. */
static void drop_hold(void *item, void *arg)
{
    (void)arg;
    rtensor *t = item;
    if (t->holds > 0) t->holds--;
}

int64_t rs_reap_releases(ferry_store *s, bool wait)
{
    return rs_fences_reap(&s->fences, wait, drop_hold, NULL);
}

/* May t's hold drop before its fence is done? When its whole group is
 * clean on the device (a hold of one member keeps all of them: the PyTorch
 * hooks hold a block by its leader; and evicting a dirty one reads it
 * back). Drops it when so. */
static bool early_drop(void *item, void *arg)
{
    (void)arg;
    rtensor *t = item;
    const ferry_model *om = t->owner;
    for (int64_t j = om->gat[t->group]; j < om->gat[t->group] + om->gcnt[t->group]; j++) {
        const rtensor *u = &om->t[om->gmem[j]];
        if (u->dirty || u->moving || u->tier != FERRY_TIER_DEVICE) return false;
    }
    if (t->holds > 0) t->holds--;
    return true;
}

int64_t rs_defer_releases(ferry_store *s)
{
    return rs_fences_defer(&s->fences, early_drop, NULL);
}

void rs_reuse_wait_all(ferry_store *s)
{
    rs_fences_wait_all(&s->fences);
}

int rs_reuse_order(ferry_store *s, bool lane)
{
    return rs_fences_order(&s->fences, lane);
}

FERRY_API int ferry_model_release_after(ferry_model *m, int64_t t, uint64_t cu_stream)
{
    if (!m || t >= m->n) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    for (int64_t i = t < 0 ? 0 : t; i < (t < 0 ? m->n : t + 1) && rc == 0; i++) {
        rtensor *r = &m->t[i];
        int64_t pending = rs_fences_pending(&s->fences, r);
        char q[256];
        if (r->holds - pending <= 0) {
            rc = rs_merr(m, FERRY_E_INVAL, "tensor %s is not in use (released more often than held)",
                         RS_Q(q, r->name));
            break;
        }
        bool device = false;
        if ((rc = rs_fences_add(&s->fences, cu_stream, r, &device)) < 0) {
            if (device) rs_device_failed(s, m, rc);
            else
                rc = rs_merr(m, -ENOMEM, "ferry_model_release_after: out of memory (%zu bytes)",
                             sizeof(rs_fence));
            break;
        }
    }
    rs_reap_releases(s, false); /* a fence on a finished stream: the hold goes now */
    pthread_mutex_unlock(&s->lock);
    return rc;
}
