/* SPDX-License-Identifier: Apache-2.0 */
/* test_gguf.c - the GGUF reader on in-memory buffers (every value type, every
 * ggml type, the error classes, truncation and bit-flip sweeps, allocation
 * failures), the dtype catalogue's block sizes, and a GGUF file through the
 * public API. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "format/format.h"

static fy_err err;

/* ---- a little GGUF builder ---- */

static uint8_t buf[1 << 20];
static size_t blen;

static void put(const void *p, size_t n)
{
    if (blen + n > sizeof buf) abort();
    memcpy(buf + blen, p, n);
    blen += n;
}
static void put_le(uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));
        put(&b, 1);
    }
}
static void u8(uint64_t v)
{
    put_le(v, 1);
}
static void u32(uint64_t v)
{
    put_le(v, 4);
}
static void u64(uint64_t v)
{
    put_le(v, 8);
}
static void str_n(const char *s, size_t n)
{
    u64(n);
    put(s, n);
}
static void str(const char *s)
{
    str_n(s, strlen(s));
}
static void header(uint32_t version, uint64_t nt, uint64_t nkv)
{
    blen = 0;
    put("GGUF", 4);
    u32(version);
    u64(nt);
    u64(nkv);
}
enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };
static void kv_u32(const char *k, uint32_t v)
{
    str(k);
    u32(U32);
    u32(v);
}
static void kv_str(const char *k, const char *v)
{
    str(k);
    u32(STR);
    str(v);
}
/* a tensor info; ne innermost-first */
static void tinfo(const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off)
{
    str(name);
    u32(nd);
    for (uint32_t i = 0; i < nd; i++) u64(ne[i]);
    u32(type);
    u64(off);
}
static size_t pad_to(size_t a)
{
    while (blen % a) u8(0);
    return blen;
}
static void zeros(size_t n)
{
    while (n--) u8(0);
}

static int parse(fy_table *tb)
{
    fy_table_init(tb, fy_default_allocator());
    err.msg[0] = 0;
    return fy_gguf_parse("t.gguf", buf, blen, tb, &err);
}

/* Expect failure with code and a one-line message holding sub. */
static void bad(int code, const char *sub)
{
    fy_table tb;
    int rc = parse(&tb);
    CHECK_EQ(rc, code);
    CHECK_STR_HAS(err.msg, sub);
    CHECK(strncmp(err.msg, "t.gguf: ", 8) == 0);
    CHECK(strchr(err.msg, '\n') == NULL);
    CHECK_EQ(tb.n, 0);
    CHECK_EQ(tb.nmeta, 0);
    if (rc != code || !strstr(err.msg, sub)) fprintf(stderr, "  message: %s\n", err.msg);
    fy_table_free(&tb);
}

static const char *meta(const fy_table *tb, const char *k)
{
    for (int64_t i = 0; i < tb->nmeta; i++)
        if (strcmp(tb->meta_k[i], k) == 0) return tb->meta_v[i];
    return NULL;
}

static int meta_kind(const fy_table *tb, const char *k)
{
    for (int64_t i = 0; i < tb->nmeta; i++)
        if (strcmp(tb->meta_k[i], k) == 0) return tb->meta_kind[i];
    return -1;
}

#define CHECK_META(tb, k, v)                                                           \
    do {                                                                               \
        const char *m_ = meta((tb), (k));                                              \
        CHECK(m_ &&strcmp(m_, (v)) == 0);                                              \
        if (!m_ || strcmp(m_, (v)))                                                    \
            fprintf(stderr, "  %s = %s, expected %s\n", (k), m_ ? m_ : "(none)", (v)); \
    } while (0)

/* ---- the dtype catalogue ---- */

