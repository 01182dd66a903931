/* SPDX-License-Identifier: Apache-2.0 */
/* model.c - models in a store: adding (tensors and their module groups),
 * removing, finding, grouping, priorities, and the selection of a request's
 * tensors with their groups. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- models ---- */

FERRY_API const char *ferry_model_errmsg(ferry_model *m)
{
    return m ? fy_err_public(&m->err) : "";
}

static int cmp_tname(const void *a, const void *b, void *arg)
{
    const ferry_model *m = arg;
    int c = strcmp(m->t[*(const int64_t *)a].name, m->t[*(const int64_t *)b].name);
    if (c) return c;
    return (*(const int64_t *)a > *(const int64_t *)b) - (*(const int64_t *)a < *(const int64_t *)b);
}

/* length of name's module prefix (up to the last '.'), or its whole length */
static size_t prefix_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

static int cmp_prefix(const void *a, const void *b, void *arg)
{
    const ferry_model *m = arg;
    const char *x = m->t[*(const int64_t *)a].name, *y = m->t[*(const int64_t *)b].name;
    size_t lx = prefix_len(x), ly = prefix_len(y);
    int c = memcmp(x, y, lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (*(const int64_t *)a > *(const int64_t *)b) - (*(const int64_t *)a < *(const int64_t *)b);
}

void rs_model_free(ferry_model *m)
{
    if (!m) return;
    ferry_store *s = m->s;
    rs_spill_hold(s->spill); /* punched later, like after a reload */
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (t->tier == FERRY_TIER_DEVICE) rs_dev_free(s, t);
        rs_release_copy(s, t); /* (of a device tensor: its cached pinned copy, if any) */
    }
    rs_plan_free(s, m);
    if (m->kf_at) rs_kfile_clear(&s->keeper, m->kf, m->kf_at[m->nfiles]);
    fy_free(s->m, m->kf);
    fy_free(s->m, m->kf_at);
    fy_free(s->m, m->t);
    fy_free(s->m, m->by_name);
    fy_free(s->m, m->gmem);
    fy_free(s->m, m->gat);
    fy_free(s->m, m->gcnt);
    fy_free(s->m, m->gmark);
    rs_lru_destroy(&m->dev);
    fy_free(s->m, m->files);
    fy_free(s->m, m->name);
    fy_err_destroy(&m->err);
    fy_free(s->m, m);
}

ferry_model *rs_find_model(ferry_store *s, const char *name)
{
    for (int i = 0; i < s->nmodels; i++)
        if (strcmp(s->models[i]->name, name) == 0) return s->models[i];
    return NULL;
}

