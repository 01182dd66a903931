/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_pickle.c - libFuzzer target for the restricted unpickler and, with the
 * storages it names, the PyTorch table builder.
 *
 * The input is a data.pkl:
 *  1. fy_pk_load() on it. On success: every name is non-NULL, valid UTF-8 and
 *     unique, and points at a view; every view at a storage, with ndim in
 *     [0, 1024], non-negative sizes and strides and a whole-byte dtype; every
 *     storage key lies inside the input, 1 to 256 bytes without '/' or NUL.
 *  2. The input is wrapped in a stored zip as archive/data.pkl, together with
 *     archive/data/<key> for each storage key step 1 found, holding exactly
 *     the bytes its persistent id asks for (when they add up to at most 1 MiB),
 *     and fy_pt_parse() reads it; fuzz_pt_check.h's table invariants apply.
 * On failure (both): a documented code, a one-line message, nothing left.
 * Each call also runs with one of ferry's allocations failing (the result
 * must then be -ENOMEM, with nothing leaked). A violated invariant calls
 * __builtin_trap(); leaks are left to LeakSanitizer. */
#include "format/format.h"
#include "format/pickle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                       \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            fprintf(stderr, "fuzz_pickle: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            if (g_err_shown) fprintf(stderr, "fuzz_pickle: message: %s\n", g_err_shown);                  \
            __builtin_trap();                                                                             \
        }                                                                                                 \
    } while (0)

static const char *g_err_shown;

#include "fuzz_alloc.h"
#include "fuzz_pt_check.h"

#define MAX_STORAGE_BYTES (1u << 20)

/* ---- a minimal stored-zip writer (no zip64, no CRC: ferry checks neither) ---- */

typedef struct zbuf {
    uint8_t *p;
    size_t n, cap;
} zbuf;