static void test_dtypes(void)
{
    static const struct {
        ferry_dtype dt;
        const char *name;
        int block, bytes;
    } want[] = {
        {FERRY_DTYPE_F32, "F32", 1, 4},           {FERRY_DTYPE_F4, "F4", 2, 1},
        {FERRY_DTYPE_F6_E2M3, "F6_E2M3", 4, 3},   {FERRY_DTYPE_Q4_0, "Q4_0", 32, 18},
        {FERRY_DTYPE_Q4_1, "Q4_1", 32, 20},       {FERRY_DTYPE_Q5_0, "Q5_0", 32, 22},
        {FERRY_DTYPE_Q5_1, "Q5_1", 32, 24},       {FERRY_DTYPE_Q8_0, "Q8_0", 32, 34},
        {FERRY_DTYPE_Q8_1, "Q8_1", 32, 36},       {FERRY_DTYPE_Q2_K, "Q2_K", 256, 84},
        {FERRY_DTYPE_Q3_K, "Q3_K", 256, 110},     {FERRY_DTYPE_Q4_K, "Q4_K", 256, 144},
        {FERRY_DTYPE_Q5_K, "Q5_K", 256, 176},     {FERRY_DTYPE_Q6_K, "Q6_K", 256, 210},
        {FERRY_DTYPE_Q8_K, "Q8_K", 256, 292},     {FERRY_DTYPE_IQ2_XXS, "IQ2_XXS", 256, 66},
        {FERRY_DTYPE_IQ2_XS, "IQ2_XS", 256, 74},  {FERRY_DTYPE_IQ3_XXS, "IQ3_XXS", 256, 98},
        {FERRY_DTYPE_IQ1_S, "IQ1_S", 256, 50},    {FERRY_DTYPE_IQ4_NL, "IQ4_NL", 32, 18},
        {FERRY_DTYPE_IQ3_S, "IQ3_S", 256, 110},   {FERRY_DTYPE_IQ2_S, "IQ2_S", 256, 82},
        {FERRY_DTYPE_IQ4_XS, "IQ4_XS", 256, 136}, {FERRY_DTYPE_IQ1_M, "IQ1_M", 256, 56},
        {FERRY_DTYPE_TQ1_0, "TQ1_0", 256, 54},    {FERRY_DTYPE_TQ2_0, "TQ2_0", 256, 66},
        {FERRY_DTYPE_MXFP4, "MXFP4", 32, 17},     {FERRY_DTYPE_NVFP4, "NVFP4", 64, 36},
        {FERRY_DTYPE_Q1_0, "Q1_0", 128, 18},      {FERRY_DTYPE_Q2_0, "Q2_0", 64, 18},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int b = 0, by = 0;
        CHECK_EQ(ferry_dtype_block(want[i].dt, &b, &by), 0);
        CHECK_EQ(b, want[i].block);
        CHECK_EQ(by, want[i].bytes);
        CHECK(strcmp(ferry_dtype_name(want[i].dt), want[i].name) == 0);
        if (want[i].dt >= FERRY_DTYPE_Q4_0) {
            CHECK_EQ(ferry_dtype_bits(want[i].dt), 0);
            /* safetensors does not know ggml's block types */
            CHECK_EQ(fy_dtype_parse(want[i].name), FERRY_DTYPE_INVALID);
        }
    }
    /* every dtype has a block and a name */
    for (int d = 1; d < FERRY_DTYPE_COUNT; d++) {
        int b = 0, by = 0;
        CHECK_EQ(ferry_dtype_block((ferry_dtype)d, &b, &by), 0);
        CHECK(b >= 1 && by >= 1);
        CHECK(strcmp(ferry_dtype_name((ferry_dtype)d), "INVALID") != 0);
        if (ferry_dtype_bits((ferry_dtype)d)) CHECK_EQ(ferry_dtype_bits((ferry_dtype)d) * b, 8 * by);
    }
    CHECK_EQ(ferry_dtype_block(FERRY_DTYPE_INVALID, NULL, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_dtype_block(FERRY_DTYPE_COUNT, NULL, NULL), FERRY_E_INVAL);
    CHECK_EQ(ferry_dtype_block((ferry_dtype)-1, NULL, NULL), FERRY_E_INVAL);
    uint64_t nb = 0;
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_Q4_0, 64, &nb) && nb == 36);
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_Q4_K, 0, &nb) && nb == 0);
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_Q4_0, 33, &nb));
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_Q8_0, UINT64_MAX / 32 * 32, &nb)); /* overflows */
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_Q8_0, (UINT64_MAX / 34) / 32 * 32, &nb));
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_INVALID, 1, &nb));
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_COUNT, 1, &nb));
    /* the sub-byte floats keep their rules */
    CHECK(fy_dtype_nbytes(FERRY_DTYPE_F4, 6, &nb) && nb == 3);
    CHECK(!fy_dtype_nbytes(FERRY_DTYPE_F6_E3M2, 6, &nb));
}

/* ---- valid files ---- */

