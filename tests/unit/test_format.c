/* SPDX-License-Identifier: Apache-2.0 */
/* test_format.c - the safetensors and index parsers on in-memory buffers. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "common/common.h"
#include "format/format.h"
#include "format/json.h"

static fy_err err;
static uint8_t buf[1 << 16];

/* Assemble prefix + header + `data` zero bytes; returns the total size. */
static size_t mk(const char *hdr, size_t data)
{
    size_t h = strlen(hdr);
    uint64_t n = h;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, hdr, h);
    memset(buf + 8 + h, 0xAB, data);
    return 8 + h + data;
}

/* Parse and expect failure with code and a message containing sub. */
static void bad(const char *hdr, size_t data, int code, const char *sub)
{
    fy_table tb;
    fy_table_init(&tb, fy_default_allocator());
    err.msg[0] = 0;
    int rc = fy_st_parse_buffer("t.st", buf, mk(hdr, data), &tb, &err);
    CHECK_EQ(rc, code);
    CHECK_STR_HAS(err.msg, sub);
    CHECK_STR_HAS(err.msg, "t.st: ");
    CHECK(strchr(err.msg, '\n') == NULL);
    CHECK_EQ(tb.n, 0);
    fy_table_free(&tb);
}

static void test_valid(void)
{
    fy_table tb;
    fy_table_init(&tb, fy_default_allocator());
    /* listed out of data order; a scalar, an empty tensor, metadata, padding */
    const char *h = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[6,14]},"
                    "\"__metadata__\":{\"format\":\"pt\",\"k\":\"\"},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                    "\"e\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[14,14]},"
                    "\"s\":{\"dtype\":\"F4\",\"shape\":[],\"data_offsets\":[14,14]},"
                    "\"x\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[14,15]}}    ";
    size_t n = mk(h, 15);
    int rc = fy_st_parse_buffer("v.st", buf, n, &tb, &err);
    /* a scalar F4 is 4 bits: not a whole byte, so this must fail... */
    CHECK_EQ(rc, FERRY_E_CORRUPT);
    CHECK_STR_HAS(err.msg, "not a whole number of bytes");
    fy_table_free(&tb);

    h = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[6,14]},"
        "\"__metadata__\":{\"format\":\"pt\",\"k\":\"\"},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
        "\"e\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[14,14]},"
        "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[14,15]},"
        "\"x\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[15,16]}}    ";
    n = mk(h, 16);
    rc = fy_st_parse_buffer("v.st", buf, n, &tb, &err);
    CHECK_EQ(rc, 0);
    CHECK_EQ(tb.n, 5);
    CHECK_EQ(tb.nmeta, 2);
    uint64_t base = 8 + strlen(h);
    if (tb.n == 5) {
        CHECK(strcmp(tb.t[0].name, "a") == 0);
        CHECK_EQ(tb.t[0].offset, base + 0);
        CHECK_EQ(tb.t[0].dtype, FERRY_DTYPE_BF16);
        CHECK(strcmp(tb.t[1].name, "b") == 0);
        CHECK_EQ(tb.t[1].nbytes, 8);
        CHECK(strcmp(tb.t[2].name, "e") == 0);
        CHECK_EQ(tb.t[2].nbytes, 0);
        CHECK_EQ(tb.t[2].ndim, 2);
        CHECK(strcmp(tb.t[3].name, "s") == 0);
        CHECK_EQ(tb.t[3].ndim, 0);
        CHECK_EQ(tb.t[3].nbytes, 1);
        CHECK_EQ(tb.t[4].nbytes, 1);
        CHECK_EQ(tb.t[4].offset, base + 15);
    }
    if (tb.nmeta == 2) {
        CHECK(strcmp(tb.meta_k[0], "format") == 0 && strcmp(tb.meta_v[0], "pt") == 0);
        CHECK(strcmp(tb.meta_v[1], "") == 0);
    }
    fy_table_free(&tb);

    /* empty header, no data */
    rc = fy_st_parse_buffer("v.st", buf, mk("{}", 0), &tb, &err);
    CHECK_EQ(rc, 0);
    CHECK_EQ(tb.n, 0);
    fy_table_free(&tb);
    /* inner whitespace is JSON's business; only the tail must be spaces */
    rc = fy_st_parse_buffer(
        "v.st", buf, mk("{\n\t\"a\" : {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}\r\n}  ", 1),
        &tb, &err);
    CHECK_EQ(rc, 0);
    fy_table_free(&tb);
    /* every dtype the format defines (BOOL..F4; ggml's block types after F4 are GGUF's) */
    for (int d = 1; d <= FERRY_DTYPE_F4; d++) {
        char hh[256];
        int bits = ferry_dtype_bits((ferry_dtype)d);
        snprintf(hh, sizeof hh, "{\"t\":{\"dtype\":\"%s\",\"shape\":[4,2],\"data_offsets\":[0,%d]}}",
                 ferry_dtype_name((ferry_dtype)d), bits);
        rc = fy_st_parse_buffer("v.st", buf, mk(hh, (size_t)bits), &tb, &err);
        CHECK_EQ(rc, 0);
        if (rc == 0) CHECK_EQ(tb.t[0].dtype, d);
        fy_table_free(&tb);
    }
}

