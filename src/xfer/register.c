/* SPDX-License-Identifier: Apache-2.0 */
/* register.c - page-locked file mappings: registering a checkpoint's shards
 * with the device (held by the caller or used by one load), and the register
 * path that copies straight out of the page cache. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xfer_impl.h"

/* ---- registration ---- */

/* A shard's mapping is registered in pieces of d->reg_piece bytes
 * (xfer_impl.h, REG_PIECE says why); piece k starts at k * d->reg_piece. */
static int64_t shard_pieces(const ferry_device *d, const ferry_file *f, int32_t s)
{
    return (int64_t)((page_round(f->shards[s].size) + d->reg_piece - 1) / d->reg_piece);
}

static reg_entry *reg_find(ferry_device *d, const ferry_file *f, int32_t s, uint64_t off)
{
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f && d->regs[i].shard == s && d->regs[i].off == off) return &d->regs[i];
    return NULL;
}

/* Page-lock piece k of shard s's read-only shared mapping, unless it is
 * already (never a private mapping: registering MAP_PRIVATE with READ_ONLY
 * hung the driver). A new entry starts neither
 * held nor used, and *added says so. *out: the entry, valid until the table
 * changes. Under d->lock. */
static int piece_register(ferry_device *d, const ferry_file *f, int32_t s, int64_t k, reg_entry **out,
                          bool *added)
{
    uint64_t off = (uint64_t)k * d->reg_piece, size = page_round(f->shards[s].size);
    if ((*out = reg_find(d, f, s, off))) return 0;
    if (d->nregs == d->cap_regs) {
        int cap = d->cap_regs ? d->cap_regs * 2 : 8;
        reg_entry *n = fy_realloc(&d->ctx->mem, d->regs, (size_t)cap * sizeof *n);
        if (!n)
            return fy_seterr(&d->err, -ENOMEM, "%s: out of memory for %d registrations", f->shards[s].path,
                             cap);
        d->regs = n;
        d->cap_regs = cap;
    }
    reg_entry *e = &d->regs[d->nregs];
    memset(e, 0, sizeof *e);
    e->f = f;
    e->shard = s;
    e->off = off;
    e->base = (uint8_t *)f->shards[s].map + off;
    e->len = size - off < d->reg_piece ? size - off : d->reg_piece;
    int rc = d->g->ops->host_register(d->g, e->base, (size_t)e->len, true);
    if (rc < 0) {
        /* the backend's message, with the file and the range it refused */
        char why[FY_ERRMSG_MAX];
        fy_err_copy(&d->err, why, sizeof why);
        return fy_seterr(&d->err, rc,
                         "%s: page-locking bytes [%" PRIu64 ", %" PRIu64
                         ") of the file for the register path "
                         "failed (nothing stays registered): %s",
                         f->shards[s].path, off, off + e->len, why);
    }
    d->nregs++;
    *out = e;
    *added = true;
    return 0;
}

/* Unregister f's entries nobody holds or uses any more. Under d->lock. */
static void reg_release_unused(ferry_device *d, const ferry_file *f)
{
    for (int i = 0; i < d->nregs;) {
        reg_entry *e = &d->regs[i];
        if (e->f == f && !e->held && e->users == 0) {
            d->g->ops->host_unregister(d->g, e->base);
            *e = d->regs[--d->nregs];
        } else {
            i++;
        }
    }
}

/* A mapping that no longer covers its file (truncated, or rewritten in place,
 * after open) faults where its pages past the new end are read: on the CPU a
 * SIGBUS, which no return code can stop once raised. So the size is re-checked
 * before registering (cuMemHostRegister pins the pages: a shard cut before it
 * would fail there or, on the sim, fault later) and before each batch's copies
 * are queued, and a shard that shrank is refused, naming the first tensor the
 * cut reaches from byte `from` on (a cut tail with no tensor in it is refused
 * too: the registration spans it). A cut after the check is what the device
 * sees: the sim reads the mapping without faulting (sim.c, copy_guarded) and
 * the stream_sync re-check below names the tensor; a real device's DMA reads
 * the pages pinned at registration (README, "Truncated checkpoints"). */