static void test_valid(void)
{
    fy_table tb;
    /* infos out of data order, custom alignment, a scalar, an empty tensor */
    uint64_t ne_a[2] = {32, 3}, ne_b[1] = {5}, ne_e[2] = {0, 7}, ne_q[3] = {256, 2, 1};
    header(3, 5, 3);
    kv_str("general.architecture", "llama");
    kv_u32("general.alignment", 64);
    str("rope");
    u32(F32);
    u32(0x3dcccccd); /* 0.1f */
    tinfo("b", 1, ne_b, 0 /* F32 */, 576);
    tinfo("a.q8", 2, ne_a, 8 /* Q8_0 */, 0);
    tinfo("e", 2, ne_e, 12 /* Q4_K */, 576);
    tinfo("s", 0, NULL, 30 /* BF16 */, 640);
    tinfo("q", 3, ne_q, 14 /* Q6_K */, 128);
    size_t start = pad_to(64);
    CHECK_EQ(start % 64, 0);
    zeros(642);
    int rc = parse(&tb);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    CHECK_EQ(tb.n, 5);
    if (tb.n == 5) {
        /* by offset, then size (the empty one before b at 576), then info order */
        const char *order[] = {"a.q8", "q", "e", "b", "s"};
        for (int i = 0; i < 5; i++) CHECK(strcmp(tb.t[i].name, order[i]) == 0);
        CHECK_EQ(tb.t[0].dtype, FERRY_DTYPE_Q8_0);
        CHECK_EQ(tb.t[0].ndim, 2);
        CHECK_EQ(tb.t[0].shape[0], 3); /* outermost first */
        CHECK_EQ(tb.t[0].shape[1], 32);
        CHECK_EQ(tb.t[0].nbytes, 3 * 34);
        CHECK_EQ(tb.t[0].offset, start);
        CHECK_EQ(tb.t[1].dtype, FERRY_DTYPE_Q6_K);
        CHECK_EQ(tb.t[1].ndim, 3);
        CHECK_EQ(tb.t[1].shape[0], 1);
        CHECK_EQ(tb.t[1].shape[1], 2);
        CHECK_EQ(tb.t[1].shape[2], 256);
        CHECK_EQ(tb.t[1].nbytes, 2 * 210);
        CHECK_EQ(tb.t[1].offset, start + 128);
        CHECK_EQ(tb.t[2].nbytes, 0);
        CHECK_EQ(tb.t[2].shape[0], 7);
        CHECK_EQ(tb.t[2].shape[1], 0);
        CHECK_EQ(tb.t[3].dtype, FERRY_DTYPE_F32);
        CHECK_EQ(tb.t[3].nbytes, 20);
        CHECK_EQ(tb.t[3].offset, start + 576);
        CHECK_EQ(tb.t[4].ndim, 0);
        CHECK(tb.t[4].shape == NULL);
        CHECK_EQ(tb.t[4].nbytes, 2);
        CHECK_EQ(tb.t[4].offset, start + 640);
        for (int i = 0; i < 5; i++) {
            CHECK(tb.t[i].strides == NULL);
            CHECK_EQ(tb.t[i].flags, 0);
            CHECK_EQ(tb.t[i].shard, 0);
        }
    }
    CHECK_EQ(tb.nmeta, 3);
    CHECK_META(&tb, "general.architecture", "llama");
    CHECK_META(&tb, "general.alignment", "64");
    CHECK_META(&tb, "rope", "0.1");
    fy_table_free(&tb);

    /* version 2, no tensors, no metadata; the header alone */
    header(2, 0, 0);
    CHECK_EQ(parse(&tb), 0);
    CHECK_EQ(tb.n, 0);
    fy_table_free(&tb);

    /* alignment 1: offsets anywhere, no padding */
    uint64_t ne1[1] = {3};
    header(3, 2, 1);
    kv_u32("general.alignment", 1);
    tinfo("x", 1, ne1, 24 /* I8 */, 0);
    tinfo("y", 1, ne1, 24, 3);
    start = blen;
    zeros(6);
    CHECK_EQ(parse(&tb), 0);
    if (tb.n == 2) {
        CHECK_EQ(tb.t[0].offset, start);
        CHECK_EQ(tb.t[1].offset, start + 3);
    }
    fy_table_free(&tb);

    /* gaps between tensors are fine; the default alignment is 32 */
    uint64_t ne4[1] = {4};
    header(3, 2, 0);
    tinfo("x", 1, ne4, 0, 0);
    tinfo("y", 1, ne4, 0, 96);
    start = pad_to(32);
    zeros(112);
    CHECK_EQ(parse(&tb), 0);
    if (tb.n == 2) CHECK_EQ(tb.t[1].offset, start + 96);
    fy_table_free(&tb);
}

