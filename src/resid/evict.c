/* SPDX-License-Identifier: Apache-2.0 */
/* evict.c - eviction: dirty tensors saved by the host policy (pinned pool,
 * RAM or the spill file), clean ones dropped, in two phases around copies
 * that run with the store's lock dropped; make_room's choice of groups. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

/* ---- eviction ---- */

/* Give back the spill ranges fr[0..n-1] reserved by spill_reserve, last
 * first, so that the spill file is as it was before them. */
static void spill_unreserve(ferry_store *s, const fy_fdrange *fr, int64_t n)
{
    for (int64_t k = n; k-- > 0;) rs_spill_unreserve(s->spill, fr[k].off, fr[k].len);
}

/* Reserve the spill ranges of fr[0..n-1] (their offsets filled in), all or
 * nothing: the batch's whole need is checked against the file system's free
 * space before any of it is reserved, and when a reservation still fails,
 * those made before it are given back before returning (a batch of 153 MiB
 * on a 64 MiB file system once reserved 47 MiB for its first 37 tensors and
 * kept it after failing, leaving 2.9 MB free for everyone else). The message
 * gives the batch's total, not the part still unreserved. Runs under the
 * lock: fallocate takes the blocks (file system bookkeeping, no data
 * written); the writes follow with the lock dropped. */
static int spill_reserve(ferry_store *s, fy_fdrange *fr, int64_t n)
{
    uint64_t total = 0;
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        uint64_t r;
        if (fy_add_ovf(fr[k].len, RS_SPILL_ALIGN - 1, &r) ||
            fy_add_ovf(total, r & ~(uint64_t)(RS_SPILL_ALIGN - 1), &total))
            rc = fy_seterr(&s->err, -EFBIG,
                           "%s: spilling %" PRId64 " dirty tensors needs more bytes than a file holds",
                           s->spill_dir, n);
    }
    if (rc == 0) rc = rs_spill_check_room(s->spill, total);
    int64_t got = 0; /* ranges reserved: fr[0..got-1] */
    for (; rc == 0 && got < n; got++)
        if ((rc = rs_spill_reserve(s->spill, fr[got].len, &fr[got].off)) < 0)
            break; /* fr[got] was not reserved */
    if (rc < 0) {
        spill_unreserve(s, fr, got);
        char msg[FY_ERRMSG_MAX];
        fy_err_copy(&s->err, msg, sizeof msg);
        fy_seterr(&s->err, rc,
                  "spilling %" PRId64 " dirty tensors (%" PRIu64
                  " bytes in the spill file): %s (the tensors stay on the device)",
                  n, total, msg);
    }
    return rc;
}

/* A dirty tensor's save: where it goes, and its copy there. */
typedef struct save {
    rtensor *t;
    ferry_tier tier; /* PINNED, HOST or SPILL */
    void *host;
    uint64_t off; /* SPILL: its range in the spill file */
} save;

/* Give back the host copy a save had taken (its tensor's tier untouched). */
static void save_undo(ferry_store *s, save *v)
{
    if (v->tier == FERRY_TIER_PINNED) {
        rs_pool_free(s, v->host, v->t->nbytes);
    } else if (v->tier == FERRY_TIER_HOST) {
        fy_free(s->m, v->host);
        s->host_used -= v->t->nbytes;
    }
    v->host = NULL;
}

void rs_store_spill_flush(ferry_store *s)
{
    fy_range *r = NULL;
    size_t n = 0;
    if (!s->spill || rs_spill_flush_take(s->spill, &r, &n) < 0 || !r) return;
    pthread_mutex_unlock(&s->lock);
    rs_spill_punch(rs_spill_fd(s->spill), r, n);
    pthread_mutex_lock(&s->lock);
    rs_spill_flush_give(s->spill, r, n);
}

/* Take the listed device tensors off the device, in three steps. Marking,
 * under the lock: each is marked evicting (nobody else moves, frees or
 * evicts it), each dirty one's destination chosen by the host policy and
 * its room taken (the pool may grow, the lock dropped meanwhile; the host's
 * available memory is read with it dropped too). Copying, with the lock
 * dropped: device to host, and to the spill file. Committing, under the
 * lock: the new tiers, or, for a copy that failed, its room given back and
 * the tensor left on the device (nothing is lost: the device copy is freed
 * only here); a group whose dirty member could not be saved stays whole.
 * Returns 0 or the first error. */
