/* SPDX-License-Identifier: Apache-2.0 */
/* gguf.c - a strict GGUF reader (versions 2 and 3, little-endian), written
 * from the GGUF specification (ggml's docs/gguf.md).
 *
 * Layout: "GGUF", u32 version, u64 tensor_count, u64 metadata_kv_count; the
 * key/values (string key, u32 value type, value); the tensor infos (string
 * name, u32 n_dims, n_dims x u64 ne with ne[0] the innermost dimension, u32
 * ggml type, u64 offset relative to the data section); zero padding up to the
 * alignment (general.alignment, default 32); the data section. A string is a
 * u64 byte count and that many bytes. Every read is bounds-checked against the
 * buffer and every count against the bytes that remain, so a hostile header can
 * neither read past the buffer nor make us allocate or loop far beyond its own
 * size; the table is returned only when all of it is valid. Only the header's
 * bytes are read. */
#define _GNU_SOURCE /* qsort_r */
#include "format.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_HEADER 24     /* magic, version, tensor_count, metadata_kv_count */
#define GGUF_MAX_DIMS 4    /* GGML_MAX_DIMS */
#define GGUF_MAX_NAME 64   /* the spec: a tensor name is at most 64 bytes */
#define GGUF_MAX_KEY 65535 /* the spec: a key is at most 2^16-1 bytes */
#define GGUF_DEFAULT_ALIGN 32
#define GGUF_MAX_DEPTH 32  /* ferry's limit on nested arrays (recursion depth) */
#define GGUF_SHOW_ITEMS 16 /* longer arrays become "[TYPE x N]" */
#define GGUF_MIN_KV 13     /* empty key (8) + type (4) + a 1-byte value */
#define GGUF_MIN_TENSOR 24 /* empty name (8) + n_dims (4) + type (4) + offset (8) */

/* ---- metadata value types ---- */

enum {
    VT_U8,
    VT_I8,
    VT_U16,
    VT_I16,
    VT_U32,
    VT_I32,
    VT_F32,
    VT_BOOL,
    VT_STRING,
    VT_ARRAY,
    VT_U64,
    VT_I64,
    VT_F64,
    VT_COUNT
};

static const char *const vt_name[VT_COUNT] = {
    "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",   "FLOAT32",
    "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64",
};
/* bytes of a fixed-size value; 0 for strings and arrays */
static const uint8_t vt_size[VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* The fewest bytes one value of type t can take (an empty string or array). */
static uint64_t vt_min(uint32_t t)
{
    return t == VT_STRING ? 8 : t == VT_ARRAY ? 12 : vt_size[t];
}

/* ---- ggml tensor types (ggml.h's enum ggml_type) ---- */

static const ferry_dtype ggml_dtype[] = {
    [0] = FERRY_DTYPE_F32,     [1] = FERRY_DTYPE_F16,      [2] = FERRY_DTYPE_Q4_0,
    [3] = FERRY_DTYPE_Q4_1,    [6] = FERRY_DTYPE_Q5_0,     [7] = FERRY_DTYPE_Q5_1,
    [8] = FERRY_DTYPE_Q8_0,    [9] = FERRY_DTYPE_Q8_1,     [10] = FERRY_DTYPE_Q2_K,
    [11] = FERRY_DTYPE_Q3_K,   [12] = FERRY_DTYPE_Q4_K,    [13] = FERRY_DTYPE_Q5_K,
    [14] = FERRY_DTYPE_Q6_K,   [15] = FERRY_DTYPE_Q8_K,    [16] = FERRY_DTYPE_IQ2_XXS,
    [17] = FERRY_DTYPE_IQ2_XS, [18] = FERRY_DTYPE_IQ3_XXS, [19] = FERRY_DTYPE_IQ1_S,
    [20] = FERRY_DTYPE_IQ4_NL, [21] = FERRY_DTYPE_IQ3_S,   [22] = FERRY_DTYPE_IQ2_S,
    [23] = FERRY_DTYPE_IQ4_XS, [24] = FERRY_DTYPE_I8,      [25] = FERRY_DTYPE_I16,
    [26] = FERRY_DTYPE_I32,    [27] = FERRY_DTYPE_I64,     [28] = FERRY_DTYPE_F64,
    [29] = FERRY_DTYPE_IQ1_M,  [30] = FERRY_DTYPE_BF16,    [34] = FERRY_DTYPE_TQ1_0,
    [35] = FERRY_DTYPE_TQ2_0,  [39] = FERRY_DTYPE_MXFP4,   [40] = FERRY_DTYPE_NVFP4,
    [41] = FERRY_DTYPE_Q1_0,   [42] = FERRY_DTYPE_Q2_0,
};
#define GGML_NTYPES (sizeof ggml_dtype / sizeof ggml_dtype[0])

/* Numbers ggml once used and then took out of GGUF files. */
static const char *ggml_removed(uint32_t t)
{
    switch (t) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
    default: return NULL;
    }
}