/* Every ggml type number ferry knows, and the ones it does not. */
static void test_types(void)
{
    static const struct {
        uint32_t num;
        const char *name;
    } known[] = {
        {0, "F32"},     {1, "F16"},    {2, "Q4_0"},     {3, "Q4_1"},    {6, "Q5_0"},     {7, "Q5_1"},
        {8, "Q8_0"},    {9, "Q8_1"},   {10, "Q2_K"},    {11, "Q3_K"},   {12, "Q4_K"},    {13, "Q5_K"},
        {14, "Q6_K"},   {15, "Q8_K"},  {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"},
        {20, "IQ4_NL"}, {21, "IQ3_S"}, {22, "IQ2_S"},   {23, "IQ4_XS"}, {24, "I8"},      {25, "I16"},
        {26, "I32"},    {27, "I64"},   {28, "F64"},     {29, "IQ1_M"},  {30, "BF16"},    {34, "TQ1_0"},
        {35, "TQ2_0"},  {39, "MXFP4"}, {40, "NVFP4"},   {41, "Q1_0"},   {42, "Q2_0"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        fy_table tb;
        uint64_t ne[2] = {256, 2};
        header(3, 1, 0);
        tinfo("w", 2, ne, known[i].num, 0);
        pad_to(32);
        zeros(4096);
        int rc = parse(&tb);
        CHECK_EQ(rc, 0);
        if (rc == 0) {
            CHECK(strcmp(ferry_dtype_name(tb.t[0].dtype), known[i].name) == 0);
            int b, by;
            ferry_dtype_block(tb.t[0].dtype, &b, &by);
            CHECK_EQ(tb.t[0].nbytes, (uint64_t)512 / (uint64_t)b * (uint64_t)by);
        }
        fy_table_free(&tb);
    }
    static const uint32_t unknown[] = {4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, 0xFFFFFFFF};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        uint64_t ne[1] = {256};
        char sub[64];
        header(3, 1, 0);
        tinfo("w", 1, ne, unknown[i], 0);
        zeros(64);
        snprintf(sub, sizeof sub, "tensor 'w': ggml type %u ", unknown[i]);
        bad(FERRY_E_UNSUPPORTED, sub);
    }
    header(3, 1, 0);
    uint64_t ne[1] = {32};
    tinfo("w", 1, ne, 4, 0);
    zeros(64);
    bad(FERRY_E_UNSUPPORTED, "ggml type 4 (Q4_2) was removed");
}

/* Every value type, how its text reads, and whether that text is JSON. */
static void test_metadata(void)
{
    fy_table tb;
    header(3, 0, 23);
    str("u8");
    u32(U8);
    u8(200);
    str("i8");
    u32(I8);
    u8(0x80);
    str("u16");
    u32(U16);
    put_le(65535, 2);
    str("i16");
    u32(I16);
    put_le(0x8000, 2);
    str("u32");
    u32(U32);
    u32(4000000000u);
    str("i32");
    u32(I32);
    u32(0xFFFFFFFF);
    str("u64");
    u32(U64);
    u64(UINT64_MAX);
    str("i64");
    u32(I64);
    u64(0x8000000000000000ull);
    str("f32");
    u32(F32);
    u32(0x3f800000); /* 1 */
    str("f64");
    u32(F64);
    u64(0x3fd5555555555555ull); /* 1/3 */
    str("nan");
    u32(F32);
    u32(0x7fc00000);
    str("ninf");
    u32(F64);
    u64(0xfff0000000000000ull);
    str("t");
    u32(BOOL);
    u8(1);
    str("f");
    u32(BOOL);
    u8(0);
    str("s");
    u32(STR);
    str("line1\nline2 \xe5\x90\x8d");
    str("empty");
    u32(STR);
    str("");
    /* arrays: short (shown), long (summarised), nested, strings escaped */
    str("a.i16");
    u32(ARR);
    u32(I16);
    u64(3);
    put_le(1, 2);
    put_le(0xFFFF, 2);
    put_le(300, 2);
    str("a.long");
    u32(ARR);
    u32(U8);
    u64(17);
    zeros(17);
    str("a.str");
    u32(ARR);
    u32(STR);
    u64(4);
    str("q\"b\\");
    str("\x01\t");
    str_n("n\0ul", 4);
    str("bad\xff\xc3");
    str("a.nest");
    u32(ARR);
    u32(ARR);
    u64(3);
    u32(BOOL);
    u64(2);
    u8(1);
    u8(0);
    u32(ARR);
    u64(1);
    u32(F32);
    u64(1);
    u32(0x40200000); /* [[2.5]] */
    u32(U64);
    u64(20);
    zeros(160);
    str("a.empty");
    u32(ARR);
    u32(STR);
    u64(0);
    str("a.bigstr");
    u32(ARR);
    u32(STR);
    u64(1000);
    for (int i = 0; i < 1000; i++) str("tok");
    str("a.nan");
    u32(ARR);
    u32(F32);
    u64(2);
    u32(0x3f800000);
    u32(0x7fc00000);
    int rc = parse(&tb);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    CHECK_META(&tb, "u8", "200");
    CHECK_META(&tb, "i8", "-128");
    CHECK_META(&tb, "u16", "65535");
    CHECK_META(&tb, "i16", "-32768");
    CHECK_META(&tb, "u32", "4000000000");
    CHECK_META(&tb, "i32", "-1");
    CHECK_META(&tb, "u64", "18446744073709551615");
    CHECK_META(&tb, "i64", "-9223372036854775808");
    CHECK_META(&tb, "f32", "1");
    CHECK_META(&tb, "f64", "0.3333333333333333");
    CHECK_META(&tb, "nan", "NaN");
    CHECK_META(&tb, "ninf", "-Infinity");
    CHECK_META(&tb, "t", "true");
    CHECK_META(&tb, "f", "false");
    CHECK_META(&tb, "s", "line1\nline2 \xe5\x90\x8d");
    CHECK_META(&tb, "empty", "");
    CHECK_META(&tb, "a.i16", "[1,-1,300]");
    CHECK_META(&tb, "a.long", "[UINT8 x 17]");
    CHECK_META(&tb, "a.str",
               "[\"q\\\"b\\\\\",\"\\u0001\\t\",\"n\\u0000ul\",\"bad\xef\xbf\xbd\xef\xbf\xbd\"]");
    CHECK_META(&tb, "a.nest", "[[true,false],[[2.5]],[UINT64 x 20]]");
    CHECK_META(&tb, "a.empty", "[]");
    CHECK_META(&tb, "a.bigstr", "[STRING x 1000]");
    CHECK_META(&tb, "a.nan", "[1,NaN]");
    /* JSON: numbers, booleans, shown arrays; text: strings and what JSON cannot hold */
    static const struct {
        const char *k;
        int kind;
    } kinds[] = {
        {"u8", FERRY_META_JSON},       {"i8", FERRY_META_JSON},     {"u16", FERRY_META_JSON},
        {"i16", FERRY_META_JSON},      {"u32", FERRY_META_JSON},    {"i32", FERRY_META_JSON},
        {"u64", FERRY_META_JSON},      {"i64", FERRY_META_JSON},    {"f32", FERRY_META_JSON},
        {"f64", FERRY_META_JSON},      {"nan", FERRY_META_TEXT},    {"ninf", FERRY_META_TEXT},
        {"t", FERRY_META_JSON},        {"f", FERRY_META_JSON},      {"s", FERRY_META_TEXT},
        {"empty", FERRY_META_TEXT},    {"a.i16", FERRY_META_JSON},  {"a.long", FERRY_META_TEXT},
        {"a.str", FERRY_META_JSON},    {"a.nest", FERRY_META_TEXT}, {"a.empty", FERRY_META_JSON},
        {"a.bigstr", FERRY_META_TEXT}, {"a.nan", FERRY_META_TEXT},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        CHECK_EQ(meta_kind(&tb, kinds[i].k), kinds[i].kind);
        if (meta_kind(&tb, kinds[i].k) != kinds[i].kind) fprintf(stderr, "  kind of %s\n", kinds[i].k);
    }
    for (int64_t i = 0; i < tb.nmeta; i++) CHECK(fy_utf8_valid(tb.meta_v[i], strlen(tb.meta_v[i]), NULL));
    fy_table_free(&tb);

    /* floats: the fewest digits that read back, plain or exponent form */
    static const struct {
        uint32_t bits;
        const char *text;
    } f32s[] = {
        {0x3dcccccd, "0.1"},
        {0x3727c5ac, "1e-05"},
        {0x80000000, "-0"},
        {0x7f7fffff, "3.4028235e+38"},
        {0x00000001, "1e-45"},
        {0x461c4000, "10000"},
        {0x501502f9, "10000000000"},
        {0x7f800000, "Infinity"},
        {0x38d1b717, "0.0001"},
        {0x5a0e1bca, "1e+16"},
        {0x59635fa9, "4000000000000000"},
    };
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++) {
        header(3, 0, 1);
        str("x");
        u32(F32);
        u32(f32s[i].bits);
        CHECK_EQ(parse(&tb), 0);
        CHECK_META(&tb, "x", f32s[i].text);
        fy_table_free(&tb);
    }
}

