/* SPDX-License-Identifier: Apache-2.0 */
/* alloc.h - a counting allocator for the unit tests: the blocks ferry holds
 * now (live: every one it allocates it must free), the calls since the last
 * alloc_arm(), and the nth of them (1 = the next; 0 = none) failing. */
#ifndef FERRY_TEST_ALLOC_H
#define FERRY_TEST_ALLOC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "ferry.h"

static atomic_long live, alloc_calls, alloc_nth;
static atomic_int alloc_fired;

static inline bool alloc_fault(void)
{
    long c = atomic_fetch_add(&alloc_calls, 1) + 1;
    long nth = atomic_load(&alloc_nth);
    if (nth == 0 || c != nth) return false;
    atomic_store(&alloc_fired, 1);
    return true;
}

static inline void alloc_arm(long nth)
{
    atomic_store(&alloc_nth, 0);
    atomic_store(&alloc_calls, 0);
    atomic_store(&alloc_fired, 0);
    atomic_store(&alloc_nth, nth);
}

static inline void *c_alloc(void *o, size_t n)
{
    (void)o;
    if (alloc_fault()) return NULL;
    void *p = malloc(n);
    if (p) atomic_fetch_add(&live, 1);
    return p;
}

static inline void *c_realloc(void *o, void *p, size_t n)
{
    (void)o;
    if (alloc_fault()) return NULL;
    void *q = realloc(p, n);
    if (q && !p) atomic_fetch_add(&live, 1);
    return q;
}

static inline void c_free(void *o, void *p)
{
    (void)o;
    if (p) atomic_fetch_sub(&live, 1);
    free(p);
}

#define COUNTING_ALLOCATOR_INIT          \
    {                                    \
        c_alloc, c_realloc, c_free, NULL \
    }

#endif
