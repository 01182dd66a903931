/* xfer.c - the transfer engine: brings a checkpoint's tensors to a device.
 *
 * ring/direct: reader threads pread (or O_DIRECT-read) contiguous file ranges
 * into a ring of pinned staging buffers and queue asynchronous host-to-device
 * copies on several streams; an event recorded after a buffer's copies returns
 * it to the ring. One CPU copy and one DMA per byte; extra host memory is the
 * ring. register: the read-only MAP_SHARED mapping itself is page-locked and
 * the device copies straight from the page cache. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../file_impl.h"
#include "../gpu/gpu.h"
#include "../io/io.h"
#include "xfer.h"

#define ALIGN 4096u
#define MAX_STREAMS 16
#define MAX_THREADS 64
#define REG_CHUNK (256ull << 20) /* largest copy from a registered mapping */

/* A registered shard mapping. held: registered by ferry_device_register_file;
 * users: loads copying from it right now. It is unregistered once neither. */
typedef struct reg_entry {
    const ferry_file *f;
    int32_t shard;
    void *base;
    uint64_t len;
    int users;
    bool held;
} reg_entry;

typedef struct ring_buf {
    uint8_t *p;
    fy_event *ev;
    int stream; /* stream its copies went to, -1 when free */
} ring_buf;

struct ferry_device {
    ferry_ctx *ctx;
    fy_gpu *g;
    pthread_mutex_t lock; /* guards regs */
    reg_entry *regs;
    int nregs, cap_regs;
    pthread_mutex_t ring_lock; /* one load at a time uses the cached ring */
    ring_buf *ring;
    uint8_t *ring_base; /* one pinned block holding every buffer */
    uint32_t nring;
    uint64_t ring_bytes;
};

struct ferry_loaded {
    ferry_device *dev;
    const ferry_file *f;
    fy_dptr *block;   /* one device block per shard (0 if the shard holds no bytes) */
    uint64_t *dptr;   /* per tensor */
};

FERRY_API const char *ferry_path_name(ferry_path p)
{
    static const char *const names[] = {"auto", "ring", "direct", "register", "cufile"};
    return (unsigned)p < FERRY_PATH_COUNT ? names[p] : "unknown";
}

FERRY_API int ferry_path_parse(const char *name)
{
    for (int p = 0; p < FERRY_PATH_COUNT; p++)
        if (name && strcmp(name, ferry_path_name((ferry_path)p)) == 0) return p;
    return -1;
}

/* ---- devices ---- */

FERRY_API int ferry_device_open(ferry_ctx *ctx, const char *spec, ferry_device **out)
{
    if (!ctx || !out) return FERRY_E_INVAL;
    *out = NULL;
    FY_RETURN_IF(!spec, &ctx->err, FERRY_E_INVAL, "ferry_device_open: no device given");
    ferry_device *d = fy_calloc(&ctx->mem, 1, sizeof *d);
    if (!d) return fy_seterr(&ctx->err, -ENOMEM, "out of memory");
    d->ctx = ctx;
    int rc = fy_gpu_open(spec, &ctx->mem, &ctx->err, &d->g);
    if (rc < 0) {
        fy_free(&ctx->mem, d);
        return rc;
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->ring_lock, NULL);
    *out = d;
    return 0;
}

static void ring_free(ferry_device *d)
{
    for (uint32_t i = 0; i < d->nring; i++)
        if (d->ring[i].ev) d->g->ops->event_free(d->g, d->ring[i].ev);
    if (d->ring_base) d->g->ops->host_free(d->g, d->ring_base);
    fy_free(&d->ctx->mem, d->ring);
    d->ring = NULL;
    d->ring_base = NULL;
    d->nring = 0;
    d->ring_bytes = 0;
}

FERRY_API void ferry_device_close(ferry_device *d)
{
    if (!d) return;
    for (int i = 0; i < d->nregs; i++) d->g->ops->host_unregister(d->g, d->regs[i].base);
    fy_free(&d->ctx->mem, d->regs);
    ring_free(d);
    fy_gpu_close(d->g);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->ring_lock);
    fy_free(&d->ctx->mem, d);
}

fy_gpu *fy_device_gpu(ferry_device *d) { return d ? d->g : NULL; }
ferry_ctx *fy_device_ctx(ferry_device *d) { return d ? d->ctx : NULL; }

FERRY_API const char *ferry_device_desc(const ferry_device *d) { return d ? d->g->desc : ""; }

FERRY_API int ferry_device_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (!d) return FERRY_E_INVAL;
    uint64_t f = 0, t = 0;
    int rc = d->g->ops->mem_info(d->g, &f, &t);
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return rc;
}

/* The ring: nbuf pinned buffers of bytes (+ slack for O_DIRECT alignment), kept
 * on the device between loads so repeated loads do not pay for pinning again.
 * One pinned block sliced into buffers: pinning is paid per call (24 separate
 * 4 MiB buffers took ~35 ms on the H200 host, a tenth of a 10 GB load). */
static int ring_get(ferry_device *d, uint32_t nbuf, uint64_t bytes)
{
    if (d->nring == nbuf && d->ring_bytes == bytes) return 0;
    ring_free(d);
    uint64_t stride = bytes + 2 * ALIGN;
    d->ring = fy_calloc(&d->ctx->mem, nbuf, sizeof *d->ring);
    if (!d->ring) return fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
    int rc = d->g->ops->host_alloc(d->g, (size_t)(stride * nbuf), (void **)&d->ring_base);
    if (rc < 0) {
        fy_free(&d->ctx->mem, d->ring);
        d->ring = NULL;
        return rc;
    }
    d->nring = nbuf;
    d->ring_bytes = bytes;
    for (uint32_t i = 0; i < nbuf; i++) {
        d->ring[i].stream = -1;
        d->ring[i].p = d->ring_base + stride * i;
        rc = d->g->ops->event_new(d->g, &d->ring[i].ev);
        if (rc < 0) {
            ring_free(d);
            return rc;
        }
    }
    return 0;
}

