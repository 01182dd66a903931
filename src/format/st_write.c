/* SPDX-License-Identifier: Apache-2.0 */
/* st_write.c - the safetensors writer's layout, in memory: which tensor goes
 * where and the header that says so (file/convert.c streams the bytes). The
 * output stays a valid safetensors file (tensors tile the data section);
 * alignment comes from padding the header so the data starts aligned and from
 * putting the tensors whose size is a multiple of the alignment first, so
 * they all start aligned. */
#define _GNU_SOURCE /* qsort_r */
#include "format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

bool fy_st_dtype_ok(ferry_dtype dt)
{
    return dt > FERRY_DTYPE_INVALID && dt <= FERRY_DTYPE_F4;
}

uint64_t fy_st_out_bytes(const fy_tensor *t, ferry_dtype to)
{
    ferry_dtype dt = fy_cast_out_dtype(t->dtype, to);
    uint64_t numel = 1, nb = t->nbytes;
    if (!t->strides && dt == t->dtype) return nb;
    for (int32_t d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
    fy_dtype_nbytes(dt, numel, &nb);
    return nb;
}

typedef struct out_order {
    const fy_table *tb;
    uint64_t align;
    ferry_dtype to;
} out_order;

static int cmp_out(const void *a, const void *b, void *arg)
{
    const out_order *c = arg;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    const fy_tensor *x = &c->tb->t[i], *y = &c->tb->t[j];
    bool ax = fy_st_out_bytes(x, c->to) % c->align == 0, ay = fy_st_out_bytes(y, c->to) % c->align == 0;
    if (ax != ay) return ax ? -1 : 1; /* whole multiples first: they all start aligned */
    return i < j ? -1 : i > j;        /* otherwise the source's order */
}

/* The JSON text of the header for tb laid out in order (*tl bytes, from mem). */
static int header_json(const fy_table *tb, const int64_t *order, ferry_dtype to, const ferry_allocator *mem,
                       char **text, size_t *tl, fy_err *err)
{
    char q[128];
    json_t *hdr = json_object(), *meta = json_object();
    int rc = 0;
    if (!hdr || !meta) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory building the header (a JSON object)");
        goto out;
    }
    /* __metadata__ (the source's string metadata), then the tensors */
    for (int64_t i = 0; i < tb->nmeta; i++)
        json_object_set_new(meta, tb->meta_k[i], json_string(tb->meta_v[i]));
    if (json_object_size(meta)) json_object_set(hdr, "__metadata__", meta);
    uint64_t pos = 0;
    for (int64_t k = 0; k < tb->n; k++) {
        const fy_tensor *t = &tb->t[order[k]];
        json_t *shape = json_array();
        for (int32_t d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t nb = fy_st_out_bytes(t, to); /* gathered, cast: numel x size */
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", ferry_dtype_name(fy_cast_out_dtype(t->dtype, to)),
                              "shape", shape, "data_offsets", (json_int_t)pos, (json_int_t)(pos + nb));
        if (e && (json_object_get(hdr, t->name) || strcmp(t->name, "__metadata__") == 0)) {
            json_decref(e);
            rc = fy_seterr(err, FERRY_E_CORRUPT, "convert: tensor name %s appears twice or is reserved",
                           Q(q, t->name));
            goto out;
        }
        if (!e || json_object_set_new(hdr, t->name, e) < 0) {
            rc = fy_seterr(err, -ENOMEM, "convert: out of memory building the header (a tensor's entry)");
            goto out;
        }
        pos += nb;
    }
    *text = fy_json_text(mem, hdr, JSON_COMPACT | JSON_PRESERVE_ORDER, tl);
    if (!*text) rc = fy_seterr(err, -ENOMEM, "convert: out of memory for the header's text");
out:
    json_decref(meta);
    json_decref(hdr);
    return rc;
}

int fy_st_layout(const fy_table *tb, uint64_t align, ferry_dtype to, const ferry_allocator *mem,
                 fy_st_out *out, fy_err *err)
{
    char q[128];
    memset(out, 0, sizeof *out);
    if (align == 0) align = 8;
    FY_RETURN_IF(align & (align - 1) || align > (1u << 20), err, FERRY_E_INVAL,
                 "convert: alignment %" PRIu64 " is not a power of two up to 1 MiB", align);
    FY_RETURN_IF(to != FERRY_DTYPE_INVALID && !fy_cast_target_ok(to), err, FERRY_E_INVAL,
                 "convert: cannot cast to %s (F16, BF16 or F32 only)", ferry_dtype_name(to));
    size_t n = (size_t)tb->n;
    for (size_t i = 0; i < n; i++)
        FY_RETURN_IF(!fy_st_dtype_ok(tb->t[i].dtype), err, FERRY_E_UNSUPPORTED,
                     "convert: tensor %s is %s, which safetensors has no dtype for", Q(q, tb->t[i].name),
                     ferry_dtype_name(tb->t[i].dtype));

    out->order = fy_calloc(mem, n ? n : 1, sizeof *out->order);
    if (!out->order) return fy_seterr(err, -ENOMEM, "convert: out of memory for the order of the tensors");
    for (size_t i = 0; i < n; i++) out->order[i] = (int64_t)i;
    out_order oo = {tb, align, to};
    qsort_r(out->order, n, sizeof *out->order, cmp_out, &oo);

    char *text = NULL;
    size_t tl = 0;
    int rc = header_json(tb, out->order, to, mem, &text, &tl, err);
    if (rc == 0) {
        uint64_t hl = tl + ((align - (8 + tl) % align) % align); /* pad: the data starts aligned */
        out->hdr = fy_malloc(mem, (size_t)(8 + hl));
        if (!out->hdr) {
            rc = fy_seterr(err, -ENOMEM, "convert: out of memory for the %" PRIu64 "-byte header", 8 + hl);
        } else {
            for (int i = 0; i < 8; i++) out->hdr[i] = (uint8_t)(hl >> (8 * i));
            memcpy(out->hdr + 8, text, tl);
            memset(out->hdr + 8 + tl, ' ', (size_t)(hl - tl));
            out->hdr_len = (size_t)(8 + hl);
        }
    }
    fy_free(mem, text);
    if (rc < 0) fy_st_layout_free(out, mem);
    return rc;
}

void fy_st_layout_free(fy_st_out *out, const ferry_allocator *mem)
{
    if (!out) return;
    fy_free(mem, out->order);
    fy_free(mem, out->hdr);
    memset(out, 0, sizeof *out);
}
