/* bench_alloc.c - what do the store's allocations cost on a real GPU?
 *
 *   bench_alloc [N] [BYTES]      (default 540 allocations of 19 MiB)
 *
 * Measures, with the driver API reached through dlopen (as ferry does):
 * cuMemAlloc/cuMemFree one by one; cuMemAllocAsync/cuMemFreeAsync (the
 * stream-ordered pool) on one stream with one synchronize; and pinned host
 * memory of 256 MiB made three ways: transparent huge pages faulted in by
 * cuMemHostRegister, MAP_POPULATE then register, and pages touched by 8
 * threads then register. Also copies into fresh and reused device memory.
 * Prints one JSON object per measurement. Experiment code: not the library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream;

static CUresult (*Init)(unsigned);
static CUresult (*DeviceGet)(int *, int);
static CUresult (*PrimaryCtxRetain)(CUcontext *, int);
static CUresult (*CtxSetCurrent)(CUcontext);
static CUresult (*MemAlloc)(CUdeviceptr *, size_t);
static CUresult (*MemFree)(CUdeviceptr);
static CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
static CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
static CUresult (*StreamCreate)(CUstream *, unsigned);
static CUresult (*StreamSynchronize)(CUstream);
static CUresult (*HostRegister)(void *, size_t, unsigned);
static CUresult (*HostUnregister)(void *);
static CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct span {
    char *p;
    size_t n;
} span;

static void *toucher(void *a)
{
    span *s = a;
    for (size_t i = 0; i < s->n; i += 4096) s->p[i] = 0;
    return NULL;
}

#define SYM(v, n) v = (__typeof__(v))dlsym(h, n)

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 540;
    size_t bytes = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (19u << 20);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 1;
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(MemAllocAsync, "cuMemAllocAsync");
    SYM(MemFreeAsync, "cuMemFreeAsync");
    SYM(StreamCreate, "cuStreamCreate");
    SYM(StreamSynchronize, "cuStreamSynchronize");
    SYM(HostRegister, "cuMemHostRegister_v2");
    SYM(HostUnregister, "cuMemHostUnregister");
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    SYM(MemsetD8, "cuMemsetD8_v2");
    int dev;
    CUcontext ctx;
    if (Init(0) || DeviceGet(&dev, 0) || PrimaryCtxRetain(&ctx, dev) || CtxSetCurrent(ctx)) return 1;
    CUstream st;
    StreamCreate(&st, 1);
    CUdeviceptr *p = calloc((size_t)n, sizeof *p);
    for (int round = 0; round < 2; round++) {
        double t0 = now();
        for (int i = 0; i < n; i++) MemAlloc(&p[i], bytes);
        double ta = now() - t0;
        t0 = now();
        for (int i = 0; i < n; i++) MemFree(p[i]);
        double tf = now() - t0;
        printf("{\"what\": \"cuMemAlloc/cuMemFree\", \"round\": %d, \"n\": %d, \"alloc_ms\": %.2f, \"free_ms\": %.2f}\n",
               round, n, ta * 1e3, tf * 1e3);
    }
    if (MemAllocAsync)
        for (int round = 0; round < 3; round++) {
            double t0 = now();
            for (int i = 0; i < n; i++) MemAllocAsync(&p[i], bytes, st);
            StreamSynchronize(st);
            double ta = now() - t0;
            t0 = now();
            for (int i = 0; i < n; i++) MemFreeAsync(p[i], st);
            StreamSynchronize(st);
            double tf = now() - t0;
            printf("{\"what\": \"cuMemAllocAsync/cuMemFreeAsync\", \"round\": %d, \"n\": %d, \"alloc_ms\": %.2f, "
                   "\"free_ms\": %.2f}\n",
                   round, n, ta * 1e3, tf * 1e3);
        }
    /* pinned host memory, 256 MiB, three ways */
    const size_t P = 256u << 20;
    for (int way = 0; way < 3; way++) {
        double t0 = now();
        char *raw = mmap(NULL, P + (2u << 20), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | (way == 1 ? MAP_POPULATE : 0), -1, 0);
        char *a = (char *)(((uintptr_t)raw + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
        if (way == 0) madvise(a, P, MADV_HUGEPAGE);
        if (way == 2) {
            pthread_t th[8];
            span sp[8];
            for (int k = 0; k < 8; k++) {
                sp[k] = (span){a + k * (P / 8), P / 8};
                pthread_create(&th[k], NULL, toucher, &sp[k]);
            }
            for (int k = 0; k < 8; k++) pthread_join(th[k], NULL);
        }
        double tt = now() - t0;
        int rc = HostRegister(a, P, 1);
        double tr = now() - t0;
        printf("{\"what\": \"pinned 256 MiB\", \"way\": \"%s\", \"touch_ms\": %.2f, \"total_ms\": %.2f, \"rc\": %d}\n",
               way == 0 ? "THP, faulted by register" : way == 1 ? "MAP_POPULATE" : "8 threads touch", tt * 1e3,
               tr * 1e3, rc);
        HostUnregister(a);
        munmap(raw, P + (2u << 20));
    }
    /* copies into fresh vs reused device memory: 40 x 256 MiB from one pinned buffer */
    {
        char *src = mmap(NULL, P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        HostRegister(src, P, 1);
        CUdeviceptr big;
        for (int round = 0; round < 3; round++) {
            if (round < 2) MemAlloc(&big, 40 * P);
            double t0 = now();
            for (int i = 0; i < 40; i++) MemcpyHtoDAsync(big + (CUdeviceptr)i * P, src, P, st);
            StreamSynchronize(st);
            double s = now() - t0;
            printf("{\"what\": \"copy 10 GiB\", \"into\": \"%s\", \"gbps\": %.2f}\n",
                   round == 2 ? "reused" : "fresh", 40.0 * (double)P / s / 1e9);
            if (round == 0) MemFree(big);
        }
        MemFree(big);
        /* freed memory reallocated after a pause: does the slow first write
         * recover with time (the driver clearing freed memory in the
         * background) or only when written (cuMemsetD8, timed apart)? */
        static const double pause[] = {0, 0.2, 1, 3};
        for (int k = 0; k < 4; k++)
            for (int ms = 0; ms < 2; ms++) {
                struct timespec ts = {(time_t)pause[k], (long)((pause[k] - (double)(time_t)pause[k]) * 1e9)};
                nanosleep(&ts, NULL); /* after the previous MemFree */
                MemAlloc(&big, 40 * P);
                double tm = 0;
                if (ms) {
                    double t1 = now();
                    MemsetD8(big, 0, 40 * P);
                    StreamSynchronize(NULL);
                    tm = now() - t1;
                }
                double t0 = now();
                for (int i = 0; i < 40; i++) MemcpyHtoDAsync(big + (CUdeviceptr)i * P, src, P, st);
                StreamSynchronize(st);
                double s = now() - t0;
                printf("{\"what\": \"copy 10 GiB\", \"into\": \"freed %.1f s before%s\", \"gbps\": %.2f, "
                       "\"memset_ms\": %.2f}\n",
                       pause[k], ms ? ", memset first" : "", 40.0 * (double)P / s / 1e9, tm * 1e3);
                MemFree(big);
            }
    }
    return 0;
}
