/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.c - the CUDA backend: the driver API reached through
 * dlopen("libcuda.so.1"), so libferry builds without a CUDA toolkit and loads
 * on machines without a GPU. It works in the device's primary context, the one
 * the CUDA runtime (and so PyTorch) uses, so pointers, streams and events are
 * shared with PyTorch in the same process. */
#define _GNU_SOURCE
#include "gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- the few driver API types and constants we use (cuda.h is not needed) ---- */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_READY = 600,
};

#define CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08u
#define CU_STREAM_NON_BLOCKING 0x01u
#define CU_EVENT_DISABLE_TIMING 0x02u
#define CU_EVENT_BLOCKING_SYNC 0x01u

/* The dlopen'd function table: the one global, filled once under pthread_once.
 * The library handle is never closed: the driver keeps threads and state that
 * outlive any one ferry handle, and unloading it under PyTorch would be fatal. */
typedef struct cu_api {
    int status;    /* 0: usable; FERRY_E_NODEV: see why */
    char why[512]; /* why the driver cannot be used */
    void *lib;

    CUresult (*Init)(unsigned flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*GetErrorName)(CUresult rc, const char **s);
    CUresult (*GetErrorString)(CUresult rc, const char **s);
    CUresult (*DeviceGetCount)(int *n);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice dev);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*CtxGetCurrent)(CUcontext *ctx);
    CUresult (*CtxSetCurrent)(CUcontext ctx);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t n);
    CUresult (*MemFree)(CUdeviceptr p);
    CUresult (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
    CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
    CUresult (*MemHostUnregister)(void *p);
    CUresult (*StreamCreate)(CUstream *s, unsigned flags);
    CUresult (*StreamDestroy)(CUstream s);
    CUresult (*StreamSynchronize)(CUstream s);
    CUresult (*EventCreate)(CUevent *e, unsigned flags);
    CUresult (*EventDestroy)(CUevent e);
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventSynchronize)(CUevent e);
    CUresult (*EventQuery)(CUevent e);
    CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);
    CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char v, size_t n, CUstream s); /* optional */
} cu_api;

static cu_api cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

/* Resolve the first of the given names that the library exports. Only names
 * with one signature are listed together: the unversioned cuMemAlloc & co.
 * take 32-bit sizes and must never stand in for the _v2 ones. */
static void *cu_sym(const char *name, const char *fallback)
{
    void *p = dlsym(cu.lib, name);
    if (!p && fallback) p = dlsym(cu.lib, fallback);
    return p;
}

static void cu_load(void)
{
    cu.status = FERRY_E_NODEV;
    dlerror();
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) {
        const char *e = dlerror();
        snprintf(cu.why, sizeof cu.why, "cannot load the NVIDIA driver (libcuda.so.1): %s",
                 e ? e : "unknown dlopen error");
        return;
    }
