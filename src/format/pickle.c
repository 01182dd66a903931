/* SPDX-License-Identifier: Apache-2.0 */
/* pickle.c - a restricted unpickler for torch.save's data.pkl (see pickle.h).
 *
 * Written from the opcode descriptions in CPython's pickletools and PyTorch's
 * serialization notes. Values live in an arena of nodes addressed by index; the
 * stack, the memo and containers hold indices, so memo sharing and later
 * mutation (APPEND to a memoized list) behave as in Python. Globals are looked
 * up in a fixed table and become inert tokens: REDUCE on one of them is
 * interpreted here (OrderedDict(), the tensor rebuilders), never called.
 * Every size is bounded: the pickle's length, the stack, the open MARKs, the
 * memo (an index must be plausible for the opcodes read so far), the nesting
 * depth and the work of the final walk. */
#include "pickle.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_POP = '0',
    OP_POP_MARK = '1',
    OP_DUP = '2',
    OP_FLOAT = 'F',
    OP_INT = 'I',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_LONG = 'L',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_PERSID = 'P',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_STRING = 'S',
    OP_BINSTRING = 'T',
    OP_SHORT_BINSTRING = 'U',
    OP_UNICODE = 'V',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_BUILD = 'b',
    OP_GLOBAL = 'c',
    OP_DICT = 'd',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_GET = 'g',
    OP_BINGET = 'h',
    OP_INST = 'i',
    OP_LONG_BINGET = 'j',
    OP_LIST = 'l',
    OP_EMPTY_LIST = ']',
    OP_OBJ = 'o',
    OP_PUT = 'p',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_SETITEMS = 'u',
    OP_BINFLOAT = 'G',
    OP_BINBYTES = 'B',
    OP_SHORT_BINBYTES = 'C',
    OP_PROTO = 0x80,
    OP_NEWOBJ = 0x81,
    OP_EXT1 = 0x82,
    OP_EXT2 = 0x83,
    OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_BINBYTES8 = 0x8e,
    OP_EMPTY_SET = 0x8f,
    OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91,
    OP_NEWOBJ_EX = 0x92,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_BYTEARRAY8 = 0x96,
    OP_NEXT_BUFFER = 0x97,
    OP_READONLY_BUFFER = 0x98,
};

static const char *op_name(int op)
{
    switch (op) {
    case OP_MARK: return "MARK";
    case OP_STOP: return "STOP";
    case OP_POP: return "POP";
    case OP_POP_MARK: return "POP_MARK";
    case OP_DUP: return "DUP";
    case OP_FLOAT: return "FLOAT";
    case OP_INT: return "INT";
    case OP_BININT: return "BININT";
    case OP_BININT1: return "BININT1";
    case OP_LONG: return "LONG";
    case OP_BININT2: return "BININT2";
    case OP_NONE: return "NONE";
    case OP_PERSID: return "PERSID";
    case OP_BINPERSID: return "BINPERSID";
    case OP_REDUCE: return "REDUCE";
    case OP_STRING: return "STRING";
    case OP_BINSTRING: return "BINSTRING";
    case OP_SHORT_BINSTRING: return "SHORT_BINSTRING";
    case OP_UNICODE: return "UNICODE";
    case OP_BINUNICODE: return "BINUNICODE";
    case OP_APPEND: return "APPEND";
    case OP_BUILD: return "BUILD";
    case OP_GLOBAL: return "GLOBAL";
    case OP_DICT: return "DICT";
    case OP_EMPTY_DICT: return "EMPTY_DICT";
    case OP_APPENDS: return "APPENDS";
    case OP_GET: return "GET";
    case OP_BINGET: return "BINGET";
    case OP_INST: return "INST";
    case OP_LONG_BINGET: return "LONG_BINGET";
    case OP_LIST: return "LIST";
    case OP_EMPTY_LIST: return "EMPTY_LIST";
    case OP_OBJ: return "OBJ";
    case OP_PUT: return "PUT";
    case OP_BINPUT: return "BINPUT";
    case OP_LONG_BINPUT: return "LONG_BINPUT";
    case OP_SETITEM: return "SETITEM";
    case OP_TUPLE: return "TUPLE";
    case OP_EMPTY_TUPLE: return "EMPTY_TUPLE";
    case OP_SETITEMS: return "SETITEMS";
    case OP_BINFLOAT: return "BINFLOAT";
    case OP_BINBYTES: return "BINBYTES";
    case OP_SHORT_BINBYTES: return "SHORT_BINBYTES";
    case OP_PROTO: return "PROTO";
    case OP_NEWOBJ: return "NEWOBJ";
    case OP_EXT1: return "EXT1";
    case OP_EXT2: return "EXT2";
    case OP_EXT4: return "EXT4";
    case OP_TUPLE1: return "TUPLE1";
    case OP_TUPLE2: return "TUPLE2";
    case OP_TUPLE3: return "TUPLE3";
    case OP_NEWTRUE: return "NEWTRUE";
    case OP_NEWFALSE: return "NEWFALSE";
    case OP_LONG1: return "LONG1";
    case OP_LONG4: return "LONG4";
    case OP_SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case OP_BINUNICODE8: return "BINUNICODE8";
    case OP_BINBYTES8: return "BINBYTES8";
    case OP_EMPTY_SET: return "EMPTY_SET";
    case OP_ADDITEMS: return "ADDITEMS";
    case OP_FROZENSET: return "FROZENSET";
    case OP_NEWOBJ_EX: return "NEWOBJ_EX";
    case OP_STACK_GLOBAL: return "STACK_GLOBAL";
    case OP_MEMOIZE: return "MEMOIZE";
    case OP_FRAME: return "FRAME";
    case OP_BYTEARRAY8: return "BYTEARRAY8";
    case OP_NEXT_BUFFER: return "NEXT_BUFFER";
    case OP_READONLY_BUFFER: return "READONLY_BUFFER";
    default: return NULL;
    }
}

/* ---- the allow-list ------------------------------------------------------ */

typedef enum gkind {
    G_ODICT,       /* collections.OrderedDict: OrderedDict() makes a dict */
    G_REBUILD_V1,  /* torch._utils._rebuild_tensor(storage, offset, size, stride) */
    G_REBUILD_V2,  /* ... _v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) */
    G_REBUILD_V3,  /* ... _v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]) */
    G_PARAM,       /* torch._utils._rebuild_parameter(tensor, requires_grad, hooks) */
    G_PARAM_STATE, /* ..._with_state(tensor, requires_grad, hooks, state) */
    G_STORAGE,     /* a storage class, named in persistent ids */
    G_DTYPE,       /* a torch dtype, named as _rebuild_tensor_v3's dtype */
} gkind;

typedef struct allowed {
    const char *mod, *name;
    gkind kind;
    ferry_dtype dt;    /* G_STORAGE, G_DTYPE: FERRY_DTYPE_INVALID = known, but no ferry equivalent */
    const char *torch; /* G_STORAGE: torch's dtype name, for messages */
} allowed;

