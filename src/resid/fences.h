/* SPDX-License-Identifier: Apache-2.0 */
/* fences.h - release fences as a resource of their own: entries that wait
 * for work queued on a caller's stream (a fence each), in two lists.
 * Pending: each carries an item (the store's: a held tensor) to let go of
 * once its fence is done. Reuse: entries whose item went early (their
 * memory may be reused); every new write into device memory is ordered
 * after those still running, on the device's lane or by the host waiting.
 * It knows a device and an allocator; the items are the owner's, reached
 * only through its callbacks. Not thread-safe: the owner serialises calls. */
#ifndef FERRY_FENCES_H
#define FERRY_FENCES_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "xfer/xfer.h"

typedef struct rs_fence {
    struct rs_fence *next;
    void *item; /* pending: the owner's item; NULL once deferred (in reuse) */
    fy_xfer_fence *f;
    bool laned; /* in reuse: the lane waits for it already */
} rs_fence;

typedef struct rs_fences {
    ferry_device *dev;
    const ferry_allocator *m;
    rs_fence *pending, *reuse;
    uint64_t waits, orders; /* host waits for a fence; lane orderings after one */
} rs_fences;

void rs_fences_init(rs_fences *fs, ferry_device *dev, const ferry_allocator *m);
/* A fence on cu_stream for item, pending: 0, -ENOMEM (no memory for the
 * entry), or the device's error (*device set; its message on the device). */
int rs_fences_add(rs_fences *fs, uint64_t cu_stream, void *item, bool *device);
/* Pending entries for item. */
int64_t rs_fences_pending(const rs_fences *fs, const void *item);
/* Free the pending entries whose fences are done (wait: after waiting for
 * each; a failed fence counts as done), calling done(item, arg) for each,
 * and the reuse entries that are done (never waiting). The items let go. */
int64_t rs_fences_reap(rs_fences *fs, bool wait, void (*done)(void *item, void *arg), void *arg);
/* Move the pending entries whose item early(item, arg) lets go now (it
 * returns true, having let go) to reuse. The entries moved. */
int64_t rs_fences_defer(rs_fences *fs, bool (*early)(void *item, void *arg), void *arg);
/* Before a write into device memory: order it after every reuse fence still
 * running. lane: the device's lane waits for each (the host does where that
 * fails, and the error is returned); else the host waits for them. */
int rs_fences_order(rs_fences *fs, bool lane);
/* The host waits for every reuse fence (before memory goes back to the driver). */
void rs_fences_wait_all(rs_fences *fs);
/* Wait for and free everything (pending items are not called back). */
void rs_fences_destroy(rs_fences *fs);

#endif
