/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_safetensors.c - libFuzzer target for the safetensors reader.
 *
 * Feeds the input, taken as a whole .safetensors file, to fy_st_parse_buffer()
 * and checks what comes back:
 *  - on success: every tensor lies inside the buffer, after the header; its byte
 *    size is product(shape) * bits / 8 (bits from the spec, not from ferry); the
 *    table is in offset order and tiles the data section exactly; names are
 *    unique, valid UTF-8 and not "__metadata__"; metadata keys and values are
 *    non-NULL valid UTF-8 and the keys unique;
 *  - on failure: the code is FERRY_E_CORRUPT, FERRY_E_LIMIT or -ENOMEM, the
 *    message is non-empty and one line, and the table is left empty.
 * The header's JSON is also checked by fy_json_check and by jansson (the
 * parser it replaced, with the flags the reader used): both must accept or
 * refuse it (but for a NUL byte jansson skips: see check_vs_jansson), agree on
 * a duplicate key, and end at the same offset.
 * Each input is parsed three times: cleanly, then with one of ferry's own
 * allocations failing (the result must then be -ENOMEM, with nothing leaked),
 * then with one of the allocations failing that jansson makes (none since the
 * reader stopped using jansson; kept for the differential check's sake: any
 * allowed result, nothing leaked). A violated invariant calls __builtin_trap(); leaks are left to
 * LeakSanitizer, so every run frees what it got.
 *
 * FERRY_FUZZ_SKIP=newline,ferry-oom,json-oom (any of them) leaves checks out,
 * to keep fuzzing past a known bug. */
#include "format/format.h"
#include "format/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Print what is wrong, then trap (libFuzzer saves the input). */
#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz_safetensors: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, \
                    #cond);                                                                            \
            if (g_err_shown) fprintf(stderr, "fuzz_safetensors: message: %s\n", g_err_shown);          \
            __builtin_trap();                                                                          \
        }                                                                                              \
    } while (0)

static const char *g_err_shown;

#include "fuzz_alloc.h"
#include "fuzz_check.h"

/* ---- checks ---- */

/* Bits per element, from the safetensors spec (independent of ferry's table). */
static int spec_bits(ferry_dtype dt)
{
    switch (dt) {
    case FERRY_DTYPE_BOOL:
    case FERRY_DTYPE_U8:
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_F8_E4M3:
    case FERRY_DTYPE_F8_E5M2:
    case FERRY_DTYPE_F8_E4M3FNUZ:
    case FERRY_DTYPE_F8_E5M2FNUZ:
    case FERRY_DTYPE_F8_E8M0: return 8;
    case FERRY_DTYPE_U16:
    case FERRY_DTYPE_I16:
    case FERRY_DTYPE_F16:
    case FERRY_DTYPE_BF16: return 16;
    case FERRY_DTYPE_U32:
    case FERRY_DTYPE_I32:
    case FERRY_DTYPE_F32: return 32;
    case FERRY_DTYPE_U64:
    case FERRY_DTYPE_I64:
    case FERRY_DTYPE_F64:
    case FERRY_DTYPE_C64: return 64;
    case FERRY_DTYPE_F6_E2M3:
    case FERRY_DTYPE_F6_E3M2: return 6;
    case FERRY_DTYPE_F4: return 4;
    default: return 0;
    }
}

static void check_success(const uint8_t *data, size_t size, const fy_table *tb)
{
    CHECK(size >= 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    CHECK(hlen > 0 && hlen <= FY_ST_MAX_HEADER && hlen <= size - 8);
    const uint64_t data_start = 8 + hlen;

    CHECK(tb->n >= 0 && tb->n <= tb->cap);
    CHECK(tb->n == 0 || tb->t != NULL);
    uint64_t pos = data_start;
    for (int64_t i = 0; i < tb->n; i++) {
        const fy_tensor *t = &tb->t[i];
        check_utf8(t->name);
        CHECK(strcmp(t->name, "__metadata__") != 0);
        CHECK(t->dtype > FERRY_DTYPE_INVALID && t->dtype < FERRY_DTYPE_COUNT);
        CHECK(fy_dtype_parse(ferry_dtype_name(t->dtype)) == t->dtype);
        int bits = spec_bits(t->dtype);
        CHECK(bits > 0 && ferry_dtype_bits(t->dtype) == bits);
        CHECK(t->ndim >= 0);
        CHECK(t->ndim == 0 || t->shape != NULL);
        /* nbytes == product(shape) * bits / 8, exactly, computed without overflow:
         * with nelem = 8q + r, that is q * bits + r * bits / 8. */
        uint64_t nelem = 1;
        bool zero = false, ovf = false;
        for (int32_t d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0);
            if (t->shape[d] == 0) zero = true;
            else if (!ovf && __builtin_mul_overflow(nelem, (uint64_t)t->shape[d], &nelem)) ovf = true;
        }
        if (zero) nelem = 0;
        CHECK(!ovf); /* more than 2^64 elements cannot lie in the buffer */
        uint64_t q = nelem / 8, r = nelem % 8, want;
        CHECK(r * (uint64_t)bits % 8 == 0); /* a whole number of bytes */
        CHECK(!__builtin_mul_overflow(q, (uint64_t)bits, &want));
        CHECK(!__builtin_add_overflow(want, r * (uint64_t)bits / 8, &want));
        CHECK(want == t->nbytes);
        CHECK(t->offset >= data_start);
        CHECK(t->offset == pos); /* sorted, no gap, no overlap; first at data_start */
        CHECK(t->offset <= size && t->nbytes <= size - t->offset);
        CHECK(t->shard == 0);
        pos = t->offset + t->nbytes;
    }
    CHECK(pos == size); /* the last tensor ends at the end of the buffer */

    char **names = malloc((size_t)(tb->n ? tb->n : 1) * sizeof *names);
    CHECK(names != NULL);
    for (int64_t i = 0; i < tb->n; i++) names[i] = tb->t[i].name;
    check_unique(names, tb->n);
    free(names);

    CHECK(tb->nmeta >= 0 && tb->nmeta <= tb->meta_cap);
    CHECK(tb->nmeta == 0 || (tb->meta_k != NULL && tb->meta_v != NULL));
    for (int64_t i = 0; i < tb->nmeta; i++) {
        check_utf8(tb->meta_k[i]);
        check_utf8(tb->meta_v[i]);
    }
    check_unique(tb->meta_k, tb->nmeta);
}