static void test_invalid(void)
{
    const char *T = "\"dtype\":\"U8\",\"shape\":[4]";
    char h[512];
    bad("{}", 3, FERRY_E_CORRUPT, "3 bytes after the last tensor");
    snprintf(h, sizeof h, "{\"x\":{%s,\"data_offsets\":[0,4]}}", T);
    bad(h, 2, FERRY_E_CORRUPT, "tensor 'x': data_offsets [0, 4] run past the end of the data (2 bytes)");
    snprintf(h, sizeof h, "{\"x\":{%s,\"data_offsets\":[0,4]},\"y\":{%s,\"data_offsets\":[2,6]}}", T, T);
    bad(h, 6, FERRY_E_CORRUPT, "overlap tensor 'x'");
    snprintf(h, sizeof h, "{\"x\":{%s,\"data_offsets\":[1,5]}}", T);
    bad(h, 5, FERRY_E_CORRUPT, "leave a gap of 1 bytes");
    snprintf(h, sizeof h, "{\"x\":{%s,\"data_offsets\":[0,3]}}", T);
    bad(h, 3, FERRY_E_CORRUPT, "needs 4 bytes but data_offsets [0, 3] hold 3");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, FERRY_E_CORRUPT,
        "end before they begin");
    bad("{\"x\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "unknown dtype 'Q4'");
    bad("{\"x\":{\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "dtype is not a string");
    bad("{\"x\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "missing \"dtype\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "missing \"shape\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, FERRY_E_CORRUPT, "missing \"data_offsets\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "shape[0] is not a non-negative integer");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4.0],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "shape[0]");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "shape is not an array");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,4]}}", 4, FERRY_E_CORRUPT,
        "not a [begin, end] pair");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-1,3]}}", 4, FERRY_E_CORRUPT,
        "non-negative integers");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
        FERRY_E_CORRUPT, "more than 2^64 elements");
    bad("{\"x\":{\"dtype\":\"F64\",\"shape\":[4294967296,536870912],\"data_offsets\":[0,4]}}", 4,
        FERRY_E_CORRUPT, "overflows 64-bit byte size");
    bad("{\"x\":{\"dtype\":\"F6_E2M3\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, FERRY_E_CORRUPT,
        "18 bits, not a whole number of bytes");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"x\":{\"dtype\":\"U8\",\"shape\":[1]"
        ",\"data_offsets\":[1,2]}}",
        2, FERRY_E_CORRUPT, "names a key twice");
    bad("{\"x\":3}", 0, FERRY_E_CORRUPT, "entry is not an object");
    bad("{\"__metadata__\":{\"k\":1}}", 0, FERRY_E_CORRUPT, "value is not a string");
    bad("{\"__metadata__\":[]}", 0, FERRY_E_CORRUPT, "__metadata__ is not an object");
    bad("{} x", 0, FERRY_E_CORRUPT, "after the JSON object");
    bad("{}\n", 0, FERRY_E_CORRUPT, "after the JSON object");
    bad("[]", 0, FERRY_E_CORRUPT, "does not start with '{'");
    bad(" {}", 0, FERRY_E_CORRUPT, "does not start with '{'");
    bad("{\"x\":", 0, FERRY_E_CORRUPT, "not valid JSON");
    bad("{\"\xff\":1}", 0, FERRY_E_CORRUPT, "not valid UTF-8 (byte 0xff at header offset 2)");
    bad("{\"\xc0\xaf\":1}", 0, FERRY_E_CORRUPT, "not valid UTF-8");     /* overlong */
    bad("{\"\xed\xa0\x80\":1}", 0, FERRY_E_CORRUPT, "not valid UTF-8"); /* surrogate */
    bad("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, FERRY_E_CORRUPT,
        "not valid JSON");
    /* a name that would break a one-line message is escaped */
    bad("{\"a\\nb\":{\"dtype\":\"Q\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, FERRY_E_CORRUPT,
        "tensor 'a\\x0ab'");

    /* deep nesting is refused, not a stack overflow */
    static char deep[40000];
    size_t o = 0;
    deep[o++] = '{';
    memcpy(deep + o, "\"x\":", 4);
    o += 4;
    for (int i = 0; i < 10000; i++) deep[o++] = '[';
    deep[o] = 0;
    bad(deep, 0, FERRY_E_CORRUPT, "not valid JSON");

    /* the 8-byte prefix */
    fy_table tb;
    uint64_t hl;
    fy_table_init(&tb, fy_default_allocator());
    CHECK_EQ(fy_st_parse_buffer("p", buf, 5, &tb, &err), FERRY_E_CORRUPT);
    CHECK_STR_HAS(err.msg, "too short for the 8-byte header length");
    uint8_t p[8] = {0};
    CHECK_EQ(fy_st_header_len(p, 100, "p", &hl, &err), FERRY_E_CORRUPT);
    CHECK_STR_HAS(err.msg, "header length is 0");
    p[0] = 0x01;
    p[4] = 0x01; /* 4 GiB + 1 */
    CHECK_EQ(fy_st_header_len(p, 1ull << 40, "p", &hl, &err), FERRY_E_LIMIT);
    CHECK_STR_HAS(err.msg, "exceeds the 100 MB limit");
    memset(p, 0, 8);
    p[0] = 200;
    CHECK_EQ(fy_st_header_len(p, 100, "p", &hl, &err), FERRY_E_CORRUPT);
    CHECK_STR_HAS(err.msg, "header length 200 runs past the end of the file (100 bytes)");
    CHECK_EQ(fy_st_header_len(p, 208, "p", &hl, &err), 0);
    CHECK_EQ(hl, 200);
    /* 100 MB exactly is allowed, one more is not */
    uint64_t lim = 100000000;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(lim >> (8 * i));
    CHECK_EQ(fy_st_header_len(p, lim + 8, "p", &hl, &err), 0);
    lim++;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(lim >> (8 * i));
    CHECK_EQ(fy_st_header_len(p, lim + 8, "p", &hl, &err), FERRY_E_LIMIT);
}

