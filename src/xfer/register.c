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

static reg_entry *reg_find(ferry_device *d, const ferry_file *f, int32_t s)
{
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f && d->regs[i].shard == s) return &d->regs[i];
    return NULL;
}


/* Page-lock shard s's read-only shared mapping (never a private one: see
 * DESIGN.md §7, registering MAP_PRIVATE with READ_ONLY hung the driver).
 * A new entry starts neither held nor used. Under d->lock. */
static int reg_add(ferry_device *d, const ferry_file *f, int32_t s)
{
    if (reg_find(d, f, s) || f->shards[s].size == 0) return 0;
    if (d->nregs == d->cap_regs) {
        int cap = d->cap_regs ? d->cap_regs * 2 : 8;
        reg_entry *n = fy_realloc(&d->ctx->mem, d->regs, (size_t)cap * sizeof *n);
        if (!n) return fy_seterr(&d->err, -ENOMEM, "%s: out of memory for %d registrations", f->shards[s].path, cap);
        d->regs = n;
        d->cap_regs = cap;
    }
    reg_entry *e = &d->regs[d->nregs];
    memset(e, 0, sizeof *e);
    e->f = f;
    e->shard = s;
    e->base = f->shards[s].map;
    e->len = page_round(f->shards[s].size);
    int rc = d->g->ops->host_register(d->g, e->base, (size_t)e->len, true);
    if (rc < 0) return rc;
    d->nregs++;
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
        if (t->shard == s && t->nbytes && t->offset + t->nbytes > now && t->offset + t->nbytes > from) cut = t;
    }
    char q[128];
    if (cut)
        return fy_seterr(&d->err, FERRY_E_CORRUPT,
                         "%s: tensor %s: the file is now %" PRIu64 " bytes, it was %" PRIu64
                         " when opened: truncated after it was opened?",
                         sh->path, fy_quote(q, sizeof q, cut->name), now, sh->size);
    return fy_seterr(&d->err, FERRY_E_CORRUPT,
                     "%s: the file is now %" PRIu64 " bytes, it was %" PRIu64 " when opened: truncated after it was opened?",
                     sh->path, now, sh->size);
}

static int check_size(ferry_device *d, const ferry_file *f)
{
    for (int32_t s = 0; s < f->nshards; s++) FY_TRY(shrunk(d, f, s, 0));
    return 0;
}

/* Register every shard of f (those not registered yet), then mark them held
 * (hold) or in use by one more load. On failure nothing changes. */
int xf_reg_acquire(ferry_device *d, const ferry_file *f, bool hold)
{
    FY_RETURN_IF(f->private_map, &d->err, FERRY_E_UNSUPPORTED,
                 "%s: opened with FERRY_OPEN_PRIVATE (a copy-on-write mapping), which must never be "
                 "page-locked: use the ring path", f->shards[0].path);
    FY_TRY(check_size(d, f));
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    for (int32_t s = 0; s < f->nshards && rc == 0; s++) rc = reg_add(d, f, s);
    if (rc == 0) {
        for (int32_t s = 0; s < f->nshards; s++) {
            reg_entry *e = reg_find(d, f, s);
            if (!e) continue; /* empty shard */
            if (hold) e->held = true;
            else e->users++;
        }
    } else {
        reg_release_unused(d, f); /* only what this call added */
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

void xf_reg_unuse(ferry_device *d, const ferry_file *f)
{
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f && d->regs[i].users > 0) d->regs[i].users--;
    reg_release_unused(d, f);
    pthread_mutex_unlock(&d->lock);
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
    uint64_t need = 0;
    for (int32_t s = 0; s < f->nshards; s++) need += page_round(f->shards[s].size);
    FY_RETURN_IF(pinned_budget && need > pinned_budget, &d->err, FERRY_E_BUDGET,
                 "%s: registering %" PRIu64 " bytes exceeds the pinned budget of %" PRIu64 " bytes",
                 f->shards[0].path, need, pinned_budget);
    /* watched before it is held, so a close never misses a held entry */
    int w = fy_file_watch_add(f, reg_file_closing, d);
    FY_RETURN_IF(w < 0, &d->err, w, "%s: out of memory for the file's close watch", f->shards[0].path);
    int rc = xf_reg_acquire(d, f, true);
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

/* Registered with ferry_device_register_file (all shards that hold bytes)? */
bool xf_is_registered(ferry_device *d, const ferry_file *f)
{
    pthread_mutex_lock(&d->lock);
    bool all = true;
    for (int32_t s = 0; s < f->nshards; s++) {
        reg_entry *e = reg_find(d, f, s);
        if (f->shards[s].size && (!e || !e->held)) all = false;
    }
    pthread_mutex_unlock(&d->lock);
    return all;
}

/* register: copies straight out of the page-locked mapping, round-robin over streams. */
int xf_run_register(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                        fy_stream **streams, uint32_t nstreams)
{
    fy_gpu *g = d->g;
    /* use the registration if there is one, else register for this load only;
     * either way the shards stay registered until this load is done with them */
    int rc = 0;
    if (o->pinned_budget && !xf_is_registered(d, f)) {
        uint64_t need = 0;
        for (int32_t k = 0; k < f->nshards; k++) need += page_round(f->shards[k].size);
        FY_RETURN_IF(need > o->pinned_budget, &d->err, FERRY_E_BUDGET,
                     "%s: registering %" PRIu64 " bytes exceeds the pinned budget of %" PRIu64 " bytes",
                     f->shards[0].path, need, o->pinned_budget);
    }
    if ((rc = xf_reg_acquire(d, f, false)) < 0) return rc;
    if ((rc = g->ops->bind_thread(g)) < 0) goto out;
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
            /* consecutive tensors that are also adjacent on the device (ferry_load's
             * blocks mirror the file) go in one copy */
            const piece *pc = &p->pc[q];
            uint64_t src = pc->off, len = pc->len;
            fy_dptr dst = pc->dst;
            for (q++; q < bt->first + bt->count && p->pc[q].dst == dst + len && p->pc[q].off == src + len; q++)
                len += p->pc[q].len;
            rc = xf_copy_spread(g, true, dst, (void *)(uintptr_t)(base + src), len, streams, nstreams, &s);
            if (rc == 0) done += len;
        }
        if (o->progress && rc == 0) o->progress(o->opaque, done, p->bytes);
    }
    for (uint32_t k = 0; k < nstreams; k++) {
        int r = g->ops->stream_sync(g, streams[k]);
        if (rc == 0 && r < 0) rc = r;
    }
    /* A copy that failed because the file was cut after its batch was checked
     * (the sim reads the mapping without faulting, see sim.c): say which
     * tensor, as the check would have. */
    if (rc < 0 && rc != FERRY_E_CORRUPT)
        for (int32_t k = 0; k < f->nshards; k++)
            if (shrunk(d, f, k, 0) < 0) {
                rc = FERRY_E_CORRUPT;
                break;
            }
out:
    xf_reg_unuse(d, f);
    return rc;
}

