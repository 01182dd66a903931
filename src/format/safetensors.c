/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors.c - a strict safetensors header reader.
 *
 * Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (an
 * object, possibly padded at the end with spaces), then the data section.
 * Everything is validated before a table is returned: dtypes, shapes, byte
 * counts, bounds, and that the tensors tile the data section exactly. */
#include "format.h"
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

int fy_st_header_len(const uint8_t p[8], uint64_t file_size, const char *name, uint64_t *hlen, fy_err *err)
{
    uint64_t n = 0;
    FY_RETURN_IF(file_size < 8, err, FERRY_E_CORRUPT,
                 "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length", name, file_size);
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    FY_RETURN_IF(n == 0, err, FERRY_E_CORRUPT, "%s: header length is 0 (the header must hold a JSON object)",
                 name);
    FY_RETURN_IF(n > FY_ST_MAX_HEADER, err, FERRY_E_LIMIT,
                 "%s: header length %" PRIu64 " exceeds the 100 MB limit (is this a safetensors file?)", name,
                 n);
    FY_RETURN_IF(n > file_size - 8, err, FERRY_E_CORRUPT,
                 "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", name, n,
                 file_size);
    *hlen = n;
    return 0;
}

/* A non-negative JSON integer at h[v], or false. */
static bool get_u64(const uint8_t *h, size_t v, uint64_t *out)
{
    int64_t x;
    if (!fy_json_int(h, v, &x) || x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

/* Whether the key with raw contents h[b..e) decodes to want (at most 63 bytes). */
static bool key_is(const uint8_t *h, size_t b, size_t e, bool esc, const char *want)
{
    size_t wl = strlen(want);
    if (!esc) return e - b == wl && memcmp(h + b, want, wl) == 0;
    char buf[6 * 64 + 1]; /* the longest escaped spelling of 64 characters */
    if (e - b >= sizeof buf) return false;
    return fy_json_decode(h, b, e, buf) == wl && memcmp(buf, want, wl) == 0;
}

/* A buffer for decoded strings, grown as needed. */
typedef struct scratch {
    char *p;
    size_t cap;
} scratch;

/* The string whose raw contents are h[b..e), decoded into s; NULL: no memory. */
static char *decode_into(const ferry_allocator *m, scratch *s, const uint8_t *h, size_t b, size_t e,
                         size_t *len)
{
    if (s->cap < e - b + 1) {
        char *np = fy_realloc(m, s->p, e - b + 1);
        if (!np) return NULL;
        s->p = np;
        s->cap = e - b + 1;
    }
    *len = fy_json_decode(h, b, e, s->p);
    return s->p;
}

static void fmt_shape(char *buf, size_t n, const int64_t *shape, int32_t ndim)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int32_t i = 0; i < ndim && o < n; i++) {
        if (o + 32 >= n) {
            snprintf(buf + o, n - o, "...");
            o = n;
            break;
        }
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    }
    if (o < n) snprintf(buf + o, n - o, "]");
}

typedef struct rel {
    uint64_t begin, end;
    int64_t idx;
} rel;