static void test_index(void)
{
    fy_index ix = {.mem = fy_default_allocator()};
    fy_table meta;
    fy_table_init(&meta, fy_default_allocator());
    const char *j =
        "{\"metadata\":{\"total_size\":123,\"n\":\"x\"},\"weight_map\":{\"a\":\"m-1.safetensors\","
        "\"b\":\"m-2.safetensors\",\"c\":\"m-1.safetensors\"}}";
    CHECK_EQ(fy_index_parse("i.json", (const uint8_t *)j, strlen(j), &ix, &meta, &err), 0);
    CHECK_EQ(ix.n, 3);
    CHECK_EQ(ix.nfiles, 2);
    if (ix.n == 3) {
        CHECK_EQ(ix.shard_of[0], 0);
        CHECK_EQ(ix.shard_of[1], 1);
        CHECK_EQ(ix.shard_of[2], 0);
    }
    CHECK_EQ(meta.nmeta, 2);
    if (meta.nmeta == 2) CHECK(strcmp(meta.meta_v[0], "123") == 0);
    fy_index_free(&ix);
    fy_table_free(&meta);

    static const struct {
        const char *json, *sub;
    } cases[] = {
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "must be relative paths"},
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "must be relative paths"},
        {"{\"weight_map\":{\"a\":\"d/../../x\"}}", "must be relative paths"},
        {"{\"weight_map\":{\"a\":\"\"}}", "must be relative paths"},
        {"{\"weight_map\":{\"a\":3}}", "is not a file name"},
        {"{\"weight_map\":{}}", "weight_map is empty"},
        {"{\"metadata\":{}}", "no \"weight_map\""},
        {"{\"metadata\":3,\"weight_map\":{\"a\":\"x\"}}", "\"metadata\" is not an object"},
        {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "not valid JSON"},
        {"[1,2]", "no \"weight_map\""},
        {"{", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fy_index ix2 = {.mem = fy_default_allocator()};
        fy_table_init(&meta, fy_default_allocator());
        CHECK_EQ(fy_index_parse("i.json", (const uint8_t *)cases[i].json, strlen(cases[i].json), &ix2, &meta,
                                &err),
                 FERRY_E_CORRUPT);
        CHECK_STR_HAS(err.msg, cases[i].sub);
        fy_index_free(&ix2);
        fy_table_free(&meta);
    }
}

