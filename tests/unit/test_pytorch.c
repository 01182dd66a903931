/* SPDX-License-Identifier: Apache-2.0 */
/* test_pytorch.c - the PyTorch zip checkpoint reader: the ZIP directory reader,
 * the restricted unpickler, the tensor table, the public API on a real file,
 * and an allocation-failure loop. Archives and pickles are assembled here byte
 * by byte. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "format/format.h"
#include "format/pickle.h"
#include "format/zip.h"

static fy_err err;

/* ---- a pickle assembler ---- */

static uint8_t pb[1 << 21];
static size_t pn;

static void raw(const void *s, size_t n)
{
    memcpy(pb + pn, s, n);
    pn += n;
}
#define OPS(lit) raw(lit, sizeof(lit) - 1)
static void byte(int b)
{
    pb[pn++] = (uint8_t)b;
}
static void u32(uint32_t v)
{
    for (int i = 0; i < 4; i++) byte((int)(v >> (8 * i)) & 0xFF);
}
static void ustr(const char *s)
{
    byte('X');
    u32((uint32_t)strlen(s));
    raw(s, strlen(s));
}
static void int1(int v)
{
    byte('K'), byte(v);
}
static void glob(const char *m, const char *n)
{
    byte('c');
    raw(m, strlen(m));
    byte('\n');
    raw(n, strlen(n));
    byte('\n');
}
static void begin(int proto)
{
    pn = 0, byte(0x80), byte(proto);
}
static void stop(void)
{
    byte('.');
}
static void tuple_of(const int *v, int n)
{
    byte('(');
    for (int i = 0; i < n; i++) int1(v[i]);
    byte('t');
}
/* _rebuild_tensor_v2(('storage', torch.<type>, key, 'cpu', numel), off, shape, stride, False, OrderedDict()) */
static void tensor(const char *type, const char *key, int numel, int off, const int *shape, const int *stride,
                   int ndim)
{
    glob("torch._utils", "_rebuild_tensor_v2");
    byte('(');
    byte('(');
    ustr("storage");
    glob(strcmp(type, "UntypedStorage") ? "torch" : "torch.storage", type);
    ustr(key);
    ustr("cpu");
    int1(numel);
    OPS("tQ");
    int1(off);
    tuple_of(shape, ndim);
    tuple_of(stride, ndim);
    byte(0x89);
    glob("collections", "OrderedDict");
    OPS(")R");
    OPS("tR");
}

/* ---- a zip assembler ---- */

typedef struct ent {
    const char *name;
    const void *data;
    size_t n;
    uint16_t method;
    size_t pad;   /* local extra field bytes (the central one is empty) */
    uint32_t hdr; /* filled in */
    uint64_t data_at;
} ent;

static uint8_t zb[1 << 22];
static size_t zn;

static void z8(int v)
{
    zb[zn++] = (uint8_t)v;
}
static void z16(uint32_t v)
{
    z8(v & 0xFF), z8((v >> 8) & 0xFF);
}
static void z32(uint32_t v)
{
    z16(v & 0xFFFF), z16(v >> 16);
}
static void z64(uint64_t v)
{
    z32((uint32_t)v), z32((uint32_t)(v >> 32));
}
static void zraw(const void *p, size_t n)
{
    memcpy(zb + zn, p, n), zn += n;
}

