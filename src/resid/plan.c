/* SPDX-License-Identifier: Apache-2.0 */
/* plan.c - running a model larger than its budget: the plan (which blocks
 * stay resident, which stream through the window), re-planning when the
 * budget changes, and the clean pinned copies kept of streamed blocks.
 *
 * The plan is a choice of marks, nothing more: each tensor of a streamed
 * block has streams set, and eviction (evict.c) takes a model's streamed
 * blocks before its other groups and spares the rest while it can. So the
 * resident set is stable because nothing else is ever chosen while the
 * window can make the room, and a cyclic pass moves exactly the streamed
 * blocks. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

enum { DEFAULT_WINDOW = 3 };

static int cmp_u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* Streamed blocks spread evenly over the pass: block k streams when the
 * count of streamed blocks up to it steps (a line drawn from 0 to S). */
static bool spread(int64_t k, int64_t S, int64_t N)
{
    return (k + 1) * S / N != k * S / N;
}

/* Choose p's resident set for m under the store's state; mark the tensors.
 * On FERRY_E_BUDGET every block is marked streamed (the best effort that
 * still moves everything) and the message says why. */
static int plan_compute(ferry_store *s, ferry_model *m, rs_plan *p, bool mark)
{
    int64_t N = p->nblocks;
    uint64_t *bb = fy_calloc(s->m, (size_t)N, sizeof *bb);
    uint64_t *sorted = fy_calloc(s->m, (size_t)N, sizeof *sorted);
    int64_t *gblock = fy_calloc(s->m, (size_t)m->n, sizeof *gblock); /* group id -> block, or -1 */
    int rc = 0;
    if (!bb || !sorted || !gblock) {
        rc = rs_merr(m, -ENOMEM, "ferry_model_plan: out of memory for %" PRId64 " blocks", N);
        goto out;
    }
    for (int64_t i = 0; i < m->n; i++) gblock[i] = -1;
    for (int64_t k = 0; k < N; k++) gblock[p->blocks[k]] = k;
    uint64_t total = 0, fixed = 0;
    for (int64_t i = 0; i < m->n; i++) {
        int64_t k = gblock[m->t[i].group];
        if (k < 0 && p->counted && !p->counted[i]) continue; /* never brought by the passes */
        total += m->t[i].nbytes;
        if (k < 0) fixed += m->t[i].nbytes;
        else bb[k] += m->t[i].nbytes;
    }
    uint64_t blocks = total - fixed;
    uint64_t budget = p->budget ? p->budget : s->o.device_budget;
    uint64_t avail = budget > p->reserve ? budget - p->reserve : 0;
    uint64_t largest = 0;
    for (int64_t k = 0; k < N; k++) largest = bb[k] > largest ? bb[k] : largest;
    ferry_plan g = {.size = sizeof g,
                    .blocks = N,
                    .fixed_bytes = fixed,
                    .budget = avail,
                    .window = p->window < N ? p->window : N,
                    .minimum_bytes = fixed + largest + p->reserve};
    for (int64_t k = 0; k < N; k++) p->streams[k] = false;
    if (fixed + blocks <= avail) { /* it fits: everything resident */
        g.resident_blocks = N;
        g.resident_bytes = total;
    } else {
        memcpy(sorted, bb, (size_t)N * sizeof *bb);
        qsort(sorted, (size_t)N, sizeof *sorted, cmp_u64_desc);
        /* the window asked for, or as many of the largest blocks as fit: a
         * tight budget streams through a smaller window rather than failing,
         * down to one block (the one computing) */
        int64_t w = p->window < N ? p->window : N;
        uint64_t window = 0;
        for (int64_t k = 0; k < w; k++) window += sorted[k];
        while (w > 1 && fixed + window > avail) window -= sorted[--w];
        g.window = w;
        if (fixed + window > avail) {
            for (int64_t k = 0; k < N; k++) p->streams[k] = true;
            g.streamed_blocks = N;
            g.resident_bytes = fixed;
            g.window_bytes = window;
            g.streamed_bytes = blocks;
            rc = rs_merr(m, FERRY_E_BUDGET,
                         "streaming needs at least %" PRIu64 " device bytes (%" PRIu64
                         " outside the blocks + the largest"
                         " block, %" PRIu64 ", + the reserve, %" PRIu64 ") but the budget is %" PRIu64,
                         fixed + window + p->reserve, fixed, window, p->reserve, budget);
        } else {
            uint64_t room = avail - fixed - window; /* for resident blocks */
            int64_t K = (int64_t)(room / (blocks / (uint64_t)N ? blocks / (uint64_t)N : 1));
            if (K > N - 1) K = N - 1; /* it does not fit whole: one block streams at least */
            for (;; K--) {
                uint64_t res = 0;
                for (int64_t k = 0; k < N; k++)
                    if (!spread(k, N - K, N)) res += bb[k];
                if (res <= room || K == 0) break;
            }
            for (int64_t k = 0; k < N; k++) {
                p->streams[k] = spread(k, N - K, N);
                if (p->streams[k]) g.streamed_bytes += bb[k], g.streamed_blocks++;
                else g.resident_bytes += bb[k], g.resident_blocks++;
            }
            g.resident_bytes += fixed;
            g.window_bytes = window;
        }
    }
    for (int64_t i = 0; i < m->n && mark; i++) {
        rtensor *t = &m->t[i];
        int64_t k = gblock[t->group];
        t->streams = k >= 0 && p->streams[k];
        /* a block that stays resident now needs no pinned copy beside it */
        if (!rs_wants_cache(m, t) && t->cached && t->tier == FERRY_TIER_DEVICE && !t->moving)
            rs_uncache(s, t);
    }
    if (mark) rs_dev_reindex(m); /* groups change lists with their streams flags */
    p->got = g;
out:
    fy_free(s->m, bb);
    fy_free(s->m, sorted);
    fy_free(s->m, gblock);
    return rc;
}

