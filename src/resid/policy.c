/* SPDX-License-Identifier: Apache-2.0 */
/* policy.c - see policy.h. No I/O, no allocation, no clocks. */
#define _GNU_SOURCE
#include "policy.h"

#include <stdlib.h>

static int cand_cmp(const void *a, const void *b, void *arg)
{
    const rs_cand *c = arg;
    const rs_cand *x = &c[*(const int64_t *)a], *y = &c[*(const int64_t *)b];
    if (x->priority != y->priority) return x->priority < y->priority ? -1 : 1;
    if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
    if (x->streams != y->streams) return x->streams ? -1 : 1;
    if (x->use != y->use) return x->use < y->use ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int64_t rs_policy_choose(const rs_cand *c, int64_t n, uint64_t need, int64_t *out, uint64_t *freed)
{
    uint64_t total = 0;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c[i].protect || c[i].bytes == 0) continue;
        out[m++] = i;
        total += c[i].bytes;
    }
    if (need == 0) {
        *freed = 0;
        return 0;
    }
    if (need != UINT64_MAX && total < need) {
        *freed = total; /* impossible: evict nothing, say how much there was */
        return -1;
    }
    qsort_r(out, (size_t)m, sizeof *out, cand_cmp, (void *)c);
    if (need == UINT64_MAX) {
        *freed = total;
        return m;
    }
    uint64_t got = 0;
    int64_t k = 0;
    while (k < m && got < need) got += c[out[k++]].bytes;
    *freed = got;
    return k;
}

rs_dest rs_policy_dest(rs_hoststate *h, uint64_t nbytes)
{
    if (h->spilling && h->available > h->spill_above) h->spilling = false;
    else if (!h->spilling && h->available < h->spill_below) h->spilling = true;
    if (h->spilling) return RS_DEST_SPILL;
    if (h->host_used + nbytes > h->host_budget || nbytes > h->available) return RS_DEST_SPILL;
    if (h->pinned_used + nbytes <= h->pinned_budget) return RS_DEST_PINNED;
    return RS_DEST_HOST;
}
