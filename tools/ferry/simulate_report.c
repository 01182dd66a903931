/* SPDX-License-Identifier: Apache-2.0 */
/* simulate_report.c - `ferry simulate`'s messages and report: the one-line
 * errors of the scenario file and of a job (used by every simulate_ file,
 * so they sit here, below all of them), then a line of text per job and
 * one for the store's totals, or the same as one JSON object per line
 * (--json). */
#include <inttypes.h>
#include <stdarg.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "simulate.h"

/* ---- messages ---- */

int sim_scen_err(const scenario *sc, const char *key, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ferry simulate: %s: ", sc->path);
    if (key && *key) fprintf(stderr, "%s: ", key);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

void sim_job_err(job_result *r, const char *fmt, ...)
{
    size_t l = strlen(r->err);
    if (l && l + 2 < sizeof r->err) {
        memcpy(r->err + l, "; ", 3);
        l += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + l, sizeof r->err - l, fmt, ap);
    va_end(ap);
    r->failed = true;
}

const char *sim_errmsg(ferry_ctx *ctx, int64_t rc)
{
    const char *m = ferry_ctx_errmsg(ctx);
    return m && *m ? m : ferry_strerror((int)rc);
}

/* ---- the report ---- */

static json_t *jrange(const ferry_mem_range *m)
{
    return json_pack("{s:I,s:I,s:I}", "start", (json_int_t)m->start, "end", (json_int_t)m->end, "peak",
                     (json_int_t)m->peak);
}

static void model_tiers(sim_model *sm, uint64_t *tb)
{
    memset(tb, 0, FERRY_TIER_COUNT * sizeof *tb);
    for (int64_t t = 0; t < sm->n; t++) {
        ferry_tensor_state st = {.size = sizeof st};
        if (ferry_model_tensor_state(sm->m, t, &st) == 0 && (unsigned)st.tier < FERRY_TIER_COUNT)
            tb[st.tier] += st.nbytes;
    }
}

/* A run's figures derived from its passes: the first pass apart (it reads
 * the checkpoint and fills the pinned cache), the rest averaged. */
typedef struct run_figs {
    int64_t nsteady;
    step_result steady;     /* means over passes 2.. */
    double predicted;       /* their median wall time: a pass that still warms up (a re-plan's
                               new streamed blocks not yet in the pinned cache) does not move it */
    double compute_s;       /* blocks x block_ms */
    double copy_s, bound_s; /* streamed bytes / rate and max(compute, copy); < 0 unknown */
} run_figs;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static run_figs figures(const scenario *sc, const sim_job *j, const run_result *rr)
{
    run_figs f = {0};
    const sim_model *sm = &sc->models[j->run.model];
    for (int64_t s = 1; s < rr->nsteps; s++) {
        const step_result *x = &rr->steps[s];
        f.steady.seconds += x->seconds;
        f.steady.compute += x->compute;
        f.steady.wait += x->wait;
        f.steady.queue += x->queue;
        f.steady.htod += x->htod;
        f.steady.dtoh += x->dtoh;
        f.nsteady++;
    }
    if (f.nsteady) {
        double *w = malloc((size_t)f.nsteady * sizeof *w);
        if (w) {
            for (int64_t s = 1; s < rr->nsteps; s++) w[s - 1] = rr->steps[s].seconds;
            qsort(w, (size_t)f.nsteady, sizeof *w, cmp_double);
            f.predicted = f.nsteady % 2 ? w[f.nsteady / 2] : (w[f.nsteady / 2 - 1] + w[f.nsteady / 2]) / 2;
            free(w);
        }
        double n = (double)f.nsteady;
        f.steady.seconds /= n;
        f.steady.compute /= n;
        f.steady.wait /= n;
        f.steady.queue /= n;
        f.steady.htod = (uint64_t)((double)f.steady.htod / n + 0.5);
        f.steady.dtoh = (uint64_t)((double)f.steady.dtoh / n + 0.5);
    }
    f.compute_s = (double)sm->nblocks * j->run.block_ms / 1000;
    f.copy_s = f.bound_s = -1;
    if (sc->copy_rate > 0 && rr->planned) {
        f.copy_s = (double)rr->plan.streamed_bytes / sc->copy_rate;
        f.bound_s = f.copy_s > f.compute_s ? f.copy_s : f.compute_s;
    }
    return f;
}

static json_t *jstep(const step_result *x)
{
    double stall = x->seconds - x->compute;
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I}", "seconds", x->seconds, "compute_seconds",
                     x->compute, "stall_seconds", stall, "stall_fraction",
                     x->seconds > 0 ? stall / x->seconds : 0.0, "wait_seconds", x->wait, "queue_seconds",
                     x->queue, "bytes_htod", (json_int_t)x->htod, "bytes_dtoh", (json_int_t)x->dtoh);
}