FERRY_API int ferry_store_add(ferry_store *s, const char *name, ferry_file *const *files, int nfiles,
                              int priority, ferry_model **out)
{
    if (!s || !name || !files || nfiles <= 0 || !out) return FERRY_E_INVAL;
    *out = NULL;
    for (int k = 0; k < nfiles; k++)
        if (!files[k]) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    ferry_model *m = NULL;
    if (rs_find_model(s, name)) {
        char q[256];
        rc = fy_seterr(&s->err, FERRY_E_INVAL, "ferry_store_add: a model called %s is already in the store",
                       RS_Q(q, name));
        goto out;
    }
    int64_t n = 0;
    int nshards = 0;
    for (int k = 0; k < nfiles; k++)
        n += ferry_file_tensor_count(files[k]), nshards += ferry_file_shard_count(files[k]);
    m = fy_calloc(s->m, 1, sizeof *m);
    if (m) { /* model_free needs both on the failure path below */
        m->s = s;
        fy_err_init_child(&m->err, &s->err);
    }
    if (!m || !(m->name = fy_strndup(s->m, name, strlen(name))) ||
        !(m->files = fy_calloc(s->m, (size_t)nfiles, sizeof *m->files)) ||
        !(m->t = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->t)) ||
        !(m->by_name = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->by_name)) ||
        !(m->gmem = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->gmem)) ||
        !(m->gat = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->gat)) ||
        !(m->gcnt = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->gcnt)) ||
        !(m->gmark = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->gmark)) ||
        !(m->kf = fy_calloc(s->m, (size_t)(nshards ? nshards : 1), sizeof *m->kf)) ||
        !(m->kf_at = fy_calloc(s->m, (size_t)nfiles + 1, sizeof *m->kf_at)) ||
        rs_lru_init(&m->dev, s->m, n) < 0) {
        rc = fy_seterr(&s->err, -ENOMEM,
                       "ferry_store_add: out of memory for a model of %" PRId64 " tensors (%zu bytes)", n,
                       sizeof *m + (size_t)n * (sizeof *m->t + 5 * sizeof *m->by_name));
        goto out;
    }
    if (s->nmodels == s->cap_models) {
        int cap = s->cap_models ? 2 * s->cap_models : 8;
        ferry_model **nm = fy_realloc(s->m, s->models, (size_t)cap * sizeof *nm);
        if (!nm) {
            rc = fy_seterr(&s->err, -ENOMEM, "ferry_store_add: out of memory for a list of %d models", cap);
            goto out;
        }
        s->models = nm;
        s->cap_models = cap;
    }
    m->s = s;
    m->priority = priority;
    m->nfiles = nfiles;
    memcpy(m->files, files, (size_t)nfiles * sizeof *files);
    for (int k = 0; k < nfiles; k++) m->kf_at[k + 1] = m->kf_at[k] + ferry_file_shard_count(files[k]);
    m->n = n;
    int64_t i = 0;
    for (int k = 0; k < nfiles; k++)
        for (int64_t j = 0; j < ferry_file_tensor_count(files[k]); j++, i++) {
            rtensor *t = &m->t[i];
            ferry_tensor_info ti = {.size = sizeof ti};
            ferry_file_tensor_info(files[k], j, &ti); /* j is in range: cannot fail */
            t->owner = m;
            t->file = k;
            t->idx = j;
            t->shard = ti.shard;
            t->name = ti.name;
            t->nbytes = ti.nbytes;
            t->tier = FERRY_TIER_SOURCE;
        }
    /* groups: one per module prefix; a group's id is the index of a member */
    for (i = 0; i < n; i++) m->by_name[i] = i;
    qsort_r(m->by_name, (size_t)n, sizeof *m->by_name, cmp_prefix, m);
    int64_t g = -1;
    for (i = 0; i < n; i++) {
        rtensor *t = &m->t[m->by_name[i]];
        const char *prev = i ? m->t[m->by_name[i - 1]].name : NULL;
        size_t pl = prefix_len(t->name);
        if (!prev || prefix_len(prev) != pl || memcmp(prev, t->name, pl) != 0) g = m->by_name[i];
        t->group = g;
    }
    rs_group_index(m);
    for (i = 0; i < n; i++) m->by_name[i] = i;
    qsort_r(m->by_name, (size_t)n, sizeof *m->by_name, cmp_tname, m);
    s->models[s->nmodels++] = m;
    *out = m;
    m = NULL;
