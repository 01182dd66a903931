/* SPDX-License-Identifier: Apache-2.0 */
/* file.c - ferry_file: a checkpoint (one file or a set of shards) opened as a
 * validated tensor table over read-only MAP_SHARED mappings. Glue between
 * format/ (what the bytes mean) and io/ (getting them). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/common.h"
#include "format/format.h"
#include "io/io.h"

#include "file_impl.h"

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

FERRY_API const char *ferry_format_name(ferry_format fmt)
{
    switch (fmt) {
    case FERRY_FORMAT_SAFETENSORS: return "safetensors";
    case FERRY_FORMAT_SAFETENSORS_INDEX: return "safetensors-index";
    case FERRY_FORMAT_GGUF: return "gguf";
    case FERRY_FORMAT_PYTORCH: return "pytorch";
    default: return "unknown";
    }
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Open, parse and map one checkpoint file into sh and tb; *fmt says which
 * format it was (safetensors unless GGUF or PyTorch zip magic is found). */
static int open_st(ferry_ctx *ctx, const char *path, int32_t idx, shard *sh, fy_table *tb, ferry_format *fmt)
{
    uint8_t prefix[8] = {0};
    uint64_t hlen = 0;
    fy_err *err = &ctx->err;
    FY_TRY(fy_open_ro(path, &sh->fd, &sh->size, err));
    if (sh->size >= 8) {
        int rc = fy_pread_full(sh->fd, prefix, 8, 0);
        if (rc < 0) return fy_seterr(err, rc, "%s: reading the header: %s", path, ferry_strerror(rc));
        int (*parse)(const char *, const uint8_t *, uint64_t, fy_table *, fy_err *) = NULL;
        if (memcmp(prefix, "GGUF", 4) == 0) parse = fy_gguf_parse, *fmt = FERRY_FORMAT_GGUF;
        else if (memcmp(prefix, "PK\x03\x04", 4) == 0) parse = fy_pt_parse, *fmt = FERRY_FORMAT_PYTORCH;
        else if (prefix[0] == 0x80 && prefix[1] <= 5 && prefix[2] == 0x8a)
            return fy_seterr(
                err, FERRY_E_UNSUPPORTED,
                "%s: a legacy (pre-1.6, non-zip) PyTorch checkpoint: not supported; re-save it with "
                "torch.save in a current PyTorch",
                path);
        if (parse) {
            /* these formats are parsed from the mapping: only the header pages are touched */
            rc = fy_map_ro(sh->fd, sh->size, &sh->map);
            if (rc < 0) return fy_seterr(err, rc, "%s: mmap: %s", path, ferry_strerror(rc));
            rc = parse(path, sh->map, sh->size, tb, err);
            for (int64_t i = 0; rc == 0 && i < tb->n; i++) tb->t[i].shard = idx;
            return rc;
        }
    }
    int rc = fy_st_header_len(prefix, sh->size, path, &hlen, err);
    if (rc < 0) {
        /* no '{' after the 8-byte length: not a safetensors file at all */
        uint8_t brace = 0;
        if (sh->size > 8 && fy_pread_full(sh->fd, &brace, 1, 8) == 0 && brace != '{') rc = FERRY_E_FORMAT;
        return rc;
    }
    /* the header buffer counts against max_header_bytes while it lives */
    FY_RETURN_IF(fy_table_charge(tb, hlen) < 0, err, FERRY_E_LIMIT,
                 "%s: header is %" PRIu64 " bytes, over the cap of %" PRIu64 " (max_header_bytes)", path,
                 hlen, tb->max_bytes);
    uint8_t *hdr = fy_malloc(&ctx->mem, (size_t)hlen);
    if (!hdr) {
        fy_table_uncharge(tb, hlen);
        return fy_seterr(err, -ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", path, hlen);
    }
    rc = fy_pread_full(sh->fd, hdr, (size_t)hlen, 8);
    if (rc < 0) {
        fy_free(&ctx->mem, hdr);
        fy_table_uncharge(tb, hlen);
        return fy_seterr(err, rc, "%s: reading the header: %s", path, ferry_strerror(rc));
    }
    rc = fy_st_parse(path, hdr, hlen, sh->size, idx, tb, err);
    bool brace = hdr[0] == '{';
    fy_free(&ctx->mem, hdr);
    if (rc == 0) fy_table_uncharge(tb, hlen); /* (a failed parse left the table empty, uncharged) */
    if (rc < 0) return brace ? rc : FERRY_E_FORMAT;
    rc = fy_map_ro(sh->fd, sh->size, &sh->map);
    if (rc < 0) return fy_seterr(err, rc, "%s: mmap: %s", path, ferry_strerror(rc));
    return 0;
}

static int cmp_name_idx(const void *a, const void *b, void *arg)
{
    const fy_table *tb = arg;
    return strcmp(tb->t[*(const int64_t *)a].name, tb->t[*(const int64_t *)b].name);
}

static int build_name_index(ferry_file *f)
{
    fy_err *err = &f->ctx->err;
    f->by_name = fy_calloc(&f->ctx->mem, (size_t)(f->tb.n ? f->tb.n : 1), sizeof(int64_t));
    if (!f->by_name)
        return fy_seterr(err, -ENOMEM, "%s: out of memory for the name index of %" PRId64 " tensors",
                         f->shards[0].path, f->tb.n);
    for (int64_t i = 0; i < f->tb.n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->tb.n, sizeof(int64_t), cmp_name_idx, &f->tb);
    for (int64_t i = 1; i < f->tb.n; i++) {
        const fy_tensor *a = &f->tb.t[f->by_name[i - 1]], *b = &f->tb.t[f->by_name[i]];
        if (strcmp(a->name, b->name) == 0) {
            char q[128];
            return fy_seterr(err, FERRY_E_CORRUPT, "%s: tensor %s is also in %s: tensor names must be unique",
                             f->shards[b->shard].path, Q(q, b->name), f->shards[a->shard].path);
        }
    }
    return 0;
}

static char *join_dir(const ferry_allocator *m, const char *index_path, const char *rel)
{
    const char *slash = strrchr(index_path, '/');
    size_t dlen = slash ? (size_t)(slash - index_path) + 1 : 0;
    size_t rlen = strlen(rel);
    char *p = fy_malloc(m, dlen + rlen + 1);
    if (!p) return NULL;
    memcpy(p, index_path, dlen);
    memcpy(p + dlen, rel, rlen + 1);
    return p;
}

static int cmp_str(const void *a, const void *b, void *arg)
{
    const fy_index *ix = arg;
    return strcmp(ix->names[*(const int64_t *)a], ix->names[*(const int64_t *)b]);
}

/* Every tensor the shards hold must be listed in weight_map under its shard, and
 * every entry of weight_map must exist: a merge of the two name-sorted lists. */
static int check_index(ferry_file *f, const char *path, const fy_index *ix)
{
    fy_err *err = &f->ctx->err;
    char q[128];
    int64_t *order = fy_calloc(&f->ctx->mem, (size_t)ix->n, sizeof(int64_t));
    if (!order)
        return fy_seterr(err, -ENOMEM, "%s: out of memory checking %" PRId64 " weight_map entries", path,
                         ix->n);
    for (int64_t i = 0; i < ix->n; i++) order[i] = i;
    qsort_r(order, (size_t)ix->n, sizeof(int64_t), cmp_str, (void *)ix);
    int64_t i = 0, j = 0;
    int rc = 0;
    while (rc == 0 && (i < ix->n || j < f->tb.n)) {
        const char *in = i < ix->n ? ix->names[order[i]] : NULL;
        const fy_tensor *t = j < f->tb.n ? &f->tb.t[f->by_name[j]] : NULL;
        int c = !in ? 1 : !t ? -1 : strcmp(in, t->name);
        if (c < 0) {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: weight_map lists tensor %s in %s, which does not hold it", path, Q(q, in),
                           f->shards[ix->shard_of[order[i]]].path);
        } else if (c > 0) {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: shard %s holds tensor %s, which weight_map does not list", path,
                           f->shards[t->shard].path, Q(q, t->name));
        } else {
            if (ix->shard_of[order[i]] != t->shard)
                rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: weight_map puts tensor %s in %s, but it is in %s",
                               path, Q(q, in), f->shards[ix->shard_of[order[i]]].path,
                               f->shards[t->shard].path);
            i++;
            j++;
        }
    }
    fy_free(&f->ctx->mem, order);
    return rc;
}

