/* SPDX-License-Identifier: Apache-2.0 */
/* xfer.h - what other layers (the residency store, resid/) may ask of the
 * transfer engine: device blocks, pinned host blocks, moves between host
 * memory, files and the device, and the completion of a queued move. Nothing
 * here names the GPU backend: resid/ decides, xfer/ moves.
 * Internal to libferry (not exported by libferry.so). */
#ifndef FERRY_XFER_H
#define FERRY_XFER_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry.h"

/* Device addresses are plain integers (CUdeviceptr); gpu.h says the same. */
typedef uint64_t fy_dptr;

/* The context a device was opened with (its messages go there). */
ferry_ctx *fy_device_ctx(ferry_device *d);

/* Make the device current on the calling thread (cuda: the primary context,
 * shared with PyTorch). Every thread calls it before its first block or move. */
int fy_xfer_bind(ferry_device *d);

/* Make now the driver objects that moves and fences take from the device's
 * cache (the lane, streams, events), so that moves made later, inside a
 * caller's step, make none: called when a model is attached for streaming. */
int fy_xfer_warm(ferry_device *d);

/* ---- blocks ---- */

/* Device memory of n bytes (-ENOMEM / FERRY_E_DEVICE with the message set). */
int fy_xfer_dev_alloc(ferry_device *d, uint64_t n, fy_dptr *out);
void fy_xfer_dev_free(ferry_device *d, fy_dptr p);
/* Page-locked host memory of n bytes: copies from it run at the DMA rate. */
int fy_xfer_pinned_alloc(ferry_device *d, uint64_t n, void **out);
void fy_xfer_pinned_free(ferry_device *d, void *p);

/* ---- completions ---- */

/* A queued move. Every move below takes `fy_xfer_op **op`: NULL waits for the
 * move before returning; otherwise, when the call returns 0, *op receives its
 * completion, which the caller must give to fy_xfer_op_wait exactly once (a
 * copy that fails after queueing reports there). When the call itself fails
 * it has waited for whatever it queued, and *op is NULL.
 * Copies between page-locked memory and the device are queued on the
 * engine's streams and the call returns at once (the host memory must stay
 * valid until the wait); moves that go through reader threads (files) finish
 * before returning and hand back a completed op. The op carries an event per
 * stream, which is what ordering a caller's stream after a move needs. */
typedef struct fy_xfer_op fy_xfer_op;
/* Wait for the move, free op, and return its result (0 or the first error). */
int fy_xfer_op_wait(fy_xfer_op *op);
/* 1 done, 0 still running, < 0 failed (wait still frees it). Does not block. */
int fy_xfer_op_query(fy_xfer_op *op);
/* Make a caller's stream wait, on the device, for the move (the host does not
 * block): stream is the backend's raw handle (cuda: a CUstream such as
 * PyTorch's current stream, 0 the legacy default stream). Work queued on it
 * afterwards sees the moved bytes. The op stays the caller's to wait on. */
int fy_xfer_op_order(fy_xfer_op *op, uint64_t stream);

/* A point in a caller's stream (raw handle as for fy_xfer_op_order): done
 * once the work queued on that stream before the call has run. What a kernel
 * may still read is released only after its fence is done. */
typedef struct fy_xfer_fence fy_xfer_fence;
int fy_xfer_fence_new(ferry_device *d, uint64_t stream, fy_xfer_fence **out);
/* 1 done, 0 not yet, < 0 failed. Does not block. */
int fy_xfer_fence_query(fy_xfer_fence *f);
int fy_xfer_fence_wait(fy_xfer_fence *f);
void fy_xfer_fence_free(fy_xfer_fence *f);
/* Order the lane (the stream every queued host copy runs on, in order) after
 * f, on the device: every host copy queued from now on starts only once the
 * work f marks has run. The host does not block; f stays the caller's. */
int fy_xfer_lane_wait(ferry_device *d, fy_xfer_fence *f);

/* ---- moves ---- */

/* Host memory (pinned or pageable) and the device range it pairs with. */
typedef struct fy_hostrange {
    void *host;
    fy_dptr dev;
    uint64_t len;
} fy_hostrange;

/* Copies over several streams. Pageable host memory makes them synchronous. */
int fy_xfer_host_to_device(ferry_device *d, const fy_hostrange *r, int64_t n, fy_xfer_op **op);
int fy_xfer_device_to_host(ferry_device *d, const fy_hostrange *r, int64_t n, fy_xfer_op **op);

/* A range of a file descriptor and the device range it pairs with. */
typedef struct fy_fdrange {
    uint64_t off, len;
    fy_dptr dev;
} fy_fdrange;

/* Read r[0..n-1] from fd (path names it in messages) into device memory
 * through the pinned ring: threaded pread, asynchronous copies. o: ring
 * geometry and threads (NULL: defaults). */
int fy_xfer_fd_to_device(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, ferry_load_stats *st, fy_xfer_op **op);
/* Write device ranges to fd at r[k].off: device -> pinned ring -> pwrite, the
 * copies of later buffers overlapping the writes of earlier ones. Extra host
 * memory is the ring. -errno of a failed write (the message names path). */
int fy_xfer_device_to_fd(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, fy_xfer_op **op);
/* Read len bytes at off of fd into host memory (a spilled tensor read back
 * by the caller). -errno, or FERRY_E_CORRUPT when the file ends first. */
int fy_xfer_fd_to_host(ferry_device *d, int fd, uint64_t off, void *buf, uint64_t len);

#endif