out:
    if (m) rs_model_free(m);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_store_remove(ferry_model *m)
{
    if (!m) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    rs_settle(s, m, NULL, 0, true); /* no copy of its tensors runs with the lock dropped any more */
    rs_reap_releases(s, false);
    if (m->refs > 0) {
        /* another thread found it and may be inside a call on it right now */
        int rc = rs_merr(m, FERRY_E_BUSY,
                         "found by ferry_store_find %" PRId64 " time%s and not put back: "
                         "ferry_model_put it first",
                         m->refs, m->refs == 1 ? "" : "s");
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    for (struct ferry_op *op = s->ops; op; op = op->next)
        if (op->m == m) {
            int rc = rs_merr(m, FERRY_E_BUSY,
                             "a queued move (ferry_model_to_device_async) was not waited for: "
                             "ferry_op_wait it first");
            pthread_mutex_unlock(&s->lock);
            return rc;
        }
    for (int64_t i = 0; i < m->n; i++)
        if (m->t[i].holds) {
            char q[256];
            int rc = rs_merr(m, FERRY_E_BUSY, "tensor %s is in use: release it first", RS_Q(q, m->t[i].name));
            pthread_mutex_unlock(&s->lock);
            return rc;
        }
    for (int i = 0; i < s->nmodels; i++)
        if (s->models[i] == m) {
            s->models[i] = s->models[--s->nmodels];
            break;
        }
    fy_xfer_bind(s->dev);
    rs_model_free(m);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

FERRY_API ferry_model *ferry_store_find(ferry_store *s, const char *name)
{
    if (!s || !name) return NULL;
    pthread_mutex_lock(&s->lock);
    ferry_model *m = rs_find_model(s, name);
    if (m) m->refs++; /* under the lock that remove takes: m cannot be freed in between */
    pthread_mutex_unlock(&s->lock);
    return m;
}

FERRY_API void ferry_model_put(ferry_model *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->s->lock);
    if (m->refs > 0) m->refs--; /* a put with nothing found is a caller's error: ignored, never negative */
    pthread_mutex_unlock(&m->s->lock);
}

FERRY_API const char *ferry_model_name(const ferry_model *m)
{
    return m ? m->name : "";
}
FERRY_API int64_t ferry_model_tensor_count(const ferry_model *m)
{
    return m ? m->n : FERRY_E_INVAL;
}

FERRY_API int64_t ferry_model_find(const ferry_model *m, const char *name)
{
    if (!m || !name) return FERRY_E_INVAL;
    int64_t lo = 0, hi = m->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (strcmp(m->t[m->by_name[mid]].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n && strcmp(m->t[m->by_name[lo]].name, name) == 0 ? m->by_name[lo] : FERRY_E_NOTFOUND;
}

FERRY_API int ferry_model_group(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0 || (n && !tensors)) return FERRY_E_INVAL;
    for (int64_t k = 0; k < n; k++)
        if (tensors[k] < 0 || tensors[k] >= m->n) return FERRY_E_INVAL;
    if (n < 2) return 0;
    pthread_mutex_lock(&m->s->lock);
    rs_settle(m->s, m, NULL, 0, false); /* an eviction decides by groups: not while one copies */
    /* the groups joined must all be in one tier: refuse mixing device and not */
    bool on = m->t[tensors[0]].tier == FERRY_TIER_DEVICE;
    for (int64_t k = 1; k < n; k++)
        for (int64_t i = 0; i < m->n; i++)
            if (m->t[i].group == m->t[tensors[k]].group && (m->t[i].tier == FERRY_TIER_DEVICE) != on) {
                int rc = rs_merr(m, FERRY_E_INVAL,
                                 "cannot group tensors of which some are on the device and some not");
                pthread_mutex_unlock(&m->s->lock);
                return rc;
            }
    int64_t g = m->t[tensors[0]].group;
    for (int64_t k = 1; k < n; k++) {
        int64_t old = m->t[tensors[k]].group;
        if (old == g) continue;
        for (int64_t i = 0; i < m->n; i++)
            if (m->t[i].group == old) m->t[i].group = g;
    }
    rs_group_index(m);
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

FERRY_API int ferry_model_set_priority(ferry_model *m, int priority)
{
    if (!m) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    m->priority = priority;
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

FERRY_API int ferry_model_set_pinned_cache(ferry_model *m, int on)
{
    if (!m || (on != 0 && on != 1)) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    m->pinned_cache = on;
    rs_pchunk *idle = NULL;
    int nidle = 0;
    if (!on) { /* the copies no longer wanted go (a moving one's when it lands) */
        for (int64_t i = 0; i < m->n; i++)
            if (m->t[i].cached && !m->t[i].moving && !m->t[i].busy && !rs_wants_cache(m, &m->t[i]))
                rs_uncache(s, &m->t[i]);
        nidle = rs_pool_trim_take(s, &idle);
    }
    pthread_mutex_unlock(&s->lock);
    rs_chunks_drop(s, idle, nidle); /* (unpinned with the lock dropped) */
    return 0;
}