void rs_plan_free(ferry_store *s, ferry_model *m)
{
    if (!m->plan) return;
    fy_free(s->m, m->plan->blocks);
    fy_free(s->m, m->plan->streams);
    fy_free(s->m, m->plan->counted);
    fy_free(s->m, m->plan);
    m->plan = NULL;
    for (int64_t i = 0; i < m->n; i++) m->t[i].streams = false;
    rs_dev_reindex(m);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

FERRY_API int ferry_model_plan(ferry_model *m, const ferry_plan_opts *opts, ferry_plan *out)
{
    return rs_model_plan(m, opts, NULL, 0, out);
}

int rs_model_plan(ferry_model *m, const ferry_plan_opts *opts, const int64_t *fixed, int64_t nfixed,
                  ferry_plan *out)
{
    if (!m || !opts || nfixed < 0 || (nfixed && !fixed)) return FERRY_E_INVAL;
    if (out && out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    ferry_plan_opts o;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &m->err, "ferry_model_plan"));
    if (o.nblocks < 0 || (o.nblocks && !o.blocks) || o.window < 0)
        return rs_merr(m, FERRY_E_INVAL,
                       "ferry_model_plan: bad block list (%" PRId64 " blocks, window %" PRId64 ")", o.nblocks,
                       o.window);
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    rs_plan *p = NULL;
    int64_t *chk = NULL;
    if (o.nblocks == 0) {
        rs_plan_free(s, m);
        goto out;
    }
    p = fy_calloc(s->m, 1, sizeof *p);
    chk = fy_calloc(s->m, (size_t)o.nblocks, sizeof *chk);
    if (p) p->blocks = fy_calloc(s->m, (size_t)o.nblocks, sizeof *p->blocks);
    if (p) p->streams = fy_calloc(s->m, (size_t)o.nblocks, sizeof *p->streams);
    if (p && fixed) p->counted = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *p->counted);
    if (!p || !chk || !p->blocks || !p->streams || (fixed && !p->counted)) {
        rc = rs_merr(m, -ENOMEM, "ferry_model_plan: out of memory for %" PRId64 " blocks", o.nblocks);
        goto out;
    }
    for (int64_t k = 0; k < o.nblocks; k++) {
        if (o.blocks[k] < 0 || o.blocks[k] >= m->n) {
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_model_plan: block %" PRId64 ": tensor index %" PRId64
                         " out of range (%" PRId64 " tensors)",
                         k, o.blocks[k], m->n);
            goto out;
        }
        p->blocks[k] = chk[k] = m->t[o.blocks[k]].group;
    }
    qsort(chk, (size_t)o.nblocks, sizeof *chk, cmp_i64);
    for (int64_t k = 1; k < o.nblocks; k++)
        if (chk[k] == chk[k - 1]) {
            char q[256];
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_model_plan: two blocks are one group (that of tensor %s): "
                         "give one tensor of each block",
                         RS_Q(q, m->t[chk[k]].name));
            goto out;
        }
    for (int64_t k = 0; k < nfixed; k++) {
        if (fixed[k] < 0 || fixed[k] >= m->n) {
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_model_plan: fixed tensor %" PRId64 ": index %" PRId64
                         " out of range (%" PRId64 " tensors)",
                         k, fixed[k], m->n);
            goto out;
        }
        p->counted[fixed[k]] = true;
    }
    p->nblocks = o.nblocks;
    p->window = o.window ? o.window : DEFAULT_WINDOW;
    p->budget = o.budget;
    p->reserve = o.reserve;
    p->pinned_cache = o.pinned_cache >= 0;
    if (o.dry_run) { /* the plan it would be, for the caller to weigh: p is freed below */
        rc = plan_compute(s, m, p, false);
        if (out) fy_struct_out(out, &p->got, sizeof p->got);
        goto out;
    }
    rs_plan_free(s, m);
    m->plan = p;
    rc = plan_compute(s, m, p, true);
    if (out) fy_struct_out(out, &p->got, sizeof p->got);
    p = NULL;
