/* SPDX-License-Identifier: Apache-2.0 */
/* streamer.c - the streaming engine: pass after pass over a model's blocks,
 * driven by a caller that says when each block runs (ferry_streamer_*).
 *
 * It sits on the store's public calls (plan, async moves, holds, ordering
 * on the caller's stream, releases after it) and adds what a pass needs
 * around them: the order the blocks really run in, the moves queued ahead,
 * the resident set held for a whole pass, and the way back from a move
 * that found no room. That way back goes from the cheapest loss to the
 * dearest: the moves queued ahead are cancelled (and the window shrinks),
 * the store makes real room (whole free segments back to the driver, so a
 * fragmented allocator is not mistaken for a full device), then the resident
 * set shrinks a block at a time. Only when none of that is left does a
 * move fail, and then the minimum itself does not fit. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

enum { DEFAULT_PREFETCH = 2, GROW_FIRST = 2, GROW_MAX = 64 };

struct ferry_streamer {
    ferry_model *m;
    ferry_store *s;
    int64_t nb;
    int64_t *lead;   /* block k: its leader tensor (the caller's blocks[k]) */
    uint64_t *bytes; /* block k: its tensors' bytes */
    int64_t *order;  /* pass position -> block */
    int64_t *pos;    /* block -> pass position */
    bool *streams;   /* block k streams under the plan */
    ferry_op **ops;  /* block k: its queued move, not landed; the block is held */
    bool *held;      /* block k: resident, held for the whole pass */
    bool *active;    /* block k: between block_begin and block_end */
    int64_t *fixed;  /* the tensors outside every block that the passes bring (the caller's, or all) */
    int64_t nfixed;
    bool fixed_given; /* the caller listed them: the plan counts no others */
    bool fixed_held;
    int64_t *rec; /* the first pass's order so far */
    int64_t nrec;
    bool in_pass;
    int64_t prefetch_asked, prefetch;
    uint64_t budget_asked, reserve;
    uint64_t cut; /* bytes the resident set gave back (budget_asked less this) */
    bool budget_changed;
    bool shrunk; /* the window was shrunk for want of room (grows back) */
    int copies;
    bool pinned;  /* the plan keeps pinned copies */
    bool planned; /* the model has this streamer's plan */
    ferry_plan plan;
    uint64_t largest;
    int64_t clean; /* passes ended since the last shrink */
    int64_t grow_after, last_grow;
    double t0;
    uint64_t h0, r0;
    ferry_streamer_stats st;
};

static bool room_error(int rc)
{
    return rc == FERRY_E_BUDGET || rc == -ENOMEM;
}

static uint64_t asked_budget(ferry_streamer *st)
{
    if (st->budget_asked) return st->budget_asked;
    ferry_store_stats ss = {.size = sizeof ss};
    return ferry_store_get_stats(st->s, &ss) == 0 ? ss.device_budget : 0;
}

/* Whether every streamed block's clean copy fits the pinned pool now: the
 * pinned and host budgets, and the host's available memory above the spill
 * threshold (the copies this model holds already count as available). */
