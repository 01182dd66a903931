/* simulate_stream.c - a "run" job of `ferry simulate`: passes over a model
 * that may not fit its budget. The model's blocks are planned
 * (ferry_model_plan: a resident set and a streaming window); then each pass
 * takes the blocks in order: a block's move is queued ahead of it
 * (ferry_model_to_device_async), it is held and waited for (the stall), it
 * "computes" for block_ms of real time while the next blocks' moves are
 * queued, and it is let go. On a sim device with a modelled copy rate the
 * copies take their real time on their own streams, so the overlap of copies
 * with compute, and the stalls, are measured rather than modelled. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "simulate.h"

/* Sleep to cli_now() == t (both CLOCK_MONOTONIC): an absolute deadline, so a
 * wake-up that comes late is not added to the next block's time too. */
static void sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0 && cli_now() < t) {
    }
}

typedef struct pass {
    ferry_ctx *ctx;
    sim_model *sm;
    job_result *r;
    ferry_op **ops; /* per block: its queued move, not yet waited */
    bool *held;     /* per block: its tensors are held */
    bool fixed_held;
} pass;

static const char *block_name(const sim_model *sm, int64_t k, char *buf, size_t n)
{
    ferry_tensor_state st = {.size = sizeof st};
    if (ferry_model_tensor_state(sm->m, sm->block_tensors[sm->block_first[k]], &st) < 0 || !st.name) return "?";
    snprintf(buf, n, "%s", st.name);
    return buf;
}

static int queue_block(pass *p, int64_t k, step_result *sr)
{
    sim_model *sm = p->sm;
    double t0 = cli_now();
    int rc = ferry_model_to_device_async(sm->m, sm->block_tensors + sm->block_first[k],
                                         sm->block_first[k + 1] - sm->block_first[k], &p->ops[k]);
    sr->queue += cli_now() - t0;
    if (rc < 0) {
        char b[256];
        sim_job_err(p->r, "run %s: moving block %" PRId64 " (%s, ...) to the device: %s", sm->name, k,
                    block_name(sm, k, b, sizeof b), sim_errmsg(p->ctx, rc));
    }
    return rc;
}

/* Hold (d = 1) or release (d = -1) tensors[0..n-1]; a hold that fails undoes the others. */
static int hold_list(pass *p, const int64_t *tensors, int64_t n, int d)
{
    for (int64_t i = 0; i < n; i++) {
        int rc = d > 0 ? ferry_model_hold(p->sm->m, tensors[i]) : ferry_model_release(p->sm->m, tensors[i]);
        if (rc < 0) {
            if (d > 0)
                while (i-- > 0) ferry_model_release(p->sm->m, tensors[i]);
            sim_job_err(p->r, "run %s: %s a tensor: %s", p->sm->name, d > 0 ? "holding" : "releasing",
                        sim_errmsg(p->ctx, rc));
            return rc;
        }
    }
    return 0;
}

static int hold_block(pass *p, int64_t k, int d)
{
    const sim_model *sm = p->sm;
    int rc = hold_list(p, sm->block_tensors + sm->block_first[k], sm->block_first[k + 1] - sm->block_first[k], d);
    if (rc == 0) p->held[k] = d > 0;
    return rc;
}

/* One pass (step s of steps): the tensors outside the blocks, then every block. */
static int run_pass(pass *p, const sim_run *run, int64_t s, step_result *sr)
{
    sim_model *sm = p->sm;
    int64_t nb = sm->nblocks;
    int rc;
    if (sm->nfixed) {
        ferry_op *op = NULL;
        double t0 = cli_now();
        rc = ferry_model_to_device_async(sm->m, sm->fixed, sm->nfixed, &op);
        double t1 = cli_now();
        sr->queue += t1 - t0;
        if (rc < 0) {
            sim_job_err(p->r, "run %s: moving the tensors outside the blocks: %s", sm->name, sim_errmsg(p->ctx, rc));
            return rc;
        }
        if ((rc = hold_list(p, sm->fixed, sm->nfixed, 1)) < 0) {
            ferry_op_wait(op);
            return rc;
        }
        p->fixed_held = true;
        rc = ferry_op_wait(op);
        sr->wait += cli_now() - t1;
        if (rc < 0) {
            sim_job_err(p->r, "run %s: moving the tensors outside the blocks: %s", sm->name, sim_errmsg(p->ctx, rc));
            return rc;
        }
    }
    for (int64_t i = 0; i < nb; i++) {
        if (!p->ops[i] && (rc = queue_block(p, i, sr)) < 0) return rc;
        if ((rc = hold_block(p, i, 1)) < 0) return rc;
        double t0 = cli_now();
        rc = ferry_op_wait(p->ops[i]);
        p->ops[i] = NULL;
        sr->wait += cli_now() - t0;
        if (rc < 0) {
            char b[256];
            sim_job_err(p->r, "run %s: block %" PRId64 " (%s, ...): %s", sm->name, i, block_name(sm, i, b, sizeof b),
                        sim_errmsg(p->ctx, rc));
            return rc;
        }
        /* the next blocks are queued before this one computes, so their copies
         * overlap its compute: the window is this block and `prefetch` in flight;
         * after the last block, the next pass's first ones (none after the last pass) */
        for (int64_t d = 1; d <= run->prefetch && d < nb; d++) {
            int64_t k = i + d;
            if (s + k / nb >= run->steps) break;
            k %= nb;
            if (!p->ops[k] && (rc = queue_block(p, k, sr)) < 0) return rc;
        }
        double c0 = cli_now();
        if (run->block_ms > 0) sleep_until(c0 + run->block_ms / 1000);
        sr->compute += cli_now() - c0;
        if ((rc = hold_block(p, i, -1)) < 0) return rc;
    }
    if (p->fixed_held) {
        p->fixed_held = false;
        if ((rc = hold_list(p, sm->fixed, sm->nfixed, -1)) < 0) return rc;
    }
    return 0;
}