int rs_evict_tensors(ferry_store *s, rtensor **ts, int64_t n)
{
    const ferry_allocator *m = s->m;
    int rc = fy_xfer_bind(s->dev);
    if (rc < 0) return rs_device_failed(s, NULL, rc);
    bool need_avail = false;
    uint64_t dirty = 0;
    for (int64_t k = 0; k < n; k++) {
        ts[k]->evicting = true;
        if (ts[k]->dirty) need_avail = true, dirty += ts[k]->nbytes;
    }
    s->evicting += n;
    /* a dirty tensor is read back on the store's streams: not before the
     * kernels of releases deferred meanwhile, which may still change it in
     * place (a group held by one member; a tensor marked dirty afterwards) */
    if (dirty && s->fences.reuse) rs_reuse_wait_all(s);
    uint64_t avail = 0;
    if (need_avail) { /* (a cgroup read: with the lock dropped, the tensors marked) */
        pthread_mutex_unlock(&s->lock);
        if (fy_host_available(&avail, NULL, 0) < 0) avail = 0; /* unknown: spill */
        pthread_mutex_lock(&s->lock);
    }
    /* dirty bytes come before clean copies kept for speed: make them room */
    if (dirty && s->cache_used &&
        (s->host_used + s->pool.used + dirty > s->o.host_budget || s->pool.used + dirty > s->o.pinned_budget))
        rs_uncache_bytes(s, dirty);
    rs_hoststate h = {.host_budget = s->o.host_budget,
                      .host_used = s->host_used + s->pool.used,
                      .pinned_budget = s->o.pinned_budget,
                      .pinned_used = s->pool.used,
                      .spill_below = s->o.spill_below,
                      .spill_above = s->o.spill_above,
                      .spilling = s->spilling,
                      .available = avail};
    save *sv = fy_calloc(m, (size_t)(n ? n : 1), sizeof *sv);
    fy_hostrange *hr = fy_calloc(m, (size_t)(n ? n : 1), sizeof *hr);
    fy_fdrange *fr = fy_calloc(m, (size_t)(n ? n : 1), sizeof *fr);
    int64_t nsv = 0, nh = 0, nf = 0;
    if (!sv || !hr || !fr) {
        rc = fy_seterr(&s->err, -ENOMEM, "evicting: out of memory for the lists of %" PRId64 " tensors", n);
        goto out;
    }
    /* ---- marking: each dirty tensor's destination and its room there ---- */
    for (int64_t k = 0; k < n; k++) {
        rtensor *t = ts[k];
        if (!t->dirty || t->nbytes == 0) continue; /* an empty tensor has nothing to save */
        rs_dest d = rs_policy_dest(&h, t->nbytes);
        save *v = &sv[nsv];
        *v = (save){.t = t};
        if (d == RS_DEST_PINNED) {
            if (rs_pool_alloc(s, t->nbytes, &v->host) == 0) { /* (may pin, the lock dropped) */
                v->tier = FERRY_TIER_PINNED;
                h.pinned_used += t->nbytes;
            } else {
                d = RS_DEST_HOST; /* pool could not grow: pageable */
            }
        }
        if (d == RS_DEST_HOST && (v->host = fy_malloc(m, (size_t)t->nbytes)) != NULL) {
            v->tier = FERRY_TIER_HOST;
            s->host_used += t->nbytes;
        }
        if (v->host) {
            h.host_used += t->nbytes;
            h.available = h.available > t->nbytes ? h.available - t->nbytes : 0;
            hr[nh++] = (fy_hostrange){v->host, t->dptr, t->nbytes};
        } else {
            v->tier = FERRY_TIER_SPILL;
        }
        nsv++;
    }
    /* the host copies first (as hr), then the spills (as fr), each in order */
    for (int64_t k = 0; k < nsv; k++)
        if (sv[k].tier == FERRY_TIER_SPILL) fr[nf++] = (fy_fdrange){0, sv[k].t->nbytes, sv[k].t->dptr};
    s->spilling = h.spilling;
    /* spills: reserve everything first, so a spill never fails half-way for
     * space; a failed batch gives back all it reserved */
    bool spilled = false; /* the spill file was used: flush it below */
    int src = 0;          /* the spill's error (the host copies go on without it) */
    if (nf) {
        if (!s->spill) src = rs_spill_open(s->spill_dir, s->m, &s->err, &s->spill);
        if (src == 0) {
            spilled = true;
            rs_spill_hold(s->spill); /* ranges released meanwhile are punched by the flush below */
            src = spill_reserve(s, fr, nf);
        }
    }
    int fd = s->spill ? rs_spill_fd(s->spill) : -1;
    /* ---- copying, with the lock dropped ---- */
    char hmsg[FY_ERRMSG_MAX] = "", fmsg[FY_ERRMSG_MAX] = "";
    int hrc = 0, frc = 0;
    double t0 = fy_now();
    rs_pin_yield(s, +1);
    pthread_mutex_unlock(&s->lock);
    if (nh && (hrc = fy_xfer_device_to_host(s->dev, hr, nh, NULL)) < 0)
        snprintf(hmsg, sizeof hmsg, "%s", ferry_device_errmsg(s->dev));
    if (nf && src == 0 && hrc == 0 &&
        (frc = fy_xfer_device_to_fd(s->dev, fd, s->spill_dir, fr, nf, &s->load, NULL)) < 0)
        snprintf(fmsg, sizeof fmsg, "%s", ferry_device_errmsg(s->dev));
    pthread_mutex_lock(&s->lock);
    rs_pin_yield(s, -1);
    double dt = fy_now() - t0;
    /* ---- committing ---- */
    if (hrc < 0) {
        rc = hrc;
        fy_err_adopt(&s->err, hmsg);
    }
    if (src < 0) {
        rc = rc < 0 ? rc : src;
    } else if (frc < 0 || (nf && hrc < 0)) { /* (after failed host copies the spill does not run) */
        if (frc < 0) {
            rc = rc < 0 ? rc : frc;
            fy_err_adopt(&s->err, fmsg);
        }
        spill_unreserve(s, fr, nf);
        frc = frc < 0 ? frc : hrc;
    }
    for (int64_t k = 0, q = 0; k < nsv; k++) {
        save *v = &sv[k];
        if (v->tier == FERRY_TIER_SPILL) {
            if (src == 0 && frc == 0) {
                v->off = fr[q].off;
                s->c.written += fr[q].len;
            } else {
                v->tier = FERRY_TIER_DEVICE; /* not saved: it stays */
            }
            q++;
        } else if (hrc < 0) {
            save_undo(s, v);
            v->tier = FERRY_TIER_DEVICE;
        }
        if (v->tier == FERRY_TIER_DEVICE) continue;
        v->t->tier = v->tier;
        v->t->host = v->host;
        v->t->soff = v->off;
    }
    /* A group moves together: when a dirty member could not be saved, the
     * whole group stays on the device (its saved members' copies dropped). */
    int64_t nkeep = 0;
    for (int64_t k = 0; k < n; k++)
        if (ts[k]->dirty && ts[k]->nbytes && ts[k]->tier == FERRY_TIER_DEVICE) nkeep++;
    if (nkeep) {
        for (int64_t k = 0; k < n; k++) {
            rtensor *t = ts[k];
            bool keep = false;
            for (int64_t q = 0; q < n && !keep; q++)
                keep = ts[q]->dirty && ts[q]->nbytes && ts[q]->tier == FERRY_TIER_DEVICE &&
                       ts[q]->owner == t->owner && ts[q]->group == t->group;
            if (!keep) continue;
            if (t->tier != FERRY_TIER_DEVICE) { /* a saved member: undo the save */
                if (t->tier == FERRY_TIER_SPILL) rs_spill_hold(s->spill);
                rs_release_copy(s, t);
                t->tier = FERRY_TIER_DEVICE;
            }
            t->keep = true;
        }
    }
    /* free device memory of what left: the dropped clean ones and the saved dirty ones */
    uint64_t moved = 0;
    for (int64_t k = 0; k < n; k++) {
        rtensor *t = ts[k];
        t->evicting = false;
        if (t->keep) { /* its group could not leave whole: it stays */
            t->keep = false;
            continue;
        }
        if (!t->dirty || t->nbytes == 0) {
            s->c.dropped++;
            /* an empty dirty tensor keeps its flag: nothing to lose; a cached
             * one's copy stays in the pinned pool */
            t->tier = t->cached ? FERRY_TIER_PINNED : FERRY_TIER_SOURCE;
        } else {
            moved += t->nbytes;
        }
        rs_dev_free(s, t);
        s->c.evicted++;
    }
    s->evicting -= n;
    n = 0; /* (committed: out must not unmark them again) */
    s->c.dtoh += moved;
    s->c.s_dtoh += dt;
    pthread_cond_broadcast(&s->landed);
    /* after a spill, what it did not reuse goes back to the file system
     * (freed ranges held for reuse, those of members undone just above);
     * after a failed one too: its file system is the one short of space.
     * (The punching runs with the lock dropped.) */
    if (spilled) rs_store_spill_flush(s);
out:
    if (n) { /* nothing was copied: unmark */
        for (int64_t k = 0; k < nsv; k++) save_undo(s, &sv[k]);
        for (int64_t k = 0; k < n; k++) ts[k]->evicting = false;
        s->evicting -= n;
        pthread_cond_broadcast(&s->landed);
    }
    fy_free(m, sv);
    fy_free(m, hr);
    fy_free(m, fr);
    return rc;
}