static int open_index(ferry_file *f, const char *path)
{
    ferry_ctx *ctx = f->ctx;
    fy_err *err = &ctx->err;
    int fd = -1;
    uint64_t size;
    fy_index ix = {.mem = &ctx->mem};
    FY_TRY(fy_open_ro(path, &fd, &size, err));
    int rc;
    if (size > FY_ST_MAX_HEADER) {
        fy_close(fd);
        return fy_seterr(err, FERRY_E_LIMIT, "%s: index file is %" PRIu64 " bytes (limit 100 MB)", path,
                         size);
    }
    if (fy_table_charge(&f->tb, size) < 0) {
        fy_close(fd);
        return fy_seterr(err, FERRY_E_LIMIT,
                         "%s: index file is %" PRIu64 " bytes, over the cap of %" PRIu64
                         " (max_header_bytes)",
                         path, size, f->tb.max_bytes);
    }
    uint8_t *buf = fy_malloc(&ctx->mem, (size_t)size);
    if (!buf) {
        fy_close(fd);
        return fy_seterr(err, -ENOMEM, "%s: out of memory", path);
    }
    rc = fy_pread_full(fd, buf, (size_t)size, 0);
    fy_close(fd);
    if (rc < 0) {
        fy_free(&ctx->mem, buf);
        return fy_seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
    rc = fy_index_parse(path, buf, (size_t)size, &ix, &f->tb, err);
    fy_free(&ctx->mem, buf);
    fy_table_uncharge(&f->tb, size);
    if (rc < 0) return rc;

    f->shards = fy_calloc(&ctx->mem, (size_t)ix.nfiles, sizeof(shard));
    if (!f->shards) {
        rc = fy_seterr(err, -ENOMEM, "%s: out of memory for %d shards", path, (int)ix.nfiles);
        goto out;
    }
    for (int32_t s = 0; s < ix.nfiles; s++) {
        f->shards[s].fd = -1;
        f->nshards++;
        f->shards[s].path = join_dir(&ctx->mem, path, ix.files[s]);
        if (!f->shards[s].path) {
            rc = fy_seterr(err, -ENOMEM, "%s: out of memory for the path of shard %d", path, (int)s);
            goto out;
        }
        fy_table part;
        fy_table_init(&part, &ctx->mem);
        part.max_bytes = f->tb.max_bytes; /* each shard on its own; the whole below, as they join */
        part.max_n = f->tb.max_n;
        ferry_format sf = FERRY_FORMAT_SAFETENSORS;
        rc = open_st(ctx, f->shards[s].path, s, &f->shards[s], &part, &sf);
        if (rc == 0 && sf != FERRY_FORMAT_SAFETENSORS)
            rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: shard %s is %s, not safetensors", path,
                           f->shards[s].path, ferry_format_name(sf));
        if (rc < 0) {
            fy_table_free(&part);
            goto out;
        }
        for (int64_t k = 0; k < part.n && rc == 0; k++) {
            rc = fy_table_push(&f->tb, &part.t[k]);
            if (rc == 0) part.t[k].name = NULL, part.t[k].shape = NULL, part.t[k].strides = NULL;
        }
        fy_table_free(&part);
        if (rc == FERRY_E_LIMIT) {
            fy_table_fail(&f->tb, rc, path, err);
            goto out;
        }
        if (rc < 0) {
            fy_seterr(err, rc, "%s: out of memory for the table of shard %s (%" PRId64 " tensors so far)",
                      path, f->shards[s].path, f->tb.n);
            goto out;
        }
    }
    if ((rc = build_name_index(f)) < 0) goto out;
    rc = check_index(f, path, &ix);
out:
    fy_index_free(&ix);
    return rc;
}