/* zip64: add the zip64 end record and locator; z64x: sizes and offsets in zip64 extra fields. */
static size_t mkzip(ent *e, int ne, int zip64, int z64x, const char *comment)
{
    zn = 0;
    for (int i = 0; i < ne; i++) {
        e[i].hdr = (uint32_t)zn;
        z32(0x04034b50), z16(20), z16(0x0800), z16(e[i].method), z16(0), z16(0), z32(0);
        z32((uint32_t)e[i].n), z32((uint32_t)e[i].n), z16((uint32_t)strlen(e[i].name)),
            z16((uint32_t)e[i].pad);
        zraw(e[i].name, strlen(e[i].name));
        memset(zb + zn, 'Z', e[i].pad), zn += e[i].pad;
        e[i].data_at = zn;
        zraw(e[i].data, e[i].n);
    }
    size_t cd = zn;
    for (int i = 0; i < ne; i++) {
        z32(0x02014b50), z16(20), z16(20), z16(0x0800), z16(e[i].method), z16(0), z16(0), z32(0);
        uint32_t sat = z64x ? 0xFFFFFFFFu : 0;
        z32(sat ? sat : (uint32_t)e[i].n), z32(sat ? sat : (uint32_t)e[i].n);
        z16((uint32_t)strlen(e[i].name)), z16(z64x ? 28 : 0), z16(0), z16(0), z16(0), z32(0);
        z32(sat ? sat : e[i].hdr);
        zraw(e[i].name, strlen(e[i].name));
        if (z64x) z16(1), z16(24), z64(e[i].n), z64(e[i].n), z64(e[i].hdr);
    }
    size_t cdsize = zn - cd;
    if (zip64) {
        size_t rec = zn;
        z32(0x06064b50), z64(44), z16(45), z16(45), z32(0), z32(0), z64((uint64_t)ne), z64((uint64_t)ne);
        z64(cdsize), z64(cd);
        z32(0x07064b50), z32(0), z64(rec), z32(1);
    }
    size_t cl = comment ? strlen(comment) : 0;
    z32(0x06054b50), z16(0), z16(0), z16((uint32_t)ne), z16((uint32_t)ne), z32((uint32_t)cdsize),
        z32((uint32_t)cd);
    z16((uint32_t)cl);
    if (cl) zraw(comment, cl);
    return zn;
}

static int parse(fy_table *tb)
{
    fy_table_init(tb, fy_default_allocator());
    err.msg[0] = 0;
    return fy_pt_parse("m.pt", zb, zn, tb, &err);
}

static void expect_fail(int code, const char *sub)
{
    fy_table tb;
    int rc = parse(&tb);
    CHECK_EQ(rc, code);
    if (code == 0) {
        if (rc) fprintf(stderr, "unexpected failure: %s\n", err.msg);
        fy_table_free(&tb);
        return;
    }
    CHECK_STR_HAS(err.msg, sub);
    CHECK_STR_HAS(err.msg, "m.pt: ");
    CHECK(strchr(err.msg, '\n') == NULL);
    CHECK_EQ(tb.n, 0);
    fy_table_free(&tb);
}

static const fy_tensor *find(const fy_table *tb, const char *name)
{
    for (int64_t i = 0; i < tb->n; i++)
        if (strcmp(tb->t[i].name, name) == 0) return &tb->t[i];
    return NULL;
}

/* A small state dict: w [2,3] F32 on storage 0, wt = w.t(), b [3] F16 at offset 1
 * of storage 1 (4 elements), e empty; in a Lightning-like tree. */
static uint8_t s0[24], s1[8];
static void build_valid(int proto, int zip64, int z64x, size_t pad)
{
    begin(proto);
    OPS("}(");
    ustr("epoch");
    int1(3);
    ustr("state_dict");
    glob("collections", "OrderedDict");
    OPS(")Rq\x01(");
    ustr("w");
    tensor("FloatStorage", "0", 6, 0, (int[]){2, 3}, (int[]){3, 1}, 2);
    OPS("q\x02");
    ustr("wt");
    tensor("FloatStorage", "0", 6, 0, (int[]){3, 2}, (int[]){1, 3}, 2);
    ustr("b");
    tensor("HalfStorage", "1", 4, 1, (int[]){3}, (int[]){1}, 1);
    ustr("e");
    tensor("HalfStorage", "1", 4, 4, (int[]){0}, (int[]){1}, 1);
    OPS("u");
    OPS("}");
    ustr("_metadata");
    OPS("}s");
    OPS("b"); /* BUILD: the state dict's attributes */
    ustr("list");
    OPS("](h\x02G?\xf0\x00\x00\x00\x00\x00\x00Ne");
    OPS("u");
    stop();
    for (int i = 0; i < 24; i++) s0[i] = (uint8_t)i;
    for (int i = 0; i < 8; i++) s1[i] = (uint8_t)(100 + i);
    ent e[] = {{"arch/data.pkl", pb, pn, 0, pad, 0, 0},
               {"arch/byteorder", "little", 6, 0, 0, 0, 0},
               {"arch/data/0", s0, 24, 0, pad ? 64 : 0, 0, 0},
               {"arch/data/1", s1, 8, 0, 3, 0, 0},
               {"arch/version", "3\n", 2, 0, 0, 0, 0}};
    mkzip(e, 5, zip64, z64x, NULL);
}

