/* SPDX-License-Identifier: Apache-2.0 */
/* pytorch.c - PyTorch zip checkpoints (torch.save since 1.6): the archive's
 * directory (zip.c), its <archive>/data.pkl (pickle.c), and a tensor table of
 * views into the stored <archive>/data/<key> entries, each checked to lie
 * inside its storage.
 *
 * Layout, as torch's PyTorchStreamWriter writes it: every record sits under
 * one folder named after the file (or "archive"); data.pkl holds the object
 * tree, whose tensors name their storage by key in a persistent id; each
 * storage's raw little-endian bytes are the entry data/<key>, stored (not
 * compressed) and aligned to 64 bytes by padding in the local header. */
#include "format.h"
#include "pickle.h"
#include "zip.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

static void fmt_dims(char *buf, size_t n, const int64_t *d, int32_t ndim)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t i = 0; i < ndim && o < n; i++) {
        if (o + 32 >= n) {
            snprintf(buf + o, n - o, "...");
            o = n;
            break;
        }
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", d[i]);
    }
    if (o < n) snprintf(buf + o, n - o, "]");
}

typedef struct pos {
    uint64_t offset;
    int64_t seq;
} pos;

static int cmp_pos(const void *a, const void *b)
{
    const pos *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

typedef struct ctx {
    const char *name;
    const uint8_t *buf;
    fy_table *tb;
    fy_err *err;
    fy_zip z;
    fy_pk_result r;
    const char *prefix; /* "<archive>/" within the first entry's name */
    size_t plen;
    int64_t *ent_of;   /* storage -> zip entry */
    int64_t *first_of; /* zip entry -> first storage that names it, or -1 */
    uint32_t *users;   /* zip entry -> named tensors viewing it */
    char *ename;       /* scratch: an entry name */
} ctx;

/* The entry "<archive>/" + suffix (left in c->ename for messages), or -1. */
static int64_t entry(ctx *c, const char *suffix, size_t slen)
{
    memcpy(c->ename, c->prefix, c->plen);
    memcpy(c->ename + c->plen, suffix, slen);
    c->ename[c->plen + slen] = '\0';
    return fy_zip_find(&c->z, c->ename, c->plen + slen);
}

/* Map each storage of the pickle to its entry, checking its size. */
static int resolve_storages(ctx *c)
{
    char q[128], qe[128];
    for (int64_t i = 0; i < c->r.nst; i++) {
        const fy_pk_storage *s = &c->r.st[i];
        char suffix[300];
        int sl = snprintf(suffix, sizeof suffix, "data/%.*s", (int)s->key_len, s->key);
        int64_t e = entry(c, suffix, (size_t)sl);
        char key[260];
        snprintf(key, sizeof key, "%.*s", (int)s->key_len, s->key);
        FY_RETURN_IF(e < 0, c->err, FERRY_E_CORRUPT, "%s: storage %s is not in the archive (no entry %s)",
                     c->name, Q(q, key), Q(qe, c->ename));
        FY_TRY(fy_zip_stored(c->name, &c->z, (uint64_t)e, c->err));
        uint64_t want = s->numel;
        if (!s->untyped && fy_mul_ovf(s->numel, (uint64_t)ferry_dtype_bits(s->dtype) / 8, &want))
            return fy_seterr(c->err, FERRY_E_CORRUPT,
                             "%s: storage %s: %" PRIu64 " elements of torch.%s overflow 64 bits", c->name,
                             Q(q, key), s->numel, s->type);
        const fy_zip_entry *ze = &c->z.e[e];
        if (ze->usize != want) {
            if (s->untyped)
                return fy_seterr(c->err, FERRY_E_CORRUPT,
                                 "%s: storage %s: entry %s holds %" PRIu64
                                 " bytes, but its persistent id says %" PRIu64,
                                 c->name, Q(q, key), Q(qe, c->ename), ze->usize, want);
            return fy_seterr(c->err, FERRY_E_CORRUPT,
                             "%s: storage %s: entry %s holds %" PRIu64
                             " bytes, but its persistent id says %" PRIu64 " elements of torch.%s (%" PRIu64
                             " bytes)",
                             c->name, Q(q, key), Q(qe, c->ename), ze->usize, s->numel, s->type, want);
        }
        int64_t f = c->first_of[e];
        if (f < 0) {
            c->first_of[e] = i;
        } else {
            const fy_pk_storage *o = &c->r.st[f];
            FY_RETURN_IF(o->dtype != s->dtype || o->untyped != s->untyped || o->numel != s->numel, c->err,
                         FERRY_E_CORRUPT,
                         "%s: storage %s is described twice, as torch.%s of %" PRIu64
                         " and as torch.%s of %" PRIu64,
                         c->name, Q(q, key), o->type, o->numel, s->type, s->numel);
        }
        c->ent_of[i] = e;
    }
    return 0;
}

/* The table entry for named tensor j: a view inside its storage's entry. */
static int make_tensor(ctx *c, int64_t j, fy_tensor *t)
{
    const fy_pk_named *nm = &c->r.names[j];
    const fy_pk_view *v = &c->r.v[nm->view];
    const fy_pk_storage *s = &c->r.st[v->storage];
    const fy_zip_entry *ze = &c->z.e[c->ent_of[v->storage]];
    char q[128], sb[200], stb[200], key[260];
    snprintf(key, sizeof key, "%.*s", (int)s->key_len, s->key);
    uint64_t el = (uint64_t)ferry_dtype_bits(v->dtype) / 8; /* every torch dtype is whole bytes */
    uint64_t numel = 1, span = 1, expect = 1;
    bool contiguous = true, ovf = false;
    for (int32_t d = v->ndim - 1; d >= 0; d--) {
        uint64_t sz = (uint64_t)v->shape[d], st = (uint64_t)v->stride[d], ext;
        if (sz != 1 && st != expect) contiguous = false;
        if (fy_mul_ovf(expect, sz, &expect)) expect = UINT64_MAX; /* only compared while no dim is 0 */
        if (fy_mul_ovf(numel, sz, &numel)) ovf = true;
        if (sz && (fy_mul_ovf(sz - 1, st, &ext) || fy_add_ovf(span, ext, &span))) ovf = true;
    }
    bool empty = false;
    for (int32_t d = 0; d < v->ndim; d++) empty |= v->shape[d] == 0;
    if (empty) numel = 0, contiguous = true, ovf = false;
    uint64_t boff, end = 0, nbytes;
    if (ovf || fy_mul_ovf(v->offset, el, &boff) ||
        (!empty && (fy_add_ovf(v->offset, span, &end) || fy_mul_ovf(end, el, &end))) ||
        fy_mul_ovf(contiguous ? numel : span, el, &nbytes)) {
        fmt_dims(sb, sizeof sb, v->shape, v->ndim);
        return fy_seterr(c->err, FERRY_E_CORRUPT, "%s: tensor %s: size %s with its strides overflows 64 bits",
                         c->name, Q(q, nm->name), sb);
    }
    if (empty) end = boff;
    if (end > ze->usize) {
        fmt_dims(sb, sizeof sb, v->shape, v->ndim);
        fmt_dims(stb, sizeof stb, v->stride, v->ndim);
        char qk[128];
        return fy_seterr(c->err, FERRY_E_CORRUPT,
                         "%s: tensor %s: view (storage offset %" PRIu64
                         ", size %s, stride %s, %s) ends at byte %" PRIu64
                         " of storage %s, which holds %" PRIu64 " bytes",
                         c->name, Q(q, nm->name), v->offset, sb, stb, ferry_dtype_name(v->dtype), end,
                         Q(qk, key), ze->usize);
    }
    memset(t, 0, sizeof *t);
    t->dtype = v->dtype;
    t->ndim = v->ndim;
    t->offset = ze->data + boff;
    t->nbytes = empty ? 0 : nbytes;
    if (v->ndim) {
        t->shape = fy_malloc(c->tb->mem, (size_t)v->ndim * sizeof(int64_t));
        if (!t->shape) return fy_seterr(c->err, -ENOMEM, "%s: out of memory", c->name);
        memcpy(t->shape, v->shape, (size_t)v->ndim * sizeof(int64_t));
    }
    if (!contiguous) {
        t->flags |= FERRY_TENSOR_NONCONTIGUOUS;
        t->strides = fy_malloc(c->tb->mem, (size_t)v->ndim * sizeof(int64_t));
        if (!t->strides) {
            fy_free(c->tb->mem, t->shape);
            return fy_seterr(c->err, -ENOMEM, "%s: out of memory", c->name);
        }
        memcpy(t->strides, v->stride, (size_t)v->ndim * sizeof(int64_t));
    }
    return 0;
}

static int build(ctx *c)
{
    fy_table *tb = c->tb;
    char q[128];
    FY_RETURN_IF(c->z.n == 0, c->err, FERRY_E_CORRUPT,
                 "%s: the zip archive is empty (not a torch.save checkpoint)", c->name);
    const fy_zip_entry *first = &c->z.e[0];
    const char *slash = memchr(first->name, '/', first->name_len);
    FY_RETURN_IF(!slash, c->err, FERRY_E_CORRUPT,
                 "%s: zip entry %s is not in a folder (torch.save puts every record under '<name>/'): not a "
                 "torch.save checkpoint",
                 c->name, fy_zip_qname(q, sizeof q, first));
    c->prefix = first->name;
    c->plen = (size_t)(slash - first->name) + 1;
    c->ename = fy_malloc(tb->mem, c->plen + 300); /* "data/" + a key of at most 256 bytes */
    c->first_of = fy_malloc(tb->mem, (size_t)c->z.n * sizeof(int64_t));
    c->users = fy_calloc(tb->mem, (size_t)c->z.n, sizeof(uint32_t));
    if (!c->ename || !c->first_of || !c->users)
        return fy_seterr(c->err, -ENOMEM, "%s: out of memory", c->name);
    for (uint64_t i = 0; i < c->z.n; i++) c->first_of[i] = -1;

    int64_t e = entry(c, "data.pkl", 8);
    FY_RETURN_IF(e < 0, c->err, FERRY_E_CORRUPT,
                 "%s: no entry %s in the zip archive: not a torch.save checkpoint", c->name, Q(q, c->ename));
    FY_TRY(fy_zip_stored(c->name, &c->z, (uint64_t)e, c->err));
    const fy_zip_entry *pkl = &c->z.e[e];
    FY_RETURN_IF(pkl->usize > FY_PK_MAX_PICKLE, c->err, FERRY_E_LIMIT,
                 "%s: %s is %" PRIu64 " bytes (ferry's limit is %llu)", c->name, Q(q, c->ename), pkl->usize,
                 FY_PK_MAX_PICKLE);

    /* torch 2.x records the byte order; the data is only usable as is when little-endian. */
    int64_t bo = entry(c, "byteorder", 9);
    if (bo >= 0) {
        FY_TRY(fy_zip_stored(c->name, &c->z, (uint64_t)bo, c->err));
        const fy_zip_entry *b = &c->z.e[bo];
        const char *s = (const char *)c->buf + b->data;
        FY_RETURN_IF(b->usize == 3 && memcmp(s, "big", 3) == 0, c->err, FERRY_E_UNSUPPORTED,
                     "%s: a big-endian checkpoint (byteorder \"big\"): ferry reads little-endian data only",
                     c->name);
        FY_RETURN_IF(b->usize != 6 || memcmp(s, "little", 6) != 0, c->err, FERRY_E_CORRUPT,
                     "%s: %s is neither \"little\" nor \"big\"", c->name, Q(q, c->ename));
    }

    char where[512];
    snprintf(where, sizeof where, "%s: data.pkl", c->name);
    FY_TRY(fy_pk_load(where, c->buf + pkl->data, (size_t)pkl->usize, tb->mem, &c->r, c->err));
    c->ent_of = fy_calloc(tb->mem, c->r.nst ? (size_t)c->r.nst : 1, sizeof(int64_t));
    if (!c->ent_of) return fy_seterr(c->err, -ENOMEM, "%s: out of memory", c->name);
    FY_TRY(resolve_storages(c));

    for (int64_t j = 0; j < c->r.nn; j++) c->users[c->ent_of[c->r.v[c->r.names[j].view].storage]]++;
    int64_t base = tb->n;
    for (int64_t j = 0; j < c->r.nn; j++) {
        fy_tensor t;
        FY_TRY(make_tensor(c, j, &t));
        if (c->users[c->ent_of[c->r.v[c->r.names[j].view].storage]] > 1)
            t.flags |= FERRY_TENSOR_SHARED_STORAGE;
        t.name = c->r.names[j].name;
        int rc = fy_table_push(tb, &t);
        if (rc < 0) {
            fy_free(tb->mem, t.shape);
            fy_free(tb->mem, t.strides);
            return fy_table_fail(tb, rc, c->name, c->err);
        }
        c->r.names[j].name = NULL; /* the table owns it now */
    }

    /* In the order the data lies in the file; views of one storage by start,
     * then in the order the pickle named them. */
    int64_t n = tb->n - base;
    if (n > 1) {
        pos *order = fy_malloc(tb->mem, (size_t)n * sizeof *order);
        fy_tensor *sorted = fy_malloc(tb->mem, (size_t)n * sizeof *sorted);
        if (!order || !sorted) {
            fy_free(tb->mem, order);
            fy_free(tb->mem, sorted);
            return fy_seterr(c->err, -ENOMEM, "%s: out of memory", c->name);
        }
        for (int64_t i = 0; i < n; i++) order[i] = (pos){tb->t[base + i].offset, i};
        qsort(order, (size_t)n, sizeof *order, cmp_pos);
        for (int64_t i = 0; i < n; i++) sorted[i] = tb->t[base + order[i].seq];
        memcpy(tb->t + base, sorted, (size_t)n * sizeof *sorted);
        fy_free(tb->mem, order);
        fy_free(tb->mem, sorted);
    }
    return 0;
}

int fy_pt_parse(const char *name, const uint8_t *buf, uint64_t size, fy_table *tb, fy_err *err)
{
    ctx c = {.name = name, .buf = buf, .tb = tb, .err = err};
    c.r.mem = tb->mem;
    int rc = fy_zip_open(name, buf, size, tb->mem, &c.z, err);
    if (rc == 0) rc = build(&c);
    fy_pk_free(&c.r);
    fy_zip_free(&c.z);
    fy_free(tb->mem, c.ent_of);
    fy_free(tb->mem, c.first_of);
    fy_free(tb->mem, c.users);
    fy_free(tb->mem, c.ename);
    if (rc < 0) fy_table_free(tb);
    return rc;
}