static bool copies_fit(ferry_streamer *st, uint64_t streamed)
{
    uint64_t avail = 0;
    if (fy_host_available(&avail, NULL, 0) < 0) return false; /* (a cgroup read: outside the lock) */
    ferry_store *s = st->s;
    pthread_mutex_lock(&s->lock);
    uint64_t other = s->pool.used - s->cache_used; /* the pool's dirty saves */
    bool ok = other + streamed <= s->o.pinned_budget && s->host_used + other + streamed <= s->o.host_budget &&
              avail + s->cache_used >= s->o.spill_below + streamed;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

/* Plan with the current order, window and budget; refresh streams[]. */
static int make_plan(ferry_streamer *st)
{
    int64_t *blocks = fy_calloc(st->s->m, (size_t)st->nb, sizeof *blocks);
    if (!blocks)
        return rs_merr(st->m, -ENOMEM, "ferry_streamer: out of memory for %" PRId64 " blocks", st->nb);
    for (int64_t p = 0; p < st->nb; p++) blocks[p] = st->lead[st->order[p]];
    uint64_t budget = 0;
    if (st->cut) {
        uint64_t a = asked_budget(st);
        budget = a > st->cut ? a - st->cut : 1;
    } else {
        budget = st->budget_asked; /* 0: the store's, re-planned when it changes */
    }
    ferry_plan_opts po = {.size = sizeof po,
                          .blocks = blocks,
                          .nblocks = st->nb,
                          .window = st->prefetch + 1,
                          .budget = budget,
                          .reserve = st->reserve,
                          .pinned_cache = -1,
                          .dry_run = 1};
    ferry_plan g = {.size = sizeof g};
    int rc = 0;
    bool pinned = st->copies == FERRY_STREAM_COPIES_PINNED;
    if (st->copies == FERRY_STREAM_COPIES_AUTO) {
        rc = rs_model_plan(st->m, &po, st->fixed_given ? st->fixed : NULL, st->fixed_given ? st->nfixed : 0,
                           &g);
        pinned = rc == 0 && copies_fit(st, g.streamed_bytes);
    }
    po.dry_run = 0;
    po.pinned_cache = pinned ? 0 : -1;
    if (rc == 0 || rc == FERRY_E_BUDGET)
        rc = rs_model_plan(st->m, &po, st->fixed_given ? st->fixed : NULL, st->fixed_given ? st->nfixed : 0,
                           &g);
    fy_free(st->s->m, blocks);
    if (rc < 0 && rc != FERRY_E_BUDGET) return rc;
    st->planned = true;
    /* (FERRY_E_BUDGET: the plan streams every block, the best effort there is) */
    st->plan = g;
    st->pinned = pinned;
    if (st->prefetch > g.window - 1) st->prefetch = g.window - 1 > 0 ? g.window - 1 : 0;
    for (int64_t p = 0; p < st->nb; p++) st->streams[st->order[p]] = ferry_model_block_streams(st->m, p) == 1;
    return rc;
}

/* The store re-plans by itself when its budget changes: take what it chose. */
static void refresh_plan(ferry_streamer *st)
{
    ferry_plan g = {.size = sizeof g};
    if (ferry_model_get_plan(st->m, &g) < 0) return;
    st->plan = g;
    if (st->prefetch > g.window - 1) st->prefetch = g.window - 1;
    for (int64_t p = 0; p < st->nb; p++) st->streams[st->order[p]] = ferry_model_block_streams(st->m, p) == 1;
}

static int fail_minimum(ferry_streamer *st, int64_t k, int rc)
{
    char what[96], msg[FY_ERRMSG_MAX];
    if (k < 0)
        snprintf(what, sizeof what, "the tensors outside the blocks (%" PRIu64 " bytes)",
                 st->plan.fixed_bytes);
    else snprintf(what, sizeof what, "block %" PRId64 " (%" PRIu64 " bytes)", k, st->bytes[k]);
    fy_err_copy(&st->m->err, msg, sizeof msg);
    ferry_store_stats ss = {.size = sizeof ss};
    (void)ferry_store_get_stats(st->s, &ss);
    uint64_t fr = 0, tot = 0;
    (void)ferry_device_mem_info(st->s->dev, &fr, &tot);
    return rs_merr(st->m, rc,
                   "streaming: no room for %s with nothing left to give back: the minimum is %" PRIu64
                   " device bytes (%" PRIu64 " outside the blocks + the largest block, %" PRIu64
                   ", + the reserve, %" PRIu64 "), the budget %" PRIu64 ", the store holds %" PRIu64
                   " on the device, which has %" PRIu64 " free of %" PRIu64 " (%s)",
                   what, st->plan.fixed_bytes + st->largest + st->reserve, st->plan.fixed_bytes, st->largest,
                   st->reserve, asked_budget(st), ss.tier_bytes[FERRY_TIER_DEVICE], fr, tot, msg);
}

/* Land a queued move of block k and drop its hold after what is queued on
 * stream (the block may have run earlier in the pass: a move ahead for the
 * next pass); stream NULL: at once. */
static int cancel(ferry_streamer *st, int64_t k, const uint64_t *stream)
{
    int rc = ferry_op_wait(st->ops[k]);
    st->ops[k] = NULL;
    int r2 = stream ? ferry_model_release_after(st->m, st->lead[k], *stream)
                    : ferry_model_release(st->m, st->lead[k]);
    return rc < 0 ? rc : r2;
}

/* One step back after a move found no room; 0 when something was given
 * back (try again), < 0 when nothing is left. *made: make_room was tried in
 * this round already. */
static int shrink(ferry_streamer *st, int64_t k, uint64_t need, bool *made, uint64_t stream)
{
    int n = 0;
    for (int64_t j = 0; j < st->nb; j++)
        if (j != k && st->ops[j] && !st->active[j]) {
            (void)cancel(st, j, &stream); /* (a failed copy leaves the block where it was: nothing lost) */
            n++;
        }
    if (n || st->prefetch > 0) {
        if (st->prefetch > 0) st->prefetch--;
        st->shrunk = true;
        st->st.shrinks++;
        st->clean = 0;
        if (n) return 0;
    }
    if (!*made) {
        *made = true;
        uint64_t could = 0;
        if (ferry_store_make_room(st->s, need, &could) >= 0) return 0;
    }
    /* the resident set gives back a block's worth, and its blocks that now
     * stream stop being held (they are the first the store evicts) once the
     * kernels queued so far ran: some of them ran earlier in this pass */
    if (st->plan.resident_blocks > 0) {
        st->cut += st->largest ? st->largest : 1;
        int rc = make_plan(st);
        if (rc < 0 && rc != FERRY_E_BUDGET) return rc;
        for (int64_t j = 0; j < st->nb; j++)
            if (st->held[j] && st->streams[j] && !st->active[j]) {
                (void)ferry_model_release_after(st->m, st->lead[j], stream);
                st->held[j] = false;
            }
        st->st.shrinks++;
        st->clean = 0;
        *made = false;
        return 0;
    }
    return -1;
}

/* Hold every tensor of list[0..n-1] (undoing on failure). */
static int hold_list(ferry_model *m, const int64_t *list, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int rc = ferry_model_hold(m, list[i]);
        if (rc < 0) {
            while (i-- > 0) (void)ferry_model_release(m, list[i]);
            return rc;
        }
    }
    return 0;
}