static void test_helpers(void)
{
    size_t badpos;
    CHECK(fy_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15, &badpos));
    CHECK(!fy_utf8_valid("\xf4\x90\x80\x80", 4, &badpos)); /* > U+10FFFF */
    CHECK(!fy_utf8_valid("ab\xe2\x82", 4, &badpos));
    CHECK_EQ(badpos, 2);
    char q[32];
    CHECK(strcmp(fy_quote(q, sizeof q, "a'b"), "'a\\x27b'") == 0);
    fy_quote(q, sizeof q, "a very long name that will certainly not fit in thirty-two bytes");
    CHECK_STR_HAS(q, "...");
    CHECK(strlen(q) < sizeof q);
    uint64_t nb;
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_F4, 6, &nb) && nb == 3);
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_F4, 3, &nb));
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_F6_E3M2, 4, &nb) && nb == 3);
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_F64, UINT64_MAX / 4, &nb));
    CHECK_EQ(fy_dtype_parse("BF16"), FERRY_DTYPE_BF16);
    CHECK_EQ(fy_dtype_parse("bf16"), FERRY_DTYPE_INVALID);
    CHECK(strcmp(ferry_dtype_name((ferry_dtype)999), "INVALID") == 0);
    CHECK(strcmp(ferry_strerror(-ENOENT), "No such file or directory") == 0);
    CHECK(strcmp(ferry_strerror(FERRY_E_CORRUPT), "corrupt or invalid checkpoint") == 0);
    for (int c = FERRY_E_LAST; c <= FERRY_E_BASE; c++) CHECK(strcmp(ferry_strerror(c), "unknown error") != 0);
    CHECK(strcmp(ferry_strerror(-5000), "unknown error") == 0);
    CHECK_EQ(ferry_version(), FERRY_VERSION_NUMBER);
    CHECK(strcmp(ferry_version_string(), FERRY_VERSION_STRING) == 0);
}


/* ---- header memory ---- */

/* An allocator that knows the bytes it has handed out now and at most. */
typedef struct {
    size_t now, peak;
} sized;
static sized g_sized;

static void *s_alloc(void *o, size_t n)
{
    (void)o;
    size_t *p = malloc(n + 16);
    if (!p) return NULL;
    *p = n;
    g_sized.now += n;
    if (g_sized.now > g_sized.peak) g_sized.peak = g_sized.now;
    return (char *)p + 16;
}

static void s_free(void *o, void *q)
{
    (void)o;
    if (!q) return;
    size_t *p = (size_t *)((char *)q - 16);
    g_sized.now -= *p;
    free(p);
}

