/* SPDX-License-Identifier: Apache-2.0 */
/* simulate_stream.c - a "run" job of `ferry simulate`: passes over a model
 * that may not fit its budget, driven through the library's streaming engine
 * (ferry_streamer_*), as a framework's hooks drive it: each pass begins,
 * each block begins (its move was queued ahead; the host waits for it on the
 * sim's caller stream: the stall), "computes" for block_ms of real time, and
 * ends (released; the next blocks are queued ahead). On a sim device with a
 * modelled copy rate the copies take their real time on their own streams,
 * so the overlap of copies with compute, and the stalls, are measured rather
 * than modelled. */
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
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0 && cli_now() < t) {}
}

static const char *block_name(const sim_model *sm, int64_t k, char *buf, size_t n)
{
    ferry_tensor_state st = {.size = sizeof st};
    if (ferry_model_tensor_state(sm->m, sm->block_tensors[sm->block_first[k]], &st) < 0 || !st.name)
        return "?";
    snprintf(buf, n, "%s", st.name);
    return buf;
}

/* A block's call failed: say which block, end the pass (its holds go), rc. */
static int block_failed(ferry_ctx *ctx, ferry_streamer *st, const sim_model *sm, int64_t k, const char *when,
                        int rc, job_result *r)
{
    char b[256];
    sim_job_err(r, "run %s: %s %" PRId64 " (%s, ...): %s", sm->name, when, k, block_name(sm, k, b, sizeof b),
                sim_errmsg(ctx, rc));
    (void)ferry_streamer_pass_end(st, 0);
    return rc;
}

/* One pass (step s): begin, every block in order, end. */
static int run_pass(ferry_ctx *ctx, ferry_streamer *st, const sim_model *sm, const sim_run *run,
                    step_result *sr, job_result *r)
{
    double t0 = cli_now();
    int rc = ferry_streamer_pass_begin(st, 0);
    sr->queue += cli_now() - t0;
    if (rc < 0) {
        sim_job_err(r, "run %s: starting a pass: %s", sm->name, sim_errmsg(ctx, rc));
        return rc;
    }
    for (int64_t k = 0; k < sm->nblocks; k++) {
        double w0 = cli_now();
        rc = ferry_streamer_block_begin(st, k, 0);
        sr->wait += cli_now() - w0;
        if (rc < 0) return block_failed(ctx, st, sm, k, "block", rc, r);
        double c0 = cli_now();
        if (run->block_ms > 0) sleep_until(c0 + run->block_ms / 1000);
        sr->compute += cli_now() - c0;
        double q0 = cli_now();
        rc = ferry_streamer_block_end(st, k, 0);
        sr->queue += cli_now() - q0;
        if (rc < 0) return block_failed(ctx, st, sm, k, "after block", rc, r);
    }
    if ((rc = ferry_streamer_pass_end(st, 0)) < 0)
        sim_job_err(r, "run %s: ending a pass: %s", sm->name, sim_errmsg(ctx, rc));
    return rc;
}

void sim_run_stream(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, uint64_t budget, job_result *r)
{
    sim_job *j = &sc->jobs[ji];
    const sim_run *run = &j->run;
    sim_model *sm = &sc->models[run->model];
    run_result *rr = &r->run;
    int64_t nb = sm->nblocks;
    ferry_streamer *st = NULL;
    int64_t *firsts = calloc((size_t)nb, sizeof *firsts);
    rr->steps = calloc((size_t)run->steps, sizeof *rr->steps);
    rr->streams = calloc((size_t)nb, sizeof *rr->streams);
    if (!firsts || !rr->steps || !rr->streams) {
        sim_job_err(r, "run %s: out of memory", sm->name);
        goto out;
    }
    for (int64_t k = 0; k < nb; k++) firsts[k] = sm->block_tensors[sm->block_first[k]];
    ferry_streamer_opts so = {.size = sizeof so,
                              .blocks = firsts,
                              .nblocks = nb,
                              .prefetch = run->prefetch ? run->prefetch : -1,
                              .budget = budget,
                              .reserve = j->has_reserve ? j->reserve : 0,
                              .copies =
                                  run->pinned_cache ? FERRY_STREAM_COPIES_PINNED : FERRY_STREAM_COPIES_RING};
    int rc = ferry_streamer_new(sm->m, &so, &st);
    if (rc < 0) {
        sim_job_err(r, "run %s: planning %" PRId64 " blocks (prefetch %" PRId64 "): %s", sm->name, nb,
                    run->prefetch, sim_errmsg(ctx, rc));
        goto out;
    }
    for (int64_t s = 0; s < run->steps; s++) {
        step_result *sr = &rr->steps[s];
        ferry_store_stats a = {.size = sizeof a}, z = {.size = sizeof z};
        ferry_store_get_stats(store, &a);
        double t0 = cli_now();
        rc = run_pass(ctx, st, sm, run, sr, r);
        sr->seconds = cli_now() - t0;
        ferry_store_get_stats(store, &z);
        sr->htod = z.bytes_htod - a.bytes_htod;
        sr->dtoh = z.bytes_dtoh - a.bytes_dtoh;
        if (rc < 0) break;
        rr->nsteps++;
    }
    /* the plan as the passes left it (after any shrinking) */
    ferry_streamer_stats ss = {.size = sizeof ss};
    if (ferry_streamer_get_stats(st, &ss) == 0) {
        rr->planned = true;
        rr->plan = (ferry_plan){.size = sizeof rr->plan,
                                .blocks = ss.blocks,
                                .resident_blocks = ss.resident_blocks,
                                .streamed_blocks = ss.streamed_blocks,
                                .fixed_bytes = ss.fixed_bytes,
                                .resident_bytes = ss.resident_bytes,
                                .window_bytes = ss.window_bytes,
                                .streamed_bytes = ss.streamed_bytes,
                                .budget = ss.budget,
                                .window = ss.prefetch + 1,
                                .minimum_bytes = ss.minimum_bytes};
        rr->shrinks = ss.shrinks;
        rr->grows = ss.grows;
        rr->retries = ss.retries;
        rr->prefetch_now = ss.prefetch;
        for (int64_t k = 0; k < nb; k++) rr->streams[k] = ferry_streamer_block_streams(st, k) == 1;
    }
out:
    ferry_streamer_free(st); /* every queued move landed, every hold released, whatever failed */
    uint64_t dev = 0;
    for (int64_t t = 0; t < sm->n; t++) {
        ferry_tensor_state ts = {.size = sizeof ts};
        if (ferry_model_tensor_state(sm->m, t, &ts) == 0 && ts.tier == FERRY_TIER_DEVICE) dev += ts.nbytes;
    }
    rr->device_bytes = dev;
    ferry_store_stats z = {.size = sizeof z};
    if (ferry_store_get_stats(store, &z) == 0) rr->pinned_cache_bytes = z.pinned_cache_bytes;
    free(firsts);
}
