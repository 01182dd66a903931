/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_check.h - invariant helpers shared by the fuzz targets: unique names,
 * valid UTF-8, metadata kinds, FERRY_FUZZ_SKIP, a hash for choosing the
 * failing allocation.
 * Needs CHECK() from the including file. static inline: not every target uses
 * every helper. */
#ifndef FERRY_FUZZ_CHECK_H
#define FERRY_FUZZ_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"

static inline int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A metadata value's kind is one ferry.h names, and a FERRY_META_JSON value
 * is JSON text indeed (RFC 8259 allows any integer: read big ones as reals).
 * json_loadb: the targets leave its allocations out of the failure injection. */
static inline void check_meta_kind(uint8_t kind, const char *v)
{
    CHECK(kind == FERRY_META_TEXT || kind == FERRY_META_JSON);
    if (kind != FERRY_META_JSON) return;
    json_t *j = json_loadb(v, strlen(v), JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
    CHECK(j != NULL);
    json_decref(j);
}

/* No two of the n strings are equal. */
static inline void check_unique(char **s, int64_t n)
{
    if (n < 2) return;
    char **c = malloc((size_t)n * sizeof *c);
    CHECK(c != NULL);
    memcpy(c, s, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_str);
    for (int64_t i = 1; i < n; i++) CHECK(strcmp(c[i - 1], c[i]) != 0);
    free(c);
}

static inline void check_utf8(const char *s)
{
    CHECK(s != NULL);
    CHECK(fy_utf8_valid(s, strlen(s), NULL));
}

/* FERRY_FUZZ_SKIP: comma-separated checks to leave out, to fuzz on past a
 * known bug: "newline" (one-line messages), "ferry-oom", "json-oom". */
static inline bool skip(const char *what)
{
    const char *e = getenv("FERRY_FUZZ_SKIP");
    size_t n = strlen(what);
    for (const char *p = e; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && memcmp(p, what, n) == 0) return true;
        p = c ? c + 1 : NULL;
    }
    return false;
}

static inline uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static inline bool allow_newline(void)
{
    static int v = -1;
    if (v < 0) v = skip("newline");
    return v;
}

#endif