static json_t *jrun(const scenario *sc, const sim_job *j, const run_result *rr)
{
    const sim_run *run = &j->run;
    const sim_model *sm = &sc->models[run->model];
    run_figs f = figures(sc, j, rr);
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(sm->name));
    json_object_set_new(o, "blocks_prefix", json_string(sm->blocks_desc));
    json_object_set_new(o, "blocks", json_integer(sm->nblocks));
    json_object_set_new(o, "block_bytes", json_integer((json_int_t)(sm->nblocks ? sm->block_bytes[0] : 0)));
    json_object_set_new(o, "steps", json_integer(run->steps));
    json_object_set_new(o, "steps_done", json_integer(rr->nsteps));
    json_object_set_new(o, "block_ms", json_real(run->block_ms));
    json_object_set_new(o, "prefetch", json_integer(run->prefetch));
    json_object_set_new(o, "window", json_integer(run->prefetch + 1));
    json_object_set_new(o, "pinned_cache", json_boolean(run->pinned_cache));
    json_t *plan = json_null();
    if (rr->planned) {
        const ferry_plan *p = &rr->plan;
        json_t *st = json_array();
        for (int64_t k = 0; k < sm->nblocks; k++)
            if (rr->streams[k]) json_array_append_new(st, json_integer(k));
        plan = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "blocks", (json_int_t)p->blocks,
                         "resident_blocks", (json_int_t)p->resident_blocks, "streamed_blocks",
                         (json_int_t)p->streamed_blocks, "fixed_bytes", (json_int_t)p->fixed_bytes,
                         "resident_bytes", (json_int_t)p->resident_bytes, "window_bytes",
                         (json_int_t)p->window_bytes, "streamed_bytes", (json_int_t)p->streamed_bytes,
                         "budget", (json_int_t)p->budget, "streamed", st);
    }
    json_object_set_new(o, "plan", plan);
    json_t *steps = json_array();
    for (int64_t s = 0; s < rr->nsteps; s++) json_array_append_new(steps, jstep(&rr->steps[s]));
    json_object_set_new(o, "per_step", steps);
    json_object_set_new(o, "first_step", rr->nsteps ? jstep(&rr->steps[0]) : json_null());
    json_t *steady = json_null();
    if (f.nsteady) {
        steady = jstep(&f.steady);
        json_object_set_new(steady, "steps", json_integer(f.nsteady));
    }
    json_object_set_new(o, "steady", steady);
    json_object_set_new(o, "predicted_step_seconds", f.nsteady ? json_real(f.predicted) : json_null());
    json_object_set_new(o, "compute_seconds", json_real(f.compute_s));
    json_object_set_new(o, "copy_rate", sc->copy_rate > 0 ? json_real(sc->copy_rate) : json_null());
    json_object_set_new(o, "copy_seconds", f.copy_s >= 0 ? json_real(f.copy_s) : json_null());
    json_object_set_new(o, "bound_seconds", f.bound_s >= 0 ? json_real(f.bound_s) : json_null());
    json_object_set_new(o, "device_bytes", json_integer((json_int_t)rr->device_bytes));
    json_object_set_new(o, "pinned_cache_bytes", json_integer((json_int_t)rr->pinned_cache_bytes));
    json_object_set_new(o, "shrinks", json_integer((json_int_t)rr->shrinks));
    json_object_set_new(o, "grows", json_integer((json_int_t)rr->grows));
    json_object_set_new(o, "retries", json_integer((json_int_t)rr->retries));
    json_object_set_new(o, "prefetch_now", json_integer(rr->prefetch_now));
    return o;
}