/* torch.save (1.6 to 2.x) names these and nothing else for tensors in
 * containers. Typed storages carry the dtype; since 2.x, dtypes without a
 * legacy storage class (uint16/32/64, float8) come as an UntypedStorage whose
 * size counts bytes plus a dtype global passed to _rebuild_tensor_v3. */
static const allowed ALLOWED[] = {
    {"collections", "OrderedDict", G_ODICT, 0, NULL},
    {"torch._utils", "_rebuild_tensor", G_REBUILD_V1, 0, NULL},
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_V2, 0, NULL},
    {"torch._utils", "_rebuild_tensor_v3", G_REBUILD_V3, 0, NULL},
    {"torch._utils", "_rebuild_parameter", G_PARAM, 0, NULL},
    {"torch._utils", "_rebuild_parameter_with_state", G_PARAM_STATE, 0, NULL},
    {"torch", "FloatStorage", G_STORAGE, FERRY_DTYPE_F32, "float32"},
    {"torch", "DoubleStorage", G_STORAGE, FERRY_DTYPE_F64, "float64"},
    {"torch", "HalfStorage", G_STORAGE, FERRY_DTYPE_F16, "float16"},
    {"torch", "BFloat16Storage", G_STORAGE, FERRY_DTYPE_BF16, "bfloat16"},
    {"torch", "LongStorage", G_STORAGE, FERRY_DTYPE_I64, "int64"},
    {"torch", "IntStorage", G_STORAGE, FERRY_DTYPE_I32, "int32"},
    {"torch", "ShortStorage", G_STORAGE, FERRY_DTYPE_I16, "int16"},
    {"torch", "CharStorage", G_STORAGE, FERRY_DTYPE_I8, "int8"},
    {"torch", "ByteStorage", G_STORAGE, FERRY_DTYPE_U8, "uint8"},
    {"torch", "BoolStorage", G_STORAGE, FERRY_DTYPE_BOOL, "bool"},
    {"torch", "ComplexFloatStorage", G_STORAGE, FERRY_DTYPE_C64, "complex64"},
    {"torch", "ComplexDoubleStorage", G_STORAGE, FERRY_DTYPE_INVALID, "complex128"},
    {"torch", "UntypedStorage", G_STORAGE, FERRY_DTYPE_U8, NULL},
    {"torch.storage", "UntypedStorage", G_STORAGE, FERRY_DTYPE_U8, NULL},
    {"torch", "float32", G_DTYPE, FERRY_DTYPE_F32, NULL},
    {"torch", "float64", G_DTYPE, FERRY_DTYPE_F64, NULL},
    {"torch", "float16", G_DTYPE, FERRY_DTYPE_F16, NULL},
    {"torch", "bfloat16", G_DTYPE, FERRY_DTYPE_BF16, NULL},
    {"torch", "int64", G_DTYPE, FERRY_DTYPE_I64, NULL},
    {"torch", "int32", G_DTYPE, FERRY_DTYPE_I32, NULL},
    {"torch", "int16", G_DTYPE, FERRY_DTYPE_I16, NULL},
    {"torch", "int8", G_DTYPE, FERRY_DTYPE_I8, NULL},
    {"torch", "uint8", G_DTYPE, FERRY_DTYPE_U8, NULL},
    {"torch", "uint16", G_DTYPE, FERRY_DTYPE_U16, NULL},
    {"torch", "uint32", G_DTYPE, FERRY_DTYPE_U32, NULL},
    {"torch", "uint64", G_DTYPE, FERRY_DTYPE_U64, NULL},
    {"torch", "bool", G_DTYPE, FERRY_DTYPE_BOOL, NULL},
    {"torch", "complex64", G_DTYPE, FERRY_DTYPE_C64, NULL},
    {"torch", "float8_e4m3fn", G_DTYPE, FERRY_DTYPE_F8_E4M3, NULL},
    {"torch", "float8_e5m2", G_DTYPE, FERRY_DTYPE_F8_E5M2, NULL},
    {"torch", "float8_e4m3fnuz", G_DTYPE, FERRY_DTYPE_F8_E4M3FNUZ, NULL},
    {"torch", "float8_e5m2fnuz", G_DTYPE, FERRY_DTYPE_F8_E5M2FNUZ, NULL},
    {"torch", "float8_e8m0fnu", G_DTYPE, FERRY_DTYPE_F8_E8M0, NULL},
    {"torch", "complex128", G_DTYPE, FERRY_DTYPE_INVALID, NULL},
    {"torch", "complex32", G_DTYPE, FERRY_DTYPE_INVALID, NULL},
    {"torch", "float4_e2m1fn_x2", G_DTYPE, FERRY_DTYPE_INVALID, NULL},
};
#define NALLOWED (sizeof ALLOWED / sizeof ALLOWED[0])

static bool eq(const char *s, const uint8_t *p, size_t n)
{
    return strlen(s) == n && memcmp(s, p, n) == 0;
}

static int find_allowed(const uint8_t *mod, size_t mlen, const uint8_t *name, size_t nlen)
{
    for (size_t i = 0; i < NALLOWED; i++)
        if (eq(ALLOWED[i].mod, mod, mlen) && eq(ALLOWED[i].name, name, nlen)) return (int)i;
    return -1;
}

/* ---- values ---------------------------------------------------------------- */

enum {
    K_NONE,
    K_BOOL,
    K_INT,
    K_BIGINT,
    K_FLOAT,
    K_STR,
    K_BYTES,
    K_TUPLE,
    K_LIST,
    K_DICT,
    K_GLOBAL,
    K_STORAGE,
    K_TENSOR
};

static const char *kind_name(int k)
{
    static const char *const names[] = {"None",    "a bool", "an int",   "an int beyond 64 bits",
                                        "a float", "a str",  "bytes",    "a tuple",
                                        "a list",  "a dict", "a global", "a storage",
                                        "a tensor"};
    return names[k];
}

typedef struct node {
    uint8_t kind;
    uint8_t onpath;  /* the walk is inside this container */
    uint32_t n, cap; /* containers: kids (dicts: key, value, key, value, ...) */
    union {
        int64_t i; /* K_INT, K_BOOL */
        double f;
        struct {
            uint32_t off, len;
        } s; /* K_STR, K_BYTES: bytes of the pickle */
        uint32_t *kids;
        int64_t idx; /* K_GLOBAL: ALLOWED[]; K_STORAGE: storage; K_TENSOR: view */
    } u;
} node;

#define NO_VALUE UINT32_MAX

typedef struct pk {
    const char *where;
    const uint8_t *p;
    size_t n, pos, op_at;
    int op;
    uint64_t nops;
    bool walking;
    const ferry_allocator *mem;
    fy_err *err;
    fy_pk_result *r;
    node *nodes;
    uint32_t nnodes, node_cap;
    uint32_t *stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, mark_cap;
    uint32_t *memo;
    size_t memo_cap, memo_count;
    /* the walk */
    char *path;
    size_t plen, path_cap;
    uint64_t work, work_max, name_bytes, name_max;
} pk;