FERRY_API int ferry_file_open(ferry_ctx *ctx, const char *path, uint32_t flags, ferry_file **out)
{
    if (!ctx || !out) return FERRY_E_INVAL;
    *out = NULL;
    FY_RETURN_IF(!path || !*path, &ctx->err, FERRY_E_INVAL, "ferry_file_open: empty path");
    FY_RETURN_IF(flags & ~(uint32_t)FERRY_OPEN_PRIVATE, &ctx->err, FERRY_E_INVAL,
                 "ferry_file_open: unknown flags 0x%x", (unsigned)(flags & ~(uint32_t)FERRY_OPEN_PRIVATE));
    ferry_file *f = fy_calloc(&ctx->mem, 1, sizeof *f);
    if (!f) return fy_seterr(&ctx->err, -ENOMEM, "%s: out of memory (%zu bytes)", path, sizeof *f);
    f->ctx = ctx;
    fy_err_init_child(&f->err, &ctx->err);
    pthread_mutex_init(&f->watch_lock, NULL);
    fy_table_init(&f->tb, &ctx->mem);
    f->tb.max_bytes = ctx->max_header_bytes;
    f->tb.max_n = ctx->max_tensors;
    int rc;
    if (ends_with(path, ".json")) {
        f->fmt = FERRY_FORMAT_SAFETENSORS_INDEX;
        rc = open_index(f, path);
    } else {
        f->fmt = FERRY_FORMAT_SAFETENSORS;
        f->shards = fy_calloc(&ctx->mem, 1, sizeof(shard));
        if (!f->shards) {
            rc = fy_seterr(&ctx->err, -ENOMEM, "%s: out of memory", path);
        } else {
            f->nshards = 1;
            f->shards[0].fd = -1;
            f->shards[0].path = fy_strndup(&ctx->mem, path, strlen(path));
            rc = f->shards[0].path ? open_st(ctx, path, 0, &f->shards[0], &f->tb, &f->fmt)
                                   : fy_seterr(&ctx->err, -ENOMEM, "%s: out of memory for its path", path);
            if (rc == 0) rc = build_name_index(f);
        }
    }
    if (rc < 0) {
        ferry_file_close(f);
        return rc;
    }
    if (flags & FERRY_OPEN_PRIVATE) {
        /* parsed through the shared mapping; the views get a copy-on-write one */
        for (int32_t s = 0; s < f->nshards && rc == 0; s++) {
            shard *sh = &f->shards[s];
            if (!sh->map) continue;
            void *p = NULL;
            rc = fy_map_private(sh->fd, sh->size, &p);
            if (rc < 0) {
                fy_seterr(&ctx->err, rc, "%s: private mmap: %s", sh->path, ferry_strerror(rc));
                break;
            }
            fy_unmap(sh->map, sh->size);
            sh->map = p;
        }
        if (rc < 0) {
            ferry_file_close(f);
            return rc;
        }
        f->private_map = true;
    }
    for (int64_t i = 0; i < f->tb.n; i++) f->total += f->tb.t[i].nbytes;
    *out = f;
    return 0;
}

