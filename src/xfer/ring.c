/* SPDX-License-Identifier: Apache-2.0 */
/* ring.c - the ring pipeline: readers on the device's pool pread (or O_DIRECT-read)
 * contiguous file ranges into the cached pinned ring and queue asynchronous
 * copies on several streams; an event recorded after a buffer's copies gives
 * it back. One CPU copy and one DMA per byte; extra host memory is the ring.
 * A shard in tmpfs or ramfs is copied out of a mapping instead of read. */
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

/* ---- the ring pipeline ---- */

typedef struct job {
    ferry_device *d;
    const ferry_file *f;
    const plan *p;
    bool direct;
    int *dfd;   /* per shard O_DIRECT descriptors */
    void **win; /* per shard in RAM (tmpfs, ramfs): this load's own mapping of it, copied
                   from (else NULL: pread) */
    fy_stream **streams;
    uint32_t nstreams;
    sched q;
    atomic_int rc;
    /* ring state */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint32_t *free_list, nfree;
    uint32_t *inflight, nin, head; /* FIFO of buffers with copies queued */
    const ferry_load_opts *o;
    fy_progress prog;
    atomic_uint wid; /* worker number -> its stream */
} job;

static void job_fail(job *j, int rc)
{
    int zero = 0;
    atomic_compare_exchange_strong(&j->rc, &zero, rc);
}

/* Fail the job and wake every reader waiting on its condition, to see it. */
static void fail_and_wake(job *j, int rc)
{
    job_fail(j, rc);
    pthread_mutex_lock(&j->lock);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->lock);
}

/* A free buffer: one never used, else the oldest in flight once its copies are done. */
static int ring_acquire(job *j, uint32_t *out)
{
    pthread_mutex_lock(&j->lock);
    for (;;) {
        if (j->nfree) {
            *out = j->free_list[--j->nfree];
            pthread_mutex_unlock(&j->lock);
            return 0;
        }
        /* a buffer whose copies are already done, wherever it is in the queue
         * (streams finish out of order), before waiting on the oldest */
        for (uint32_t k = 0; k < j->nin; k++) {
            uint32_t pos = (j->head + k) % j->d->nring, b = j->inflight[pos];
            if (j->d->g->ops->event_query(j->d->g, j->d->ring[b].ev) == 1) {
                for (uint32_t m = k; m + 1 < j->nin; m++)
                    j->inflight[(j->head + m) % j->d->nring] = j->inflight[(j->head + m + 1) % j->d->nring];
                j->nin--;
                *out = b;
                pthread_mutex_unlock(&j->lock);
                return 0;
            }
        }
        if (j->nin) {
            uint32_t b = j->inflight[j->head];
            j->head = (j->head + 1) % j->d->nring;
            j->nin--;
            pthread_mutex_unlock(&j->lock);
            int rc = j->d->g->ops->event_sync(j->d->g, j->d->ring[b].ev);
            if (rc < 0) {
                /* b's copies may still be running (a failed sync says nothing
                 * about them): it is not free. Fail the job so no reader waits
                 * for it; run_ring syncs every stream before the ring goes. */
                fail_and_wake(j, rc);
                return rc;
            }
            *out = b;
            return 0;
        }
        /* every buffer is being filled by another thread */
        if (atomic_load(&j->rc) < 0) {
            pthread_mutex_unlock(&j->lock);
            return atomic_load(&j->rc);
        }
        pthread_cond_wait(&j->cv, &j->lock);
    }
}

static void ring_inflight(job *j, uint32_t b)
{
    pthread_mutex_lock(&j->lock);
    j->inflight[(j->head + j->nin) % j->d->nring] = b;
    j->nin++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->lock);
}

static void ring_return(job *j, uint32_t b)
{
    pthread_mutex_lock(&j->lock);
    j->free_list[j->nfree++] = b;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->lock);
}

