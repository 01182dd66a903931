/* SPDX-License-Identifier: Apache-2.0 */
/* host.c - the cpu device's route: readers (on the device's pool) pread
 * straight into host memory. */
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

/* cpu device: the destination is host memory, so threads pread straight
 * into it: one copy, no ring. */
typedef struct host_job {
    const ferry_file *f;
    const plan *p;
    sched q;
    atomic_int rc;
    fy_err *err;
    const ferry_load_opts *o;
    fy_progress prog;
} host_job;

static void host_worker(void *arg)
{
    host_job *j = arg;
    own o = {-1, -1};
    long long k = -1, end = 0;
    for (;;) {
        if (atomic_load(&j->rc) < 0) break;
        if (xf_next_batch(&j->q, &k, &end) >= j->p->nbt) break;
        const batch *bt = &j->p->bt[k];
        const shard *sh = &j->f->shards[bt->shard];
        int fd = xf_own_fd(j->f, &o, bt->shard), rc = 0;
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0; q++) {
            const piece *pc = &j->p->pc[q];
            rc = fy_pread_full(fd, (void *)(uintptr_t)pc->dst, (size_t)pc->len, pc->off);
        }
        if (rc < 0) {
            xf_read_failed(j->err, rc, sh->path, bt, false);
            int zero = 0;
            atomic_compare_exchange_strong(&j->rc, &zero, rc);
            break;
        }
        fy_progress_add(&j->prog, bt->len);
    }
    xf_own_close(&o);
}

int xf_run_host(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                uint32_t nthreads)
{
    host_job j = {.f = f, .p = p, .err = &d->err, .o = o};
    xf_sched_init(&j.q, p, 64, nthreads);
    atomic_init(&j.rc, 0);
    fy_progress_init(&j.prog, o->progress, o->opaque, p->bytes);
    /* the readers run on the device's pool (pool.c) */
    xf_task t[MAX_THREADS];
    xf_group g;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    for (uint32_t k = 0; k < nthreads; k++) t[k] = (xf_task){.fn = host_worker, .arg = &j};
    xf_pool_start(&d->pool, &g, t, nthreads);
    xf_pool_wait(&d->pool, &g);
    fy_progress_destroy(&j.prog);
    return atomic_load(&j.rc);
}