/* Queue block k's move and hold it. must: the block runs now, so a move that
 * finds no room shrinks the plan and tries again; else (a move ahead) it is
 * skipped. */
static int queue(ferry_streamer *st, int64_t k, bool must, uint64_t stream)
{
    bool made = false;
    for (;;) {
        ferry_op *op = NULL;
        int rc = ferry_model_to_device_async(st->m, &st->lead[k], 1, &op);
        if (rc == 0) {
            if ((rc = ferry_model_hold(st->m, st->lead[k])) < 0) {
                (void)ferry_op_wait(op);
                return rc;
            }
            st->ops[k] = op;
            return 0;
        }
        if (!room_error(rc)) return rc;
        if (!must) {
            st->st.prefetch_skipped++;
            return rc;
        }
        st->st.retries++;
        if (shrink(st, k, st->bytes[k], &made, stream) < 0) return fail_minimum(st, k, rc);
    }
}

/* Synchronous move of tensors[0..n-1] that must succeed (the tensors outside
 * the blocks, a resident block), shrinking as queue() does. */
static int bring(ferry_streamer *st, const int64_t *tensors, int64_t n, uint64_t need, int64_t k,
                 uint64_t stream)
{
    bool made = false;
    for (;;) {
        int rc = ferry_model_to_device(st->m, tensors, n);
        if (rc == 0 || !room_error(rc)) return rc;
        st->st.retries++;
        if (k >= 0 && st->streams[k]) return 0; /* a shrink made it a streamed block: it comes when it runs */
        if (shrink(st, k, need, &made, stream) < 0) return fail_minimum(st, k, rc);
    }
}

/* Queue the streamed blocks after pass position p (cyclically) until limit
 * of them are in flight; resident blocks need no move, so they are not
 * counted (several in a row would leave the copies idle). */
static void prefetch_after(ferry_streamer *st, int64_t p, int64_t limit, int64_t span, uint64_t stream)
{
    int64_t flying = 0;
    for (int64_t j = 0; j < st->nb; j++) flying += st->ops[j] && st->streams[j] && !st->active[j];
    for (int64_t j = 1; j < span && flying < limit; j++) {
        int64_t b = st->order[(p + j) % st->nb];
        if (!st->streams[b] || st->ops[b] || st->active[b]) continue;
        if (queue(st, b, false, stream) < 0) return; /* no room ahead: it comes when it runs */
        flying++;
    }
}