/* Read batch bt into buf; *skew = where the batch's first byte landed. */
static int read_batch(job *j, const batch *bt, uint8_t *buf, uint64_t *skew, own *o)
{
    if (j->win[bt->shard]) {
        /* A file in RAM: pread's first pass over freshly written tmpfs pages
         * ran at half the copy limit on the H200 (24 of 45 GB/s; a second
         * pass at 45), while faulting a mapping of it in and copying runs
         * near a second pass's rate from the start. The mapping faults (SIGBUS) where the file no longer
         * reaches: its size is checked first, so a file truncated before
         * this batch is an error; one truncated while it is copied is not
         * guarded (README, "Truncated checkpoints"). */
        uint64_t now_size = 0;
        int rc = fy_fstat_size(j->f->shards[bt->shard].fd, &now_size);
        if (rc < 0) return rc;
        if (now_size < bt->off + bt->len) return FERRY_E_CORRUPT;
        *skew = 0;
        memcpy(buf, (const uint8_t *)j->win[bt->shard] + bt->off, (size_t)bt->len);
        return 0;
    }
    if (!j->direct) {
        *skew = 0;
        return fy_pread_full(xf_own_fd(j->f, o, bt->shard), buf, (size_t)bt->len, bt->off);
    }
    /* O_DIRECT: aligned offset and length; the file may end inside the last
     * block, so a short read is fine once it covers the batch. */
    uint64_t a = bt->off & ~(uint64_t)(ALIGN - 1);
    uint64_t e = page_round(bt->off + bt->len);
    *skew = bt->off - a;
    uint64_t got = 0;
    while (got < e - a) {
        ssize_t r = fy_pread_some(j->dfd[bt->shard], buf + got, (size_t)(e - a - got), a + got);
        if (r == -EINTR) continue;
        if (r < 0) return (int)r;
        if (r == 0) break;
        got += (uint64_t)r;
        if (got % ALIGN) break; /* end of file */
    }
    return got >= *skew + bt->len ? 0 : FERRY_E_CORRUPT;
}

/* The load's own mappings of shards in RAM are unmapped by the device's
 * pool after the load returns: the copies faulted every page in, and
 * unmapping 10 GB of page-table entries took about 0.6 s on the H200, which
 * the load need not wait for (its bytes are on the device). A plain munmap
 * held the mmap lock all that time, and the process's next load (its own
 * mmap, its faults behind that waiting writer) ran at 13-16 GB/s instead of
 * 45: the task empties the range in pieces first (fy_unmap_gently).
 * ferry_device_close runs what is still queued before it returns. The list
 * is plain malloc's (its task frees it). Where it cannot be queued, here. */
typedef struct unmap_list {
    xf_task task;
    int n;
    struct {
        void *p;
        uint64_t size;
    } v[];
} unmap_list;

static void unmapper(void *arg)
{
    unmap_list *u = arg;
    for (int i = 0; i < u->n; i++) fy_unmap_gently(u->v[i].p, u->v[i].size);
    free(u);
}

static void unmap_later(ferry_device *d, void **win, const ferry_file *f)
{
    int n = 0;
    for (int32_t s = 0; s < f->nshards; s++) n += win[s] != NULL;
    if (!n) return;
    unmap_list *u = malloc(sizeof *u + (size_t)n * sizeof u->v[0]);
    if (u) {
        u->n = 0;
        for (int32_t s = 0; s < f->nshards; s++)
            if (win[s]) u->v[u->n].p = win[s], u->v[u->n++].size = f->shards[s].size;
        u->task = (xf_task){.fn = unmapper, .arg = u};
        if (xf_pool_detach(&d->pool, &u->task)) return;
        free(u);
    }
    for (int32_t s = 0; s < f->nshards; s++) fy_unmap(win[s], f->shards[s].size);
}

/* A reader of one copy per buffer: buffers from the free list, or the oldest
 * in flight once its copies are done. */
static void buffer_reader(job *j, fy_stream *st, own *o)
{
    fy_gpu *g = j->d->g;
    long long k = -1, end = 0;
    for (;;) {
        if (atomic_load(&j->rc) < 0) break;
        if (xf_next_batch(&j->q, &k, &end) >= j->p->nbt) break;
        const batch *bt = &j->p->bt[k];
        uint32_t b = 0;
        int rc = ring_acquire(j, &b);
        if (rc < 0) {
            job_fail(j, rc);
            break;
        }
        uint8_t *buf = j->d->ring[b].p;
        uint64_t skew;
        rc = read_batch(j, bt, buf, &skew, o);
        if (rc < 0) {
            xf_read_failed(g->err, rc, j->f->shards[bt->shard].path, bt, j->direct);
            ring_return(j, b);
            job_fail(j, rc);
            break;
        }
        /* one copy per run of pieces that continue one another on the device
         * too (tensors laid out as in the file: ferry_load's block, PyTorch's
         * allocations carved in order), not one per tensor piece */
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0;) {
            uint64_t src, len;
            fy_dptr dst;
            xf_piece_run(j->p, bt, &q, &src, &len, &dst);
            rc = g->ops->copy_htod(g, dst, buf + skew + (src - bt->off), (size_t)len, st);
        }
        if (rc == 0) rc = g->ops->event_record(g, j->d->ring[b].ev, st);
        if (rc < 0) {
            /* copies may be queued: buf is free again only once the stream
             * is known to be done with it (else run_ring's final syncs wait) */
            if (g->ops->stream_sync(g, st) == 0) ring_return(j, b);
            job_fail(j, rc);
            break;
        }
        ring_inflight(j, b);
        fy_progress_add(&j->prog, bt->len);
    }
}