/* ---- registration ---- */

static reg_entry *reg_find(ferry_device *d, const ferry_file *f, int32_t s)
{
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f && d->regs[i].shard == s) return &d->regs[i];
    return NULL;
}

static uint64_t page_round(uint64_t n) { return (n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* Page-lock shard s's read-only shared mapping (never a private one: see
 * DESIGN.md §7, registering MAP_PRIVATE with READ_ONLY hung the driver).
 * A new entry starts neither held nor used. Under d->lock. */
static int reg_add(ferry_device *d, const ferry_file *f, int32_t s)
{
    if (reg_find(d, f, s) || f->shards[s].size == 0) return 0;
    if (d->nregs == d->cap_regs) {
        int cap = d->cap_regs ? d->cap_regs * 2 : 8;
        reg_entry *n = fy_realloc(&d->ctx->mem, d->regs, (size_t)cap * sizeof *n);
        if (!n) return fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
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

/* A mapping that no longer covers its file (truncated after open) would be
 * read past the end by the device: refuse before registering or copying. */
static int check_size(ferry_device *d, const ferry_file *f)
{
    for (int32_t s = 0; s < f->nshards; s++) {
        struct stat st;
        if (fstat(f->shards[s].fd, &st) == 0 && (uint64_t)st.st_size < f->shards[s].size)
            return fy_seterr(&d->ctx->err, FERRY_E_CORRUPT,
                             "%s: the file shrank from %" PRIu64 " to %lld bytes since it was opened", f->shards[s].path,
                             f->shards[s].size, (long long)st.st_size);
    }
    return 0;
}

/* Register every shard of f (those not registered yet), then mark them held
 * (hold) or in use by one more load. On failure nothing changes. */
static int reg_acquire(ferry_device *d, const ferry_file *f, bool hold)
{
    FY_RETURN_IF(f->private_map, &d->ctx->err, FERRY_E_UNSUPPORTED,
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

static void reg_unuse(ferry_device *d, const ferry_file *f)
{
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f && d->regs[i].users > 0) d->regs[i].users--;
    reg_release_unused(d, f);
    pthread_mutex_unlock(&d->lock);
}

FERRY_API int ferry_device_register_file(ferry_device *d, const ferry_file *f, uint64_t pinned_budget)
{
    if (!d || !f) return FERRY_E_INVAL;
    uint64_t need = 0;
    for (int32_t s = 0; s < f->nshards; s++) need += page_round(f->shards[s].size);
    FY_RETURN_IF(pinned_budget && need > pinned_budget, &d->ctx->err, FERRY_E_BUDGET,
                 "%s: registering %" PRIu64 " bytes exceeds the pinned budget of %" PRIu64 " bytes",
                 f->shards[0].path, need, pinned_budget);
    return reg_acquire(d, f, true);
}

FERRY_API void ferry_device_unregister_file(ferry_device *d, const ferry_file *f)
{
    if (!d || !f) return;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nregs; i++)
        if (d->regs[i].f == f) d->regs[i].held = false;
    reg_release_unused(d, f); /* a load still copying keeps its shards until it ends */
    pthread_mutex_unlock(&d->lock);
}

/* Registered with ferry_device_register_file (all shards that hold bytes)? */
static bool is_registered(ferry_device *d, const ferry_file *f)
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

/* ---- residency ---- */

FERRY_API double ferry_file_resident(const ferry_file *f)
{
    if (!f) return -1.0;
    if (f->total == 0) return 1.0;
    uint64_t in = 0, all = 0;
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), per = 1u << 18; /* pages per mincore call */
    unsigned char *vec = fy_malloc(&f->ctx->mem, per);
    if (!vec) return -1.0; /* unknown */
    for (int32_t s = 0; s < f->nshards; s++) {
        const shard *sh = &f->shards[s];
        if (!sh->map) continue;
        for (uint64_t off = 0; off < sh->size; off += per * pg) {
            uint64_t len = sh->size - off;
            if (len > per * pg) len = per * pg;
            if (mincore((char *)sh->map + off, (size_t)len, vec) < 0) continue;
            uint64_t pages = (len + pg - 1) / pg;
            for (uint64_t p = 0; p < pages; p++) in += vec[p] & 1;
            all += pages;
        }
    }
    fy_free(&f->ctx->mem, vec);
    return all ? (double)in / (double)all : 1.0;
}

/* auto's estimate: mincore on 4096 pages spread evenly over the data. A
 * mincore of every page of a 10 GB file (2.5 M page-cache lookups) took
 * ~0.12 s on the H200 host, a third of a hot load; a sample decides as well. */
static double resident_sampled(const ferry_file *f)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t pages = 0;
    for (int32_t s = 0; s < f->nshards; s++)
        if (f->shards[s].map) pages += (f->shards[s].size + pg - 1) / pg;
    if (pages == 0) return 1.0;
    const uint64_t want = pages < 4096 ? pages : 4096;
    uint64_t in = 0, seen = 0;
    for (uint64_t k = 0; k < want; k++) {
        uint64_t page = k * pages / want; /* global page index -> shard */
        for (int32_t s = 0; s < f->nshards; s++) {
            const shard *sh = &f->shards[s];
            if (!sh->map) continue;
            uint64_t np = (sh->size + pg - 1) / pg;
            if (page >= np) {
                page -= np;
                continue;
            }
            unsigned char v = 0;
            if (mincore((char *)sh->map + page * pg, 1, &v) == 0) {
                in += v & 1;
                seen++;
            }
            break;
        }
    }
    return seen ? (double)in / (double)seen : -1.0;
}

/* ---- the plan: file ranges (batches) and the copies out of them ---- */

typedef struct piece {
    uint64_t off, len; /* in the file */
    fy_dptr dst;
} piece;

typedef struct batch {
    int32_t shard;
    uint64_t off, len;
    int64_t first, count; /* pieces */
} batch;

typedef struct plan {
    piece *pc;
    int64_t npc;
    batch *bt;
    int64_t nbt;
    uint64_t bytes;
} plan;

typedef struct item {
    int64_t t;
    fy_dptr dst;
} item;

static int cmp_item(const void *a, const void *b, void *arg)
{
    const ferry_file *f = arg;
    const fy_tensor *x = &f->tb.t[((const item *)a)->t], *y = &f->tb.t[((const item *)b)->t];
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void plan_free(const ferry_allocator *m, plan *p)
{
    fy_free(m, p->pc);
    fy_free(m, p->bt);
    memset(p, 0, sizeof *p);
}

/* Tensors in file order, cut into pieces of at most cap bytes, grouped into
 * batches: contiguous file ranges of at most cap bytes in one shard. */
static int plan_build(const ferry_allocator *m, const ferry_file *f, item *it, int64_t n, uint64_t cap, plan *p)
{
    memset(p, 0, sizeof *p);
    qsort_r(it, (size_t)n, sizeof *it, cmp_item, (void *)f);
    int64_t maxpc = 0;
    for (int64_t i = 0; i < n; i++) maxpc += (int64_t)((f->tb.t[it[i].t].nbytes + cap - 1) / cap);
    p->pc = fy_calloc(m, (size_t)(maxpc ? maxpc : 1), sizeof *p->pc);
    p->bt = fy_calloc(m, (size_t)(maxpc ? maxpc : 1), sizeof *p->bt);
    if (!p->pc || !p->bt) {
        plan_free(m, p);
        return -ENOMEM;
    }
    batch *cur = NULL;
    for (int64_t i = 0; i < n; i++) {
        const fy_tensor *t = &f->tb.t[it[i].t];
        for (uint64_t o = 0; o < t->nbytes; o += cap) {
            uint64_t len = t->nbytes - o < cap ? t->nbytes - o : cap;
            piece *pc = &p->pc[p->npc];
            pc->off = t->offset + o;
            pc->len = len;
            pc->dst = it[i].dst + o;
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

/* ---- reader threads' shared schedule ---- */

/* Buffered reads claim runs of consecutive batches, shorter as the work runs
 * out (guided scheduling: the last claims are single batches, so no thread is
 * left with a long tail), and each reader reads through a descriptor of its
 * own (own_fd). Together they let the kernel's readahead see each thread's
 * sequential run: when 12 threads' reads interleave on one descriptor, a cold
 * load fills the page cache with single-page folios, and the first read of
 * those afterwards (the next hot load) runs at half speed while the kernel
 * activates every page (bench/RESULTS.md, third GPU session). */
typedef struct sched {
    const plan *p;
    atomic_llong next;
    long long run; /* most consecutive batches one claim takes */
    uint32_t nthreads;
} sched;

static void sched_init(sched *q, const plan *p, long long run, uint32_t nthreads)
{
    q->p = p;
    atomic_init(&q->next, 0);
    q->run = run;
    q->nthreads = nthreads ? nthreads : 1;
}

/* The next batch for a reader (p->nbt when none is left); *k and *end: the
 * reader's current run, -1 and 0 to begin. */
static long long next_batch(sched *q, long long *k, long long *end)
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

/* A reader's own descriptor: one at a time, for the shard it reads now
 * (batches come in shard order, so it rarely changes; keeping one per shard
 * could hold threads x shards descriptors open in the host process). */
typedef struct own {
    int32_t shard; /* -1: none open */
    int fd;
} own;

static int own_fd(const ferry_file *f, own *o, int32_t s)
{
    if (o->shard != s) {
        if (o->shard >= 0 && o->fd >= 0) close(o->fd);
        o->shard = s;
        o->fd = fy_reopen_ro(f->shards[s].fd, f->shards[s].path); /* < 0: use the shared one */
    }
    return o->fd >= 0 ? o->fd : f->shards[s].fd;
}

static void own_close(own *o)
{
    if (o->shard >= 0 && o->fd >= 0) close(o->fd);
    o->shard = -1;
}

/* ---- the ring pipeline ---- */

typedef struct job {
    ferry_device *d;
    const ferry_file *f;
    const plan *p;
    bool direct;
    int *dfd; /* per shard O_DIRECT descriptors */
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
                pthread_mutex_lock(&j->lock);
                j->free_list[j->nfree++] = b;
                pthread_cond_broadcast(&j->cv);
                pthread_mutex_unlock(&j->lock);
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
    if (!j->direct) {
        *skew = 0;
        return fy_pread_full(own_fd(j->f, o, bt->shard), buf, (size_t)bt->len, bt->off);
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

static void *ring_worker(void *arg)
{
    job *j = arg;
    fy_gpu *g = j->d->g;
    uint32_t me = atomic_fetch_add(&j->wid, 1);
    fy_stream *st = j->streams[me % j->nstreams];
    int brc = g->ops->bind_thread(g);
    if (brc < 0) {
        job_fail(j, brc);
        return NULL;
    }
    own o = {-1, -1};
    long long k = -1, end = 0;
    for (;;) {
        if (atomic_load(&j->rc) < 0) break;
        if (next_batch(&j->q, &k, &end) >= j->p->nbt) break;
        const batch *bt = &j->p->bt[k];
        uint32_t b = 0;
        int rc = ring_acquire(j, &b);
        if (rc < 0) { job_fail(j, rc); break; }
        uint8_t *buf = j->d->ring[b].p;
        uint64_t skew;
        rc = read_batch(j, bt, buf, &skew, &o);
        if (rc < 0) {
            const char *path = j->f->shards[bt->shard].path;
            if (rc == FERRY_E_CORRUPT)
                fy_seterr(g->err, rc, "%s: the file ended early at byte %" PRIu64 " (truncated after it was opened?)",
                          path, bt->off);
            else
                fy_seterr(g->err, rc, "%s: %sread of %" PRIu64 " bytes at %" PRIu64 ": %s", path,
                          j->direct ? "O_DIRECT " : "", bt->len, bt->off, ferry_strerror(rc));
            ring_return(j, b);
            job_fail(j, rc);
            break;
        }
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0; q++) {
            const piece *pc = &j->p->pc[q];
            rc = g->ops->copy_htod(g, pc->dst, buf + skew + (pc->off - bt->off), (size_t)pc->len, st);
        }
        if (rc == 0) rc = g->ops->event_record(g, j->d->ring[b].ev, st);
        if (rc < 0) {
            /* copies may be queued: wait for the stream before reusing buf */
            g->ops->stream_sync(g, st);
            ring_return(j, b);
            job_fail(j, rc);
            break;
        }
        ring_inflight(j, b);
        fy_progress_add(&j->prog, bt->len);
    }
    own_close(&o);
    pthread_mutex_lock(&j->lock);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

static int run_ring(ferry_device *d, const ferry_file *f, const plan *p, bool direct, const ferry_load_opts *o,
                    fy_stream **streams, uint32_t nstreams, uint32_t nthreads)
{
    const ferry_allocator *m = &d->ctx->mem;
    job j = {.d = d, .f = f, .p = p, .direct = direct, .streams = streams, .nstreams = nstreams, .o = o};
    int rc = 0;
    /* runs of up to 64 batches (256 MiB of the default ring) for buffered
     * reads; O_DIRECT reads leave the page cache alone and take one at a time */
    sched_init(&j.q, p, direct ? 1 : 64, nthreads);
    atomic_init(&j.rc, 0);
    atomic_init(&j.wid, 0);
    pthread_mutex_init(&j.lock, NULL);
    fy_progress_init(&j.prog, o->progress, o->opaque, p->bytes);
    pthread_cond_init(&j.cv, NULL);
    j.free_list = fy_calloc(m, d->nring, sizeof(uint32_t));
    j.inflight = fy_calloc(m, d->nring, sizeof(uint32_t));
    j.dfd = fy_calloc(m, (size_t)f->nshards, sizeof(int));
    if (j.dfd) /* before any failure path: the cleanup closes what is >= 0 */
        for (int32_t s = 0; s < f->nshards; s++) j.dfd[s] = -1;
    pthread_t *th = fy_calloc(m, nthreads, sizeof(pthread_t));
    if (!j.free_list || !j.inflight || !j.dfd || !th) {
        rc = fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < d->nring; i++) j.free_list[j.nfree++] = i;
    if (direct) {
        for (int32_t s = 0; s < f->nshards; s++) {
            j.dfd[s] = open(f->shards[s].path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (j.dfd[s] < 0) {
                rc = -errno;
                fy_seterr(&d->ctx->err, rc, "%s: open with O_DIRECT: %s%s", f->shards[s].path, ferry_strerror(rc),
                          rc == -EINVAL ? " (this file system does not support O_DIRECT: use --path ring)" : "");
                goto out;
            }
        }
    }
    uint32_t started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, ring_worker, &j) != 0) break;
    if (started == 0) ring_worker(&j);
    for (uint32_t t = 0; t < started; t++) pthread_join(th[t], NULL);
    for (uint32_t s = 0; s < nstreams; s++) {
        int r = d->g->ops->stream_sync(d->g, streams[s]);
        if (r < 0) job_fail(&j, r);
    }
    rc = atomic_load(&j.rc);
out:
    if (j.dfd)
        for (int32_t s = 0; s < f->nshards; s++)
            if (j.dfd[s] >= 0) close(j.dfd[s]);
    fy_free(m, j.free_list);
    fy_free(m, j.inflight);
    fy_free(m, j.dfd);
    fy_free(m, th);
    pthread_mutex_destroy(&j.lock);
    fy_progress_destroy(&j.prog);
    pthread_cond_destroy(&j.cv);
    return rc;
}

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

static void *host_worker(void *arg)
{
    host_job *j = arg;
    own o = {-1, -1};
    long long k = -1, end = 0;
    for (;;) {
        if (atomic_load(&j->rc) < 0) break;
        if (next_batch(&j->q, &k, &end) >= j->p->nbt) break;
        const batch *bt = &j->p->bt[k];
        const shard *sh = &j->f->shards[bt->shard];
        int fd = own_fd(j->f, &o, bt->shard), rc = 0;
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0; q++) {
            const piece *pc = &j->p->pc[q];
            rc = fy_pread_full(fd, (void *)(uintptr_t)pc->dst, (size_t)pc->len, pc->off);
        }
        if (rc < 0) {
            if (rc == FERRY_E_CORRUPT)
                fy_seterr(j->err, rc, "%s: the file ended early at byte %" PRIu64 " (truncated after it was opened?)",
                          sh->path, bt->off);
            else
                fy_seterr(j->err, rc, "%s: read of %" PRIu64 " bytes at %" PRIu64 ": %s", sh->path, bt->len, bt->off,
                          ferry_strerror(rc));
            int zero = 0;
            atomic_compare_exchange_strong(&j->rc, &zero, rc);
            break;
        }
        fy_progress_add(&j->prog, bt->len);
    }
    own_close(&o);
    return NULL;
}

static int run_host(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o, uint32_t nthreads)
{
    host_job j = {.f = f, .p = p, .err = &d->ctx->err, .o = o};
    sched_init(&j.q, p, 64, nthreads);
    atomic_init(&j.rc, 0);
    fy_progress_init(&j.prog, o->progress, o->opaque, p->bytes);
    pthread_t th[MAX_THREADS];
    uint32_t started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, host_worker, &j) != 0) break;
    if (started == 0) host_worker(&j);
    for (uint32_t t = 0; t < started; t++) pthread_join(th[t], NULL);
    fy_progress_destroy(&j.prog);
    return atomic_load(&j.rc);
}

/* Queue a copy of len bytes between host and dev in pieces of at most
 * REG_CHUNK, round-robin over streams st[0..nst-1] from *next on: the host
 * memory must be page-locked for the copies to run asynchronously. */
static int copy_spread(fy_gpu *g, bool to_device, fy_dptr dev, void *host, uint64_t len, fy_stream **st, uint32_t nst,
                       uint32_t *next)
{
    int rc = 0;
    for (uint64_t off = 0; off < len && rc == 0; off += REG_CHUNK) {
        size_t n = (size_t)(len - off < REG_CHUNK ? len - off : REG_CHUNK);
        rc = to_device ? g->ops->copy_htod(g, dev + off, (uint8_t *)host + off, n, st[*next])
                       : g->ops->copy_dtoh(g, (uint8_t *)host + off, dev + off, n, st[*next]);
        *next = (*next + 1) % nst;
    }
    return rc;
}

/* register: copies straight out of the page-locked mapping, round-robin over streams. */
static int run_register(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                        fy_stream **streams, uint32_t nstreams)
{
    fy_gpu *g = d->g;
    /* use the registration if there is one, else register for this load only;
     * either way the shards stay registered until this load is done with them */
    int rc = 0;
    if (o->pinned_budget && !is_registered(d, f)) {
        uint64_t need = 0;
        for (int32_t k = 0; k < f->nshards; k++) need += page_round(f->shards[k].size);
        FY_RETURN_IF(need > o->pinned_budget, &d->ctx->err, FERRY_E_BUDGET,
                     "%s: registering %" PRIu64 " bytes exceeds the pinned budget of %" PRIu64 " bytes",
                     f->shards[0].path, need, o->pinned_budget);
    }
    if ((rc = reg_acquire(d, f, false)) < 0) return rc;
    if ((rc = g->ops->bind_thread(g)) < 0) goto out;
    uint64_t done = 0;
    uint32_t s = 0;
    /* pieces carry file offsets; find each piece's shard through its batch */
    for (int64_t b = 0; b < p->nbt && rc == 0; b++) {
        const batch *bt = &p->bt[b];
        const uint8_t *base = f->shards[bt->shard].map;
        for (int64_t q = bt->first; q < bt->first + bt->count && rc == 0;) {
            /* consecutive tensors that are also adjacent on the device (ferry_load's
             * blocks mirror the file) go in one copy */
            const piece *pc = &p->pc[q];
            uint64_t src = pc->off, len = pc->len;
            fy_dptr dst = pc->dst;
            for (q++; q < bt->first + bt->count && p->pc[q].dst == dst + len && p->pc[q].off == src + len; q++)
                len += p->pc[q].len;
            rc = copy_spread(g, true, dst, (void *)(uintptr_t)(base + src), len, streams, nstreams, &s);
            if (rc == 0) done += len;
        }
        if (o->progress && rc == 0) o->progress(o->opaque, done, p->bytes);
    }
    for (uint32_t k = 0; k < nstreams; k++) {
        int r = g->ops->stream_sync(g, streams[k]);
        if (rc == 0 && r < 0) rc = r;
    }
out:
    reg_unuse(d, f);
    return rc;
}

/* ---- choosing a path ---- */

static int choose_path(ferry_device *d, const ferry_file *f, const ferry_load_opts *o, ferry_load_stats *st)
{
    ferry_path want = o->path;
    st->resident = -1; /* measured only when auto needs it: mincore over 10 GB is not free */
    if (want == FERRY_PATH_CUFILE) {
        char why[256];
        FY_RETURN_IF(strcmp(d->g->ops->name, "cuda") != 0, &d->ctx->err, FERRY_E_NODEV,
                     "cufile: GPUDirect Storage needs a cuda device, not %s", d->g->desc);
        if (fy_cufile_probe(f->shards[0].fd, why, sizeof why) < 0)
            return fy_seterr(&d->ctx->err, FERRY_E_NODEV, "cufile unavailable: %s (use --path auto)", why);
        return fy_seterr(&d->ctx->err, FERRY_E_UNSUPPORTED,
                         "cufile: the probe succeeded (%s), but ferry has no cuFile transfer yet (use --path auto)", why);
    }
    if (d->g->host_visible) {
        FY_RETURN_IF(want != FERRY_PATH_AUTO && want != FERRY_PATH_RING, &d->ctx->err, FERRY_E_UNSUPPORTED,
                     "the cpu device reads straight into host memory: use --path ring or auto, not %s",
                     ferry_path_name(want));
        snprintf(st->why, sizeof st->why, "host memory: threaded pread straight into the destination");
        return FERRY_PATH_RING;
    }
    if (want != FERRY_PATH_AUTO) {
        snprintf(st->why, sizeof st->why, "asked for");
        return (int)want;
    }
    if (!f->private_map && is_registered(d, f)) {
        snprintf(st->why, sizeof st->why, "the file is registered with the device");
        return FERRY_PATH_REGISTER;
    }
    st->resident = resident_sampled(f);
    if (st->resident < 0) {
        snprintf(st->why, sizeof st->why, "page-cache residency unknown (mincore failed): ring");
        return FERRY_PATH_RING;
    }
    if (st->resident >= 0.5) {
        snprintf(st->why, sizeof st->why,
                 "%.0f%% of the data is in the page cache (sampled; cufile is probed only on request)",
                 st->resident * 100);
        return FERRY_PATH_RING;
    }
    snprintf(st->why, sizeof st->why,
             "%.0f%% of the data is in the page cache (sampled): O_DIRECT reads (cufile is probed only on request)",
             st->resident * 100);
    return FERRY_PATH_DIRECT;
}

/* Threads and ring size from load options, with the defaults measured on the
 * H200 host (bench/RESULTS.md, ring sweep: 12 threads x 4 MiB buffers beat 8
 * and 16 threads and 8-32 MiB buffers), within ferry's limits. Loads and the
 * spill pipeline ask the same way, so they share one pinned ring. */
static int ring_geometry(ferry_device *d, const ferry_load_opts *o, uint32_t *nthreads, uint32_t *nbuf,
                         uint64_t *bufsz)
{
    uint32_t cpus = fy_ncpu();
    *nthreads = o->threads ? o->threads : (cpus < 12 ? cpus : 12);
    if (*nthreads > MAX_THREADS) *nthreads = MAX_THREADS;
    FY_RETURN_IF(o->ring_buffer_bytes > (4ull << 30) || o->ring_buffers > 4096, &d->ctx->err, FERRY_E_INVAL,
                 "ferry_load: a ring of %u buffers of %llu bytes is outside the limits (4096 buffers, 4 GiB each)",
                 o->ring_buffers, (unsigned long long)o->ring_buffer_bytes);
    *bufsz = o->ring_buffer_bytes ? page_round(o->ring_buffer_bytes) : 4ull << 20;
    *nbuf = o->ring_buffers ? o->ring_buffers : 2 * *nthreads;
    if (*nbuf < 2) *nbuf = 2;
    FY_RETURN_IF((uint64_t)*nbuf * *bufsz > (64ull << 30), &d->ctx->err, FERRY_E_LIMIT,
                 "ferry_load: a ring of %u x %llu bytes would pin more than 64 GiB", *nbuf,
                 (unsigned long long)*bufsz);
    return 0;
}

static int load_items(ferry_device *d, const ferry_file *f, item *it, int64_t n, const ferry_load_opts *opts,
                      ferry_load_stats *stats)
{
    ferry_load_opts o = {0};
    ferry_load_stats st = {0};
    const ferry_allocator *m = &d->ctx->mem;
    fy_err *err = &d->ctx->err;
    if (opts) {
        FY_RETURN_IF(opts->size < sizeof(uint32_t) || opts->size > sizeof o, err, FERRY_E_INVAL,
                     "ferry_load: opts->size is %u, expected %zu", opts->size, sizeof o);
        memcpy(&o, opts, opts->size);
    }
    FY_RETURN_IF((unsigned)o.path >= FERRY_PATH_COUNT, err, FERRY_E_INVAL, "ferry_load: unknown path %d", (int)o.path);
    uint32_t nthreads, nbuf;
    uint64_t bufsz;
    FY_TRY(ring_geometry(d, &o, &nthreads, &nbuf, &bufsz));
    uint32_t nstreams = o.streams ? o.streams : 4;
    if (nstreams < 2) nstreams = 2;
    if (nstreams > MAX_STREAMS) nstreams = MAX_STREAMS;

    double t0 = fy_now();
    int rc = choose_path(d, f, &o, &st);
    if (rc < 0) return rc;
    st.path = (ferry_path)rc;
    plan p;
    rc = plan_build(m, f, it, n, st.path == FERRY_PATH_REGISTER ? UINT64_MAX / 2 : bufsz, &p);
    if (rc < 0) return fy_seterr(err, rc, "out of memory");
    fy_stream *streams[MAX_STREAMS] = {0};
    rc = d->g->ops->bind_thread(d->g);
    for (uint32_t s = 0; s < nstreams && rc == 0; s++) rc = d->g->ops->stream_new(d->g, &streams[s]);
    if (rc == 0) {
        if (d->g->host_visible) {
            rc = run_host(d, f, &p, &o, nthreads);
        } else if (st.path == FERRY_PATH_REGISTER) {
            rc = run_register(d, f, &p, &o, streams, nstreams);
        } else {
            pthread_mutex_lock(&d->ring_lock);
            rc = ring_get(d, nbuf, bufsz);
            if (rc == 0) rc = run_ring(d, f, &p, st.path == FERRY_PATH_DIRECT, &o, streams, nstreams, nthreads);
            if (rc == -EINVAL && st.path == FERRY_PATH_DIRECT && o.path == FERRY_PATH_AUTO) {
                /* auto chose O_DIRECT on a file system without it (tmpfs, some FUSE): buffered reads */
                st.path = FERRY_PATH_RING;
                snprintf(st.why, sizeof st.why, "cold, but the file system refuses O_DIRECT: buffered reads");
                rc = run_ring(d, f, &p, false, &o, streams, nstreams, nthreads);
            }
            pthread_mutex_unlock(&d->ring_lock);
        }
    }
    for (uint32_t s = 0; s < nstreams; s++)
        if (streams[s]) d->g->ops->stream_free(d->g, streams[s]);
    st.bytes = p.bytes;
    st.seconds = fy_now() - t0;
    plan_free(m, &p);
    if (stats) *stats = st;
    return rc;
}

FERRY_API int ferry_load_into(ferry_device *d, const ferry_file *f, const int64_t *idx, const uint64_t *dptrs,
                              int64_t n, const ferry_load_opts *opts, ferry_load_stats *stats)
{
    if (!d || !f || n < 0 || (n && (!idx || !dptrs))) return FERRY_E_INVAL;
    item *it = fy_calloc(&d->ctx->mem, (size_t)(n ? n : 1), sizeof *it);
    if (!it) return fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
    for (int64_t k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= f->tb.n) {
            fy_free(&d->ctx->mem, it);
            return fy_seterr(&d->ctx->err, FERRY_E_INVAL, "ferry_load_into: tensor index %" PRId64 " out of range",
                             idx[k]);
        }
        it[k].t = idx[k];
        it[k].dst = dptrs[k];
    }
    int rc = load_items(d, f, it, n, opts, stats);
    fy_free(&d->ctx->mem, it);
    return rc;
}

FERRY_API int ferry_load(ferry_device *d, const ferry_file *f, const ferry_load_opts *opts, ferry_loaded **out,
                         ferry_load_stats *stats)
{
    if (!d || !f || !out) return FERRY_E_INVAL;
    *out = NULL;
    const ferry_allocator *m = &d->ctx->mem;
    ferry_loaded *l = fy_calloc(m, 1, sizeof *l);
    item *it = fy_calloc(m, (size_t)(f->tb.n ? f->tb.n : 1), sizeof *it);
    int rc = 0;
    if (l) l->dev = d, l->f = f;
    if (!l || !it || !(l->block = fy_calloc(m, (size_t)f->nshards, sizeof(fy_dptr))) ||
        !(l->dptr = fy_calloc(m, (size_t)(f->tb.n ? f->tb.n : 1), sizeof(uint64_t)))) {
        rc = fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
        goto fail;
    }
    /* one block per shard spanning its tensors, laid out as in the file */
    rc = d->g->ops->bind_thread(d->g);
    for (int32_t s = 0; s < f->nshards && rc == 0; s++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int64_t i = 0; i < f->tb.n; i++) {
            const fy_tensor *t = &f->tb.t[i];
            if (t->shard != s || t->nbytes == 0) continue;
            if (t->offset < lo) lo = t->offset;
            if (t->offset + t->nbytes > hi) hi = t->offset + t->nbytes;
        }
        if (hi == 0) continue;
        rc = d->g->ops->mem_alloc(d->g, (size_t)(hi - lo), &l->block[s]);
        if (rc < 0) break;
        for (int64_t i = 0; i < f->tb.n; i++)
            if (f->tb.t[i].shard == s) l->dptr[i] = l->block[s] + (f->tb.t[i].offset - lo);
    }
    if (rc < 0) goto fail;
    for (int64_t i = 0; i < f->tb.n; i++) {
        it[i].t = i;
        it[i].dst = l->dptr[i];
    }
    rc = load_items(d, f, it, f->tb.n, opts, stats);
    if (rc < 0) goto fail;
    fy_free(m, it);
    *out = l;
    return 0;
fail:
    fy_free(m, it);
    ferry_loaded_free(l);
    return rc;
}

FERRY_API uint64_t ferry_loaded_ptr(const ferry_loaded *l, int64_t i)
{
    if (!l || i < 0 || i >= l->f->tb.n) return 0;
    return l->dptr[i];
}

FERRY_API int ferry_loaded_read(ferry_loaded *l, int64_t i, void *buf)
{
    if (!l || !buf || i < 0 || i >= l->f->tb.n) return FERRY_E_INVAL;
    fy_gpu *g = l->dev->g;
    uint64_t n = l->f->tb.t[i].nbytes;
    if (n == 0) return 0;
    fy_stream *s = NULL;
    int rc = g->ops->bind_thread(g);
    if (rc == 0) rc = g->ops->stream_new(g, &s);
    if (rc < 0) return rc;
    rc = g->ops->copy_dtoh(g, buf, l->dptr[i], (size_t)n, s);
    int r2 = g->ops->stream_sync(g, s);
    g->ops->stream_free(g, s);
    return rc < 0 ? rc : r2;
}

FERRY_API void ferry_loaded_free(ferry_loaded *l)
{
    if (!l) return;
    const ferry_allocator *m = &l->dev->ctx->mem;
    if (l->block) {
        l->dev->g->ops->bind_thread(l->dev->g);
        for (int32_t s = 0; s < l->f->nshards; s++)
            if (l->block[s]) l->dev->g->ops->mem_free(l->dev->g, l->block[s]);
    }
    fy_free(m, l->block);
    fy_free(m, l->dptr);
    fy_free(m, l);
}

FERRY_API int ferry_device_copy_rate(ferry_device *d, uint64_t bytes, double *htod, double *dtoh)
{
    if (!d) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    const size_t chunk = 256u << 20;
    void *h = NULL;
    fy_dptr dp = 0;
    fy_stream *s[2] = {0};
    int rc = g->ops->bind_thread(g);
    if (rc == 0) rc = g->ops->host_alloc(g, chunk, &h);
    if (rc == 0) rc = g->ops->mem_alloc(g, chunk, &dp);
    for (int k = 0; k < 2 && rc == 0; k++) rc = g->ops->stream_new(g, &s[k]);
    if (rc == 0) memset(h, 0x5A, chunk);
    for (int dir = 0; dir < 2 && rc == 0; dir++) {
        /* one untimed copy per stream first: the first copy pays for setup */
        for (int k = 0; k < 2 && rc == 0; k++) /* each stream its own half: no two copies write one byte */
            rc = dir == 0 ? g->ops->copy_htod(g, dp + (fy_dptr)(k * (chunk / 2)), (char *)h + k * (chunk / 2), chunk / 2, s[k])
                          : g->ops->copy_dtoh(g, (char *)h + k * (chunk / 2), dp + (fy_dptr)(k * (chunk / 2)), chunk / 2, s[k]);
        for (int k = 0; k < 2 && rc == 0; k++) rc = g->ops->stream_sync(g, s[k]);
        double t0 = fy_now();
        uint64_t moved = 0;
        for (int k = 0; moved < bytes && rc == 0; k ^= 1) {
            /* two halves on two streams, like the ring's copies */
            size_t half = chunk / 2;
            rc = dir == 0 ? g->ops->copy_htod(g, dp + (fy_dptr)(k * half), (char *)h + k * half, half, s[k])
                          : g->ops->copy_dtoh(g, (char *)h + k * half, dp + (fy_dptr)(k * half), half, s[k]);
            moved += half;
        }
        for (int k = 0; k < 2; k++) {
            int r = g->ops->stream_sync(g, s[k]);
            if (rc == 0) rc = r;
        }
        double gbps = (double)moved / (fy_now() - t0) / 1e9;
        if (dir == 0 && htod) *htod = gbps;
        if (dir == 1 && dtoh) *dtoh = gbps;
    }
    for (int k = 0; k < 2; k++)
        if (s[k]) g->ops->stream_free(g, s[k]);
    if (dp) g->ops->mem_free(g, dp);
    if (h) g->ops->host_free(g, h);
    return rc;
}

/* ---- moves for the residency store ---- */

/* A stand-in ferry_file whose one "shard" is fd, and whose tensors are the
 * ranges: the ring pipeline then reads any file (the spill file) unchanged. */
int fy_xfer_fd_to_device(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, ferry_load_stats *st)
{
    if (!d || fd < 0 || n < 0 || (n && !r)) return FERRY_E_INVAL;
    if (n == 0) return 0;
    const ferry_allocator *m = &d->ctx->mem;
    shard sh = {.path = (char *)(uintptr_t)path, .fd = fd, .size = 0, .map = NULL};
    ferry_file f = {.ctx = d->ctx, .fmt = FERRY_FORMAT_UNKNOWN, .nshards = 1, .shards = &sh};
    f.tb.mem = m;
    f.tb.t = fy_calloc(m, (size_t)n, sizeof *f.tb.t);
    item *it = fy_calloc(m, (size_t)n, sizeof *it);
    int rc = 0;
    if (!f.tb.t || !it) {
        rc = fy_seterr(&d->ctx->err, -ENOMEM, "out of memory");
    } else {
        f.tb.n = n;
        for (int64_t k = 0; k < n; k++) {
            f.tb.t[k].name = (char *)"";
            f.tb.t[k].offset = r[k].off;
            f.tb.t[k].nbytes = r[k].len;
            it[k].t = k;
            it[k].dst = r[k].dev;
        }
        ferry_load_opts lo = {0};
        if (o) memcpy(&lo, o, o->size && o->size <= sizeof lo ? o->size : 0);
        lo.size = sizeof lo;
        lo.path = FERRY_PATH_RING;
        rc = load_items(d, &f, it, n, &lo, st);
    }
    fy_free(m, f.tb.t);
    fy_free(m, it);
    return rc;
}

int fy_xfer_device_to_fd(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o)
{
    if (!d || fd < 0 || n < 0 || (n && !r)) return FERRY_E_INVAL;
    if (n == 0) return 0;
    fy_gpu *g = d->g;
    const ferry_load_opts none = {.size = sizeof none};
    uint32_t nthreads, nbuf;
    uint64_t bufsz;
    FY_TRY(ring_geometry(d, o ? o : &none, &nthreads, &nbuf, &bufsz));
    fy_stream *st[4] = {0};
    int rc = g->ops->bind_thread(g);
    for (int k = 0; k < 4 && rc == 0; k++) rc = g->ops->stream_new(g, &st[k]);
    if (rc < 0) goto out_streams;
    pthread_mutex_lock(&d->ring_lock);
    rc = ring_get(d, nbuf, bufsz);
    if (rc < 0) goto out;
    /* pending[b]: what buffer b holds once its event fires */
    struct pend {
        bool busy;
        uint64_t off, len;
    } pending[4096];
    uint32_t nb = d->nring < 4096 ? d->nring : 4096;
    memset(pending, 0, sizeof pending);
    uint32_t b = 0, s = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        for (uint64_t done = 0; done < r[k].len && rc == 0; done += bufsz) {
            uint64_t len = r[k].len - done < bufsz ? r[k].len - done : bufsz;
            ring_buf *rb = &d->ring[b];
            if (pending[b].busy) { /* the oldest buffer: wait for its copy, write it out */
                rc = g->ops->event_sync(g, rb->ev);
                if (rc == 0) {
                    rc = fy_pwrite_full(fd, rb->p, (size_t)pending[b].len, pending[b].off);
                    if (rc < 0)
                        fy_seterr(&d->ctx->err, rc, "%s: writing %" PRIu64 " bytes at %" PRIu64 ": %s", path,
                                  pending[b].len, pending[b].off, ferry_strerror(rc));
                }
                pending[b].busy = false;
                if (rc < 0) break;
            }
            rc = g->ops->copy_dtoh(g, rb->p, r[k].dev + done, (size_t)len, st[s]);
            if (rc == 0) rc = g->ops->event_record(g, rb->ev, st[s]);
            if (rc < 0) break;
            pending[b] = (struct pend){true, r[k].off + done, len};
            b = (b + 1) % nb;
            s = (s + 1) % 4;
        }
    }
    /* drain in order (on failure: still wait, so no copy lands in a reused buffer) */
    for (uint32_t k = 0; k < nb; k++) {
        uint32_t q = (b + k) % nb;
        if (!pending[q].busy) continue;
        int r2 = g->ops->event_sync(g, d->ring[q].ev);
        if (rc == 0 && r2 < 0) rc = r2;
        if (rc == 0) {
            rc = fy_pwrite_full(fd, d->ring[q].p, (size_t)pending[q].len, pending[q].off);
            if (rc < 0)
                fy_seterr(&d->ctx->err, rc, "%s: writing %" PRIu64 " bytes at %" PRIu64 ": %s", path, pending[q].len,
                          pending[q].off, ferry_strerror(rc));
        }
    }
out:
    /* no copy may still be landing in a ring buffer once the ring is let go
     * (a copy whose event could not be recorded is not in pending[]) */
    for (int k = 0; k < 4; k++)
        if (st[k]) g->ops->stream_sync(g, st[k]);
    pthread_mutex_unlock(&d->ring_lock);
out_streams:
    for (int k = 0; k < 4; k++) {
        if (!st[k]) continue;
        g->ops->stream_sync(g, st[k]);
        g->ops->stream_free(g, st[k]);
    }
    return rc;
}

static int host_copies(ferry_device *d, const fy_hostrange *r, int64_t n, bool to_device)
{
    if (!d || n < 0 || (n && !r)) return FERRY_E_INVAL;
    fy_gpu *g = d->g;
    fy_stream *st[4] = {0};
    int rc = g->ops->bind_thread(g);
    for (int k = 0; k < 4 && rc == 0; k++) rc = g->ops->stream_new(g, &st[k]);
    uint32_t next = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) rc = copy_spread(g, to_device, r[k].dev, r[k].host, r[k].len, st, 4, &next);
    for (int k = 0; k < 4; k++) {
        if (!st[k]) continue;
        int r2 = g->ops->stream_sync(g, st[k]);
        if (rc == 0 && r2 < 0) rc = r2;
        g->ops->stream_free(g, st[k]);
    }
    return rc;
}

int fy_xfer_host_to_device(ferry_device *d, const fy_hostrange *r, int64_t n) { return host_copies(d, r, n, true); }
int fy_xfer_device_to_host(ferry_device *d, const fy_hostrange *r, int64_t n) { return host_copies(d, r, n, false); }
