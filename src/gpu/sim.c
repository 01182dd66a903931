/* SPDX-License-Identifier: Apache-2.0 */
/* sim.c - a GPU emulated on host memory, for tests, CI and capacity planning
 * (--device sim:24GiB). It is stricter than a real device so that transfer
 * bugs show up here first: allocation tables catch double frees, foreign
 * pointers and out-of-bounds copies; streams are real asynchronous queues
 * (one worker thread each), so code that forgets to wait for an event reads
 * stale bytes; and any call kind can be made to fail at its nth call.
 *
 * Rules the code above must follow (the cuda backend needs them too):
 * - Streams and events should be freed before the device is closed; close
 *   drains and frees leftovers anyway.
 * - The NULL stream is refused: use a stream from stream_new.
 * - mem_free / host_free wait for queued copies that use the memory, as
 *   cuMemFree / cuMemFreeHost synchronise; host memory the caller owns
 *   (pageable or registered) must stay valid until an event recorded after
 *   the copy completes.
 * - Frees, unregistration, stream_free, event_free, mem_info and event_query
 *   never fail by injection, so cleanup paths stay testable.
 * - A copy whose host side touches a pinned buffer or a registered range
 *   must lie inside that one buffer or range (CUDA refuses a copy that
 *   crosses from one registration into the next).
 * - A host->device copy from memory that cannot be read (a file mapping past
 *   the end of its file, truncated after it was mapped) is not a SIGBUS: the
 *   next stream_sync of its stream fails with -EFAULT (copy_guarded). */
#define _GNU_SOURCE
#include "gpu.h"
#include "common/ranges.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    SIM_MMAP_MIN = 1 << 20, /* blocks from this size on are anonymous mappings */
    SIM_DEV_ALIGN = 256,    /* cuMemAlloc's alignment */
    SIM_HOST_ALIGN = 4096   /* cuMemHostAlloc gives pages: O_DIRECT reads need it */
};

/* One allocation (device or pinned) or one registered host range. */
typedef struct sim_range {
    uintptr_t base;
    size_t n;
    void *raw;              /* what to release: an fy_malloc block or a mapping; NULL if registered */
    size_t map_len;         /* mapping length, 0 for an fy_malloc block */
    bool read_only;         /* registered with read_only */
    bool in_arena;          /* a device block carved from the arena (mem_put gives it back) */
    unsigned long inflight; /* queued copies that touch this range */
} sim_range;

/* Ranges sorted by base: exact lookups for frees, containment for copies. */
typedef struct sim_table {
    sim_range **v;
    size_t len, cap;
    uint64_t bytes;
} sim_table;

typedef struct sim_gpu sim_gpu;

typedef struct sim_op {
    struct sim_op *next;
    bool is_copy;
    bool is_wait; /* a stream_wait: hold the stream until ev reaches seq */
    bool to_dev;  /* copy direction (each has its own modelled link) */
    bool guarded; /* read the host side with copy_guarded (not sim's own pinned memory) */
    void *dst;    /* copy */
    const void *src;
    size_t n;
    sim_range *dev, *pinned; /* ranges whose inflight count this copy holds */
    fy_event *ev;            /* marker */
    uint64_t seq;
} sim_op;

struct fy_stream {
    sim_gpu *g;
    fy_stream *prev, *next;
    pthread_t thread;
    pid_t pid;           /* the process whose thread that is (a forked child has none of it) */
    pthread_cond_t work; /* an op was queued, or stop */
    pthread_cond_t idle; /* done advanced */
    sim_op *head, *tail;
    uint64_t queued, done;
    bool stop;
    /* the first copy whose host side could not be read since the last
     * stream_sync, which reports it (as CUDA reports an async failure) */
    int fault_rc;
    const void *fault_src;
    size_t fault_n, fault_at;
};

struct fy_event {
    fy_event *prev, *next;
    uint64_t recorded;     /* records so far */
    uint64_t completed;    /* highest record whose marker has run */
    unsigned long markers; /* queued markers that point here */
    bool freed;            /* event_free ran: the last marker frees it */
};

struct sim_gpu {
    fy_gpu base;             /* first: fy_gpu * and sim_gpu * convert */
    pthread_mutex_t lock;    /* everything below, and every stream's queue */
    pthread_cond_t ev_done;  /* some event completed */
    pthread_cond_t released; /* some range's inflight count dropped to 0 */
    uint64_t capacity;
    double rate;     /* modelled copy bytes/s per direction, 0 = unmodelled */
    double pin_rate; /* modelled pinning bytes/s (host_alloc), 0 = unmodelled */
    /* device blocks of SIM_MMAP_MIN or more: carved lowest address first from
     * one reserved range of address space, so that blocks allocated in a
     * row are adjacent, as cuMemAlloc's often are (two 64 MiB blocks in a
     * row were, on the H200); a copy that runs from one block into the next
     * is then refused here as the driver refuses it (CUDA_ERROR_INVALID_VALUE,
     * bench/span_copy.py), where separate mappings would rarely meet */
    pthread_mutex_t arena_lock;
    uint8_t *arena; /* PROT_NONE until carved; NULL: not reserved (yet, or it failed) */
    size_t arena_len;
    bool arena_tried;
    fy_ranges arena_free; /* offsets in the arena */
    double link_free[2];  /* per direction (0 dtoh, 1 htod): when the link is free next (fy_now) */
    sim_table dev, pinned, reg;
    struct {
        long nth, left;
    } fault[FY_OP_COUNT];
    fy_stream *streams;
    fy_event *events;
};

static const fy_gpu_ops sim_ops;

