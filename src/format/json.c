/* SPDX-License-Identifier: Apache-2.0 */
/* json.c - the strict JSON checker and in-place cursor of json.h. */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}
static bool is_alpha(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at p[i..i+4) within n, or -1. */
static int32_t hex4(const uint8_t *p, size_t n, size_t i)
{
    if (n < 4 || i > n - 4) return -1;
    int32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p[i + k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* ---- the checker ---- */

/* The keys of one open object: open addressing, each slot (offset of the key's
 * opening quote + 1) << 32 | its hash; 0 is empty. */
typedef struct keyset {
    uint64_t *slot;
    uint32_t cap, n;
} keyset;

typedef struct checker {
    const uint8_t *p;
    size_t n;
    const ferry_allocator *mem;
    fy_json_info *info;
    uint64_t seed;
    keyset *sets; /* one per object nesting level, grown on demand */
    size_t nsets;
    char *scratch[2]; /* decoded keys, for hashing and comparing escaped ones */
    size_t scratch_cap[2];
} checker;

static int fault(checker *c, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fault(checker *c, size_t at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->info->why, sizeof c->info->why, fmt, ap);
    va_end(ap);
    c->info->at = at;
    return FERRY_E_CORRUPT;
}

/* A string at c->p[*pi] == '"': checked, *pi moved past it. */
static int check_string(checker *c, size_t *pi, bool *esc)
{
    const uint8_t *p = c->p;
    size_t i = *pi + 1, n = c->n;
    *esc = false;
    for (;;) {
        if (i >= n) return fault(c, *pi, "unterminated string");
        uint8_t ch = p[i];
        if (ch == '"') break;
        if (ch < 0x20) return fault(c, i, "control character 0x%02x in a string", ch);
        if (ch != '\\') {
            i++;
            continue;
        }
        *esc = true;
        if (i + 1 >= n) return fault(c, i, "unterminated string");
        uint8_t e = p[i + 1];
        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            i += 2;
            continue;
        }
        if (e != 'u') return fault(c, i, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
        int32_t v = hex4(p, n, i + 2);
        if (v < 0) return fault(c, i, "invalid \\u escape");
        if (v == 0) return fault(c, i, "\\u0000 is not allowed");
        if (v >= 0xDC00 && v <= 0xDFFF) return fault(c, i, "lone low surrogate \\u%04X", (unsigned)v);
        if (v >= 0xD800 && v <= 0xDBFF) {
            int32_t w = (i + 7 < n && p[i + 6] == '\\' && p[i + 7] == 'u') ? hex4(p, n, i + 8) : -1;
            if (w < 0xDC00 || w > 0xDFFF)
                return fault(c, i, "high surrogate \\u%04X without a low one", (unsigned)v);
            i += 12;
        } else {
            i += 6;
        }
    }
    *pi = i + 1;
    return 0;
}

/* Whether the real number p[b..e) (checked grammar) is too large for a double,
 * the way strtod sees it (jansson refuses those). The digits are handed to
 * strtod as "DIGITSe<exp>", without a decimal point, so the locale cannot
 * change the answer; past 800 significant digits (more than the 768 that can
 * decide a double's rounding) the rest is kept as one sticky nonzero digit. */
static bool real_overflows(const uint8_t *p, size_t b, size_t e)
{
    enum { KEEP = 800 };
    char buf[KEEP + 32];
    size_t nd = 0, i = b;
    int64_t x = 0;
    bool nonzero = false, sticky = false;
    if (p[i] == '-') i++;
    for (; i < e && is_digit(p[i]); i++) {
        if (!nonzero && p[i] == '0') continue;
        nonzero = true;
        if (nd < KEEP) buf[nd++] = (char)p[i];
        else x++, sticky |= p[i] != '0';
    }
    if (i < e && p[i] == '.') {
        for (i++; i < e && is_digit(p[i]); i++) {
            if (!nonzero && p[i] == '0') {
                x--;
                continue;
            }
            nonzero = true;
            if (nd < KEEP) buf[nd++] = (char)p[i], x--;
            else sticky |= p[i] != '0';
        }
    }
    int64_t ev = 0;
    if (i < e && (p[i] == 'e' || p[i] == 'E')) {
        bool neg = false;
        i++;
        if (p[i] == '+' || p[i] == '-') neg = p[i++] == '-';
        for (; i < e && is_digit(p[i]); i++)
            if (ev < 1000000000) ev = ev * 10 + (p[i] - '0');
        if (neg) ev = -ev;
    }
    if (!nonzero) return false; /* zero */
    if (sticky) buf[nd++] = '1', x--;
    int64_t ex = x + ev; /* |x| <= 100 M digits, |ev| <= 10^10 */
    if (ex > 2000000000) ex = 2000000000;
    if (ex < -2000000000) ex = -2000000000;
    snprintf(buf + nd, sizeof buf - nd, "e%" PRId64, ex);
    double d = strtod(buf, NULL);
    return isinf(d);
}

static int check_number(checker *c, size_t *pi)
{
    const uint8_t *p = c->p;
    size_t b = *pi, i = b, n = c->n;
    bool neg = false, real = false;
    if (p[i] == '-') neg = true, i++;
    if (i >= n || !is_digit(p[i])) return fault(c, b, "invalid number");
    if (p[i] == '0') {
        i++;
        if (i < n && is_digit(p[i])) return fault(c, b, "invalid number (leading zero)");
    } else {
        while (i < n && is_digit(p[i])) i++;
    }
    size_t int_end = i;
    if (i < n && p[i] == '.') {
        real = true;
        i++;
        if (i >= n || !is_digit(p[i])) return fault(c, b, "invalid number");
        while (i < n && is_digit(p[i])) i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        real = true;
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) i++;
        if (i >= n || !is_digit(p[i])) return fault(c, b, "invalid number");
        while (i < n && is_digit(p[i])) i++;
    }
    if (real) {
        if (real_overflows(p, b, i)) return fault(c, b, "real number overflow");
    } else {
        /* int64_t: at most 2^63 - 1, or 2^63 when negative */
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (size_t k = b + neg; k < int_end; k++) {
            uint64_t d = (uint64_t)(p[k] - '0');
            if (v > (lim - d) / 10) return fault(c, b, "integer out of range (int64)");
            v = v * 10 + d;
        }
    }
    *pi = i;
    return 0;
}

static uint64_t hash_bytes(const uint8_t *s, size_t n, uint64_t seed)
{
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull);
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

/* The decoded bytes of the key whose raw contents are p[b..e): the raw bytes
 * themselves without escapes, else decoded into scratch k. NULL: no memory. */
static const uint8_t *key_bytes(checker *c, int k, size_t b, size_t e, bool esc, size_t *len)
{
    if (!esc) {
        *len = e - b;
        return c->p + b;
    }
    if (c->scratch_cap[k] < e - b + 1) {
        char *s = fy_realloc(c->mem, c->scratch[k], e - b + 1);
        if (!s) return NULL;
        c->scratch[k] = s;
        c->scratch_cap[k] = e - b + 1;
    }
    *len = fy_json_decode(c->p, b, e, c->scratch[k]);
    return (const uint8_t *)c->scratch[k];
}

static int set_grow(checker *c, keyset *s)
{
    uint32_t cap = s->cap ? s->cap * 2 : 16;
    uint64_t *ns = fy_calloc(c->mem, cap, sizeof *ns);
    if (!ns) return -ENOMEM;
    for (uint32_t k = 0; k < s->cap; k++) {
        if (!s->slot[k]) continue;
        uint32_t j = (uint32_t)s->slot[k] & (cap - 1);
        while (ns[j]) j = (j + 1) & (cap - 1);
        ns[j] = s->slot[k];
    }
    fy_free(c->mem, s->slot);
    s->slot = ns;
    s->cap = cap;
    return 0;
}

/* Add the key at c->p[q] (its opening quote, raw contents [b, e)) to the set
 * of nesting level lvl; FERRY_E_CORRUPT if the object has it already. */
static int add_key(checker *c, size_t lvl, size_t q, size_t b, size_t e, bool esc)
{
    keyset *s = &c->sets[lvl];
    if ((uint64_t)(s->n + 1) * 4 > (uint64_t)s->cap * 3) {
        if (s->cap >= (1u << 31)) {
            snprintf(c->info->why, sizeof c->info->why, "more than 2^31 keys in one object");
            return FERRY_E_LIMIT;
        }
        if (set_grow(c, s) < 0) return -ENOMEM;
    }
    size_t len;
    const uint8_t *kb = key_bytes(c, 0, b, e, esc, &len);
    if (!kb) return -ENOMEM;
    uint32_t h = (uint32_t)hash_bytes(kb, len, c->seed);
    uint32_t j = h & (s->cap - 1);
    for (; s->slot[j]; j = (j + 1) & (s->cap - 1)) {
        if ((uint32_t)s->slot[j] != h) continue;
        size_t ob, oe, olen;
        bool oesc;
        fy_json_string(c->p, (size_t)(s->slot[j] >> 32) - 1, &ob, &oe, &oesc);
        const uint8_t *other = key_bytes(c, 1, ob, oe, oesc, &olen);
        if (!other) return -ENOMEM;
        if (olen == len && memcmp(other, kb, len) == 0) {
            size_t m = len < sizeof c->info->key - 1 ? len : sizeof c->info->key - 1;
            while (m < len && m > 0 && (kb[m] & 0xC0) == 0x80) m--; /* whole characters only */
            memcpy(c->info->key, kb, m);
            c->info->key[m] = '\0';
            c->info->duplicate = true;
            return fault(c, q, "duplicate object key");
        }
    }
    s->slot[j] = ((uint64_t)(q + 1) << 32) | h;
    s->n++;
    return 0;
}

/* An object opens at nesting level lvl (1 = outermost): its set, empty. */
static int open_set(checker *c, size_t lvl)
{
    if (lvl >= c->nsets) {
        size_t nn = c->nsets ? c->nsets * 2 : 8;
        while (nn <= lvl) nn *= 2;
        keyset *ns = fy_realloc(c->mem, c->sets, nn * sizeof *ns);
        if (!ns) return -ENOMEM;
        memset(ns + c->nsets, 0, (nn - c->nsets) * sizeof *ns);
        c->sets = ns;
        c->nsets = nn;
    }
    keyset *s = &c->sets[lvl];
    if (s->cap) memset(s->slot, 0, (size_t)s->cap * sizeof *s->slot);
    s->n = 0;
    return 0;
}

/* An object closes: a set much larger than what it held is given back, so that
 * clearing it for the next object at this level costs no more than the keys
 * that made it grow. */
static void close_set(checker *c, size_t lvl)
{
    keyset *s = &c->sets[lvl];
    if (s->cap > 16 && (uint64_t)s->n * 4 < s->cap) {
        fy_free(c->mem, s->slot);
        s->slot = NULL;
        s->cap = 0;
    }
}

/* kinds[lvl]: '{' or '[' for the open containers; depth: how many are open. */
static int check_doc(checker *c, const char *skip_key)
{
    const uint8_t *p = c->p;
    const size_t n = c->n;
    size_t skip_len = skip_key ? strlen(skip_key) : 0;
    uint8_t *kinds = fy_malloc(c->mem, FY_JSON_MAX_DEPTH + 1);
    if (!kinds) return -ENOMEM;
    size_t depth = 0, i = 0;
    int rc = 0;
    bool esc;
#define FAIL(expr)                       \
    do {                                 \
        if ((rc = (expr)) < 0) goto out; \
    } while (0)
    for (;;) {
        /* a value at nesting level depth + 1 */
        if (depth + 1 > FY_JSON_MAX_DEPTH) FAIL(fault(c, i, "nesting deeper than %d", FY_JSON_MAX_DEPTH));
        while (i < n && is_ws(p[i])) i++;
        if (i >= n) FAIL(fault(c, i, "unexpected end of input"));
        uint8_t ch = p[i];
        if (ch == '{' || ch == '[') {
            i++;
            kinds[++depth] = ch;
            if (ch == '{') FAIL(open_set(c, depth));
            while (i < n && is_ws(p[i])) i++;
            if (i < n && p[i] == (ch == '{' ? '}' : ']')) {
                i++;
                if (ch == '{') close_set(c, depth);
                depth--;
                goto after;
            }
            if (ch == '{') goto key;
            continue;
        }
        if (ch == '"') {
            FAIL(check_string(c, &i, &esc));
        } else if (ch == '-' || is_digit(ch)) {
            FAIL(check_number(c, &i));
        } else if (is_alpha(ch)) {
            size_t b = i;
            while (i < n && is_alpha(p[i])) i++;
            size_t l = i - b;
            if (!((l == 4 && memcmp(p + b, "true", 4) == 0) || (l == 5 && memcmp(p + b, "false", 5) == 0) ||
                  (l == 4 && memcmp(p + b, "null", 4) == 0)))
                FAIL(fault(c, b, "invalid token"));
        } else {
            FAIL(fault(c, i, "invalid token"));
        }
    after:
        if (depth == 0) break;
        while (i < n && is_ws(p[i])) i++;
        if (i >= n) FAIL(fault(c, i, "unexpected end of input"));
        if (kinds[depth] == '[') {
            if (p[i] == ',') {
                i++;
                continue;
            }
            if (p[i] != ']') FAIL(fault(c, i, "']' expected"));
            i++;
            depth--;
            goto after;
        }
        if (p[i] == '}') {
            i++;
            close_set(c, depth);
            depth--;
            goto after;
        }
        if (p[i] != ',') FAIL(fault(c, i, "'}' expected"));
        i++;
        while (i < n && is_ws(p[i])) i++;
    key:
        if (i >= n || p[i] != '"') FAIL(fault(c, i, "string or '}' expected"));
        {
            size_t q = i, b, e;
            FAIL(check_string(c, &i, &esc));
            fy_json_string(p, q, &b, &e, &esc);
            FAIL(add_key(c, depth, q, b, e, esc));
            if (depth == 1) {
                size_t len;
                const uint8_t *kb = key_bytes(c, 0, b, e, esc, &len);
                if (!kb) FAIL(-ENOMEM);
                if (skip_key && len == skip_len && memcmp(kb, skip_key, len) == 0) c->info->has_skip = true;
                else c->info->nkeys++;
            }
        }
        while (i < n && is_ws(p[i])) i++;
        if (i >= n || p[i] != ':') FAIL(fault(c, i, "':' expected"));
        i++;
    }
#undef FAIL
    c->info->end = i;
out:
    fy_free(c->mem, kinds);
    return rc;
}

int fy_json_check(const uint8_t *p, size_t n, const char *skip_key, const ferry_allocator *mem,
                  fy_json_info *info)
{
    memset(info, 0, sizeof *info);
    if (n >= UINT32_MAX) {
        snprintf(info->why, sizeof info->why, "document of 4 GiB or more");
        return FERRY_E_LIMIT;
    }
    checker c = {.p = p, .n = n, .mem = mem, .info = info};
    /* Keys are hashed with a seed an input cannot know in advance (where this
     * frame lives), so a file cannot be built to collide them all. */
    uint64_t where = (uint64_t)(uintptr_t)&c;
    c.seed = hash_bytes((const uint8_t *)&where, sizeof where, 0x2545F4914F6CDD1Dull);
    if (n == 0 || (p[0] != '{' && p[0] != '[')) {
        snprintf(info->why, sizeof info->why, "'[' or '{' expected");
        return FERRY_E_CORRUPT;
    }
    int rc = check_doc(&c, skip_key);
    for (size_t k = 0; k < c.nsets; k++) fy_free(mem, c.sets[k].slot);
    fy_free(mem, c.sets);
    fy_free(mem, c.scratch[0]);
    fy_free(mem, c.scratch[1]);
    return rc;
}

/* ---- the cursor over checked text ---- */

size_t fy_json_ws(const uint8_t *p, size_t i)
{
    while (is_ws(p[i])) i++;
    return i;
}

size_t fy_json_string(const uint8_t *p, size_t i, size_t *b, size_t *e, bool *esc)
{
    *b = ++i;
    *esc = false;
    while (p[i] != '"') {
        if (p[i] == '\\') *esc = true, i += 2;
        else i++;
    }
    *e = i;
    return i + 1;
}

size_t fy_json_skip(const uint8_t *p, size_t i)
{
    size_t b, e;
    bool esc;
    if (p[i] == '"') return fy_json_string(p, i, &b, &e, &esc);
    if (p[i] != '{' && p[i] != '[') {
        while (is_digit(p[i]) || is_alpha(p[i]) || p[i] == '-' || p[i] == '+' || p[i] == '.') i++;
        return i;
    }
    size_t depth = 0;
    for (;;) {
        uint8_t ch = p[i];
        if (ch == '"') {
            i = fy_json_string(p, i, &b, &e, &esc);
            continue;
        }
        if (ch == '{' || ch == '[') depth++;
        else if ((ch == '}' || ch == ']') && --depth == 0) return i + 1;
        i++;
    }
}

static size_t put_utf8(char *o, uint32_t v)
{
    if (v < 0x80) {
        o[0] = (char)v;
        return 1;
    }
    if (v < 0x800) {
        o[0] = (char)(0xC0 | (v >> 6));
        o[1] = (char)(0x80 | (v & 0x3F));
        return 2;
    }
    if (v < 0x10000) {
        o[0] = (char)(0xE0 | (v >> 12));
        o[1] = (char)(0x80 | ((v >> 6) & 0x3F));
        o[2] = (char)(0x80 | (v & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (v >> 18));
    o[1] = (char)(0x80 | ((v >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((v >> 6) & 0x3F));
    o[3] = (char)(0x80 | (v & 0x3F));
    return 4;
}

size_t fy_json_decode(const uint8_t *p, size_t b, size_t e, char *out)
{
    size_t o = 0;
    for (size_t i = b; i < e;) {
        if (p[i] != '\\') {
            out[o++] = (char)p[i++];
            continue;
        }
        uint8_t x = p[i + 1];
        i += 2;
        switch (x) {
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            uint32_t v = (uint32_t)hex4(p, e, i);
            i += 4;
            if (v >= 0xD800 && v <= 0xDBFF) { /* checked: a low surrogate follows */
                uint32_t w = (uint32_t)hex4(p, e, i + 2);
                i += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
            }
            o += put_utf8(out + o, v);
            break;
        }
        default: out[o++] = (char)x; break; /* " \ / */
        }
    }
    out[o] = '\0';
    return o;
}

size_t fy_json_enter(const uint8_t *p, size_t i)
{
    i = fy_json_ws(p, i + 1);
    return p[i] == '}' || p[i] == ']' ? 0 : i;
}

size_t fy_json_next(const uint8_t *p, size_t after_value)
{
    size_t i = fy_json_ws(p, after_value);
    return p[i] == ',' ? fy_json_ws(p, i + 1) : 0;
}

size_t fy_json_member(const uint8_t *p, size_t i, size_t *kb, size_t *ke, bool *esc)
{
    i = fy_json_ws(p, fy_json_string(p, i, kb, ke, esc));
    return fy_json_ws(p, i + 1); /* past ':' */
}

bool fy_json_int(const uint8_t *p, size_t i, int64_t *v)
{
    bool neg = p[i] == '-';
    size_t k = i + neg;
    if (!is_digit(p[k])) return false;
    uint64_t m = 0;
    for (; is_digit(p[k]); k++) m = m * 10 + (uint64_t)(p[k] - '0');
    if (p[k] == '.' || p[k] == 'e' || p[k] == 'E') return false;
    /* range checked: m <= 2^63 when negative, else < 2^63 */
    *v = neg ? (int64_t)(0 - m) : (int64_t)m;
    return true;
}
