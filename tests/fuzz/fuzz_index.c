/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_index.c - libFuzzer target for the sharded-checkpoint index reader.
 *
 * Feeds the input, taken as a *.safetensors.index.json, to fy_index_parse()
 * and checks what comes back:
 *  - on success: n > 0; tensor names non-NULL, valid UTF-8 and unique; every
 *    shard_of in [0, nfiles); 1 <= nfiles <= n; shard files non-empty, valid
 *    UTF-8, unique, relative (no leading '/') with no '..' component, each used
 *    by some tensor, numbered in first-seen order; metadata keys and values
 *    non-NULL, the keys unique, and the values of kind FERRY_META_JSON valid JSON;
 *  - on failure: the code is FERRY_E_CORRUPT or -ENOMEM (the documented codes),
 *    the message is non-empty and one line, and the index is left empty.
 * Each input is parsed three times: cleanly, then with one of ferry's own
 * allocations failing (the result must then be -ENOMEM), then with one of the
 * allocations failing that ferry's own jansson calls make outside the parser
 * (json_object, json_integer, json_object_set_new, json_dumps: any allowed
 * result). A violated invariant calls __builtin_trap(); leaks are left to
 * LeakSanitizer, so every run frees what it got.
 *
 * FERRY_FUZZ_SKIP=newline,ferry-oom,json-oom (any of them) leaves checks out,
 * to keep fuzzing past a known bug. */
#include "format/format.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                      \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "fuzz_index: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            if (g_err_shown) fprintf(stderr, "fuzz_index: message: %s\n", g_err_shown);                  \
            __builtin_trap();                                                                            \
        }                                                                                                \
    } while (0)

static const char *g_err_shown;

#include "fuzz_alloc.h"
#include "fuzz_check.h"

/* ---- checks ---- */

/* Independent restatement of the rule: non-empty, relative, no ".." component. */
static bool relpath_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || p[0] == '/') return false;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == '/') {
            if (i - start == 2 && p[start] == '.' && p[start + 1] == '.') return false;
            start = i + 1;
        }
    }
    return true;
}

static void check_success(const fy_index *ix, const fy_table *meta)
{
    CHECK(ix->n > 0);
    CHECK(ix->names != NULL && ix->shard_of != NULL && ix->files != NULL);
    CHECK(ix->nfiles >= 1 && ix->nfiles <= ix->n);
    for (int64_t i = 0; i < ix->n; i++) check_utf8(ix->names[i]);
    check_unique(ix->names, ix->n);

    char *used = calloc((size_t)ix->nfiles, 1);
    CHECK(used != NULL);
    int32_t next = 0; /* files are numbered in first-seen order */
    for (int64_t i = 0; i < ix->n; i++) {
        int32_t s = ix->shard_of[i];
        CHECK(s >= 0 && s < ix->nfiles);
        CHECK(s <= next);
        if (s == next) next++;
        used[s] = 1;
    }
    CHECK(next == ix->nfiles);
    for (int32_t f = 0; f < ix->nfiles; f++) {
        CHECK(used[f]);
        check_utf8(ix->files[f]);
        CHECK(ix->files[f][0] != '\0');
        CHECK(relpath_ok(ix->files[f]));
    }
    free(used);
    check_unique(ix->files, ix->nfiles);

    CHECK(meta->n == 0);
    CHECK(meta->nmeta >= 0 && meta->nmeta <= meta->meta_cap);
    CHECK(meta->nmeta == 0 || (meta->meta_k != NULL && meta->meta_v != NULL));
    for (int64_t i = 0; i < meta->nmeta; i++) {
        check_utf8(meta->meta_k[i]);
        check_utf8(meta->meta_v[i]);
        check_meta_kind(meta->meta_kind[i], meta->meta_v[i]);
    }
    check_unique(meta->meta_k, meta->nmeta);
}

static void check_failure(int rc, const fy_err *err, const fy_index *ix)
{
    g_err_shown = err->msg;
    CHECK(rc == FERRY_E_CORRUPT || rc == -ENOMEM);
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
    CHECK(err->msg[0] != '\0');
    if (!allow_newline()) CHECK(strchr(err->msg, '\n') == NULL && strchr(err->msg, '\r') == NULL);
    CHECK(ix->n == 0 && ix->nfiles == 0 && ix->names == NULL && ix->files == NULL && ix->shard_of == NULL);
    g_err_shown = NULL;
}

static void parse_once(const uint8_t *data, size_t size, bool strict_oom)
{
    fy_index ix;
    fy_table meta;
    fy_err err;
    memset(&ix, 0, sizeof ix);
    ix.mem = &fz_mem;
    fy_table_init(&meta, &fz_mem);
    fy_err_init(&err);
    int rc = fy_index_parse("fuzz.safetensors.index.json", data, size, &ix, &meta, &err);
    CHECK(rc <= 0);
    if (rc == 0) {
        if (strict_oom) CHECK(!g_ferry_failed);
        check_success(&ix, &meta);
    } else {
        check_failure(rc, &err, &ix);
        if (strict_oom) CHECK(g_ferry_failed == (rc == -ENOMEM));
    }
    fy_index_free(&ix);
    CHECK(ix.mem == &fz_mem && ix.n == 0 && ix.names == NULL);
    fy_table_free(&meta);
    fy_err_destroy(&err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        json_set_alloc_funcs(js_malloc, js_free);
        init = true;
    }
    g_ferry_allocs = g_json_allocs = 0;
    g_ferry_fail_at = g_json_fail_at = -1;
    g_ferry_failed = g_json_failed = 0;
    parse_once(data, size, true);
    long nferry = g_ferry_allocs, njson = g_json_allocs;
    uint64_t h = fnv1a(data, size);

    static int no_ferry_oom = -1, no_json_oom = -1;
    if (no_ferry_oom < 0) {
        no_ferry_oom = skip("ferry-oom");
        no_json_oom = skip("json-oom");
    }
    if (nferry > 0 && !no_ferry_oom) {
        g_ferry_allocs = g_json_allocs = 0;
        g_ferry_fail_at = (long)(h % (uint64_t)nferry);
        g_ferry_failed = 0;
        parse_once(data, size, true);
        CHECK(g_ferry_failed);
        g_ferry_fail_at = -1;
    }
    if (njson > 0 && !no_json_oom) {
        g_ferry_allocs = g_json_allocs = 0;
        g_json_fail_at = (long)((h >> 32) % (uint64_t)njson);
        g_json_failed = 0;
        parse_once(data, size, false);
        g_json_fail_at = -1;
    }
    return 0;
}
