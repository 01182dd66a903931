/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Feeds the input, taken as a whole .gguf file, to fy_gguf_parse() and checks
 * what comes back:
 *  - on success: the input starts with "GGUF" and version 2 or 3; every tensor
 *    lies inside the buffer, after the 24-byte header, at a multiple of the
 *    alignment (general.alignment from the metadata, else 32); its byte size is
 *    product(shape) / block * block bytes with the innermost dimension a whole
 *    number of blocks (block sizes from ggml-common.h, written out here, not
 *    taken from ferry); at most 4 dimensions, none negative; the table is in
 *    offset order and no two non-empty tensors share a byte; names are unique,
 *    valid UTF-8 and at most 64 bytes; strides NULL, flags 0; metadata keys are
 *    unique, non-empty, valid UTF-8, and the values valid UTF-8, those of
 *    kind FERRY_META_JSON valid JSON;
 *  - on failure: the code is FERRY_E_CORRUPT, FERRY_E_UNSUPPORTED,
 *    FERRY_E_LIMIT or -ENOMEM, the message is non-empty, one line and starts
 *    with the file's name, and the table is left empty.
 * Each input is parsed twice: cleanly, then with one of ferry's allocations
 * failing (the result must then be -ENOMEM, with nothing leaked). A violated
 * invariant calls __builtin_trap(); leaks are left to LeakSanitizer.
 *
 * FERRY_FUZZ_SKIP=newline,ferry-oom (either) leaves checks out, to keep
 * fuzzing past a known bug. */
#include "format/format.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "fuzz_gguf: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            if (g_err_shown) fprintf(stderr, "fuzz_gguf: message: %s\n", g_err_shown);                  \
            __builtin_trap();                                                                           \
        }                                                                                               \
    } while (0)

static const char *g_err_shown;

#include "fuzz_alloc.h"
#include "fuzz_check.h"

#define NAME "fuzz.gguf"

/* Elements per block and bytes per block, from ggml-common.h's block_* structs. */
static bool spec_block(ferry_dtype dt, uint64_t *block, uint64_t *bytes)
{
    static const struct {
        ferry_dtype dt;
        uint64_t block, bytes;
    } t[] = {
        {FERRY_DTYPE_F32, 1, 4},
        {FERRY_DTYPE_F16, 1, 2},
        {FERRY_DTYPE_BF16, 1, 2},
        {FERRY_DTYPE_F64, 1, 8},
        {FERRY_DTYPE_I8, 1, 1},
        {FERRY_DTYPE_I16, 1, 2},
        {FERRY_DTYPE_I32, 1, 4},
        {FERRY_DTYPE_I64, 1, 8},
        {FERRY_DTYPE_Q4_0, 32, 2 + 16},
        {FERRY_DTYPE_Q4_1, 32, 4 + 16},
        {FERRY_DTYPE_Q5_0, 32, 2 + 4 + 16},
        {FERRY_DTYPE_Q5_1, 32, 4 + 4 + 16},
        {FERRY_DTYPE_Q8_0, 32, 2 + 32},
        {FERRY_DTYPE_Q8_1, 32, 4 + 32},
        {FERRY_DTYPE_Q2_K, 256, 16 + 64 + 4},
        {FERRY_DTYPE_Q3_K, 256, 32 + 64 + 12 + 2},
        {FERRY_DTYPE_Q4_K, 256, 4 + 12 + 128},
        {FERRY_DTYPE_Q5_K, 256, 4 + 12 + 32 + 128},
        {FERRY_DTYPE_Q6_K, 256, 128 + 64 + 16 + 2},
        {FERRY_DTYPE_Q8_K, 256, 4 + 256 + 32},
        {FERRY_DTYPE_IQ2_XXS, 256, 2 + 64},
        {FERRY_DTYPE_IQ2_XS, 256, 2 + 64 + 8},
        {FERRY_DTYPE_IQ3_XXS, 256, 2 + 96},
        {FERRY_DTYPE_IQ1_S, 256, 2 + 32 + 16},
        {FERRY_DTYPE_IQ4_NL, 32, 2 + 16},
        {FERRY_DTYPE_IQ3_S, 256, 2 + 64 + 8 + 32 + 4},
        {FERRY_DTYPE_IQ2_S, 256, 2 + 64 + 8 + 8},
        {FERRY_DTYPE_IQ4_XS, 256, 2 + 2 + 4 + 128},
        {FERRY_DTYPE_IQ1_M, 256, 32 + 16 + 8},
        {FERRY_DTYPE_TQ1_0, 256, 48 + 4 + 2},
        {FERRY_DTYPE_TQ2_0, 256, 64 + 2},
        {FERRY_DTYPE_MXFP4, 32, 1 + 16},
        {FERRY_DTYPE_NVFP4, 64, 4 + 32},
        {FERRY_DTYPE_Q1_0, 128, 2 + 16},
        {FERRY_DTYPE_Q2_0, 64, 2 + 16},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].dt == dt) {
            *block = t[i].block;
            *bytes = t[i].bytes;
            return true;
        }
    return false;
}