static int fail(pk *k, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(pk *k, int code, const char *fmt, ...)
{
    char msg[FY_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code == -ENOMEM) return fy_seterr(k->err, code, "%s: out of memory", k->where);
    if (k->walking) return fy_seterr(k->err, code, "%s: %s", k->where, msg);
    const char *on = op_name(k->op);
    if (on) return fy_seterr(k->err, code, "%s: offset %zu (%s): %s", k->where, k->op_at, on, msg);
    return fy_seterr(k->err, code, "%s: offset %zu: %s", k->where, k->op_at, msg);
}

static int oom(pk *k)
{
    return fail(k, -ENOMEM, "out of memory for the unpickler's stack or memo");
}

/* Grow *arr (of *cap elements of size sz) to hold at least need elements. */
static int grow(pk *k, void **arr, size_t *cap, size_t need, size_t sz, size_t first)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2 / sz) return oom(k);
        c *= 2;
    }
    void *a = fy_realloc(k->mem, *arr, c * sz);
    if (!a) return oom(k);
    *arr = a;
    *cap = c;
    return 0;
}

static int new_node(pk *k, int kind, uint32_t *id)
{
    if (k->nnodes == k->node_cap) {
        size_t cap = k->node_cap;
        if (k->nnodes >= UINT32_MAX - 1) return fail(k, FERRY_E_LIMIT, "more than 2^32 values");
        void *a = k->nodes;
        FY_TRY(grow(k, &a, &cap, (size_t)k->nnodes + 1, sizeof(node), 256));
        k->nodes = a;
        k->node_cap = cap > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)cap;
    }
    node *v = &k->nodes[k->nnodes];
    memset(v, 0, sizeof *v);
    v->kind = (uint8_t)kind;
    *id = k->nnodes++;
    return 0;
}

static int add_kid(pk *k, uint32_t cont, uint32_t kid)
{
    node *c = &k->nodes[cont];
    if (c->n == c->cap) {
        if (c->cap >= UINT32_MAX / 2) return fail(k, FERRY_E_LIMIT, "a container with more than 2^31 items");
        size_t cap = c->cap;
        void *a = c->u.kids;
        FY_TRY(grow(k, &a, &cap, (size_t)c->n + 1, sizeof(uint32_t), 4));
        c->u.kids = a;
        c->cap = (uint32_t)cap;
    }
    c->u.kids[c->n++] = kid;
    return 0;
}

static int push(pk *k, uint32_t id)
{
    if (k->sp >= FY_PK_MAX_STACK)
        return fail(k, FERRY_E_LIMIT, "the stack grows past %u values (ferry's limit)", FY_PK_MAX_STACK);
    if (k->sp == k->stack_cap) {
        void *a = k->stack;
        FY_TRY(grow(k, &a, &k->stack_cap, k->sp + 1, sizeof(uint32_t), 64));
        k->stack = a;
    }
    k->stack[k->sp++] = id;
    return 0;
}

static int push_new(pk *k, int kind, uint32_t *id)
{
    uint32_t v = 0;
    FY_TRY(new_node(k, kind, &v));
    if (id) *id = v;
    return push(k, v);
}

static size_t fence(const pk *k)
{
    return k->nmarks ? k->marks[k->nmarks - 1] : 0;
}

/* At least cnt values above the innermost MARK. */
static int need(pk *k, size_t cnt)
{
    size_t have = k->sp - fence(k);
    if (have >= cnt) return 0;
    return fail(k, FERRY_E_CORRUPT, "stack underflow: needs %zu value%s, %zu on the stack%s", cnt,
                cnt == 1 ? "" : "s", have, k->nmarks ? " above the last MARK" : "");
}

/* Pop the innermost MARK: the values above it are stack[*base, sp). */
static int pop_mark(pk *k, size_t *base)
{
    if (!k->nmarks) return fail(k, FERRY_E_CORRUPT, "no MARK is open");
    *base = k->marks[--k->nmarks];
    return 0;
}

static int take(pk *k, uint64_t len, const uint8_t **out)
{
    if (len > k->n - k->pos)
        return fail(k, FERRY_E_CORRUPT,
                    "an operand of %" PRIu64 " bytes runs past the end of the pickle (%zu bytes left)", len,
                    k->n - k->pos);
    *out = k->p + k->pos;
    k->pos += (size_t)len;
    return 0;
}