static void drop_pass_holds(ferry_streamer *st, bool after, uint64_t stream)
{
    for (int64_t k = 0; k < st->nb; k++)
        if (st->held[k]) {
            (void)(after ? ferry_model_release_after(st->m, st->lead[k], stream)
                         : ferry_model_release(st->m, st->lead[k]));
            st->held[k] = false;
        }
    if (st->fixed_held) {
        for (int64_t i = 0; i < st->nfixed; i++)
            (void)(after ? ferry_model_release_after(st->m, st->fixed[i], stream)
                         : ferry_model_release(st->m, st->fixed[i]));
        st->fixed_held = false;
    }
}

FERRY_API int ferry_streamer_new(ferry_model *m, const ferry_streamer_opts *opts, ferry_streamer **out)
{
    if (out) *out = NULL;
    if (!m || !opts || !out) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    ferry_streamer_opts o;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &m->err, "ferry_streamer_new"));
    if (o.nblocks < 1 || !o.blocks || o.prefetch < -1 || o.copies < FERRY_STREAM_COPIES_AUTO ||
        o.copies > FERRY_STREAM_COPIES_RING || o.nfixed < 0 || (o.nfixed && !o.fixed))
        return rs_merr(m, FERRY_E_INVAL,
                       "ferry_streamer_new: bad options (%" PRId64 " blocks, prefetch %" PRId64
                       ", copies %d)",
                       o.nblocks, o.prefetch, o.copies);
    /* the streams and events its passes' moves and fences use, made now
     * rather than inside the caller's step, where a full device may refuse
     * them (best effort: what could not be made is made when first needed) */
    (void)fy_xfer_warm(s->dev);
    int64_t nt = ferry_model_tensor_count(m);
    ferry_streamer *st = fy_calloc(s->m, 1, sizeof *st);
    size_t nb = (size_t)o.nblocks;
    if (st) {
        st->m = m, st->s = s;
        st->lead = fy_calloc(s->m, nb, sizeof *st->lead);
        st->bytes = fy_calloc(s->m, nb, sizeof *st->bytes);
        st->order = fy_calloc(s->m, nb, sizeof *st->order);
        st->pos = fy_calloc(s->m, nb, sizeof *st->pos);
        st->rec = fy_calloc(s->m, nb, sizeof *st->rec);
        st->streams = fy_calloc(s->m, nb, sizeof *st->streams);
        st->ops = fy_calloc(s->m, nb, sizeof *st->ops);
        st->held = fy_calloc(s->m, nb, sizeof *st->held);
        st->active = fy_calloc(s->m, nb, sizeof *st->active);
        st->fixed = fy_calloc(s->m, (size_t)(nt > 0 ? nt : 1), sizeof *st->fixed);
    }
    int64_t *gblock = fy_calloc(s->m, (size_t)(nt > 0 ? nt : 1), sizeof *gblock); /* group -> block + 1 */
    int rc = 0;
    if (!st || !st->lead || !st->bytes || !st->order || !st->pos || !st->rec || !st->streams || !st->ops ||
        !st->held || !st->active || !st->fixed || !gblock) {
        rc = rs_merr(m, -ENOMEM, "ferry_streamer_new: out of memory for %" PRId64 " blocks", o.nblocks);
        goto fail;
    }
    pthread_mutex_lock(&s->lock);
    for (int64_t k = 0; k < o.nblocks && rc == 0; k++) {
        int64_t t = o.blocks[k];
        if (t < 0 || t >= m->n)
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_streamer_new: block %" PRId64 ": tensor %" PRId64 " out of range (%" PRId64
                         " tensors)",
                         k, t, m->n);
        else if (gblock[m->t[t].group])
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_streamer_new: blocks %" PRId64 " and %" PRId64 " are one group: "
                         "give one tensor of each block",
                         gblock[m->t[t].group] - 1, k);
        else gblock[m->t[t].group] = k + 1;
        st->lead[k] = t, st->order[k] = k, st->pos[k] = k;
    }
    for (int64_t i = 0; i < m->n && rc == 0; i++) {
        int64_t k = gblock[m->t[i].group] - 1;
        if (k < 0 && !o.fixed) st->fixed[st->nfixed++] = i;
        else if (k >= 0) st->bytes[k] += m->t[i].nbytes;
    }
    for (int64_t j = 0; o.fixed && j < o.nfixed && rc == 0; j++) {
        int64_t t = o.fixed[j];
        if (t < 0 || t >= m->n || st->nfixed >= m->n)
            rc = rs_merr(m, FERRY_E_INVAL,
                         "ferry_streamer_new: fixed tensor %" PRId64 ": index %" PRId64
                         " out of range (%" PRId64 " tensors)",
                         j, t, m->n);
        else if (gblock[m->t[t].group])
            rc =
                rs_merr(m, FERRY_E_INVAL, "ferry_streamer_new: fixed tensor %" PRId64 " is in block %" PRId64,
                        t, gblock[m->t[t].group] - 1);
        else st->fixed[st->nfixed++] = t;
    }
    st->fixed_given = o.fixed != NULL;
    pthread_mutex_unlock(&s->lock);
    if (rc < 0) goto fail;
    st->nb = o.nblocks;
    for (int64_t k = 0; k < st->nb; k++)
        st->largest = st->bytes[k] > st->largest ? st->bytes[k] : st->largest;
    st->prefetch_asked = st->prefetch = o.prefetch == 0 ? DEFAULT_PREFETCH : o.prefetch < 0 ? 0 : o.prefetch;
    st->budget_asked = o.budget;
    st->reserve = o.reserve;
    st->copies = o.copies;
    st->grow_after = GROW_FIRST;
    st->last_grow = -1;
    if ((rc = make_plan(st)) < 0) goto fail; /* (below the minimum: FERRY_E_BUDGET, naming it) */
    fy_free(s->m, gblock);
    *out = st;
    return 0;