static int shrunk(ferry_device *d, const ferry_file *f, int32_t s, uint64_t from)
{
    const shard *sh = &f->shards[s];
    uint64_t now = 0;
    if (fy_fstat_size(sh->fd, &now) < 0 || now >= sh->size) return 0; /* fstat failing: the copy will tell */
    const fy_tensor *cut = NULL;
    for (int64_t i = 0; i < f->tb.n && !cut; i++) {
        const fy_tensor *t = &f->tb.t[i];
        if (t->shard == s && t->nbytes && t->offset + t->nbytes > now && t->offset + t->nbytes > from)
            cut = t;
    }
    char q[128];
    if (cut)
        return fy_seterr(&d->err, FERRY_E_CORRUPT,
                         "%s: tensor %s: the file is now %" PRIu64 " bytes, it was %" PRIu64
                         " when opened: truncated after it was opened?",
                         sh->path, fy_quote(q, sizeof q, cut->name), now, sh->size);
    return fy_seterr(&d->err, FERRY_E_CORRUPT,
                     "%s: the file is now %" PRIu64 " bytes, it was %" PRIu64
                     " when opened: truncated after it was opened?",
                     sh->path, now, sh->size);
}

static int check_size(ferry_device *d, const ferry_file *f)
{
    for (int32_t s = 0; s < f->nshards; s++) FY_TRY(shrunk(d, f, s, 0));
    return 0;
}

/* A copy-on-write mapping is never page-locked (see piece_register). */
static int refuse_private(ferry_device *d, const ferry_file *f)
{
    FY_RETURN_IF(f->private_map, &d->err, FERRY_E_UNSUPPORTED,
                 "%s: opened with FERRY_OPEN_PRIVATE (a copy-on-write mapping), which must never be "
                 "page-locked: use the ring path",
                 f->shards[0].path);
    return 0;
}

/* Registering all of f within budget bytes (0: no limit)? */
static int check_budget(ferry_device *d, const ferry_file *f, uint64_t budget)
{
    uint64_t need = 0;
    for (int32_t s = 0; s < f->nshards; s++) need += page_round(f->shards[s].size);
    FY_RETURN_IF(budget && need > budget, &d->err, FERRY_E_BUDGET,
                 "%s: registering %" PRIu64 " bytes exceeds the pinned budget of %" PRIu64 " bytes",
                 f->shards[0].path, need, budget);
    return 0;
}

/* Register every piece of f not registered yet, then mark them all held. On
 * failure nothing changes. */
static int reg_hold(ferry_device *d, const ferry_file *f)
{
    FY_TRY(refuse_private(d, f));
    FY_TRY(check_size(d, f));
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    reg_entry *e;
    bool added = false;
    for (int32_t s = 0; s < f->nshards && rc == 0; s++)
        for (int64_t k = 0; k < shard_pieces(d, f, s) && rc == 0; k++)
            rc = piece_register(d, f, s, k, &e, &added);
    if (rc == 0) {
        for (int i = 0; i < d->nregs; i++)
            if (d->regs[i].f == f) d->regs[i].held = true;
    } else {
        reg_release_unused(d, f); /* only what this call added */
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

/* f is being closed while d still holds its registration (the caller never
 * unregistered it): drop it while the mappings exist, so no entry outlives the
 * file (one keyed by a freed pointer would match a later file at the same
 * address, and the pages would stay locked). */
static void reg_file_closing(void *owner, const ferry_file *f)
{
    ferry_device *d = owner;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f) d->regs[i].held = false;
    reg_release_unused(d, f);
    pthread_mutex_unlock(&d->lock);
}

/* The device stops watching every file it registered (ferry_device_close). */
void xf_reg_unwatch_all(ferry_device *d)
{
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].held) fy_file_watch_drop(d->regs[i].f, reg_file_closing, d);
}

