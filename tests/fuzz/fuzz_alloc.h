/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_alloc.h - allocation-failure injection shared by the fuzz targets:
 * ferry's allocator (through a ferry_allocator) and the jansson calls ferry
 * makes outside jansson's parser. Included by one .c file per executable,
 * after it defines CHECK(). */
#ifndef FERRY_FUZZ_ALLOC_H
#define FERRY_FUZZ_ALLOC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <jansson.h>

#include "ferry.h"


static long g_ferry_allocs, g_ferry_fail_at = -1, g_json_allocs, g_json_fail_at = -1;
static int g_ferry_failed, g_json_failed;

static bool ferry_should_fail(void)
{
    long k = g_ferry_allocs++;
    if (k == g_ferry_fail_at) {
        g_ferry_failed = 1;
        return true;
    }
    return false;
}
static void *fz_alloc(void *o, size_t n)
{
    (void)o;
    return ferry_should_fail() ? NULL : malloc(n);
}
static void *fz_realloc(void *o, void *p, size_t n)
{
    (void)o;
    return ferry_should_fail() ? NULL : realloc(p, n);
}
static void fz_free(void *o, void *p)
{
    (void)o;
    free(p);
}
static const ferry_allocator fz_mem = {fz_alloc, fz_realloc, fz_free, NULL};

/* Run fn(data, size, strict) once counting ferry's allocations, then again
 * with allocation number h % count failing: that run must see the failure. */
static inline void with_oom(int (*fn)(const uint8_t *, size_t, bool), const uint8_t *data, size_t size,
                            uint64_t h)
{
    g_ferry_allocs = 0;
    g_ferry_fail_at = -1;
    g_ferry_failed = 0;
    fn(data, size, true);
    long n = g_ferry_allocs;
    if (n > 0) {
        g_ferry_allocs = 0;
        g_ferry_fail_at = (long)(h % (uint64_t)n);
        g_ferry_failed = 0;
        fn(data, size, true);
        CHECK(g_ferry_failed);
        g_ferry_fail_at = -1;
    }
}

/* jansson's parser itself is left out of the injection: it ignores some
 * allocation failures (load.c: lex_save drops strbuffer_append_byte's error)
 * and then reads past its token buffer, a bug of jansson's, not ferry's. So
 * json_loadb is wrapped (linked with -Wl,--wrap=json_loadb: tests/fuzz/
 * CMakeLists.txt) and only the jansson calls ferry makes itself fail. */
json_t *__real_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
static int g_in_json_load;
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    g_in_json_load++;
    json_t *r = __real_json_loadb(buffer, buflen, flags, error);
    g_in_json_load--;
    return r;
}

static void *js_malloc(size_t n)
{
    if (g_in_json_load) return malloc(n);
    long k = g_json_allocs++;
    if (k == g_json_fail_at) {
        g_json_failed = 1;
        return NULL;
    }
    return malloc(n);
}
static void js_free(void *p)
{
    free(p);
}

#endif
