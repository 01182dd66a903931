/* test_format.c - the safetensors and index parsers on in-memory buffers. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "format/format.h"

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
    rc = fy_st_parse_buffer("v.st", buf, mk("{\n\t\"a\" : {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}\r\n}  ", 1),
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
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, FERRY_E_CORRUPT, "end before they begin");
    bad("{\"x\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "unknown dtype 'Q4'");
    bad("{\"x\":{\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "dtype is not a string");
    bad("{\"x\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "missing \"dtype\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "missing \"shape\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, FERRY_E_CORRUPT, "missing \"data_offsets\"");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "shape[0] is not a non-negative integer");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4.0],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "shape[0]");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT, "shape is not an array");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,4]}}", 4, FERRY_E_CORRUPT, "not a [begin, end] pair");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-1,3]}}", 4, FERRY_E_CORRUPT, "non-negative integers");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "more than 2^64 elements");
    bad("{\"x\":{\"dtype\":\"F64\",\"shape\":[4294967296,536870912],\"data_offsets\":[0,4]}}", 4, FERRY_E_CORRUPT,
        "overflows 64-bit byte size");
    bad("{\"x\":{\"dtype\":\"F6_E2M3\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, FERRY_E_CORRUPT,
        "18 bits, not a whole number of bytes");
    bad("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
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
    bad("{\"\xc0\xaf\":1}", 0, FERRY_E_CORRUPT, "not valid UTF-8");       /* overlong */
    bad("{\"\xed\xa0\x80\":1}", 0, FERRY_E_CORRUPT, "not valid UTF-8");   /* surrogate */
    bad("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, FERRY_E_CORRUPT, "not valid JSON");
    /* a name that would break a one-line message is escaped */
    bad("{\"a\\nb\":{\"dtype\":\"Q\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, FERRY_E_CORRUPT, "tensor 'a\\x0ab'");

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
    const char *j = "{\"metadata\":{\"total_size\":123,\"n\":\"x\"},\"weight_map\":{\"a\":\"m-1.safetensors\","
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

    static const struct { const char *json, *sub; } cases[] = {
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
        CHECK_EQ(fy_index_parse("i.json", (const uint8_t *)cases[i].json, strlen(cases[i].json), &ix2, &meta, &err),
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

/* `test_format CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)                                                              \
    CASE(valid, test_valid())                                                    \
    CASE(invalid, test_invalid())                                                \
    CASE(index, test_index())                                                    \
    CASE(helpers, test_helpers())
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