FERRY_API int ferry_device_register_file(ferry_device *d, const ferry_file *f, uint64_t pinned_budget)
{
    if (!d || !f) return FERRY_E_INVAL;
    FY_TRY(check_budget(d, f, pinned_budget));
    /* watched before it is held, so a close never misses a held entry */
    int w = fy_file_watch_add(f, reg_file_closing, d);
    FY_RETURN_IF(w < 0, &d->err, w, "%s: out of memory for the file's close watch", f->shards[0].path);
    int rc = reg_hold(d, f);
    if (rc < 0 && w == 1) fy_file_watch_drop(f, reg_file_closing, d);
    return rc;
}

FERRY_API void ferry_device_unregister_file(ferry_device *d, const ferry_file *f)
{
    if (!d || !f) return;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f) d->regs[i].held = false;
    reg_release_unused(d, f); /* a load still copying keeps its shards until it ends */
    pthread_mutex_unlock(&d->lock);
    fy_file_watch_drop(f, reg_file_closing, d);
}

/* Held registered (every piece of every shard that holds bytes)? */
bool xf_is_registered(ferry_device *d, const ferry_file *f)
{
    pthread_mutex_lock(&d->lock);
    bool all = true;
    for (int32_t s = 0; s < f->nshards && all; s++)
        for (int64_t k = 0; k < shard_pieces(d, f, s) && all; k++) {
            reg_entry *e = reg_find(d, f, s, (uint64_t)k * d->reg_piece);
            if (!e || !e->held) all = false;
        }
    pthread_mutex_unlock(&d->lock);
    return all;
}

/* ---- the register path ---- */

/* A load's registration: the pieces of f in file order (shard by shard),
 * registered (or found registered) and put in use by this load one by one,
 * on the loading thread, each just before the first copy out of it. Copies
 * already queued keep the copy engine busy while the next piece registers
 * (bench/reg_probe.py on the H200: a 1 GiB copy queued before a 1 GiB
 * registration landed while it ran), where a helper thread registering ahead
 * held up the loading thread's copy calls behind each registration (the
 * driver serialises the calls, not the transfers). */
typedef struct reg_job {
    ferry_device *d;
    const ferry_file *f;
    int32_t s; /* every piece before piece k of shard s is in use by this load */
    int64_t k;
    bool added;     /* this load registered a piece itself */
    double seconds; /* spent in the registrations this load made */
} reg_job;

/* Put every piece up to and including piece k of shard s in use by this
 * load (k past the shard's last piece: all of shard s), registering those
 * not registered yet: 0, or the failure (its message set). */
static int reg_upto(reg_job *j, int32_t s, int64_t k)
{
    ferry_device *d = j->d;
    const ferry_file *f = j->f;
    while (j->s < f->nshards && (j->s < s || (j->s == s && j->k <= k))) {
        if (j->k >= shard_pieces(d, f, j->s)) {
            if (j->s == s) break; /* all of shard s */
            j->s++;
            j->k = 0;
            continue;
        }
        reg_entry *e = NULL;
        bool added = false;
        double t0 = fy_now();
        pthread_mutex_lock(&d->lock);
        int rc = piece_register(d, f, j->s, j->k, &e, &added);
        if (rc == 0) e->users++;
        pthread_mutex_unlock(&d->lock);
        if (rc < 0) return rc;
        if (added) {
            j->added = true;
            j->seconds += fy_now() - t0;
        }
        j->k++;
    }
    return 0;
}

/* The load is done with the pieces it put in use (its copies have landed):
 * held from now on when keep, else unregistered unless someone else holds or
 * uses them. */
static void reg_job_release(reg_job *j, bool keep)
{
    ferry_device *d = j->d;
    pthread_mutex_lock(&d->lock);
    for (int32_t s = 0; s <= j->s && s < j->f->nshards; s++)
        for (int64_t k = 0; k < (s < j->s ? shard_pieces(d, j->f, s) : j->k); k++) {
            reg_entry *e = reg_find(d, j->f, s, (uint64_t)k * d->reg_piece);
            if (!e) continue;
            if (e->users > 0) e->users--;
            if (keep) e->held = true;
        }
    reg_release_unused(d, j->f);
    pthread_mutex_unlock(&d->lock);
}

