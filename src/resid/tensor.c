/* SPDX-License-Identifier: Apache-2.0 */
/* tensor.c - one tensor of a model: dirty marks, use counts, state, and
 * reading or writing its bytes wherever they are. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

static int check_t(ferry_model *m, int64_t t)
{
    return m && t >= 0 && t < m->n ? 0 : FERRY_E_INVAL;
}

FERRY_API int ferry_model_mark_dirty(ferry_model *m, int64_t t)
{
    FY_TRY(check_t(m, t));
    char q[256];
    pthread_mutex_lock(&m->s->lock);
    rs_settle(m->s, m, &t, 1, false); /* a queued move of it lands first, an eviction commits */
    int rc = 0;
    if (m->t[t].tier != FERRY_TIER_DEVICE)
        rc = rs_merr(m, FERRY_E_INVAL, "tensor %s is not on the device (it is in %s)", RS_Q(q, m->t[t].name),
                     ferry_tier_name(m->t[t].tier));
    else {
        rs_uncache(m->s, &m->t[t]); /* the pinned copy is stale now */
        m->t[t].dirty = true;
    }
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

static int hold(ferry_model *m, int64_t t, int d)
{
    if (!m || t >= m->n) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    int rc = 0;
    for (int64_t i = t < 0 ? 0 : t; i < (t < 0 ? m->n : t + 1); i++) {
        if (d < 0 && m->t[i].holds == 0) {
            char q[256];
            rc = rs_merr(m, FERRY_E_INVAL, "tensor %s is not in use (released more often than held)",
                         RS_Q(q, m->t[i].name));
            continue;
        }
        m->t[i].holds += d;
    }
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

FERRY_API int ferry_model_hold(ferry_model *m, int64_t t)
{
    return hold(m, t, 1);
}
FERRY_API int ferry_model_release(ferry_model *m, int64_t t)
{
    return hold(m, t, -1);
}

FERRY_API int ferry_model_tensor_state(ferry_model *m, int64_t t, ferry_tensor_state *out)
{
    FY_TRY(check_t(m, t));
    if (!out || out->size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    ferry_tensor_state st = {.size = sizeof st};
    pthread_mutex_lock(&m->s->lock);
    const rtensor *r = &m->t[t];
    st.name = r->name;
    st.nbytes = r->nbytes;
    st.tier = r->tier;
    st.dirty = r->dirty;
    st.holds = r->holds;
    st.group = r->group;
    st.dptr =
        r->tier == FERRY_TIER_DEVICE || r->moving ? r->dptr : 0; /* a queued move's block is there already */
    st.cached = r->cached;
    st.streams = r->streams;
    pthread_mutex_unlock(&m->s->lock);
    return fy_struct_out(out, &st, sizeof st);
}

FERRY_API int ferry_model_device_addrs(ferry_model *m, const int64_t *tensors, int64_t n, uint64_t *out)
{
    if (!m) return FERRY_E_INVAL;
    if (n < 0 || (n && (!tensors || !out)))
        return rs_merr(m, FERRY_E_INVAL, "ferry_model_device_addrs: bad arguments (%" PRId64 " tensors)", n);
    for (int64_t k = 0; k < n; k++)
        if (tensors[k] < 0 || tensors[k] >= m->n)
            return rs_merr(m, FERRY_E_INVAL,
                           "ferry_model_device_addrs: tensor index %" PRId64 " out of range (%" PRId64
                           " tensors)",
                           tensors[k], m->n);
    pthread_mutex_lock(&m->s->lock);
    for (int64_t k = 0; k < n; k++) {
        const rtensor *r = &m->t[tensors[k]];
        uint64_t d = r->tier == FERRY_TIER_DEVICE || r->moving ? r->dptr : 0;
        out[3 * k] = d;
        out[3 * k + 1] = out[3 * k + 2] = 0;
        if (d) rs_arena_block(&m->s->arena, d, &out[3 * k + 1], &out[3 * k + 2]);
    }
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

/* Reads and writes of a tensor's bytes run with the lock dropped: the
 * tensor is marked busy, so that no move, eviction or uncaching takes the
 * copy they work on meanwhile (rs_settle waits for them). */

FERRY_API int ferry_model_read(ferry_model *m, int64_t t, void *buf)
{
    FY_TRY(check_t(m, t));
    if (!buf) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    rs_settle(s, m, &t, 1, false); /* a queued move lands first, an eviction commits */
    rtensor *r = &m->t[t];
    ferry_tier tier = r->tier;
    fy_hostrange h = {buf, r->dptr, r->nbytes};
    const void *host = r->host;
    uint64_t soff = r->soff;
    int fd = s->spill ? rs_spill_fd(s->spill) : -1;
    r->busy++;
    pthread_mutex_unlock(&s->lock);
    int rc = 0;
    char msg[FY_ERRMSG_MAX] = "";
    if (r->nbytes == 0) {
    } else if (tier == FERRY_TIER_DEVICE) {
        if ((rc = fy_xfer_device_to_host(s->dev, &h, 1, NULL)) < 0)
            snprintf(msg, sizeof msg, "%s", ferry_device_errmsg(s->dev));
    } else if (tier == FERRY_TIER_PINNED || tier == FERRY_TIER_HOST) {
        memcpy(buf, host, (size_t)r->nbytes);
    } else if (tier == FERRY_TIER_SOURCE) {
        rc = ferry_file_tensor_read(m->files[r->file], r->idx, 0, buf, (size_t)r->nbytes);
        if (rc < 0) snprintf(msg, sizeof msg, "%s", ferry_file_errmsg(m->files[r->file]));
    } else {
        rc = fy_xfer_fd_to_host(s->dev, fd, soff, buf, r->nbytes);
    }
    pthread_mutex_lock(&s->lock);
    r->busy--;
    pthread_cond_broadcast(&s->landed);
    if (rc < 0 && tier == FERRY_TIER_DEVICE) {
        fy_err_adopt(&s->err, msg);
        fy_err_adopt(&m->err, msg);
    } else if (rc < 0 && tier == FERRY_TIER_SOURCE) {
        rs_merr(m, rc, "%s", msg);
    } else if (rc < 0) {
        char q[256];
        rs_merr(m, rc, "%s: reading back tensor %s from the spill file: %s", s->spill_dir, RS_Q(q, r->name),
                ferry_strerror(rc));
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_model_write(ferry_model *m, int64_t t, const void *buf)
{
    FY_TRY(check_t(m, t));
    if (!buf) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    rs_settle(s, m, &t, 1, false);
    rtensor *r = &m->t[t];
    int rc = 0;
    if (r->tier != FERRY_TIER_DEVICE) {
        char q[256];
        rc = rs_merr(m, FERRY_E_INVAL, "tensor %s is not on the device (it is in %s)", RS_Q(q, r->name),
                     ferry_tier_name(r->tier));
    } else if (r->nbytes) {
        fy_hostrange h = {(void *)(uintptr_t)buf, r->dptr, r->nbytes};
        r->busy++;
        pthread_mutex_unlock(&s->lock);
        char msg[FY_ERRMSG_MAX] = "";
        if ((rc = fy_xfer_host_to_device(s->dev, &h, 1, NULL)) < 0)
            snprintf(msg, sizeof msg, "%s", ferry_device_errmsg(s->dev));
        pthread_mutex_lock(&s->lock);
        r->busy--;
        pthread_cond_broadcast(&s->landed);
        if (rc < 0) {
            fy_err_adopt(&s->err, msg);
            fy_err_adopt(&m->err, msg);
        }
    }
    if (rc == 0) {
        rs_uncache(s, r);
        r->dirty = true;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}