static uint64_t le(const uint8_t *b, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static int push_int(pk *k, int64_t v)
{
    uint32_t id;
    FY_TRY(push_new(k, K_INT, &id));
    k->nodes[id].u.i = v;
    return 0;
}

/* LONG1 / LONG4: little-endian two's complement of n bytes. */
static int push_long(pk *k, const uint8_t *b, uint64_t n)
{
    if (n > 8) {
        /* Python writes the shortest form, but accept redundant sign bytes. */
        uint8_t ext = (b[7] & 0x80) ? 0xFF : 0x00;
        for (uint64_t i = 8; i < n; i++)
            if (b[i] != ext) return push_new(k, K_BIGINT, NULL);
        n = 8;
    }
    if (n == 0) return push_int(k, 0);
    uint64_t u = le(b, (int)n);
    if (n < 8 && (b[n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
    return push_int(k, (int64_t)u);
}

static int push_str(pk *k, int kind, const uint8_t *b, uint64_t len)
{
    uint32_t id;
    FY_TRY(push_new(k, kind, &id));
    k->nodes[id].u.s.off = (uint32_t)(b - k->p);
    k->nodes[id].u.s.len = (uint32_t)len;
    return 0;
}

/* A newline-terminated operand of GLOBAL / INST. */
static int line(pk *k, const uint8_t **s, size_t *len)
{
    const uint8_t *nl = memchr(k->p + k->pos, '\n', k->n - k->pos);
    if (!nl) return fail(k, FERRY_E_CORRUPT, "operand has no terminating newline");
    *s = k->p + k->pos;
    *len = (size_t)(nl - *s);
    k->pos += *len + 1;
    return 0;
}

static const char *qglobal(char *buf, size_t n, const uint8_t *mod, size_t mlen, const uint8_t *name,
                           size_t nlen)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%.*s.%.*s", (int)(mlen > 120 ? 120 : mlen), (const char *)mod,
             (int)(nlen > 120 ? 120 : nlen), (const char *)name);
    return fy_quote(buf, n, tmp);
}

/* Resolve a global against the allow-list, or refuse it by name. */
static int global(pk *k, const uint8_t *mod, size_t mlen, const uint8_t *name, size_t nlen, int *out)
{
    int g = find_allowed(mod, mlen, name, nlen);
    if (g < 0) {
        char q[200];
        return fail(
            k, FERRY_E_UNSUPPORTED,
            "ferry refuses global %s: only torch's tensor rebuilders, storage types, dtypes and "
            "collections.OrderedDict may appear in a checkpoint ferry reads (it never runs code from one)",
            qglobal(q, sizeof q, mod, mlen, name, nlen));
    }
    *out = g;
    return 0;
}

static int push_global(pk *k, int g)
{
    uint32_t id;
    FY_TRY(push_new(k, K_GLOBAL, &id));
    k->nodes[id].u.idx = g;
    return 0;
}

static const char *gname(char *buf, size_t n, int g)
{
    snprintf(buf, n, "%s.%s", ALLOWED[g].mod, ALLOWED[g].name);
    return buf;
}

/* ---- memo ------------------------------------------------------------------ */

static int memo_put(pk *k, uint64_t idx)
{
    FY_TRY(need(k, 1));
    /* The pickler numbers memo entries 0, 1, 2, ... as it goes: an index past
     * the number of opcodes read so far cannot come from it (and would make
     * the memo as large as the hostile index). */
    if (idx >= k->nops)
        return fail(k, FERRY_E_CORRUPT, "memo index %" PRIu64 " is out of range after %" PRIu64 " opcodes",
                    idx, k->nops);
    if (idx >= k->memo_cap) {
        size_t old = k->memo_cap;
        void *a = k->memo;
        FY_TRY(grow(k, &a, &k->memo_cap, (size_t)idx + 1, sizeof(uint32_t), 64));
        k->memo = a;
        for (size_t i = old; i < k->memo_cap; i++) k->memo[i] = NO_VALUE;
    }
    if (k->memo[idx] == NO_VALUE) k->memo_count++;
    k->memo[idx] = k->stack[k->sp - 1];
    return 0;
}

static int memo_get(pk *k, uint64_t idx)
{
    if (idx >= k->memo_cap || k->memo[idx] == NO_VALUE)
        return fail(k, FERRY_E_CORRUPT, "memo index %" PRIu64 " was never stored", idx);
    return push(k, k->memo[idx]);
}

/* ---- calls ----------------------------------------------------------------- */

static int get_int(pk *k, uint32_t id, const char *what, int64_t *out)
{
    const node *v = &k->nodes[id];
    if (v->kind == K_INT) {
        *out = v->u.i;
        return 0;
    }
    if (v->kind == K_BIGINT) return fail(k, FERRY_E_CORRUPT, "%s does not fit in 64 bits", what);
    return fail(k, FERRY_E_CORRUPT, "%s is %s, not an int", what, kind_name(v->kind));
}

static int get_nonneg(pk *k, uint32_t id, const char *what, int64_t *out)
{
    FY_TRY(get_int(k, id, what, out));
    if (*out < 0) return fail(k, FERRY_E_CORRUPT, "%s is %" PRId64 ", negative", what, *out);
    return 0;
}

/* A tuple of ndim non-negative ints (shape or stride). */
static int get_dims(pk *k, uint32_t id, const char *fn, const char *what, int64_t **out, int32_t *ndim)
{
    const node *v = &k->nodes[id];
    if (v->kind != K_TUPLE)
        return fail(k, FERRY_E_CORRUPT, "%s: %s is %s, not a tuple of ints", fn, what, kind_name(v->kind));
    if (v->n > FY_PK_MAX_NDIM)
        return fail(k, FERRY_E_CORRUPT, "%s: %s has %u dimensions (limit %d)", fn, what, v->n,
                    FY_PK_MAX_NDIM);
    if (*ndim >= 0 && (int32_t)v->n != *ndim)
        return fail(k, FERRY_E_CORRUPT, "%s: %s has %u entries for %d dimensions", fn, what, v->n, *ndim);
    *ndim = (int32_t)v->n;
    *out = NULL;
    if (!v->n) return 0;
    int64_t *a = fy_malloc(k->mem, v->n * sizeof(int64_t));
    if (!a) return oom(k);
    for (uint32_t i = 0; i < v->n; i++) {
        char w[64];
        snprintf(w, sizeof w, "%s[%u]", what, i);
        int rc = get_int(k, k->nodes[id].u.kids[i], w, &a[i]);
        if (rc == 0 && a[i] < 0)
            rc = fail(k, FERRY_E_CORRUPT,
                      "%s: %s is %" PRId64 ": ferry reads non-negative sizes and strides only", fn, w, a[i]);
        if (rc < 0) {
            fy_free(k->mem, a);
            return rc;
        }
    }
    *out = a;
    return 0;
}

/* _rebuild_tensor{,_v2,_v3}(...): a new view. */
static int rebuild(pk *k, int g, uint32_t args, uint32_t *res)
{
    char fn[96];
    gname(fn, sizeof fn, g);
    const node *a = &k->nodes[args];
    uint32_t lo = 4, hi = 4;
    if (ALLOWED[g].kind == G_REBUILD_V2) lo = 6, hi = 7;
    if (ALLOWED[g].kind == G_REBUILD_V3) lo = 7, hi = 8;
    if (a->n < lo || a->n > hi)
        return fail(k, FERRY_E_CORRUPT, "%s takes %u%s arguments, got %u", fn, lo, hi > lo ? " or more" : "",
                    a->n);
    const uint32_t *x = a->u.kids;
    const node *st = &k->nodes[x[0]];
    if (st->kind != K_STORAGE)
        return fail(k, FERRY_E_CORRUPT, "%s: the first argument is %s, not a storage (BINPERSID)", fn,
                    kind_name(st->kind));
    fy_pk_view v = {.storage = st->u.idx, .dtype = k->r->st[st->u.idx].dtype, .ndim = -1};
    int64_t off;
    FY_TRY(get_nonneg(k, x[1], "the storage offset", &off));
    v.offset = (uint64_t)off;
    if (ALLOWED[g].kind != G_REBUILD_V1) {
        const node *rg = &k->nodes[x[4]], *hooks = &k->nodes[x[5]];
        if (rg->kind != K_BOOL)
            return fail(k, FERRY_E_CORRUPT, "%s: requires_grad is %s, not a bool", fn, kind_name(rg->kind));
        if (hooks->kind != K_DICT && hooks->kind != K_NONE)
            return fail(k, FERRY_E_CORRUPT, "%s: backward_hooks is %s, not an OrderedDict", fn,
                        kind_name(hooks->kind));
    }
    if (ALLOWED[g].kind == G_REBUILD_V3) {
        const node *dt = &k->nodes[x[6]];
        char q[96];
        if (dt->kind == K_GLOBAL && ALLOWED[dt->u.idx].kind != G_DTYPE)
            return fail(k, FERRY_E_CORRUPT, "%s: the dtype argument %s is not a torch dtype", fn,
                        gname(q, sizeof q, (int)dt->u.idx));
        if (dt->kind != K_GLOBAL)
            return fail(k, FERRY_E_CORRUPT, "%s: the dtype argument is %s, not a torch dtype", fn,
                        kind_name(dt->kind));
        if (ALLOWED[dt->u.idx].dt == FERRY_DTYPE_INVALID)
            return fail(k, FERRY_E_UNSUPPORTED, "dtype torch.%s has no ferry equivalent",
                        ALLOWED[dt->u.idx].name);
        v.dtype = ALLOWED[dt->u.idx].dt;
    }
    FY_TRY(get_dims(k, x[2], fn, "size", &v.shape, &v.ndim));
    int rc = get_dims(k, x[3], fn, "stride", &v.stride, &v.ndim);
    if (rc == 0 && k->r->nv == k->r->v_cap) {
        size_t cap = (size_t)k->r->v_cap;
        void *arr = k->r->v;
        rc = grow(k, &arr, &cap, (size_t)k->r->nv + 1, sizeof(fy_pk_view), 16);
        if (rc == 0) k->r->v = arr, k->r->v_cap = (int64_t)cap;
    }
    uint32_t id = 0;
    if (rc == 0) rc = new_node(k, K_TENSOR, &id);
    if (rc < 0) {
        fy_free(k->mem, v.shape);
        fy_free(k->mem, v.stride);
        return rc;
    }
    k->nodes[id].u.idx = k->r->nv;
    k->r->v[k->r->nv++] = v;
    *res = id;
    return 0;
}

/* REDUCE: callable(*args), for the callables torch.save uses. */
static int call(pk *k, uint32_t fn, uint32_t args, uint32_t *res)
{
    const node *f = &k->nodes[fn], *a = &k->nodes[args];
    char q[96];
    if (f->kind != K_GLOBAL) return fail(k, FERRY_E_CORRUPT, "calls %s, not a global", kind_name(f->kind));
    int g = (int)f->u.idx;
    if (a->kind != K_TUPLE)
        return fail(k, FERRY_E_CORRUPT, "the arguments of %s are %s, not a tuple", gname(q, sizeof q, g),
                    kind_name(a->kind));
    switch (ALLOWED[g].kind) {
    case G_ODICT:
        if (a->n != 0)
            return fail(k, FERRY_E_UNSUPPORTED,
                        "collections.OrderedDict called with %u arguments (ferry reads "
                        "OrderedDict() filled by SETITEMS only)",
                        a->n);
        return new_node(k, K_DICT, res);
    case G_REBUILD_V1:
    case G_REBUILD_V2:
    case G_REBUILD_V3: return rebuild(k, g, args, res);
    case G_PARAM:
    case G_PARAM_STATE: {
        uint32_t want = ALLOWED[g].kind == G_PARAM ? 3 : 4;
        if (a->n != want)
            return fail(k, FERRY_E_CORRUPT, "%s takes %u arguments, got %u", gname(q, sizeof q, g), want,
                        a->n);
        const node *t = &k->nodes[a->u.kids[0]], *rg = &k->nodes[a->u.kids[1]];
        if (t->kind != K_TENSOR)
            return fail(k, FERRY_E_CORRUPT, "%s: the data argument is %s, not a tensor",
                        gname(q, sizeof q, g), kind_name(t->kind));
        if (rg->kind != K_BOOL)
            return fail(k, FERRY_E_CORRUPT, "%s: requires_grad is %s, not a bool", gname(q, sizeof q, g),
                        kind_name(rg->kind));
        *res = a->u.kids[0]; /* a Parameter is its tensor, for ferry */
        return 0;
    }
    default:
        return fail(k, FERRY_E_UNSUPPORTED,
                    "calls %s: ferry does not construct that (torch.save never calls it)",
                    gname(q, sizeof q, g));
    }
}

/* BINPERSID: ('storage', storage_type, key, location, numel). */
static int persistent(pk *k, uint32_t pid, uint32_t *res)
{
    const node *t = &k->nodes[pid];
    if (t->kind != K_TUPLE)
        return fail(k, FERRY_E_CORRUPT, "persistent id is %s, not a tuple", kind_name(t->kind));
    const uint32_t *x = t->u.kids;
    const node *tag = t->n ? &k->nodes[x[0]] : NULL;
    if (!tag || tag->kind != K_STR || !eq("storage", k->p + tag->u.s.off, tag->u.s.len))
        return fail(k, FERRY_E_UNSUPPORTED, "persistent id is not a ('storage', ...) tuple");
    if (t->n != 5)
        return fail(k, FERRY_E_CORRUPT,
                    "persistent id ('storage', ...) has %u fields, not 5 (type, key, location, "
                    "size)",
                    t->n);
    const node *ty = &k->nodes[x[1]], *key = &k->nodes[x[2]], *loc = &k->nodes[x[3]];
    char q[96];
    if (ty->kind == K_GLOBAL && ALLOWED[ty->u.idx].kind != G_STORAGE)
        return fail(k, FERRY_E_CORRUPT, "persistent id: the storage type %s is not a storage class",
                    gname(q, sizeof q, (int)ty->u.idx));
    if (ty->kind != K_GLOBAL)
        return fail(k, FERRY_E_CORRUPT, "persistent id: the storage type is %s, not a storage class",
                    kind_name(ty->kind));
    const allowed *al = &ALLOWED[ty->u.idx];
    if (al->dt == FERRY_DTYPE_INVALID)
        return fail(k, FERRY_E_UNSUPPORTED, "storage type %s.%s (%s) has no ferry equivalent", al->mod,
                    al->name, al->torch);
    if (key->kind != K_STR)
        return fail(k, FERRY_E_CORRUPT, "persistent id: the key is %s, not a str", kind_name(key->kind));
    const char *ks = (const char *)k->p + key->u.s.off;
    uint32_t kl = key->u.s.len;
    size_t bad;
    if (kl == 0 || kl > 256 || memchr(ks, '/', kl) || memchr(ks, 0, kl) || !fy_utf8_valid(ks, kl, &bad)) {
        char tmp[300], qk[128];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(kl > 256 ? 256 : kl), ks);
        return fail(k, FERRY_E_CORRUPT,
                    "persistent id: storage key %s is not a plain name (1 to 256 bytes of UTF-8, "
                    "no '/' or NUL)",
                    fy_quote(qk, sizeof qk, tmp));
    }
    if (loc->kind != K_STR)
        return fail(k, FERRY_E_CORRUPT, "persistent id: the location is %s, not a str", kind_name(loc->kind));
    int64_t numel;
    FY_TRY(get_nonneg(k, x[4], "persistent id: the storage size", &numel));
    fy_pk_result *r = k->r;
    if (r->nst == r->st_cap) {
        size_t cap = (size_t)r->st_cap;
        void *arr = r->st;
        FY_TRY(grow(k, &arr, &cap, (size_t)r->nst + 1, sizeof(fy_pk_storage), 16));
        r->st = arr;
        r->st_cap = (int64_t)cap;
    }
    uint32_t id;
    FY_TRY(new_node(k, K_STORAGE, &id));
    k->nodes[id].u.idx = r->nst;
    fy_pk_storage *s = &r->st[r->nst++];
    s->key = ks;
    s->key_len = kl;
    s->dtype = al->dt;
    s->untyped = al->torch == NULL;
    s->numel = (uint64_t)numel;
    s->type = al->torch ? al->name : "UntypedStorage";
    *res = id;
    return 0;
}

/* ---- the opcode loop ------------------------------------------------------- */

static int collect(pk *k, int kind)
{
    size_t base = 0;
    FY_TRY(pop_mark(k, &base));
    uint32_t id;
    FY_TRY(new_node(k, kind, &id));
    for (size_t i = base; i < k->sp; i++) FY_TRY(add_kid(k, id, k->stack[i]));
    k->sp = base;
    return push(k, id);
}

static int tuple_n(pk *k, size_t cnt)
{
    FY_TRY(need(k, cnt));
    uint32_t id;
    FY_TRY(new_node(k, K_TUPLE, &id));
    for (size_t i = k->sp - cnt; i < k->sp; i++) FY_TRY(add_kid(k, id, k->stack[i]));
    k->sp -= cnt;
    return push(k, id);
}

/* APPENDS / SETITEMS: the values above the MARK go into the container below it. */
static int extend(pk *k, int kind)
{
    size_t base = 0;
    FY_TRY(pop_mark(k, &base));
    if (base == 0 || base - 1 < fence(k))
        return fail(k, FERRY_E_CORRUPT, "stack underflow: no %s below the MARK",
                    kind == K_LIST ? "list" : "dict");
    uint32_t c = k->stack[base - 1];
    if (k->nodes[c].kind != kind)
        return fail(k, FERRY_E_UNSUPPORTED, "adds items to %s, not %s", kind_name(k->nodes[c].kind),
                    kind_name(kind));
    if (kind == K_DICT && (k->sp - base) % 2)
        return fail(k, FERRY_E_CORRUPT, "an odd number of values (%zu) for key/value pairs", k->sp - base);
    for (size_t i = base; i < k->sp; i++) FY_TRY(add_kid(k, c, k->stack[i]));
    k->sp = base;
    return 0;
}

static int step(pk *k, bool *stop)
{
    const uint8_t *b = NULL;
    uint32_t id;
    int64_t x;
    k->op_at = k->pos;
    k->op = -1;
    if (k->pos >= k->n) return fail(k, FERRY_E_CORRUPT, "the pickle ends without STOP");
    int op = k->op = k->p[k->pos++];
    k->nops++;
    if (k->op_at == 0 && op != OP_PROTO)
        return fail(k, FERRY_E_CORRUPT,
                    "does not start with PROTO (torch.save writes pickle protocol 2 to 5)");
    switch (op) {
    case OP_PROTO:
        FY_TRY(take(k, 1, &b));
        if (k->op_at != 0) return fail(k, FERRY_E_CORRUPT, "PROTO after the start of the pickle");
        if (b[0] < 2 || b[0] > 5)
            return fail(k, FERRY_E_UNSUPPORTED,
                        "pickle protocol %u (ferry reads protocols 2 to 5, as torch.save "
                        "writes them)",
                        b[0]);
        return 0;
    case OP_FRAME:
        FY_TRY(take(k, 8, &b));
        if (le(b, 8) > k->n - k->pos)
            return fail(k, FERRY_E_CORRUPT,
                        "a frame of %" PRIu64 " bytes runs past the end of the pickle (%zu bytes "
                        "left)",
                        le(b, 8), k->n - k->pos);
        return 0;
    case OP_STOP:
        if (k->sp != 1 || k->nmarks)
            return fail(k, FERRY_E_CORRUPT,
                        "STOP with %zu values on the stack and %zu MARKs open (expected one "
                        "value)",
                        k->sp, k->nmarks);
        if (k->pos != k->n) return fail(k, FERRY_E_CORRUPT, "%zu bytes follow STOP", k->n - k->pos);
        *stop = true;
        return 0;
    case OP_MARK:
        if (k->nmarks >= FY_PK_MAX_MARKS)
            return fail(k, FERRY_E_LIMIT, "more than %u MARKs open at once (ferry's limit)", FY_PK_MAX_MARKS);
        if (k->nmarks == k->mark_cap) {
            void *a = k->marks;
            FY_TRY(grow(k, &a, &k->mark_cap, k->nmarks + 1, sizeof(size_t), 16));
            k->marks = a;
        }
        k->marks[k->nmarks++] = k->sp;
        return 0;
    case OP_POP:
        FY_TRY(need(k, 1));
        k->sp--;
        return 0;
    case OP_POP_MARK: {
        size_t base = 0;
        FY_TRY(pop_mark(k, &base));
        k->sp = base;
        return 0;
    }
    case OP_DUP: FY_TRY(need(k, 1)); return push(k, k->stack[k->sp - 1]);
    case OP_NONE: return push_new(k, K_NONE, NULL);
    case OP_NEWTRUE:
    case OP_NEWFALSE:
        FY_TRY(push_new(k, K_BOOL, &id));
        k->nodes[id].u.i = op == OP_NEWTRUE;
        return 0;
    case OP_BININT: FY_TRY(take(k, 4, &b)); return push_int(k, (int32_t)(uint32_t)le(b, 4));
    case OP_BININT1: FY_TRY(take(k, 1, &b)); return push_int(k, b[0]);
    case OP_BININT2: FY_TRY(take(k, 2, &b)); return push_int(k, (int64_t)le(b, 2));
    case OP_LONG1:
        FY_TRY(take(k, 1, &b));
        x = b[0];
        FY_TRY(take(k, (uint64_t)x, &b));
        return push_long(k, b, (uint64_t)x);
    case OP_LONG4:
        FY_TRY(take(k, 4, &b));
        x = (int32_t)(uint32_t)le(b, 4);
        if (x < 0) return fail(k, FERRY_E_CORRUPT, "negative length %" PRId64, x);
        FY_TRY(take(k, (uint64_t)x, &b));
        return push_long(k, b, (uint64_t)x);
    case OP_BINFLOAT: {
        FY_TRY(take(k, 8, &b));
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = u << 8 | b[i]; /* big-endian */
        FY_TRY(push_new(k, K_FLOAT, &id));
        memcpy(&k->nodes[id].u.f, &u, sizeof u);
        return 0;
    }
    case OP_SHORT_BINUNICODE:
    case OP_SHORT_BINSTRING:
    case OP_SHORT_BINBYTES:
        FY_TRY(take(k, 1, &b));
        x = b[0];
        FY_TRY(take(k, (uint64_t)x, &b));
        return push_str(k, op == OP_SHORT_BINBYTES ? K_BYTES : K_STR, b, (uint64_t)x);
    case OP_BINUNICODE:
    case OP_BINBYTES:
        FY_TRY(take(k, 4, &b));
        x = (int64_t)le(b, 4);
        FY_TRY(take(k, (uint64_t)x, &b));
        return push_str(k, op == OP_BINBYTES ? K_BYTES : K_STR, b, (uint64_t)x);
    case OP_BINSTRING:
        FY_TRY(take(k, 4, &b));
        x = (int32_t)(uint32_t)le(b, 4);
        if (x < 0) return fail(k, FERRY_E_CORRUPT, "negative length %" PRId64, x);
        FY_TRY(take(k, (uint64_t)x, &b));
        return push_str(k, K_STR, b, (uint64_t)x);
    case OP_BINUNICODE8:
    case OP_BINBYTES8: {
        FY_TRY(take(k, 8, &b));
        uint64_t len = le(b, 8);
        FY_TRY(take(k, len, &b));
        return push_str(k, op == OP_BINBYTES8 ? K_BYTES : K_STR, b, len);
    }
    case OP_EMPTY_DICT: return push_new(k, K_DICT, NULL);
    case OP_EMPTY_LIST: return push_new(k, K_LIST, NULL);
    case OP_EMPTY_TUPLE: return push_new(k, K_TUPLE, NULL);
    case OP_TUPLE: return collect(k, K_TUPLE);
    case OP_LIST: return collect(k, K_LIST);
    case OP_DICT:
        if (k->nmarks && (k->sp - fence(k)) % 2)
            return fail(k, FERRY_E_CORRUPT, "an odd number of values (%zu) for key/value pairs",
                        k->sp - fence(k));
        return collect(k, K_DICT);
    case OP_TUPLE1: return tuple_n(k, 1);
    case OP_TUPLE2: return tuple_n(k, 2);
    case OP_TUPLE3: return tuple_n(k, 3);
    case OP_APPEND: {
        FY_TRY(need(k, 2));
        uint32_t v = k->stack[--k->sp], c = k->stack[k->sp - 1];
        if (k->nodes[c].kind != K_LIST)
            return fail(k, FERRY_E_UNSUPPORTED, "appends to %s, not a list", kind_name(k->nodes[c].kind));
        return add_kid(k, c, v);
    }
    case OP_APPENDS: return extend(k, K_LIST);
    case OP_SETITEM: {
        FY_TRY(need(k, 3));
        uint32_t v = k->stack[k->sp - 1], key = k->stack[k->sp - 2], c = k->stack[k->sp - 3];
        k->sp -= 2;
        if (k->nodes[c].kind != K_DICT)
            return fail(k, FERRY_E_UNSUPPORTED, "sets an item of %s, not a dict",
                        kind_name(k->nodes[c].kind));
        FY_TRY(add_kid(k, c, key));
        return add_kid(k, c, v);
    }
    case OP_SETITEMS: return extend(k, K_DICT);
    case OP_BINPUT: FY_TRY(take(k, 1, &b)); return memo_put(k, b[0]);
    case OP_LONG_BINPUT: FY_TRY(take(k, 4, &b)); return memo_put(k, le(b, 4));
    case OP_MEMOIZE: return memo_put(k, k->memo_count);
    case OP_BINGET: FY_TRY(take(k, 1, &b)); return memo_get(k, b[0]);
    case OP_LONG_BINGET: FY_TRY(take(k, 4, &b)); return memo_get(k, le(b, 4));
    case OP_GLOBAL:
    case OP_INST: {
        const uint8_t *mod = NULL, *name = NULL;
        size_t mlen = 0, nlen = 0;
        int g;
        FY_TRY(line(k, &mod, &mlen));
        FY_TRY(line(k, &name, &nlen));
        FY_TRY(global(k, mod, mlen, name, nlen, &g));
        if (op == OP_INST) return fail(k, FERRY_E_UNSUPPORTED, "opcode INST (0x69) is not read by ferry");
        return push_global(k, g);
    }
    case OP_STACK_GLOBAL: {
        FY_TRY(need(k, 2));
        const node *m = &k->nodes[k->stack[k->sp - 2]], *nm = &k->nodes[k->stack[k->sp - 1]];
        if (m->kind != K_STR || nm->kind != K_STR)
            return fail(k, FERRY_E_CORRUPT, "module and name are %s and %s, not strs", kind_name(m->kind),
                        kind_name(nm->kind));
        int g;
        FY_TRY(global(k, k->p + m->u.s.off, m->u.s.len, k->p + nm->u.s.off, nm->u.s.len, &g));
        k->sp -= 2;
        return push_global(k, g);
    }
    case OP_REDUCE: {
        FY_TRY(need(k, 2));
        uint32_t args = k->stack[k->sp - 1], fn = k->stack[k->sp - 2], res;
        FY_TRY(call(k, fn, args, &res));
        k->sp--;
        k->stack[k->sp - 1] = res;
        return 0;
    }
    case OP_NEWOBJ: {
        FY_TRY(need(k, 2));
        const node *cls = &k->nodes[k->stack[k->sp - 2]], *args = &k->nodes[k->stack[k->sp - 1]];
        if (cls->kind != K_GLOBAL || ALLOWED[cls->u.idx].kind != G_ODICT || args->kind != K_TUPLE ||
            args->n) {
            char q[96];
            return fail(k, FERRY_E_UNSUPPORTED,
                        "NEWOBJ of %s (ferry reads OrderedDict.__new__(OrderedDict) only)",
                        cls->kind == K_GLOBAL ? gname(q, sizeof q, (int)cls->u.idx) : kind_name(cls->kind));
        }
        FY_TRY(new_node(k, K_DICT, &id));
        k->sp--;
        k->stack[k->sp - 1] = id;
        return 0;
    }
    case OP_BUILD: {
        FY_TRY(need(k, 2));
        const node *obj = &k->nodes[k->stack[k->sp - 2]];
        /* A state dict is an OrderedDict with a _metadata attribute: the
         * attributes are not entries, and hold no tensors; they are dropped. */
        if (obj->kind != K_DICT)
            return fail(k, FERRY_E_UNSUPPORTED,
                        "sets the state of %s (ferry accepts state on OrderedDicts only)",
                        kind_name(obj->kind));
        k->sp--;
        return 0;
    }
    case OP_BINPERSID: {
        FY_TRY(need(k, 1));
        FY_TRY(persistent(k, k->stack[k->sp - 1], &id));
        k->stack[k->sp - 1] = id;
        return 0;
    }
    default:
        if (op_name(op))
            return fail(k, FERRY_E_UNSUPPORTED,
                        "opcode %s (0x%02x) is not read by ferry (torch.save does not "
                        "write it for tensors)",
                        op_name(op), op);
        return fail(k, FERRY_E_CORRUPT, "unknown opcode 0x%02x", op);
    }
}

/* ---- the walk: names for the tensors reachable from the root -------------- */

static bool is_container(int kind)
{
    return kind == K_DICT || kind == K_LIST || kind == K_TUPLE;
}

static const char *path_q(pk *k, char *buf, size_t n)
{
    char tmp[200];
    size_t l = k->plen < sizeof tmp - 1 ? k->plen : sizeof tmp - 1;
    if (l) memcpy(tmp, k->path, l); /* the path is NULL until something was added */
    tmp[l] = '\0';
    return fy_quote(buf, n, tmp);
}

/* Append (depth > 0 ? "." : "") + s to the path. */
static int path_add(pk *k, int depth, const char *s, size_t len)
{
    size_t add = (depth > 0) + len;
    if (k->plen + add > FY_PK_MAX_NAME) {
        char q[128];
        return fail(k, FERRY_E_LIMIT, "names grow longer than %d bytes under %s (ferry's limit)",
                    FY_PK_MAX_NAME, path_q(k, q, sizeof q));
    }
    if (k->plen + add + 1 > k->path_cap) {
        void *a = k->path;
        FY_TRY(grow(k, &a, &k->path_cap, k->plen + add + 1, 1, 256));
        k->path = a;
    }
    if (depth > 0) k->path[k->plen++] = '.';
    memcpy(k->path + k->plen, s, len);
    k->plen += len;
    return 0;
}

static int emit(pk *k, int64_t view)
{
    fy_pk_result *r = k->r;
    k->name_bytes += k->plen + 1;
    if (k->name_bytes > k->name_max)
        return fail(k, FERRY_E_LIMIT,
                    "tensor names add up to more than %" PRIu64 " bytes, out of proportion to "
                    "the pickle's size (shared containers referenced over and over?)",
                    k->name_max);
    if (r->nn == r->nn_cap) {
        size_t cap = (size_t)r->nn_cap;
        void *a = r->names;
        FY_TRY(grow(k, &a, &cap, (size_t)r->nn + 1, sizeof(fy_pk_named), 64));
        r->names = a;
        r->nn_cap = (int64_t)cap;
    }
    char *s = fy_strndup(k->mem, k->path ? k->path : "", k->plen);
    if (!s) return oom(k);
    r->names[r->nn].name = s;
    r->names[r->nn].view = view;
    r->nn++;
    return 0;
}

/* Visit value id found under the current path. nameless: why tensors below
 * cannot be named (a dict key that is not a str or int), or NULL. */
static int walk(pk *k, uint32_t id, int depth, const char *nameless)
{
    char q[128];
    if (++k->work > k->work_max)
        return fail(k, FERRY_E_LIMIT,
                    "walking the unpickled objects takes more than %" PRIu64 " steps, out of "
                    "proportion to the pickle's size (shared containers referenced over and over?)",
                    k->work_max);
    node *v = &k->nodes[id];
    if (v->kind == K_TENSOR) {
        if (nameless)
            return fail(k, FERRY_E_UNSUPPORTED, "a tensor under %s: only str and int dict keys name tensors",
                        nameless);
        return emit(k, v->u.idx);
    }
    if (!is_container(v->kind)) return 0; /* numbers, strings, ...: not tensors, skipped */
    if (depth >= FY_PK_MAX_DEPTH)
        return fail(k, FERRY_E_LIMIT, "containers nest deeper than %d levels under %s (ferry's limit)",
                    FY_PK_MAX_DEPTH, path_q(k, q, sizeof q));
    if (v->onpath)
        return fail(k, FERRY_E_CORRUPT, "a container holds itself under %s", path_q(k, q, sizeof q));
    v->onpath = 1;
    int rc = 0;
    size_t save = k->plen;
    uint32_t step_by = v->kind == K_DICT ? 2 : 1;
    for (uint32_t i = 0; rc == 0 && i + step_by - 1 < k->nodes[id].n; i += step_by) {
        const uint32_t *kids = k->nodes[id].u.kids;
        uint32_t val = kids[i + step_by - 1];
        int vk = k->nodes[val].kind;
        if (vk != K_TENSOR && !is_container(vk)) {
            k->work++;
            continue;
        }
        const char *why = nameless;
        char buf[32], nl[200];
        if (v->kind != K_DICT) {
            int len = snprintf(buf, sizeof buf, "%u", i);
            rc = path_add(k, depth, buf, (size_t)len);
        } else {
            const node *key = &k->nodes[kids[i]];
            if (key->kind == K_STR) {
                const char *s = (const char *)k->p + key->u.s.off;
                size_t bad;
                if (memchr(s, 0, key->u.s.len) || !fy_utf8_valid(s, key->u.s.len, &bad))
                    rc = fail(k, FERRY_E_CORRUPT, "a dict key under %s is not valid UTF-8 without NUL",
                              path_q(k, q, sizeof q));
                else rc = path_add(k, depth, s, key->u.s.len);
            } else if (key->kind == K_INT) {
                int len = snprintf(buf, sizeof buf, "%" PRId64, key->u.i);
                rc = path_add(k, depth, buf, (size_t)len);
            } else if (!why) {
                snprintf(nl, sizeof nl, "a dict key that is %s in %s", kind_name(key->kind),
                         depth ? path_q(k, q, sizeof q) : "the top-level dict");
                why = nl;
            }
        }
        if (rc == 0) rc = walk(k, val, depth + 1, why);
        k->plen = save;
    }
    k->nodes[id].onpath = 0;
    return rc;
}

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const fy_pk_named *)a)->name, ((const fy_pk_named *)b)->name);
}

