/* SPDX-License-Identifier: Apache-2.0 */
/* plan.c - a load's plan (file ranges in order and the copies out of them),
 * the readers' shared schedule and the descriptor each reader reads through. */
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

static int cmp_item(const void *a, const void *b, void *arg)
{
    const ferry_file *f = arg;
    const fy_tensor *x = &f->tb.t[((const item *)a)->t], *y = &f->tb.t[((const item *)b)->t];
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void xf_plan_free(const ferry_allocator *m, plan *p)
{
    fy_free(m, p->pc);
    fy_free(m, p->bt);
    memset(p, 0, sizeof *p);
}

void xf_piece_run(const plan *p, const batch *bt, int64_t *q, uint64_t *src, uint64_t *len, fy_dptr *dst)
{
    int64_t k = *q, end = bt->first + bt->count;
    *src = p->pc[k].off, *len = p->pc[k].len, *dst = p->pc[k].dst;
    fy_dptr aend = p->pc[k].aend;
    /* a run stays inside the allocation of its first piece */
    for (k++; k < end && xf_piece_continues(&p->pc[k], *src, *len, *dst, aend); k++) *len += p->pc[k].len;
    *q = k;
}

void xf_items_alloc_ends(ferry_device *d, item *it, int64_t n)
{
    fy_dptr base = 0, end = 0;
    for (int64_t k = 0; k < n; k++) {
        fy_dptr p = it[k].dst;
        it[k].aend = 0;
        if (!p || !d->g->ops->mem_range) continue;
        if (!(p >= base && p < end)) {
            size_t size = 0;
            if (d->g->ops->mem_range(d->g, p, &base, &size) < 0) {
                base = end = 0;
                continue;
            }
            end = base + size;
        }
        it[k].aend = end;
    }
}

/* Tensors in file order, cut into pieces of at most cap bytes, grouped into
 * batches: contiguous file ranges of at most cap bytes in one shard.
 *
 * Views of one storage (a PyTorch checkpoint's x and x.t()) overlap in the
 * file, and a load that puts them where they overlap on the device too (the
 * same distance from file to device: ferry_load, ferry.torch's bases) would
 * copy the shared bytes once per view, from streams that may run at once:
 * two writes of the same bytes (harmless on a GPU, a data race under the
 * sim, which ThreadSanitizer reported). Such a tensor's bytes that the
 * storage copied already are left out; where the distance differs (the
 * caller wants the bytes twice, in two places) every byte is copied. */
int xf_plan_build(const ferry_allocator *m, const ferry_file *f, item *it, int64_t n, uint64_t cap, plan *p)
{
    memset(p, 0, sizeof *p);
    qsort_r(it, (size_t)n, sizeof *it, cmp_item, (void *)f);
    int64_t maxpc = 0;
    for (int64_t i = 0; i < n; i++) maxpc += (int64_t)((f->tb.t[it[i].t].nbytes + cap - 1) / cap);
    p->pc = fy_calloc(m, (size_t)(maxpc ? maxpc : 1), sizeof *p->pc);
    p->bt = fy_calloc(m, (size_t)(maxpc ? maxpc : 1), sizeof *p->bt);
    if (!p->pc || !p->bt) {
        xf_plan_free(m, p);
        return -ENOMEM;
    }
    batch *cur = NULL;
    /* the storage copied so far: its shard (-1: none yet), the end of its
     * bytes in the file and the distance from file to device */
    int32_t cov_shard = -1;
    uint64_t cov_end = 0;
    fy_dptr cov_delta = 0;
    for (int64_t i = 0; i < n; i++) {
        const fy_tensor *t = &f->tb.t[it[i].t];
        uint64_t start = 0, end = t->offset + t->nbytes;
        fy_dptr delta = it[i].dst - (fy_dptr)t->offset; /* wraps: compared, never used as an address */
        if (t->shard == cov_shard && t->offset < cov_end && delta == cov_delta && it[i].dst) {
            if (end <= cov_end) continue; /* all of it copied with its storage */
            start = cov_end - t->offset;
        }
        if (t->shard != cov_shard || end > cov_end) cov_shard = t->shard, cov_end = end, cov_delta = delta;
        for (uint64_t o = start; o < t->nbytes; o += cap) {
            uint64_t len = t->nbytes - o < cap ? t->nbytes - o : cap;
            piece *pc = &p->pc[p->npc];
            pc->off = t->offset + o;
            pc->len = len;
            pc->dst = it[i].dst + o;
            pc->aend = it[i].aend;
            if (!cur || cur->shard != t->shard || cur->off + cur->len != pc->off || cur->len + len > cap) {
                cur = &p->bt[p->nbt++];
                cur->shard = t->shard;
                cur->off = pc->off;
                cur->len = 0;
                cur->first = p->npc;
                cur->count = 0;
            }
            cur->len += len;
            cur->count++;
            p->npc++;
            p->bytes += len;
        }
    }
    return 0;
}

void xf_sched_init(sched *q, const plan *p, long long run, uint32_t nthreads)
{
    q->p = p;
    atomic_init(&q->next, 0);
    q->run = run;
    q->nthreads = nthreads ? nthreads : 1;
}

/* The next batch for a reader (p->nbt when none is left); *k and *end: the
 * reader's current run, -1 and 0 to begin. */
long long xf_next_batch(sched *q, long long *k, long long *end)
{
    if (*k + 1 < *end) return ++*k;
    long long s = atomic_load(&q->next), want;
    do {
        long long left = q->p->nbt - s;
        if (left <= 0) return q->p->nbt;
        want = left / (2 * (long long)q->nthreads);
        if (want > q->run) want = q->run;
        if (want < 1) want = 1;
    } while (!atomic_compare_exchange_weak(&q->next, &s, s + want));
    *k = s;
    *end = s + want;
    return s;
}


int xf_own_fd(const ferry_file *f, own *o, int32_t s)
{
    if (o->shard != s) {
        if (o->shard >= 0 && o->fd >= 0) fy_close(o->fd);
        o->shard = s;
        o->fd = fy_reopen_ro(f->shards[s].fd, f->shards[s].path); /* < 0: use the shared one */
    }
    return o->fd >= 0 ? o->fd : f->shards[s].fd;
}

int xf_read_failed(fy_err *err, int rc, const char *path, const batch *bt, bool direct)
{
    if (rc == FERRY_E_CORRUPT)
        return fy_seterr(err, rc,
                         "%s: the file ended early at byte %" PRIu64 " (truncated after it was opened?)",
                         path, bt->off);
    return fy_seterr(err, rc, "%s: %sread of %" PRIu64 " bytes at %" PRIu64 ": %s", path,
                     direct ? "O_DIRECT " : "", bt->len, bt->off, ferry_strerror(rc));
}

void xf_own_close(own *o)
{
    if (o->shard >= 0 && o->fd >= 0) fy_close(o->fd);
    o->shard = -1;
}