fail:
    fy_free(s->m, gblock);
    if (st) {
        st->nb = 0; /* nothing queued or held yet */
        ferry_streamer_free(st);
    }
    return rc;
}

FERRY_API void ferry_streamer_free(ferry_streamer *st)
{
    if (!st) return;
    ferry_store *s = st->s;
    if (st->nb) {
        for (int64_t k = 0; k < st->nb; k++) {
            if (st->ops[k]) (void)cancel(st, k, NULL);
            st->active[k] = false;
        }
        drop_pass_holds(st, false, 0);
    }
    if (st->planned) {
        ferry_plan_opts none = {.size = sizeof none};
        (void)ferry_model_plan(st->m, &none, NULL);
    }
    const ferry_allocator *mm = s->m;
    fy_free(mm, st->lead);
    fy_free(mm, st->bytes);
    fy_free(mm, st->order);
    fy_free(mm, st->pos);
    fy_free(mm, st->rec);
    fy_free(mm, st->streams);
    fy_free(mm, st->ops);
    fy_free(mm, st->held);
    fy_free(mm, st->active);
    fy_free(mm, st->fixed);
    fy_free(mm, st);
}

FERRY_API int ferry_streamer_pass_begin(ferry_streamer *st, uint64_t cu_stream)
{
    if (!st) return FERRY_E_INVAL;
    if (st->in_pass) { /* a pass not ended (its caller raised): its holds go now */
        for (int64_t k = 0; k < st->nb; k++)
            if (st->active[k]) {
                if (st->ops[k]) (void)cancel(st, k, NULL);
                st->active[k] = false;
            }
        drop_pass_holds(st, false, 0);
    }
    st->in_pass = false;
    /* grow back to what was asked after passes without a shrink */
    bool grow = (st->cut || st->shrunk) && st->clean >= st->grow_after;
    if (grow || st->budget_changed) {
        if (grow) {
            if (st->last_grow >= 0 && st->st.passes - st->last_grow <= st->grow_after + 1)
                st->grow_after = st->grow_after * 2 < GROW_MAX ? st->grow_after * 2 : GROW_MAX;
            st->last_grow = st->st.passes;
            st->cut = 0;
            st->shrunk = false;
            st->prefetch = st->prefetch_asked;
            st->st.grows++;
        }
        st->budget_changed = false;
        int rc = make_plan(st);
        if (rc < 0 && rc != FERRY_E_BUDGET) return rc;
    } else {
        refresh_plan(st);
    }
    ferry_store_stats ss = {.size = sizeof ss};
    if (ferry_store_get_stats(st->s, &ss) == 0) st->h0 = ss.bytes_htod, st->r0 = ss.bytes_read;
    st->t0 = fy_now();
    if (st->nfixed) {
        int rc = bring(st, st->fixed, st->nfixed, st->plan.fixed_bytes, -1, cu_stream);
        if (rc == 0) rc = hold_list(st->m, st->fixed, st->nfixed);
        if (rc < 0) return rc;
        st->fixed_held = true;
    }
    st->in_pass = true;
    st->nrec = 0;
    if (st->st.passes == 0) return 0; /* the first pass learns the order: every block moves when it runs */
    /* the resident blocks are held for the whole pass (their own calls then
     * do nothing); one with a move queued keeps to the move's way */
    for (int64_t p = 0; p < st->nb; p++) {
        int64_t k = st->order[p];
        if (st->streams[k] || st->ops[k]) continue;
        int rc = bring(st, &st->lead[k], 1, st->bytes[k], k, cu_stream);
        if (rc < 0) return rc;
        if (st->streams[k]) continue;
        if ((rc = ferry_model_hold(st->m, st->lead[k])) < 0) return rc;
        st->held[k] = true;
    }
    /* no block computes yet: the window has room for one more than the prefetch */
    prefetch_after(st, st->nb - 1, st->prefetch + 1, st->nb + 1, cu_stream);
    return 0;
}