int fy_file_watch_add(const ferry_file *cf, void (*closing)(void *, const ferry_file *), void *owner)
{
    ferry_file *f = (ferry_file *)cf; /* allocated mutable by ferry_file_open */
    int rc = 0;
    pthread_mutex_lock(&f->watch_lock);
    for (int i = 0; i < f->nwatch; i++)
        if (f->watch[i].closing == closing && f->watch[i].owner == owner) goto out;
    if (f->nwatch == f->cap_watch) {
        int cap = f->cap_watch ? f->cap_watch * 2 : 2;
        fy_file_watch *n = fy_realloc(&f->ctx->mem, f->watch, (size_t)cap * sizeof *n);
        if (!n) {
            rc = -ENOMEM;
            goto out;
        }
        f->watch = n;
        f->cap_watch = cap;
    }
    f->watch[f->nwatch++] = (fy_file_watch){closing, owner};
    rc = 1;
out:
    pthread_mutex_unlock(&f->watch_lock);
    return rc;
}

void fy_file_watch_drop(const ferry_file *cf, void (*closing)(void *, const ferry_file *), void *owner)
{
    ferry_file *f = (ferry_file *)cf;
    pthread_mutex_lock(&f->watch_lock);
    for (int i = 0; i < f->nwatch; i++)
        if (f->watch[i].closing == closing && f->watch[i].owner == owner) {
            f->watch[i] = f->watch[--f->nwatch];
            break;
        }
    pthread_mutex_unlock(&f->watch_lock);
}