static const char *fmt_size(char *buf, size_t n, uint64_t v)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1024) {
        snprintf(buf, n, "%" PRIu64 " B", v);
        return buf;
    }
    double x = (double)v;
    int i = 0;
    while (x >= 1024 && i < 6) {
        x /= 1024;
        i++;
    }
    snprintf(buf, n, "%.2f %s", x, unit[i]);
    return buf;
}

/* ---- range tables ---- */

/* Index of the last range whose base <= addr, or -1. */
static ptrdiff_t tab_floor(const sim_table *t, uintptr_t addr)
{
    size_t lo = 0, hi = t->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid]->base <= addr) lo = mid + 1;
        else hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

static sim_range *tab_containing(const sim_table *t, uintptr_t addr)
{
    ptrdiff_t i = tab_floor(t, addr);
    if (i < 0 || addr - t->v[i]->base >= t->v[i]->n) return NULL;
    return t->v[i];
}

/* The first range that shares a byte with [addr, addr + n), or NULL. */
static sim_range *tab_overlap(const sim_table *t, uintptr_t addr, size_t n)
{
    ptrdiff_t i = tab_floor(t, addr);
    if (i >= 0 && addr - t->v[i]->base < t->v[i]->n) return t->v[i];
    size_t j = (size_t)(i + 1);
    if (j < t->len && t->v[j]->base - addr < n) return t->v[j];
    return NULL;
}

static int tab_reserve(sim_gpu *g, sim_table *t)
{
    if (t->len < t->cap) return 0;
    size_t cap = t->cap ? t->cap * 2 : 16;
    sim_range **v = fy_realloc(g->base.mem, t->v, cap * sizeof *v);
    if (!v) return fy_seterr(g->base.err, -ENOMEM, "sim: out of host memory for the allocation table");
    t->v = v;
    t->cap = cap;
    return 0;
}

static void tab_insert(sim_table *t, sim_range *r)
{
    size_t at = (size_t)(tab_floor(t, r->base) + 1);
    memmove(t->v + at + 1, t->v + at, (t->len - at) * sizeof *t->v);
    t->v[at] = r;
    t->len++;
    t->bytes += r->n;
}

/* Take the range starting exactly at addr out of the table (its bytes stay
 * counted until tab_done); NULL if none starts there. */
static sim_range *tab_take(sim_table *t, uintptr_t addr)
{
    ptrdiff_t i = tab_floor(t, addr);
    if (i < 0 || t->v[i]->base != addr) return NULL;
    sim_range *r = t->v[i];
    memmove(t->v + i, t->v + i + 1, (t->len - (size_t)i - 1) * sizeof *t->v);
    t->len--;
    return r;
}

/* ---- host memory behind device and pinned allocations ---- */

/* len bytes of the arena (made on first use: the capacity, rounded up, plus
 * 64 MiB for the blocks' page rounding), fresh zero pages, at the lowest
 * offset that has room; MAP_FAILED when it has none (the caller maps
 * elsewhere). */
static void *arena_get(sim_gpu *g, size_t len)
{
    void *p = MAP_FAILED;
    pthread_mutex_lock(&g->arena_lock);
    if (!g->arena_tried) {
        g->arena_tried = true;
        size_t al = (size_t)((g->capacity + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1)) + (64u << 20);
        void *a = mmap(NULL, al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a != MAP_FAILED && fy_ranges_give(&g->arena_free, g->base.mem, 0, al) >= 0) {
            g->arena = a, g->arena_len = al;
        } else if (a != MAP_FAILED) {
            munmap(a, al);
        }
    }
    size_t i = 0;
    while (g->arena && i < g->arena_free.n && g->arena_free.v[i].len < len) i++;
    if (g->arena && i < g->arena_free.n) {
        uint8_t *at = g->arena + g->arena_free.v[i].off;
        p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                 0);
        if (p != MAP_FAILED) fy_ranges_take(&g->arena_free, i, len);
    }
    pthread_mutex_unlock(&g->arena_lock);
    return p;
}

/* Back to the arena: the pages dropped, the range reserved again. */
static void arena_put(sim_gpu *g, void *p, size_t len)
{
    pthread_mutex_lock(&g->arena_lock);
    (void)mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (fy_ranges_give(&g->arena_free, g->base.mem, (uint64_t)((uint8_t *)p - g->arena), len) < 0) {
        /* the free list could not grow: the range stays reserved, unused, until close */
    }
    pthread_mutex_unlock(&g->arena_lock);
}

static int mem_get(sim_gpu *g, sim_range *r, size_t n, size_t align, bool dev, const char *what)
{
    char s[32];
    if (n >= SIM_MMAP_MIN) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        if (n > SIZE_MAX - pg)
            return fy_seterr(g->base.err, -ENOMEM, "sim: %s of %s: too large", what,
                             fmt_size(s, sizeof s, n));
        size_t len = (n + pg - 1) / pg * pg;
        /* NORESERVE: a capacity-planning run may allocate more than the host
         * has, as long as it does not touch it all. Device blocks come from
         * the arena, lowest address first (arena_get). */
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
        void *p = dev ? arena_get(g, len) : MAP_FAILED;
        r->in_arena = p != MAP_FAILED;
        if (p == MAP_FAILED) p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            return fy_seterr(g->base.err, -ENOMEM, "sim: %s of %s: host mmap failed: %s", what,
                             fmt_size(s, sizeof s, n), ferry_strerror(-e));
        }
        r->raw = p;
        r->map_len = len;
        r->base = (uintptr_t)p;
    } else {
        void *p = fy_malloc(g->base.mem, n + align - 1);
        if (!p)
            return fy_seterr(g->base.err, -ENOMEM, "sim: %s of %s: out of host memory", what,
                             fmt_size(s, sizeof s, n));
        r->raw = p;
        r->map_len = 0;
        r->base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    }
    r->n = n;
    return 0;
}

