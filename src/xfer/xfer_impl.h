/* SPDX-License-Identifier: Apache-2.0 */
/* xfer_impl.h - what the transfer engine's files share: the device handle and
 * its cached ring and registrations, the plan (file ranges and the copies out
 * of them), the readers' schedule, and the pipelines that run a plan. Private
 * to xfer/: other layers see xfer.h only. */
#ifndef FERRY_XFER_IMPL_H
#define FERRY_XFER_IMPL_H

#include <pthread.h>
#include <sys/types.h>
#include <stdatomic.h>

#include "file/file_impl.h"
#include "gpu/gpu.h"
#include "io/io.h"
#include "xfer.h"

#define ALIGN 4096u
#define MAX_STREAMS 16
#define MAX_THREADS 64
/* O_DIRECT loads' default readers and read size (load.c, xf_ring_geometry) */
#define DIRECT_THREADS 8u
#define DIRECT_READ (1ull << 20)
#define REG_CHUNK (256ull << 20) /* largest copy from a registered mapping */
/* A shard's mapping is registered in pieces of this many bytes (the last one
 * shorter), each by the loading thread just before its first copy, so that
 * the copies queued out of one piece run while the next registers. Measured
 * on the H200 with bench/reg_probe.py: a 1 GiB copy queued before a 1 GiB
 * registration landed while it ran; 10.4 GB of hot page cache registered and
 * copied that way in 1 GiB pieces took 0.34-0.40 s, against 0.49-0.50 s
 * registered in one call and then copied (0.31 + 0.19). 256 MiB pieces
 * registered on a helper thread while the loading thread queued the copies
 * took 0.40 + 0.19 s: the driver serialises its calls, so each copy call
 * waited for a registration. A copy must never span two registrations (a
 * copy crossing two adjacent ones failed on the H200), so register.c splits
 * copies there.
 * Tests set a small size per device (fy_device_set_reg_piece). */
#define REG_PIECE (1ull << 30)