static void test_valid(void)
{
    const int configs[][4] = {{2, 1, 0, 16}, {2, 0, 0, 0}, {2, 1, 1, 40}, {3, 0, 1, 0}};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        build_valid(configs[c][0], configs[c][1], configs[c][2], (size_t)configs[c][3]);
        /* where the storages ended up */
        uint64_t d0 = 0, d1 = 0;
        fy_zip z;
        CHECK_EQ(fy_zip_open("m.pt", zb, zn, fy_default_allocator(), &z, &err), 0);
        int64_t i0 = fy_zip_find(&z, "arch/data/0", 11), i1 = fy_zip_find(&z, "arch/data/1", 11);
        CHECK(i0 >= 0 && i1 >= 0);
        CHECK_EQ(fy_zip_find(&z, "arch/data/2", 11), -1);
        CHECK_EQ(fy_zip_find(&z, "arch/data", 9), -1);
        if (i0 >= 0 && i1 >= 0) d0 = z.e[i0].data, d1 = z.e[i1].data;
        CHECK_EQ(z.zip64, configs[c][1]);
        CHECK_EQ(memcmp(zb + d0, s0, 24), 0);
        fy_zip_free(&z);

        fy_table tb;
        int rc = parse(&tb);
        CHECK_EQ(rc, 0);
        if (rc) fprintf(stderr, "config %zu: %s\n", c, err.msg);
        CHECK_EQ(tb.n, 5);
        const fy_tensor *w = find(&tb, "state_dict.w"), *wt = find(&tb, "state_dict.wt"),
                        *b = find(&tb, "state_dict.b"), *e = find(&tb, "state_dict.e"),
                        *l0 = find(&tb, "list.0");
        CHECK(w && wt && b && e && l0);
        if (w && wt && b && e && l0) {
            CHECK_EQ(w->dtype, FERRY_DTYPE_F32);
            CHECK_EQ(w->ndim, 2);
            CHECK_EQ(w->shape[0], 2);
            CHECK_EQ(w->shape[1], 3);
            CHECK(w->strides == NULL);
            CHECK_EQ(w->nbytes, 24);
            CHECK_EQ(w->offset, d0);
            CHECK_EQ(w->flags, FERRY_TENSOR_SHARED_STORAGE);
            CHECK(wt->strides != NULL);
            if (wt->strides) CHECK(wt->strides[0] == 1 && wt->strides[1] == 3);
            CHECK_EQ(wt->flags, FERRY_TENSOR_NONCONTIGUOUS | FERRY_TENSOR_SHARED_STORAGE);
            CHECK_EQ(wt->nbytes, 24); /* 1 + 2*1 + 1*3 = 6 elements */
            CHECK_EQ(b->dtype, FERRY_DTYPE_F16);
            CHECK_EQ(b->offset, d1 + 2);
            CHECK_EQ(b->nbytes, 6);
            CHECK_EQ(e->nbytes, 0);
            CHECK_EQ(e->offset, d1 + 8);
            CHECK_EQ(l0->offset, d0); /* the memoized w, under a second name */
            CHECK_EQ(l0->nbytes, 24);
            /* file order: by offset, then the order the pickle named them */
            for (int64_t i = 1; i < tb.n; i++) CHECK(tb.t[i - 1].offset <= tb.t[i].offset);
            CHECK(strcmp(tb.t[0].name, "state_dict.w") == 0);
            CHECK(strcmp(tb.t[1].name, "state_dict.wt") == 0);
            CHECK(strcmp(tb.t[2].name, "list.0") == 0);
        }
        fy_table_free(&tb);
    }
}

/* Protocol 4: FRAME, SHORT_BINUNICODE, STACK_GLOBAL, MEMOIZE; v3 over an
 * UntypedStorage; a bare tensor at the top is named "". */