#define CU_LOAD2(field, name, fallback)                                                            \
    do {                                                                                           \
        cu.field = (__typeof__(cu.field))cu_sym(name, fallback);                                   \
        if (!cu.field) {                                                                           \
            snprintf(cu.why, sizeof cu.why,                                                        \
                     "the NVIDIA driver (libcuda.so.1) lacks %s: driver too old or broken", name); \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define CU_LOAD(field, name) CU_LOAD2(field, name, NULL)
    CU_LOAD(Init, "cuInit");
    CU_LOAD(DriverGetVersion, "cuDriverGetVersion");
    CU_LOAD(GetErrorName, "cuGetErrorName");
    CU_LOAD(GetErrorString, "cuGetErrorString");
    CU_LOAD(DeviceGetCount, "cuDeviceGetCount");
    CU_LOAD(DeviceGet, "cuDeviceGet");
    CU_LOAD(DeviceGetName, "cuDeviceGetName");
    CU_LOAD(DeviceTotalMem, "cuDeviceTotalMem_v2");
    CU_LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    CU_LOAD2(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    CU_LOAD(CtxGetCurrent, "cuCtxGetCurrent");
    CU_LOAD(CtxSetCurrent, "cuCtxSetCurrent");
    CU_LOAD(MemAlloc, "cuMemAlloc_v2");
    CU_LOAD(MemFree, "cuMemFree_v2");
    CU_LOAD(MemGetInfo, "cuMemGetInfo_v2");
    CU_LOAD(MemGetAddressRange, "cuMemGetAddressRange_v2");
    CU_LOAD(MemHostRegister, "cuMemHostRegister_v2");
    CU_LOAD(MemHostUnregister, "cuMemHostUnregister");
    CU_LOAD(StreamCreate, "cuStreamCreate");
    CU_LOAD2(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
    CU_LOAD(StreamSynchronize, "cuStreamSynchronize");
    CU_LOAD(EventCreate, "cuEventCreate");
    CU_LOAD2(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    CU_LOAD(EventRecord, "cuEventRecord");
    CU_LOAD(EventSynchronize, "cuEventSynchronize");
    CU_LOAD(EventQuery, "cuEventQuery");
    CU_LOAD(StreamWaitEvent, "cuStreamWaitEvent");
    CU_LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    CU_LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
#undef CU_LOAD
#undef CU_LOAD2
    cu.MemsetD8Async = (__typeof__(cu.MemsetD8Async))cu_sym("cuMemsetD8Async", NULL);
    cu.status = 0;
}

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; works before cuInit too. */
static void cu_describe(CUresult rc, char *buf, size_t n)
{
    const char *name = NULL, *str = NULL;
    if (cu.GetErrorName(rc, &name) != CUDA_SUCCESS) name = NULL;
    if (cu.GetErrorString(rc, &str) != CUDA_SUCCESS) str = NULL;
    if (name && str) snprintf(buf, n, "%s (%s)", name, str);
    else if (name) snprintf(buf, n, "%s", name);
    else snprintf(buf, n, "CUDA error %d", rc);
}

/* ---- the handle ---- */

typedef struct cu_gpu {
    fy_gpu base; /* first: a cu_gpu * is a fy_gpu * */
    CUdevice dev;
    CUcontext ctx; /* the primary context, retained */
} cu_gpu;

struct fy_stream {
    CUstream s;
};

struct fy_event {
    CUevent e;
};

static inline cu_gpu *cu_of(fy_gpu *g)
{
    return (cu_gpu *)g;
}

/* Record "cuda:N: <what>: CUDA_ERROR_X (text)" and return -ENOMEM for an
 * out-of-memory error, FERRY_E_DEVICE for any other. */
__attribute__((format(printf, 3, 4))) static int cu_fail(fy_gpu *g, CUresult rc, const char *fmt, ...)
{
    char what[384], desc[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    cu_describe(rc, desc, sizeof desc);
    int code = rc == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : FERRY_E_DEVICE;
    return fy_seterr(g->err, code, "cuda:%d: %s: %s", g->ordinal, what, desc);
}

/* Make g's context current on the calling thread. Every op does this itself:
 * ferry runs ops on worker threads, and a caller's thread may have been
 * switched to another device's context (torch.cuda.set_device) since ferry
 * last ran there, so a per-thread cache of "already current" could go stale
 * and allocate on the wrong GPU. Asking the driver is cheap: on the H200
 * cuCtxGetCurrent took 12 ns and cuCtxSetCurrent 26 ns, against 290 ns for
 * cuEventQuery and microseconds for a copy. */
static int cu_enter(fy_gpu *g)
{
    cu_gpu *c = cu_of(g);
    CUcontext cur = NULL;
    CUresult rc = cu.CtxGetCurrent(&cur);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuCtxGetCurrent");
    if (cur == c->ctx) return 0;
    rc = cu.CtxSetCurrent(c->ctx);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuCtxSetCurrent");
    return 0;
}

static int cu_bind_thread(fy_gpu *g)
{
    return cu_enter(g);
}

static void cu_close(fy_gpu *g)
{
    if (!g) return;
    cu_gpu *c = cu_of(g);
    /* The context stays current on the threads that used it: PyTorch may be
     * using it too, and a released primary context keeps its handle. */
    CUresult rc = cu.DevicePrimaryCtxRelease(c->dev);
    if (rc != CUDA_SUCCESS) cu_fail(g, rc, "cuDevicePrimaryCtxRelease");
    fy_free(g->mem, c);
}

/* ---- device memory ---- */

#define TOUCH_MIN (64u << 20)

static int cu_mem_alloc(fy_gpu *g, size_t n, fy_dptr *out)
{
    *out = 0;
    FY_RETURN_IF(n == 0, g->err, FERRY_E_INVAL, "cuda:%d: cuMemAlloc(0 bytes): zero-size allocation",
                 g->ordinal);
    FY_TRY(cu_enter(g));
    CUdeviceptr p = 0;
    CUresult rc = cu.MemAlloc(&p, n);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuMemAlloc(%zu bytes)", n);
    /* The first DMA into fresh device memory is slower (a 10 GB load into a new
     * block lost ~20 ms on the H200 host against the same block reused); a
     * memset on the device writes it first at ~4 TB/s (2.4 ms for 10 GB).
     * On its own stream, waited for, so no copy can race it. An optimisation
     * only: a failure here changes nothing. */
    if (n >= TOUCH_MIN && cu.MemsetD8Async) {
        CUstream st = NULL;
        if (cu.StreamCreate(&st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
            if (cu.MemsetD8Async(p, 0, n, st) == CUDA_SUCCESS) cu.StreamSynchronize(st);
            cu.StreamDestroy(st);
        }
    }
    *out = (fy_dptr)p;
    return 0;
}

static int cu_mem_free(fy_gpu *g, fy_dptr p)
{
    if (!p) return 0;
    FY_TRY(cu_enter(g));
    CUresult rc = cu.MemFree((CUdeviceptr)p);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuMemFree(0x%llx)", (unsigned long long)p);
    return 0;
}

static int cu_mem_info(fy_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes)
{
    FY_TRY(cu_enter(g));
    size_t f = 0, t = 0;
    CUresult rc = cu.MemGetInfo(&f, &t);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuMemGetInfo");
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}

static int cu_mem_range(fy_gpu *g, fy_dptr p, fy_dptr *base, size_t *size)
{
    FY_TRY(cu_enter(g));
    CUdeviceptr b = 0;
    size_t n = 0;
    if (cu.MemGetAddressRange(&b, &n, (CUdeviceptr)p) != CUDA_SUCCESS)
        return FERRY_E_NOTFOUND; /* (no message: gpu.h) */
    *base = (fy_dptr)b;
    *size = n;
    return 0;
}

/* ---- page-locked host memory ---- */

/* Pinned memory is anonymous memory, populated, then registered: on the H200
 * host cuMemHostAlloc took 1.7-2.1 s for 4 GiB where registering touched
 * memory took 0.17-0.21 s (bench_pinrate times both ways of making pinned
 * memory). Allocations of 2 MiB or more are
 * 2 MiB-aligned and asked to use transparent huge pages, so faulting them in
 * and pinning them takes a few hundred page operations instead of 4 KiB each.
 * The page before the data holds the mapping's start and length. */
#define HOST_HDR 4096u
#define HUGE (2u << 20)

/* Fault fresh anonymous memory in with several threads: the kernel zeroes
 * each page on first touch, and cuMemHostRegister would otherwise do that on
 * one thread (256 MiB: 88 ms faulted by the register call, 121 ms with
 * MAP_POPULATE, 35 ms touched by 8 threads then registered; bench_alloc). */
typedef struct touch_span {
    volatile uint8_t *p;
    size_t n;
} touch_span;

static void *touch_run(void *a)
{
    touch_span *t = a;
    for (size_t i = 0; i < t->n; i += 4096) t->p[i] = 0;
    return NULL;
}

static void touch_parallel(uint8_t *p, size_t n)
{
    enum { MAXT = 8 };
    size_t per = n / MAXT;
    if (n < (64u << 20)) per = n; /* small: one thread (this one) */
    per = (per + 4095) & ~(size_t)4095;
    pthread_t th[MAXT];
    touch_span sp[MAXT];
    int ns = 0, started = 0;
    for (size_t off = 0; ns < MAXT && off < n; off += per)
        sp[ns++] = (touch_span){p + off, n - off < per ? n - off : per};
    for (int k = 1; k < ns; k++) { /* span 0 is this thread's */
        if (pthread_create(&th[started], NULL, touch_run, &sp[k]) == 0) started++;
        else touch_run(&sp[k]);
    }
    touch_run(&sp[0]);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
}

static int cu_host_alloc(fy_gpu *g, size_t n, void **out)
{
    *out = NULL;
    FY_RETURN_IF(n == 0, g->err, FERRY_E_INVAL, "cuda:%d: pinned allocation of 0 bytes", g->ordinal);
    FY_RETURN_IF(n > SIZE_MAX / 2, g->err, FERRY_E_INVAL, "cuda:%d: pinned allocation of %zu bytes",
                 g->ordinal, n);
    FY_TRY(cu_enter(g));
    bool huge = n >= HUGE;
    size_t data = huge ? (n + HUGE - 1) & ~(size_t)(HUGE - 1) : (n + 4095) & ~(size_t)4095;
    size_t len = HOST_HDR + data + (huge ? HUGE : 0);
    uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | (huge ? 0 : MAP_POPULATE), -1, 0);
    if (raw == MAP_FAILED) {
        int e = -errno;
        return fy_seterr(g->err, e, "cuda:%d: mmap of %zu bytes for pinned memory: %s", g->ordinal, len,
                         ferry_strerror(e));
    }
    uint8_t *p = raw + HOST_HDR;
    if (huge) {
        p = (uint8_t *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
        madvise(p, data, MADV_HUGEPAGE); /* a hint: without THP it is 4 KiB pages */
        touch_parallel(p, data);
    }
    memcpy(p - HOST_HDR, &raw, sizeof raw);
    memcpy(p - HOST_HDR + sizeof raw, &len, sizeof len);
    CUresult rc = cu.MemHostRegister(p, data, CU_MEMHOSTREGISTER_PORTABLE);
    if (rc != CUDA_SUCCESS) {
        munmap(raw, len);
        return cu_fail(g, rc, "cuMemHostRegister(%zu bytes of anonymous memory)", n);
    }
    *out = p;
    return 0;
}

static int cu_host_free(fy_gpu *g, void *p)
{
    if (!p) return 0;
    FY_TRY(cu_enter(g));
    uint8_t *raw;
    size_t len;
    memcpy(&raw, (uint8_t *)p - HOST_HDR, sizeof raw);
    memcpy(&len, (uint8_t *)p - HOST_HDR + sizeof raw, sizeof len);
    CUresult rc = cu.MemHostUnregister(p);
    munmap(raw, len);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuMemHostUnregister(%p)", p);
    return 0;
}

/* READ_ONLY is what lets a MAP_SHARED, PROT_READ file mapping be registered at
 * all (with the default flags the driver refuses it). The caller must never pass
 * a MAP_PRIVATE mapping: registering one hung the process on the H200 host. */
static int cu_host_register(fy_gpu *g, void *p, size_t n, bool read_only)
{
    FY_RETURN_IF(!p || n == 0, g->err, FERRY_E_INVAL,
                 "cuda:%d: cuMemHostRegister(%p, %zu bytes): empty range", g->ordinal, p, n);
    FY_TRY(cu_enter(g));
    unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | (read_only ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
    CUresult rc = cu.MemHostRegister(p, n, flags);
    if (rc != CUDA_SUCCESS)
        return cu_fail(g, rc, "cuMemHostRegister(%p, %zu bytes, %s)", p, n,
                       read_only ? "PORTABLE|READ_ONLY" : "PORTABLE");
    return 0;
}

static int cu_host_unregister(fy_gpu *g, void *p)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.MemHostUnregister(p);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuMemHostUnregister(%p)", p);
    return 0;
}

/* ---- streams and events ---- */

static int cu_stream_new(fy_gpu *g, fy_stream **out)
{
    *out = NULL;
    FY_TRY(cu_enter(g));
    fy_stream *s = fy_malloc(g->mem, sizeof *s);
    if (!s) return fy_seterr(g->err, -ENOMEM, "cuda:%d: out of host memory for a stream", g->ordinal);
    /* Non-blocking: never serialised against the legacy default stream that
     * other code in the process (PyTorch) may be using. */
    CUresult rc = cu.StreamCreate(&s->s, CU_STREAM_NON_BLOCKING);
    if (rc != CUDA_SUCCESS) {
        fy_free(g->mem, s);
        return cu_fail(g, rc, "cuStreamCreate");
    }
    *out = s;
    return 0;
}

static void cu_stream_free(fy_gpu *g, fy_stream *s)
{
    if (!s) return;
    if (cu_enter(g) == 0) {
        CUresult rc = cu.StreamDestroy(s->s);
        if (rc != CUDA_SUCCESS) cu_fail(g, rc, "cuStreamDestroy");
    }
    fy_free(g->mem, s);
}

static int cu_stream_sync(fy_gpu *g, fy_stream *s)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.StreamSynchronize(s ? s->s : NULL);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuStreamSynchronize");
    return 0;
}

static int cu_event_new(fy_gpu *g, fy_event **out)
{
    *out = NULL;
    FY_TRY(cu_enter(g));
    fy_event *e = fy_malloc(g->mem, sizeof *e);
    if (!e) return fy_seterr(g->err, -ENOMEM, "cuda:%d: out of host memory for an event", g->ordinal);
    /* No timing: cheaper to record and query, and ferry only asks "done?". */
    /* blocking: up to 16 reader threads wait on events; spinning would take the
     * cores that copy from the page cache */
    CUresult rc = cu.EventCreate(&e->e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
    if (rc != CUDA_SUCCESS) {
        fy_free(g->mem, e);
        return cu_fail(g, rc, "cuEventCreate");
    }
    *out = e;
    return 0;
}

static void cu_event_free(fy_gpu *g, fy_event *e)
{
    if (!e) return;
    if (cu_enter(g) == 0) {
        CUresult rc = cu.EventDestroy(e->e);
        if (rc != CUDA_SUCCESS) cu_fail(g, rc, "cuEventDestroy");
    }
    fy_free(g->mem, e);
}

static int cu_event_record(fy_gpu *g, fy_event *e, fy_stream *s)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.EventRecord(e->e, s ? s->s : NULL);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuEventRecord");
    return 0;
}

static int cu_event_sync(fy_gpu *g, fy_event *e)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.EventSynchronize(e->e);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuEventSynchronize");
    return 0;
}

/* The caller's stream (PyTorch's current one, say) waits on the device for
 * e: ordering without a host sync. */
static int cu_stream_wait(fy_gpu *g, uint64_t raw, fy_event *e)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.StreamWaitEvent((CUstream)(uintptr_t)raw, e->e, 0);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuStreamWaitEvent");
    return 0;
}

static int cu_event_record_raw(fy_gpu *g, fy_event *e, uint64_t raw)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.EventRecord(e->e, (CUstream)(uintptr_t)raw);
    if (rc != CUDA_SUCCESS) return cu_fail(g, rc, "cuEventRecord");
    return 0;
}

static uint64_t cu_stream_raw(fy_gpu *g, fy_stream *s)
{
    (void)g;
    return (uint64_t)(uintptr_t)s->s;
}

static int cu_event_query(fy_gpu *g, fy_event *e)
{
    FY_TRY(cu_enter(g));
    CUresult rc = cu.EventQuery(e->e);
    if (rc == CUDA_SUCCESS) return 1;
    if (rc == CUDA_ERROR_NOT_READY) return 0;
    return cu_fail(g, rc, "cuEventQuery");
}

/* ---- copies ---- */

static int cu_copy_htod(fy_gpu *g, fy_dptr dst, const void *src, size_t n, fy_stream *s)
{
    if (n == 0) return 0;
    FY_TRY(cu_enter(g));
    CUresult rc = cu.MemcpyHtoDAsync((CUdeviceptr)dst, src, n, s ? s->s : NULL);
    if (rc != CUDA_SUCCESS)
        return cu_fail(g, rc, "cuMemcpyHtoDAsync(0x%llx <- %p, %zu bytes)", (unsigned long long)dst, src, n);
    return 0;
}

static int cu_copy_dtoh(fy_gpu *g, void *dst, fy_dptr src, size_t n, fy_stream *s)
{
    if (n == 0) return 0;
    FY_TRY(cu_enter(g));
    CUresult rc = cu.MemcpyDtoHAsync(dst, (CUdeviceptr)src, n, s ? s->s : NULL);
    if (rc != CUDA_SUCCESS)
        return cu_fail(g, rc, "cuMemcpyDtoHAsync(%p <- 0x%llx, %zu bytes)", dst, (unsigned long long)src, n);
    return 0;
}

static const fy_gpu_ops cu_ops = {
    .name = "cuda",
    .close = cu_close,
    .mem_alloc = cu_mem_alloc,
    .mem_range = cu_mem_range,
    .mem_free = cu_mem_free,
    .mem_info = cu_mem_info,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .stream_new = cu_stream_new,
    .stream_free = cu_stream_free,
    .stream_sync = cu_stream_sync,
    .event_new = cu_event_new,
    .event_free = cu_event_free,
    .event_record = cu_event_record,
    .event_sync = cu_event_sync,
    .event_query = cu_event_query,
    .copy_htod = cu_copy_htod,
    .copy_dtoh = cu_copy_dtoh,
    .bind_thread = cu_bind_thread,
    .stream_wait = cu_stream_wait,
    .stream_raw = cu_stream_raw,
    .event_record_raw = cu_event_record_raw,
};

/* ---- open ---- */

int fy_gpu_cuda_open(int ordinal, const ferry_allocator *mem, fy_err *err, fy_gpu **out)
{
    char desc[256];
    CUresult rc;
    if (!out) return fy_seterr(err, FERRY_E_INVAL, "fy_gpu_cuda_open: out is NULL");
    *out = NULL;
    if (!mem) mem = fy_default_allocator();

    pthread_once(&cu_once, cu_load);
    if (cu.status != 0) return fy_seterr(err, cu.status, "cuda:%d: %s", ordinal, cu.why);

    /* Say which driver it is: most cuInit failures are a driver that is too
     * old for, or mismatched with, the kernel module. */
    int ver = 0;
    char vbuf[48] = "unknown";
    if (cu.DriverGetVersion(&ver) == CUDA_SUCCESS)
        snprintf(vbuf, sizeof vbuf, "%d.%d", ver / 1000, (ver % 1000) / 10);

    rc = cu.Init(0);
    if (rc != CUDA_SUCCESS) {
        cu_describe(rc, desc, sizeof desc);
        return fy_seterr(err, FERRY_E_NODEV,
                         "cuda:%d: cuInit failed: %s; 0 usable CUDA devices found (driver supports CUDA %s)",
                         ordinal, desc, vbuf);
    }
    int count = 0;
    rc = cu.DeviceGetCount(&count);
    if (rc != CUDA_SUCCESS) {
        cu_describe(rc, desc, sizeof desc);
        return fy_seterr(err, FERRY_E_NODEV, "cuda:%d: cuDeviceGetCount failed: %s", ordinal, desc);
    }
    if (ordinal < 0 || ordinal >= count) {
        if (count == 0)
            return fy_seterr(err, FERRY_E_NODEV, "cuda:%d: no such device: 0 CUDA devices found", ordinal);
        if (count == 1)
            return fy_seterr(err, FERRY_E_NODEV, "cuda:%d: no such device: 1 CUDA device found (cuda:0)",
                             ordinal);
        return fy_seterr(err, FERRY_E_NODEV,
                         "cuda:%d: no such device: %d CUDA devices found (cuda:0..cuda:%d)", ordinal, count,
                         count - 1);
    }

    CUdevice dev = 0;
    rc = cu.DeviceGet(&dev, ordinal);
    if (rc != CUDA_SUCCESS) {
        cu_describe(rc, desc, sizeof desc);
        return fy_seterr(err, FERRY_E_NODEV, "cuda:%d: cuDeviceGet failed: %s", ordinal, desc);
    }
    char name[80];
    rc = cu.DeviceGetName(name, (int)sizeof name, dev);
    if (rc != CUDA_SUCCESS) snprintf(name, sizeof name, "CUDA device");
    name[sizeof name - 1] = '\0';
    size_t total = 0;
    rc = cu.DeviceTotalMem(&total, dev);
    if (rc != CUDA_SUCCESS) total = 0;

    cu_gpu *c = fy_calloc(mem, 1, sizeof *c);
    if (!c) return fy_seterr(err, -ENOMEM, "cuda:%d: out of host memory", ordinal);
    c->base.ops = &cu_ops;
    c->base.mem = mem;
    c->base.err = err;
    c->base.ordinal = ordinal;
    c->dev = dev;
    /* The primary context is the runtime's (PyTorch's): retaining it instead of
     * creating our own means one context per device, shared memory pointers,
     * and no per-context memory overhead. */
    rc = cu.DevicePrimaryCtxRetain(&c->ctx, dev);
    if (rc != CUDA_SUCCESS) {
        int code = cu_fail(&c->base, rc, "cuDevicePrimaryCtxRetain");
        fy_free(mem, c);
        return code;
    }
    /* name is at most 79 characters: the line fits desc[128] for any real device. */
    snprintf(c->base.desc, sizeof c->base.desc, "%s (cuda:%d, %.1f GiB)", name, ordinal,
             (double)total / (double)(1ull << 30));
    *out = &c->base;
    return 0;
}
