/* SPDX-License-Identifier: Apache-2.0 */
/* groups.c - a model's groups as an index (each group's members, so a
 * move looks at its block alone) and the selection of a request's tensors
 * with their groups. Part of the model catalogue: below the moves and the
 * eviction. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

void rs_group_index(ferry_model *m)
{
    memset(m->gcnt, 0, (size_t)m->n * sizeof *m->gcnt);
    for (int64_t i = 0; i < m->n; i++) m->gcnt[m->t[i].group]++;
    int64_t at = 0;
    for (int64_t g = 0; g < m->n; g++) {
        m->gat[g] = at;
        at += m->gcnt[g];
    }
    memset(m->gcnt, 0, (size_t)m->n * sizeof *m->gcnt);
    for (int64_t i = 0; i < m->n; i++) {
        int64_t g = m->t[i].group;
        m->gmem[m->gat[g] + m->gcnt[g]++] = i;
    }
    rs_dev_reindex(m);
}

void rs_dev_reindex(ferry_model *m)
{
    rs_lru_clear(&m->dev);
    for (int64_t g = 0; g < m->n; g++) {
        if (m->t[g].group != g) continue; /* a group's id is its leader's index */
        int32_t live = 0;
        for (int64_t k = 0; k < m->gcnt[g]; k++) live += m->t[m->gmem[m->gat[g] + k]].dptr != 0;
        rs_lru_append(&m->dev, g, m->t[g].streams, m->t[g].use, live);
    }
    rs_lru_sort(&m->dev);
}

int rs_select(ferry_model *m, const int64_t *tensors, int64_t n, int64_t **out, int64_t *nt)
{
    *out = NULL;
    *nt = 0;
    int64_t cnt = tensors ? 0 : m->n;
    uint64_t stamp = ++m->gstamp;
    for (int64_t k = 0; tensors && k < n; k++) {
        if (tensors[k] < 0 || tensors[k] >= m->n)
            return rs_merr(m, FERRY_E_INVAL, "tensor index %" PRId64 " out of range (%" PRId64 " tensors)",
                           tensors[k], m->n);
        int64_t g = m->t[tensors[k]].group;
        if (m->gmark[g] != stamp) {
            m->gmark[g] = stamp;
            cnt += m->gcnt[g];
        }
    }
    int64_t *v = fy_malloc(m->s->m, (size_t)(cnt ? cnt : 1) * sizeof *v);
    if (!v) return rs_merr(m, -ENOMEM, "out of memory for a list of %" PRId64 " tensors", cnt);
    if (!tensors) {
        for (int64_t i = 0; i < m->n; i++) v[i] = i;
    } else {
        stamp = ++m->gstamp;
        cnt = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t g = m->t[tensors[k]].group;
            if (m->gmark[g] == stamp) continue;
            m->gmark[g] = stamp;
            memcpy(&v[cnt], &m->gmem[m->gat[g]], (size_t)m->gcnt[g] * sizeof *v);
            cnt += m->gcnt[g];
        }
    }
    *out = v;
    *nt = cnt;
    return 0;
}