FERRY_API void ferry_file_close(ferry_file *f)
{
    if (!f) return;
    const ferry_allocator *m = &f->ctx->mem;
    /* whoever still keys state by f (a device's registration of these
     * mappings) drops it now, while the mappings still exist; taken off the
     * list first so the callbacks run with no lock of f held */
    pthread_mutex_lock(&f->watch_lock);
    fy_file_watch *w = f->watch;
    int nw = f->nwatch;
    f->watch = NULL;
    f->nwatch = f->cap_watch = 0;
    pthread_mutex_unlock(&f->watch_lock);
    for (int i = 0; i < nw; i++) w[i].closing(w[i].owner, f);
    fy_free(m, w);
    pthread_mutex_destroy(&f->watch_lock);
    for (int32_t s = 0; s < f->nshards; s++) {
        fy_unmap(f->shards[s].map, f->shards[s].size);
        fy_close(f->shards[s].fd);
        fy_free(m, f->shards[s].path);
    }
    fy_free(m, f->shards);
    fy_free(m, f->by_name);
    fy_table_free(&f->tb);
    fy_err_destroy(&f->err);
    fy_free(m, f);
}

FERRY_API const char *ferry_file_errmsg(ferry_file *f)
{
    return f ? fy_err_public(&f->err) : "";
}

FERRY_API ferry_format ferry_file_format(const ferry_file *f)
{
    return f ? f->fmt : FERRY_FORMAT_UNKNOWN;
}
FERRY_API int64_t ferry_file_tensor_count(const ferry_file *f)
{
    return f ? f->tb.n : FERRY_E_INVAL;
}
FERRY_API uint64_t ferry_file_total_bytes(const ferry_file *f)
{
    return f ? f->total : 0;
}
FERRY_API int ferry_file_shard_count(const ferry_file *f)
{
    return f ? f->nshards : FERRY_E_INVAL;
}

FERRY_API const char *ferry_file_shard_path(const ferry_file *f, int i)
{
    if (!f || i < 0 || i >= f->nshards) return NULL;
    return f->shards[i].path;
}

FERRY_API int64_t ferry_file_metadata_count(const ferry_file *f)
{
    return f ? f->tb.nmeta : FERRY_E_INVAL;
}

FERRY_API int ferry_file_metadata(const ferry_file *f, int64_t i, const char **key, const char **value)
{
    if (!f || i < 0 || i >= f->tb.nmeta) return FERRY_E_INVAL;
    if (key) *key = f->tb.meta_k[i];
    if (value) *value = f->tb.meta_v[i];
    return 0;
}

FERRY_API int ferry_file_metadata_kind(const ferry_file *f, int64_t i)
{
    if (!f || i < 0 || i >= f->tb.nmeta) return FERRY_E_INVAL;
    return f->tb.meta_kind[i];
}

FERRY_API int ferry_file_tensor_info(const ferry_file *f, int64_t i, ferry_tensor_info *out)
{
    if (!f || !out || i < 0 || i >= f->tb.n) return FERRY_E_INVAL;
    const fy_tensor *t = &f->tb.t[i];
    ferry_tensor_info ti = {.size = sizeof ti};
    ti.name = t->name;
    ti.dtype = t->dtype;
    ti.ndim = t->ndim;
    ti.shape = t->shape;
    ti.nbytes = t->nbytes;
    ti.offset = t->offset;
    ti.shard = t->shard;
    ti.strides = t->strides;
    ti.flags = t->flags;
    return fy_struct_out(out, &ti, sizeof ti);
}