/* Room on the device: the budget's room, and the device's real free memory. */
uint64_t rs_room_now(ferry_store *s)
{
    uint64_t room = s->o.device_budget > s->arena.used ? s->o.device_budget - s->arena.used : 0;
    uint64_t fr = 0, tot = 0;
    if (ferry_device_mem_info(s->dev, &fr, &tot) == 0 && fr + s->arena.cached < room)
        room = fr + s->arena.cached;
    return room;
}

/* Make bytes of room, never touching protected tensors (prot: per model, per
 * tensor, may be NULL). *could = what could be freed when impossible. */
static int64_t make_room_once(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot, bool spare,
                              uint64_t *could);

int64_t rs_make_room_locked(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot,
                            uint64_t *could)
{
    return rs_make_room_ex(s, bytes, pm, prot, could, false);
}

int64_t rs_make_room_ex(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot, uint64_t *could,
                        bool spared_only)
{
    rs_reap_releases(s, false); /* holds whose kernels are done go first */
    /* a planned model's own resident set is spared while its streamed blocks
     * (and everything else) can make the room, even if that means waiting for
     * their release events: taking a resident block would make the next pass
     * stream it */
    bool spare = pm && pm->plan;
    int64_t rc = make_room_once(s, bytes, pm, prot, spare, could);
    /* short of room (or asked for everything) while kernels may still read
     * released tensors: wait for them (their memory is reusable only then),
     * then evict what they held too */
    bool all = bytes == UINT64_MAX;
    /* short of room while kernels may still read released clean tensors:
     * they may go now, the copies into their memory ordered after those
     * kernels on the device (rs_defer_releases), so the host does not wait
     * for the GPU and keeps queueing work ahead of it */
    if (rc == FERRY_E_BUDGET && s->fences.pending && rs_defer_releases(s) > 0)
        rc = make_room_once(s, bytes, pm, prot, spare, could);
    if ((rc == FERRY_E_BUDGET || (all && rc >= 0)) && s->fences.pending && rs_reap_releases(s, true) > 0) {
        int64_t more = make_room_once(s, bytes, pm, prot, spare, could);
        rc = all && rc >= 0 && more >= 0 ? rc + more : more;
    }
    if (rc == FERRY_E_BUDGET && spare && !spared_only)
        rc = make_room_once(s, bytes, pm, prot, false, could); /* the budget shrank */
    return rc;
}

