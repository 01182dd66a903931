/* safetensors.c - a strict safetensors header reader.
 *
 * Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (an
 * object, possibly padded at the end with spaces), then the data section.
 * Everything is validated before a table is returned: dtypes, shapes, byte
 * counts, bounds, and that the tensors tile the data section exactly. */
#include "format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

int fy_st_header_len(const uint8_t p[8], uint64_t file_size, const char *name, uint64_t *hlen,
                     fy_err *err)
{
    uint64_t n = 0;
    FY_RETURN_IF(file_size < 8, err, FERRY_E_CORRUPT,
                 "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length", name,
                 file_size);
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    FY_RETURN_IF(n == 0, err, FERRY_E_CORRUPT, "%s: header length is 0 (the header must hold a JSON object)",
                 name);
    FY_RETURN_IF(n > FY_ST_MAX_HEADER, err, FERRY_E_LIMIT,
                 "%s: header length %" PRIu64 " exceeds the 100 MB limit (is this a safetensors file?)",
                 name, n);
    FY_RETURN_IF(n > file_size - 8, err, FERRY_E_CORRUPT,
                 "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", name,
                 n, file_size);
    *hlen = n;
    return 0;
}

/* A non-negative JSON integer, or false. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

static void fmt_shape(char *buf, size_t n, const int64_t *shape, int32_t ndim)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int32_t i = 0; i < ndim && o < n; i++) {
        if (o + 32 >= n) { snprintf(buf + o, n - o, "..."); o = n; break; }
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

/* Validate one tensor entry; fills t (but name and shape) and shape[MAX_DIMS]. */
static int parse_tensor(const char *name, const char *key, json_t *v, uint64_t data_len,
                        fy_tensor *t, int64_t *shape, uint64_t *begin, uint64_t *end, fy_err *err)
{
    char qn[128], sb[256];
    Q(qn, key);
    FY_RETURN_IF(!json_is_object(v), err, FERRY_E_CORRUPT,
                 "%s: tensor %s: entry is not an object with dtype, shape and data_offsets", name, qn);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    FY_RETURN_IF(!jd, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"dtype\"", name, qn);
    FY_RETURN_IF(!js, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"shape\"", name, qn);
    FY_RETURN_IF(!jo, err, FERRY_E_CORRUPT, "%s: tensor %s: missing \"data_offsets\"", name, qn);
    FY_RETURN_IF(!json_is_string(jd), err, FERRY_E_CORRUPT, "%s: tensor %s: dtype is not a string",
                 name, qn);
    t->dtype = fy_dtype_parse(json_string_value(jd));
    if (t->dtype == FERRY_DTYPE_INVALID) {
        char qd[64];
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: tensor %s: unknown dtype %s", name, qn,
                         Q(qd, json_string_value(jd)));
    }
    FY_RETURN_IF(!json_is_array(js), err, FERRY_E_CORRUPT,
                 "%s: tensor %s: shape is not an array of integers", name, qn);
    size_t nd = json_array_size(js);
    FY_RETURN_IF(nd > MAX_DIMS, err, FERRY_E_CORRUPT, "%s: tensor %s: shape has %zu dimensions (limit %d)",
                 name, qn, nd, MAX_DIMS);
    FY_RETURN_IF(!json_is_array(jo) || json_array_size(jo) != 2, err, FERRY_E_CORRUPT,
                 "%s: tensor %s: data_offsets is not a [begin, end] pair of integers", name, qn);
    FY_RETURN_IF(!get_u64(json_array_get(jo, 0), begin) || !get_u64(json_array_get(jo, 1), end), err,
                 FERRY_E_CORRUPT, "%s: tensor %s: data_offsets must be non-negative integers", name, qn);
    uint64_t nelem = 1;
    bool ovf = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        FY_RETURN_IF(!get_u64(json_array_get(js, i), &d), err, FERRY_E_CORRUPT,
                     "%s: tensor %s: shape[%zu] is not a non-negative integer", name, qn, i);
        shape[i] = (int64_t)d;
        if (!ovf && fy_mul_ovf(nelem, d, &nelem)) ovf = true;
    }
    fmt_shape(sb, sizeof sb, shape, (int32_t)nd);
    FY_RETURN_IF(ovf, err, FERRY_E_CORRUPT, "%s: tensor %s: shape %s has more than 2^64 elements",
                 name, qn, sb);
    uint64_t nbytes;
    if (!fy_dtype_nbytes(t->dtype, nelem, &nbytes)) {
        uint64_t bits;
        if (ferry_dtype_bits(t->dtype) % 8 == 0 || fy_mul_ovf(nelem, (uint64_t)ferry_dtype_bits(t->dtype), &bits))
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
                 "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the data (%" PRIu64
                 " bytes)",
                 name, qn, *begin, *end, data_len);
    FY_RETURN_IF(*end - *begin != nbytes, err, FERRY_E_CORRUPT,
                 "%s: tensor %s: shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64 ", %" PRIu64
                 "] hold %" PRIu64,
                 name, qn, sb, ferry_dtype_name(t->dtype), nbytes, *begin, *end, *end - *begin);
    t->ndim = (int32_t)nd;
    t->nbytes = nbytes;
    return 0;
}

