/* stats.c - the store's statistics and jobs (per-job counters and memory samples). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- statistics ---- */

void rs_tiers(ferry_store *s, uint64_t *tb)
{
    memset(tb, 0, FERRY_TIER_COUNT * sizeof *tb);
    for (int i = 0; i < s->nmodels; i++)
        for (int64_t j = 0; j < s->models[i]->n; j++) tb[s->models[i]->t[j].tier] += s->models[i]->t[j].nbytes;
}

FERRY_API int ferry_store_get_stats(ferry_store *s, ferry_store_stats *out)
{
    if (!s || !out) return FERRY_E_INVAL;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->lock);
    rs_tiers(s, out->tier_bytes);
    out->device_budget = s->o.device_budget;
    out->pinned_budget = s->o.pinned_budget;
    out->host_budget = s->o.host_budget;
    fy_host_available(&out->host_available, out->host_source, sizeof out->host_source);
    out->spilling = s->spilling;
    if (s->spill) {
        snprintf(out->spill_path, sizeof out->spill_path, "%s", s->spill_dir);
        uint64_t res = 0;
        fy_spill_usage(s->spill, &res, &out->spill_file_bytes);
    }
    out->bytes_htod = s->c.htod;
    out->bytes_dtoh = s->c.dtoh;
    out->seconds_htod = s->c.s_htod;
    out->seconds_dtoh = s->c.s_dtoh;
    out->bytes_written = s->c.written;
    out->bytes_read = s->c.read;
    out->evicted = s->c.evicted;
    out->dropped = s->c.dropped;
    out->device_cached = s->cached;
    out->pinned_pool_bytes = s->pool_bytes;
    out->models = s->nmodels;
    for (int i = 0; i < s->nmodels; i++) out->tensors += s->models[i]->n;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

FERRY_API int ferry_store_job_begin(ferry_store *s, const char *name)
{
    if (!s || !name) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (s->job_open) {
        rc = fy_seterr(&s->ctx->err, FERRY_E_INVAL, "job \"%s\" is still open: end it before \"%s\"", s->job, name);
    } else if ((rc = fy_memsampler_start(s->m, 10, &s->sampler)) < 0) {
        fy_seterr(&s->ctx->err, rc, "job \"%s\": cannot start the memory sampler: %s", name, ferry_strerror(rc));
    } else {
        s->job_open = true;
        snprintf(s->job, sizeof s->job, "%s", name);
        s->job_t0 = fy_now();
        s->job_c = s->c;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_store_job_end(ferry_store *s, ferry_job_stats *out)
{
    if (!s) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    if (!s->job_open) {
        pthread_mutex_unlock(&s->lock);
        return fy_seterr(&s->ctx->err, FERRY_E_INVAL, "no job is open");
    }
    fy_memsample_result r;
    fy_memsampler_stop(s->sampler, &r);
    s->sampler = NULL;
    s->job_open = false;
    if (out) {
        memset(out, 0, sizeof *out);
        snprintf(out->job, sizeof out->job, "%s", s->job);
        out->seconds = fy_now() - s->job_t0;
        out->rss = (ferry_mem_range){r.start.rss, r.end.rss, r.peak.rss};
        out->uss = (ferry_mem_range){r.start.uss, r.end.uss, r.peak.uss};
        out->pss = (ferry_mem_range){r.start.pss, r.end.pss, r.peak.pss};
        if (r.has_cgroup) out->cgroup = (ferry_mem_range){r.cg_start, r.cg_end, r.cg_peak};
        uint64_t tb[FERRY_TIER_COUNT];
        rs_tiers(s, tb);
        out->device_bytes = tb[FERRY_TIER_DEVICE];
        out->pinned_bytes = tb[FERRY_TIER_PINNED];
        out->host_bytes = tb[FERRY_TIER_HOST];
        out->spill_bytes = tb[FERRY_TIER_SPILL];
        out->bytes_htod = s->c.htod - s->job_c.htod;
        out->bytes_dtoh = s->c.dtoh - s->job_c.dtoh;
        out->bytes_written = s->c.written - s->job_c.written;
        out->bytes_read = s->c.read - s->job_c.read;
        out->seconds_htod = s->c.s_htod - s->job_c.s_htod;
        out->seconds_dtoh = s->c.s_dtoh - s->job_c.s_dtoh;
        out->evicted = s->c.evicted - s->job_c.evicted;
        out->dropped = s->c.dropped - s->job_c.dropped;
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

