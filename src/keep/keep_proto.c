/* SPDX-License-Identifier: Apache-2.0 */
/* keep_proto.c - the keeper's message codec (keep_proto.h): bounds-checked
 * readers and writers over byte buffers, nothing else. */
#include "keep_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ------------------------------------------------------------- */

typedef struct wr {
    uint8_t *p;
    size_t len, cap;
    int err;
} wr;

static void put(wr *w, const void *src, size_t n)
{
    if (w->err) return;
    if (n > w->cap - w->len) {
        w->err = -EMSGSIZE;
        return;
    }
    if (n) memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void put_le(wr *w, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, (size_t)bytes);
}
#define put_u8(w, v) put_le(w, (uint64_t)(v), 1)
#define put_u16(w, v) put_le(w, (uint64_t)(v), 2)
#define put_u32(w, v) put_le(w, (uint64_t)(v), 4)
#define put_u64(w, v) put_le(w, (uint64_t)(v), 8)

/* A string the decoder accepts: at most max bytes, no NUL; min 1 when
 * must_abs (and then starting with '/'). */
static int str_ok(const char *s, size_t max, int must_abs)
{
    size_t n = s ? strnlen(s, max + 1) : 0;
    if (n > max) return 0;
    if (must_abs && (n == 0 || s[0] != '/')) return 0;
    return 1;
}

static void put_str(wr *w, const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n > max) {
        if (!w->err) w->err = -EINVAL;
        return;
    }
    put_u16(w, n);
    put(w, s, n);
}

/* ---- reader ------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t len, off;
    int err;
} rd;

static uint64_t get_le(rd *r, int bytes)
{
    if (r->err || (size_t)bytes > r->len - r->off) {
        r->err = -EPROTO;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->off + (size_t)i] << (8 * i);
    r->off += (size_t)bytes;
    return v;
}
#define get_u8(r) ((uint8_t)get_le(r, 1))
#define get_u16(r) ((uint16_t)get_le(r, 2))
#define get_u32(r) ((uint32_t)get_le(r, 4))
#define get_u64(r) get_le(r, 8)

/* A string into out[0..max] (NUL-terminated): at most max bytes, no NUL. */
static size_t get_str(rd *r, char *out, size_t max)
{
    size_t n = get_u16(r);
    if (r->err) return 0;
    if (n > max || n > r->len - r->off || memchr(r->p + r->off, 0, n)) {
        r->err = -EPROTO;
        out[0] = '\0';
        return 0;
    }
    memcpy(out, r->p + r->off, n);
    out[n] = '\0';
    r->off += n;
    return n;
}

/* The same, pointing into the body instead (for the status block): *at and
 * *n are the string's place; no copy. */
static void get_str_ref(rd *r, size_t max, size_t *at, size_t *n)
{
    *n = get_u16(r);
    *at = r->off;
    if (r->err) return;
    if (*n > max || *n > r->len - r->off || memchr(r->p + r->off, 0, *n)) {
        r->err = -EPROTO;
        return;
    }
    r->off += *n;
}

/* ---- header ------------------------------------------------------------- */

static int type_known(uint16_t t)
{
    return (t >= FKP_HELLO && t <= FKP_STATUS) || (t >= FKP_HELLO_OK && t <= FKP_STATUS_REPLY) ||
           t == FKP_ERROR;
}

int fkp_hdr_decode(const uint8_t *b, fkp_hdr *h)
{
    rd r = {b, FKP_HDR, 0, 0};
    uint32_t magic = get_u32(&r);
    uint16_t version = get_u16(&r);
    uint16_t type = get_u16(&r);
    uint32_t len = get_u32(&r);
    uint32_t reserved = get_u32(&r);
    if (magic != FKP_MAGIC || version != FKP_VERSION || !type_known(type) || reserved != 0) return -EPROTO;
    if (len > FKP_MAX_BODY) return -EMSGSIZE;
    h->type = type;
    h->len = len;
    return 0;
}

static void put_hdr(wr *w, uint16_t type)
{
    put_u32(w, FKP_MAGIC);
    put_u16(w, FKP_VERSION);
    put_u16(w, type);
    put_u32(w, 0); /* length, filled in by finish */
    put_u32(w, 0);
}