static void put(zbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        CHECK(b->p != NULL);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put16(zbuf *b, uint32_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(b, x, 2);
}
static void put32(zbuf *b, uint32_t v)
{
    put16(b, v & 0xFFFF);
    put16(b, v >> 16);
}

typedef struct zent {
    char name[300];
    size_t nlen;
    const uint8_t *data;
    size_t n;
    uint32_t hdr;
} zent;

static void zip_write(zbuf *b, zent *e, size_t ne)
{
    for (size_t i = 0; i < ne; i++) {
        e[i].hdr = (uint32_t)b->n;
        put32(b, 0x04034b50u);
        put16(b, 20), put16(b, 0), put16(b, 0), put16(b, 0), put16(b, 0);
        put32(b, 0), put32(b, (uint32_t)e[i].n), put32(b, (uint32_t)e[i].n);
        put16(b, (uint32_t)e[i].nlen), put16(b, 0);
        put(b, e[i].name, e[i].nlen);
        put(b, e[i].data, e[i].n);
    }
    uint32_t cd = (uint32_t)b->n;
    for (size_t i = 0; i < ne; i++) {
        put32(b, 0x02014b50u);
        put16(b, 20), put16(b, 20), put16(b, 0), put16(b, 0), put16(b, 0), put16(b, 0);
        put32(b, 0), put32(b, (uint32_t)e[i].n), put32(b, (uint32_t)e[i].n);
        put16(b, (uint32_t)e[i].nlen), put16(b, 0), put16(b, 0), put16(b, 0), put16(b, 0);
        put32(b, 0), put32(b, e[i].hdr);
        put(b, e[i].name, e[i].nlen);
    }
    uint32_t cd_size = (uint32_t)b->n - cd;
    put32(b, 0x06054b50u);
    put16(b, 0), put16(b, 0), put16(b, (uint32_t)ne), put16(b, (uint32_t)ne);
    put32(b, cd_size), put32(b, cd), put16(b, 0);
}

/* ---- checks ---- */

static void check_result(const uint8_t *data, size_t size, const fy_pk_result *r)
{
    CHECK(r->nst >= 0 && r->nv >= 0 && r->nn >= 0);
    for (int64_t i = 0; i < r->nst; i++) {
        const fy_pk_storage *s = &r->st[i];
        CHECK(s->key_len >= 1 && s->key_len <= 256);
        CHECK((const uint8_t *)s->key >= data &&
              (size_t)((const uint8_t *)s->key - data) + s->key_len <= size);
        CHECK(memchr(s->key, '/', s->key_len) == NULL && memchr(s->key, 0, s->key_len) == NULL);
        CHECK(pt_elsize(s->dtype) > 0);
        CHECK(!s->untyped || s->dtype == FERRY_DTYPE_U8);
        CHECK(s->type != NULL);
    }
    for (int64_t i = 0; i < r->nv; i++) {
        const fy_pk_view *v = &r->v[i];
        CHECK(v->storage >= 0 && v->storage < r->nst);
        CHECK(pt_elsize(v->dtype) > 0);
        CHECK(v->ndim >= 0 && v->ndim <= FY_PK_MAX_NDIM);
        CHECK(v->ndim == 0 || (v->shape != NULL && v->stride != NULL));
        for (int32_t d = 0; d < v->ndim; d++) CHECK(v->shape[d] >= 0 && v->stride[d] >= 0);
    }
    for (int64_t i = 0; i < r->nn; i++) {
        CHECK(r->names[i].name != NULL);
        CHECK(strlen(r->names[i].name) <= FY_PK_MAX_NAME);
        CHECK(fy_utf8_valid(r->names[i].name, strlen(r->names[i].name), NULL));
        CHECK(r->names[i].view >= 0 && r->names[i].view < r->nv);
    }
    if (r->nn > 1) {
        char **names = malloc((size_t)r->nn * sizeof *names);
        CHECK(names != NULL);
        for (int64_t i = 0; i < r->nn; i++) names[i] = r->names[i].name;
        qsort(names, (size_t)r->nn, sizeof *names, pt_cmp_str);
        for (int64_t i = 1; i < r->nn; i++) CHECK(strcmp(names[i - 1], names[i]) != 0);
        free(names);
    }
}

/* The storages of a successful load, as zip entries (NULL when too big). */
static zent *storage_entries(const fy_pk_result *r, size_t *ne, uint8_t **zeros)
{
    zent *e = calloc((size_t)r->nst + 1, sizeof *e);
    CHECK(e != NULL);
    size_t n = 0, total = 0;
    for (int64_t i = 0; i < r->nst; i++) {
        const fy_pk_storage *s = &r->st[i];
        char name[300];
        int nl = snprintf(name, sizeof name, "archive/data/%.*s", (int)s->key_len, s->key);
        bool dup = false;
        for (size_t j = 0; j < n && !dup; j++)
            dup = e[j].nlen == (size_t)nl && memcmp(e[j].name, name, (size_t)nl) == 0;
        if (dup) continue;
        uint64_t bytes;
        if (__builtin_mul_overflow(s->numel, s->untyped ? 1 : pt_elsize(s->dtype), &bytes) ||
            bytes > MAX_STORAGE_BYTES - total) {
            free(e);
            return NULL;
        }
        memcpy(e[n].name, name, (size_t)nl);
        e[n].nlen = (size_t)nl;
        e[n].n = (size_t)bytes;
        total += (size_t)bytes;
        n++;
    }
    *zeros = calloc(total + 1, 1);
    CHECK(*zeros != NULL);
    for (size_t j = 0; j < n; j++) e[j].data = *zeros;
    *ne = n;
    return e;
}

static zbuf g_zip;

static int pk_once(const uint8_t *data, size_t size, bool strict_oom)
{
    fy_pk_result r;
    fy_err err;
    fy_err_init(&err);
    int rc = fy_pk_load("fuzz: data.pkl", data, size, &fz_mem, &r, &err);
    CHECK(rc <= 0);
    if (rc == 0) {
        if (strict_oom) CHECK(!g_ferry_failed);
        check_result(data, size, &r);
        if (!strict_oom || g_ferry_fail_at < 0) {
            /* the first, clean run also builds the zip for step 2 */
            size_t ne = 0;
            uint8_t *zeros = NULL;
            zent *e = storage_entries(&r, &ne, &zeros);
            g_zip.n = 0;
            if (e) {
                zent *all = calloc(ne + 1, sizeof *all);
                CHECK(all != NULL);
                memcpy(all[0].name, "archive/data.pkl", 16);
                all[0].nlen = 16;
                all[0].data = data;
                all[0].n = size;
                memcpy(all + 1, e, ne * sizeof *e);
                zip_write(&g_zip, all, ne + 1);
                free(all);
                free(e);
            }
            free(zeros);
        }
    } else {
        pt_check_failure(rc, &err, r.nn == 0 && r.nv == 0 && r.nst == 0 && r.names == NULL);
        if (strict_oom) CHECK(g_ferry_failed == (rc == -ENOMEM));
    }
    fy_pk_free(&r);
    fy_err_destroy(&err);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        json_set_alloc_funcs(js_malloc, js_free); /* jansson is not used here; kept uniform */
        init = true;
    }
    uint64_t h = pt_fnv1a(data, size);
    g_zip.n = 0;
    with_oom(pk_once, data, size, h);
    if (g_zip.n) {
        /* an exact-size copy, so that ASan sees reads past its end */
        uint8_t *z = malloc(g_zip.n);
        CHECK(z != NULL);
        size_t zn = g_zip.n;
        memcpy(z, g_zip.p, zn);
        with_oom(pt_once, z, zn, h >> 32);
        free(z);
    }
    return 0;
}