static void test_protocol4_v3(void)
{
    uint8_t d[16];
    for (int i = 0; i < 16; i++) d[i] = (uint8_t)i;
    begin(4);
    OPS("\x95\x00\x00\x00\x00\x00\x00\x00\x00"); /* FRAME (its length is not checked against opcodes) */
    OPS("\x8c\x0ctorch._utils\x94\x8c\x12_rebuild_tensor_v3\x94\x93\x94(");
    OPS("(\x8c\x07storage\x94\x8c\x0dtorch.storage\x8c\x0eUntypedStorage\x93\x8c\x01"
        "0\x8c\x03"
        "cpuK\x10tQ");
    OPS("K\x01K\x03\x85K\x02\x85\x89\x8c\x0b"
        "collections\x8c\x0bOrderedDict\x93)R");
    OPS("\x8c\x05torch\x8c\x06uint16\x93tR");
    stop();
    pb[3] = (uint8_t)(pn - 11); /* the frame holds the rest */
    ent e[] = {{"a/data.pkl", pb, pn, 0, 0, 0, 0}, {"a/data/0", d, 16, 0, 0, 0, 0}};
    mkzip(e, 2, 1, 0, "comment PK\x05\x06 inside");
    fy_table tb;
    int rc = parse(&tb);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CHECK_EQ(tb.n, 1);
    if (tb.n == 1) {
        CHECK(strcmp(tb.t[0].name, "") == 0);
        CHECK_EQ(tb.t[0].dtype, FERRY_DTYPE_U16);
        CHECK_EQ(tb.t[0].ndim, 1);
        CHECK_EQ(tb.t[0].nbytes, 10);   /* 1 + 2 x 2 elements of 2 bytes */
        CHECK(tb.t[0].strides != NULL); /* stride 2 */
        CHECK_EQ(tb.t[0].offset, e[1].data_at + 2);
    }
    fy_table_free(&tb);
}

/* One hostile or broken data.pkl, inside an otherwise good archive. */
static void bad_pickle(int code, const char *sub)
{
    static uint8_t d[64];
    ent e[] = {{"a/data.pkl", pb, pn, 0, 0, 0, 0}, {"a/data/0", d, 24, 0, 0, 0, 0}};
    mkzip(e, 2, 0, 0, NULL);
    expect_fail(code, sub);
}