void sim_run_stream(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, uint64_t budget, job_result *r)
{
    sim_job *j = &sc->jobs[ji];
    const sim_run *run = &j->run;
    sim_model *sm = &sc->models[run->model];
    run_result *rr = &r->run;
    int64_t nb = sm->nblocks;
    pass p = {ctx, sm, r, calloc((size_t)nb, sizeof *p.ops), calloc((size_t)nb, sizeof *p.held), false};
    int64_t *firsts = calloc((size_t)nb, sizeof *firsts);
    rr->steps = calloc((size_t)run->steps, sizeof *rr->steps);
    rr->streams = calloc((size_t)nb, sizeof *rr->streams);
    if (!p.ops || !p.held || !firsts || !rr->steps || !rr->streams) {
        sim_job_err(r, "run %s: out of memory", sm->name);
        goto out;
    }
    for (int64_t k = 0; k < nb; k++) firsts[k] = sm->block_tensors[sm->block_first[k]];
    ferry_plan_opts po = {.size = sizeof po,
                          .blocks = firsts,
                          .nblocks = nb,
                          .window = run->prefetch + 1,
                          .budget = budget,
                          .reserve = j->has_reserve ? j->reserve : 0,
                          .pinned_cache = run->pinned_cache ? 0 : -1};
    rr->plan.size = sizeof rr->plan;
    int rc = ferry_model_plan(sm->m, &po, &rr->plan);
    if (rc < 0) {
        sim_job_err(r, "run %s: planning %" PRId64 " blocks (window %" PRId64 "): %s", sm->name, nb, po.window,
                    sim_errmsg(ctx, rc));
        goto out;
    }
    rr->planned = true;
    for (int64_t k = 0; k < nb; k++) rr->streams[k] = ferry_model_block_streams(sm->m, k) == 1;
    for (int64_t s = 0; s < run->steps; s++) {
        step_result *sr = &rr->steps[s];
        ferry_store_stats a = {.size = sizeof a}, z = {.size = sizeof z};
        ferry_store_get_stats(store, &a);
        double t0 = cli_now();
        rc = run_pass(&p, run, s, sr);
        sr->seconds = cli_now() - t0;
        ferry_store_get_stats(store, &z);
        sr->htod = z.bytes_htod - a.bytes_htod;
        sr->dtoh = z.bytes_dtoh - a.bytes_dtoh;
        if (rc < 0) break;
        rr->nsteps++;
    }
out:
    /* every queued move is waited for once, and every hold released, whatever failed */
    for (int64_t k = 0; p.ops && k < nb; k++)
        if (p.ops[k] && (rc = ferry_op_wait(p.ops[k])) < 0 && !r->failed)
            sim_job_err(r, "run %s: a block's move: %s", sm->name, sim_errmsg(ctx, rc));
    for (int64_t k = 0; p.held && k < nb; k++)
        if (p.held[k]) hold_block(&p, k, -1);
    if (p.fixed_held) hold_list(&p, sm->fixed, sm->nfixed, -1);
    uint64_t dev = 0;
    for (int64_t t = 0; t < sm->n; t++) {
        ferry_tensor_state st = {.size = sizeof st};
        if (ferry_model_tensor_state(sm->m, t, &st) == 0 && st.tier == FERRY_TIER_DEVICE) dev += st.nbytes;
    }
    rr->device_bytes = dev;
    ferry_store_stats z = {.size = sizeof z};
    if (ferry_store_get_stats(store, &z) == 0) rr->pinned_cache_bytes = z.pinned_cache_bytes;
    free(p.ops);
    free(p.held);
    free(firsts);
}