static void mem_put(sim_gpu *g, sim_range *r)
{
    if (r->in_arena) arena_put(g, r->raw, r->map_len);
    else if (r->map_len) munmap(r->raw, r->map_len);
    else fy_free(g->base.mem, r->raw);
}

/* ---- fault injection (call with the lock held) ---- */

/* Count one call of kind op (FY_OP_ANY: counted by FY_OP_ANY faults only);
 * fail it if an armed fault reaches it. */
static int fault_hit(sim_gpu *g, fy_gpu_op op, const char *name)
{
    long nth = 0;
    fy_gpu_op kinds[2] = {FY_OP_ANY, op};
    for (int i = 0; i < (op == FY_OP_ANY ? 1 : 2); i++) {
        fy_gpu_op k = kinds[i];
        if (g->fault[k].left > 0 && --g->fault[k].left == 0) nth = g->fault[k].nth;
    }
    if (!nth) return 0;
    int code = (op == FY_OP_MEM_ALLOC || op == FY_OP_HOST_ALLOC) ? -ENOMEM : FERRY_E_DEVICE;
    return fy_seterr(g->base.err, code, "sim: injected failure in %s (call %ld)", name, nth);
}

int fy_gpu_sim_pin_rate(fy_gpu *gg, uint64_t bytes_per_s)
{
    if (!gg || gg->ops != &sim_ops)
        return fy_seterr(gg ? gg->err : NULL, FERRY_E_INVAL, "a modelled pinning rate needs a sim device");
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    g->pin_rate = (double)bytes_per_s;
    pthread_mutex_unlock(&g->lock);
    return 0;
}

int fy_gpu_sim_fault(fy_gpu *gg, fy_gpu_op op, long nth)
{
    if (!gg || gg->ops != &sim_ops)
        return fy_seterr(gg ? gg->err : NULL, FERRY_E_INVAL, "fault injection needs a sim device");
    if ((int)op < 0 || op >= FY_OP_COUNT || nth < 0)
        return fy_seterr(gg->err, FERRY_E_INVAL, "sim: bad fault (op %d, call %ld)", (int)op, nth);
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    /* The previous arming's calls still to go: 0 tells a fault loop that the
     * fault fired (or was never armed). */
    long prev = g->fault[op].left;
    g->fault[op].nth = nth;
    g->fault[op].left = nth;
    pthread_mutex_unlock(&g->lock);
    return prev > INT32_MAX ? INT32_MAX : (int)prev;
}

int fy_gpu_sim_usage(fy_gpu *gg, uint64_t *device, uint64_t *pinned, uint64_t *registered)
{
    if (!gg || gg->ops != &sim_ops)
        return fy_seterr(gg ? gg->err : NULL, FERRY_E_INVAL, "usage figures need a sim device");
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    if (device) *device = g->dev.bytes;
    if (pinned) *pinned = g->pinned.bytes;
    if (registered) *registered = g->reg.bytes;
    pthread_mutex_unlock(&g->lock);
    return 0;
}

/* ---- device and pinned memory ---- */