static void check_success(const uint8_t *data, size_t size, const fy_table *tb)
{
    CHECK(size >= 24 && memcmp(data, "GGUF", 4) == 0);
    CHECK((data[4] == 2 || data[4] == 3) && data[5] == 0 && data[6] == 0 && data[7] == 0);

    CHECK(tb->nmeta >= 0 && tb->nmeta <= tb->meta_cap);
    CHECK(tb->nmeta == 0 || (tb->meta_k != NULL && tb->meta_v != NULL));
    uint64_t align = 32;
    for (int64_t i = 0; i < tb->nmeta; i++) {
        check_utf8(tb->meta_k[i]);
        check_utf8(tb->meta_v[i]);
        CHECK(tb->meta_k[i][0] != '\0');
        check_meta_kind(tb->meta_kind[i], tb->meta_v[i]);
        if (strcmp(tb->meta_k[i], "general.alignment") == 0) {
            char *end;
            align = strtoull(tb->meta_v[i], &end, 10);
            CHECK(*end == '\0' && align > 0 && align <= 0xFFFFFFFFu && (align & (align - 1)) == 0);
        }
    }
    check_unique(tb->meta_k, tb->nmeta);

    CHECK(tb->n >= 0 && tb->n <= tb->cap);
    CHECK(tb->n == 0 || tb->t != NULL);
    uint64_t prev = 0, reach = 24; /* the furthest byte a non-empty tensor reaches */
    for (int64_t i = 0; i < tb->n; i++) {
        const fy_tensor *t = &tb->t[i];
        check_utf8(t->name);
        CHECK(strlen(t->name) <= 64);
        CHECK(t->dtype > FERRY_DTYPE_INVALID && t->dtype < FERRY_DTYPE_COUNT);
        uint64_t block, bytes;
        CHECK(spec_block(t->dtype, &block, &bytes));
        int fb = 0, fby = 0;
        CHECK(ferry_dtype_block(t->dtype, &fb, &fby) == 0 && (uint64_t)fb == block && (uint64_t)fby == bytes);
        CHECK(t->ndim >= 0 && t->ndim <= 4);
        CHECK(t->ndim == 0 || t->shape != NULL);
        CHECK(t->strides == NULL && t->flags == 0 && t->shard == 0);
        uint64_t nelem = 1;
        bool zero = false, ovf = false;
        for (int32_t d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0);
            if (t->shape[d] == 0) zero = true;
            else if (!ovf && __builtin_mul_overflow(nelem, (uint64_t)t->shape[d], &nelem)) ovf = true;
        }
        if (zero) nelem = 0;
        CHECK(!ovf); /* more than 2^64 elements cannot lie in the buffer */
        uint64_t row = t->ndim ? (uint64_t)t->shape[t->ndim - 1] : 1;
        CHECK(row % block == 0 && nelem % block == 0);
        uint64_t want;
        CHECK(!__builtin_mul_overflow(nelem / block, bytes, &want));
        CHECK(want == t->nbytes);
        CHECK(t->offset >= 24 && t->offset % align == 0);
        CHECK(t->offset <= size && t->nbytes <= size - t->offset);
        CHECK(t->offset >= prev); /* file order */
        prev = t->offset;
        if (t->nbytes) {
            CHECK(t->offset >= reach); /* no overlap */
            reach = t->offset + t->nbytes;
        }
    }
    char **names = malloc((size_t)(tb->n ? tb->n : 1) * sizeof *names);
    CHECK(names != NULL);
    for (int64_t i = 0; i < tb->n; i++) names[i] = tb->t[i].name;
    check_unique(names, tb->n);
    free(names);
}

static void check_failure(int rc, const fy_err *err, const fy_table *tb)
{
    static int allow_newline = -1;
    if (allow_newline < 0) allow_newline = skip("newline");
    g_err_shown = err->msg;
    CHECK(rc == FERRY_E_CORRUPT || rc == FERRY_E_UNSUPPORTED || rc == FERRY_E_LIMIT || rc == -ENOMEM);
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
    CHECK(strncmp(err->msg, NAME ": ", sizeof NAME + 1) == 0);
    if (!allow_newline) CHECK(strchr(err->msg, '\n') == NULL && strchr(err->msg, '\r') == NULL);
    CHECK(tb->n == 0 && tb->nmeta == 0); /* "on failure tb is empty" */
    g_err_shown = NULL;
}

static int parse_once(const uint8_t *data, size_t size, bool strict_oom)
{
    fy_table tb;
    fy_err err;
    fy_table_init(&tb, &fz_mem);
    fy_err_init(&err);
    int rc = fy_gguf_parse(NAME, data, size, &tb, &err);
    CHECK(rc <= 0);
    if (rc == 0) {
        if (strict_oom) CHECK(!g_ferry_failed); /* an allocation failed but nobody noticed */
        check_success(data, size, &tb);
    } else {
        check_failure(rc, &err, &tb);
        if (strict_oom) CHECK(g_ferry_failed == (rc == -ENOMEM));
    }
    fy_table_free(&tb);
    CHECK(tb.n == 0 && tb.t == NULL && tb.nmeta == 0);
    fy_err_destroy(&err);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int no_ferry_oom = -1;
    if (no_ferry_oom < 0) {
        no_ferry_oom = skip("ferry-oom");
        json_set_alloc_funcs(js_malloc, js_free); /* jansson only checks JSON values here */
    }
    /* 1: clean, counting allocations. */
    g_ferry_allocs = 0;
    g_ferry_fail_at = -1;
    g_ferry_failed = 0;
    parse_once(data, size, true);
    long nferry = g_ferry_allocs;
    /* 2: one of ferry's allocations fails: must give -ENOMEM. */
    if (nferry > 0 && !no_ferry_oom) {
        g_ferry_allocs = 0;
        g_ferry_fail_at = (long)(fnv1a(data, size) % (uint64_t)nferry);
        g_ferry_failed = 0;
        parse_once(data, size, true);
        CHECK(g_ferry_failed);
        g_ferry_fail_at = -1;
    }
    return 0;
}
