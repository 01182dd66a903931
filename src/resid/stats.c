/* SPDX-License-Identifier: Apache-2.0 */
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
        for (int64_t j = 0; j < s->models[i]->n; j++)
            tb[s->models[i]->t[j].tier] += s->models[i]->t[j].nbytes;
}

FERRY_API int ferry_store_get_stats(ferry_store *s, ferry_store_stats *out)
{
    if (!s || !out || out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    ferry_store_stats st = {.size = sizeof st};
    fy_host_available(&st.host_available, NULL, 0); /* (a cgroup read: before the lock) */
    pthread_mutex_lock(&s->lock);
    rs_tiers(s, st.tier_bytes);
    st.device_budget = s->o.device_budget;
    st.pinned_budget = s->o.pinned_budget;
    st.host_budget = s->o.host_budget;
    st.spilling = s->spilling;
    if (s->spill) {
        uint64_t res = 0;
        rs_spill_usage(s->spill, &res, &st.spill_file_bytes);
    }
    st.bytes_htod = s->c.htod;
    st.bytes_dtoh = s->c.dtoh;
    st.seconds_htod = s->c.s_htod;
    st.seconds_dtoh = s->c.s_dtoh;
    st.bytes_written = s->c.written;
    st.bytes_read = s->c.read;
    st.evicted = s->c.evicted;
    st.dropped = s->c.dropped;
    st.device_cached = s->arena.cached;
    rs_pinpool_adopt(&s->pool);
    st.pinned_pool_bytes = s->pool.bytes;
    st.pinned_reserve = s->pool.target;
    st.pinned_reserved = rs_pinpool_reserved(&s->pool);
    st.pinned_cache_bytes = s->cache_used;
    st.device_allocs = s->arena.allocs;
    st.device_frees = s->arena.frees;
    st.fence_waits = s->fences.waits;
    st.fence_orders = s->fences.orders;
    st.models = s->nmodels;
    for (int i = 0; i < s->nmodels; i++) st.tensors += s->models[i]->n;
    pthread_mutex_unlock(&s->lock);
    return fy_struct_out(out, &st, sizeof st);
}

FERRY_API int ferry_store_get_keeper_stats(ferry_store *s, ferry_store_keeper_stats *out)
{
    if (!s || !out || out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    ferry_store_keeper_stats st;
    rs_keeper_stats(&s->keeper, &st); /* (the keeper's lock, not the store's) */
    return fy_struct_out(out, &st, sizeof st);
}

FERRY_API int ferry_store_job_begin(ferry_store *s, const char *name)
{
    if (!s || !name) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    char q[256], q2[256];
    char *copy = NULL;
    if (s->job_open) {
        rc = fy_seterr(&s->err, FERRY_E_BUSY, "job %s is still open: end it before %s", RS_Q(q, s->job),
                       RS_Q(q2, name));
    } else if (!(copy = fy_strndup(s->m, name, strlen(name)))) {
        rc = fy_seterr(&s->err, -ENOMEM, "job %s: out of memory for its name (%zu bytes)", RS_Q(q, name),
                       strlen(name) + 1);
    } else if ((rc = fy_memsampler_start(s->m, 10, &s->sampler)) < 0) {
        fy_seterr(&s->err, rc, "job %s: cannot start the memory sampler: %s", RS_Q(q, name),
                  ferry_strerror(rc));
        fy_free(s->m, copy);
    } else {
        s->job_open = true;
        fy_free(s->m, s->job);
        s->job = copy;
        s->job_t0 = fy_now();
        s->job_c = s->c;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API const char *ferry_store_job_name(const ferry_store *s)
{
    return s ? s->job : NULL;
}

FERRY_API int ferry_store_job_end(ferry_store *s, ferry_job_stats *out)
{
    if (!s || (out && out->size < FERRY_STRUCT_MIN)) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    if (!s->job_open) {
        pthread_mutex_unlock(&s->lock);
        return fy_seterr(&s->err, FERRY_E_INVAL, "no job is open");
    }
    fy_memsample_result r;
    fy_memsampler_stop(s->sampler, &r);
    s->sampler = NULL;
    s->job_open = false;
    ferry_job_stats js = {.size = sizeof js};
    js.seconds = fy_now() - s->job_t0;
    js.rss = (ferry_mem_range){r.start.rss, r.end.rss, r.peak.rss};
    js.uss = (ferry_mem_range){r.start.uss, r.end.uss, r.peak.uss};
    js.pss = (ferry_mem_range){r.start.pss, r.end.pss, r.peak.pss};
    if (r.has_cgroup) js.cgroup = (ferry_mem_range){r.cg_start, r.cg_end, r.cg_peak};
    uint64_t tb[FERRY_TIER_COUNT];
    rs_tiers(s, tb);
    js.device_bytes = tb[FERRY_TIER_DEVICE];
    js.pinned_bytes = tb[FERRY_TIER_PINNED];
    js.host_bytes = tb[FERRY_TIER_HOST];
    js.spill_bytes = tb[FERRY_TIER_SPILL];
    js.bytes_htod = s->c.htod - s->job_c.htod;
    js.bytes_dtoh = s->c.dtoh - s->job_c.dtoh;
    js.bytes_written = s->c.written - s->job_c.written;
    js.bytes_read = s->c.read - s->job_c.read;
    js.seconds_htod = s->c.s_htod - s->job_c.s_htod;
    js.seconds_dtoh = s->c.s_dtoh - s->job_c.s_dtoh;
    js.evicted = s->c.evicted - s->job_c.evicted;
    js.dropped = s->c.dropped - s->job_c.dropped;
    pthread_mutex_unlock(&s->lock);
    return out ? fy_struct_out(out, &js, sizeof js) : 0;
}
