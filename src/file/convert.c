/* SPDX-License-Identifier: Apache-2.0 */
/* convert.c - write any readable checkpoint as a safetensors file, streaming:
 * at most one 8 MiB buffer of tensor data is in memory. The layout and the
 * header come from format/st_write.c; this file moves the bytes, through io/,
 * into a file beside the target that is renamed over it only when complete. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "format/format.h"
#include "io/io.h"
#include "file_impl.h"

#define CHUNK (8u << 20)
#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

static int write_failed(fy_err *err, const char *out_path, int rc)
{
    return fy_seterr(err, rc, "%s: writing: %s (nothing was written to it)", out_path, ferry_strerror(rc));
}

/* Where a tensor's bytes go: straight to fd, or cast into cbuf first (whole
 * elements each time: chunks are multiples of 8 bytes, gathers of elements). */
typedef struct sink {
    int fd;
    ferry_dtype from, to; /* equal: no cast */
    uint8_t *cbuf;        /* 2 x CHUNK: a cast at most doubles the size (F16 to F32) */
} sink;

static int emit(const sink *s, const uint8_t *buf, size_t len)
{
    if (s->from == s->to) return fy_write_full(s->fd, buf, len);
    size_t n = len / (size_t)(ferry_dtype_bits(s->from) / 8);
    int rc = fy_cast(s->from, s->to, buf, s->cbuf, n);
    return rc < 0 ? rc : fy_write_full(s->fd, s->cbuf, n * (size_t)(ferry_dtype_bits(s->to) / 8));
}

/* Gather a strided tensor's elements in row-major order into the output. */
static int gather(const ferry_file *f, const fy_tensor *t, const sink *sk, const char *out_path, uint8_t *buf,
                  fy_err *err)
{
    char q[128];
    int bits = ferry_dtype_bits(t->dtype);
    FY_RETURN_IF(bits % 8 != 0 || bits == 0, err, FERRY_E_UNSUPPORTED,
                 "tensor %s: strided %s tensors cannot be converted", Q(q, t->name),
                 ferry_dtype_name(t->dtype));
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
            int rc = emit(sk, buf, used);
            if (rc < 0) return write_failed(err, out_path, rc);
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
    ferry_convert_opts o = {.size = sizeof o, .align = align};
    return ferry_file_convert_with(ctx, f, out_path, &o, progress, opaque);
}

FERRY_API int ferry_file_convert_with(ferry_ctx *ctx, const ferry_file *f, const char *out_path,
                                      const ferry_convert_opts *opts,
                                      void (*progress)(void *, uint64_t, uint64_t), void *opaque)
{
    if (!ctx || !f || !out_path) return FERRY_E_INVAL;
    fy_err *err = &ctx->err;
    const ferry_allocator *m = &ctx->mem;
    ferry_convert_opts o = {.size = sizeof o};
    FY_TRY(fy_struct_in(&o, sizeof o, opts, err, "ferry_file_convert_with"));
    fy_st_out lay;
    FY_TRY(fy_st_layout(&f->tb, o.align, o.dtype, m, &lay, err));
    size_t n = (size_t)f->tb.n;
    bool casts = false;
    for (size_t i = 0; i < n; i++) casts |= fy_cast_out_dtype(f->tb.t[i].dtype, o.dtype) != f->tb.t[i].dtype;
    uint8_t *buf = fy_malloc(m, CHUNK), *cbuf = casts ? fy_malloc(m, 2 * (size_t)CHUNK) : NULL;
    char *tmp = NULL;
    int fd = -1, rc = 0;
    if (!buf || (casts && !cbuf)) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory for the %u-byte copy buffers", (unsigned)CHUNK);
        goto out;
    }

    /* write beside the target, then rename: never a half-written OUT */
    size_t pl = strlen(out_path);
    tmp = fy_malloc(m, pl + 16);
    if (!tmp) {
        rc = fy_seterr(err, -ENOMEM, "convert: out of memory for the temporary name beside %s", out_path);
        goto out;
    }
    snprintf(tmp, pl + 16, "%s.tmp-XXXXXX", out_path);
    if ((rc = fy_mkstemp(tmp, &fd)) < 0) {
        fy_seterr(err, rc, "%s: cannot create a file beside it: %s", out_path, ferry_strerror(rc));
        goto out;
    }
    (void)fy_fchmod(fd, 0644); /* mkostemp made it 0600 */
    if ((rc = fy_write_full(fd, lay.hdr, lay.hdr_len)) < 0) goto werr;
    uint64_t done = 0;
    for (size_t k = 0; k < n; k++) {
        const fy_tensor *t = &f->tb.t[lay.order[k]];
        sink sk = {fd, t->dtype, fy_cast_out_dtype(t->dtype, o.dtype), cbuf};
        if (t->strides) {
            if ((rc = gather(f, t, &sk, out_path, buf, err)) < 0) goto fail_keep_msg;
        } else {
            for (uint64_t off = 0; off < t->nbytes;) {
                size_t len = t->nbytes - off > CHUNK ? CHUNK : (size_t)(t->nbytes - off);
                if ((rc = ferry_file_tensor_read(f, lay.order[k], off, buf, len)) < 0) {
                    char msg[FY_ERRMSG_MAX];
                    fy_err_copy(&f->ctx->err, msg, sizeof msg);
                    fy_seterr(err, rc, "%s", msg);
                    goto fail_keep_msg;
                }
                if ((rc = emit(&sk, buf, len)) < 0) goto werr;
                off += len;
            }
        }
        done += t->nbytes;
        if (progress) progress(opaque, done, f->total);
    }
    if ((rc = fy_fsync(fd)) < 0) goto werr;
    fy_close(fd);
    fd = -1;
    if ((rc = fy_rename(tmp, out_path)) < 0) {
        fy_seterr(err, rc, "%s: rename: %s", out_path, ferry_strerror(rc));
        (void)fy_unlink(tmp);
        goto out;
    }
    rc = 0;
    goto out;
werr:
    write_failed(err, out_path, rc);
fail_keep_msg:
    fy_close(fd);
    fd = -1;
    (void)fy_unlink(tmp);
out:
    fy_close(fd);
    fy_free(m, tmp);
    fy_free(m, cbuf);
    fy_free(m, buf);
    fy_st_layout_free(&lay, m);
    return rc;
}