static int check_unique(pk *k)
{
    fy_pk_result *r = k->r;
    if (r->nn < 2) return 0;
    fy_pk_named *c = fy_malloc(k->mem, (size_t)r->nn * sizeof *c);
    if (!c) return oom(k);
    memcpy(c, r->names, (size_t)r->nn * sizeof *c);
    qsort(c, (size_t)r->nn, sizeof *c, cmp_named);
    int rc = 0;
    for (int64_t i = 1; i < r->nn && rc == 0; i++) {
        if (strcmp(c[i - 1].name, c[i].name) == 0) {
            char q[128];
            rc = fail(k, FERRY_E_CORRUPT,
                      "two tensors are named %s (dict keys that flatten to the same dotted name)",
                      fy_quote(q, sizeof q, c[i].name));
        }
    }
    fy_free(k->mem, c);
    return rc;
}

void fy_pk_free(fy_pk_result *r)
{
    if (!r) return;
    for (int64_t i = 0; i < r->nv; i++) {
        fy_free(r->mem, r->v[i].shape);
        fy_free(r->mem, r->v[i].stride);
    }
    for (int64_t i = 0; i < r->nn; i++) fy_free(r->mem, r->names[i].name);
    fy_free(r->mem, r->v);
    fy_free(r->mem, r->st);
    fy_free(r->mem, r->names);
    const ferry_allocator *m = r->mem;
    memset(r, 0, sizeof *r);
    r->mem = m;
}