FERRY_API int64_t ferry_file_find(const ferry_file *f, const char *name)
{
    if (!f || !name) return FERRY_E_INVAL;
    int64_t lo = 0, hi = f->tb.n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tb.t[f->by_name[mid]].name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return FERRY_E_NOTFOUND;
}

FERRY_API int ferry_file_tensor_data(const ferry_file *f, int64_t i, const void **out)
{
    if (!f || !out || i < 0 || i >= f->tb.n) return FERRY_E_INVAL;
    const fy_tensor *t = &f->tb.t[i];
    const char *base = f->shards[t->shard].map;
    *out = base ? base + t->offset : NULL;
    return 0;
}

FERRY_API int ferry_file_tensor_read(const ferry_file *f, int64_t i, uint64_t off, void *buf, size_t len)
{
    if (!f || i < 0 || i >= f->tb.n) return FERRY_E_INVAL;
    const fy_tensor *t = &f->tb.t[i];
    fy_err *err = (fy_err *)&f->err; /* see file_impl.h: the message slot is mutable */
    char q[128];
    uint64_t end;
    FY_RETURN_IF(fy_add_ovf(off, len, &end) || end > t->nbytes || (len && !buf), err, FERRY_E_INVAL,
                 "tensor %s: read of %zu bytes at %" PRIu64 " is outside its %" PRIu64 " bytes",
                 Q(q, t->name), len, off, t->nbytes);
    const shard *sh = &f->shards[t->shard];
    int rc = fy_pread_full(sh->fd, buf, len, t->offset + off);
    if (rc == FERRY_E_CORRUPT)
        return fy_seterr(err, rc,
                         "%s: tensor %s: the file ended early (was it truncated after it was opened?)",
                         sh->path, Q(q, t->name));
    if (rc < 0)
        return fy_seterr(err, rc, "%s: tensor %s: read: %s", sh->path, Q(q, t->name), ferry_strerror(rc));
    return 0;
}

FERRY_API int64_t ferry_file_tensor_gathered_bytes(const ferry_file *f, int64_t i)
{
    if (!f || i < 0 || i >= f->tb.n) return FERRY_E_INVAL;
    const fy_tensor *t = &f->tb.t[i];
    if (!t->strides) return (int64_t)t->nbytes;
    int bits = ferry_dtype_bits(t->dtype);
    if (bits <= 0 || bits % 8) return FERRY_E_UNSUPPORTED;
    uint64_t nb = (uint64_t)bits / 8;
    for (int32_t d = 0; d < t->ndim; d++)
        if (fy_mul_ovf(nb, (uint64_t)t->shape[d], &nb)) return FERRY_E_CORRUPT;
    return nb > INT64_MAX ? FERRY_E_CORRUPT : (int64_t)nb;
}

/* A strided view's elements are scattered over its span: read the span
 * through a window of up to GATHER_WINDOW bytes (pread, as everywhere else:
 * a truncated file is an error, not a SIGBUS) and copy each element out. */
#define GATHER_WINDOW (256u << 20)