/* The run's line of text, after the job's. */
static void print_run(const scenario *sc, const sim_job *j, const run_result *rr)
{
    const sim_run *run = &j->run;
    const sim_model *sm = &sc->models[run->model];
    run_figs f = figures(sc, j, rr);
    char a[32], b[32], c[32], d[32];
#define H(buf, v) cli_human(buf, sizeof buf, v)
    printf("    run %s: %" PRId64 " of %" PRId64 " passes over %" PRId64
           " blocks (%s), %.3g ms each, prefetch %" PRId64,
           sm->name, rr->nsteps, run->steps, sm->nblocks, sm->blocks_desc, run->block_ms, run->prefetch);
    if (rr->planned) {
        const ferry_plan *p = &rr->plan;
        printf(" | plan: %" PRId64 " resident, %" PRId64 " streamed", p->resident_blocks, p->streamed_blocks);
        if (p->streamed_blocks) {
            printf(" (");
            for (int64_t k = 0, shown = 0; k < sm->nblocks; k++) {
                if (!rr->streams[k]) continue;
                if (shown == 8) {
                    printf(", ...");
                    break;
                }
                printf("%s%" PRId64, shown++ ? ", " : "", k);
            }
            printf(")");
        }
        printf(", resident %s, window %s, streams %s a pass, budget %s", H(a, p->resident_bytes),
               H(b, p->window_bytes), H(c, p->streamed_bytes), H(d, p->budget));
    }
    if (rr->nsteps) {
        const step_result *x = &rr->steps[0];
        printf(" | pass 1: %.3f s, %s to the device, stall %.3f s", x->seconds, H(a, x->htod),
               x->seconds - x->compute);
    }
    if (f.nsteady) {
        double stall = f.steady.seconds - f.steady.compute;
        printf(" | steady (passes 2-%" PRId64 "): %.3f s a pass, %s to the device, stall %.3f s (%.0f%%)",
               rr->nsteps, f.steady.seconds, H(a, f.steady.htod), stall,
               f.steady.seconds > 0 ? 100 * stall / f.steady.seconds : 0.0);
        printf(" | predicted %.3f s a pass", f.predicted);
    }
    if (rr->shrinks || rr->retries)
        printf(" | %" PRIu64 " moves found no room: shrank %" PRIu64 " times, grew back %" PRIu64
               ", prefetch now %" PRId64,
               rr->retries, rr->shrinks, rr->grows, rr->prefetch_now);
    if (f.bound_s >= 0)
        printf("; bound %.3f s (compute %.3f s, copy %s at %.3g GB/s %.3f s)", f.bound_s, f.compute_s,
               H(a, rr->plan.streamed_bytes), sc->copy_rate / 1e9, f.copy_s);
    else if (rr->planned) printf("; compute %.3f s a pass (no copy rate known for a bound)", f.compute_s);
    putchar('\n');
#undef H
}