static int cmp_rel(const void *a, const void *b)
{
    const rel *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

#define MAX_DIMS 1024

/* Validate one tensor entry, the value at h[v]; fills t (but name and shape)
 * and shape[MAX_DIMS]. The checks and their order are those of the entry as a
 * whole: its three fields present, then each one's type, then the numbers. */
static int parse_tensor(const char *name, const char *key, const uint8_t *h, size_t v, uint64_t data_len,
                        const ferry_allocator *mem, fy_tensor *t, int64_t *shape, uint64_t *begin,
                        uint64_t *end, fy_err *err)
{
    char qn[128], sb[256];
    Q(qn, key);
    FY_RETURN_IF(h[v] != '{', err, FERRY_E_CORRUPT,
                 "%s: tensor %s: entry is not an object with dtype, shape and data_offsets", name, qn);
    size_t jd = 0, js = 0, jo = 0; /* where each value starts; 0: absent (no value starts at 0) */
    for (size_t m = fy_json_enter(h, v); m;) {
        size_t kb, ke;
        bool esc;
        size_t val = fy_json_member(h, m, &kb, &ke, &esc);
        if (key_is(h, kb, ke, esc, "dtype")) jd = val;
        else if (key_is(h, kb, ke, esc, "shape")) js = val;
        else if (key_is(h, kb, ke, esc, "data_offsets")) jo = val;
        m = fy_json_next(h, fy_json_skip(h, val));
    }
    FY_RETURN_IF(!jd, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"dtype\"", name, qn);
    FY_RETURN_IF(!js, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"shape\"", name, qn);
    FY_RETURN_IF(!jo, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"data_offsets\"", name, qn);
    FY_RETURN_IF(h[jd] != '"', err, FERRY_E_CORRUPT, "%s: tensor %s: dtype is not a string", name, qn);
    {
        size_t db, de, dlen;
        bool esc;
        fy_json_string(h, jd, &db, &de, &esc);
        scratch ds = {0};
        const char *dname = decode_into(mem, &ds, h, db, de, &dlen);
        if (!dname) return fy_seterr(err, -ENOMEM, "%s: out of memory", name);
        t->dtype = fy_dtype_parse(dname);
        if (t->dtype == FERRY_DTYPE_INVALID) {
            char qd[64];
            int rc =
                fy_seterr(err, FERRY_E_CORRUPT, "%s: tensor %s: unknown dtype %s", name, qn, Q(qd, dname));
            fy_free(mem, ds.p);
            return rc;
        }
        fy_free(mem, ds.p);
    }
    FY_RETURN_IF(h[js] != '[', err, FERRY_E_CORRUPT, "%s: tensor %s: shape is not an array of integers", name,
                 qn);
    size_t nd = 0;
    for (size_t e = fy_json_enter(h, js); e; e = fy_json_next(h, fy_json_skip(h, e))) nd++;
    FY_RETURN_IF(nd > MAX_DIMS, err, FERRY_E_CORRUPT, "%s: tensor %s: shape has %zu dimensions (limit %d)",
                 name, qn, nd, MAX_DIMS);
    size_t o0 = h[jo] == '[' ? fy_json_enter(h, jo) : 0;
    size_t o1 = o0 ? fy_json_next(h, fy_json_skip(h, o0)) : 0;
    FY_RETURN_IF(!o1 || fy_json_next(h, fy_json_skip(h, o1)), err, FERRY_E_CORRUPT,
                 "%s: tensor %s: data_offsets is not a [begin, end] pair of integers", name, qn);
    FY_RETURN_IF(!get_u64(h, o0, begin) || !get_u64(h, o1, end), err, FERRY_E_CORRUPT,
                 "%s: tensor %s: data_offsets must be non-negative integers", name, qn);
    uint64_t nelem = 1;
    bool ovf = false;
    size_t e = fy_json_enter(h, js);
    for (size_t i = 0; i < nd; i++, e = fy_json_next(h, fy_json_skip(h, e))) {
        uint64_t d;
        FY_RETURN_IF(!get_u64(h, e, &d), err, FERRY_E_CORRUPT,
                     "%s: tensor %s: shape[%zu] is not a non-negative integer", name, qn, i);
        shape[i] = (int64_t)d;
        if (!ovf && fy_mul_ovf(nelem, d, &nelem)) ovf = true;
    }
    fmt_shape(sb, sizeof sb, shape, (int32_t)nd);
    FY_RETURN_IF(ovf, err, FERRY_E_CORRUPT, "%s: tensor %s: shape %s has more than 2^64 elements", name, qn,
                 sb);
    uint64_t nbytes;
    if (!fy_dtype_nbytes(t->dtype, nelem, &nbytes)) {
        uint64_t bits;
        if (ferry_dtype_bits(t->dtype) % 8 == 0 ||
            fy_mul_ovf(nelem, (uint64_t)ferry_dtype_bits(t->dtype), &bits))
            return fy_seterr(err, FERRY_E_CORRUPT, "%s: tensor %s: shape %s of %s overflows 64-bit byte size",
                             name, qn, sb, ferry_dtype_name(t->dtype));
        return fy_seterr(err, FERRY_E_CORRUPT,
                         "%s: tensor %s: shape %s of %s is %" PRIu64 " bits, not a whole number of bytes",
                         name, qn, sb, ferry_dtype_name(t->dtype), bits);
    }
    FY_RETURN_IF(*end < *begin, err, FERRY_E_CORRUPT,
                 "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", name, qn,
                 *begin, *end);
    FY_RETURN_IF(*end > data_len, err, FERRY_E_CORRUPT,
                 "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                 "] run past the end of the data (%" PRIu64 " bytes)",
                 name, qn, *begin, *end, data_len);
    FY_RETURN_IF(*end - *begin != nbytes, err, FERRY_E_CORRUPT,
                 "%s: tensor %s: shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                 ", %" PRIu64 "] hold %" PRIu64,
                 name, qn, sb, ferry_dtype_name(t->dtype), nbytes, *begin, *end, *end - *begin);
    t->ndim = (int32_t)nd;
    t->nbytes = nbytes;
    return 0;
}