FERRY_API int ferry_streamer_block_begin(ferry_streamer *st, int64_t k, uint64_t cu_stream)
{
    if (!st || k < 0 || k >= st->nb) return FERRY_E_INVAL;
    if (st->st.passes == 0 && st->in_pass && st->nrec < st->nb) st->rec[st->nrec++] = k;
    if (st->held[k]) return 0;
    if (st->active[k])
        return rs_merr(st->m, FERRY_E_INVAL, "ferry_streamer_block_begin: block %" PRId64 " runs already", k);
    if (!st->ops[k]) FY_TRY(queue(st, k, true, cu_stream));
    st->active[k] = true;
    return ferry_op_stream_wait(st->ops[k], cu_stream);
}

/* Whether the first pass has so far run the blocks in the order planned. */
static bool rec_in_order(const ferry_streamer *st)
{
    for (int64_t i = 0; i < st->nrec; i++)
        if (st->rec[i] != st->order[i]) return false;
    return true;
}

FERRY_API int ferry_streamer_block_end(ferry_streamer *st, int64_t k, uint64_t cu_stream)
{
    if (!st || k < 0 || k >= st->nb) return FERRY_E_INVAL;
    if (st->held[k]) {
        prefetch_after(st, st->pos[k], st->prefetch, st->nb, cu_stream);
        return 0;
    }
    if (!st->active[k]) return 0; /* its block_begin failed */
    st->active[k] = false;
    ferry_op *op = st->ops[k];
    st->ops[k] = NULL;
    int rc = ferry_model_release_after(st->m, st->lead[k], cu_stream);
    int r2 = ferry_op_wait(op); /* lands it (its copy was queued a block or more ago) */
    if (rc == 0) rc = r2;
    if (st->st.passes == 0 && !rec_in_order(st))
        return rc; /* no guessing the next block until the order is known */
    prefetch_after(st, st->pos[k], st->prefetch, st->nb, cu_stream);
    return rc;
}

