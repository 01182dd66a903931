/* SPDX-License-Identifier: Apache-2.0 */
/* bench_ring.c - where is the ceiling of a pinned-ring load? The pieces of
 * ferry's ring measured apart, on one file, in one process:
 *
 *   bench_ring FILE MODE THREADS BUFS_PER_THREAD SIZE_KIB [REPS]
 *
 * MODE:
 *   dma     no reads: THREADS threads each cycle their own buffers on their own
 *           stream (wait for a buffer's event, queue its copy, record the event)
 *           over the file's length: the copy engine's rate for SIZE pieces
 *   read    no copies: THREADS threads pread the file in SIZE pieces into their
 *           own pinned buffers: the page cache's rate into pinned memory
 *   ring    both, per thread: pread into the thread's next buffer once its event
 *           says the buffer's last copy is done, queue the copy, record
 *   mapcopy as ring, but memcpy from a MAP_SHARED mapping of the file instead
 *           of pread (what ferry does for tmpfs)
 *   mapnt   as mapcopy with non-temporal (streaming) stores into the pinned
 *           buffer: no read-for-ownership of the destination
 *   bounce  as ring, but pread in BOUNCE_KIB pieces (env, default 256) into a
 *           small per-thread buffer that stays in cache, then copy it into the
 *           pinned buffer with streaming stores
 *   hybrid  ring over the head of the file while a helper thread page-locks
 *           the tail (HYBRID_FRAC of it, env, default 0.3) of a fresh
 *           MAP_SHARED mapping in REG_MIB pieces (env, default 256), queueing
 *           each piece's copy on its own stream right after it registers: can
 *           copies straight from registered page-cache pages fill the copy
 *           engine's gaps in the ring's? Each rep maps afresh (as a first load
 *           would); the unregistering after the rep is timed apart
 *   gang    as ring, but the THREADS x BUFS_PER_THREAD pieces form slots of GANG
 *           (env, default 4) pieces next to one another in pinned memory and in
 *           the file: any thread preads any piece (one at a time, in file
 *           order), and the thread whose piece completes a slot queues ONE copy
 *           of the whole slot. Reads stay SIZE (the size the page cache reads
 *           fastest at) while copies grow to GANG x SIZE (the copy engine's
 *           per-copy cost: 4 MiB copies alone ran at 0.965 of the limit, 16 MiB
 *           at 0.99), with the same pinned bytes as ring
 * Threads take the file in contiguous runs of 64 pieces (as ferry's scheduler).
 * The device block is written once before the first rep (no first-touch cost in
 * the figures); REPS reps (default 3), one JSON line with each rep's GB/s. The
 * pinned buffers are cuMemHostAlloc'ed. Driver API through dlopen, as ferry. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <emmintrin.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent;

static CUresult (*Init)(unsigned);
static CUresult (*DeviceGet)(int *, int);
static CUresult (*PrimaryCtxRetain)(CUcontext *, int);
static CUresult (*CtxSetCurrent)(CUcontext);
static CUresult (*MemAlloc)(CUdeviceptr *, size_t);
static CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
static CUresult (*MemHostAlloc)(void **, size_t, unsigned);
static CUresult (*StreamCreate)(CUstream *, unsigned);
static CUresult (*StreamSynchronize)(CUstream);
static CUresult (*EventCreate)(CUevent *, unsigned);
static CUresult (*EventRecord)(CUevent, CUstream);
static CUresult (*EventSynchronize)(CUevent);
static CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*MemHostRegister)(void *, size_t, unsigned);
static CUresult (*MemHostUnregister)(void *);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { DMA, READ, RING, MAPCOPY, MAPNT, BOUNCE, HYBRID, GANG };

/* n bytes from src to 16-byte aligned dst with streaming stores (SSE2, in
 * every x86-64); the tail by memcpy */
static void copy_nt(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)),
                b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)),
                e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    if (i < n) memcpy(d + i, s + i, n - i);
}

typedef struct shared {
    int mode, fd;
    const char *map;
    uint64_t size, piece;
    uint64_t ring_end; /* the ring's part: [0, ring_end) (hybrid: the head) */
    CUdeviceptr d;
    CUcontext ctx;
    atomic_ullong next; /* next run's first byte */
    atomic_int failed;  /* a read came up short or a driver call failed: no rate */
    int bufs;
    size_t bounce;
    /* gang: slots of gang pieces; slot_issued[k] the last group whose copy
     * was queued from slot k (-1: none), slot_filled[k] its pieces landed */
    int gang, nslots;
    char *pool;
    CUevent *slot_ev;
    atomic_llong *slot_issued;
    atomic_int *slot_filled;
} shared;

typedef struct worker {
    shared *s;
    char **buf;
    CUevent *ev;
    CUstream st;
    int used;
    pthread_t th;
} worker;

