/* SPDX-License-Identifier: Apache-2.0 */
/* gpu.h - device backends behind one ops table. Only gpu/ knows CUDA: the
 * cuda backend reaches the driver API through dlopen("libcuda.so.1"); the sim
 * backend emulates a GPU on host memory (capacity, asynchronous copies on
 * streams, events, pinned memory, registration) with injectable failures.
 * Depends on common/ only. */
#ifndef FERRY_GPU_H
#define FERRY_GPU_H

#include "common/common.h"

typedef struct fy_gpu fy_gpu;
typedef struct fy_stream fy_stream;
typedef struct fy_event fy_event;

/* Device addresses are plain integers (CUdeviceptr). */
typedef uint64_t fy_dptr;

/* Which call a sim fault hits (fy_gpu_sim_fault). */
typedef enum fy_gpu_op {
    FY_OP_ANY = 0,
    FY_OP_MEM_ALLOC,
    FY_OP_HOST_ALLOC,
    FY_OP_HOST_REGISTER,
    FY_OP_COPY, /* either direction */
    FY_OP_EVENT,
    FY_OP_COUNT
} fy_gpu_op;

typedef struct fy_gpu_ops {
    const char *name; /* "cuda", "sim" */
    void (*close)(fy_gpu *g);
    /* device memory */
    int (*mem_alloc)(fy_gpu *g, size_t n, fy_dptr *out);
    int (*mem_free)(fy_gpu *g, fy_dptr p);
    int (*mem_info)(fy_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes);
    /* the allocation holding device address p: its start and size (one copy
     * may not run from one allocation into the next, however adjacent). A
     * failure (p not device memory of this backend's) leaves no message: a
     * caller's pointer may be anything the copies accept */
    int (*mem_range)(fy_gpu *g, fy_dptr p, fy_dptr *base, size_t *size);
    /* page-locked host memory */
    int (*host_alloc)(fy_gpu *g, size_t n, void **out);
    int (*host_free)(fy_gpu *g, void *p);
    /* page-lock existing memory; read_only for file mappings (MAP_SHARED, PROT_READ only) */
    int (*host_register)(fy_gpu *g, void *p, size_t n, bool read_only);
    int (*host_unregister)(fy_gpu *g, void *p);
    /* streams and events */
    int (*stream_new)(fy_gpu *g, fy_stream **out);
    void (*stream_free)(fy_gpu *g, fy_stream *s);
    int (*stream_sync)(fy_gpu *g, fy_stream *s);
    int (*event_new)(fy_gpu *g, fy_event **out);
    void (*event_free)(fy_gpu *g, fy_event *e);
    int (*event_record)(fy_gpu *g, fy_event *e, fy_stream *s);
    int (*event_sync)(fy_gpu *g, fy_event *e);
    /* 1 done, 0 not yet, < 0 error */
    int (*event_query)(fy_gpu *g, fy_event *e);
    /* asynchronous copies; src/dst host memory must stay valid until an event
     * recorded after them completes */
    int (*copy_htod)(fy_gpu *g, fy_dptr dst, const void *src, size_t n, fy_stream *s);
    int (*copy_dtoh)(fy_gpu *g, void *dst, fy_dptr src, size_t n, fy_stream *s);
    /* make the device's context current on the calling thread (cuda: the
     * primary context, shared with PyTorch); no-op for sim */
    int (*bind_thread)(fy_gpu *g);
    /* Make a stream that is not ours wait, on the device, until e's latest
     * record has completed; the host does not block. raw is the backend's
     * own stream handle: cuda a CUstream (0: the legacy default stream), e.g.
     * PyTorch's current stream; sim a fy_stream of this device, 0 meaning
     * "the caller's thread" (the call then waits on the host). */
    int (*stream_wait)(fy_gpu *g, uint64_t raw, fy_event *e);
    /* The raw handle stream_wait takes for one of our streams. */
    uint64_t (*stream_raw)(fy_gpu *g, fy_stream *s);
    /* Record e on a stream that is not ours (raw as for stream_wait; sim: 0
     * means the caller's thread, so e is complete at once). */
    int (*event_record_raw)(fy_gpu *g, fy_event *e, uint64_t raw);
} fy_gpu_ops;

/* Every backend's handle starts with this. */
struct fy_gpu {
    const fy_gpu_ops *ops;
    const ferry_allocator *mem;
    fy_err *err;       /* where backend messages go (the owning context's) */
    int ordinal;       /* device number */
    char desc[128];    /* "NVIDIA H200 (cuda:0, 139.8 GiB)" / "sim (24.0 GiB)" */
    bool host_visible; /* "cpu": device addresses are ordinary host memory that
                          the transfer engine may read into directly */
};

/* Open "cuda:N", "sim:SIZE" (e.g. "sim:24GiB", "sim:512MiB", "sim:1000000"), or
 * "cpu": pageable host memory (the sim backend sized to the machine's RAM,
 * marked host_visible so loads read straight into it).
 * Errors: FERRY_E_NODEV (no driver, no such device: the message says why),
 * FERRY_E_INVAL (bad spec), -ENOMEM. */
int fy_gpu_open(const char *spec, const ferry_allocator *mem, fy_err *err, fy_gpu **out);
void fy_gpu_close(fy_gpu *g);

int fy_gpu_cuda_open(int ordinal, const ferry_allocator *mem, fy_err *err, fy_gpu **out);
/* bytes_per_s: the modelled copy rate per direction (copies on every stream
 * share it, as on one copy engine per direction); 0 = as fast as memcpy. */
int fy_gpu_sim_open(uint64_t capacity, uint64_t bytes_per_s, const ferry_allocator *mem, fy_err *err,
                    fy_gpu **out);

/* Sim only: the nth call (1 = next) of kind op fails (FERRY_E_DEVICE, or -ENOMEM
 * for allocations); 0 disarms. Returns FERRY_E_INVAL for a non-sim device. */
int fy_gpu_sim_fault(fy_gpu *g, fy_gpu_op op, long nth);
/* Sim only: host_alloc (pinning) takes n / bytes_per_s seconds, as pinning
 * does on a real device (about 7 GB/s on the H200 host); 0 = instant. */
int fy_gpu_sim_pin_rate(fy_gpu *g, uint64_t bytes_per_s);
/* Sim only: bytes currently allocated / registered / pinned, for leak checks. */
int fy_gpu_sim_usage(fy_gpu *g, uint64_t *device, uint64_t *pinned, uint64_t *registered);

/* GPUDirect Storage probe: loads libcufile (dlopen), opens its driver and
 * registers a handle for fd (fd < 0: the driver alone). 0 if cuFile accepts the file, else FERRY_E_NODEV
 * with the reason in why. The first call may take a while (driver start-up). */
int fy_cufile_probe(fy_gpu *g, int fd, char *why, size_t n);

/* Parse "24GiB", "512MiB", "1.5GB", "4096" into bytes; false if malformed. */
bool fy_parse_size(const char *s, uint64_t *out);

#endif /* FERRY_GPU_H */