static int finish(wr *w)
{
    if (w->err) return w->err;
    size_t body = w->len - FKP_HDR;
    if (body > FKP_MAX_BODY) return -EMSGSIZE;
    for (int i = 0; i < 4; i++) w->p[8 + i] = (uint8_t)(body >> (8 * i));
    return (int)w->len;
}

/* ---- bodies ------------------------------------------------------------- */

static void put_ident(wr *w, const fkp_ident *id)
{
    if (!str_ok(id->path, FKP_MAX_PATH, 1) && !w->err) w->err = -EINVAL;
    put_str(w, id->path, FKP_MAX_PATH);
    put_str(w, id->tensor, FKP_MAX_NAME);
    put_u32(w, id->index);
    put_u64(w, id->file_size);
    put_u64(w, (uint64_t)id->mtime_ns);
    put_u64(w, id->digest);
}

static void get_ident(rd *r, fkp_ident *id, int path_may_be_empty)
{
    size_t n = get_str(r, id->path, FKP_MAX_PATH);
    if (!r->err && !(path_may_be_empty && n == 0) && (n == 0 || id->path[0] != '/')) r->err = -EPROTO;
    get_str(r, id->tensor, FKP_MAX_NAME);
    id->index = get_u32(r);
    id->file_size = get_u64(r);
    id->mtime_ns = (int64_t)get_u64(r);
    id->digest = get_u64(r);
}

int fkp_encode(const fkp_msg *m, uint8_t *out, size_t cap)
{
    wr w = {out, 0, cap, 0};
    if (!type_known(m->type) || m->type == FKP_STATUS_REPLY) return -EINVAL;
    put_hdr(&w, m->type);
    switch (m->type) {
    case FKP_HELLO: put_u32(&w, m->version); break;
    case FKP_PUT_BEGIN:
        put_ident(&w, &m->id);
        put_u64(&w, m->nbytes);
        break;
    case FKP_GET: put_ident(&w, &m->id); break;
    case FKP_PUT_COMMIT:
    case FKP_RELEASE: put_u64(&w, m->entry); break;
    case FKP_DROP:
        if (m->scope > FKP_DROP_ALL) return -EINVAL;
        if (m->scope == FKP_DROP_ALL) {
            put_u8(&w, m->scope);
            put_u16(&w, 0); /* path */
            put_u16(&w, 0); /* tensor */
            put_u32(&w, 0);
            put_u64(&w, 0);
            put_u64(&w, 0);
            put_u64(&w, 0);
        } else {
            put_u8(&w, m->scope);
            put_ident(&w, &m->id);
        }
        break;
    case FKP_STATUS:
    case FKP_OK: break;
    case FKP_HELLO_OK:
        put_u32(&w, m->version);
        put_u32(&w, m->pid);
        put_u64(&w, m->nbytes);
        put_str(&w, m->text, FKP_MAX_DEVICE);
        break;
    case FKP_PUT_READY:
        put_u64(&w, m->entry);
        put_u64(&w, m->nbytes);
        break;
    case FKP_HIT:
        put_u64(&w, m->entry);
        put_u64(&w, m->offset);
        put_u64(&w, m->nbytes);
        break;
    case FKP_MISS:
        if (m->reason > FKP_MISS_STALE) return -EINVAL;
        put_u8(&w, m->reason);
        break;
    case FKP_DROPPED: put_u32(&w, m->count); break;
    case FKP_ERROR:
        if (m->code <= 0) return -EINVAL;
        put_u32(&w, (uint32_t)m->code);
        put_str(&w, m->text, FKP_MAX_ERRMSG);
        break;
    }
    return finish(&w);
}