int fy_pk_load(const char *where, const uint8_t *p, size_t n, const ferry_allocator *mem, fy_pk_result *out,
               fy_err *err)
{
    memset(out, 0, sizeof *out);
    out->mem = mem;
    FY_RETURN_IF(n > FY_PK_MAX_PICKLE, err, FERRY_E_LIMIT, "%s: %zu bytes of pickle (ferry's limit is %llu)",
                 where, n, FY_PK_MAX_PICKLE);
    pk k = {.where = where, .p = p, .n = n, .mem = mem, .err = err, .r = out, .op = -1};
    int rc = 0;
    bool stop = false;
    while (!stop && (rc = step(&k, &stop)) == 0) {}
    if (rc == 0) {
        /* Bounds for the walk: a tree visits each value once, and each
         * reference to a shared value cost the pickle an opcode (BINGET). */
        k.walking = true;
        k.work_max = 4 * ((uint64_t)k.nnodes + k.nops) + 65536;
        k.name_max = 16 * (uint64_t)n + (1u << 20);
        rc = walk(&k, k.stack[0], 0, NULL);
        if (rc == 0) rc = check_unique(&k);
    }
    for (uint32_t i = 0; i < k.nnodes; i++)
        if (is_container(k.nodes[i].kind)) fy_free(mem, k.nodes[i].u.kids);
    fy_free(mem, k.nodes);
    fy_free(mem, k.stack);
    fy_free(mem, k.marks);
    fy_free(mem, k.memo);
    fy_free(mem, k.path);
    if (rc < 0) fy_pk_free(out);
    return rc;
}
