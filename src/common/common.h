/* SPDX-License-Identifier: Apache-2.0 */
/* common.h - internal helpers shared by every module: error reporting, the
 * context's allocator, overflow-checked arithmetic. Depends on nothing else. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>

#include "ferry.h"

#define FY_ERRMSG_MAX 1024

/* Where a detailed message goes. A context owns one; so does every call that
 * cannot reach a context (the parsers write into one the caller passes). */
typedef struct fy_err {
    pthread_mutex_t lock;
    char msg[FY_ERRMSG_MAX];
    struct fy_err *parent; /* gets every message too (a handle's context), or NULL */
} fy_err;

struct ferry_ctx {
    ferry_allocator mem;
    uint32_t nthreads;
    uint64_t max_header_bytes; /* ferry_ctx_opts' caps; 0: none */
    int64_t max_tensors;
    fy_err err;
};

/* Record a message and return code. The message is formatted outside the lock. */
int fy_seterr(fy_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int fy_vseterr(fy_err *e, int code, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
void fy_err_init(fy_err *e);
/* A handle's message slot whose messages also go to parent (its context's). */
void fy_err_init_child(fy_err *e, fy_err *parent);
void fy_err_destroy(fy_err *e);
void fy_err_copy(fy_err *e, char *buf, size_t n);
/* A handle's message for ferry_*_errmsg: a copy owned by the calling thread,
 * valid until its next *_errmsg call; "" for a NULL handle or no failure. */
const char *fy_err_public(fy_err *e);
/* Put msg on e alone (not its parents, which already have it). */
void fy_err_adopt(fy_err *e, const char *msg);

/* `size`-versioned structs (ferry.h's conventions), all checked here.
 * In: copy the caller's options (in->size bytes, the rest of dst zeroed);
 * FERRY_E_INVAL when size is below FERRY_STRUCT_MIN or above full. NULL in:
 * all defaults. what names the call in the message. */
int fy_struct_in(void *dst, size_t full, const void *in, fy_err *err, const char *what);
/* Out: give the caller what src holds, no more than its size bytes (its size
 * field is kept); FERRY_E_INVAL when out is NULL or its size is below
 * FERRY_STRUCT_MIN. A larger size (a newer caller) gets full bytes. */
int fy_struct_out(void *out, const void *src, size_t full);

/* Error-path helpers (zstd's RETURN_ERROR_IF / FORWARD_IF_ERROR). */
#define FY_RETURN_IF(cond, err, code, ...)                      \
    do {                                                        \
        if (cond) return fy_seterr((err), (code), __VA_ARGS__); \
    } while (0)
#define FY_TRY(expr)                   \
    do {                               \
        int fy_rc_ = (expr);           \
        if (fy_rc_ < 0) return fy_rc_; \
    } while (0)

/* Allocation through the context's allocator. */
void *fy_malloc(const ferry_allocator *m, size_t n);
void *fy_calloc(const ferry_allocator *m, size_t count, size_t size);
void *fy_realloc(const ferry_allocator *m, void *p, size_t n);
void fy_free(const ferry_allocator *m, void *p);
char *fy_strndup(const ferry_allocator *m, const char *s, size_t n);
const ferry_allocator *fy_default_allocator(void);

/* Overflow-checked arithmetic: return true on overflow. */
static inline bool fy_mul_ovf(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline bool fy_add_ovf(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

/* Well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). On failure *bad
 * gets the offset of the first bad byte. */
bool fy_utf8_valid(const char *s, size_t n, size_t *bad);

/* Write s into buf (size n) as a JSON-style quoted, escaped, possibly shortened
 * string for messages: hostile names must not break a one-line message. */
const char *fy_quote(char *buf, size_t n, const char *s);

/* Progress from worker threads: bytes are added from any thread; the callback
 * is called one call at a time, never with a smaller count than before, and the
 * last call carries the total. fn may be NULL (then only counting). */
typedef struct fy_progress {
    void (*fn)(void *opaque, uint64_t done, uint64_t total);
    void *opaque;
    uint64_t total;
    atomic_ullong done;
    pthread_mutex_t lock;
    uint64_t reported;
} fy_progress;
void fy_progress_init(fy_progress *p, void (*fn)(void *, uint64_t, uint64_t), void *opaque, uint64_t total);
void fy_progress_add(fy_progress *p, uint64_t n);
void fy_progress_destroy(fy_progress *p);

/* Number of online CPUs, at least 1. */
uint32_t fy_ncpu(void);
/* Seconds on the monotonic clock. */
double fy_now(void);
/* Sleep until fy_now() reaches t (signals do not cut it short). */
void fy_sleep_until(double t);

#endif /* FERRY_COMMON_H */
