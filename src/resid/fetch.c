/* fetch.c - ferry_model_to_device: room first, then each tier's tensors
 * through its move (the checkpoint through the loader, pinned and RAM copies
 * by DMA, the spill file through the ring). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- to the device ---- */

FERRY_API int ferry_model_to_device(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0) return FERRY_E_INVAL; /* tensors NULL: all */
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    bool *sel = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *sel);
    int64_t *idx = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *idx);
    uint64_t *dp = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *dp);
    fy_hostrange *hr = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *hr);
    fy_fdrange *fr = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *fr);
    int rc = 0;
    if (!sel || !idx || !dp || !hr || !fr) {
        rc = rs_merr(m, -ENOMEM, "ferry_model_to_device: out of memory for the lists of %" PRId64 " tensors", m->n);
        goto out;
    }
    if ((rc = rs_select_groups(m, tensors, n, sel)) < 0) goto out;
    uint64_t need = 0;
    for (int64_t i = 0; i < m->n; i++)
        if (sel[i] && m->t[i].tier != FERRY_TIER_DEVICE) need += m->t[i].nbytes;
    m->last_use = ++s->clock;
    int64_t mr = need ? rs_make_room_locked(s, need, m, sel, NULL) : 0; /* empty tensors need no room */
    if (mr < 0) {
        rc = (int)mr;
        char msg[FY_ERRMSG_MAX];
        fy_err_copy(&s->err, msg, sizeof msg);
        rs_merr(m, rc, "%s", msg);
        goto out;
    }
    if ((rc = fy_xfer_bind(s->dev)) < 0) {
        rs_device_failed(s, m, rc);
        goto out;
    }
    /* allocate, then move tier by tier; on failure free what this call allocated */
    for (int64_t i = 0; i < m->n && rc == 0; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || t->tier == FERRY_TIER_DEVICE) continue;
        if (t->nbytes == 0) continue;
        rc = rs_dev_alloc(s, t);
    }
    double t0 = fy_now();
    uint64_t moved = 0, read = 0;
    /* SOURCE: file by file, through the transfer engine */
    for (int k = 0; k < m->nfiles && rc == 0; k++) {
        int64_t cnt = 0;
        for (int64_t i = 0; i < m->n; i++) {
            rtensor *t = &m->t[i];
            if (sel[i] && t->file == k && t->tier == FERRY_TIER_SOURCE && t->nbytes) {
                idx[cnt] = t->idx;
                dp[cnt++] = t->dptr;
                moved += t->nbytes;
            }
        }
        if (cnt) rc = ferry_load_into(s->dev, m->files[k], idx, dp, cnt, &s->load, NULL);
    }
    read = moved;
    /* PINNED / HOST: plain copies */
    int64_t nh = 0, nf = 0;
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || !t->nbytes) continue;
        if (t->tier == FERRY_TIER_PINNED || t->tier == FERRY_TIER_HOST) hr[nh++] = (fy_hostrange){t->host, t->dptr, t->nbytes};
        if (t->tier == FERRY_TIER_SPILL) fr[nf++] = (fy_fdrange){t->soff, t->nbytes, t->dptr};
    }
    if (rc == 0 && nh) rc = fy_xfer_host_to_device(s->dev, hr, nh, NULL);
    if (rc == 0 && nf) rc = fy_xfer_fd_to_device(s->dev, fy_spill_fd(s->spill), s->spill_dir, fr, nf, &s->load, NULL, NULL);
    double dt = fy_now() - t0;
    for (int64_t i = 0; i < nh; i++) moved += hr[i].len;
    for (int64_t i = 0; i < nf; i++) moved += fr[i].len, read += fr[i].len;
    if (rc < 0) { /* nothing moved: back to where they were */
        rs_device_failed(s, m, rc);
        for (int64_t i = 0; i < m->n; i++) {
            rtensor *t = &m->t[i];
            if (sel[i] && t->tier != FERRY_TIER_DEVICE && t->dptr) rs_dev_free(s, t);
        }
        goto out;
    }
    /* The spill ranges stay allocated for the next spill: giving 10 GB back to
     * ext4 (truncate or punch) took 0.5-2.8 s on the H200 host, far longer
     * than reading it back. They are punched after the next spill, or by
     * ferry_store_make_room. */
    fy_spill_hold(s->spill);
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || t->tier == FERRY_TIER_DEVICE) continue;
        if (t->nbytes == 0) t->dptr = 0;
        rs_release_copy(s, t); /* the device copy is now the one */
        t->tier = FERRY_TIER_DEVICE;
    }
    s->c.htod += moved;
    s->c.read += read;
    s->c.s_htod += dt;
out:
    fy_free(s->m, sel);
    fy_free(s->m, idx);
    fy_free(s->m, dp);
    fy_free(s->m, hr);
    fy_free(s->m, fr);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

