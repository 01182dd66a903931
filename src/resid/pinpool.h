/* SPDX-License-Identifier: Apache-2.0 */
/* pinpool.h - the pinned pool as a resource of its own: chunks of pinned
 * host memory, pinned once and carved best-fit, trimmed when idle, and the
 * pinner, a thread that pins a reserve ahead in pieces and hands them over.
 * It knows a device, an allocator, a message slot, a budget and its owner's
 * lock; nothing of the store. Calls are made with the owner's lock held
 * (outer); the pool drops it while it pins a chunk or waits for the
 * pinner's next piece, so the caller marks what it works on first.
 * rs_pinpool_yield, _stop and _wait take no lock of the owner's. */
#ifndef FERRY_PINPOOL_H
#define FERRY_PINPOOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "common/ranges.h"
#include "xfer/xfer.h"

#define RS_PCHUNK (256ull << 20) /* the pool grows by this much (at least) */
/* the pinner pins the reserve in pieces of this much: a transfer that
 * starts while one is pinned shares the host with it until it is done
 * (1 GiB pieces took 26 ms off a 10 GB load that started with one) */
#define RS_RCHUNK RS_PCHUNK

/* a chunk of pinned memory, with its free ranges */
typedef struct rs_pchunk {
    uint8_t *base;
    uint64_t size;
    fy_ranges fr;
    bool reserved; /* pinned ahead by the pinner: kept while the pool lives */
} rs_pchunk;

typedef struct rs_pinpool {
    ferry_device *dev;
    const ferry_allocator *m;
    fy_err *err;
    pthread_mutex_t *outer; /* the owner's lock, held by every caller but where said */
    uint64_t budget;        /* pinned bytes the pool may hold (chunks, pieces owed, growth) */
    uint64_t used;          /* bytes handed out now (4 KiB multiples) */
    uint64_t bytes;         /* the chunks' bytes */
    uint64_t growing;       /* being pinned with the owner's lock dropped (rs_pinpool_alloc) */
    rs_pchunk *chunks;
    int nchunks;
    /* the pinner: started by rs_pinpool_start for target bytes; it pins
     * without any lock of the owner's and hands each piece over through
     * pin_lock (rs_pinpool_adopt moves them into chunks); the pin_ fields
     * are pin_lock's */
    uint64_t target;
    pthread_t pinner;
    bool pinner_on, pin_stop;
    pthread_mutex_t pin_lock;
    pthread_cond_t pin_cv; /* a piece was pinned, or the pinner stopped */
    rs_pchunk *pin_ready;  /* pinned, not yet adopted (room for every piece, made up front) */
    int pin_nready;
    uint64_t pin_left; /* bytes still to pin (0 once done, failed or stopped) */
    uint64_t pin_done; /* bytes pinned ahead so far */
    int pin_busy;      /* transfers running (rs_pinpool_yield): the pinner waits for none ... */
    int pin_wanted;    /* ... unless an allocation waits for a piece */
    int pin_rc;        /* the error that stopped it, with its message */
    char pin_msg[FY_ERRMSG_MAX];
} rs_pinpool;

/* An empty pool (nothing pinned); target: the reserve the pinner will pin
 * ahead once started (capped at budget, in 4 KiB multiples). */
void rs_pinpool_init(rs_pinpool *p, ferry_device *dev, const ferry_allocator *m, fy_err *err,
                     pthread_mutex_t *outer, uint64_t budget, uint64_t target);
/* Start the pinner for the target (nothing without one), before the pool is
 * shared: 0 or a negative code (message on *p->err). */
int rs_pinpool_start(rs_pinpool *p);
/* n bytes of the pool (rounded up to 4 KiB). Where no free range fits, it
 * waits for the pinner's next piece or pins a new chunk, with *outer dropped
 * meanwhile. FERRY_E_BUDGET past the budget, or the pinning's error. */
int rs_pinpool_alloc(rs_pinpool *p, uint64_t n, void **out);
/* Never fails: a range the free list cannot take is lost to fragmentation
 * until the pool goes. */
void rs_pinpool_free(rs_pinpool *p, void *ptr, uint64_t n);
/* Move the pieces the pinner has pinned into the pool; false when one could
 * not be moved (out of memory for the list of chunks). */
bool rs_pinpool_adopt(rs_pinpool *p);
/* Take the chunks that hold nothing (not the reserve's) out of the pool:
 * their count, the list in *out (NULL when none); rs_pinpool_drop unpins
 * and frees them, and needs no lock (call it with *outer dropped). */
int rs_pinpool_trim_take(rs_pinpool *p, rs_pchunk **out);
void rs_pinpool_drop(rs_pinpool *p, rs_pchunk *v, int n);
/* A transfer starts (+1) or ends (-1): the pinner pins between them, not
 * beside them (its page faults and registrations halved a 10 GB load's rate
 * on the H200 host), unless an allocation is waiting for a piece. Any
 * thread, no lock needed; nothing without a pinner. */
void rs_pinpool_yield(rs_pinpool *p, int d);
/* Wait until the pinner is done: 0, or its error (its message put on *p->err). */
int rs_pinpool_wait(rs_pinpool *p);
/* Bytes the pinner has pinned so far. */
uint64_t rs_pinpool_reserved(rs_pinpool *p);
/* Stop the pinner and unpin everything: pieces never adopted and every
 * chunk (the owner is going; no lock held). */
void rs_pinpool_destroy(rs_pinpool *p);

#endif
