/* SPDX-License-Identifier: Apache-2.0 */
/* bench_pinrate.c - how fast does the copy engine read pinned host memory,
 * by how that memory was made?
 *
 *   bench_pinrate [GIB] [PIECE_MIB] [REPS]     (default 8 GiB in 64 MiB pieces, 3 reps)
 *
 * The streaming store's pinned pool is anonymous memory asked for transparent
 * huge pages, touched by 8 threads, then registered (cuda.c cu_host_alloc).
 * Its host->device rate varied between processes (45.7-55.1 GB/s while the
 * copy engine was busy, bench/RESULTS.md "Streaming"); this asks whether
 * the page size the kernel gave the pool explains it. Ways:
 *   hostalloc  cuMemHostAlloc (what torch's pin_memory and the copy-limit probe use)
 *   thp        ferry's: mmap, MADV_HUGEPAGE, 8-thread touch, cuMemHostRegister
 *   nothp      the same with MADV_NOHUGEPAGE (4 KiB pages)
 *   collapse   thp, then MADV_COLLAPSE (synchronous compaction into 2 MiB pages)
 * For each: the time to make it, how much of it is on huge pages (the VMA's
 * AnonHugePages in /proc/self/smaps), and the rate of copying all of it to
 * the device in pieces on one stream, in order (as the store's lane does).
 * One JSON object per line. Driver API through dlopen, as ferry. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent;

static CUresult (*Init)(unsigned);
static CUresult (*DeviceGet)(int *, int);
static CUresult (*PrimaryCtxRetain)(CUcontext *, int);
static CUresult (*CtxSetCurrent)(CUcontext);
static CUresult (*MemAlloc)(CUdeviceptr *, size_t);
static CUresult (*MemFree)(CUdeviceptr);
static CUresult (*MemHostAlloc)(void **, size_t, unsigned);
static CUresult (*MemFreeHost)(void *);
static CUresult (*StreamCreate)(CUstream *, unsigned);
static CUresult (*StreamSynchronize)(CUstream);
static CUresult (*HostRegister)(void *, size_t, unsigned);
static CUresult (*HostUnregister)(void *);
static CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct span {
    volatile char *p;
    size_t n;
} span;

static void *toucher(void *a)
{
    span *s = a;
    for (size_t i = 0; i < s->n; i += 4096) s->p[i] = 1;
    return NULL;
}

static void touch8(char *p, size_t n)
{
    pthread_t th[8];
    span sp[8];
    size_t per = (n / 8 + 4095) & ~(size_t)4095;
    for (int k = 0; k < 8; k++) {
        size_t off = per * (size_t)k;
        sp[k] = (span){p + off, off >= n ? 0 : (n - off < per ? n - off : per)};
        pthread_create(&th[k], NULL, toucher, &sp[k]);
    }
    for (int k = 0; k < 8; k++) pthread_join(th[k], NULL);
}

/* AnonHugePages (bytes) summed over the VMAs that overlap [p, p+n). */
static long long huge_bytes(const void *p, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    uintptr_t a = (uintptr_t)p, b = a + n;
    int in = 0;
    long long sum = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        long long kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = lo < b && hi > a;
        else if (in && sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) sum += kb << 10;
    }
    fclose(f);
    return sum;
}

#define SYM(v, n)                                                          \
    do {                                                                   \
        v = (__typeof__(v))dlsym(h, n);                                    \
        if (!v) {                                                          \
            fprintf(stderr, "bench_pinrate: libcuda.so.1 has no %s\n", n); \
            return 1;                                                      \
        }                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 8;
    size_t piece = (size_t)(argc > 2 ? atof(argv[2]) : 64) * (1u << 20);
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    const char *only = argc > 4 ? argv[4] : NULL;
    size_t n = ((size_t)(gib * (double)(1u << 30)) + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    if (n == 0 || piece == 0 || reps < 1) {
        fprintf(stderr, "usage: bench_pinrate [GIB] [PIECE_MIB] [REPS] [WAY]\n");
        return 2;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "bench_pinrate: %s\n", dlerror());
        return 1;
    }
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(MemHostAlloc, "cuMemHostAlloc");
    SYM(MemFreeHost, "cuMemFreeHost");
    SYM(StreamCreate, "cuStreamCreate");
    SYM(StreamSynchronize, "cuStreamSynchronize");
    SYM(HostRegister, "cuMemHostRegister_v2");
    SYM(HostUnregister, "cuMemHostUnregister");
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    int dev;
    CUcontext ctx;
    CUstream st;
    if (Init(0) || DeviceGet(&dev, 0) || PrimaryCtxRetain(&ctx, dev) || CtxSetCurrent(ctx) ||
        StreamCreate(&st, 1)) {
        fprintf(stderr, "bench_pinrate: no CUDA device\n");
        return 1;
    }
    CUdeviceptr d;
    if (MemAlloc(&d, n)) {
        fprintf(stderr, "bench_pinrate: cuMemAlloc(%zu) failed\n", n);
        return 1;
    }
    static const char *ways[] = {"hostalloc", "thp", "nothp", "collapse"};
    for (int w = 0; w < 4; w++) {
        if (only && strcmp(only, ways[w]) != 0) continue;
        double t0 = now();
        char *raw = NULL, *p = NULL;
        size_t len = n + (2u << 20);
        int crc = 0, collapse_errno = 0;
        if (w == 0) {
            void *q = NULL;
            crc = MemHostAlloc(&q, n, 1 /* PORTABLE */);
            p = q;
        } else {
            raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (raw == MAP_FAILED) {
                printf("{\"way\": \"%s\", \"error\": \"mmap: %s\"}\n", ways[w], strerror(errno));
                continue;
            }
            p = (char *)(((uintptr_t)raw + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
            madvise(p, n, w == 2 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
            touch8(p, n);
            if (w == 3 && madvise(p, n, MADV_COLLAPSE) != 0) collapse_errno = errno;
            crc = HostRegister(p, n, 1 /* PORTABLE */);
        }
        double made = now() - t0;
        if (crc || !p) {
            printf("{\"way\": \"%s\", \"error\": \"CUresult %d\"}\n", ways[w], crc);
            if (raw) munmap(raw, len);
            continue;
        }
        if (w == 0) memset(p, 1, n);
        long long hb = huge_bytes(p, n);
        printf("{\"way\": \"%s\", \"bytes\": %zu, \"piece\": %zu, \"make_s\": %.3f, \"huge_bytes\": %lld, "
               "\"huge_frac\": %.4f, \"collapse_errno\": %d, \"gbps\": [",
               ways[w], n, piece, made, hb, hb < 0 ? -1.0 : (double)hb / (double)n, collapse_errno);
        for (int r = 0; r <= reps; r++) { /* rep 0 warms up */
            double t1 = now();
            for (size_t off = 0; off < n; off += piece)
                MemcpyHtoDAsync(d + off, p + off, n - off < piece ? n - off : piece, st);
            StreamSynchronize(st);
            double s = now() - t1;
            if (r) printf("%s%.2f", r > 1 ? ", " : "", (double)n / s / 1e9);
        }
        printf("]}\n");
        fflush(stdout);
        if (w == 0) MemFreeHost(p);
        else {
            HostUnregister(p);
            munmap(raw, len);
        }
    }
    MemFree(d);
    return 0;
}