/* ---- the error classes ---- */

static void test_invalid(void)
{
    uint64_t ne4[1] = {4};
    /* header */
    blen = 0;
    put("GGUX\3\0\0\0", 8);
    zeros(16);
    bad(FERRY_E_CORRUPT, "does not start with the GGUF magic");
    blen = 0;
    put("GGU", 3);
    bad(FERRY_E_CORRUPT, "does not start with the GGUF magic");
    blen = 0;
    put("GGUF\3\0", 6);
    bad(FERRY_E_CORRUPT, "file is 6 bytes, too short for the 24-byte GGUF header");
    header(3, 0, 0);
    blen = 20;
    bad(FERRY_E_CORRUPT, "file is 20 bytes, too short");
    header(1, 0, 0);
    bad(FERRY_E_UNSUPPORTED, "GGUF version 1 is not supported");
    header(4, 0, 0);
    bad(FERRY_E_UNSUPPORTED, "GGUF version 4 is not supported (ferry reads versions 2 and 3)");
    header(0x03000000, 0, 0);
    bad(FERRY_E_UNSUPPORTED, "a big-endian GGUF file (version 3 with its bytes swapped)");
    header(0x02000000, 0, 0);
    bad(FERRY_E_UNSUPPORTED, "big-endian");
    header(0x01000000, 0, 0);
    bad(FERRY_E_UNSUPPORTED, "big-endian GGUF file (version 1");
    header(3, 0, 2);
    zeros(25);
    bad(FERRY_E_CORRUPT, "metadata_kv_count 2 is impossible");
    header(3, 2, 1);
    kv_u32("k", 1);
    zeros(40);
    bad(FERRY_E_CORRUPT, "tensor_count 2 is impossible");
    header(3, 0, UINT64_MAX);
    bad(FERRY_E_CORRUPT, "metadata_kv_count 18446744073709551615 is impossible");

    /* key/values */
    header(3, 0, 1);
    str("");
    u32(U8);
    u8(1);
    zeros(8);
    bad(FERRY_E_CORRUPT, "metadata key/value 1 of 1: the key is empty");
    header(3, 0, 1);
    str("a\xc3");
    u32(U8);
    u8(1);
    bad(FERRY_E_CORRUPT, "the key is not valid UTF-8 (byte 0xc3 at offset 33)");
    header(3, 0, 1);
    str_n("a\0b", 3);
    u32(U8);
    u8(1);
    bad(FERRY_E_CORRUPT, "the key holds a NUL byte (offset 33)");
    header(3, 0, 1);
    str("k");
    u32(13);
    zeros(8);
    bad(FERRY_E_CORRUPT, "metadata key 'k': unknown value type 13");
    header(3, 0, 1);
    str("k");
    u32(BOOL);
    u8(2);
    zeros(8);
    bad(FERRY_E_CORRUPT, "BOOL value 2 at offset 37 is neither 0 nor 1");
    header(3, 0, 1);
    str("k");
    u32(STR);
    str("a\xe0\x80\x80");
    bad(FERRY_E_CORRUPT, "metadata key 'k': the STRING value is not valid UTF-8 (byte 0xe0 at offset 46)");
    header(3, 0, 1);
    str("k");
    u32(STR);
    str_n("a\0", 2);
    bad(FERRY_E_CORRUPT, "the STRING value holds a NUL byte (offset 46)");
    header(3, 0, 1);
    str("k");
    u32(STR);
    u64(1000);
    zeros(4);
    bad(FERRY_E_CORRUPT,
        "a STRING value of 1000 bytes at offset 45 runs past the end of the file (49 bytes)");
    header(3, 0, 1);
    str("k");
    u32(U64);
    u32(0);
    bad(FERRY_E_CORRUPT, "a UINT64 value at offset 37 runs past the end of the file");
    header(3, 0, 1);
    str("k");
    u32(ARR);
    u32(14);
    u64(0);
    bad(FERRY_E_CORRUPT, "has unknown element type 14");
    header(3, 0, 1);
    str("k");
    u32(ARR);
    u32(ARR);
    u64(UINT64_MAX / 4);
    zeros(30);
    bad(FERRY_E_CORRUPT, "needs at least 12 bytes per item");
    header(3, 0, 1);
    str("k");
    u32(ARR);
    u32(BOOL);
    u64(40);
    zeros(39);
    u8(7);
    bad(FERRY_E_CORRUPT, "BOOL value 7");
    /* 32 levels of arrays are fine, 33 are not */
    for (int levels = 32; levels <= 33; levels++) {
        header(3, 0, 1);
        str("k");
        u32(ARR);
        for (int i = 1; i < levels; i++) {
            u32(ARR);
            u64(1);
        }
        u32(U8);
        u64(1);
        u8(9);
        if (levels == 32) {
            fy_table tb;
            CHECK_EQ(parse(&tb), 0);
            fy_table_free(&tb);
        } else {
            bad(FERRY_E_LIMIT, "arrays nested deeper than 32 levels (ferry's limit)");
        }
    }
    header(3, 0, 2);
    kv_u32("k", 1);
    kv_u32("k", 2);
    bad(FERRY_E_CORRUPT, "metadata key 'k' appears twice (key/values 1 and 2): keys must be unique");
    header(3, 0, 1);
    kv_u32("general.alignment", 0);
    bad(FERRY_E_CORRUPT, "the alignment 0 is not a power of two");
    header(3, 0, 1);
    kv_u32("general.alignment", 96);
    bad(FERRY_E_CORRUPT, "metadata key 'general.alignment': the alignment 96 is not a power of two");
    header(3, 0, 1);
    str("general.alignment");
    u32(I32);
    u32(32);
    bad(FERRY_E_CORRUPT, "the alignment must be a UINT32, not INT32");
    header(3, 0, 1);
    str("k\x1b[31m\n");
    u32(99);
    zeros(8);
    bad(FERRY_E_CORRUPT, "metadata key 'k\\x1b[31m\\x0a': unknown value type 99");

    /* tensor infos */
    char name65[66];
    memset(name65, 'n', 65);
    name65[65] = 0;
    header(3, 1, 0);
    tinfo(name65, 1, ne4, 0, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "tensor info 1 of 1: the name is 65 bytes long (GGUF allows at most 64)");
    header(3, 1, 0);
    tinfo("w\xf8", 1, ne4, 0, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "tensor info 1 of 1: the name is not valid UTF-8");
    header(3, 2, 0);
    tinfo("w", 1, ne4, 0, 0);
    tinfo("w", 1, ne4, 0, 32);
    pad_to(32);
    zeros(64);
    bad(FERRY_E_CORRUPT, "tensor 'w' is listed twice (tensor infos 1 and 2): tensor names must be unique");
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    header(3, 1, 0);
    tinfo("w", 5, ne5, 0, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "tensor 'w': n_dims is 5 (GGUF allows at most 4)");
    uint64_t neneg[2] = {4, UINT64_MAX};
    header(3, 1, 0);
    tinfo("w", 2, neneg, 0, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "ne[1] = 18446744073709551615 is negative as the int64 ggml reads it");
    uint64_t ne33[2] = {33, 1};
    header(3, 1, 0);
    tinfo("w", 2, ne33, 2, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT,
        "tensor 'w': ne [33, 1] of Q4_0: ne[0] = 33 is not a multiple of the Q4_0 block (32 elements)");
    uint64_t neovf[3] = {1ull << 32, 1ull << 32, 1};
    header(3, 1, 0);
    tinfo("w", 3, neovf, 24, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "has more than 2^64 elements");
    uint64_t nebig[1] = {1ull << 62};
    header(3, 1, 0);
    tinfo("w", 1, nebig, 0, 0);
    zeros(64);
    bad(FERRY_E_CORRUPT, "ne [4611686018427387904] of F32 overflows 64-bit byte size");
    header(3, 1, 0);
    tinfo("w", 1, ne4, 0, 16);
    zeros(64);
    bad(FERRY_E_CORRUPT, "tensor 'w': offset 16 is not a multiple of the alignment (32)");
    header(3, 1, 0);
    tinfo("w", 1, ne4, 0, 0);
    size_t start = pad_to(32);
    zeros(15);
    char sub[160];
    snprintf(sub, sizeof sub,
             "tensor 'w': 16 bytes at offset 0 of the data section (which starts at %zu) run past the "
             "end of the file (%zu bytes)",
             start, start + 15);
    bad(FERRY_E_CORRUPT, sub);
    header(3, 1, 0);
    tinfo("w", 1, ne4, 0, UINT64_MAX - 31);
    zeros(64);
    bad(FERRY_E_CORRUPT, "run past the end of the file");
    header(3, 2, 0);
    tinfo("a", 1, ne4, 0, 0);
    tinfo("b", 1, ne4, 1 /* F16 */, 0);
    pad_to(32);
    zeros(32);
    bad(FERRY_E_CORRUPT, "tensor 'a': bytes [0, 16) of the data section overlap tensor 'b' [0, 8)");
    /* empty tensors overlap nothing, even inside another */
    uint64_t ne0[1] = {0}, ne64[1] = {64};
    header(3, 3, 0);
    tinfo("big", 1, ne64, 0, 0);
    tinfo("e", 1, ne0, 0, 32);
    tinfo("next", 1, ne4, 0, 256);
    pad_to(32);
    zeros(288);
    fy_table tb;
    CHECK_EQ(parse(&tb), 0);
    if (tb.n == 3) CHECK(strcmp(tb.t[1].name, "e") == 0);
    fy_table_free(&tb);
    header(3, 3, 0);
    tinfo("big", 1, ne64, 0, 0);
    tinfo("e", 1, ne0, 0, 32);
    tinfo("in", 1, ne4, 0, 224);
    pad_to(32);
    zeros(288);
    bad(FERRY_E_CORRUPT, "tensor 'in': bytes [224, 240) of the data section overlap tensor 'big' [0, 256)");
}