int fkp_body_decode(uint16_t type, const uint8_t *body, size_t len, fkp_msg *m)
{
    rd r = {body, len, 0, 0};
    if (len > FKP_MAX_BODY || !type_known(type) || type == FKP_STATUS_REPLY) return -EPROTO;
    m->type = type;
    switch (type) {
    case FKP_HELLO: m->version = get_u32(&r); break;
    case FKP_PUT_BEGIN:
        get_ident(&r, &m->id, 0);
        m->nbytes = get_u64(&r);
        if (!r.err && m->nbytes == 0) r.err = -EPROTO;
        break;
    case FKP_GET: get_ident(&r, &m->id, 0); break;
    case FKP_PUT_COMMIT:
    case FKP_RELEASE: m->entry = get_u64(&r); break;
    case FKP_DROP:
        m->scope = get_u8(&r);
        if (!r.err && m->scope > FKP_DROP_ALL) r.err = -EPROTO;
        get_ident(&r, &m->id, m->scope == FKP_DROP_ALL);
        /* ALL names nothing: an empty path, and only then */
        if (!r.err && (m->scope == FKP_DROP_ALL) != (m->id.path[0] == '\0')) r.err = -EPROTO;
        break;
    case FKP_STATUS:
    case FKP_OK: break;
    case FKP_HELLO_OK:
        m->version = get_u32(&r);
        m->pid = get_u32(&r);
        m->nbytes = get_u64(&r);
        get_str(&r, m->text, FKP_MAX_DEVICE);
        break;
    case FKP_PUT_READY:
        m->entry = get_u64(&r);
        m->nbytes = get_u64(&r);
        break;
    case FKP_HIT:
        m->entry = get_u64(&r);
        m->offset = get_u64(&r);
        m->nbytes = get_u64(&r);
        break;
    case FKP_MISS:
        m->reason = get_u8(&r);
        if (!r.err && m->reason > FKP_MISS_STALE) r.err = -EPROTO;
        break;
    case FKP_DROPPED: m->count = get_u32(&r); break;
    case FKP_ERROR: {
        uint32_t c = get_u32(&r);
        if (!r.err && (c == 0 || c > 0x7fffffffu)) r.err = -EPROTO;
        m->code = (int32_t)c;
        get_str(&r, m->text, FKP_MAX_ERRMSG);
        break;
    }
    }
    if (!r.err && r.off != r.len) r.err = -EPROTO; /* trailing bytes */
    return r.err ? -EPROTO : 0;
}

/* ---- STATUS_REPLY ------------------------------------------------------- */

size_t fkp_status_entry_size(size_t path_len, size_t tensor_len)
{
    return 8 + 2 + path_len + 2 + tensor_len + 4 + 8 + 4 + 8 + 8 + 8 + 8;
}
#define CLIENT_SIZE 16

int fkp_status_encode(const ferry_keep_status *s, uint8_t *out, size_t cap)
{
    wr w = {out, 0, cap, 0};
    if (s->listed_entries > FKP_MAX_LIST || s->listed_clients > FKP_MAX_LIST) return -EINVAL;
    put_hdr(&w, FKP_STATUS_REPLY);
    put_u64(&w, s->budget);
    put_u64(&w, s->used);
    put_u64(&w, s->pending_bytes);
    put_u32(&w, s->nentries);
    put_u32(&w, s->npending);
    put_u32(&w, s->nclients);
    put_str(&w, s->device, FKP_MAX_DEVICE);
    put_u32(&w, s->listed_entries);
    for (uint32_t i = 0; i < s->listed_entries; i++) {
        const ferry_keep_entry_info *e = &s->entries[i];
        if (!str_ok(e->path, FKP_MAX_PATH, 1) && !w.err) w.err = -EINVAL;
        put_u64(&w, e->id);
        put_str(&w, e->path, FKP_MAX_PATH);
        put_str(&w, e->tensor, FKP_MAX_NAME);
        put_u32(&w, e->index);
        put_u64(&w, e->nbytes);
        put_u32(&w, e->attached);
        put_u64(&w, e->file_size);
        put_u64(&w, (uint64_t)e->mtime_ns);
        put_u64(&w, e->header_digest);
        put_u64(&w, e->idle_ms);
    }
    put_u32(&w, s->listed_clients);
    for (uint32_t i = 0; i < s->listed_clients; i++) {
        const ferry_keep_client_info *c = &s->clients[i];
        put_u32(&w, (uint32_t)c->pid);
        put_u32(&w, c->uid);
        put_u32(&w, c->attached);
        put_u32(&w, c->pending);
    }
    return finish(&w);
}