/* register: copies straight out of the page-locked mapping, round-robin over
 * streams, each within one registered piece. What is not registered yet is
 * registered for this load piece by piece, each piece just before its first
 * copy, while the copies queued before it run (and the pieces no copy needs
 * after the last copy, so that the whole file is registered either way); it
 * stays registered after the load only with FERRY_LOAD_KEEP_REGISTRATION. */
int xf_run_register(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                    fy_stream **streams, uint32_t nstreams, ferry_load_stats *st)
{
    fy_gpu *g = d->g;
    FY_TRY(refuse_private(d, f));
    bool registered = xf_is_registered(d, f);
    if (!registered) FY_TRY(check_budget(d, f, o->pinned_budget));
    FY_TRY(check_size(d, f));
    reg_job j = {.d = d, .f = f};
    int rc = g->ops->bind_thread(g);
    uint64_t done = 0;
    uint32_t s = 0;
    /* pieces carry file offsets; find each piece's shard through its batch */
    for (int64_t b = 0; b < p->nbt && rc == 0; b++) {
        const batch *bt = &p->bt[b];
        const uint8_t *base = f->shards[bt->shard].map;
        /* one fstat per batch (a contiguous run of the file: one per shard for
         * ferry_load, more for a load_into with gaps): a cut seen here is
         * refused before any of the batch's copies is queued */
        if ((rc = shrunk(d, f, bt->shard, bt->off)) < 0) break;
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0;) {
            /* consecutive tensors that are also adjacent on the device go in one copy */
            uint64_t src, len;
            fy_dptr dst;
            xf_piece_run(p, bt, &q, &src, &len, &dst);
            /* ... cut where registration pieces meet: a copy must not span two */
            while (len > 0 && rc == 0) {
                int64_t k = (int64_t)(src / d->reg_piece);
                uint64_t n = ((uint64_t)k + 1) * d->reg_piece - src;
                if (n > len) n = len;
                rc = reg_upto(&j, bt->shard, k);
                if (rc == 0)
                    rc = xf_copy_spread(g, true, dst, (void *)(uintptr_t)(base + src), n, streams, nstreams,
                                        &s);
                if (rc == 0) done += n;
                src += n;
                dst += n;
                len -= n;
            }
        }
        if (o->progress && rc == 0) o->progress(o->opaque, done, p->bytes);
    }
    for (uint32_t k = 0; k < nstreams; k++) {
        int r = g->ops->stream_sync(g, streams[k]);
        if (rc == 0 && r < 0) rc = r;
    }
    /* the pieces no copy needed (a load_into of part of the file, a load
     * with no tensors), so that the load leaves what it always did */
    if (rc == 0) rc = reg_upto(&j, f->nshards - 1, INT64_MAX);
    /* A copy that failed because the file was cut after its batch was checked
     * (the sim reads the mapping without faulting, see sim.c): say which
     * tensor, as the check would have. */
    if (rc < 0 && rc != FERRY_E_CORRUPT)
        for (int32_t k = 0; k < f->nshards; k++)
            if (shrunk(d, f, k, 0) < 0) {
                rc = FERRY_E_CORRUPT;
                break;
            }
    /* kept: watched before it is held, so a close never misses a held entry
     * (no memory for the watch: the load still worked, the pages go back) */
    bool keep = rc == 0 && (o->flags & FERRY_LOAD_KEEP_REGISTRATION) &&
                fy_file_watch_add(f, reg_file_closing, d) >= 0;
    reg_job_release(&j, keep);
    st->registration = j.added ? FERRY_REGISTRATION_NEW : FERRY_REGISTRATION_REUSED;
    st->register_seconds = j.added ? j.seconds : 0;
    return rc;
}