static int range_alloc(sim_gpu *g, sim_table *t, size_t n, size_t align, fy_gpu_op op, const char *name,
                       uintptr_t *out)
{
    char a[32], b[32], c[32];
    int rc;
    if (n == 0)
        return fy_seterr(g->base.err, FERRY_E_INVAL, "sim: %s of 0 bytes (CUDA refuses it too)", name);
    pthread_mutex_lock(&g->lock);
    if ((rc = fault_hit(g, op, name)) < 0) goto out;
    if (t == &g->dev && n > g->capacity - t->bytes) {
        rc = fy_seterr(g->base.err, -ENOMEM, "sim: out of device memory: %s requested, %s free of %s",
                       fmt_size(a, sizeof a, n), fmt_size(b, sizeof b, g->capacity - t->bytes),
                       fmt_size(c, sizeof c, g->capacity));
        goto out;
    }
    if ((rc = tab_reserve(g, t)) < 0) goto out;
    sim_range *r = fy_calloc(g->base.mem, 1, sizeof *r);
    if (!r) {
        rc = fy_seterr(g->base.err, -ENOMEM, "sim: %s: out of host memory", name);
        goto out;
    }
    if ((rc = mem_get(g, r, n, align, t == &g->dev, name)) < 0) {
        fy_free(g->base.mem, r);
        goto out;
    }
    tab_insert(t, r);
    *out = r->base;
out:
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int range_free(sim_gpu *g, sim_table *t, uintptr_t p, const char *name, const char *what)
{
    char s[32];
    pthread_mutex_lock(&g->lock);
    sim_range *r = tab_take(t, p);
    if (!r) {
        sim_range *in = tab_containing(t, p);
        int rc;
        if (in)
            rc = fy_seterr(g->base.err, FERRY_E_INVAL,
                           "sim: %s of 0x%" PRIxPTR ": inside the %s at 0x%" PRIxPTR " (%s), not its start",
                           name, p, what, in->base, fmt_size(s, sizeof s, in->n));
        else
            rc = fy_seterr(g->base.err, FERRY_E_INVAL,
                           "sim: %s of 0x%" PRIxPTR ": not a live %s (freed twice, or not from this device)",
                           name, p, what);
        pthread_mutex_unlock(&g->lock);
        return rc;
    }
    /* cuMemFree synchronises: wait for the copies still queued on it. */
    while (r->inflight) pthread_cond_wait(&g->released, &g->lock);
    t->bytes -= r->n;
    pthread_mutex_unlock(&g->lock);
    mem_put(g, r);
    fy_free(g->base.mem, r);
    return 0;
}

static int sim_mem_range(fy_gpu *gg, fy_dptr p, fy_dptr *base, size_t *size)
{
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    sim_range *r = tab_containing(&g->dev, (uintptr_t)p);
    if (r) *base = (fy_dptr)r->base, *size = r->n;
    pthread_mutex_unlock(&g->lock);
    return r ? 0 : FERRY_E_NOTFOUND; /* (no message: gpu.h) */
}

static int sim_mem_alloc(fy_gpu *gg, size_t n, fy_dptr *out)
{
    sim_gpu *g = (sim_gpu *)gg;
    uintptr_t p = 0;
    if (!out) return fy_seterr(gg->err, FERRY_E_INVAL, "sim: mem_alloc: out is NULL");
    *out = 0;
    int rc = range_alloc(g, &g->dev, n, SIM_DEV_ALIGN, FY_OP_MEM_ALLOC, "mem_alloc", &p);
    if (rc == 0) *out = (fy_dptr)p;
    return rc;
}

static int sim_mem_free(fy_gpu *gg, fy_dptr p)
{
    sim_gpu *g = (sim_gpu *)gg;
    return range_free(g, &g->dev, (uintptr_t)p, "mem_free", "device allocation");
}

static int sim_mem_info(fy_gpu *gg, uint64_t *free_bytes, uint64_t *total_bytes)
{
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    if (free_bytes) *free_bytes = g->capacity - g->dev.bytes;
    if (total_bytes) *total_bytes = g->capacity;
    pthread_mutex_unlock(&g->lock);
    return 0;
}

static int sim_host_alloc(fy_gpu *gg, size_t n, void **out)
{
    sim_gpu *g = (sim_gpu *)gg;
    uintptr_t p = 0;
    if (!out) return fy_seterr(gg->err, FERRY_E_INVAL, "sim: host_alloc: out is NULL");
    *out = NULL;
    pthread_mutex_lock(&g->lock);
    double pin_rate = g->pin_rate;
    pthread_mutex_unlock(&g->lock);
    /* pinning takes time, as cuMemHostAlloc's does (outside the lock) */
    if (pin_rate > 0) fy_sleep_until(fy_now() + (double)n / pin_rate);
    int rc = range_alloc(g, &g->pinned, n, SIM_HOST_ALIGN, FY_OP_HOST_ALLOC, "host_alloc", &p);
    if (rc == 0) *out = (void *)p;
    return rc;
}

static int sim_host_free(fy_gpu *gg, void *p)
{
    sim_gpu *g = (sim_gpu *)gg;
    if (!p) return 0; /* like cuMemFreeHost(NULL)... and free(NULL) */
    return range_free(g, &g->pinned, (uintptr_t)p, "host_free", "pinned allocation");
}

/* ---- registration ---- */

static int sim_host_register(fy_gpu *gg, void *p, size_t n, bool read_only)
{
    sim_gpu *g = (sim_gpu *)gg;
    uintptr_t a = (uintptr_t)p;
    char s[32];
    int rc;
    if (!p || n == 0 || a + n < a)
        return fy_seterr(gg->err, FERRY_E_INVAL,
                         "sim: host_register of %p, %zu bytes: empty or wrapping range", p, n);
    pthread_mutex_lock(&g->lock);
    sim_range *o;
    if ((o = tab_overlap(&g->reg, a, n))) {
        rc = fy_seterr(gg->err, FERRY_E_INVAL,
                       "sim: host_register of [%p, +%zu): overlaps the range registered at 0x%" PRIxPTR
                       " (%s) (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
                       p, n, o->base, fmt_size(s, sizeof s, o->n));
        goto out;
    }
    if ((o = tab_overlap(&g->pinned, a, n))) {
        rc = fy_seterr(
            gg->err, FERRY_E_INVAL,
            "sim: host_register of [%p, +%zu): overlaps pinned memory from host_alloc at 0x%" PRIxPTR
            " (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
            p, n, o->base);
        goto out;
    }
    if ((o = tab_overlap(&g->dev, a, n))) {
        rc = fy_seterr(gg->err, FERRY_E_INVAL,
                       "sim: host_register of [%p, +%zu): that is device memory (allocation at 0x%" PRIxPTR
                       ")",
                       p, n, o->base);
        goto out;
    }
    /* cuMemHostRegister refuses unmapped memory; msync says ENOMEM for it. */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = a & ~(pg - 1);
    if (msync((void *)lo, a + n - lo, MS_ASYNC) != 0 && errno == ENOMEM) {
        rc = fy_seterr(gg->err, FERRY_E_INVAL, "sim: host_register of [%p, +%zu): not all of it is mapped", p,
                       n);
        goto out;
    }
    if ((rc = fault_hit(g, FY_OP_HOST_REGISTER, "host_register")) < 0) goto out;
    if ((rc = tab_reserve(g, &g->reg)) < 0) goto out;
    sim_range *r = fy_calloc(gg->mem, 1, sizeof *r);
    if (!r) {
        rc = fy_seterr(gg->err, -ENOMEM, "sim: host_register: out of host memory");
        goto out;
    }
    r->base = a;
    r->n = n;
    r->read_only = read_only;
    tab_insert(&g->reg, r);
out:
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int sim_host_unregister(fy_gpu *gg, void *p)
{
    sim_gpu *g = (sim_gpu *)gg;
    uintptr_t a = (uintptr_t)p;
    char s[32];
    int rc = 0;
    pthread_mutex_lock(&g->lock);
    sim_range *r = tab_take(&g->reg, a);
    if (r) {
        g->reg.bytes -= r->n;
    } else {
        sim_range *in = tab_containing(&g->reg, a);
        if (in)
            rc = fy_seterr(gg->err, FERRY_E_INVAL,
                           "sim: host_unregister of %p: inside the range registered at 0x%" PRIxPTR
                           " (%s), not its start",
                           p, in->base, fmt_size(s, sizeof s, in->n));
        else rc = fy_seterr(gg->err, FERRY_E_INVAL, "sim: host_unregister of %p: not registered", p);
    }
    pthread_mutex_unlock(&g->lock);
    fy_free(gg->mem, r);
    return rc;
}

/* ---- streams ---- */

/* memcpy, except that host memory which cannot be read (a file mapping past
 * the end of a file truncated after it was mapped, a failing disk's page) is
 * an error rather than a SIGBUS: the kernel does the copy (process_vm_readv on
 * this process), much as a real device's DMA reads pages the driver pinned
 * without the CPU touching them. Where the call is refused (a seccomp filter:
 * ENOSYS, EPERM) the rest is a plain memcpy. Returns 0, or -errno with *at the
 * bytes copied before the failure. */
static int copy_guarded(void *dst, const void *src, size_t n, size_t *at)
{
    size_t done = 0;
    while (done < n) {
        struct iovec l = {(char *)dst + done, n - done};
        struct iovec r = {(void *)((uintptr_t)src + done), n - done};
        ssize_t k = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        int e = k < 0 ? errno : EFAULT;
        if (e == EINTR) continue;
        if (e == ENOSYS || e == EPERM) {
            memcpy((char *)dst + done, (const char *)src + done, n - done);
            return 0;
        }
        *at = done;
        return -e;
    }
    return 0;
}

static void *stream_worker(void *arg)
{
    fy_stream *s = arg;
    sim_gpu *g = s->g;
    pthread_mutex_lock(&g->lock);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &g->lock);
        sim_op *op = s->head;
        if (!op) break; /* stopped and drained */
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        if (op->is_copy) {
            /* a modelled link: copies in one direction take turns at the rate,
             * whichever stream they are on, so overlap and stalls are real */
            double until = 0;
            if (g->rate > 0) {
                double *link = &g->link_free[op->to_dev], now = fy_now();
                until = (*link > now ? *link : now) + (double)op->n / g->rate;
                *link = until;
            }
            pthread_mutex_unlock(&g->lock);
            size_t at = 0;
            int rc = 0;
            if (op->guarded) rc = copy_guarded(op->dst, op->src, op->n, &at);
            else memcpy(op->dst, op->src, op->n);
            if (until > 0) fy_sleep_until(until);
            pthread_mutex_lock(&g->lock);
            if (rc < 0 && s->fault_rc == 0) {
                s->fault_rc = rc;
                s->fault_src = op->src;
                s->fault_n = op->n;
                s->fault_at = at;
            }
            bool zero = --op->dev->inflight == 0;
            if (op->pinned && --op->pinned->inflight == 0) zero = true;
            if (zero) pthread_cond_broadcast(&g->released);
        } else if (op->is_wait) {
            fy_event *e = op->ev;
            while (e->completed < op->seq) pthread_cond_wait(&g->ev_done, &g->lock);
            if (--e->markers == 0 && e->freed) fy_free(g->base.mem, e);
        } else {
            fy_event *e = op->ev;
            if (op->seq > e->completed) e->completed = op->seq;
            pthread_cond_broadcast(&g->ev_done);
            if (--e->markers == 0 && e->freed) fy_free(g->base.mem, e);
        }
        s->done++;
        pthread_cond_broadcast(&s->idle);
        fy_free(g->base.mem, op);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* Handles are checked by address against the live lists, never dereferenced
 * first, so a freed or foreign handle is a clean error, not a crash. */
static bool stream_known(sim_gpu *g, const fy_stream *s)
{
    for (fy_stream *x = g->streams; x; x = x->next)
        if (x == s) return true;
    return false;
}

static bool event_known(sim_gpu *g, const fy_event *e)
{
    for (fy_event *x = g->events; x; x = x->next)
        if (x == e) return true;
    return false;
}

static int bad_stream(sim_gpu *g, const char *name, const fy_stream *s)
{
    if (!s)
        return fy_seterr(g->base.err, FERRY_E_INVAL, "sim: %s: NULL stream (the sim has no default stream)",
                         name);
    return fy_seterr(g->base.err, FERRY_E_INVAL, "sim: %s: unknown stream %p (freed, or from another device)",
                     name, (const void *)s);
}

static int bad_event(sim_gpu *g, const char *name, const fy_event *e)
{
    return fy_seterr(g->base.err, FERRY_E_INVAL,
                     "sim: %s: unknown event %p (NULL, freed, or from another device)", name,
                     (const void *)e);
}

static void enqueue(fy_stream *s, sim_op *op)
{
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->queued++;
    pthread_cond_signal(&s->work);
}

static int sim_stream_new(fy_gpu *gg, fy_stream **out)
{
    sim_gpu *g = (sim_gpu *)gg;
    if (!out) return fy_seterr(gg->err, FERRY_E_INVAL, "sim: stream_new: out is NULL");
    *out = NULL;
    pthread_mutex_lock(&g->lock);
    int rc = fault_hit(g, FY_OP_ANY, "stream_new");
    pthread_mutex_unlock(&g->lock);
    if (rc < 0) return rc;

    fy_stream *s = fy_calloc(gg->mem, 1, sizeof *s);
    if (!s) return fy_seterr(gg->err, -ENOMEM, "sim: stream_new: out of host memory");
    s->g = g;
    if ((rc = pthread_cond_init(&s->work, NULL)) != 0) goto fail_work;
    if ((rc = pthread_cond_init(&s->idle, NULL)) != 0) goto fail_idle;
    /* Signals belong to the host application's threads, not to ours. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    s->pid = getpid();
    rc = pthread_create(&s->thread, NULL, stream_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) goto fail_thread;

    pthread_mutex_lock(&g->lock);
    s->next = g->streams;
    if (g->streams) g->streams->prev = s;
    g->streams = s;
    pthread_mutex_unlock(&g->lock);
    *out = s;
    return 0;

fail_thread:
    pthread_cond_destroy(&s->idle);
fail_idle:
    pthread_cond_destroy(&s->work);
fail_work:
    fy_free(gg->mem, s);
    return fy_seterr(gg->err, -rc, "sim: stream_new: cannot start the stream's thread: %s",
                     ferry_strerror(-rc));
}

/* Like cuStreamDestroy, queued work still runs; unlike it, this waits for it. */
static void sim_stream_free(fy_gpu *gg, fy_stream *s)
{
    sim_gpu *g = (sim_gpu *)gg;
    if (!s) return;
    pthread_mutex_lock(&g->lock);
    if (!stream_known(g, s)) {
        bad_stream(g, "stream_free", s);
        pthread_mutex_unlock(&g->lock);
        return;
    }
    if (s->prev) s->prev->next = s->next;
    else g->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&g->lock);
    if (s->pid != getpid()) { /* a stream of the parent's, in a forked child: its thread is not here */
        fy_free(gg->mem, s);
        return;
    }
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    fy_free(gg->mem, s);
}

static int sim_stream_sync(fy_gpu *gg, fy_stream *s)
{
    sim_gpu *g = (sim_gpu *)gg;
    int rc = 0;
    pthread_mutex_lock(&g->lock);
    if (!s || !stream_known(g, s)) rc = bad_stream(g, "stream_sync", s);
    else if ((rc = fault_hit(g, FY_OP_ANY, "stream_sync")) == 0) {
        uint64_t target = s->queued;
        while (s->done < target) pthread_cond_wait(&s->idle, &g->lock);
        if (s->fault_rc < 0) {
            rc =
                fy_seterr(gg->err, s->fault_rc,
                          "sim: copy_htod of %zu bytes from %p: host byte %zu could not be read (%s): a file "
                          "mapping past the end of its file?",
                          s->fault_n, s->fault_src, s->fault_at, strerror(-s->fault_rc));
            s->fault_rc = 0;
        }
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* ---- events ---- */

static int sim_event_new(fy_gpu *gg, fy_event **out)
{
    sim_gpu *g = (sim_gpu *)gg;
    if (!out) return fy_seterr(gg->err, FERRY_E_INVAL, "sim: event_new: out is NULL");
    *out = NULL;
    pthread_mutex_lock(&g->lock);
    int rc = fault_hit(g, FY_OP_EVENT, "event_new");
    if (rc == 0) {
        fy_event *e = fy_calloc(gg->mem, 1, sizeof *e);
        if (!e) {
            rc = fy_seterr(gg->err, -ENOMEM, "sim: event_new: out of host memory");
        } else {
            e->next = g->events;
            if (g->events) g->events->prev = e;
            g->events = e;
            *out = e;
        }
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static void event_unlink(sim_gpu *g, fy_event *e)
{
    if (e->prev) e->prev->next = e->next;
    else g->events = e->next;
    if (e->next) e->next->prev = e->prev;
}

/* Like cuEventDestroy: allowed with records still queued; the last marker frees it. */
static void sim_event_free(fy_gpu *gg, fy_event *e)
{
    sim_gpu *g = (sim_gpu *)gg;
    if (!e) return;
    pthread_mutex_lock(&g->lock);
    if (!event_known(g, e)) {
        bad_event(g, "event_free", e);
        pthread_mutex_unlock(&g->lock);
        return;
    }
    event_unlink(g, e);
    bool now = e->markers == 0;
    e->freed = true;
    pthread_mutex_unlock(&g->lock);
    if (now) fy_free(gg->mem, e);
}

static int sim_event_record(fy_gpu *gg, fy_event *e, fy_stream *s)
{
    sim_gpu *g = (sim_gpu *)gg;
    int rc;
    pthread_mutex_lock(&g->lock);
    if (!e || !event_known(g, e)) rc = bad_event(g, "event_record", e);
    else if (!s || !stream_known(g, s)) rc = bad_stream(g, "event_record", s);
    else if ((rc = fault_hit(g, FY_OP_EVENT, "event_record")) == 0) {
        sim_op *op = fy_calloc(gg->mem, 1, sizeof *op);
        if (!op) {
            rc = fy_seterr(gg->err, -ENOMEM, "sim: event_record: out of host memory");
        } else {
            op->ev = e;
            op->seq = ++e->recorded;
            e->markers++;
            enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int sim_event_sync(fy_gpu *gg, fy_event *e)
{
    sim_gpu *g = (sim_gpu *)gg;
    int rc;
    pthread_mutex_lock(&g->lock);
    if (!e || !event_known(g, e)) rc = bad_event(g, "event_sync", e);
    else if ((rc = fault_hit(g, FY_OP_EVENT, "event_sync")) == 0) {
        /* The record current at the call, as cuEventSynchronize; an event
         * never recorded is complete. */
        uint64_t target = e->recorded;
        while (e->completed < target) pthread_cond_wait(&g->ev_done, &g->lock);
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* Not counted by fault injection: how often a caller polls depends on timing,
 * and fault loops must be reproducible. */
static int sim_event_query(fy_gpu *gg, fy_event *e)
{
    sim_gpu *g = (sim_gpu *)gg;
    int rc;
    pthread_mutex_lock(&g->lock);
    if (!e || !event_known(g, e)) rc = bad_event(g, "event_query", e);
    else rc = e->completed >= e->recorded;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* ---- copies ---- */

/* Check a copy and queue it (lock held): [d, d + n) on the device, [host,
 * host + n) on the host, to_dev the direction. */
static int copy_queue(sim_gpu *g, const char *name, bool to_dev, fy_dptr d, void *host, size_t n,
                      fy_stream *s)
{
    char a[32], b[32];
    fy_err *err = g->base.err;
    uintptr_t h = (uintptr_t)host;
    if (!s || !stream_known(g, s)) return bad_stream(g, name, s);
    if (n == 0) return 0;
    if (!host) return fy_seterr(err, FERRY_E_INVAL, "sim: %s: NULL host pointer", name);
    if (d + n < d || h + n < h)
        return fy_seterr(err, FERRY_E_INVAL, "sim: %s of %zu bytes: address range wraps around", name, n);

    sim_range *dev = tab_containing(&g->dev, (uintptr_t)d);
    if (!dev)
        return fy_seterr(err, FERRY_E_INVAL,
                         "sim: %s of %s: device address 0x%" PRIx64 " is not in any live allocation", name,
                         fmt_size(a, sizeof a, n), d);
    if (d + n > dev->base + dev->n)
        return fy_seterr(err, FERRY_E_INVAL,
                         "sim: %s: device range 0x%" PRIx64 " + %zu runs %" PRIu64
                         " bytes past the end of the allocation at 0x%" PRIxPTR " (%s)",
                         name, d, n, (uint64_t)(d + n - (dev->base + dev->n)), dev->base,
                         fmt_size(b, sizeof b, dev->n));

    sim_range *o = tab_overlap(&g->dev, h, n);
    if (o)
        return fy_seterr(err, FERRY_E_INVAL,
                         "sim: %s: host range %p + %zu is device memory (allocation at 0x%" PRIxPTR ")", name,
                         host, n, o->base);
    /* A copy that starts in, or runs into, a pinned buffer must stay inside it. */
    sim_range *pin = tab_overlap(&g->pinned, h, n);
    if (pin && (h < pin->base || h + n > pin->base + pin->n))
        return fy_seterr(err, FERRY_E_INVAL,
                         "sim: %s: host range %p + %zu crosses the edge of the pinned buffer at 0x%" PRIxPTR
                         " (%s)",
                         name, host, n, pin->base, fmt_size(b, sizeof b, pin->n));
    /* The same for a registered range: two adjacent registrations are separate
     * for the driver, and a copy that crossed from one into the next failed on
     * the H200, so a copy that touches a registration must stay inside it. */
    sim_range *reg = tab_overlap(&g->reg, h, n);
    if (reg && (h < reg->base || h + n > reg->base + reg->n))
        return fy_seterr(
            err, FERRY_E_INVAL,
            "sim: %s: host range %p + %zu crosses the edge of the range registered at 0x%" PRIxPTR
            " (%s): a copy must stay inside one registration",
            name, host, n, reg->base, fmt_size(b, sizeof b, reg->n));
    if (!to_dev) {
        ptrdiff_t i = tab_floor(&g->reg, h);
        for (size_t j = i < 0 ? 0 : (size_t)i; j < g->reg.len && g->reg.v[j]->base < h + n; j++) {
            sim_range *r = g->reg.v[j];
            if (r->read_only && h < r->base + r->n)
                return fy_seterr(err, FERRY_E_INVAL,
                                 "sim: %s: destination %p + %zu is registered read-only (at 0x%" PRIxPTR ")",
                                 name, host, n, r->base);
        }
    }

    int rc = fault_hit(g, FY_OP_COPY, name);
    if (rc < 0) return rc;
    sim_op *op = fy_calloc(g->base.mem, 1, sizeof *op);
    if (!op) return fy_seterr(err, -ENOMEM, "sim: %s: out of host memory", name);
    op->is_copy = true;
    op->to_dev = to_dev;
    op->guarded = to_dev && !pin;
    op->n = n;
    op->dst = to_dev ? (void *)(uintptr_t)d : host;
    op->src = to_dev ? (const void *)host : (const void *)(uintptr_t)d;
    op->dev = dev;
    op->pinned = pin;
    dev->inflight++;
    if (pin) pin->inflight++;
    enqueue(s, op);
    return 0;
}

static int sim_copy_htod(fy_gpu *gg, fy_dptr dst, const void *src, size_t n, fy_stream *s)
{
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    int rc = copy_queue(g, "copy_htod", true, dst, (void *)(uintptr_t)src, n, s);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int sim_copy_dtoh(fy_gpu *gg, void *dst, fy_dptr src, size_t n, fy_stream *s)
{
    sim_gpu *g = (sim_gpu *)gg;
    pthread_mutex_lock(&g->lock);
    int rc = copy_queue(g, "copy_dtoh", false, src, dst, n, s);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int sim_stream_wait(fy_gpu *gg, uint64_t raw, fy_event *e)
{
    if (raw == 0) return sim_event_sync(gg, e); /* the caller's thread */
    sim_gpu *g = (sim_gpu *)gg;
    fy_stream *s = (fy_stream *)(uintptr_t)raw;
    int rc;
    pthread_mutex_lock(&g->lock);
    if (!e || !event_known(g, e)) rc = bad_event(g, "stream_wait", e);
    else if (!stream_known(g, s)) rc = bad_stream(g, "stream_wait", s);
    else if ((rc = fault_hit(g, FY_OP_EVENT, "stream_wait")) == 0) {
        sim_op *op = fy_calloc(gg->mem, 1, sizeof *op);
        if (!op) {
            rc = fy_seterr(gg->err, -ENOMEM, "sim: stream_wait: out of host memory (%zu bytes)", sizeof *op);
        } else { /* as cuStreamWaitEvent: the record current at the call */
            op->is_wait = true;
            op->ev = e;
            op->seq = e->recorded;
            e->markers++;
            enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int sim_event_record_raw(fy_gpu *gg, fy_event *e, uint64_t raw)
{
    if (raw) return sim_event_record(gg, e, (fy_stream *)(uintptr_t)raw);
    sim_gpu *g = (sim_gpu *)gg; /* the caller's thread: nothing of it is queued here */
    int rc;
    pthread_mutex_lock(&g->lock);
    if (!e || !event_known(g, e)) rc = bad_event(g, "event_record", e);
    else if ((rc = fault_hit(g, FY_OP_EVENT, "event_record")) == 0) e->completed = ++e->recorded;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static uint64_t sim_stream_raw(fy_gpu *gg, fy_stream *s)
{
    (void)gg;
    return (uint64_t)(uintptr_t)s;
}

static int sim_bind_thread(fy_gpu *gg)
{
    (void)gg;
    return 0;
}

/* ---- open / close ---- */

static void table_clear(sim_gpu *g, sim_table *t)
{
    for (size_t i = 0; i < t->len; i++) {
        if (t->v[i]->raw) mem_put(g, t->v[i]);
        fy_free(g->base.mem, t->v[i]);
    }
    fy_free(g->base.mem, t->v);
}

/* Leftover streams and events are freed too: streams first, so that every
 * queued copy has run before memory goes. */
static void sim_close(fy_gpu *gg)
{
    sim_gpu *g = (sim_gpu *)gg;
    for (;;) {
        pthread_mutex_lock(&g->lock);
        fy_stream *s = g->streams;
        pthread_mutex_unlock(&g->lock);
        if (!s) break;
        sim_stream_free(gg, s);
    }
    while (g->events) {
        fy_event *e = g->events;
        event_unlink(g, e);
        fy_free(gg->mem, e);
    }
    table_clear(g, &g->dev);
    table_clear(g, &g->pinned);
    table_clear(g, &g->reg);
    if (g->arena) munmap(g->arena, g->arena_len);
    fy_ranges_free(&g->arena_free, gg->mem);
    pthread_mutex_destroy(&g->arena_lock);
    pthread_cond_destroy(&g->released);
    pthread_cond_destroy(&g->ev_done);
    pthread_mutex_destroy(&g->lock);
    fy_free(gg->mem, g);
}

int fy_gpu_sim_open(uint64_t capacity, uint64_t bytes_per_s, const ferry_allocator *mem, fy_err *err,
                    fy_gpu **out)
{
    char s[32];
    if (!out) return fy_seterr(err, FERRY_E_INVAL, "sim: open: out is NULL");
    *out = NULL;
    if (capacity == 0) return fy_seterr(err, FERRY_E_INVAL, "sim: a capacity of 0 bytes");
    if (!mem) mem = fy_default_allocator();
    sim_gpu *g = fy_calloc(mem, 1, sizeof *g);
    if (!g) return fy_seterr(err, -ENOMEM, "sim: open: out of host memory");
    g->base.ops = &sim_ops;
    g->base.mem = mem;
    g->base.err = err;
    g->base.ordinal = 0;
    if (bytes_per_s)
        snprintf(g->base.desc, sizeof g->base.desc, "sim (%s, copies at %.1f GB/s)",
                 fmt_size(s, sizeof s, capacity), (double)bytes_per_s / 1e9);
    else snprintf(g->base.desc, sizeof g->base.desc, "sim (%s)", fmt_size(s, sizeof s, capacity));
    g->capacity = capacity;
    g->rate = (double)bytes_per_s;
    int rc;
    if ((rc = pthread_mutex_init(&g->lock, NULL)) != 0) goto fail_lock;
    if ((rc = pthread_cond_init(&g->ev_done, NULL)) != 0) goto fail_ev;
    if ((rc = pthread_cond_init(&g->released, NULL)) != 0) goto fail_rel;
    if ((rc = pthread_mutex_init(&g->arena_lock, NULL)) != 0) goto fail_arena;
    *out = &g->base;
    return 0;

fail_arena:
    pthread_cond_destroy(&g->released);
fail_rel:
    pthread_cond_destroy(&g->ev_done);
fail_ev:
    pthread_mutex_destroy(&g->lock);
fail_lock:
    fy_free(mem, g);
    return fy_seterr(err, -rc, "sim: open: %s", ferry_strerror(-rc));
}

static const fy_gpu_ops sim_ops = {
    .name = "sim",
    .close = sim_close,
    .mem_alloc = sim_mem_alloc,
    .mem_range = sim_mem_range,
    .mem_free = sim_mem_free,
    .mem_info = sim_mem_info,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .stream_new = sim_stream_new,
    .stream_free = sim_stream_free,
    .stream_sync = sim_stream_sync,
    .event_new = sim_event_new,
    .event_free = sim_event_free,
    .event_record = sim_event_record,
    .event_sync = sim_event_sync,
    .event_query = sim_event_query,
    .copy_htod = sim_copy_htod,
    .copy_dtoh = sim_copy_dtoh,
    .bind_thread = sim_bind_thread,
    .stream_wait = sim_stream_wait,
    .stream_raw = sim_stream_raw,
    .event_record_raw = sim_event_record_raw,
};