int64_t rs_hold_at_most(ferry_store *s, uint64_t held_max)
{
    int64_t got = 0;
    rs_cache_release(s, UINT64_MAX);
    while (s->arena.used && s->arena.used + s->arena.cached > held_max) {
        /* ask for the room there is plus the excess: the policy evicts at
         * least the excess more (whole groups), freeing pieces that merge
         * into whole free segments, given back at once. (The room is the
         * smaller of the budget's and the device's: with a budget past what
         * the device has, the budget's room asked for more than could ever
         * be freed, and nothing went.) */
        uint64_t room = rs_room_now(s);
        uint64_t excess = s->arena.used + s->arena.cached - held_max;
        int64_t more = rs_make_room_locked(s, room + (excess < s->arena.used ? excess : s->arena.used), NULL,
                                           NULL, NULL);
        if (more <= 0) break; /* nothing more can go: the rest stays */
        got += more;
        rs_cache_release(s, UINT64_MAX);
    }
    return got;
}

int rs_fit_budget(ferry_store *s)
{
    if (s->arena.used <= s->o.device_budget) return 0;
    uint64_t excess = s->arena.used - s->o.device_budget, could = 0;
    int64_t rc = rs_make_room_locked(s, excess, NULL, NULL, &could);
    return rc < 0 ? (int)rc : 0;
}