static void test_pickles(void)
{
    begin(2), glob("os", "system"), ustr("touch MARKER"), OPS("\x85R"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "refuses global 'os.system'");
    begin(2), OPS("}("), ustr("x"), glob("builtins", "eval"), ustr("1"), OPS("\x85Ru"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "refuses global 'builtins.eval'");
    begin(4), OPS("\x8c\x02os\x8c\x06system\x93"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "refuses global 'os.system'");
    begin(2), glob("evil\x1b[2J", "x'y"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "refuses global 'evil\\x1b[2J.x\\x27y'");
    begin(2), OPS("(X\x02\x00\x00\x00id"), OPS("ios\nsystem\n"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "refuses global 'os.system'");
    begin(2), OPS("\xff"), stop();
    bad_pickle(FERRY_E_CORRUPT, "offset 2: unknown opcode 0xff");
    begin(2), OPS("K\x01\x86"), stop();
    bad_pickle(FERRY_E_CORRUPT, "(TUPLE2): stack underflow");
    begin(2), OPS("]h\x05"), stop();
    bad_pickle(FERRY_E_CORRUPT, "memo index 5 was never stored");
    begin(2), OPS("]r\xff\xff\xff\xff"), stop();
    bad_pickle(FERRY_E_CORRUPT, "memo index 4294967295 is out of range");
    begin(2),
        OPS("]q\x00h\x00"
            "a"),
        stop();
    bad_pickle(FERRY_E_CORRUPT, "a container holds itself");
    begin(2);
    for (int i = 0; i < 257; i++) byte(']');
    for (int i = 0; i < 256; i++) byte('a');
    stop();
    bad_pickle(FERRY_E_LIMIT, "nest deeper than 256 levels");
    begin(2);
    for (int i = 0; i < 256; i++) byte(']');
    for (int i = 0; i < 255; i++) byte('a');
    stop();
    bad_pickle(0, ""); /* 256 levels: fine (no tensors) */
    begin(2);
    for (unsigned i = 0; i <= FY_PK_MAX_STACK; i++) byte('N');
    bad_pickle(FERRY_E_LIMIT, "the stack grows past");
    begin(2);
    for (unsigned i = 0; i <= FY_PK_MAX_MARKS; i++) byte('(');
    bad_pickle(FERRY_E_LIMIT, "MARKs open at once");
    begin(2), OPS("}"), stop(), OPS("x");
    bad_pickle(FERRY_E_CORRUPT, "1 bytes follow STOP");
    begin(2), OPS("}");
    bad_pickle(FERRY_E_CORRUPT, "ends without STOP");
    begin(1), OPS("}"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "pickle protocol 1");
    begin(2), OPS("}}"), stop();
    bad_pickle(FERRY_E_CORRUPT, "STOP with 2 values");
    begin(2), OPS("\x80\x02}"), stop();
    bad_pickle(FERRY_E_CORRUPT, "PROTO after the start");
    begin(2),
        OPS("X\x10\x00\x00\x00"
            "ab"),
        stop();
    bad_pickle(FERRY_E_CORRUPT, "runs past the end of the pickle");
    begin(2), OPS("\x8b\xff\xff\xff\xff"), stop();
    bad_pickle(FERRY_E_CORRUPT, "negative length");
    begin(2), OPS("N\x81"), stop();
    bad_pickle(FERRY_E_CORRUPT, "stack underflow");
    begin(2), glob("torch", "FloatStorage"), OPS(")\x81"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "NEWOBJ of torch.FloatStorage");
    begin(2), glob("collections", "OrderedDict"), OPS(")\x81"), stop();
    bad_pickle(0, ""); /* OrderedDict.__new__(OrderedDict): an empty dict */
    begin(2), OPS("]}b"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "sets the state of a list");
    begin(2), OPS("K\x01)R"), stop();
    bad_pickle(FERRY_E_CORRUPT, "calls an int, not a global");
    begin(2), glob("collections", "OrderedDict"), OPS("K\x01R"), stop();
    bad_pickle(FERRY_E_CORRUPT, "are an int, not a tuple");
    begin(2),
        OPS("}K\x01"
            "a"),
        stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "appends to a dict, not a list");
    begin(2), OPS("](K\x01K\x02u"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "adds items to a list, not a dict");
    begin(2), OPS("}(K\x01u"), stop();
    bad_pickle(FERRY_E_CORRUPT, "an odd number of values (1)");
    begin(2),
        OPS("(K\x01"
            "d"),
        stop();
    bad_pickle(FERRY_E_CORRUPT, "an odd number of values (1)");
    begin(2),
        OPS("(}K\x01K\x02"
            "d"),
        stop();
    bad_pickle(FERRY_E_CORRUPT, "an odd number of values (3)");
    begin(2), OPS("}("), ustr("a"), OPS("(K\x01K\x02l"), OPS("u"), stop();
    bad_pickle(0, ""); /* LIST, DICT (protocol 1 forms) work */
    begin(2), OPS("(X\x07\x00\x00\x00storageK\x01tQ"), stop();
    bad_pickle(FERRY_E_CORRUPT, "has 2 fields, not 5");
    begin(2), OPS("K\x01Q"), stop();
    bad_pickle(FERRY_E_CORRUPT, "persistent id is an int, not a tuple");
    begin(2), OPS("(X\x07\x00\x00\x00storage"), glob("torch", "FloatStorage"), OPS("X\x00\x00\x00\x00"),
        ustr("cpu"), int1(1), OPS("tQ"), stop();
    bad_pickle(FERRY_E_CORRUPT, "storage key '' is not a plain name");
    begin(2), OPS("(X\x07\x00\x00\x00storage"), glob("torch", "FloatStorage"), ustr("0"), ustr("cpu"),
        OPS("J\xff\xff\xff\xfftQ"), stop();
    bad_pickle(FERRY_E_CORRUPT, "the storage size is -1, negative");
    /* tensors */
    begin(2), OPS("}("), ustr("t"), tensor("FloatStorage", "0", 6, 0, (int[]){2, 3}, (int[]){3, 1}, 2),
        OPS("u"), stop();
    bad_pickle(0, "");
    begin(2), OPS("}("), ustr("t"), tensor("FloatStorage", "0", 6, 1, (int[]){2, 3}, (int[]){3, 1}, 2),
        OPS("u"), stop();
    bad_pickle(FERRY_E_CORRUPT, "ends at byte 28 of storage '0', which holds 24 bytes");
    begin(2), OPS("}("), ustr("t"), tensor("FloatStorage", "0", 7, 0, (int[]){2, 3}, (int[]){3, 1}, 2),
        OPS("u"), stop();
    bad_pickle(FERRY_E_CORRUPT, "holds 24 bytes, but its persistent id says 7 elements");
    begin(2), OPS("}("), ustr("t"), tensor("FloatStorage", "9", 6, 0, (int[]){2, 3}, (int[]){3, 1}, 2),
        OPS("u"), stop();
    bad_pickle(FERRY_E_CORRUPT, "storage '9' is not in the archive (no entry 'a/data/9')");
    begin(2), OPS("}("), ustr("t"), tensor("ComplexDoubleStorage", "0", 1, 0, (int[]){1}, (int[]){1}, 1),
        OPS("u"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "ComplexDoubleStorage (complex128) has no ferry equivalent");
    begin(2), OPS("}("), ustr("a.b"), tensor("FloatStorage", "0", 6, 0, (int[]){6}, (int[]){1}, 1), ustr("a"),
        OPS("}("), ustr("b"), tensor("FloatStorage", "0", 6, 0, (int[]){6}, (int[]){1}, 1), OPS("uu"), stop();
    bad_pickle(FERRY_E_CORRUPT, "two tensors are named 'a.b'");
    begin(2), OPS("}(N"), tensor("FloatStorage", "0", 6, 0, (int[]){6}, (int[]){1}, 1), OPS("u"), stop();
    bad_pickle(FERRY_E_UNSUPPORTED, "a tensor under a dict key that is None in the top-level dict");
    begin(2), OPS("}(N}K\x01K\x02su"), stop();
    bad_pickle(0, ""); /* a None key without tensors below: skipped */
    begin(2), OPS("}(K\x07"), tensor("FloatStorage", "0", 6, 0, (int[]){6}, (int[]){1}, 1), OPS("u"), stop();
    bad_pickle(0, ""); /* an int key names it "7" */
}