int fy_st_parse(const char *name, const uint8_t *hdr, uint64_t hlen, uint64_t file_size, int32_t shard,
                fy_table *tb, fy_err *err)
{
    char qn[128];
    size_t bad;
    const uint64_t data_start = 8 + hlen;
    const uint64_t data_len = file_size - data_start;
    const ferry_allocator *mem = tb->mem;

    FY_RETURN_IF(hdr[0] != '{', err, FERRY_E_CORRUPT,
                 "%s: header does not start with '{' (byte 0x%02x): not a safetensors file", name, hdr[0]);
    if (!fy_utf8_valid((const char *)hdr, (size_t)hlen, &bad))
        return fy_seterr(err, FERRY_E_CORRUPT,
                         "%s: header is not valid UTF-8 (byte 0x%02x at header offset %zu)", name, hdr[bad],
                         bad);

    /* The whole header is checked first (as a parser building a tree would),
     * then walked in place, filling the table directly. */
    fy_json_info ji;
    int rc = fy_json_check(hdr, (size_t)hlen, "__metadata__", mem, &ji);
    if (rc == -ENOMEM) return fy_seterr(err, rc, "%s: out of memory parsing the header", name);
    if (rc == FERRY_E_LIMIT) return fy_seterr(err, rc, "%s: header: %s", name, ji.why);
    if (rc < 0 && ji.duplicate)
        return fy_seterr(err, FERRY_E_CORRUPT,
                         "%s: header names a key twice (%s): tensor names must be unique", name,
                         Q(qn, ji.key));
    if (rc < 0)
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: header is not valid JSON: %s (header offset %zu)", name,
                         ji.why, ji.at);
    for (size_t i = ji.end; i < hlen; i++)
        FY_RETURN_IF(
            hdr[i] != ' ', err, FERRY_E_CORRUPT,
            "%s: header has byte 0x%02x at offset %zu after the JSON object (only spaces may pad it)", name,
            hdr[i], i);
    FY_RETURN_IF(tb->max_n && ji.nkeys > (uint64_t)(tb->max_n - tb->n), err, FERRY_E_LIMIT,
                 "%s: header holds %" PRIu64 " tensors, over the cap of %" PRId64 " (max_tensors)", name,
                 ji.nkeys, tb->max_n - tb->n);
    if ((rc = fy_table_reserve(tb, (int64_t)ji.nkeys)) == FERRY_E_LIMIT)
        return fy_seterr(err, rc,
                         "%s: the header and a table of its %" PRIu64
                         " tensors would take more than the cap of %" PRIu64 " bytes (max_header_bytes)",
                         name, ji.nkeys, tb->max_bytes);
    if (rc < 0) return fy_table_fail(tb, rc, name, err);

    rel *rels = fy_calloc(mem, ji.nkeys ? (size_t)ji.nkeys : 1, sizeof *rels);
    if (!rels) return fy_seterr(err, -ENOMEM, "%s: out of memory", name);
    int64_t shape[MAX_DIMS];
    scratch mk = {0}, mv = {0};
    int64_t base = tb->n;
    size_t nrel = 0;
    rc = 0;
    for (size_t m = fy_json_enter(hdr, 0), v = 0; m; m = fy_json_next(hdr, fy_json_skip(hdr, v))) {
        size_t kb, ke;
        bool esc;
        v = fy_json_member(hdr, m, &kb, &ke, &esc);
        if (key_is(hdr, kb, ke, esc, "__metadata__")) {
            if (hdr[v] != '{') {
                rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: __metadata__ is not an object of strings", name);
                goto out;
            }
            for (size_t e = fy_json_enter(hdr, v), ev = 0; e; e = fy_json_next(hdr, fy_json_skip(hdr, ev))) {
                size_t mkb, mke, mvb, mve, mklen, mvlen;
                ev = fy_json_member(hdr, e, &mkb, &mke, &esc);
                const char *k = decode_into(mem, &mk, hdr, mkb, mke, &mklen);
                if (!k) {
                    rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                    goto out;
                }
                if (hdr[ev] != '"') {
                    rc = fy_seterr(
                        err, FERRY_E_CORRUPT,
                        "%s: __metadata__ key %s: value is not a string (only string -> string is allowed)",
                        name, Q(qn, k));
                    goto out;
                }
                fy_json_string(hdr, ev, &mvb, &mve, &esc);
                const char *val = decode_into(mem, &mv, hdr, mvb, mve, &mvlen);
                if (!val) {
                    rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                    goto out;
                }
                if ((rc = fy_table_push_meta(tb, k, mklen, val, mvlen, FERRY_META_TEXT)) < 0) {
                    fy_table_fail(tb, rc, name, err);
                    goto out;
                }
            }
            continue;
        }
        fy_tensor t = {0};
        uint64_t begin = 0, end = 0;
        t.name = fy_malloc(mem, ke - kb + 1);
        if (!t.name) {
            rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
            goto out;
        }
        fy_json_decode(hdr, kb, ke, t.name);
        if ((rc = parse_tensor(name, t.name, hdr, v, data_len, mem, &t, shape, &begin, &end, err)) < 0) {
            fy_free(mem, t.name);
            goto out;
        }
        if (t.ndim) {
            t.shape = fy_malloc(mem, (size_t)t.ndim * sizeof(int64_t));
            if (!t.shape) {
                fy_free(mem, t.name);
                rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                goto out;
            }
            memcpy(t.shape, shape, (size_t)t.ndim * sizeof(int64_t));
        }
        t.offset = data_start + begin;
        t.shard = shard;
        if ((rc = fy_table_push(tb, &t)) < 0) {
            fy_free(mem, t.name);
            fy_free(mem, t.shape);
            fy_table_fail(tb, rc, name, err);
            goto out;
        }
        rels[nrel].begin = begin;
        rels[nrel].end = end;
        rels[nrel].idx = tb->n - 1;
        nrel++;
    }
    /* The tensors must tile [0, data_len) exactly: sorted by offset, each one
     * starts where the previous ended, and the last ends at the end of the file. */
    qsort(rels, nrel, sizeof *rels, cmp_rel);
    uint64_t pos = 0;
    for (size_t i = 0; i < nrel; i++) {
        const char *tn = tb->t[rels[i].idx].name;
        if (rels[i].begin < pos) {
            char q2[128];
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                           "] overlap tensor %s [%" PRIu64 ", %" PRIu64 "]",
                           name, Q(qn, tn), rels[i].begin, rels[i].end, Q(q2, tb->t[rels[i - 1].idx].name),
                           rels[i - 1].begin, rels[i - 1].end);
            goto out;
        }
        if (rels[i].begin > pos) {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] leave a gap of %" PRIu64
                           " bytes before them (tensors must tile the data section)",
                           name, Q(qn, tn), rels[i].begin, rels[i].end, rels[i].begin - pos);
            goto out;
        }
        pos = rels[i].end;
    }
    if (pos != data_len) {
        rc = fy_seterr(err, FERRY_E_CORRUPT,
                       "%s: the data section holds %" PRIu64
                       " bytes after the last tensor (tensors must tile it exactly; %" PRIu64 " of %" PRIu64
                       " bytes used)",
                       name, data_len - pos, pos, data_len);
        goto out;
    }
    /* Order this file's tensors by their position in the file: position k
     * takes the tensor at rels[k].idx, moved in place cycle by cycle (a copy
     * of the table would be the largest allocation of the parse). */
    for (size_t k = 0; k < nrel; k++) {
        if (rels[k].idx < 0) continue;
        fy_tensor first = tb->t[base + (int64_t)k];
        size_t j = k;
        for (;;) {
            size_t from = (size_t)(rels[j].idx - base);
            rels[j].idx = -1;
            if (from == k) {
                tb->t[base + (int64_t)j] = first;
                break;
            }
            tb->t[base + (int64_t)j] = tb->t[base + (int64_t)from];
            j = from;
        }
    }
    rc = 0;
out:
    fy_free(mem, rels);
    fy_free(mem, mk.p);
    fy_free(mem, mv.p);
    if (rc < 0) fy_table_free(tb);
    return rc;
}

int fy_st_parse_buffer(const char *name, const uint8_t *buf, size_t n, fy_table *tb, fy_err *err)
{
    uint64_t hlen = 0;
    FY_TRY(fy_st_header_len(buf, n, name, &hlen, err));
    return fy_st_parse(name, buf + 8, hlen, n, 0, tb, err);
}
