/* SPDX-License-Identifier: Apache-2.0 */
/* arena.h - the store's device memory as a resource of its own: segments
 * from the driver, carved into tensors best-fit and kept after they leave,
 * for reuse without a driver call, until given back (arena.c says why).
 * It knows a device, an allocator, a message slot and a budget; nothing of
 * the store, its models or its lock. Not thread-safe: its owner serialises
 * the calls (the store calls it under its lock). */
#ifndef FERRY_ARENA_H
#define FERRY_ARENA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "common/ranges.h"
#include "xfer/xfer.h"

/* a device segment: one driver allocation, carved into tensors */
typedef struct rs_seg {
    uint64_t base, size, used; /* used: bytes carved out now */
    int64_t nlive;             /* pieces carved out now */
    bool small;                /* serves requests under 1 MiB only */
    bool streams;              /* holds streamed tensors (else others) while it holds any */
    fy_ranges fr;              /* its free space */
} rs_seg;

typedef struct rs_arena {
    ferry_device *dev;
    const ferry_allocator *m;
    fy_err *err; /* where its messages go (the owner's handle) */
    uint64_t
        budget;    /* the device budget: what the tensors may take, and the free pieces up to 1/16 past it */
    uint64_t used; /* the tensors' bytes carved out now (their sizes, not the 512-byte padding) */
    uint64_t cached;        /* free bytes inside segments */
    uint64_t allocs, frees; /* driver calls for device memory */
    rs_seg *segs;           /* sorted by base */
    int nsegs, cap_segs;
    /* called before any segment goes back to the driver (kernels may still
     * read memory released early: the store waits for their fences); may be NULL */
    void (*drain)(void *arg);
    void *drain_arg;
} rs_arena;

/* An empty arena on dev (nothing is allocated until the first request). */
void rs_arena_init(rs_arena *a, ferry_device *dev, const ferry_allocator *m, fy_err *err, uint64_t budget);
/* The device bytes a tensor of n bytes takes: n rounded up to 512 (every
 * piece's start is that aligned; cuMemAlloc gives 256). */
static inline uint64_t rs_dev_size(uint64_t n)
{
    return (n + 511) / 512 * 512;
}
/* rs_arena_alloc's answer when strict and the request fits nowhere in the
 * free space while a new segment would take the arena more than 1/16 past
 * its budget. */
#define RS_FRAGMENTED 1
/* Device memory for a tensor of nbytes (streams: of a streamed block, kept
 * in segments apart from the others): *p and *dsize (rs_dev_size(nbytes),
 * at least 512) on success, untouched otherwise. Carved from the free space,
 * else from a new segment (strict: RS_FRAGMENTED rather than a new segment
 * past the budget's slack). 0, RS_FRAGMENTED or a negative code (message in
 * *a->err). */
int rs_arena_alloc(rs_arena *a, uint64_t nbytes, bool streams, bool strict, fy_dptr *p, uint64_t *dsize);
/* A piece back to the free space (p, dsize as allocated; nbytes the
 * tensor's size). p 0: nothing carved (an empty tensor), only nbytes is
 * uncounted. A piece the arena never gave is reported on *a->err
 * (FERRY_E_INTERNAL) and otherwise ignored. */
void rs_arena_free(rs_arena *a, fy_dptr p, uint64_t dsize, uint64_t nbytes);
/* The segment holding device address p: its base and size (0, 0: none). */
void rs_arena_block(const rs_arena *a, uint64_t p, uint64_t *base, uint64_t *size);
/* Give whole free segments back to the driver, the largest first, until at
 * least want bytes were returned (UINT64_MAX: all). The bytes returned. */
uint64_t rs_arena_release(rs_arena *a, uint64_t want);
/* Every segment back to the driver and the table freed (the owner is going). */
void rs_arena_destroy(rs_arena *a);

#endif