/* make-room's candidates, gathered in the policy's order (rs_policy_choose:
 * priority, model's last use, streamed blocks first, group's use, then the
 * model's place in the store and the group's id) from each model's device
 * index (m->dev), so that only groups with device memory are looked at: the
 * models are sorted by (priority, last use); models that tie are merged
 * group by group; a model's streamed blocks' list comes before its others'.
 * Each group looked at (s->room_visits) gets its device bytes and its
 * protection from its own members, as in a walk of every tensor; the
 * unprotected ones with bytes are kept, until they make need (need
 * UINT64_MAX, or not enough: all of them). c[k].id is k, the walk's order,
 * which is the policy's, so rs_policy_choose decides as it would over every
 * group of the store. */
typedef struct room_walk {
    rs_cand *c;
    ferry_model **gm; /* per candidate: its model ... */
    int64_t *gid;     /* ... and its group */
    int64_t n, cap;
} room_walk;

static void room_walk_free(ferry_store *s, room_walk *w)
{
    fy_free(s->m, w->c);
    fy_free(s->m, w->gm);
    fy_free(s->m, w->gid);
    *w = (room_walk){0};
}

static int walk_push(ferry_store *s, room_walk *w, const rs_cand *cd, ferry_model *m, int64_t g)
{
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 64;
        rs_cand *c = fy_realloc(s->m, w->c, (size_t)cap * sizeof *c);
        if (c) w->c = c;
        ferry_model **gm = c ? fy_realloc(s->m, w->gm, (size_t)cap * sizeof *gm) : NULL;
        if (gm) w->gm = gm;
        int64_t *gid = gm ? fy_realloc(s->m, w->gid, (size_t)cap * sizeof *gid) : NULL;
        if (!gid)
            return fy_seterr(&s->err, -ENOMEM, "making room: out of memory for %" PRId64 " candidates", cap);
        w->gid = gid;
        w->cap = cap;
    }
    w->c[w->n] = *cd;
    w->c[w->n].id = w->n;
    w->gm[w->n] = m;
    w->gid[w->n] = g;
    w->n++;
    return 0;
}