static inline uint64_t page_round(uint64_t n)
{
    return (n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

/* A registered piece of a shard mapping (bytes [off, off + len) of it, off a
 * multiple of the device's reg_piece). held: registered by
 * ferry_device_register_file or kept by a load (FERRY_LOAD_KEEP_REGISTRATION);
 * users: loads copying from it right now. It is unregistered once neither. */
typedef struct reg_entry {
    const ferry_file *f;
    int32_t shard;
    void *base;
    uint64_t off, len;
    int users;
    bool held;
} reg_entry;

/* ---- pool.c: the device's reader pool ---- */

#define POOL_MAX (2 * MAX_THREADS + 8) /* most threads one device's pool makes */

typedef struct xf_group {
    uint32_t left; /* tasks not done yet; under the pool's lock */
} xf_group;

typedef struct xf_task {
    void (*fn)(void *arg);
    void *arg;
    xf_group *grp; /* NULL: detached (nobody waits; fn may free the task) */
    struct xf_task *next;
} xf_task;

typedef struct xf_pool {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    pthread_t th[POOL_MAX];
    uint32_t nth, idle, queued;
    xf_task *head, *tail;
    bool stop;
    pid_t pid; /* the process whose workers th[] are (a fork's child has none) */
} xf_pool;

void xf_pool_init(xf_pool *p);
/* Queue tasks t[0..n-1] (fn and arg set) as group g, making workers so that
 * idle ones cover what is queued (as many as they can up to POOL_MAX). */
void xf_pool_start(xf_pool *p, xf_group *g, xf_task *t, uint32_t n);
/* Run g's tasks no worker took yet in the caller, then wait for the rest. */
void xf_pool_wait(xf_pool *p, xf_group *g);
/* Queue a task nobody waits for; false (nothing queued) when the pool has
 * no worker to run it or is stopping: the caller runs it. */
bool xf_pool_detach(xf_pool *p, xf_task *t);
/* Run what is still queued, then join every worker (ferry_device_close). */
void xf_pool_stop(xf_pool *p);

typedef struct ring_buf {
    uint8_t *p;
    fy_event *ev;
    int stream; /* stream its copies went to, -1 when free */
} ring_buf;

struct ferry_device {
    ferry_ctx *ctx;
    fy_err err; /* this device's messages (also its context's); the backend's too */
    fy_gpu *g;
    pthread_mutex_t lock; /* guards regs */
    reg_entry *regs;
    int nregs, cap_regs;
    uint64_t reg_piece;        /* REG_PIECE, or a test's size (a multiple of ALIGN) */
    pthread_mutex_t ring_lock; /* one load at a time uses the cached ring */
    ring_buf *ring;
    uint8_t *ring_base; /* one pinned block holding every buffer */
    uint32_t nring;
    uint64_t ring_bytes;
    /* the lane: one stream, made on first use, that every queued host copy
     * runs on in the order queued, so a prefetch queued first lands first
     * (copies of separate moves on separate streams would share the link and
     * all land late); guarded by lock */
    fy_stream *lane;
    xf_pool pool; /* the readers' threads (pool.c) */
    /* streams and events made once and reused (xf_stream_take / xf_event_take):
     * a move inside a caller's step then makes no driver object, which the
     * driver may refuse when the device's memory is full; guarded by lock */
    fy_stream **free_streams;
    fy_event **free_events;
    uint32_t nfree_streams, nfree_events;
    pid_t pid; /* the process the lane and the cache belong to (a forked child forgets them) */
};

/* Under d->lock: in a child of fork(), forget the parent's lane and cached
 * streams and events (a backend's stream may be its parent's thread); the
 * child makes its own. */
void xf_device_forked(ferry_device *d);

/* A stream (idle) or an event from the device's cache, made when the cache
 * is empty; given back with xf_stream_give / xf_event_give once nothing of
 * the caller's is queued on the stream (the event may still be pending: a
 * later record replaces it). A full cache frees what it is given. */
int xf_stream_take(ferry_device *d, fy_stream **out);
void xf_stream_give(ferry_device *d, fy_stream *s);
int xf_event_take(ferry_device *d, fy_event **out);
void xf_event_give(ferry_device *d, fy_event *e);

struct ferry_loaded {
    ferry_device *dev;
    const ferry_file *f;
    fy_dptr *block; /* one device block per shard (0 if the shard holds no bytes) */
    uint64_t *dptr; /* per tensor */
};

/* ---- the plan: file ranges (batches) and the copies out of them ---- */

typedef struct piece {
    uint64_t off, len; /* in the file */
    fy_dptr dst;
    fy_dptr aend; /* the end of the device allocation holding dst (0: unknown) */
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
    fy_dptr aend; /* the end of the device allocation holding dst; 0: unknown (its
                     copies are never merged with the next tensor's) */
} item;
/* Fill it[k].aend from the device (one query per allocation met, in order):
 * for destinations the caller gave. A query that fails leaves 0. */
void xf_items_alloc_ends(ferry_device *d, item *it, int64_t n);

/* ---- reader threads' shared schedule ---- */

/* Buffered reads claim runs of consecutive batches, shorter as the work runs
 * out (guided scheduling: the last claims are single batches, so no thread is
 * left with a long tail), and each reader reads through a descriptor of its
 * own (own_fd). Together they let the kernel's readahead see each thread's
 * sequential run: when 12 threads' reads interleave on one descriptor, a cold
 * load fills the page cache with single-page folios, and the first read of
 * those afterwards (the next hot load) runs at half speed while the kernel
 * activates every page (measured on the H100). */
typedef struct sched {
    const plan *p;
    atomic_llong next;
    long long run; /* most consecutive batches one claim takes */
    uint32_t nthreads;
} sched;

/* A reader's own descriptor: one at a time, for the shard it reads now
 * (batches come in shard order, so it rarely changes; keeping one per shard
 * could hold threads x shards descriptors open in the host process). */
typedef struct own {
    int32_t shard; /* -1: none open */
    int fd;
} own;

/* ---- device.c: the ring cache and copies ---- */

/* The device's cached ring: nbuf pinned buffers of bytes each (+ O_DIRECT
 * slack); reused while the geometry stays the same. Under d->ring_lock. */
int xf_ring_get(ferry_device *d, uint32_t nbuf, uint64_t bytes);
void xf_ring_free(ferry_device *d);
/* ---- spread.c ---- */
/* Queue a copy of len bytes between host and dev in pieces of at most
 * REG_CHUNK, round-robin over streams st[0..nst-1] from *next on: the host
 * memory must be page-locked for the copies to run asynchronously. */
int xf_copy_spread(fy_gpu *g, bool to_device, fy_dptr dev, void *host, uint64_t len, fy_stream **st,
                   uint32_t nst, uint32_t *next);

/* ---- register.c: page-locked file mappings ---- */
/* Forget the close watches on the files d registered (ferry_device_close, before freeing d). */
void xf_reg_unwatch_all(ferry_device *d);

/* Held registered (every piece of every shard that holds bytes)? */
bool xf_is_registered(ferry_device *d, const ferry_file *f);
/* Run plan p as copies straight out of the page-locked mapping, registering
 * what is not registered yet on a helper thread meanwhile; says in st how it
 * came by the registration. */
int xf_run_register(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                    fy_stream **streams, uint32_t nstreams, ferry_load_stats *st);

/* ---- residency.c ---- */

/* Fraction of f's pages in the page cache from 64 sampled runs of 64 pages; -1 unknown. */
double xf_resident_sampled(const ferry_file *f);

/* ---- plan.c: plans, the readers' schedule, their descriptors ---- */

/* Tensors in file order, cut into pieces of at most cap bytes, grouped into
 * batches: contiguous file ranges of at most cap bytes in one shard. */
int xf_plan_build(const ferry_allocator *m, const ferry_file *f, item *it, int64_t n, uint64_t cap, plan *p);
void xf_plan_free(const ferry_allocator *m, plan *p);
/* Whether piece pc continues a copy of len bytes from file offset src to
 * dst, in the device allocation that ends at aend: adjacent in the file and
 * on the device, and not past that allocation (the driver refuses one copy
 * into two allocations, adjacent or not; aend 0, unknown: never). */
static inline bool xf_piece_continues(const piece *pc, uint64_t src, uint64_t len, fy_dptr dst, fy_dptr aend)
{
    return aend && pc->off == src + len && pc->dst == dst + len && dst + len + pc->len <= aend;
}
/* From piece *q of batch bt on, the run of pieces adjacent both in the file
 * and on the device (ferry_load's blocks mirror the file): one copy of *len
 * bytes from file offset *src to *dst. *q moves past the run. */
void xf_piece_run(const plan *p, const batch *bt, int64_t *q, uint64_t *src, uint64_t *len, fy_dptr *dst);
void xf_sched_init(sched *q, const plan *p, long long run, uint32_t nthreads);
/* The next batch for a reader (p->nbt when none is left); *k and *end: the
 * reader's current run, -1 and 0 to begin. */
long long xf_next_batch(sched *q, long long *k, long long *end);
/* The descriptor a reader reads shard s through: its own when it could open one. */
int xf_own_fd(const ferry_file *f, own *o, int32_t s);
void xf_own_close(own *o);
/* A reader's failed read of batch bt: the message, with the file and where. */
int xf_read_failed(fy_err *err, int rc, const char *path, const batch *bt, bool direct);

/* ---- ring.c / host.c: the pipelines ---- */

/* Readers fill nbuf buffers (at most d->nring: a larger ring serves a load
 * that asks for fewer) of the cached ring (O_DIRECT when direct), copies go
 * out on streams; waits until every copy landed. Under d->ring_lock. */
int xf_run_ring(ferry_device *d, const ferry_file *f, const plan *p, bool direct, const ferry_load_opts *o,
                fy_stream **streams, uint32_t nstreams, uint32_t nthreads, uint32_t nbuf);
/* cpu device: readers pread straight into the destination. */
int xf_run_host(ferry_device *d, const ferry_file *f, const plan *p, const ferry_load_opts *o,
                uint32_t nthreads);

/* ---- choose.c: the one decision of a load's route, readers, ring and pinning ---- */

/* What a load will do (xf_choose): the route; its readers and the reads'
 * size (bufsz: the plan's batches; for routes without a ring too); for the
 * ring's routes the buffers it fills (fit_nbuf: fitted to its bytes; nbuf:
 * as it would take them from the ring pinned now), whether it must pin first
 * (pins), and the ring a pin ahead makes (pin_*: auto's buffered ring, which
 * an O_DIRECT load reads into part of). */
typedef struct xf_choice {
    ferry_route route;
    bool ring; /* reads into the device's ring (ring, direct; not the cpu device) */
    uint32_t nthreads, nbuf, fit_nbuf;
    uint64_t bufsz;
    bool pins;
    uint32_t pin_nbuf;
    uint64_t pin_bufsz;
    bool pin_direct;
    double resident; /* auto's sampled page-cache fraction; -1 not measured */
    const char *why; /* static text */
} xf_choice;

/* Decide for a load of `bytes` of f (NULL: none known, as for
 * ferry_device_prepare) with validated options o; who names the caller in
 * messages. 0 or an error with its message on d. */
int xf_choose(ferry_device *d, const ferry_file *f, const ferry_load_opts *o, uint64_t bytes, const char *who,
              xf_choice *c);
/* Take the ring c chose (ahead: the ring a pin ahead makes), pinning it unless
 * the ring pinned now serves; *nbuf the buffers to use, *pin_seconds the
 * pinning's time (0 when nothing was pinned). Under d->ring_lock. */
int xf_ring_take(ferry_device *d, const ferry_load_opts *o, const xf_choice *c, bool ahead, uint32_t *nbuf,
                 double *pin_seconds);
/* Whether d has any ring pinned. */
bool xf_ring_pinned(ferry_device *d);
/* Threads and ring size from load options (defaults measured on the H200
 * host), within ferry's limits. */
int xf_ring_geometry(ferry_device *d, const ferry_load_opts *o, bool direct, uint32_t *nthreads,
                     uint32_t *nbuf, uint64_t *bufsz);

/* ---- load.c: running a load ---- */

/* Load tensors it[0..n-1] of f to their destinations: choose (or take the
 * choice pre made for these items), plan, run. t0: when the caller's part
 * of the load began (fy_now(); its time up to here is the device
 * allocation, counted in seconds and alloc_seconds), or 0. */
int xf_load_items(ferry_device *d, const ferry_file *f, item *it, int64_t n, const ferry_load_opts *opts,
                  const xf_choice *pre, ferry_load_stats *stats, double t0);

#endif