static void ring_worker(void *arg)
{
    job *j = arg;
    fy_gpu *g = j->d->g;
    uint32_t me = atomic_fetch_add(&j->wid, 1);
    fy_stream *st = j->streams[me % j->nstreams];
    int brc = g->ops->bind_thread(g);
    if (brc < 0) {
        job_fail(j, brc);
        return;
    }
    own o = {-1, -1};
    buffer_reader(j, st, &o);
    xf_own_close(&o);
    pthread_mutex_lock(&j->lock);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->lock);
}

int xf_run_ring(ferry_device *d, const ferry_file *f, const plan *p, bool direct, const ferry_load_opts *o,
                fy_stream **streams, uint32_t nstreams, uint32_t nthreads, uint32_t nbuf)
{
    const ferry_allocator *m = &d->ctx->mem;
    job j = {.d = d, .f = f, .p = p, .direct = direct, .streams = streams, .nstreams = nstreams, .o = o};
    int rc = 0;
    /* runs of up to 64 batches (256 MiB of the default ring) for buffered
     * reads; O_DIRECT reads leave the page cache alone and take one at a time */
    xf_sched_init(&j.q, p, direct ? 1 : 64, nthreads);
    atomic_init(&j.rc, 0);
    atomic_init(&j.wid, 0);
    pthread_mutex_init(&j.lock, NULL);
    fy_progress_init(&j.prog, o->progress, o->opaque, p->bytes);
    pthread_cond_init(&j.cv, NULL);
    j.free_list = fy_calloc(m, d->nring, sizeof(uint32_t));
    j.inflight = fy_calloc(m, d->nring, sizeof(uint32_t));
    j.dfd = fy_calloc(m, (size_t)f->nshards, sizeof(int));
    j.win = fy_calloc(m, (size_t)f->nshards, sizeof(void *));
    if (j.dfd) /* before any failure path: the cleanup closes what is >= 0 */
        for (int32_t s = 0; s < f->nshards; s++) j.dfd[s] = -1;
    xf_task *th = fy_calloc(m, nthreads, sizeof *th);
    if (!j.free_list || !j.inflight || !j.dfd || !j.win || !th) {
        rc = fy_seterr(&d->err, -ENOMEM,
                       "ferry_load: out of memory for the ring's lists (%u buffers, %u threads, %d shards)",
                       d->nring, nthreads, (int)f->nshards);
        goto out;
    }
    for (uint32_t i = 0; i < d->nring && i < nbuf; i++) j.free_list[j.nfree++] = i;
    for (int32_t s = 0; s < f->nshards && !direct && !(o->flags & FERRY_LOAD_PREAD); s++) {
        long type = 0;
        if (!f->shards[s].size) continue;
        if ((rc = fy_fs_info(f->shards[s].fd, NULL, &type)) < 0) {
            fy_seterr(&d->err, rc, "%s: statfs: %s", f->shards[s].path, ferry_strerror(rc));
            goto out;
        }
        if (type != FY_TMPFS_MAGIC && type != FY_RAMFS_MAGIC) continue;
        if ((rc = fy_map_ro(f->shards[s].fd, f->shards[s].size, &j.win[s])) < 0) {
            j.win[s] = NULL;
            fy_seterr(&d->err, rc, "%s: mmap: %s", f->shards[s].path, ferry_strerror(rc));
            goto out;
        }
    }
    if (direct) {
        for (int32_t s = 0; s < f->nshards; s++) {
            rc = fy_open_direct(f->shards[s].path, &j.dfd[s]);
            if (rc < 0) {
                j.dfd[s] = -1;
                fy_seterr(&d->err, rc, "%s: open with O_DIRECT: %s%s", f->shards[s].path, ferry_strerror(rc),
                          rc == -EINVAL ? " (this file system does not support O_DIRECT: use --path ring)"
                                        : "");
                goto out;
            }
        }
    }
    /* the readers run on the device's pool (pool.c) */
    xf_group grp;
    for (uint32_t t = 0; t < nthreads; t++) th[t] = (xf_task){.fn = ring_worker, .arg = &j};
    xf_pool_start(&d->pool, &grp, th, nthreads);
    xf_pool_wait(&d->pool, &grp);
    for (uint32_t s = 0; s < nstreams; s++) {
        int r = d->g->ops->stream_sync(d->g, streams[s]);
        if (r < 0) job_fail(&j, r);
    }
    rc = atomic_load(&j.rc);
out:
    if (j.dfd)
        for (int32_t s = 0; s < f->nshards; s++)
            if (j.dfd[s] >= 0) fy_close(j.dfd[s]);
    fy_free(m, j.free_list);
    fy_free(m, j.inflight);
    fy_free(m, j.dfd);
    if (j.win) unmap_later(d, j.win, f);
    fy_free(m, j.win);
    fy_free(m, th);
    pthread_mutex_destroy(&j.lock);
    fy_progress_destroy(&j.prog);
    pthread_cond_destroy(&j.cv);
    return rc;
}