FERRY_API int ferry_file_tensor_gather(const ferry_file *f, int64_t i, uint64_t off, void *buf, size_t len)
{
    if (!f || i < 0 || i >= f->tb.n) return FERRY_E_INVAL;
    const fy_tensor *t = &f->tb.t[i];
    if (!t->strides) return ferry_file_tensor_read(f, i, off, buf, len);
    fy_err *err = (fy_err *)&f->err;
    char q[128];
    int64_t total = ferry_file_tensor_gathered_bytes(f, i);
    FY_RETURN_IF(total == FERRY_E_UNSUPPORTED || t->ndim > 64, err, FERRY_E_UNSUPPORTED,
                 "tensor %s: strided %s tensors cannot be gathered", Q(q, t->name),
                 ferry_dtype_name(t->dtype));
    FY_RETURN_IF(total < 0, err, FERRY_E_CORRUPT, "tensor %s: its size overflows 64 bits", Q(q, t->name));
    uint64_t end;
    FY_RETURN_IF(fy_add_ovf(off, len, &end) || end > (uint64_t)total || (len && !buf), err, FERRY_E_INVAL,
                 "tensor %s: read of %zu bytes at %" PRIu64 " is outside its %" PRId64 " row-major bytes",
                 Q(q, t->name), len, off, total);
    if (!len) return 0;
    size_t es = (size_t)ferry_dtype_bits(t->dtype) / 8;
    size_t win_cap = t->nbytes < GATHER_WINDOW ? (size_t)t->nbytes : GATHER_WINDOW;
    if (win_cap < es) win_cap = es;
    uint8_t *win = fy_malloc(&f->ctx->mem, win_cap);
    FY_RETURN_IF(!win, err, -ENOMEM, "tensor %s: out of memory for a %zu-byte gather window", Q(q, t->name),
                 win_cap);
    /* the row-major index of the first element wanted */
    int64_t idx[64];
    uint64_t e = off / es;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        uint64_t n = (uint64_t)t->shape[d];
        idx[d] = (int64_t)(e % n);
        e /= n;
    }
    uint64_t wbeg = 0, wlen = 0; /* the window holds span bytes [wbeg, wbeg + wlen) */
    uint8_t *out = buf;
    size_t skip = (size_t)(off % es), done = 0;
    int rc = 0;
    while (done < len) {
        int64_t el = 0;
        for (int32_t d = 0; d < t->ndim; d++) el += idx[d] * t->strides[d];
        uint64_t at = (uint64_t)el * es;
        if (el < 0 || at + es > t->nbytes) {
            rc = fy_seterr(err, FERRY_E_CORRUPT, "tensor %s: a strided element lies outside its span",
                           Q(q, t->name));
            break;
        }
        if (at < wbeg || at + es > wbeg + wlen) {
            /* a window as full as the span allows: one read for a span that fits */
            wbeg = t->nbytes - at < win_cap ? t->nbytes - win_cap : at;
            wlen = win_cap;
            if ((rc = ferry_file_tensor_read(f, i, wbeg, win, (size_t)wlen)) < 0) break;
        }
        size_t take = es - skip < len - done ? es - skip : len - done;
        memcpy(out + done, win + (at - wbeg) + skip, take);
        done += take;
        skip = 0;
        for (int32_t d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    fy_free(&f->ctx->mem, win);
    return rc;
}

FERRY_API uint64_t ferry_xxh3(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

/* ---- hashing with a pool of threads ---- */

#define HASH_CHUNK (4u << 20)

typedef struct hash_job {
    const ferry_file *f;
    int64_t *order; /* tensors, largest first, so threads finish together */
    atomic_llong next;
    uint64_t *out;
    atomic_int rc;
    fy_progress prog;
} hash_job;

static void *hash_worker(void *arg)
{
    hash_job *j = arg;
    const ferry_allocator *m = &j->f->ctx->mem;
    uint8_t *buf = fy_malloc(m, HASH_CHUNK);
    XXH3_state_t st;
    if (!buf) {
        int zero = 0;
        atomic_compare_exchange_strong(&j->rc, &zero, -ENOMEM);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&j->rc) < 0) break;
        long long k = atomic_fetch_add(&j->next, 1);
        if (k >= j->f->tb.n) break;
        int64_t i = j->order[k];
        /* a strided view hashes as its elements in row-major order, as
         * ferry_file_convert writes it, so that a copy hashes the same; one
         * whose elements are not whole bytes keeps its span */
        const fy_tensor *t = &j->f->tb.t[i];
        int64_t gn = t->strides ? ferry_file_tensor_gathered_bytes(j->f, i) : -1;
        bool gather = gn >= 0;
        uint64_t n = gather ? (uint64_t)gn : t->nbytes;
        XXH3_64bits_reset(&st);
        for (uint64_t off = 0; off < n;) {
            size_t len = n - off > HASH_CHUNK ? HASH_CHUNK : (size_t)(n - off);
            int rc = gather ? ferry_file_tensor_gather(j->f, i, off, buf, len)
                            : ferry_file_tensor_read(j->f, i, off, buf, len);
            if (rc < 0) {
                int zero = 0;
                atomic_compare_exchange_strong(&j->rc, &zero, rc);
                goto done;
            }
            XXH3_64bits_update(&st, buf, len);
            off += len;
            if (!gather) fy_progress_add(&j->prog, len); /* progress counts spans, as the total does */
        }
        if (gather) fy_progress_add(&j->prog, t->nbytes);
        j->out[i] = XXH3_64bits_digest(&st);
    }
done:
    fy_free(m, buf);
    return NULL;
}