/* The table: names and geometry. */
static void test_geometry(void)
{
    static uint8_t d[64];
    begin(2);
    OPS("}(");
    ustr("expand"), tensor("FloatStorage", "0", 16, 2, (int[]){4, 3}, (int[]){0, 1}, 2);
    ustr("size1"), tensor("FloatStorage", "0", 16, 0, (int[]){3, 1}, (int[]){1, 9}, 2);
    ustr("scalar"), tensor("FloatStorage", "0", 16, 15, NULL, NULL, 0);
    ustr("empty.end"), tensor("FloatStorage", "0", 16, 16, (int[]){0, 5}, (int[]){5, 1}, 2);
    ustr("7"), OPS("}("), int1(5), tensor("FloatStorage", "0", 16, 0, (int[]){1}, (int[]){1}, 1), OPS("u");
    OPS("u");
    stop();
    ent e[] = {{"a/data.pkl", pb, pn, 0, 0, 0, 0}, {"a/data/0", d, 64, 0, 0, 0, 0}};
    mkzip(e, 2, 0, 0, NULL);
    fy_table tb;
    int rc = parse(&tb);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    const fy_tensor *ex = find(&tb, "expand"), *sz1 = find(&tb, "size1"), *sc = find(&tb, "scalar"),
                    *em = find(&tb, "empty.end"), *nested = find(&tb, "7.5");
    CHECK(ex && sz1 && sc && em && nested);
    if (ex && sz1 && sc && em && nested) {
        CHECK_EQ(ex->flags & FERRY_TENSOR_NONCONTIGUOUS, FERRY_TENSOR_NONCONTIGUOUS);
        CHECK_EQ(ex->nbytes, 12); /* 3 distinct elements */
        CHECK_EQ(ex->offset, e[1].data_at + 8);
        CHECK(sz1->strides == NULL); /* a size-1 dimension's stride does not matter */
        CHECK_EQ(sz1->nbytes, 12);
        CHECK_EQ(sc->ndim, 0);
        CHECK_EQ(sc->nbytes, 4);
        CHECK_EQ(sc->offset, e[1].data_at + 60);
        CHECK_EQ(em->nbytes, 0);
        CHECK(em->strides == NULL);
        CHECK_EQ(em->offset, e[1].data_at + 64);
        CHECK_EQ(nested->flags, FERRY_TENSOR_SHARED_STORAGE);
    }
    fy_table_free(&tb);
}