int fkp_status_decode(const uint8_t *body, size_t len, ferry_keep_status **out)
{
    *out = NULL;
    if (len > FKP_MAX_BODY) return -EPROTO;
    rd r = {body, len, 0, 0};
    ferry_keep_status s;
    memset(&s, 0, sizeof s);
    s.budget = get_u64(&r);
    s.used = get_u64(&r);
    s.pending_bytes = get_u64(&r);
    s.nentries = get_u32(&r);
    s.npending = get_u32(&r);
    s.nclients = get_u32(&r);
    size_t dev_at, dev_n;
    get_str_ref(&r, FKP_MAX_DEVICE, &dev_at, &dev_n);
    uint32_t ne = get_u32(&r);
    /* each item takes at least its fixed bytes: a count the body cannot hold is refused now */
    if (r.err || ne > FKP_MAX_LIST || (uint64_t)ne * fkp_status_entry_size(0, 0) > r.len - r.off)
        return -EPROTO;
    size_t e_start = r.off;
    for (uint32_t i = 0; i < ne && !r.err; i++) {
        size_t at, n;
        get_u64(&r);
        get_str_ref(&r, FKP_MAX_PATH, &at, &n);
        if (!r.err && (n == 0 || body[at] != '/')) r.err = -EPROTO;
        get_str_ref(&r, FKP_MAX_NAME, &at, &n);
        get_le(&r, 4);
        get_le(&r, 8);
        get_le(&r, 4);
        get_le(&r, 8);
        get_le(&r, 8);
        get_le(&r, 8);
        get_le(&r, 8);
    }
    uint32_t nc = get_u32(&r);
    if (r.err || nc > FKP_MAX_LIST || (uint64_t)nc * CLIENT_SIZE != r.len - r.off) return -EPROTO;
    size_t c_start = r.off;

    /* One block: the struct, the two arrays, then the strings with their NULs. */
    size_t strings = dev_n + 1 + (size_t)ne * 2 + len;
    size_t total = sizeof s + (size_t)ne * sizeof(ferry_keep_entry_info) +
                   (size_t)nc * sizeof(ferry_keep_client_info) + strings;
    uint8_t *blk = malloc(total);
    if (!blk) return -ENOMEM;
    ferry_keep_status *o = (ferry_keep_status *)blk;
    *o = s;
    o->entries = (ferry_keep_entry_info *)(blk + sizeof s);
    o->clients = (ferry_keep_client_info *)(blk + sizeof s + (size_t)ne * sizeof(ferry_keep_entry_info));
    char *sp = (char *)(blk + sizeof s + (size_t)ne * sizeof(ferry_keep_entry_info) +
                        (size_t)nc * sizeof(ferry_keep_client_info));
    memcpy(sp, body + dev_at, dev_n);
    sp[dev_n] = '\0';
    o->device = sp;
    sp += dev_n + 1;
    o->listed_entries = ne;
    o->listed_clients = nc;

    /* second pass: everything was checked above */
    rd q = {body, len, e_start, 0};
    for (uint32_t i = 0; i < ne; i++) {
        ferry_keep_entry_info *e = &o->entries[i];
        size_t at, n;
        e->id = get_u64(&q);
        get_str_ref(&q, FKP_MAX_PATH, &at, &n);
        memcpy(sp, body + at, n);
        sp[n] = '\0';
        e->path = sp;
        sp += n + 1;
        get_str_ref(&q, FKP_MAX_NAME, &at, &n);
        memcpy(sp, body + at, n);
        sp[n] = '\0';
        e->tensor = sp;
        sp += n + 1;
        e->index = get_u32(&q);
        e->nbytes = get_u64(&q);
        e->attached = get_u32(&q);
        e->file_size = get_u64(&q);
        e->mtime_ns = (int64_t)get_u64(&q);
        e->header_digest = get_u64(&q);
        e->idle_ms = get_u64(&q);
    }
    q.off = c_start;
    for (uint32_t i = 0; i < nc; i++) {
        ferry_keep_client_info *c = &o->clients[i];
        c->pid = (int32_t)get_u32(&q);
        c->uid = get_u32(&q);
        c->attached = get_u32(&q);
        c->pending = get_u32(&q);
    }
    if (q.err) { /* cannot happen: the first pass read the same bytes */
        free(blk);
        return -EPROTO;
    }
    *out = o;
    return 0;
}