out:
    if (p) {
        fy_free(s->m, p->blocks);
        fy_free(s->m, p->streams);
        fy_free(s->m, p->counted);
        fy_free(s->m, p);
    }
    fy_free(s->m, chk);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_model_get_plan(ferry_model *m, ferry_plan *out)
{
    if (!m || !out || out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    int rc = m->plan ? fy_struct_out(out, &m->plan->got, sizeof m->plan->got)
                     : rs_merr(m, FERRY_E_NOTFOUND, "no plan (ferry_model_plan was not called)");
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

FERRY_API int ferry_model_block_streams(ferry_model *m, int64_t k)
{
    if (!m) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    int rc = !m->plan ? rs_merr(m, FERRY_E_NOTFOUND, "no plan (ferry_model_plan was not called)")
             : k < 0 || k >= m->plan->nblocks
                 ? rs_merr(m, FERRY_E_INVAL, "block %" PRId64 " out of range (%" PRId64 " planned)", k,
                           m->plan->nblocks)
                 : m->plan->streams[k];
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

void rs_replan(ferry_store *s)
{
    for (int i = 0; i < s->nmodels; i++) {
        ferry_model *m = s->models[i];
        if (m->plan && m->plan->budget == 0)
            (void)plan_compute(s, m, m->plan, true); /* a failure keeps its message */
    }
}

FERRY_API int ferry_store_set_device_budget(ferry_store *s, uint64_t bytes)
{
    if (!s) return FERRY_E_INVAL;
    if (!bytes)
        return fy_seterr(&s->err, FERRY_E_INVAL, "ferry_store_set_device_budget: a budget of 0 bytes");
    pthread_mutex_lock(&s->lock);
    bool shrank = bytes < s->o.device_budget;
    s->o.device_budget = bytes;
    s->arena.budget = bytes;
    rs_replan(s);
    int rc = 0;
    if (shrank) {
        fy_xfer_bind(s->dev);
        rc = rs_fit_budget(s);
        /* the room is the caller's now, not the store's to reuse: whole free
         * segments go back, and where the tensors left sit scattered over
         * segments, more leave until the store holds at most 1/16 past the
         * budget (the allocator's own bound) */
        if (rc == 0) rs_hold_at_most(s, bytes + bytes / 16);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}