/* The archive. */
static void test_zip(void)
{
    static uint8_t d[24];
    begin(2), OPS("}("), ustr("t"), tensor("FloatStorage", "0", 6, 0, (int[]){6}, (int[]){1}, 1), OPS("u"),
        stop();
    ent e[] = {{"a/data.pkl", pb, pn, 0, 5, 0, 0}, {"a/data/0", d, 24, 0, 0, 0, 0}};
    size_t n = mkzip(e, 2, 1, 0, NULL);
    fy_table tb;
    CHECK_EQ(parse(&tb), 0);
    fy_table_free(&tb);
    size_t cd = e[1].data_at + 24;

#define PATCH32(at, v)                                                                                 \
    (zb[(at)] = (uint8_t)(v), zb[(at) + 1] = (uint8_t)((v) >> 8), zb[(at) + 2] = (uint8_t)((v) >> 16), \
     zb[(at) + 3] = (uint8_t)((v) >> 24))
    /* compressed */
    e[1].method = 8;
    mkzip(e, 2, 1, 0, NULL);
    expect_fail(FERRY_E_UNSUPPORTED, "zip entry 'a/data/0' is compressed (method 8, deflate)");
    e[1].method = 0;
    e[0].method = 12;
    mkzip(e, 2, 1, 0, NULL);
    expect_fail(FERRY_E_UNSUPPORTED, "zip entry 'a/data.pkl' is compressed (method 12, bzip2)");
    e[0].method = 0;
    /* truncated anywhere: no end record, or a broken directory */
    for (size_t cut = 0; cut < n; cut += 7) {
        mkzip(e, 2, 1, 0, NULL);
        zn = cut;
        fy_table t2;
        int rc = parse(&t2);
        CHECK(rc == FERRY_E_CORRUPT);
        CHECK_EQ(t2.n, 0);
        fy_table_free(&t2);
    }
    /* a local header whose name differs */
    mkzip(e, 2, 1, 0, NULL);
    zb[e[1].hdr + 30 + 7] = '1';
    expect_fail(FERRY_E_CORRUPT, "zip entry 'a/data/0': its local header at");
    /* the central offset points at the other entry */
    mkzip(e, 2, 1, 0, NULL);
    PATCH32(cd + 46 + 10 + 42, e[0].hdr);
    expect_fail(FERRY_E_CORRUPT, "names 'a/data.pkl'");
    /* zip64 extra fields */
    mkzip(e, 2, 1, 1, NULL);
    CHECK_EQ(parse(&tb), 0);
    fy_table_free(&tb);
    mkzip(e, 2, 0, 1, NULL);
    zb[cd + 46 + 10 + 2] = 16; /* first entry's zip64 block: 16 of the 24 bytes needed */
    expect_fail(FERRY_E_CORRUPT, "zip64 extra field holds 16 bytes");
    mkzip(e, 2, 0, 1, NULL);
    zb[cd + 46 + 10] = 9; /* not a zip64 block */
    expect_fail(FERRY_E_CORRUPT, "there is no zip64 extra field");
    mkzip(e, 2, 0, 1, NULL);
    zb[cd + 46 + 10 + 2] = 200; /* a block longer than the extra field */
    expect_fail(FERRY_E_CORRUPT, "runs past the extra field");
    /* zip64 end record lies */
    mkzip(e, 2, 1, 0, NULL);
    zb[cd + 46 + 10 + 46 + 8 + 32] = 3; /* entry count 3 */
    expect_fail(FERRY_E_CORRUPT, "zip64 end record says entry count 3, the end record says 2");
    /* the end record's comment length must reach the end exactly */
    mkzip(e, 2, 0, 0, "abc");
    zb[zn - 5] = 4;
    expect_fail(FERRY_E_CORRUPT, "no zip end of central directory record");
    /* no entries at all */
    mkzip(e, 0, 0, 0, NULL);
    expect_fail(FERRY_E_CORRUPT, "the zip archive is empty");
    /* a comment of 65535 bytes: the search reaches that far back */
    {
        static char big[65536];
        memset(big, 'c', 65535);
        mkzip(e, 2, 1, 0, big);
        CHECK_EQ(parse(&tb), 0);
        fy_table_free(&tb);
    }
}

/* Fail allocation N for N = 0, 1, ... until the parse succeeds: each failure
 * is -ENOMEM with nothing leaked (run under ASan) and an empty table. */
static long fail_at = -1, nallocs;
static void *fa_alloc(void *o, size_t n)
{
    (void)o;
    return nallocs++ == fail_at ? NULL : malloc(n);
}
static void *fa_realloc(void *o, void *p, size_t n)
{
    (void)o;
    return nallocs++ == fail_at ? NULL : realloc(p, n);
}
static void fa_free(void *o, void *p)
{
    (void)o;
    free(p);
}

static void test_alloc_faults(void)
{
    const ferry_allocator fa = {fa_alloc, fa_realloc, fa_free, NULL};
    build_valid(2, 1, 0, 16);
    int rounds = 0;
    for (fail_at = 0;; fail_at++, rounds++) {
        nallocs = 0;
        fy_table tb;
        fy_table_init(&tb, &fa);
        int rc = fy_pt_parse("m.pt", zb, zn, &tb, &err);
        if (rc == 0) {
            CHECK_EQ(tb.n, 5);
            fy_table_free(&tb);
            break;
        }
        CHECK_EQ(rc, -ENOMEM);
        CHECK_STR_HAS(err.msg, "out of memory");
        CHECK_EQ(tb.n, 0);
        fy_table_free(&tb);
        if (rounds > 10000) break;
    }
    CHECK(rounds > 10);
    fail_at = -1;
}