int fy_st_parse(const char *name, const uint8_t *hdr, uint64_t hlen, uint64_t file_size,
                int32_t shard, fy_table *tb, fy_err *err)
{
    char qn[128];
    size_t bad;
    const uint64_t data_start = 8 + hlen;
    const uint64_t data_len = file_size - data_start;

    FY_RETURN_IF(hdr[0] != '{', err, FERRY_E_CORRUPT,
                 "%s: header does not start with '{' (byte 0x%02x): not a safetensors file", name, hdr[0]);
    if (!fy_utf8_valid((const char *)hdr, (size_t)hlen, &bad))
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: header is not valid UTF-8 (byte 0x%02x at header offset %zu)",
                         name, hdr[bad], bad);

    json_error_t je;
    json_t *root = json_loadb((const char *)hdr, (size_t)hlen,
                              JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key) {
            /* jansson says: duplicate object key near '"name"' */
            const char *near = strstr(je.text, "near '");
            int len = near ? (int)strlen(near + 6) : 0;
            if (len && near[6 + len - 1] == '\'') len--;
            return fy_seterr(err, FERRY_E_CORRUPT, "%s: header names a key twice (%.*s): tensor names must be unique",
                             name, near ? len : (int)strlen(je.text), near ? near + 6 : je.text);
        }
        if (json_error_code(&je) == json_error_out_of_memory) return fy_seterr(err, -ENOMEM, "%s: out of memory parsing the header", name);
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: header is not valid JSON: %s (header offset %d)", name,
                         je.text, je.position);
    }
    int rc = 0;
    rel *rels = NULL;
    int64_t shape[MAX_DIMS];
    size_t end_json = (size_t)je.position;
    for (size_t i = end_json; i < hlen; i++) {
        if (hdr[i] != ' ') {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: header has byte 0x%02x at offset %zu after the JSON object (only spaces may pad it)",
                           name, hdr[i], i);
            goto out;
        }
    }
    if (!json_is_object(root)) {
        rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: header is not a JSON object", name);
        goto out;
    }

    size_t nkeys = json_object_size(root);
    rels = fy_calloc(tb->mem, nkeys ? nkeys : 1, sizeof *rels);
    if (!rels) { rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name); goto out; }
    int64_t base = tb->n;
    size_t nrel = 0;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(root, key, klen, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: __metadata__ is not an object of strings", name);
                goto out;
            }
            const char *mk;
            size_t mklen;
            json_t *mv;
            json_object_keylen_foreach(v, mk, mklen, mv) {
                if (!json_is_string(mv)) {
                    rc = fy_seterr(err, FERRY_E_CORRUPT,
                                   "%s: __metadata__ key %s: value is not a string (only string -> string is allowed)",
                                   name, Q(qn, mk));
                    goto out;
                }
                if ((rc = fy_table_push_meta(tb, mk, mklen, json_string_value(mv), json_string_length(mv))) < 0) {
                    fy_seterr(err, rc, "%s: out of memory", name);
                    goto out;
                }
            }
            continue;
        }
        fy_tensor t = {0};
        uint64_t begin = 0, end = 0;
        if ((rc = parse_tensor(name, key, v, data_len, &t, shape, &begin, &end, err)) < 0) goto out;
        if (t.ndim) {
            t.shape = fy_malloc(tb->mem, (size_t)t.ndim * sizeof(int64_t));
            if (!t.shape) { rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name); goto out; }
            memcpy(t.shape, shape, (size_t)t.ndim * sizeof(int64_t));
        }
        t.name = fy_strndup(tb->mem, key, klen);
        t.offset = data_start + begin;
        t.shard = shard;
        if (!t.name || (rc = fy_table_push(tb, &t)) < 0) {
            fy_free(tb->mem, t.name);
            fy_free(tb->mem, t.shape);
            rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
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
                           "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor %s [%" PRIu64 ", %" PRIu64 "]",
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
                       "%s: the data section holds %" PRIu64 " bytes after the last tensor (tensors must tile it exactly; %" PRIu64
                       " of %" PRIu64 " bytes used)",
                       name, data_len - pos, pos, data_len);
        goto out;
    }
    /* Order this file's tensors by their position in the file. */
    if (nrel > 1) {
        fy_tensor *sorted = fy_malloc(tb->mem, nrel * sizeof *sorted);
        if (!sorted) { rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name); goto out; }
        for (size_t i = 0; i < nrel; i++) sorted[i] = tb->t[rels[i].idx];
        memcpy(tb->t + base, sorted, nrel * sizeof *sorted);
        fy_free(tb->mem, sorted);
    }
    rc = 0;
out:
    fy_free(tb->mem, rels);
    json_decref(root);
    if (rc < 0) fy_table_free(tb);
    return rc;
}

int fy_st_parse_buffer(const char *name, const uint8_t *buf, size_t n, fy_table *tb, fy_err *err)
{
    uint64_t hlen = 0;
    FY_TRY(fy_st_header_len(buf, n, name, &hlen, err));
    return fy_st_parse(name, buf + 8, hlen, n, 0, tb, err);
}