/* ---- sweeps: every prefix, every byte flipped ---- */

static size_t build_rich(void)
{
    uint64_t ne_a[2] = {32, 2}, ne_b[1] = {3}, ne0[1] = {0};
    header(3, 3, 4);
    kv_str("general.architecture", "llama");
    kv_u32("general.alignment", 16);
    str("arr");
    u32(ARR);
    u32(STR);
    u64(2);
    str("x");
    str("yz");
    str("nest");
    u32(ARR);
    u32(ARR);
    u64(1);
    u32(BOOL);
    u64(2);
    u8(1);
    u8(0);
    tinfo("a", 2, ne_a, 8, 0);
    tinfo("b", 1, ne_b, 0, 80);
    tinfo("e", 1, ne0, 2, 96);
    pad_to(16);
    zeros(96);
    return blen;
}

static void check_clean(int rc, const fy_table *tb)
{
    if (rc == 0) return;
    CHECK(rc == FERRY_E_CORRUPT || rc == FERRY_E_UNSUPPORTED || rc == FERRY_E_LIMIT);
    CHECK(strncmp(err.msg, "t.gguf: ", 8) == 0 && !strchr(err.msg, '\n'));
    CHECK(tb->n == 0 && tb->nmeta == 0);
}

static void test_sweeps(void)
{
    static uint8_t orig[4096];
    size_t n = build_rich();
    memcpy(orig, buf, n);
    fy_table tb;
    CHECK_EQ(parse(&tb), 0);
    CHECK_EQ(tb.n, 3);
    fy_table_free(&tb);
    int fails = 0;
    for (size_t cut = 0; cut < n; cut++) {
        /* an exact-size copy, so that the sanitizers see a read past the end */
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, orig, cut);
        fy_table_init(&tb, fy_default_allocator());
        int rc = fy_gguf_parse("t.gguf", p, cut, &tb, &err);
        if (rc == 0) fails++;
        check_clean(rc ? rc : FERRY_E_CORRUPT, &tb);
        fy_table_free(&tb);
        free(p);
    }
    CHECK_EQ(fails, 0); /* every prefix is missing data */
    for (size_t i = 0; i < n; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(buf, orig, n);
            buf[i] ^= (uint8_t)(1u << bit);
            blen = n;
            int rc = parse(&tb);
            check_clean(rc, &tb);
            fy_table_free(&tb);
        }
    }
}

