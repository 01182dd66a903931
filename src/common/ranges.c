/* SPDX-License-Identifier: Apache-2.0 */
/* ranges.c - see ranges.h. */
#include "ranges.h"

#include <errno.h>
#include <string.h>

int fy_ranges_reserve(fy_ranges *r, const ferry_allocator *m, size_t want)
{
    if (want <= r->cap) return 0;
    uint64_t cap = r->cap ? r->cap : 16, bytes;
    while (cap < want) cap *= 2;
    if (fy_mul_ovf(cap, sizeof *r->v, &bytes) || bytes > SIZE_MAX) return -ENOMEM;
    fy_range *p = fy_realloc(m, r->v, (size_t)bytes);
    if (!p) return -ENOMEM;
    r->v = p;
    r->cap = (size_t)cap;
    return 0;
}

void fy_ranges_free(fy_ranges *r, const ferry_allocator *m)
{
    fy_free(m, r->v);
    memset(r, 0, sizeof *r);
}

size_t fy_ranges_best(const fy_ranges *r, uint64_t len)
{
    size_t best = r->n;
    for (size_t i = 0; i < r->n; i++)
        if (r->v[i].len >= len && (best == r->n || r->v[i].len < r->v[best].len)) best = i;
    return best;
}

void fy_ranges_remove(fy_ranges *r, size_t i)
{
    memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof *r->v);
    r->n--;
}

void fy_ranges_take(fy_ranges *r, size_t i, uint64_t len)
{
    r->v[i].off += len;
    r->v[i].len -= len;
    if (r->v[i].len == 0) fy_ranges_remove(r, i);
}

ptrdiff_t fy_ranges_give(fy_ranges *r, const ferry_allocator *m, uint64_t off, uint64_t len)
{
    uint64_t end = off + len;
    size_t lo = 0, hi = r->n; /* i: the first range at or after off */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    size_t i = lo;
    bool prev = i > 0 && r->v[i - 1].off + r->v[i - 1].len >= off;
    bool next = i < r->n && r->v[i].off <= end;
    if ((prev && r->v[i - 1].off + r->v[i - 1].len > off) || (next && r->v[i].off < end)) return -1;
    if (prev && next) {
        r->v[i - 1].len += len + r->v[i].len;
        fy_ranges_remove(r, i);
        return (ptrdiff_t)(i - 1);
    }
    if (prev) {
        r->v[i - 1].len += len;
        return (ptrdiff_t)(i - 1);
    }
    if (next) {
        r->v[i].off = off;
        r->v[i].len += len;
        return (ptrdiff_t)i;
    }
    if (fy_ranges_reserve(r, m, r->n + 1) < 0) return -ENOMEM;
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->v[i] = (fy_range){off, len};
    r->n++;
    return (ptrdiff_t)i;
}