/* ---- a growing text buffer (metadata values) ---- */

typedef struct sbuf {
    const ferry_allocator *mem;
    char *p;
    size_t n, cap;
    bool oom;
    bool not_json; /* holds text JSON cannot read: NaN, Infinity, "[TYPE x N]" */
} sbuf;

static void sb_add(sbuf *b, const void *s, size_t n)
{
    if (b->oom || n == 0) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *np = fy_realloc(b->mem, b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* s (n bytes) as a JSON string: quotes, backslashes and control characters
 * escaped as Python's json.dumps(ensure_ascii=False) does; each byte that is
 * not part of valid UTF-8 becomes U+FFFD, so the text is always UTF-8. */
static void sb_json_string(sbuf *b, const uint8_t *s, uint64_t n)
{
    sb_add(b, "\"", 1);
    uint64_t i = 0;
    while (i < n) {
        uint64_t run = i;
        while (run < n && s[run] >= 0x20 && s[run] != '"' && s[run] != '\\' && s[run] < 0x80) run++;
        sb_add(b, s + i, (size_t)(run - i));
        i = run;
        if (i == n) break;
        unsigned c = s[i];
        if (c >= 0x80) {
            /* the longest valid UTF-8 prefix from here */
            size_t bad = (size_t)(n - i);
            size_t lim = n - i > 4 ? 4 : (size_t)(n - i);
            size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            if (len && len <= lim && fy_utf8_valid((const char *)s + i, len, &bad)) {
                sb_add(b, s + i, len);
                i += len;
            } else {
                sb_add(b, "\xEF\xBF\xBD", 3);
                i++;
            }
            continue;
        }
        char esc[8];
        switch (c) {
        case '"': sb_str(b, "\\\""); break;
        case '\\': sb_str(b, "\\\\"); break;
        case '\n': sb_str(b, "\\n"); break;
        case '\r': sb_str(b, "\\r"); break;
        case '\t': sb_str(b, "\\t"); break;
        case '\b': sb_str(b, "\\b"); break;
        case '\f': sb_str(b, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", c); sb_str(b, esc);
        }
        i++;
    }
    sb_add(b, "\"", 1);
}

/* The fewest significant digits that read back as the same float32 (f32) or
 * double, written plainly ("10000", "0.001", "4000000000000000") when the
 * decimal exponent is in [-4, 16), else in exponent form ("1e-05",
 * "3.4028235e+38"), as Python's repr chooses; "NaN", "Infinity", "-Infinity"
 * as JSON-ish text. The round trip is checked in the current locale; the text
 * is built from the digits, so its decimal point is always '.'. */
static void fmt_float(char *out, size_t n, double v, bool f32)
{
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, n, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char tmp[64];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        double back = strtod(tmp, NULL);
        if (f32 ? (float)back == (float)v : back == v) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
    /* "-d.ddde+XX" (the point as the locale has it): sign, digits, exponent */
    char dig[24];
    int nd = 0;
    const char *c = tmp;
    bool neg = *c == '-';
    for (; *c && *c != 'e' && *c != 'E'; c++)
        if (*c >= '0' && *c <= '9' && nd < (int)sizeof dig - 1) dig[nd++] = *c;
    dig[nd] = '\0';
    long ex = *c ? strtol(c + 1, NULL, 10) : 0;
    if (ex < -4 || ex >= 16) {
        snprintf(out, n, "%s%c%s%se%c%02ld", neg ? "-" : "", dig[0], nd > 1 ? "." : "", dig + 1,
                 ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex < 0) { /* 0.000ddd */
        snprintf(out, n, "%s0.%.*s%s", neg ? "-" : "", (int)(-ex - 1), "0000", dig);
    } else if (nd <= ex + 1) { /* ddd000 */
        snprintf(out, n, "%s%s%.*s", neg ? "-" : "", dig, (int)(ex + 1 - nd), "0000000000000000");
    } else { /* dd.ddd */
        snprintf(out, n, "%s%.*s.%s", neg ? "-" : "", (int)(ex + 1), dig, dig + ex + 1);
    }
}

/* ---- the parser ---- */

enum { SUBJ_NONE, SUBJ_KV, SUBJ_TENSOR };

typedef struct gg {
    const char *name;
    const uint8_t *buf;
    uint64_t size, pos;
    fy_table *tb;
    fy_err *err;
    /* what messages are about: a key/value or a tensor info, by number until
     * its key or name has been read and validated */
    int subj;
    uint64_t index, count;
    const uint8_t *subj_s;
    uint64_t subj_len;
    sbuf text;
} gg;

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* s (n bytes, already checked to be UTF-8 without NUL) quoted for a message. */
static const char *quote_n(char *out, size_t outn, const uint8_t *s, uint64_t n)
{
    char tmp[400];
    size_t m = n < sizeof tmp - 1 ? (size_t)n : sizeof tmp - 1;
    while (m < n && m > 0 && (s[m] & 0xC0) == 0x80) m--; /* never cut a character */
    memcpy(tmp, s, m);
    tmp[m] = '\0';
    return fy_quote(out, outn, tmp);
}

static int fail(gg *g, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(gg *g, int code, const char *fmt, ...)
{
    char msg[FY_ERRMSG_MAX], q[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g->subj == SUBJ_NONE) return fy_seterr(g->err, code, "%s: %s", g->name, msg);
    const char *what = g->subj == SUBJ_KV ? "metadata key" : "tensor";
    if (g->subj_s)
        return fy_seterr(g->err, code, "%s: %s %s: %s", g->name, what,
                         quote_n(q, sizeof q, g->subj_s, g->subj_len), msg);
    return fy_seterr(g->err, code, "%s: %s %" PRIu64 " of %" PRIu64 ": %s", g->name,
                     g->subj == SUBJ_KV ? "metadata key/value" : "tensor info", g->index + 1, g->count, msg);
}

static int oom(gg *g)
{
    return fy_seterr(g->err, -ENOMEM, "%s: out of memory", g->name);
}
/* A failed push: out of memory, or past a cap of the table's (max_tensors, max_header_bytes). */
static int push_failed(gg *g, int rc)
{
    return fy_table_fail(g->tb, rc, g->name, g->err);
}

static uint64_t left(const gg *g)
{
    return g->size - g->pos;
}

/* n more bytes must be there for `what`. */
static int need(gg *g, uint64_t n, const char *what)
{
    if (n <= left(g)) return 0;
    return fail(g, FERRY_E_CORRUPT,
                "%s at offset %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", what, g->pos,
                g->size);
}

/* A string: its length, then its bytes. */
static int read_string(gg *g, const char *what, const uint8_t **s, uint64_t *len)
{
    char w[96];
    snprintf(w, sizeof w, "the length of %s", what);
    FY_TRY(need(g, 8, w));
    uint64_t n = le(g->buf + g->pos, 8);
    if (n > left(g) - 8)
        return fail(g, FERRY_E_CORRUPT,
                    "%s of %" PRIu64 " bytes at offset %" PRIu64 " runs past the end of the file (%" PRIu64
                    " bytes)",
                    what, n, g->pos + 8, g->size);
    *s = g->buf + g->pos + 8;
    *len = n;
    g->pos += 8 + n;
    return 0;
}

/* A key or tensor name: UTF-8, no NUL (ferry hands names out as C strings). */
static int check_text(gg *g, const char *what, const uint8_t *s, uint64_t n, uint64_t at)
{
    const uint8_t *nul = memchr(s, 0, (size_t)n);
    if (nul)
        return fail(g, FERRY_E_CORRUPT, "%s holds a NUL byte (offset %" PRIu64 ")", what,
                    at + (uint64_t)(nul - s));
    size_t bad = 0;
    if (!fy_utf8_valid((const char *)s, (size_t)n, &bad))
        return fail(g, FERRY_E_CORRUPT, "%s is not valid UTF-8 (byte 0x%02x at offset %" PRIu64 ")", what,
                    s[bad], at + bad);
    return 0;
}

/* One value of type t at g->pos, validated and skipped; its text goes to out
 * unless out is NULL. top: the metadata value itself, not an array item
 * (strings then go as they are, not quoted). */
static int read_value(gg *g, uint32_t t, int depth, sbuf *out, bool top)
{
    char num[64];
    if (t >= VT_COUNT) return fail(g, FERRY_E_CORRUPT, "unknown value type %" PRIu32, t);
    if (vt_size[t]) {
        char w[48];
        snprintf(w, sizeof w, "a %s value", vt_name[t]);
        FY_TRY(need(g, vt_size[t], w));
        const uint8_t *p = g->buf + g->pos;
        uint64_t v = le(p, vt_size[t]);
        if (t == VT_BOOL && v > 1)
            return fail(g, FERRY_E_CORRUPT, "BOOL value %" PRIu64 " at offset %" PRIu64 " is neither 0 nor 1",
                        v, g->pos);
        g->pos += vt_size[t];
        if (!out) return 0;
        switch (t) {
        case VT_U8:
        case VT_U16:
        case VT_U32:
        case VT_U64: snprintf(num, sizeof num, "%" PRIu64, v); break;
        case VT_I8: snprintf(num, sizeof num, "%d", (int)(int8_t)v); break;
        case VT_I16: snprintf(num, sizeof num, "%d", (int)(int16_t)v); break;
        case VT_I32: snprintf(num, sizeof num, "%" PRId32, (int32_t)(uint32_t)v); break;
        case VT_I64: snprintf(num, sizeof num, "%" PRId64, (int64_t)v); break;
        case VT_BOOL: snprintf(num, sizeof num, "%s", v ? "true" : "false"); break;
        case VT_F32: {
            uint32_t u = (uint32_t)v;
            float f;
            memcpy(&f, &u, sizeof f);
            fmt_float(num, sizeof num, f, true);
            out->not_json |= !isfinite(f);
            break;
        }
        default: { /* VT_F64 */
            double d;
            memcpy(&d, &v, sizeof d);
            fmt_float(num, sizeof num, d, false);
            out->not_json |= !isfinite(d);
        }
        }
        sb_str(out, num);
        return out->oom ? oom(g) : 0;
    }
    if (t == VT_STRING) {
        const uint8_t *s;
        uint64_t n;
        uint64_t at = g->pos + 8;
        FY_TRY(read_string(g, "a STRING value", &s, &n));
        if (!out) return 0;
        if (top) {
            FY_TRY(check_text(g, "the STRING value", s, n, at));
            sb_add(out, s, (size_t)n);
        } else {
            sb_json_string(out, s, n);
        }
        return out->oom ? oom(g) : 0;
    }
    /* VT_ARRAY: element type, count, items */
    FY_TRY(need(g, 12, "an ARRAY's element type and length"));
    uint32_t et = (uint32_t)le(g->buf + g->pos, 4);
    uint64_t n = le(g->buf + g->pos + 4, 8);
    uint64_t at = g->pos;
    g->pos += 12;
    if (et >= VT_COUNT)
        return fail(g, FERRY_E_CORRUPT, "ARRAY at offset %" PRIu64 " has unknown element type %" PRIu32, at,
                    et);
    if (depth + 1 > GGUF_MAX_DEPTH) /* this array is at level depth + 1 */
        return fail(g, FERRY_E_LIMIT,
                    "arrays nested deeper than %d levels (ferry's limit) at offset %" PRIu64, GGUF_MAX_DEPTH,
                    at);
    uint64_t min = vt_min(et);
    if (min && n > left(g) / min)
        return fail(g, FERRY_E_CORRUPT,
                    "ARRAY of %" PRIu64 " %s items at offset %" PRIu64 " needs at least %" PRIu64
                    " bytes per item, more than the %" PRIu64 " bytes left in the file",
                    n, vt_name[et], at, min, left(g));
    bool show = out && n <= GGUF_SHOW_ITEMS;
    if (out && !show) {
        snprintf(num, sizeof num, "[%s x %" PRIu64 "]", vt_name[et], n);
        sb_str(out, num);
        out->not_json = true;
    }
    if (!show && vt_size[et] && et != VT_BOOL) { /* fixed-size items: skip them all at once */
        g->pos += n * vt_size[et];
        return out && out->oom ? oom(g) : 0;
    }
    if (show) sb_add(out, "[", 1);
    for (uint64_t i = 0; i < n; i++) {
        if (show && i) sb_add(out, ",", 1);
        /* an allocation failure is reported as such, not as a later problem */
        if (out && out->oom) return oom(g);
        FY_TRY(read_value(g, et, depth + 1, show ? out : NULL, false));
    }
    if (show) sb_add(out, "]", 1);
    return out && out->oom ? oom(g) : 0;
}

static bool is_pow2(uint64_t x)
{
    return x && !(x & (x - 1));
}

static int read_kv(gg *g, uint32_t *align)
{
    const uint8_t *k;
    uint64_t klen, at = g->pos + 8;
    FY_TRY(read_string(g, "the key", &k, &klen));
    if (klen == 0) return fail(g, FERRY_E_CORRUPT, "the key is empty");
    if (klen > GGUF_MAX_KEY)
        return fail(g, FERRY_E_CORRUPT, "the key is %" PRIu64 " bytes long (GGUF allows at most %d)", klen,
                    GGUF_MAX_KEY);
    FY_TRY(check_text(g, "the key", k, klen, at));
    g->subj_s = k;
    g->subj_len = klen;
    FY_TRY(need(g, 4, "the value type"));
    uint32_t t = (uint32_t)le(g->buf + g->pos, 4);
    g->pos += 4;
    if (t >= VT_COUNT) return fail(g, FERRY_E_CORRUPT, "unknown value type %" PRIu32, t);
    bool is_align = klen == 17 && memcmp(k, "general.alignment", 17) == 0;
    if (is_align && t != VT_U32)
        return fail(g, FERRY_E_CORRUPT, "the alignment must be a UINT32, not %s", vt_name[t]);
    if (is_align) {
        FY_TRY(need(g, 4, "a UINT32 value"));
        uint32_t a = (uint32_t)le(g->buf + g->pos, 4);
        if (!is_pow2(a))
            return fail(g, FERRY_E_CORRUPT, "the alignment %" PRIu32 " is not a power of two", a);
        *align = a;
    }
    int rc;
    if (t == VT_STRING) { /* as it is, straight from the buffer */
        const uint8_t *s;
        uint64_t n;
        at = g->pos + 8;
        FY_TRY(read_string(g, "a STRING value", &s, &n));
        FY_TRY(check_text(g, "the STRING value", s, n, at));
        rc = fy_table_push_meta(g->tb, (const char *)k, (size_t)klen, (const char *)s, (size_t)n,
                                FERRY_META_TEXT);
    } else { /* numbers, booleans and shown arrays are JSON text as they are */
        g->text.n = 0;
        g->text.not_json = false;
        FY_TRY(read_value(g, t, 0, &g->text, true));
        if (g->text.oom) return oom(g);
        rc = fy_table_push_meta(g->tb, (const char *)k, (size_t)klen, g->text.p ? g->text.p : "", g->text.n,
                                g->text.not_json ? FERRY_META_TEXT : FERRY_META_JSON);
    }
    return rc < 0 ? push_failed(g, rc) : 0;
}

static void fmt_ne(char *buf, size_t n, const uint64_t *ne, uint32_t nd)
{
    size_t o = (size_t)snprintf(buf, n, "ne [");
    for (uint32_t i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRIu64, i ? ", " : "", ne[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int read_tensor_info(gg *g, uint32_t align)
{
    const uint8_t *s;
    uint64_t n, at = g->pos + 8;
    FY_TRY(need(g, 8, "the length of the name"));
    n = le(g->buf + g->pos, 8);
    if (n > GGUF_MAX_NAME)
        return fail(g, FERRY_E_CORRUPT, "the name is %" PRIu64 " bytes long (GGUF allows at most %d)", n,
                    GGUF_MAX_NAME);
    FY_TRY(read_string(g, "the name", &s, &n));
    FY_TRY(check_text(g, "the name", s, n, at));
    g->subj_s = s;
    g->subj_len = n;

    FY_TRY(need(g, 4, "n_dims"));
    uint32_t nd = (uint32_t)le(g->buf + g->pos, 4);
    g->pos += 4;
    if (nd > GGUF_MAX_DIMS)
        return fail(g, FERRY_E_CORRUPT, "n_dims is %" PRIu32 " (GGUF allows at most %d)", nd, GGUF_MAX_DIMS);
    FY_TRY(need(g, 8ull * nd, "the dimensions"));
    uint64_t ne[GGUF_MAX_DIMS];
    for (uint32_t i = 0; i < nd; i++) {
        ne[i] = le(g->buf + g->pos + 8ull * i, 8);
        if (ne[i] > INT64_MAX)
            return fail(g, FERRY_E_CORRUPT,
                        "ne[%" PRIu32 "] = %" PRIu64 " is negative as the int64 ggml reads it", i, ne[i]);
    }
    g->pos += 8ull * nd;
    FY_TRY(need(g, 12, "the type and offset"));
    uint32_t gt = (uint32_t)le(g->buf + g->pos, 4);
    uint64_t off = le(g->buf + g->pos + 4, 8);
    g->pos += 12;

    ferry_dtype dt = gt < GGML_NTYPES ? ggml_dtype[gt] : FERRY_DTYPE_INVALID;
    if (dt == FERRY_DTYPE_INVALID) {
        const char *old = ggml_removed(gt);
        if (old)
            return fail(g, FERRY_E_UNSUPPORTED,
                        "ggml type %" PRIu32 " (%s) was removed from GGUF files; not supported", gt, old);
        return fail(g, FERRY_E_UNSUPPORTED,
                    "ggml type %" PRIu32 " is not one ferry knows (newer than ferry?)", gt);
    }
    char sb[160];
    fmt_ne(sb, sizeof sb, ne, nd);
    int block = 1, bbytes = 0;
    ferry_dtype_block(dt, &block, &bbytes);
    uint64_t row = nd ? ne[0] : 1;
    if (row % (uint64_t)block)
        return fail(g, FERRY_E_CORRUPT,
                    "%s of %s: ne[0] = %" PRIu64 " is not a multiple of the %s block (%d elements)", sb,
                    ferry_dtype_name(dt), row, ferry_dtype_name(dt), block);
    uint64_t nelem = 1;
    bool zero = false, ovf = false;
    for (uint32_t i = 0; i < nd; i++) {
        if (ne[i] == 0) zero = true;
        else if (!ovf && fy_mul_ovf(nelem, ne[i], &nelem)) ovf = true;
    }
    /* order-independent: an empty tensor's other dimensions must not overflow either */
    if (ovf) return fail(g, FERRY_E_CORRUPT, "%s has more than 2^64 elements", sb);
    if (zero) nelem = 0;
    uint64_t nbytes;
    if (!fy_dtype_nbytes(dt, nelem, &nbytes))
        return fail(g, FERRY_E_CORRUPT, "%s of %s overflows 64-bit byte size", sb, ferry_dtype_name(dt));
    if (off % align)
        return fail(g, FERRY_E_CORRUPT, "offset %" PRIu64 " is not a multiple of the alignment (%" PRIu32 ")",
                    off, align);

    fy_tensor t = {0};
    t.dtype = dt;
    t.ndim = (int32_t)nd;
    t.offset = off; /* relative until the data section's start is known */
    t.nbytes = nbytes;
    if (nd) {
        t.shape = fy_malloc(g->tb->mem, nd * sizeof(int64_t));
        if (!t.shape) return oom(g);
        for (uint32_t i = 0; i < nd; i++) t.shape[i] = (int64_t)ne[nd - 1 - i]; /* outermost first */
    }
    t.name = fy_strndup(g->tb->mem, (const char *)s, (size_t)n);
    int rc = t.name ? fy_table_push(g->tb, &t) : -ENOMEM;
    if (rc < 0) {
        fy_free(g->tb->mem, t.name);
        fy_free(g->tb->mem, t.shape);
        return push_failed(g, rc);
    }
    return 0;
}

typedef struct rel {
    uint64_t begin, nbytes;
    int64_t idx;
} rel;

static int cmp_rel(const void *a, const void *b)
{
    const rel *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int cmp_str_idx(const void *a, const void *b, void *arg)
{
    char **s = arg;
    int c = strcmp(s[*(const int64_t *)a], s[*(const int64_t *)b]);
    if (c) return c;
    return *(const int64_t *)a < *(const int64_t *)b ? -1 : *(const int64_t *)a > *(const int64_t *)b;
}

/* Strings s[0..n) (keys or names) must be distinct: sorted, neighbours differ.
 * On a repeat, *first and *second get the two (file-order) indices. */
static int find_dup(const ferry_allocator *mem, char **s, int64_t n, int64_t *first, int64_t *second)
{
    *first = *second = -1;
    if (n < 2) return 0;
    int64_t *ix = fy_malloc(mem, (size_t)n * sizeof *ix);
    if (!ix) return -ENOMEM;
    for (int64_t i = 0; i < n; i++) ix[i] = i;
    qsort_r(ix, (size_t)n, sizeof *ix, cmp_str_idx, s);
    for (int64_t i = 1; i < n; i++) {
        if (strcmp(s[ix[i - 1]], s[ix[i]]) == 0 && (*first < 0 || ix[i] < *second)) {
            *first = ix[i - 1];
            *second = ix[i];
        }
    }
    fy_free(mem, ix);
    return 0;
}

static int parse(gg *g)
{
    char q[160], q2[160];
    const uint8_t *b = g->buf;
    if (g->size < 4 || memcmp(b, "GGUF", 4) != 0)
        return fail(g, FERRY_E_CORRUPT, "does not start with the GGUF magic \"GGUF\"");
    if (g->size < 8)
        return fail(g, FERRY_E_CORRUPT, "file is %" PRIu64 " bytes, too short for the %d-byte GGUF header",
                    g->size, GGUF_HEADER);
    uint32_t ver = (uint32_t)le(b + 4, 4);
    if (ver != 2 && ver != 3) {
        uint32_t sw = __builtin_bswap32(ver);
        if ((ver & 0xFFFF) == 0 && sw >= 1 && sw <= 3)
            return fail(g, FERRY_E_UNSUPPORTED,
                        "a big-endian GGUF file (version %" PRIu32
                        " with its bytes swapped): ferry reads little-endian "
                        "GGUF only",
                        sw);
        if (ver == 1)
            return fail(
                g, FERRY_E_UNSUPPORTED,
                "GGUF version 1 is not supported (ferry reads versions 2 and 3; convert the file with a "
                "current llama.cpp)");
        return fail(g, FERRY_E_UNSUPPORTED,
                    "GGUF version %" PRIu32 " is not supported (ferry reads versions 2 and 3)", ver);
    }
    if (g->size < GGUF_HEADER)
        return fail(g, FERRY_E_CORRUPT, "file is %" PRIu64 " bytes, too short for the %d-byte GGUF header",
                    g->size, GGUF_HEADER);
    uint64_t ntensors = le(b + 8, 8), nkv = le(b + 16, 8);
    g->pos = GGUF_HEADER;
    uint64_t rest = left(g);
    if (nkv > rest / GGUF_MIN_KV)
        return fail(g, FERRY_E_CORRUPT,
                    "metadata_kv_count %" PRIu64
                    " is impossible: each key/value takes at least %d bytes and only %" PRIu64
                    " bytes follow the header",
                    nkv, GGUF_MIN_KV, rest);
    if (ntensors > (rest - nkv * GGUF_MIN_KV) / GGUF_MIN_TENSOR)
        return fail(g, FERRY_E_CORRUPT,
                    "tensor_count %" PRIu64
                    " is impossible: each tensor info takes at least %d bytes and only %" PRIu64
                    " bytes follow the header and the key/values' minimum",
                    ntensors, GGUF_MIN_TENSOR, rest - nkv * GGUF_MIN_KV);
    if (g->tb->max_n && ntensors > (uint64_t)(g->tb->max_n - g->tb->n))
        return fail(g, FERRY_E_LIMIT, "tensor_count %" PRIu64 " is over the cap of %" PRId64 " (max_tensors)",
                    ntensors, g->tb->max_n - g->tb->n);

    /* metadata */
    uint32_t align = GGUF_DEFAULT_ALIGN;
    int64_t mbase = g->tb->nmeta;
    g->subj = SUBJ_KV;
    g->count = nkv;
    for (uint64_t i = 0; i < nkv; i++) {
        g->index = i;
        g->subj_s = NULL;
        FY_TRY(read_kv(g, &align));
    }
    g->subj = SUBJ_NONE;
    int64_t d1, d2;
    /* (no pointer arithmetic on a table that is still NULL) */
    char **keys = g->tb->nmeta > mbase ? g->tb->meta_k + mbase : NULL;
    if (find_dup(g->tb->mem, keys, g->tb->nmeta - mbase, &d1, &d2) < 0) return oom(g);
    if (d1 >= 0)
        return fail(g, FERRY_E_CORRUPT,
                    "metadata key %s appears twice (key/values %" PRId64 " and %" PRId64
                    "): keys must be unique",
                    fy_quote(q, sizeof q, keys[d1]), d1 + 1, d2 + 1);

    /* tensor infos */
    int64_t tbase = g->tb->n;
    g->subj = SUBJ_TENSOR;
    g->count = ntensors;
    for (uint64_t i = 0; i < ntensors; i++) {
        g->index = i;
        g->subj_s = NULL;
        FY_TRY(read_tensor_info(g, align));
    }
    g->subj = SUBJ_NONE;
    int64_t nt = g->tb->n - tbase;
    fy_tensor *ts = nt ? g->tb->t + tbase : NULL;

    char **names = fy_malloc(g->tb->mem, (size_t)(nt ? nt : 1) * sizeof *names);
    if (!names) return oom(g);
    for (int64_t i = 0; i < nt; i++) names[i] = ts[i].name;
    int rc = find_dup(g->tb->mem, names, nt, &d1, &d2);
    fy_free(g->tb->mem, names);
    if (rc < 0) return oom(g);
    if (d1 >= 0)
        return fail(g, FERRY_E_CORRUPT,
                    "tensor %s is listed twice (tensor infos %" PRId64 " and %" PRId64
                    "): tensor names must be unique",
                    fy_quote(q, sizeof q, ts[d1].name), d1 + 1, d2 + 1);

    /* the data section starts at the first multiple of the alignment after the header */
    uint64_t hend = g->pos, data_start;
    if (fy_add_ovf(hend, (align - hend % align) % align, &data_start))
        return fail(g, FERRY_E_CORRUPT, "the data section's start overflows 64 bits");
    for (int64_t i = 0; i < nt; i++) {
        uint64_t rel_off = ts[i].offset, abs_off, end;
        if (fy_add_ovf(data_start, rel_off, &abs_off) || fy_add_ovf(abs_off, ts[i].nbytes, &end) ||
            end > g->size)
            return fail(g, FERRY_E_CORRUPT,
                        "tensor %s: %" PRIu64 " bytes at offset %" PRIu64
                        " of the data section (which starts at %" PRIu64
                        ") run past the end of the file (%" PRIu64 " bytes)",
                        fy_quote(q, sizeof q, ts[i].name), ts[i].nbytes, rel_off, data_start, g->size);
    }

    /* no two tensors share a byte (gaps are fine: padding); empty tensors
     * overlap nothing */
    rel *rels = fy_malloc(g->tb->mem, (size_t)(nt ? nt : 1) * sizeof *rels);
    if (!rels) return oom(g);
    for (int64_t i = 0; i < nt; i++) rels[i] = (rel){ts[i].offset, ts[i].nbytes, i};
    qsort(rels, (size_t)nt, sizeof *rels, cmp_rel);
    int64_t last = -1; /* the non-empty tensor reaching furthest so far */
    for (int64_t i = 0; i < nt; i++) {
        const rel *r = &rels[i];
        if (r->nbytes == 0) continue;
        if (last >= 0 && r->begin < rels[last].begin + rels[last].nbytes) {
            const rel *o = &rels[last];
            rc = fail(g, FERRY_E_CORRUPT,
                      "tensor %s: bytes [%" PRIu64 ", %" PRIu64
                      ") of the data section overlap tensor %s [%" PRIu64 ", %" PRIu64 ")",
                      fy_quote(q, sizeof q, ts[r->idx].name), r->begin, r->begin + r->nbytes,
                      fy_quote(q2, sizeof q2, ts[o->idx].name), o->begin, o->begin + o->nbytes);
            fy_free(g->tb->mem, rels);
            return rc;
        }
        if (last < 0 || r->begin + r->nbytes > rels[last].begin + rels[last].nbytes) last = i;
    }
    /* file order, absolute offsets */
    if (nt > 1) {
        fy_tensor *sorted = fy_malloc(g->tb->mem, (size_t)nt * sizeof *sorted);
        if (!sorted) {
            fy_free(g->tb->mem, rels);
            return oom(g);
        }
        for (int64_t i = 0; i < nt; i++) sorted[i] = ts[rels[i].idx];
        memcpy(ts, sorted, (size_t)nt * sizeof *sorted);
        fy_free(g->tb->mem, sorted);
    }
    fy_free(g->tb->mem, rels);
    for (int64_t i = 0; i < nt; i++) ts[i].offset += data_start;
    return 0;
}

int fy_gguf_parse(const char *name, const uint8_t *buf, uint64_t size, fy_table *tb, fy_err *err)
{
    gg g = {.name = name, .buf = buf, .size = size, .tb = tb, .err = err, .text = {.mem = tb->mem}};
    int rc = parse(&g);
    fy_free(tb->mem, g.text.p);
    if (rc < 0) fy_table_free(tb);
    return rc;
}