/* ---- allocation failures ---- */

static long alloc_n, fail_at = -1, biggest;
static void *t_alloc(void *o, size_t n)
{
    (void)o;
    if ((long)n > biggest) biggest = (long)n;
    return alloc_n++ == fail_at ? NULL : malloc(n);
}
static void *t_realloc(void *o, void *p, size_t n)
{
    (void)o;
    if ((long)n > biggest) biggest = (long)n;
    return alloc_n++ == fail_at ? NULL : realloc(p, n);
}
static void t_free(void *o, void *p)
{
    (void)o;
    free(p);
}
static const ferry_allocator tmem = {t_alloc, t_realloc, t_free, NULL};

static void test_oom(void)
{
    build_rich();
    int ok = 0;
    for (fail_at = 0; fail_at < 1000 && !ok; fail_at++) {
        fy_table tb;
        fy_table_init(&tb, &tmem);
        alloc_n = 0;
        int rc = fy_gguf_parse("t.gguf", buf, blen, &tb, &err);
        if (rc == 0) {
            ok = 1;
            CHECK(alloc_n <= fail_at); /* nothing failed */
        } else {
            CHECK_EQ(rc, -ENOMEM);
            CHECK_STR_HAS(err.msg, "out of memory");
            CHECK(tb.n == 0 && tb.nmeta == 0);
        }
        fy_table_free(&tb);
    }
    CHECK(ok);
    fail_at = -1;

    /* hostile counts allocate nothing big */
    header(3, 0, 1);
    str("k");
    u32(ARR);
    u32(STR);
    u64(UINT64_MAX);
    zeros(64);
    fy_table tb;
    fy_table_init(&tb, &tmem);
    biggest = 0;
    CHECK_EQ(fy_gguf_parse("t.gguf", buf, blen, &tb, &err), FERRY_E_CORRUPT);
    CHECK(biggest < 4096);
    fy_table_free(&tb);
    header(3, 0, 1);
    str("k");
    u32(ARR);
    u32(U8);
    u64(1u << 19);
    zeros(1u << 19);
    fy_table_init(&tb, &tmem);
    biggest = 0;
    CHECK_EQ(fy_gguf_parse("t.gguf", buf, blen, &tb, &err), 0);
    CHECK(biggest < 4096); /* "[UINT8 x 1048576]", not the items */
    fy_table_free(&tb);
}

