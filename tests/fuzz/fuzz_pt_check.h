/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_pt_check.h - what a PyTorch checkpoint table must satisfy, checked by
 * fuzz_zip.c and fuzz_pickle.c after fy_pt_parse(). Needs CHECK() and
 * g_err_shown from the including file, and fuzz_alloc.h before it. Written from the contract in
 * format.h and ferry.h, not from the reader's code. */
#ifndef FERRY_FUZZ_PT_CHECK_H
#define FERRY_FUZZ_PT_CHECK_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"

static int pt_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Bytes per element of the dtypes torch can store (all whole bytes). */
static uint64_t pt_elsize(ferry_dtype dt)
{
    switch (dt) {
    case FERRY_DTYPE_BOOL:
    case FERRY_DTYPE_U8:
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_F8_E4M3:
    case FERRY_DTYPE_F8_E5M2:
    case FERRY_DTYPE_F8_E4M3FNUZ:
    case FERRY_DTYPE_F8_E5M2FNUZ:
    case FERRY_DTYPE_F8_E8M0: return 1;
    case FERRY_DTYPE_U16:
    case FERRY_DTYPE_I16:
    case FERRY_DTYPE_F16:
    case FERRY_DTYPE_BF16: return 2;
    case FERRY_DTYPE_U32:
    case FERRY_DTYPE_I32:
    case FERRY_DTYPE_F32: return 4;
    case FERRY_DTYPE_U64:
    case FERRY_DTYPE_I64:
    case FERRY_DTYPE_F64:
    case FERRY_DTYPE_C64: return 8;
    default: return 0;
    }
}

/* The table of a successful fy_pt_parse over data[0, size). */
static void pt_check_table(const uint8_t *data, size_t size, const fy_table *tb)
{
    (void)data;
    CHECK(tb->n >= 0 && tb->n <= tb->cap);
    CHECK(tb->n == 0 || tb->t != NULL);
    uint64_t prev = 0;
    for (int64_t i = 0; i < tb->n; i++) {
        const fy_tensor *t = &tb->t[i];
        CHECK(t->name != NULL);
        CHECK(fy_utf8_valid(t->name, strlen(t->name), NULL));
        uint64_t el = pt_elsize(t->dtype);
        CHECK(el > 0);
        CHECK(t->ndim >= 0 && t->ndim <= 1024);
        CHECK(t->ndim == 0 || t->shape != NULL);
        CHECK((t->flags & ~(uint32_t)(FERRY_TENSOR_NONCONTIGUOUS | FERRY_TENSOR_SHARED_STORAGE)) == 0);
        CHECK(t->shard == 0);
        /* inside the buffer, and in file order */
        CHECK(t->offset <= size && t->nbytes <= size - t->offset);
        CHECK(t->offset >= prev);
        prev = t->offset;
        uint64_t numel = 1;
        bool empty = false, ovf = false;
        for (int32_t d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0);
            if (t->shape[d] == 0) empty = true;
            else if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) ovf = true;
        }
        if (empty) {
            CHECK(t->nbytes == 0);
            continue;
        }
        CHECK(!ovf);
        if (!t->strides) {
            /* row-major: numel x element size */
            CHECK(!(t->flags & FERRY_TENSOR_NONCONTIGUOUS));
            uint64_t want;
            CHECK(!__builtin_mul_overflow(numel, el, &want));
            CHECK(t->nbytes == want);
        } else {
            /* strided: the span from the first to one past the last element,
             * and the strides really are not row-major */
            CHECK(t->flags & FERRY_TENSOR_NONCONTIGUOUS);
            uint64_t span = 1, expect = 1;
            bool rowmajor = true;
            for (int32_t d = t->ndim - 1; d >= 0; d--) {
                CHECK(t->strides[d] >= 0);
                uint64_t ext;
                CHECK(!__builtin_mul_overflow((uint64_t)t->shape[d] - 1, (uint64_t)t->strides[d], &ext));
                CHECK(!__builtin_add_overflow(span, ext, &span));
                if (t->shape[d] != 1 && (uint64_t)t->strides[d] != expect) rowmajor = false;
                expect *= (uint64_t)t->shape[d];
            }
            CHECK(!rowmajor);
            uint64_t want;
            CHECK(!__builtin_mul_overflow(span, el, &want));
            CHECK(t->nbytes == want);
        }
    }
    if (tb->n > 1) {
        char **names = malloc((size_t)tb->n * sizeof *names);
        CHECK(names != NULL);
        for (int64_t i = 0; i < tb->n; i++) names[i] = tb->t[i].name;
        qsort(names, (size_t)tb->n, sizeof *names, pt_cmp_str);
        for (int64_t i = 1; i < tb->n; i++) CHECK(strcmp(names[i - 1], names[i]) != 0);
        free(names);
    }
    CHECK(tb->nmeta == 0);
}

/* A failure: a documented code, a one-line message, nothing left behind. */
static void pt_check_failure(int rc, const fy_err *err, bool table_empty)
{
    g_err_shown = err->msg;
    CHECK(rc == FERRY_E_CORRUPT || rc == FERRY_E_UNSUPPORTED || rc == FERRY_E_LIMIT || rc == -ENOMEM);
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
    CHECK(err->msg[0] != '\0');
    CHECK(strchr(err->msg, '\n') == NULL && strchr(err->msg, '\r') == NULL);
    CHECK(table_empty);
    g_err_shown = NULL;
}

static uint64_t pt_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* fy_pt_parse over data[0, size), checked; with strict_oom, an allocation
 * failure (fuzz_alloc.h) must be what made it fail, and only that. */
static inline int pt_once(const uint8_t *data, size_t size, bool strict_oom)
{
    fy_table tb;
    fy_err err;
    fy_table_init(&tb, &fz_mem);
    fy_err_init(&err);
    int rc = fy_pt_parse("fuzz.pt", data, size, &tb, &err);
    CHECK(rc <= 0);
    if (rc == 0) {
        if (strict_oom) CHECK(!g_ferry_failed);
        pt_check_table(data, size, &tb);
    } else {
        pt_check_failure(rc, &err, tb.n == 0 && tb.nmeta == 0);
        if (strict_oom) CHECK(g_ferry_failed == (rc == -ENOMEM));
    }
    fy_table_free(&tb);
    CHECK(tb.n == 0 && tb.t == NULL);
    fy_err_destroy(&err);
    return rc;
}

#endif