FERRY_API int ferry_streamer_pass_end(ferry_streamer *st, uint64_t cu_stream)
{
    if (!st) return FERRY_E_INVAL;
    if (!st->in_pass) return 0;
    st->in_pass = false;
    for (int64_t k = 0; k < st->nb; k++)
        if (st->active[k]) { /* a block whose block_end never came */
            st->active[k] = false;
            (void)ferry_model_release_after(st->m, st->lead[k], cu_stream);
            if (st->ops[k]) (void)ferry_op_wait(st->ops[k]);
            st->ops[k] = NULL;
        }
    drop_pass_holds(st, true, cu_stream);
    int rc = 0;
    if (st->st.passes == 0 && st->nrec && !rec_in_order(st)) {
        /* the order the blocks ran in, then any that did not run, as before */
        bool *seen = fy_calloc(st->s->m, (size_t)st->nb, sizeof *seen);
        int64_t *order = fy_calloc(st->s->m, (size_t)st->nb, sizeof *order);
        if (seen && order) {
            int64_t n = 0;
            for (int64_t i = 0; i < st->nrec; i++)
                if (!seen[st->rec[i]]) seen[st->rec[i]] = true, order[n++] = st->rec[i];
            for (int64_t p = 0; p < st->nb; p++)
                if (!seen[st->order[p]]) order[n++] = st->order[p];
            memcpy(st->order, order, (size_t)st->nb * sizeof *order);
            for (int64_t p = 0; p < st->nb; p++) st->pos[st->order[p]] = p;
            rc = make_plan(st);
            if (rc == FERRY_E_BUDGET) rc = 0; /* (the next pass shrinks as it needs) */
        }
        fy_free(st->s->m, seen);
        fy_free(st->s->m, order);
    }
    ferry_store_stats ss = {.size = sizeof ss};
    if (ferry_store_get_stats(st->s, &ss) == 0) {
        st->st.pass_htod = ss.bytes_htod - st->h0;
        st->st.pass_read = ss.bytes_read - st->r0;
    }
    st->st.pass_seconds = fy_now() - st->t0;
    st->st.passes++;
    st->clean++;
    return rc;
}

FERRY_API int ferry_streamer_drain(ferry_streamer *st)
{
    if (!st) return FERRY_E_INVAL;
    int rc = 0;
    for (int64_t k = 0; k < st->nb; k++)
        if (st->ops[k] && !st->active[k]) {
            int r = cancel(st, k, NULL);
            if (rc == 0) rc = r;
        }
    return rc;
}

FERRY_API int ferry_streamer_set_budget(ferry_streamer *st, uint64_t budget, uint64_t reserve)
{
    if (!st) return FERRY_E_INVAL;
    uint64_t b = budget ? budget : 0;
    uint64_t eff = b ? b : asked_budget(st);
    uint64_t min = st->plan.fixed_bytes + st->largest + reserve;
    if (eff < min) {
        return rs_merr(st->m, FERRY_E_BUDGET,
                       "streaming: a budget of %" PRIu64
                       " device bytes is below the minimum, at least %" PRIu64 " (%" PRIu64
                       " outside the blocks + the largest block, %" PRIu64 ", + the reserve, %" PRIu64 ")",
                       eff, min, st->plan.fixed_bytes, st->largest, reserve);
    }
    st->budget_asked = b;
    st->reserve = reserve;
    st->cut = 0;
    st->shrunk = false;
    st->prefetch = st->prefetch_asked; /* (make_plan takes it down to what the window holds) */
    if (st->in_pass) {
        st->budget_changed = true;
        return 0;
    }
    int rc = make_plan(st);
    return rc == FERRY_E_BUDGET ? 0 : rc;
}

FERRY_API int64_t ferry_streamer_block_position(ferry_streamer *st, int64_t k)
{
    if (!st || k < 0 || k >= st->nb) return FERRY_E_INVAL;
    return st->pos[k];
}

FERRY_API int ferry_streamer_block_streams(ferry_streamer *st, int64_t k)
{
    if (!st || k < 0 || k >= st->nb) return FERRY_E_INVAL;
    return st->streams[k];
}

FERRY_API int ferry_streamer_get_stats(ferry_streamer *st, ferry_streamer_stats *out)
{
    if (!st || !out || out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    ferry_streamer_stats r = st->st;
    r.size = sizeof r;
    r.blocks = st->nb;
    r.resident_blocks = st->plan.resident_blocks;
    r.streamed_blocks = st->plan.streamed_blocks;
    r.prefetch = st->prefetch;
    r.prefetch_asked = st->prefetch_asked;
    r.budget_asked = asked_budget(st);
    r.budget = r.budget_asked > st->cut ? r.budget_asked - st->cut : 0;
    r.minimum_bytes = st->plan.fixed_bytes + st->largest + st->reserve;
    r.fixed_bytes = st->plan.fixed_bytes;
    r.resident_bytes = st->plan.resident_bytes;
    r.window_bytes = st->plan.window_bytes;
    r.streamed_bytes = st->plan.streamed_bytes;
    r.pinned_copies = st->pinned && st->plan.streamed_blocks > 0;
    return fy_struct_out(out, &r, sizeof r);
}
