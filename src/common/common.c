/* SPDX-License-Identifier: Apache-2.0 */
/* common.c - errors, allocator, UTF-8 check, message quoting, version. */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

FERRY_API int ferry_version(void)
{
    return FERRY_VERSION_NUMBER;
}
FERRY_API const char *ferry_version_string(void)
{
    return FERRY_VERSION_STRING;
}

FERRY_API const char *ferry_strerror(int code)
{
    switch (code) {
    case 0: return "success";
    case FERRY_E_CORRUPT: return "corrupt or invalid checkpoint";
    case FERRY_E_UNSUPPORTED: return "unsupported feature";
    case FERRY_E_FORMAT: return "unknown checkpoint format";
    case FERRY_E_INVAL: return "invalid argument";
    case FERRY_E_NOTFOUND: return "no such tensor";
    case FERRY_E_BUDGET: return "memory budget exceeded";
    case FERRY_E_NODEV: return "no usable device";
    case FERRY_E_DEVICE: return "device error";
    case FERRY_E_LIMIT: return "size limit exceeded";
    case FERRY_E_INTERNAL: return "internal error";
    case FERRY_E_BUSY: return "in use";
    default: break;
    }
    if (code < 0 && code > -4096) {
        /* strerror() may use a static buffer; strerrordesc_np is static text. */
        const char *s = strerrordesc_np(-code);
        return s ? s : "unknown system error";
    }
    return "unknown error";
}

void fy_err_init(fy_err *e)
{
    pthread_mutex_init(&e->lock, NULL);
    e->msg[0] = '\0';
    e->parent = NULL;
}

void fy_err_init_child(fy_err *e, fy_err *parent)
{
    fy_err_init(e);
    e->parent = parent;
}

void fy_err_destroy(fy_err *e)
{
    pthread_mutex_destroy(&e->lock);
}