void sim_print_job(scenario *sc, int ji, const ferry_job_stats *js, const job_result *r, bool json)
{
    const sim_job *j = &sc->jobs[ji];
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "job", json_string(j->name));
        json_object_set_new(o, "index", json_integer(ji));
        json_object_set_new(o, "seconds", json_real(js->seconds));
        json_object_set_new(o, "rss", jrange(&js->rss));
        json_object_set_new(o, "uss", jrange(&js->uss));
        json_object_set_new(o, "pss", jrange(&js->pss));
        bool cg = js->cgroup.start || js->cgroup.end || js->cgroup.peak;
        json_object_set_new(o, "cgroup", cg ? jrange(&js->cgroup) : json_null());
        json_object_set_new(o, "device_bytes", json_integer((json_int_t)js->device_bytes));
        json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)js->pinned_bytes));
        json_object_set_new(o, "host_bytes", json_integer((json_int_t)js->host_bytes));
        json_object_set_new(o, "spill_bytes", json_integer((json_int_t)js->spill_bytes));
        json_object_set_new(o, "bytes_htod", json_integer((json_int_t)js->bytes_htod));
        json_object_set_new(o, "bytes_dtoh", json_integer((json_int_t)js->bytes_dtoh));
        json_object_set_new(o, "seconds_htod", json_real(js->seconds_htod));
        json_object_set_new(o, "seconds_dtoh", json_real(js->seconds_dtoh));
        json_object_set_new(o, "bytes_written", json_integer((json_int_t)js->bytes_written));
        json_object_set_new(o, "bytes_read", json_integer((json_int_t)js->bytes_read));
        json_object_set_new(o, "evicted", json_integer((json_int_t)js->evicted));
        json_object_set_new(o, "dropped", json_integer((json_int_t)js->dropped));
        json_object_set_new(o, "reserve",
                            j->has_reserve ? json_integer((json_int_t)j->reserve) : json_null());
        json_object_set_new(o, "reserve_freed",
                            j->has_reserve && r->reserve_freed >= 0 ? json_integer(r->reserve_freed)
                                                                    : json_null());
        json_object_set_new(o, "modified", json_integer(r->modified));
        json_object_set_new(o, "modified_bytes", json_integer((json_int_t)r->modified_bytes));
        json_object_set_new(o, "verified", j->verify ? json_integer(r->verified) : json_null());
        json_object_set_new(o, "mismatches", json_integer(r->mismatches));
        json_t *ms = json_object();
        for (int i = 0; i < sc->nmodels; i++) {
            uint64_t tb[FERRY_TIER_COUNT];
            model_tiers(&sc->models[i], tb);
            json_t *mo = json_object();
            for (int t = 0; t < FERRY_TIER_COUNT; t++)
                json_object_set_new(mo, ferry_tier_name((ferry_tier)t), json_integer((json_int_t)tb[t]));
            json_object_set_new(ms, sc->models[i].name, mo);
        }
        json_object_set_new(o, "models", ms);
        json_object_set_new(o, "run", j->has_run ? jrun(sc, j, &r->run) : json_null());
        json_object_set_new(o, "error", r->failed ? json_string(r->err) : json_null());
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        fflush(stdout);
        json_decref(o);
        return;
    }
    char a[32], b[32], c[32], d[32];
#define H(buf, v) cli_human(buf, sizeof buf, v)
    printf("[%d/%d] %s: %.3f s | rss %s -> %s (peak %s)", ji + 1, sc->njobs, j->name, js->seconds,
           H(a, js->rss.start), H(b, js->rss.end), H(c, js->rss.peak));
    printf(", uss %s -> %s (peak %s)", H(a, js->uss.start), H(b, js->uss.end), H(c, js->uss.peak));
    printf(", pss %s -> %s (peak %s)", H(a, js->pss.start), H(b, js->pss.end), H(c, js->pss.peak));
    if (js->cgroup.start || js->cgroup.end || js->cgroup.peak)
        printf(", cgroup %s -> %s (peak %s)", H(a, js->cgroup.start), H(b, js->cgroup.end),
               H(c, js->cgroup.peak));
    printf(" | device %s, pinned %s, host %s, spill %s", H(a, js->device_bytes), H(b, js->pinned_bytes),
           H(c, js->host_bytes), H(d, js->spill_bytes));
    printf(" | read %s, written %s | evicted %" PRIu64 " (%" PRIu64 " dropped)", H(a, js->bytes_read),
           H(b, js->bytes_written), js->evicted, js->dropped);
    if (j->has_reserve && r->reserve_freed >= 0)
        printf(" | reserve %s: freed %s", H(a, j->reserve), H(b, (uint64_t)r->reserve_freed));
    if (r->modified) printf(" | modified %" PRId64 " (%s)", r->modified, H(a, r->modified_bytes));
    if (j->verify) printf(" | verified %" PRId64 ", %" PRId64 " mismatches", r->verified, r->mismatches);
    if (r->failed) printf(" | ERROR: %s", r->err);
    putchar('\n');
    if (j->has_run) print_run(sc, j, &r->run);
    fflush(stdout);
#undef H
}

