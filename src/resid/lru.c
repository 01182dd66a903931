/* SPDX-License-Identifier: Apache-2.0 */
/* lru.c - see lru.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lru.h"

int rs_lru_init(rs_lru *l, const ferry_allocator *m, int64_t n)
{
    size_t k = (size_t)(n ? n : 1);
    *l = (rs_lru){.m = m, .n = n};
    l->prev = fy_calloc(m, k, sizeof *l->prev);
    l->next = fy_calloc(m, k, sizeof *l->next);
    l->tmp = fy_calloc(m, k, sizeof *l->tmp);
    l->key = fy_calloc(m, k, sizeof *l->key);
    l->refs = fy_calloc(m, k, sizeof *l->refs);
    l->list = fy_calloc(m, k, sizeof *l->list);
    if (!l->prev || !l->next || !l->tmp || !l->key || !l->refs || !l->list) {
        rs_lru_destroy(l);
        return -ENOMEM;
    }
    rs_lru_clear(l);
    return 0;
}

void rs_lru_destroy(rs_lru *l)
{
    if (!l->m) return; /* (never initialised) */
    fy_free(l->m, l->prev);
    fy_free(l->m, l->next);
    fy_free(l->m, l->tmp);
    fy_free(l->m, l->key);
    fy_free(l->m, l->refs);
    fy_free(l->m, l->list);
    *l = (rs_lru){.m = l->m};
}

void rs_lru_clear(rs_lru *l)
{
    if (l->n) memset(l->refs, 0, (size_t)l->n * sizeof *l->refs);
    for (int i = 0; i < 2; i++) l->head[i] = l->tail[i] = RS_LRU_END, l->count[i] = 0;
}

/* (key, id) order */
static bool before(const rs_lru *l, int64_t a, int64_t b)
{
    return l->key[a] != l->key[b] ? l->key[a] < l->key[b] : a < b;
}

static void unlink_id(rs_lru *l, int64_t id)
{
    int li = l->list[id];
    int64_t p = l->prev[id], q = l->next[id];
    if (p != RS_LRU_END) l->next[p] = q;
    else l->head[li] = q;
    if (q != RS_LRU_END) l->prev[q] = p;
    else l->tail[li] = p;
    l->count[li]--;
}

/* Link id into list li after p (RS_LRU_END: at the front). */
static void link_after(rs_lru *l, int li, int64_t id, int64_t p)
{
    int64_t q = p == RS_LRU_END ? l->head[li] : l->next[p];
    l->list[id] = (uint8_t)li;
    l->prev[id] = p;
    l->next[id] = q;
    if (p != RS_LRU_END) l->next[p] = id;
    else l->head[li] = id;
    if (q != RS_LRU_END) l->prev[q] = id;
    else l->tail[li] = id;
    l->count[li]++;
}

/* Link id at its place in list li, looking from the back. */
static void place(rs_lru *l, int li, int64_t id)
{
    int64_t p = l->tail[li];
    while (p != RS_LRU_END && before(l, id, p)) p = l->prev[p];
    link_after(l, li, id, p);
}

void rs_lru_ref(rs_lru *l, int64_t id, int list, uint64_t key)
{
    if (l->refs[id]++ > 0) return;
    l->key[id] = key;
    place(l, list ? 1 : 0, id);
}

void rs_lru_unref(rs_lru *l, int64_t id)
{
    if (l->refs[id] <= 0) return; /* (never listed: nothing to take back) */
    if (--l->refs[id] == 0) unlink_id(l, id);
}

void rs_lru_touch(rs_lru *l, int64_t id, uint64_t key)
{
    if (l->refs[id] <= 0) {
        l->key[id] = key;
        return;
    }
    int li = l->list[id];
    unlink_id(l, id);
    l->key[id] = key;
    place(l, li, id);
}

void rs_lru_append(rs_lru *l, int64_t id, int list, uint64_t key, int32_t refs)
{
    if (refs <= 0 || l->refs[id] > 0) return;
    l->refs[id] = refs;
    l->key[id] = key;
    int li = list ? 1 : 0;
    link_after(l, li, id, l->tail[li]);
}

static int cmp_key(const void *a, const void *b, void *arg)
{
    const rs_lru *l = arg;
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return before(l, x, y) ? -1 : before(l, y, x) ? 1 : 0;
}

void rs_lru_sort(rs_lru *l)
{
    for (int li = 0; li < 2; li++) {
        int64_t k = 0;
        for (int64_t id = l->head[li]; id != RS_LRU_END; id = l->next[id]) l->tmp[k++] = id;
        qsort_r(l->tmp, (size_t)k, sizeof *l->tmp, cmp_key, l);
        l->head[li] = l->tail[li] = RS_LRU_END;
        l->count[li] = 0;
        for (int64_t j = 0; j < k; j++) link_after(l, li, l->tmp[j], l->tail[li]);
    }
}