static int cmp_models(const void *a, const void *b, void *arg)
{
    ferry_model *const *v = arg;
    const ferry_model *x = v[*(const int *)a], *y = v[*(const int *)b];
    if (x->priority != y->priority) return x->priority < y->priority ? -1 : 1;
    if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static int room_walk_run(ferry_store *s, room_walk *w, uint64_t need, ferry_model *pm, const bool *prot,
                         bool spare)
{
    *w = (room_walk){0};
    int nm = s->nmodels;
    int *ord = fy_calloc(s->m, (size_t)(nm ? nm : 1), sizeof *ord);
    int64_t *at =
        fy_calloc(s->m, (size_t)(nm ? nm : 1), sizeof *at); /* per model of a class: its next group */
    if (!ord || !at) {
        fy_free(s->m, ord), fy_free(s->m, at);
        return fy_seterr(&s->err, -ENOMEM, "making room: out of memory for %d models", nm);
    }
    for (int i = 0; i < nm; i++) ord[i] = i;
    qsort_r(ord, (size_t)nm, sizeof *ord, cmp_models, s->models);
    uint64_t got = 0;
    int rc = 0;
    for (int lo = 0; lo < nm && rc == 0 && (need == UINT64_MAX || got < need);) {
        int hi = lo + 1; /* models ord[lo .. hi-1] tie on (priority, last use) */
        while (hi < nm && s->models[ord[hi]]->priority == s->models[ord[lo]]->priority &&
               s->models[ord[hi]]->last_use == s->models[ord[lo]]->last_use)
            hi++;
        for (int li = 1; li >= 0 && rc == 0 && (need == UINT64_MAX || got < need); li--) {
            for (int q = lo; q < hi; q++) {
                ferry_model *m = s->models[ord[q]];
                /* a planned model's resident set is spared: its whole list of others */
                at[q - lo] = li == 0 && spare && m == pm ? RS_LRU_END : rs_lru_first(&m->dev, li);
            }
            while (rc == 0 && (need == UINT64_MAX || got < need)) {
                int best = -1; /* the tying models' next groups: the oldest use, then the first model */
                for (int q = lo; q < hi; q++) {
                    if (at[q - lo] == RS_LRU_END) continue;
                    if (best < 0 ||
                        s->models[ord[q]]->t[at[q - lo]].use < s->models[ord[best]]->t[at[best - lo]].use ||
                        (s->models[ord[q]]->t[at[q - lo]].use == s->models[ord[best]]->t[at[best - lo]].use &&
                         ord[q] < ord[best]))
                        best = q;
                }
                if (best < 0) break;
                ferry_model *m = s->models[ord[best]];
                int64_t g = at[best - lo];
                at[best - lo] = rs_lru_next(&m->dev, g);
                s->room_visits++;
                rs_cand cd = {.priority = m->priority,
                              .last_use = m->last_use,
                              .streams = m->t[g].streams,
                              .use = m->t[g].use};
                for (int64_t j = 0; j < m->gcnt[g] && !cd.protect; j++) {
                    int64_t i = m->gmem[m->gat[g] + j];
                    const rtensor *u = &m->t[i];
                    if (u->tier != FERRY_TIER_DEVICE && !u->moving) continue;
                    if (u->tier == FERRY_TIER_DEVICE) cd.bytes += u->nbytes;
                    /* a group with a member still landing stays whole: not a candidate */
                    if (u->holds || u->moving || u->evicting || u->busy || u->wanted ||
                        (m == pm && prot && prot[i]) || (spare && m == pm && !u->streams))
                        cd.protect = true;
                }
                if (cd.protect || cd.bytes == 0) continue;
                if ((rc = walk_push(s, w, &cd, m, g)) < 0) break;
                got += cd.bytes;
            }
        }
        lo = hi;
    }
    fy_free(s->m, ord);
    fy_free(s->m, at);
    if (rc < 0) room_walk_free(s, w);
    return rc;
}

static int64_t make_room_once(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot, bool spare,
                              uint64_t *could)
{
    uint64_t room = rs_room_now(s);
    /* short of room while other evictions copy with the lock dropped: the
     * room they make is coming; wait for them (not for the asking when there
     * is room: a call that needs nothing never waits for another's copies) */
    while (bytes != UINT64_MAX && bytes > room && s->evicting > 0) {
        pthread_cond_wait(&s->landed, &s->lock);
        room = rs_room_now(s);
    }
    uint64_t need = bytes == UINT64_MAX ? UINT64_MAX : (bytes > room ? bytes - room : 0);
    if (could) *could = 0;
    if (need == 0) return 0;
    /* candidates, in the policy's order, from the models' device indexes:
     * only groups with device memory are looked at, and only until enough is
     * found (all of them when not enough can be) */
    room_walk w;
    int64_t rc = room_walk_run(s, &w, need, pm, prot, spare);
    if (rc < 0) return rc;
    rs_cand *c = w.c;
    int64_t k = w.n;
    int64_t *out = fy_calloc(s->m, (size_t)(k ? k : 1), sizeof *out);
    if (!out) {
        room_walk_free(s, &w);
        return fy_seterr(&s->err, -ENOMEM, "making room: out of memory for %" PRId64 " candidates", k);
    }
    uint64_t freed = 0;
    int64_t chosen = rs_policy_choose(c, k, need, out, &freed);
    if (chosen < 0) {
        if (could) *could = freed + room;
        rc = fy_seterr(&s->err, FERRY_E_BUDGET,
                       "the device needs %" PRIu64 " bytes free but only %" PRIu64 " can be made (%" PRIu64
                       " free now + %" PRIu64 " evictable): nothing was evicted",
                       bytes, freed + room, room, freed);
    } else if (chosen > 0) {
        /* the chosen groups' device tensors, in eviction order */
        int64_t nt = 0;
        for (int64_t q = 0; q < chosen; q++) {
            const ferry_model *m = w.gm[out[q]];
            int64_t g = w.gid[out[q]];
            for (int64_t j = 0; j < m->gcnt[g]; j++)
                nt += m->t[m->gmem[m->gat[g] + j]].tier == FERRY_TIER_DEVICE;
        }
        rtensor **ts = fy_calloc(s->m, (size_t)(nt ? nt : 1), sizeof *ts);
        if (!ts) {
            rc = fy_seterr(&s->err, -ENOMEM, "making room: out of memory for a list of %" PRId64 " tensors",
                           nt);
        } else {
            nt = 0;
            for (int64_t q = 0; q < chosen; q++) {
                ferry_model *m = w.gm[out[q]];
                int64_t g = w.gid[out[q]];
                for (int64_t j = 0; j < m->gcnt[g]; j++) {
                    rtensor *u = &m->t[m->gmem[m->gat[g] + j]];
                    if (u->tier == FERRY_TIER_DEVICE) ts[nt++] = u;
                }
            }
            room_walk_free(s, &w); /* (the eviction drops the lock: the models may change) */
            int erc = rs_evict_tensors(s, ts, nt);
            uint64_t got = 0; /* tensor bytes evicted (the API's unit; each freed its dsize) */
            for (int64_t q = 0; q < nt; q++)
                if (ts[q]->tier != FERRY_TIER_DEVICE) got += ts[q]->nbytes;
            fy_free(s->m, ts);
            rc = erc < 0 ? erc : (int64_t)got;
        }
    }
    room_walk_free(s, &w);
    fy_free(s->m, out);
    return rc;
}

FERRY_API int64_t ferry_store_make_room(ferry_store *s, uint64_t bytes, uint64_t *could)
{
    if (!s) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    fy_xfer_bind(s->dev);
    int64_t rc = rs_make_room_locked(s, bytes, NULL, NULL, could);
    /* the caller wants device memory for itself: hand back what the store
     * keeps for reuse, not only what it just evicted; the free pieces of
     * segments that still hold tensors cannot go back, so evict on until
     * the device has the room (or nothing more can go) */
    if (rc >= 0) rs_cache_release(s, UINT64_MAX);
    uint64_t fr = 0, tot = 0;
    if (rc >= 0 && bytes != UINT64_MAX && ferry_device_mem_info(s->dev, &fr, &tot) == 0 && fr < bytes) {
        uint64_t held = s->arena.used + s->arena.cached, short_by = bytes - fr;
        int64_t more = rs_hold_at_most(s, held > short_by ? held - short_by : 0);
        if (more > 0) rc += more;
    }
    /* and disk space held for reuse, and pinned RAM nobody uses: each
     * given back with the lock dropped */
    if (rc >= 0) rs_store_spill_flush(s);
    rs_pchunk *idle = NULL;
    int nidle = rc >= 0 ? rs_pool_trim_take(s, &idle) : 0;
    pthread_mutex_unlock(&s->lock);
    rs_chunks_drop(s, idle, nidle);
    return rc;
}

FERRY_API int ferry_model_evict(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    int64_t *sel = NULL, nsel = 0;
    rtensor **ts = NULL;
    int rc = rs_select(m, tensors, n, &sel, &nsel);
    if (rc < 0) goto out;
    if (!(ts = fy_calloc(s->m, (size_t)(nsel ? nsel : 1), sizeof *ts))) {
        rc = rs_merr(m, -ENOMEM, "ferry_model_evict: out of memory for the lists of %" PRId64 " tensors",
                     nsel);
        goto out;
    }
    rs_settle(s, m, sel, nsel,
              true); /* a queued move of any of them lands first, an eviction commits, a read ends */
    rs_reap_releases(s, false);
    int64_t nt = 0;
    for (int64_t k = 0; k < nsel; k++) {
        int64_t i = sel[k];
        if (m->t[i].tier != FERRY_TIER_DEVICE) continue;
        if (m->t[i].holds) {
            char q[256];
            rc = rs_merr(m, FERRY_E_BUSY, "tensor %s is in use: release it before evicting",
                         RS_Q(q, m->t[i].name));
            goto out;
        }
        ts[nt++] = &m->t[i];
    }
    rc = rs_evict_tensors(s, ts, nt);
    if (rc < 0) rs_model_failed(m, rc);
out:
    fy_free(s->m, sel);
    fy_free(s->m, ts);
    pthread_mutex_unlock(&s->lock);
    return rc;
}
