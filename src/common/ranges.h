/* SPDX-License-Identifier: Apache-2.0 */
/* ranges.h - a list of free ranges, sorted by offset, never adjacent (merged)
 * and never empty: the bookkeeping behind the spill file (resid/spill.c) and
 * the store's pinned pool (resid/store.c). Depends on common/ only. */
#ifndef FERRY_RANGES_H
#define FERRY_RANGES_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct fy_range {
    uint64_t off, len;
} fy_range;

typedef struct fy_ranges {
    fy_range *v;
    size_t n, cap;
} fy_ranges;

/* Room for want ranges (so that fy_ranges_give cannot need memory): 0 or -ENOMEM. */
int fy_ranges_reserve(fy_ranges *r, const ferry_allocator *m, size_t want);
void fy_ranges_free(fy_ranges *r, const ferry_allocator *m);
/* Index of the smallest range of at least len bytes (the lowest offset among
 * equals), or r->n when none is that large. */
size_t fy_ranges_best(const fy_ranges *r, uint64_t len);
/* Take len bytes (at most the range's) from the front of range i. */
void fy_ranges_take(fy_ranges *r, size_t i, uint64_t len);
void fy_ranges_remove(fy_ranges *r, size_t i);
/* Make [off, off + len) free, merged with its neighbours. Returns the index of
 * the range that now holds it; -1 when it overlaps a free range (nothing
 * changes: it was not taken from this list); -ENOMEM when a new entry was
 * needed and the list could not grow (nothing changes). */
ptrdiff_t fy_ranges_give(fy_ranges *r, const ferry_allocator *m, uint64_t off, uint64_t len);

#endif
