/* SPDX-License-Identifier: Apache-2.0 */
/* releases.c - holds dropped once a caller's stream is done with a tensor
 * (ferry_model_release_after), and the fences of released memory that the
 * next writes into it are ordered after (rs_reuse_order). A resource under
 * the moves (fetch.c), the eviction (evict.c) and the device arena
 * (blocks.c), which wait for these fences before reusing memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* A pending "release after stream": the hold of tensor t drops once f is done. */
struct rs_release {
    struct rs_release *next;
    rtensor *t;       /* NULL once deferred (in s->reuse) */
    fy_xfer_fence *f;
    bool laned;       /* in s->reuse: the lane waits for it already */
};

/* Free the entries of a release list whose fences are done (wait: after
 * waiting for each), dropping the hold of each that still has one (those of
 * s->releases; a deferred one's went already). Returns the holds dropped. */
static int64_t reap_list(ferry_store *s, struct rs_release **head, bool wait)
{
    int64_t dropped = 0;
    for (struct rs_release **p = head; *p;) {
        struct rs_release *r = *p;
        int q = fy_xfer_fence_query(r->f);
        if (q == 0 && wait) {
            q = fy_xfer_fence_wait(r->f) < 0 ? -1 : 1;
            s->c.fence_waits++;
        }
        if (q == 0) {
            p = &r->next;
            continue;
        }
        /* done, or the fence failed: a failed event says nothing more will
         * come of it, so the hold goes either way rather than forever */
        if (r->t) {
            if (r->t->holds > 0) r->t->holds--;
            dropped++;
        }
        *p = r->next;
        fy_xfer_fence_free(r->f);
        fy_free(s->m, r);
    }
    return dropped;
}

int64_t rs_reap_releases(ferry_store *s, bool wait)
{
    int64_t dropped = reap_list(s, &s->releases, wait);
    if (s->reuse) reap_list(s, &s->reuse, false);
    return dropped;
}

int64_t rs_defer_releases(ferry_store *s)
{
    int64_t n = 0;
    for (struct rs_release **p = &s->releases; *p;) {
        struct rs_release *r = *p;
        rtensor *t = r->t;
        /* the whole group: a hold of one member keeps all of them (the
         * PyTorch hooks hold a block by its leader), and evicting a dirty
         * one reads it back */
        const ferry_model *om = t->owner;
        bool clean = true;
        for (int64_t j = om->gat[t->group]; j < om->gat[t->group] + om->gcnt[t->group] && clean; j++) {
            const rtensor *u = &om->t[om->gmem[j]];
            if (u->dirty || u->moving || u->tier != FERRY_TIER_DEVICE) clean = false;
        }
        if (!clean) {
            p = &r->next;
            continue;
        }
        if (t->holds > 0) t->holds--;
        *p = r->next;
        r->t = NULL;
        r->laned = false;
        r->next = s->reuse;
        s->reuse = r;
        n++;
    }
    return n;
}

void rs_reuse_wait_all(ferry_store *s) { reap_list(s, &s->reuse, true); }

int rs_reuse_order(ferry_store *s, bool lane)
{
    reap_list(s, &s->reuse, !lane);
    for (struct rs_release *r = s->reuse; r && lane; r = r->next) {
        if (r->laned) continue;
        int rc = fy_xfer_lane_wait(s->dev, r->f);
        if (rc < 0) { /* the host waits instead */
            reap_list(s, &s->reuse, true);
            return rc;
        }
        r->laned = true;
        s->c.fence_orders++;
    }
    return 0;
}

FERRY_API int ferry_model_release_after(ferry_model *m, int64_t t, uint64_t cu_stream)
{
    if (!m || t >= m->n) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    for (int64_t i = t < 0 ? 0 : t; i < (t < 0 ? m->n : t + 1) && rc == 0; i++) {
        rtensor *r = &m->t[i];
        int64_t pending = 0;
        for (struct rs_release *x = s->releases; x; x = x->next) pending += x->t == r;
        char q[256];
        if (r->holds - pending <= 0) {
            rc = rs_merr(m, FERRY_E_INVAL, "tensor %s is not in use (released more often than held)", RS_Q(q, r->name));
            break;
        }
        struct rs_release *x = fy_calloc(s->m, 1, sizeof *x);
        if (!x) {
            rc = rs_merr(m, -ENOMEM, "ferry_model_release_after: out of memory (%zu bytes)", sizeof *x);
            break;
        }
        if ((rc = fy_xfer_fence_new(s->dev, cu_stream, &x->f)) < 0) {
            fy_free(s->m, x);
            rs_device_failed(s, m, rc);
            break;
        }
        x->t = r;
        x->next = s->releases;
        s->releases = x;
    }
    rs_reap_releases(s, false); /* a fence on a finished stream: the hold goes now */
    pthread_mutex_unlock(&s->lock);
    return rc;
}
