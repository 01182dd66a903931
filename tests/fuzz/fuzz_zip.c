/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_zip.c - libFuzzer target for the ZIP reader, and through it the whole
 * PyTorch checkpoint reader.
 *
 * The input is a whole file. It goes to fy_zip_open() and then to
 * fy_pt_parse(), and what comes back is checked:
 *  - fy_zip_open on success: the directory and the end records lie inside the
 *    buffer; every entry's name lies inside the buffer, is non-empty, valid
 *    UTF-8 without NUL, and unique (fy_zip_find finds each at its own index,
 *    the sorted index is strictly increasing); its local header, re-read here,
 *    has the local signature and the same name, and the data starts right
 *    after the LOCAL header's name and extra field; data + csize ends before
 *    the central directory; stored entries have csize == usize;
 *  - fy_pt_parse on success: fuzz_pt_check.h's table invariants (every tensor
 *    inside the buffer, sizes consistent with shape, strides and flags, names
 *    unique, file order);
 *  - on failure (both): a documented code, a one-line message, nothing left.
 * Each call runs cleanly, then with one of ferry's allocations failing (the
 * result must then be -ENOMEM and nothing may leak). A violated invariant
 * calls __builtin_trap(); leaks are left to LeakSanitizer. */
#include "format/format.h"
#include "format/zip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz_zip: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            if (g_err_shown) fprintf(stderr, "fuzz_zip: message: %s\n", g_err_shown);                  \
            __builtin_trap();                                                                          \
        }                                                                                              \
    } while (0)

static const char *g_err_shown;

#include "fuzz_alloc.h"
#include "fuzz_pt_check.h"

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static bool inside(const uint8_t *data, size_t size, const void *p, uint64_t n)
{
    const uint8_t *q = p;
    return q >= data && (uint64_t)(q - data) <= size && n <= size - (uint64_t)(q - data);
}

static void check_zip(const uint8_t *data, size_t size, const fy_zip *z)
{
    CHECK(z->cd_offset <= size && z->cd_size <= size - z->cd_offset);
    CHECK(z->n <= z->cd_size / 46);
    CHECK(z->n == 0 || (z->e != NULL && z->sorted != NULL));
    for (uint64_t i = 0; i < z->n; i++) {
        const fy_zip_entry *e = &z->e[i];
        CHECK(e->name_len > 0);
        CHECK(inside(data, size, e->name, e->name_len));
        CHECK(memchr(e->name, 0, e->name_len) == NULL);
        CHECK(fy_utf8_valid(e->name, e->name_len, NULL));
        CHECK(fy_zip_find(z, e->name, e->name_len) == (int64_t)i);
        CHECK(e->header < z->cd_offset && z->cd_offset - e->header >= 30);
        const uint8_t *l = data + e->header;
        CHECK(rd32(l) == 0x04034b50u);
        uint16_t nl = rd16(l + 26), xl = rd16(l + 28);
        CHECK(nl == e->name_len && memcmp(l + 30, e->name, nl) == 0);
        CHECK(e->data == e->header + 30 + nl + xl);
        CHECK(e->data <= z->cd_offset && e->csize <= z->cd_offset - e->data);
        if (e->method == 0 && !(e->flags & 1)) CHECK(e->csize == e->usize);
        fy_err err;
        fy_err_init(&err);
        if (fy_zip_stored("x", z, i, &err) == 0) CHECK(e->method == 0 && !(e->flags & 1));
        else CHECK((e->method != 0 || (e->flags & 1)) && strstr(err.msg, "x: zip entry '") == err.msg);
        fy_err_destroy(&err);
    }
    for (uint64_t i = 1; i < z->n; i++) {
        const fy_zip_entry *a = &z->e[z->sorted[i - 1]], *b = &z->e[z->sorted[i]];
        size_t m = a->name_len < b->name_len ? a->name_len : b->name_len;
        int c = memcmp(a->name, b->name, m);
        CHECK(c < 0 || (c == 0 && a->name_len < b->name_len));
    }
    CHECK(fy_zip_find(z, "\xff", 1) < 0); /* not UTF-8: never a name */
}

static int zip_once(const uint8_t *data, size_t size, bool strict_oom)
{
    fy_zip z;
    fy_err err;
    fy_err_init(&err);
    int rc = fy_zip_open("fuzz.pt", data, size, &fz_mem, &z, &err);
    CHECK(rc <= 0);
    if (rc == 0) {
        if (strict_oom) CHECK(!g_ferry_failed);
        check_zip(data, size, &z);
    } else {
        pt_check_failure(rc, &err, z.n == 0 && z.e == NULL && z.sorted == NULL);
        if (strict_oom) CHECK(g_ferry_failed == (rc == -ENOMEM));
    }
    fy_zip_free(&z);
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
    with_oom(zip_once, data, size, h);
    with_oom(pt_once, data, size, h >> 32);
    return 0;
}