/* ---- through the public API ---- */

static void test_file_api(void)
{
    char dir[] = "/tmp/ferry-gguf-XXXXXX";
    const char *tmp = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/ferry-gguf-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    char *d = mkdtemp(tmpl);
    if (!d) d = mkdtemp(dir);
    CHECK(d != NULL);
    if (!d) return;
    char path[600];
    snprintf(path, sizeof path, "%s/m.gguf", d);
    uint64_t ne[2] = {32, 2};
    header(3, 1, 1);
    kv_str("general.name", "tiny");
    tinfo("blk.0.w", 2, ne, 8, 0);
    size_t start = pad_to(32);
    for (int i = 0; i < 68; i++) u8((uint64_t)(i * 7));
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fwrite(buf, 1, blen, f);
    fclose(f);

    ferry_ctx *ctx;
    ferry_file *ff;
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    int rc = ferry_file_open(ctx, path, 0, &ff);
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        CHECK_EQ(ferry_file_format(ff), FERRY_FORMAT_GGUF);
        CHECK(strcmp(ferry_format_name(ferry_file_format(ff)), "gguf") == 0);
        CHECK_EQ(ferry_file_tensor_count(ff), 1);
        CHECK_EQ(ferry_file_total_bytes(ff), 68);
        int64_t i = ferry_file_find(ff, "blk.0.w");
        CHECK_EQ(i, 0);
        ferry_tensor_info ti = {.size = sizeof ti};
        CHECK_EQ(ferry_file_tensor_info(ff, 0, &ti), 0);
        CHECK_EQ(ti.dtype, FERRY_DTYPE_Q8_0);
        CHECK_EQ(ti.offset, start);
        CHECK(ti.ndim == 2 && ti.shape[0] == 2 && ti.shape[1] == 32);
        const void *p;
        CHECK_EQ(ferry_file_tensor_data(ff, 0, &p), 0);
        CHECK(p && memcmp(p, buf + start, 68) == 0);
        uint8_t back[68];
        CHECK_EQ(ferry_file_tensor_read(ff, 0, 0, back, sizeof back), 0);
        CHECK(memcmp(back, buf + start, 68) == 0);
        const char *k, *v;
        CHECK_EQ(ferry_file_metadata(ff, 0, &k, &v), 0);
        CHECK(strcmp(k, "general.name") == 0 && strcmp(v, "tiny") == 0);
        CHECK_EQ(ferry_file_metadata_kind(ff, 0), FERRY_META_TEXT);
        ferry_file_close(ff);
    }
    /* a corrupt one: the message names the file */
    header(3, 0, 1);
    str("k");
    u32(BOOL);
    u8(3);
    zeros(8);
    f = fopen(path, "wb");
    fwrite(buf, 1, blen, f);
    fclose(f);
    CHECK_EQ(ferry_file_open(ctx, path, 0, &ff), FERRY_E_CORRUPT);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), path);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "BOOL value 3");
    ferry_ctx_free(ctx);
    unlink(path);
    rmdir(d);
}

/* `test_gguf CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)                 \
    CASE(dtypes, test_dtypes())     \
    CASE(valid, test_valid())       \
    CASE(types, test_types())       \
    CASE(metadata, test_metadata()) \
    CASE(invalid, test_invalid())   \
    CASE(sweeps, test_sweeps())     \
    CASE(oom, test_oom())           \
    CASE(file_api, test_file_api())
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
