/* SPDX-License-Identifier: Apache-2.0 */
/* lru.h - ordered lists of ids (a model's groups), for make-room's candidates:
 * each id is on at most one of two lists, kept in the order (key, id), where
 * the key is when it was last used, so the oldest comes first. An id is
 * listed while it holds references (a group while any of its tensors has
 * device memory), so a walk from the front sees only what is on the device,
 * oldest first, and stops when it has seen enough: its cost is what it
 * visits, never the number of ids. Every operation but the sort is O(1) when
 * keys are given in increasing order (a clock); it allocates only in
 * rs_lru_init. Not thread-safe: its owner serialises the calls. */
#ifndef FERRY_LRU_H
#define FERRY_LRU_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

#define RS_LRU_END (-1)

typedef struct rs_lru {
    const ferry_allocator *m;
    int64_t n;            /* ids 0 .. n-1 */
    int64_t *prev, *next; /* RS_LRU_END at the ends */
    int64_t *tmp;         /* rs_lru_sort's room, n entries */
    uint64_t *key;
    int32_t *refs; /* 0: not listed */
    uint8_t *list; /* the list it is on (0 or 1) */
    int64_t head[2], tail[2], count[2];
} rs_lru;

/* Room for n ids, none listed: 0 or -ENOMEM (nothing left allocated). */
int rs_lru_init(rs_lru *l, const ferry_allocator *m, int64_t n);
void rs_lru_destroy(rs_lru *l);
/* Nothing listed, every reference dropped. */
void rs_lru_clear(rs_lru *l);
/* One more reference to id: on its first, it is listed on list (0 or 1) at
 * its place by (key, id), found from the back. */
void rs_lru_ref(rs_lru *l, int64_t id, int list, uint64_t key);
/* One reference less: on its last, id leaves its list. */
void rs_lru_unref(rs_lru *l, int64_t id);
/* id was used at key (not below its old key): a listed id moves to its new
 * place, found from the back; an unlisted one keeps key for later. */
void rs_lru_touch(rs_lru *l, int64_t id, uint64_t key);
/* Bulk listing: id (not listed) goes to the back of list with refs
 * references, out of order; rs_lru_sort then orders both lists
 * (O(k log k) for the k listed). */
void rs_lru_append(rs_lru *l, int64_t id, int list, uint64_t key, int32_t refs);
void rs_lru_sort(rs_lru *l);

static inline bool rs_lru_listed(const rs_lru *l, int64_t id)
{
    return l->refs[id] > 0;
}
static inline int64_t rs_lru_first(const rs_lru *l, int list)
{
    return l->head[list];
}
static inline int64_t rs_lru_next(const rs_lru *l, int64_t id)
{
    return l->next[id];
}

#endif