static void gang_work(worker *w)
{
    shared *s = w->s;
    const uint64_t np = (s->size + s->piece - 1) / s->piece, slot_bytes = s->piece * (uint64_t)s->gang;
    for (;;) {
        uint64_t i = atomic_fetch_add(&s->next, 1);
        if (i >= np) break;
        long long g = (long long)(i / (uint64_t)s->gang);
        int k = (int)(g % s->nslots), part = (int)(i % (uint64_t)s->gang);
        /* the slot's copy from its previous group: queued, then done */
        while (atomic_load(&s->slot_issued[k]) < g - s->nslots) {
            if (atomic_load(&s->failed)) return;
            sched_yield();
        }
        if (g >= s->nslots && EventSynchronize(s->slot_ev[k])) atomic_store(&s->failed, 1);
        char *b = s->pool + slot_bytes * (uint64_t)k + s->piece * (uint64_t)part;
        uint64_t off = i * s->piece;
        size_t n = (size_t)(s->size - off < s->piece ? s->size - off : s->piece), got = 0;
        while (got < n) {
            ssize_t r = pread(s->fd, b + got, n - got, (off_t)(off + got));
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got < n) atomic_store(&s->failed, 1);
        uint64_t first = (uint64_t)g * (uint64_t)s->gang;
        int count = (int)(np - first < (uint64_t)s->gang ? np - first : (uint64_t)s->gang);
        if (atomic_fetch_add(&s->slot_filled[k], 1) + 1 == count) {
            uint64_t from = first * s->piece,
                     len = (s->size - from < slot_bytes ? s->size - from : slot_bytes);
            if (MemcpyHtoDAsync(s->d + from, s->pool + slot_bytes * (uint64_t)k, (size_t)len, w->st) ||
                EventRecord(s->slot_ev[k], w->st))
                atomic_store(&s->failed, 1);
            atomic_store(&s->slot_filled[k], 0);
            atomic_store(&s->slot_issued[k], g);
        }
    }
}

static void *work(void *arg)
{
    worker *w = arg;
    shared *s = w->s;
    CtxSetCurrent(s->ctx);
    if (s->mode == GANG) {
        gang_work(w);
        if (StreamSynchronize(w->st)) atomic_store(&s->failed, 1);
        return NULL;
    }
    const uint64_t run = 64 * s->piece;
    int k = 0;
    char *bb = s->mode == BOUNCE ? aligned_alloc(4096, s->bounce) : NULL;
    for (;;) {
        uint64_t lo = atomic_fetch_add(&s->next, run);
        if (lo >= s->ring_end) break;
        uint64_t hi = lo + run < s->ring_end ? lo + run : s->ring_end;
        for (uint64_t off = lo; off < hi; off += s->piece) {
            size_t n = (size_t)(hi - off < s->piece ? hi - off : s->piece);
            char *b = w->buf[k];
            if (s->mode != READ && w->used > k) EventSynchronize(w->ev[k]);
            if (s->mode == READ || s->mode == RING || s->mode == HYBRID) {
                size_t got = 0;
                while (got < n) {
                    ssize_t r = pread(s->fd, b + got, n - got, (off_t)(off + got));
                    if (r <= 0) break;
                    got += (size_t)r;
                }
                if (got < n) atomic_store(&s->failed, 1);
            } else if (s->mode == MAPCOPY) {
                memcpy(b, s->map + off, n);
            } else if (s->mode == MAPNT) {
                copy_nt(b, s->map + off, n);
            } else if (s->mode == BOUNCE) {
                for (size_t at = 0; at < n;) {
                    size_t want = n - at < s->bounce ? n - at : s->bounce;
                    ssize_t r = bb ? pread(s->fd, bb, want, (off_t)(off + at)) : -1;
                    if (r <= 0) {
                        atomic_store(&s->failed, 1);
                        break;
                    }
                    copy_nt(b + at, bb, (size_t)r);
                    at += (size_t)r;
                }
            }
            if (s->mode != READ) {
                if (MemcpyHtoDAsync(s->d + off, b, n, w->st) || EventRecord(w->ev[k], w->st))
                    atomic_store(&s->failed, 1);
                if (w->used <= k) w->used = k + 1;
            }
            k = (k + 1) % s->bufs;
        }
    }
    if (StreamSynchronize(w->st)) atomic_store(&s->failed, 1);
    free(bb);
    return NULL;
}

/* hybrid: the helper that registers the tail piece by piece and queues its copies */
typedef struct helper {
    shared *s;
    uint64_t cut, reg; /* the tail [cut, size); pieces of reg bytes */
    char *map;         /* this rep's mapping */
    CUstream st;
    double reg_seconds, done_at; /* in registration calls; when its copies had landed */
    int npieces;
    pthread_t th;
} helper;

static uint64_t round_page(uint64_t n)
{
    return (n + 4095) & ~(uint64_t)4095;
}