void sim_print_summary(ferry_device *dev, ferry_store *store, int njobs, int ran, int failed, bool json)
{
    ferry_store_stats st = {.size = sizeof st};
    if (ferry_store_get_stats(store, &st) < 0) memset(&st, 0, sizeof st); /* prints zeros */
    char source[128] = "unknown";
    ferry_host_available(&st.host_available, source, sizeof source); /* the figure and its source together */
    const char *spill_dir = ferry_store_spill_dir(store);
    if (json) {
        json_t *tb = json_object();
        for (int t = 0; t < FERRY_TIER_COUNT; t++)
            json_object_set_new(tb, ferry_tier_name((ferry_tier)t),
                                json_integer((json_int_t)st.tier_bytes[t]));
        json_t *s = json_object();
        json_object_set_new(s, "device", json_string(ferry_device_desc(dev)));
        json_object_set_new(s, "jobs", json_integer(njobs));
        json_object_set_new(s, "jobs_run", json_integer(ran));
        json_object_set_new(s, "jobs_failed", json_integer(failed));
        json_object_set_new(s, "ok", json_boolean(failed == 0 && ran == njobs));
        json_object_set_new(s, "tier_bytes", tb);
        json_object_set_new(s, "device_budget", json_integer((json_int_t)st.device_budget));
        json_object_set_new(s, "host_budget", json_integer((json_int_t)st.host_budget));
        json_object_set_new(s, "pinned_budget", json_integer((json_int_t)st.pinned_budget));
        json_object_set_new(s, "pinned_reserve", json_integer((json_int_t)st.pinned_reserve));
        json_object_set_new(s, "pinned_pool_bytes", json_integer((json_int_t)st.pinned_pool_bytes));
        json_object_set_new(s, "host_available", json_integer((json_int_t)st.host_available));
        json_object_set_new(s, "host_source", json_string(source));
        json_object_set_new(s, "spilling", json_boolean(st.spilling));
        json_object_set_new(s, "spill_dir", spill_dir ? json_string(spill_dir) : json_null());
        json_object_set_new(s, "spill_file_bytes", json_integer((json_int_t)st.spill_file_bytes));
        json_object_set_new(s, "bytes_htod", json_integer((json_int_t)st.bytes_htod));
        json_object_set_new(s, "bytes_dtoh", json_integer((json_int_t)st.bytes_dtoh));
        json_object_set_new(s, "seconds_htod", json_real(st.seconds_htod));
        json_object_set_new(s, "seconds_dtoh", json_real(st.seconds_dtoh));
        json_object_set_new(s, "bytes_written", json_integer((json_int_t)st.bytes_written));
        json_object_set_new(s, "bytes_read", json_integer((json_int_t)st.bytes_read));
        json_object_set_new(s, "evicted", json_integer((json_int_t)st.evicted));
        json_object_set_new(s, "dropped", json_integer((json_int_t)st.dropped));
        json_object_set_new(s, "models", json_integer(st.models));
        json_object_set_new(s, "tensors", json_integer(st.tensors));
        json_t *o = json_pack("{s:o}", "summary", s);
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
        return;
    }
    char a[32], b[32], c[32], d[32], e[32];
#define H(buf, v) cli_human(buf, sizeof buf, v)
    printf("summary: %d of %d jobs run, %d failed, on %s | budgets: device %s, host %s (pinned %s); host "
           "available %s"
           " (%s)",
           ran, njobs, failed, ferry_device_desc(dev), H(a, st.device_budget), H(b, st.host_budget),
           H(c, st.pinned_budget), H(d, st.host_available), source);
    printf(" | now: device %s, pinned %s, host %s, spill %s, source %s",
           H(a, st.tier_bytes[FERRY_TIER_DEVICE]), H(b, st.tier_bytes[FERRY_TIER_PINNED]),
           H(c, st.tier_bytes[FERRY_TIER_HOST]), H(d, st.tier_bytes[FERRY_TIER_SPILL]),
           H(e, st.tier_bytes[FERRY_TIER_SOURCE]));
    printf(" | to device %s in %.3f s, from device %s in %.3f s | read %s, written %s", H(a, st.bytes_htod),
           st.seconds_htod, H(b, st.bytes_dtoh), st.seconds_dtoh, H(c, st.bytes_read),
           H(d, st.bytes_written));
    if (spill_dir) printf(" (spill file in %s: %s)", spill_dir, H(a, st.spill_file_bytes));
    printf(" | evicted %" PRIu64 " (%" PRIu64 " dropped)%s\n", st.evicted, st.dropped,
           st.spilling ? " | spilling now" : "");
#undef H
}