static void check_failure(int rc, const fy_err *err, const fy_table *tb)
{
    g_err_shown = err->msg;
    CHECK(rc == FERRY_E_CORRUPT || rc == FERRY_E_LIMIT || rc == -ENOMEM);
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
    CHECK(err->msg[0] != '\0');
    if (!allow_newline()) CHECK(strchr(err->msg, '\n') == NULL && strchr(err->msg, '\r') == NULL);
    CHECK(tb->n == 0 && tb->nmeta == 0); /* "on failure tb is left empty" */
    g_err_shown = NULL;
}

/* One parse; returns its code. */
static int parse_once(const uint8_t *data, size_t size, const ferry_allocator *mem, bool strict_oom)
{
    fy_table tb;
    fy_err err;
    fy_table_init(&tb, mem);
    fy_err_init(&err);
    int rc = fy_st_parse_buffer("fuzz.safetensors", data, size, &tb, &err);
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

/* fy_json_check against jansson on the header bytes (when they are UTF-8 and
 * start with '{', as the reader requires before either is asked). */
static void check_vs_jansson(const uint8_t *data, size_t size)
{
    if (size < 9) return;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen == 0 || hlen > size - 8 || data[8] != '{') return;
    size_t bad;
    if (!fy_utf8_valid((const char *)data + 8, (size_t)hlen, &bad)) return;
    fy_json_info ji;
    int rc = fy_json_check(data + 8, (size_t)hlen, "__metadata__", fy_default_allocator(), &ji);
    json_error_t je;
    json_t *j = json_loadb((const char *)data + 8, (size_t)hlen,
                           JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    CHECK(rc == 0 || rc == FERRY_E_CORRUPT);
    /* One known difference, where ferry is the stricter: jansson drops a raw
     * NUL byte that follows a number or literal (its ungetc puts back a 0,
     * which its buffer reads as "empty"), so it takes "[2\0]"; ferry refuses
     * a NUL outside a string, as JSON does. */
    bool nul = memchr(data + 8, '\0', (size_t)hlen) != NULL;
    if (rc == 0) CHECK(j != NULL);
    else if (!nul) CHECK(j == NULL);
    if (j && rc == 0 && !nul) {
        CHECK(ji.end == (size_t)je.position);
        if (json_is_object(j)) CHECK(ji.nkeys + ji.has_skip == json_object_size(j));
    } else if (!j && rc < 0 && !nul) {
        CHECK(ji.duplicate == (json_error_code(&je) == json_error_duplicate_key));
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        json_set_alloc_funcs(js_malloc, js_free);
        init = true;
    }
    g_json_fail_at = -1;
    check_vs_jansson(data, size);
    /* 1: clean, counting allocations. */
    g_ferry_allocs = g_json_allocs = 0;
    g_ferry_fail_at = g_json_fail_at = -1;
    g_ferry_failed = g_json_failed = 0;
    parse_once(data, size, &fz_mem, true);
    long nferry = g_ferry_allocs, njson = g_json_allocs;
    uint64_t h = fnv1a(data, size);

    /* 2: one of ferry's allocations fails: must give -ENOMEM. */
    static int no_ferry_oom = -1, no_json_oom = -1;
    if (no_ferry_oom < 0) {
        no_ferry_oom = skip("ferry-oom");
        no_json_oom = skip("json-oom");
    }
    if (nferry > 0 && !no_ferry_oom) {
        g_ferry_allocs = g_json_allocs = 0;
        g_ferry_fail_at = (long)(h % (uint64_t)nferry);
        g_ferry_failed = 0;
        parse_once(data, size, &fz_mem, true);
        CHECK(g_ferry_failed);
        g_ferry_fail_at = -1;
    }
    /* 3: one of jansson's allocations (outside json_loadb) fails: any allowed outcome, no leak. */
    if (njson > 0 && !no_json_oom) {
        g_ferry_allocs = g_json_allocs = 0;
        g_json_fail_at = (long)((h >> 32) % (uint64_t)njson);
        g_json_failed = 0;
        parse_once(data, size, &fz_mem, false);
        g_json_fail_at = -1;
    }
    return 0;
}