static void *help(void *arg)
{
    helper *h = arg;
    shared *s = h->s;
    CtxSetCurrent(s->ctx);
    h->npieces = 0;
    for (uint64_t off = h->cut; off < s->size; off += h->reg) {
        uint64_t len = s->size - off < h->reg ? s->size - off : h->reg;
        double t = now();
        if (MemHostRegister(h->map + off, (size_t)round_page(len), 0x08 /* READ_ONLY */)) {
            atomic_store(&s->failed, 1);
            break;
        }
        h->reg_seconds += now() - t;
        h->npieces++;
        if (MemcpyHtoDAsync(s->d + off, h->map + off, (size_t)len, h->st)) atomic_store(&s->failed, 1);
    }
    if (StreamSynchronize(h->st)) atomic_store(&s->failed, 1);
    h->done_at = now();
    return NULL;
}

#define SYM(v, n)                                                       \
    do {                                                                \
        v = (__typeof__(v))dlsym(h, n);                                 \
        if (!v) {                                                       \
            fprintf(stderr, "bench_ring: libcuda.so.1 has no %s\n", n); \
            return 1;                                                   \
        }                                                               \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: bench_ring FILE dma|read|ring|mapcopy|mapnt|bounce|hybrid|gang THREADS "
                        "BUFS_PER_THREAD SIZE_KIB [REPS]\n");
        return 2;
    }
    static const char *modes[] = {"dma", "read", "ring", "mapcopy", "mapnt", "bounce", "hybrid", "gang"};
    int mode = -1;
    for (int m = 0; m < 8; m++)
        if (strcmp(argv[2], modes[m]) == 0) mode = m;
    int nth = atoi(argv[3]), bufs = atoi(argv[4]), reps = argc > 6 ? atoi(argv[6]) : 3;
    uint64_t piece = (uint64_t)atoll(argv[5]) << 10;
    if (mode < 0 || nth < 1 || nth > 64 || bufs < 1 || bufs > 64 || piece == 0 || reps < 1) {
        fprintf(stderr, "bench_ring: bad arguments\n");
        return 2;
    }
    const char *bk = getenv("BOUNCE_KIB");
    shared s = {.mode = mode, .piece = piece, .bufs = bufs, .bounce = (size_t)(bk ? atoi(bk) : 256) << 10};
    if (s.bounce == 0) s.bounce = 256 << 10;
    atomic_init(&s.failed, 0);
    s.fd = open(argv[1], O_RDONLY);
    struct stat sb;
    if (s.fd < 0 || fstat(s.fd, &sb) != 0 || sb.st_size <= 0) {
        fprintf(stderr, "bench_ring: %s: cannot open\n", argv[1]);
        return 1;
    }
    s.size = (uint64_t)sb.st_size;
    s.ring_end = s.size;
    helper hp = {.s = &s};
    if (mode == HYBRID) {
        const char *fr = getenv("HYBRID_FRAC"), *rm = getenv("REG_MIB");
        double frac = fr ? atof(fr) : 0.3;
        hp.reg = (uint64_t)(rm ? atoll(rm) : 256) << 20;
        if (frac < 0 || frac > 1 || hp.reg == 0) {
            fprintf(stderr, "bench_ring: HYBRID_FRAC in [0, 1], REG_MIB > 0\n");
            return 2;
        }
        /* the head a multiple of the ring's pieces, the tail's start page-aligned */
        hp.cut = (uint64_t)((1 - frac) * (double)s.size) / piece * piece;
        s.ring_end = hp.cut;
    }
    if (mode == MAPCOPY || mode == MAPNT) {
        void *m = mmap(NULL, s.size, PROT_READ, MAP_SHARED, s.fd, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "bench_ring: mmap failed\n");
            return 1;
        }
        s.map = m;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "bench_ring: %s\n", dlerror());
        return 1;
    }
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemsetD8, "cuMemsetD8_v2");
    SYM(MemHostAlloc, "cuMemHostAlloc");
    SYM(StreamCreate, "cuStreamCreate");
    SYM(StreamSynchronize, "cuStreamSynchronize");
    SYM(EventCreate, "cuEventCreate");
    SYM(EventRecord, "cuEventRecord");
    SYM(EventSynchronize, "cuEventSynchronize");
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    SYM(MemHostRegister, "cuMemHostRegister_v2");
    SYM(MemHostUnregister, "cuMemHostUnregister");
    int dev;
    if (Init(0) || DeviceGet(&dev, 0) || PrimaryCtxRetain(&s.ctx, dev) || CtxSetCurrent(s.ctx)) {
        fprintf(stderr, "bench_ring: no CUDA device\n");
        return 1;
    }
    if (MemAlloc(&s.d, s.size) || MemsetD8(s.d, 0, s.size)) {
        fprintf(stderr, "bench_ring: cuMemAlloc(%llu) failed\n", (unsigned long long)s.size);
        return 1;
    }
    worker *w = calloc((size_t)nth, sizeof *w);
    char *pool = NULL;
    if (!w || MemHostAlloc((void **)&pool, (size_t)(piece * (uint64_t)nth * (uint64_t)bufs), 0)) {
        fprintf(stderr, "bench_ring: no pinned memory\n");
        return 1;
    }
    memset(pool, 1, (size_t)(piece * (uint64_t)nth * (uint64_t)bufs));
    for (int t = 0; t < nth; t++) {
        w[t].s = &s;
        w[t].buf = calloc((size_t)bufs, sizeof(char *));
        w[t].ev = calloc((size_t)bufs, sizeof(CUevent));
        StreamCreate(&w[t].st, 1 /* non-blocking */);
        for (int b = 0; b < bufs; b++) {
            w[t].buf[b] = pool + piece * (uint64_t)(t * bufs + b);
            EventCreate(&w[t].ev[b], 2 /* disable timing */);
        }
    }
    if (mode == HYBRID) StreamCreate(&hp.st, 1);
    if (mode == GANG) {
        const char *gs = getenv("GANG");
        s.gang = gs ? atoi(gs) : 4;
        if (s.gang < 1 || (nth * bufs) % s.gang) {
            fprintf(stderr, "bench_ring: GANG must divide THREADS x BUFS_PER_THREAD\n");
            return 2;
        }
        s.nslots = nth * bufs / s.gang;
        s.pool = pool;
        s.slot_ev = calloc((size_t)s.nslots, sizeof(CUevent));
        s.slot_issued = calloc((size_t)s.nslots, sizeof(atomic_llong));
        s.slot_filled = calloc((size_t)s.nslots, sizeof(atomic_int));
        if (!s.slot_ev || !s.slot_issued || !s.slot_filled) return 1;
        for (int k = 0; k < s.nslots; k++) EventCreate(&s.slot_ev[k], 2);
    }
    printf("{\"mode\": \"%s\", \"threads\": %d, \"bufs_per_thread\": %d, \"piece\": %llu, \"bounce\": %zu, "
           "\"gang\": %d, \"bytes\": %llu, \"registered_tail\": %llu, \"reg_piece\": %llu, \"gbps\": [",
           modes[mode], nth, bufs, (unsigned long long)piece, mode == BOUNCE ? s.bounce : 0, s.gang,
           (unsigned long long)s.size, (unsigned long long)(s.size - s.ring_end), (unsigned long long)hp.reg);
    char detail[4096] = "";
    size_t dl = 0;
    for (int r = 0; r < reps; r++) {
        atomic_store(&s.next, 0);
        for (int t = 0; t < nth; t++) w[t].used = 0;
        for (int k = 0; k < s.nslots; k++)
            atomic_store(&s.slot_issued[k], -1), atomic_store(&s.slot_filled[k], 0);
        double t0 = now();
        if (mode == HYBRID) {
            void *m = mmap(NULL, s.size, PROT_READ, MAP_SHARED, s.fd, 0);
            if (m == MAP_FAILED) {
                printf("], \"error\": \"mmap failed in rep %d\"}\n", r + 1);
                return 1;
            }
            hp.map = m;
            hp.reg_seconds = 0;
            pthread_create(&hp.th, NULL, help, &hp);
        }
        for (int t = 0; t < nth; t++) pthread_create(&w[t].th, NULL, work, &w[t]);
        for (int t = 0; t < nth; t++) pthread_join(w[t].th, NULL);
        double ring_done = now();
        if (mode == HYBRID) pthread_join(hp.th, NULL);
        double secs = now() - t0;
        if (mode == HYBRID) {
            double tu = now();
            for (uint64_t off = hp.cut; off < s.size && hp.npieces-- > 0; off += hp.reg)
                MemHostUnregister(hp.map + off);
            double unreg = now() - tu;
            munmap(hp.map, s.size);
            if (dl < sizeof detail - 200)
                dl += (size_t)snprintf(
                    detail + dl, sizeof detail - dl,
                    "%s{\"ring_s\": %.4f, \"helper_s\": %.4f, \"register_s\": %.4f, \"unregister_s\": %.4f}",
                    r ? ", " : "", ring_done - t0, hp.done_at - t0, hp.reg_seconds, unreg);
        }
        if (atomic_load(&s.failed)) {
            printf("], \"error\": \"a read came up short or a CUDA call failed in rep %d\"}\n", r + 1);
            return 1;
        }
        printf("%s%.2f", r ? ", " : "", (double)s.size / secs / 1e9);
        fflush(stdout);
    }
    printf("]%s%s%s}\n", dl ? ", \"reps\": [" : "", detail, dl ? "]" : "");
    return 0;
}
