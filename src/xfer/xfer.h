/* xfer.h - internal hooks of the transfer engine for tests (not exported by
 * libferry.so; the tests link libferry.a). */
#ifndef FERRY_XFER_H
#define FERRY_XFER_H

#include "../gpu/gpu.h"

/* The backend behind a device: tests inject sim faults and read its usage. */
fy_gpu *fy_device_gpu(ferry_device *d);
/* The context a device was opened with (its messages go there). */
ferry_ctx *fy_device_ctx(ferry_device *d);

/* ---- moves for the residency store (resid/) ---- */

/* A range of a file descriptor and the device range it pairs with. */
typedef struct fy_fdrange {
    uint64_t off, len;
    fy_dptr dev;
} fy_fdrange;

/* Read r[0..n-1] from fd (path names it in messages) into device memory
 * through the pinned ring: threaded pread, asynchronous copies. Waits. */
int fy_xfer_fd_to_device(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o, ferry_load_stats *st);
/* Write device ranges to fd at r[k].off: device -> pinned ring -> pwrite, the
 * copies of later buffers overlapping the writes of earlier ones. Extra host
 * memory is the ring. Waits. -errno of a failed write (message names path). */
int fy_xfer_device_to_fd(ferry_device *d, int fd, const char *path, const fy_fdrange *r, int64_t n,
                         const ferry_load_opts *o);

/* Host (pinned or pageable) <-> device copies over several streams. Waits. */
typedef struct fy_hostrange {
    void *host;
    fy_dptr dev;
    uint64_t len;
} fy_hostrange;
int fy_xfer_host_to_device(ferry_device *d, const fy_hostrange *r, int64_t n);
int fy_xfer_device_to_host(ferry_device *d, const fy_hostrange *r, int64_t n);

#endif