static int cmp_size_desc(const void *a, const void *b, void *arg)
{
    const fy_table *tb = arg;
    uint64_t x = tb->t[*(const int64_t *)a].nbytes, y = tb->t[*(const int64_t *)b].nbytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void put_le64(XXH3_state_t *st, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_64bits_update(st, b, 8);
}

FERRY_API int ferry_file_hash(ferry_ctx *ctx, const ferry_file *f, uint64_t *per_tensor, uint64_t *model,
                              void (*progress)(void *, uint64_t, uint64_t), void *opaque)
{
    if (!ctx || !f) return FERRY_E_INVAL;
    const ferry_allocator *m = &ctx->mem;
    size_t n = (size_t)f->tb.n;
    uint64_t *hashes = fy_calloc(m, n ? n : 1, sizeof(uint64_t));
    int64_t *order = fy_calloc(m, n ? n : 1, sizeof(int64_t));
    pthread_t *th = fy_calloc(m, ctx->nthreads, sizeof(pthread_t));
    int rc = 0;
    if (!hashes || !order || !th) {
        rc = fy_seterr(&ctx->err, -ENOMEM, "hash: out of memory for the lists of %zu tensors", n);
        goto out;
    }
    hash_job j = {.f = f, .order = order, .out = hashes};
    atomic_init(&j.next, 0);
    atomic_init(&j.rc, 0);
    fy_progress_init(&j.prog, progress, opaque, f->total);
    for (size_t i = 0; i < n; i++) order[i] = (int64_t)i;
    qsort_r(order, n, sizeof(int64_t), cmp_size_desc, (void *)&f->tb);
    uint32_t nth = ctx->nthreads, started = 0;
    if (nth > n) nth = n ? (uint32_t)n : 1;
    for (; started < nth; started++)
        if (pthread_create(&th[started], NULL, hash_worker, &j) != 0) break;
    if (started == 0) hash_worker(&j);
    for (uint32_t t = 0; t < started; t++) pthread_join(th[t], NULL);
    fy_progress_destroy(&j.prog);
    rc = atomic_load(&j.rc);
    if (rc < 0) {
        if (rc == -ENOMEM) fy_seterr(&ctx->err, rc, "hash: out of memory for a reader's buffer");
        else if (ctx != f->ctx) { /* the failing read left its message on f's context */
            char msg[FY_ERRMSG_MAX];
            fy_err_copy(&f->ctx->err, msg, sizeof msg);
            fy_seterr(&ctx->err, rc, "%s", msg);
        }
        goto out;
    }
    if (per_tensor) memcpy(per_tensor, hashes, n * sizeof(uint64_t));
    if (model) {
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        for (size_t k = 0; k < n; k++) {
            const fy_tensor *t = &f->tb.t[f->by_name[k]];
            const char *dn = ferry_dtype_name(t->dtype);
            XXH3_64bits_update(&st, t->name, strlen(t->name) + 1);
            XXH3_64bits_update(&st, dn, strlen(dn) + 1);
            put_le64(&st, (uint64_t)t->ndim);
            for (int32_t d = 0; d < t->ndim; d++) put_le64(&st, (uint64_t)t->shape[d]);
            put_le64(&st, hashes[f->by_name[k]]);
        }
        *model = XXH3_64bits_digest(&st);
    }
out:
    fy_free(m, hashes);
    fy_free(m, order);
    fy_free(m, th);
    return rc;
}