/* Through the public API, from a file. */
static void test_file(void)
{
    build_valid(2, 1, 0, 16);
    const char *tmpdir = getenv("TMPDIR");
    char full[512];
    snprintf(full, sizeof full, "%s/ferry_test_pt_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = mkstemp(full);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ(write(fd, zb, zn), (long long)zn);
    close(fd);
    ferry_ctx *ctx;
    ferry_file *f;
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    int rc = ferry_file_open(ctx, full, 0, &f);
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        CHECK_EQ(ferry_file_format(f), FERRY_FORMAT_PYTORCH);
        CHECK_EQ(ferry_file_tensor_count(f), 5);
        int64_t i = ferry_file_find(f, "state_dict.wt");
        CHECK(i >= 0);
        ferry_tensor_info ti = {.size = sizeof ti};
        CHECK_EQ(ferry_file_tensor_info(f, i, &ti), 0);
        CHECK(ti.strides != NULL && ti.strides[0] == 1 && ti.strides[1] == 3);
        CHECK_EQ(ti.flags, FERRY_TENSOR_NONCONTIGUOUS | FERRY_TENSOR_SHARED_STORAGE);
        uint8_t buf[24];
        CHECK_EQ(ferry_file_tensor_read(f, i, 0, buf, 24), 0);
        CHECK_EQ(memcmp(buf, s0, 24), 0);
        /* its elements in row-major order: wt[r][c] is storage element r + 3c */
        static const int order[6] = {0, 3, 1, 4, 2, 5};
        uint8_t want[24], got[24];
        for (int k = 0; k < 6; k++) memcpy(want + 4 * k, s0 + 4 * order[k], 4);
        CHECK_EQ(ferry_file_tensor_gathered_bytes(f, i), 24);
        CHECK_EQ(ferry_file_tensor_gather(f, i, 0, got, 24), 0);
        CHECK_EQ(memcmp(got, want, 24), 0);
        memset(got, 0xEE, sizeof got); /* a range that starts and ends inside elements */
        CHECK_EQ(ferry_file_tensor_gather(f, i, 2, got, 9), 0);
        CHECK_EQ(memcmp(got, want + 2, 9), 0);
        CHECK_EQ(got[9], 0xEE);
        CHECK_EQ(ferry_file_tensor_gather(f, i, 20, got, 5), FERRY_E_INVAL);
        /* hashed as those elements, as its converted copy is */
        uint64_t h[5];
        CHECK_EQ(ferry_file_hash(ctx, f, h, NULL, NULL, NULL), 0);
        CHECK_EQ(h[i], ferry_xxh3(want, 24));
        int64_t w = ferry_file_find(f, "state_dict.w");
        CHECK_EQ(ferry_file_tensor_gathered_bytes(f, w), 24);
        CHECK_EQ(ferry_file_tensor_gather(f, w, 4, got, 8), 0);
        CHECK_EQ(memcmp(got, s0 + 4, 8), 0);
        CHECK_EQ(h[w], ferry_xxh3(s0, 24));
        const void *p;
        CHECK_EQ(ferry_file_tensor_data(f, ferry_file_find(f, "state_dict.b"), &p), 0);
        CHECK_EQ(memcmp(p, s1 + 2, 6), 0);
        ferry_file_close(f);
    }
    /* the same file with a refused global: the message names it */
    begin(2), glob("posix", "system"), ustr("id"), OPS("\x85R"), stop();
    ent e[] = {{"x/data.pkl", pb, pn, 0, 0, 0, 0}};
    mkzip(e, 1, 0, 0, NULL);
    fd = open(full, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK_EQ(write(fd, zb, zn), (long long)zn);
        close(fd);
    }
    CHECK_EQ(ferry_file_open(ctx, full, 0, &f), FERRY_E_UNSUPPORTED);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "refuses global 'posix.system'");
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), full);
    unlink(full);
    ferry_ctx_free(ctx);
}

/* `test_pytorch CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)                         \
    CASE(valid, test_valid())               \
    CASE(protocol4_v3, test_protocol4_v3()) \
    CASE(pickles, test_pickles())           \
    CASE(geometry, test_geometry())         \
    CASE(zip, test_zip())                   \
    CASE(alloc_faults, test_alloc_faults()) \
    CASE(file, test_file())
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
