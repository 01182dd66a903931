/* convert.c - write any readable checkpoint as a safetensors file, streaming:
 * at most one 8 MiB buffer of tensor data is in memory. The output stays a
 * valid safetensors file (tensors tile the data section); alignment comes from
 * padding the header so the data starts aligned and from putting the tensors
 * whose size is a multiple of the alignment first, so they all start aligned. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "file_impl.h"

#define CHUNK (8u << 20)
#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

/* safetensors knows these dtypes; block-quantized GGUF types it does not. */
static bool st_dtype(ferry_dtype dt) { return dt > FERRY_DTYPE_INVALID && dt <= FERRY_DTYPE_F4; }

typedef struct conv_order {
    const ferry_file *f;
    uint64_t align;
} conv_order;

/* Bytes a tensor takes in the output: a strided view (PyTorch) is gathered
 * into numel x element size, not copied as its span in the storage. */
static uint64_t out_bytes(const fy_tensor *t)
{
    uint64_t numel = 1, nb = t->nbytes;
    if (!t->strides) return nb;
    for (int32_t d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
    fy_dtype_nbytes(t->dtype, numel, &nb);
    return nb;
}

static int cmp_conv(const void *a, const void *b, void *arg)
{
    const conv_order *c = arg;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    const fy_tensor *x = &c->f->tb.t[i], *y = &c->f->tb.t[j];
    bool ax = out_bytes(x) % c->align == 0, ay = out_bytes(y) % c->align == 0;
    if (ax != ay) return ax ? -1 : 1; /* whole multiples first: they all start aligned */
    return i < j ? -1 : i > j;        /* otherwise the source's order */
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Gather a strided tensor's elements in row-major order into out. */
static int gather(const ferry_file *f, const fy_tensor *t, int fd, uint8_t *buf, fy_err *err)
{
    char q[128];
    int bits = ferry_dtype_bits(t->dtype);
    FY_RETURN_IF(bits % 8 != 0 || bits == 0, err, FERRY_E_UNSUPPORTED,
                 "tensor %s: strided %s tensors cannot be converted", Q(q, t->name), ferry_dtype_name(t->dtype));
    size_t es = (size_t)bits / 8, used = 0;
    const uint8_t *base = f->shards[t->shard].map;
    int64_t idx[64] = {0};
    FY_RETURN_IF(t->ndim > 64, err, FERRY_E_UNSUPPORTED, "tensor %s: %d dimensions", Q(q, t->name), t->ndim);
    uint64_t numel = 1;
    for (int32_t d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
    for (uint64_t e = 0; e < numel; e++) {
        int64_t off = 0;
        for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        uint64_t at = t->offset + (uint64_t)off * es;
        FY_RETURN_IF(off < 0 || at + es > f->shards[t->shard].size, err, FERRY_E_CORRUPT,
                     "tensor %s: a strided element lies outside the file", Q(q, t->name));
        memcpy(buf + used, base + at, es);
        used += es;
        if (used + es > CHUNK || e + 1 == numel) {
            int rc = write_all(fd, buf, used);
            if (rc < 0) return rc;
            used = 0;
        }
        for (int32_t d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    return 0;
}

FERRY_API int ferry_file_convert(ferry_ctx *ctx, const ferry_file *f, const char *out_path, uint64_t align,
                                 void (*progress)(void *, uint64_t, uint64_t), void *opaque)
{
    if (!ctx || !f || !out_path) return FERRY_E_INVAL;
    fy_err *err = &ctx->err;
    const ferry_allocator *m = &ctx->mem;
    char q[128];
    if (align == 0) align = 8;
    FY_RETURN_IF(align & (align - 1) || align > (1u << 20), err, FERRY_E_INVAL,
                 "convert: alignment %" PRIu64 " is not a power of two up to 1 MiB", align);
    size_t n = (size_t)f->tb.n;
    for (size_t i = 0; i < n; i++)
        FY_RETURN_IF(!st_dtype(f->tb.t[i].dtype), err, FERRY_E_UNSUPPORTED,
                     "convert: tensor %s is %s, which safetensors has no dtype for", Q(q, f->tb.t[i].name),
                     ferry_dtype_name(f->tb.t[i].dtype));

    int64_t *order = fy_calloc(m, n ? n : 1, sizeof *order);
    uint8_t *buf = fy_malloc(m, CHUNK);
    json_t *hdr = json_object(), *meta = json_object();
    char *text = NULL, *tmp = NULL;
    int fd = -1, rc = 0;
    if (!order || !buf || !hdr || !meta) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) order[i] = (int64_t)i;
    conv_order co = {f, align};
    qsort_r(order, n, sizeof *order, cmp_conv, &co);

    /* the header: __metadata__ (the source's string metadata), then the tensors */
    for (int64_t i = 0; i < f->tb.nmeta; i++) json_object_set_new(meta, f->tb.meta_k[i], json_string(f->tb.meta_v[i]));
    if (json_object_size(meta)) json_object_set(hdr, "__metadata__", meta);
    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        const fy_tensor *t = &f->tb.t[order[k]];
        json_t *shape = json_array();
        for (int32_t d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t nb = out_bytes(t); /* gathered: numel x size */
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", ferry_dtype_name(t->dtype), "shape", shape, "data_offsets",
                              (json_int_t)pos, (json_int_t)(pos + nb));
        if (e && (json_object_get(hdr, t->name) || strcmp(t->name, "__metadata__") == 0)) {
            json_decref(e);
            rc = fy_seterr(err, FERRY_E_CORRUPT, "convert: tensor name %s appears twice or is reserved", Q(q, t->name));
            goto out;
        }
        if (!e || json_object_set_new(hdr, t->name, e) < 0) {
            rc = fy_seterr(err, -ENOMEM, "convert: out of memory");
            goto out;
        }
        pos += nb;
    }
    text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory");
        goto out;
    }
    size_t tl = strlen(text);
    uint64_t hl = tl + ((align - (8 + tl) % align) % align); /* pad: the data starts aligned */

    /* write beside the target, then rename: never a half-written OUT */
    size_t pl = strlen(out_path);
    tmp = fy_malloc(m, pl + 16);
    if (!tmp) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory");
        goto out;
    }
    snprintf(tmp, pl + 16, "%s.tmp-XXXXXX", out_path);
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        fy_seterr(err, rc, "%s: cannot create a file beside it: %s", out_path, ferry_strerror(rc));
        goto out;
    }
    fchmod(fd, 0644); /* mkostemp made it 0600 */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hl >> (8 * i));
    memset(buf, ' ', (size_t)(hl - tl));
    if ((rc = write_all(fd, len8, 8)) < 0 || (rc = write_all(fd, text, tl)) < 0 ||
        (rc = write_all(fd, buf, (size_t)(hl - tl))) < 0)
        goto werr;
    uint64_t done = 0;
    for (size_t k = 0; k < n; k++) {
        const fy_tensor *t = &f->tb.t[order[k]];
        if (t->strides) {
            if ((rc = gather(f, t, fd, buf, err)) < 0) goto fail_keep_msg;
        } else {
            for (uint64_t off = 0; off < t->nbytes;) {
                size_t len = t->nbytes - off > CHUNK ? CHUNK : (size_t)(t->nbytes - off);
                if ((rc = ferry_file_tensor_read(f, order[k], off, buf, len)) < 0) {
                    char msg[FY_ERRMSG_MAX];
                    fy_err_copy(&f->ctx->err, msg, sizeof msg);
                    fy_seterr(err, rc, "%s", msg);
                    goto fail_keep_msg;
                }
                if ((rc = write_all(fd, buf, len)) < 0) goto werr;
                off += len;
            }
        }
        done += t->nbytes;
        if (progress) progress(opaque, done, f->total);
    }
    if (fsync(fd) < 0) {
        rc = -errno;
        goto werr;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, out_path) < 0) {
        rc = -errno;
        fy_seterr(err, rc, "%s: rename: %s", out_path, ferry_strerror(rc));
        unlink(tmp);
        goto out;
    }
    rc = 0;
    goto out;
werr:
    fy_seterr(err, rc, "%s: writing: %s (nothing was written to it)", out_path, ferry_strerror(rc));
fail_keep_msg:
    if (fd >= 0) close(fd);
    fd = -1;
    unlink(tmp);
out:
    if (fd >= 0) close(fd);
    free(text);
    fy_free(m, tmp);
    json_decref(meta);
    json_decref(hdr);
    fy_free(m, buf);
    fy_free(m, order);
    return rc;
}
