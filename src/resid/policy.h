/* SPDX-License-Identifier: Apache-2.0 */
/* policy.h - which groups leave the device: a pure function of the store's
 * state and the request (least recently used, lowest priority first, whole
 * groups, none in use), unit-tested with tables. */
#ifndef FERRY_POLICY_H
#define FERRY_POLICY_H

#include <stdbool.h>
#include <stdint.h>

/* One group of tensors now on the device (all its device bytes). */
typedef struct rs_cand {
    int priority;      /* lower leaves first */
    uint64_t last_use; /* older (smaller) leaves first */
    uint64_t bytes;    /* device bytes the group frees */
    bool protect;      /* held by a caller, or needed by the request itself */
    bool streams;      /* a streamed block of a planned model: leaves before its model's
                          other groups */
    uint64_t use;      /* when the group itself was last asked for: older leaves first
                          within a model */
    int64_t id;        /* caller's handle; ties broken by it, so the order is total */
} rs_cand;

/* Choose groups to evict so that at least need bytes are freed: evictable
 * candidates in order (priority, last_use, streamed first, use, id), taken
 * until need is met.
 * need = UINT64_MAX: every evictable candidate. On success returns the count
 * chosen, their indices (into c) in out[0..count-1] in eviction order, and the
 * bytes they free in *freed. When even every evictable group falls short:
 * returns -1, chooses nothing, and *freed = what they would have freed. out
 * must have room for n entries; c is not modified. need 0 chooses nothing. */
int64_t rs_policy_choose(const rs_cand *c, int64_t n, uint64_t need, int64_t *out, uint64_t *freed);

/* Where a dirty tensor leaving the device goes. */
typedef enum rs_dest { RS_DEST_PINNED, RS_DEST_HOST, RS_DEST_SPILL } rs_dest;

/* Host-side state for rs_policy_dest. */
typedef struct rs_hoststate {
    uint64_t host_budget, host_used; /* pinned + pageable bytes ferry holds */
    uint64_t pinned_budget, pinned_used;
    uint64_t available;                /* the host's real available memory now */
    uint64_t spill_below, spill_above; /* hysteresis thresholds */
    bool spilling;                     /* state from the previous decision */
} rs_hoststate;

/* Destination of a dirty tensor of nbytes, updating h->spilling with the
 * hysteresis: spilling starts when available < spill_below and stops only when
 * available > spill_above. RAM is chosen only when not spilling and the host
 * budget has room (and available memory too): pinned while the pinned budget
 * has room, else pageable. */
rs_dest rs_policy_dest(rs_hoststate *h, uint64_t nbytes);

#endif
