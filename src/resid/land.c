/* SPDX-License-Identifier: Apache-2.0 */
/* land.c - landing a queued move: waiting for its copies with the lock
 * dropped, then committing the tensors' new tiers (or rolling them back,
 * nothing lost) under it; and waiting for the marks that keep a tensor's
 * copies in place (moving, evicting, busy) to clear. Below fetch.c (which
 * queues the moves), evict.c and the API files that touch tensors. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

void rs_op_fail(ferry_op *op, ferry_store *s, int rc)
{
    if (op->rc < 0 || rc >= 0) return;
    op->rc = rc;
    snprintf(op->msg, sizeof op->msg, "%s", ferry_device_errmsg(s->dev));
}

/* Commit (rc == 0: the device copies are the ones now) or roll back (the
 * tensors stay where they were; nothing was lost: their old copies were kept). */
static void op_commit(ferry_store *s, ferry_op *op)
{
    ferry_model *m = op->m;
    if (op->rc == 0) rs_spill_hold(s->spill); /* freed ranges stay for the next spill (see below) */
    for (int64_t k = 0; k < op->nt; k++) {
        rtensor *t = &m->t[op->ti[k]];
        if (t->moving != op) continue;
        t->moving = NULL;
        if (op->rc < 0) {
            if (t->dptr) rs_dev_free(s, t);
            if (t->caching) { /* the cache copy it was filling goes (the tensor stays in SOURCE) */
                rs_cache_buffer_free(s, t);
                t->caching = false;
            }
            continue;
        }
        if (t->nbytes == 0) t->dptr = 0;
        /* (a dirty tensor's saved copy is not kept as a cache: the caller may
         * change it in place again without marking it, as ferry.h allows) */
        if (t->caching) { /* its pinned copy stays beside the device copy, unless a re-plan
                             made the block resident meanwhile */
            t->caching = false;
            if (rs_wants_cache(m, t)) t->cached = true;
            else rs_cache_buffer_free(s, t);
        } else if (!t->cached) {
            rs_release_copy(s, t); /* the device copy is now the one */
        } else if (!rs_wants_cache(m, t)) {
            rs_uncache(s, t); /* its cache was switched off (or its block made resident) while it moved */
        }
        t->tier = FERRY_TIER_DEVICE;
    }
    if (op->rc < 0) {
        rs_merr(m, op->rc, "%s", op->msg);
        return;
    }
    s->c.htod += op->moved;
    s->c.read += op->read;
    s->c.s_htod += fy_now() - op->t0;
}

/* Land a QUEUED op now: one thread waits for its copies (lock dropped), then
 * commits. Only its owner frees it, and not before it is LANDED. */
static void land_now(ferry_store *s, ferry_op *op)
{
    op->state = OP_LANDING;
    fy_xfer_op *x = op->xop;
    op->xop = NULL; /* fy_xfer_op_wait frees it: nobody may look at it meanwhile */
    if (x) {
        pthread_mutex_unlock(&s->lock);
        int rc = fy_xfer_op_wait(x);
        pthread_mutex_lock(&s->lock);
        if (rc < 0) rs_op_fail(op, s, rc);
    }
    op_commit(s, op);
    op->state = OP_LANDED;
    pthread_cond_broadcast(&s->landed);
}

/* The owner's landing (ferry_op_wait, the store's free): op stays valid. */
void rs_op_land(ferry_store *s, ferry_op *op)
{
    while (op->state == OP_MOVING || op->state == OP_LANDING) pthread_cond_wait(&s->landed, &s->lock);
    if (op->state == OP_QUEUED) land_now(s, op);
}

void rs_land_moving(ferry_store *s, ferry_model *m, const int64_t *ti, int64_t nt)
{
    /* Another thread's op may be freed by its owner the moment it has landed,
     * so after any wait only the tensors are looked at again, never the op;
     * and landing drops the lock, so meanwhile another move may have been
     * queued: start over until one pass finds none. */
    for (bool again = true; again;) {
        again = false;
        for (int64_t k = 0; k < nt && !again; k++) {
            ferry_op *op = m->t[ti[k]].moving;
            if (!op) continue;
            if (op->state == OP_QUEUED) land_now(s, op);
            else pthread_cond_wait(&s->landed, &s->lock); /* being moved or landed by someone else */
            again = true;
        }
    }
}

void rs_settle(ferry_store *s, ferry_model *m, const int64_t *ti, int64_t nt, bool readers)
{
    for (bool again = true; again;) {
        if (ti) rs_land_moving(s, m, ti, nt);
        again = false;
        for (int64_t k = 0; k < (ti ? nt : m->n) && !again; k++) {
            const rtensor *t = &m->t[ti ? ti[k] : k];
            again = t->evicting || (readers && t->busy);
        }
        if (again)
            pthread_cond_wait(&s->landed, &s->lock); /* (broadcast when an eviction commits, a read ends) */
    }
}

void rs_op_free(ferry_store *s, ferry_op *op)
{
    for (ferry_op **p = &s->ops; *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            break;
        }
    fy_free(s->m, op->ti);
    fy_free(s->m, op);
}