static void *s_realloc(void *o, void *q, size_t n)
{
    if (!q) return s_alloc(o, n);
    size_t *p = (size_t *)((char *)q - 16), old = *p;
    size_t *np = realloc(p, n + 16);
    if (!np) return NULL;
    *np = n;
    g_sized.now = g_sized.now - old + n;
    if (g_sized.now > g_sized.peak) g_sized.peak = g_sized.now;
    return (char *)np + 16;
}

static const ferry_allocator sized_mem = {s_alloc, s_realloc, s_free, NULL};

/* A whole file of n zero-size tensors "t0000000"... (and a metadata entry), in
 * JSON order n-1 .. 0, in a malloc'd buffer. */
static uint8_t *many_zero(int64_t n, size_t *size)
{
    size_t cap = 64 + (size_t)n * 64, o = 8;
    uint8_t *b = malloc(cap);
    if (!b) return NULL;
    o += (size_t)snprintf((char *)b + o, cap - o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int64_t i = n - 1; i >= 0; i--)
        o += (size_t)snprintf((char *)b + o, cap - o,
                              ",\"t%07lld\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                              (long long)i);
    b[o++] = '}';
    uint64_t h = o - 8;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    *size = o;
    return b;
}

static void test_caps(void)
{
    static const char *three = "{\"__metadata__\":{\"k\":\"v\"},"
                               "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                               "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                               "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}";
    size_t n = mk(three, 6);
    fy_table tb;
    fy_table_init(&tb, fy_default_allocator());
    /* the tensor count: refused before any table is made, __metadata__ not counted */
    tb.max_n = 2;
    CHECK_EQ(fy_st_parse_buffer("t.st", buf, n, &tb, &err), FERRY_E_LIMIT);
    CHECK_STR_HAS(err.msg, "t.st: header holds 3 tensors, over the cap of 2 (max_tensors)");
    CHECK_EQ(tb.n, 0);
    CHECK_EQ(tb.max_n, 2); /* the caps outlive fy_table_free */
    tb.max_n = 3;
    CHECK_EQ(fy_st_parse_buffer("t.st", buf, n, &tb, &err), 0);
    CHECK_EQ(tb.n, 3);
    /* what the table says it holds: 3 entries, 3 names of 2 bytes, 3 shapes,
     * the metadata arrays (16 slots each: key, value, kind) and "k", "v" */
    uint64_t want = 3 * sizeof(fy_tensor) + 3 * 2 + 3 * 8 + 16 * (2 * sizeof(char *) + 1) + 2 + 2;
    CHECK_EQ(tb.bytes, want);
    fy_table_free(&tb);
    CHECK_EQ(tb.bytes, 0);
    /* bytes: one short of what it needs, then exactly that */
    tb.max_n = 0;
    tb.max_bytes = want - 1;
    CHECK_EQ(fy_st_parse_buffer("t.st", buf, n, &tb, &err), FERRY_E_LIMIT);
    CHECK_STR_HAS(err.msg,
                  "t.st: the header and the tensor table built from it would take more than the cap of");
    CHECK_STR_HAS(err.msg, "(max_header_bytes)");
    CHECK_EQ(tb.n, 0);
    CHECK_EQ(tb.nmeta, 0);
    tb.max_bytes = want;
    CHECK_EQ(fy_st_parse_buffer("t.st", buf, n, &tb, &err), 0);
    /* a charge (the header buffer, in file.c) counts against the same cap */
    fy_table_free(&tb);
    CHECK_EQ(fy_table_charge(&tb, want + 1), FERRY_E_LIMIT);
    CHECK_EQ(fy_table_charge(&tb, want - 3 * sizeof(fy_tensor) + 1), 0); /* no room left for the entries */
    CHECK_EQ(fy_st_parse_buffer("t.st", buf, n, &tb, &err), FERRY_E_LIMIT);
    CHECK_STR_HAS(err.msg, "a table of its 3 tensors would take more than the cap");
    fy_table_free(&tb);

    /* GGUF-like pushes: the count cap in fy_table_push itself */
    fy_table_init(&tb, fy_default_allocator());
    tb.max_n = 1;
    fy_tensor t = {.name = fy_strndup(tb.mem, "x", 1), .dtype = FERRY_DTYPE_U8};
    CHECK_EQ(fy_table_push(&tb, &t), 0);
    fy_tensor u = {.name = "y", .dtype = FERRY_DTYPE_U8};
    CHECK_EQ(fy_table_push(&tb, &u), FERRY_E_LIMIT);
    CHECK_EQ(fy_table_fail(&tb, FERRY_E_LIMIT, "m.gguf", &err), FERRY_E_LIMIT);
    CHECK_STR_HAS(err.msg, "m.gguf: holds more than 1 tensors, the cap (max_tensors)");
    fy_table_free(&tb);
}

/* 100k zero-size tensors open within a bound on what the parse asks of the
 * allocator (jansson's tree took about 21 bytes a header byte in RSS). */
static void test_large_header(void)
{
    const int64_t n = 100000;
    size_t size;
    uint8_t *file = many_zero(n, &size);
    CHECK(file != NULL);
    if (!file) return;
    size_t hlen = size - 8;
    fy_table tb;
    fy_table_init(&tb, &sized_mem);
    g_sized.now = g_sized.peak = 0;
    CHECK_EQ(fy_st_parse_buffer("big.st", file, size, &tb, &err), 0);
    CHECK_EQ(tb.n, n);
    CHECK_EQ(tb.nmeta, 1);
    /* the table is in JSON order reversed (equal offsets keep JSON order) */
    CHECK(strcmp(tb.t[0].name, "t0099999") == 0 && strcmp(tb.t[n - 1].name, "t0000000") == 0);
    /* exactly as many entries as tensors (no doubling), each name and shape counted */
    CHECK_EQ(tb.cap, n);
    uint64_t want = (uint64_t)n * (sizeof(fy_tensor) + 9 + 8) + 16 * (2 * sizeof(char *) + 1) + 7 + 3;
    CHECK_EQ(tb.bytes, want);
    CHECK_EQ(g_sized.now, want); /* the accounting is what the table holds */
    /* peak: the table plus the parse's own (offset records, duplicate-key set):
     * under 2 bytes a header byte, about 120 a tensor, the header not included */
    CHECK(g_sized.peak < 2 * hlen);
    CHECK(g_sized.peak < (size_t)n * 120);
    fprintf(stderr, "large_header: %lld tensors, header %zu bytes, table %llu bytes, parse peak %zu bytes\n",
            (long long)n, hlen, (unsigned long long)tb.bytes, g_sized.peak);
    fy_table_free(&tb);
    CHECK_EQ(g_sized.now, 0);

    /* the same with one name twice, far apart: still found */
    memcpy(strstr((char *)file + 8, "\"t0000001\""), "\"t0099998\"", 10);
    CHECK_EQ(fy_st_parse_buffer("big.st", file, size, &tb, &err), FERRY_E_CORRUPT);
    CHECK_STR_HAS(err.msg, "big.st: header names a key twice ('t0099998')");
    CHECK_EQ(g_sized.now, 0);
    free(file);
}

/* fy_json_check accepts what jansson (as the safetensors reader used it)
 * accepts, refuses what it refuses, and ends where it ends. */
static void test_json_vs_jansson(void)
{
    static const char *docs[] = {
        "{}",
        "[]",
        "{\"a\":1}",
        "{\"a\":1,}",
        "{\"a\" : [1, 2 ,3]}\t",
        "{\"a\":[1,]}",
        "[1 2]",
        "{\"a\":1 \"b\":2}",
        "{\"a\"}",
        "{\"a\":}",
        "{1:2}",
        "{\"a\":01}",
        "{\"a\":-0}",
        "{\"a\":-}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":1e}",
        "{\"a\":1e+5}",
        "{\"a\":1E-5}",
        "{\"a\":+1}",
        "{\"a\":9223372036854775807}",
        "{\"a\":9223372036854775808}",
        "{\"a\":-9223372036854775808}",
        "{\"a\":-9223372036854775809}",
        "{\"a\":1e308}",
        "{\"a\":1e309}",
        "{\"a\":-1e309}",
        "{\"a\":1.7976931348623157e308}",
        "{\"a\":1.7976931348623159e308}",
        "{\"a\":"
        "1797693134862315807937289714053034150799341327100378269361737789804449682927647509466490179775872070"
        "9633028641669288791094655554785194040263065748867150582068190890200070838367627385484581771153176447"
        "5730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904"
        "174497791.9}",
        "{\"a\":1e-400}",
        "{\"a\":0.000000000000000000000000000000000000001e999999999999}",
        "{\"a\":true,\"b\":false,\"c\":null}",
        "{\"a\":True}",
        "{\"a\":nul}",
        "{\"a\":nullx}",
        "{\"a\":\"\\u0041\"}",
        "{\"a\":\"\\u00\"}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\ud83d\\ude00\"}",
        "{\"a\":\"\\ud83d\"}",
        "{\"a\":\"\\ude00\"}",
        "{\"a\":\"\\ud83d\\u0041\"}",
        "{\"a\":\"\\u0000\"}",
        "{\"a\\u0000\":1}",
        "{\"a\":\"x\ty\"}",
        "{\"a\":\"\x7f\"}",
        "{\"a\":1,\"a\":2}",
        "{\"a\":1,\"\\u0061\":2}",
        "{\"a\":{\"b\":1,\"b\":2}}",
        "{\"a\":{\"b\":1},\"c\":{\"b\":1}}",
        "{\"ab\":1,\"a\\u0062\":2}",
        "{\"\\/\":1,\"/\":2}",
        "{\"a\":1}x",
        "{\"a\":1}{}",
        "{\"a\":[[[]]]}  ",
        "{\"a\":\"unterminated",
        "{\"a\":[1,2",
        "{\"a\"",
        "{",
        "{ }",
        "{\r\n\"a\"\r\n:\r\n1\r\n}",
        "{\"a\":\"\xc3\xa9\"}",
        "{\"a\":[\"\\\"\",\"\\\\\",\"\\b\\f\\n\\r\\t\"]}",
    };
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        const char *doc = docs[d];
        size_t len = strlen(doc);
        json_error_t je;
        json_t *j = json_loadb(doc, len, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
        fy_json_info ji;
        int rc = fy_json_check((const uint8_t *)doc, len, NULL, fy_default_allocator(), &ji);
        if ((j != NULL) != (rc == 0))
            fprintf(stderr, "json_vs_jansson: differ on %s (jansson: %s)\n", doc, j ? "ok" : je.text);
        CHECK_EQ(rc == 0, j != NULL);
        if (j && rc == 0) CHECK_EQ(ji.end, (size_t)je.position);
        if (!j && rc < 0) CHECK_EQ(ji.duplicate, json_error_code(&je) == json_error_duplicate_key);
        json_decref(j);
    }
    /* nesting: 2048 levels are allowed, 2049 are not (jansson's limit) */
    for (int depth = 2047; depth <= 2049; depth++) {
        char *doc = malloc((size_t)depth * 2 + 1);
        memset(doc, '[', (size_t)depth);
        memset(doc + depth, ']', (size_t)depth);
        json_error_t je;
        json_t *j = json_loadb(doc, (size_t)depth * 2, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
        fy_json_info ji;
        int rc = fy_json_check((const uint8_t *)doc, (size_t)depth * 2, NULL, fy_default_allocator(), &ji);
        CHECK_EQ(rc == 0, j != NULL);
        CHECK_EQ(rc == 0, depth <= 2048);
        json_decref(j);
        free(doc);
    }
}

/* `test_format CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)                         \
    CASE(valid, test_valid())               \
    CASE(invalid, test_invalid())           \
    CASE(index, test_index())               \
    CASE(helpers, test_helpers())           \
    CASE(caps, test_caps())                 \
    CASE(large_header, test_large_header()) \
    CASE(json_vs_jansson, test_json_vs_jansson())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    fy_err_init(&err);
    check_run();
    fy_err_destroy(&err);
    return check_summary();
}