int fy_vseterr(fy_err *e, int code, const char *fmt, va_list ap)
{
    char tmp[FY_ERRMSG_MAX];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    /* A message is one line whatever a hostile file puts into it (jansson
     * quotes raw input in its own messages). */
    for (char *c = tmp; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';
    for (; e; e = e->parent) {
        pthread_mutex_lock(&e->lock);
        memcpy(e->msg, tmp, sizeof tmp);
        pthread_mutex_unlock(&e->lock);
    }
    return code;
}

int fy_seterr(fy_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fy_vseterr(e, code, fmt, ap);
    va_end(ap);
    return code;
}

void fy_err_copy(fy_err *e, char *buf, size_t n)
{
    pthread_mutex_lock(&e->lock);
    snprintf(buf, n, "%s", e->msg);
    pthread_mutex_unlock(&e->lock);
}

static _Thread_local char tls_handle_msg[FY_ERRMSG_MAX];

const char *fy_err_public(fy_err *e)
{
    if (!e) return "";
    fy_err_copy(e, tls_handle_msg, sizeof tls_handle_msg);
    return tls_handle_msg;
}

void fy_err_adopt(fy_err *e, const char *msg)
{
    pthread_mutex_lock(&e->lock);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    pthread_mutex_unlock(&e->lock);
}

int fy_struct_in(void *dst, size_t full, const void *in, fy_err *err, const char *what)
{
    memset(dst, 0, full);
    if (in) {
        uint32_t size;
        memcpy(&size, in, sizeof size);
        FY_RETURN_IF(size < FERRY_STRUCT_MIN || size > full, err, FERRY_E_INVAL,
                     "%s: opts->size is %u, expected %u..%zu (sizeof the options struct)", what, size,
                     FERRY_STRUCT_MIN, full);
        memcpy(dst, in, size);
    }
    uint32_t size = (uint32_t)full;
    memcpy(dst, &size, sizeof size);
    return 0;
}

int fy_struct_out(void *out, const void *src, size_t full)
{
    if (!out) return FERRY_E_INVAL;
    uint32_t size;
    memcpy(&size, out, sizeof size);
    if (size < FERRY_STRUCT_MIN) return FERRY_E_INVAL;
    size_t n = size < full ? size : full;
    memcpy((char *)out + sizeof size, (const char *)src + sizeof size, n - sizeof size);
    return 0;
}

static void *sys_alloc(void *o, size_t n)
{
    (void)o;
    return malloc(n);
}
static void *sys_realloc(void *o, void *p, size_t n)
{
    (void)o;
    return realloc(p, n);
}
static void sys_free(void *o, void *p)
{
    (void)o;
    free(p);
}
static const ferry_allocator sys_mem = {sys_alloc, sys_realloc, sys_free, NULL};

const ferry_allocator *fy_default_allocator(void)
{
    return &sys_mem;
}

void *fy_malloc(const ferry_allocator *m, size_t n)
{
    return m->alloc(m->opaque, n ? n : 1);
}

void *fy_calloc(const ferry_allocator *m, size_t count, size_t size)
{
    uint64_t n;
    if (fy_mul_ovf(count, size, &n) || n > SIZE_MAX) return NULL;
    void *p = fy_malloc(m, (size_t)n);
    if (p) memset(p, 0, (size_t)n);
    return p;
}

void *fy_realloc(const ferry_allocator *m, void *p, size_t n)
{
    return m->realloc(m->opaque, p, n ? n : 1);
}

void fy_free(const ferry_allocator *m, void *p)
{
    if (p) m->free(m->opaque, p);
}

char *fy_strndup(const ferry_allocator *m, const char *s, size_t n)
{
    char *d = fy_malloc(m, n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

bool fy_utf8_valid(const char *str, size_t n, size_t *bad)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
            min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
            min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else goto fail;
        if (n - i < len) goto fail;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto fail;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto fail;
        i += len;
    }
    return true;
fail:
    if (bad) *bad = i;
    return false;
}

const char *fy_quote(char *buf, size_t n, const char *s)
{
    /* At most ~80 visible characters: enough to recognise a tensor name. */
    size_t o = 0, shown = 0;
    if (n < 8) {
        if (n) buf[0] = '\0';
        return buf;
    }
    buf[o++] = '\'';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < n; p++) {
        /* stop before a character that might not fit, never inside one */
        if ((o + 8 >= n || shown >= 80) && (*p & 0xC0) != 0x80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned c = *p;
        if (c < 0x20 || c == 0x7F || c == '\'' || c == '\\') {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
        shown++;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

void fy_progress_init(fy_progress *p, void (*fn)(void *, uint64_t, uint64_t), void *opaque, uint64_t total)
{
    p->fn = fn;
    p->opaque = opaque;
    p->total = total;
    atomic_init(&p->done, 0);
    pthread_mutex_init(&p->lock, NULL);
    p->reported = 0;
}

void fy_progress_add(fy_progress *p, uint64_t n)
{
    uint64_t d = atomic_fetch_add(&p->done, n) + n;
    if (!p->fn) return;
    pthread_mutex_lock(&p->lock);
    if (d > p->reported) { /* counts computed out of order by other threads are skipped */
        p->reported = d;
        p->fn(p->opaque, d, p->total);
    }
    pthread_mutex_unlock(&p->lock);
}

void fy_progress_destroy(fy_progress *p)
{
    pthread_mutex_destroy(&p->lock);
}

double fy_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fy_sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

uint32_t fy_ncpu(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : (uint32_t)n;
}

/* ---- context ---- */

static __thread char tls_msg[FY_ERRMSG_MAX];
static __thread char tls_new_msg[FY_ERRMSG_MAX];

FERRY_API int ferry_ctx_new(const ferry_ctx_opts *opts, ferry_ctx **out)
{
    ferry_ctx_opts o = {0};
    if (!out) return FERRY_E_INVAL;
    *out = NULL;
    tls_new_msg[0] = '\0';
    if (opts) {
        if (opts->size < offsetof(ferry_ctx_opts, allocator) + sizeof(ferry_allocator) ||
            opts->size > sizeof(ferry_ctx_opts)) {
            snprintf(tls_new_msg, sizeof tls_new_msg, "ferry_ctx_new: opts->size is %u, expected %zu",
                     opts->size, sizeof(ferry_ctx_opts));
            return FERRY_E_INVAL;
        }
        memcpy(&o, opts, opts->size);
    }
    const ferry_allocator *m = &o.allocator;
    int nset = !!m->alloc + !!m->realloc + !!m->free;
    if (nset != 0 && nset != 3) {
        snprintf(tls_new_msg, sizeof tls_new_msg, "ferry_ctx_new: set all three allocator functions or none");
        return FERRY_E_INVAL;
    }
    if (nset == 0) m = fy_default_allocator();
    ferry_ctx *ctx = fy_malloc(m, sizeof *ctx);
    if (!ctx) {
        snprintf(tls_new_msg, sizeof tls_new_msg, "ferry_ctx_new: out of memory");
        return -ENOMEM;
    }
    ctx->mem = *m;
    ctx->nthreads = o.nthreads ? o.nthreads : fy_ncpu();
    ctx->max_header_bytes = o.max_header_bytes;
    ctx->max_tensors =
        o.max_tensors > (uint64_t)INT64_MAX ? 0 : (int64_t)o.max_tensors; /* past any table: none */
    if (ctx->nthreads > 64) ctx->nthreads = 64;
    fy_err_init(&ctx->err);
    *out = ctx;
    return 0;
}

FERRY_API void ferry_ctx_free(ferry_ctx *ctx)
{
    if (!ctx) return;
    fy_err_destroy(&ctx->err);
    ferry_allocator m = ctx->mem;
    fy_free(&m, ctx);
}

FERRY_API const char *ferry_ctx_errmsg(ferry_ctx *ctx)
{
    if (!ctx) return tls_new_msg;
    fy_err_copy(&ctx->err, tls_msg, sizeof tls_msg);
    return tls_msg;
}
