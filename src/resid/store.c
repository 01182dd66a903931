/* store.c - the residency store: models, tensors, tiers, budgets (DESIGN.md
 * §4-§6). resid/ decides, xfer/ moves: the policy is policy.c, the moves are
 * xfer.h's, the spill file is spill.c, the host's real limits memstat.c.
 * One lock per store; transfers run under it. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/ranges.h"
#include "../xfer/xfer.h"
#include "memstat.h"
#include "policy.h"
#include "spill.h"

#define PCHUNK (256ull << 20) /* pinned pool grows by this much (at least) */

typedef struct rtensor {
    const struct ferry_model *owner; /* with group: a group's identity across models */
    int32_t file;
    int64_t idx; /* in its file */
    const char *name;
    uint64_t nbytes;
    ferry_tier tier;
    bool dirty;
    int pins;
    int64_t group;
    fy_dptr dptr;   /* DEVICE */
    uint64_t dsize; /* the device block's size (a reused block may be larger) */
    void *host;     /* PINNED / HOST */
    uint64_t soff;  /* SPILL: offset in the spill file */
    bool keep;      /* evict_tensors: stays on the device with its group */
} rtensor;

struct ferry_model {
    ferry_store *s;
    char *name;
    int priority;
    uint64_t last_use;
    ferry_file **files;
    int nfiles;
    rtensor *t;
    int64_t n;
    int64_t *by_name; /* tensor indices sorted by name */
};

/* pinned pool: chunks of pinned memory, each with its free ranges */
typedef struct pchunk {
    uint8_t *base;
    uint64_t size;
    fy_ranges fr;
} pchunk;

typedef struct counters {
    uint64_t htod, dtoh, written, read, evicted, dropped;
    double s_htod, s_dtoh;
} counters;

struct ferry_store {
    ferry_device *dev;
    ferry_ctx *ctx;
    const ferry_allocator *m;
    pthread_mutex_t lock;
    ferry_store_opts o;
    char *spill_dir;
    ferry_model **models;
    int nmodels, cap_models;
    uint64_t clock;
    uint64_t device_used, host_used, pinned_used; /* pinned_used: of the pool, in use */
    pchunk *chunks;
    int nchunks;
    uint64_t pool_bytes;
    fy_spill *spill;
    bool spilling;
    /* device blocks of evicted tensors, kept for reuse (no driver call, and
     * memory the copy engine has written before: bench_alloc) until
     * ferry_store_make_room gives them back */
    fy_range *cache; /* off = device address, len = size */
    int ncache, cap_cache;
    uint64_t cached;
    counters c;
    /* the open job */
    bool job_open;
    char job[64];
    double job_t0;
    counters job_c;
    fy_memsampler *sampler;
};

FERRY_API const char *ferry_tier_name(ferry_tier t)
{
    static const char *const names[] = {"device", "pinned", "host", "source", "spill"};
    return (unsigned)t < FERRY_TIER_COUNT ? names[t] : "unknown";
}

/* ---- pinned pool ---- */

static int pool_alloc(ferry_store *s, uint64_t n, void **out)
{
    n = (n + 4095) & ~4095ull;
    int bc = -1; /* best fit over every chunk */
    size_t bi = 0;
    for (int c = 0; c < s->nchunks; c++) {
        const fy_ranges *fr = &s->chunks[c].fr;
        size_t i = fy_ranges_best(fr, n);
        if (i < fr->n && (bc < 0 || fr->v[i].len < s->chunks[bc].fr.v[bi].len)) bc = c, bi = i;
    }
    if (bc < 0) { /* grow */
        uint64_t size = n > PCHUNK ? (n + (2u << 20) - 1) & ~((2ull << 20) - 1) : PCHUNK;
        if (s->pool_bytes + size > s->o.pinned_budget) {
            if (s->pool_bytes + n > s->o.pinned_budget) return FERRY_E_BUDGET;
            size = n; /* the last bit of the budget */
        }
        pchunk *nc = fy_realloc(s->m, s->chunks, (size_t)(s->nchunks + 1) * sizeof *nc);
        if (!nc) return -ENOMEM;
        s->chunks = nc;
        pchunk *c = &nc[s->nchunks];
        memset(c, 0, sizeof *c);
        if (fy_ranges_give(&c->fr, s->m, 0, size) < 0) return -ENOMEM;
        int rc = fy_xfer_pinned_alloc(s->dev, size, (void **)&c->base);
        if (rc < 0) {
            fy_ranges_free(&c->fr, s->m);
            return rc;
        }
        c->size = size;
        s->pool_bytes += size;
        bc = s->nchunks++;
        bi = 0;
    }
    pchunk *c = &s->chunks[bc];
    *out = c->base + c->fr.v[bi].off;
    fy_ranges_take(&c->fr, bi, n);
    s->pinned_used += n;
    return 0;
}

/* Never fails: when the chunk's free list cannot grow, the range is lost to
 * fragmentation until the store is freed. */
static void pool_free(ferry_store *s, void *p, uint64_t n)
{
    n = (n + 4095) & ~4095ull;
    for (int ci = 0; ci < s->nchunks; ci++) {
        pchunk *c = &s->chunks[ci];
        if ((uint8_t *)p < c->base || (uint8_t *)p >= c->base + c->size) continue;
        (void)fy_ranges_give(&c->fr, s->m, (uint64_t)((uint8_t *)p - c->base), n);
        break;
    }
    s->pinned_used -= n;
}

/* Unpin and free the pool's chunks that hold nothing. */
static void pool_trim(ferry_store *s)
{
    for (int c = 0; c < s->nchunks;) {
        pchunk *ch = &s->chunks[c];
        if (ch->fr.n == 1 && ch->fr.v[0].off == 0 && ch->fr.v[0].len == ch->size) {
            fy_xfer_pinned_free(s->dev, ch->base);
            fy_ranges_free(&ch->fr, s->m);
            s->pool_bytes -= ch->size;
            s->chunks[c] = s->chunks[--s->nchunks];
        } else {
            c++;
        }
    }
}

/* ---- tensors' host copies ---- */

/* Drop whatever copy t has off the device (after it came back, or on removal). */
static void release_copy(ferry_store *s, rtensor *t)
{
    if (t->tier == FERRY_TIER_PINNED) {
        pool_free(s, t->host, t->nbytes);
    } else if (t->tier == FERRY_TIER_HOST) {
        fy_free(s->m, t->host);
        s->host_used -= t->nbytes;
    } else if (t->tier == FERRY_TIER_SPILL) {
        fy_spill_release(s->spill, t->soff, t->nbytes);
    }
    t->host = NULL;
    t->soff = 0;
}

/* Give cached device blocks back to the driver until at least want bytes
 * were returned (UINT64_MAX: all). */
static uint64_t cache_release(ferry_store *s, uint64_t want)
{
    uint64_t got = 0;
    while (s->ncache && got < want) {
        fy_range b = s->cache[--s->ncache];
        fy_xfer_dev_free(s->dev, (fy_dptr)b.off);
        s->cached -= b.len;
        got += b.len;
    }
    return got;
}

/* A device block of at least n bytes: a cached one that fits (not wasting
 * more than an eighth), else a new one; on failure the cache is given back and
 * the allocation tried once more. */
static int dev_alloc(ferry_store *s, rtensor *t)
{
    uint64_t n = t->nbytes;
    int best = -1;
    for (int i = 0; i < s->ncache; i++)
        if (s->cache[i].len >= n && s->cache[i].len - n <= n / 8 &&
            (best < 0 || s->cache[i].len < s->cache[best].len))
            best = i;
    if (best >= 0) {
        t->dptr = (fy_dptr)s->cache[best].off;
        t->dsize = s->cache[best].len;
        s->cached -= t->dsize;
        s->cache[best] = s->cache[--s->ncache];
    } else {
        uint64_t held = s->device_used + s->cached + n; /* the budget bounds what the store holds */
        if (held > s->o.device_budget) cache_release(s, held - s->o.device_budget);
        int rc = fy_xfer_dev_alloc(s->dev, n, &t->dptr);
        if (rc < 0 && s->ncache) {
            cache_release(s, UINT64_MAX);
            rc = fy_xfer_dev_alloc(s->dev, n, &t->dptr);
        }
        if (rc < 0) return rc;
        t->dsize = n;
    }
    s->device_used += t->dsize; /* what the store holds: a reused block may be larger */
    return 0;
}

static void dev_free(ferry_store *s, rtensor *t)
{
    if (t->dptr) {
        if (s->ncache == s->cap_cache) {
            int cap = s->cap_cache ? 2 * s->cap_cache : 64;
            fy_range *nc = fy_realloc(s->m, s->cache, (size_t)cap * sizeof *nc);
            if (nc) s->cache = nc, s->cap_cache = cap;
        }
        if (s->ncache < s->cap_cache) {
            s->cache[s->ncache++] = (fy_range){(uint64_t)t->dptr, t->dsize};
            s->cached += t->dsize;
        } else {
            fy_xfer_dev_free(s->dev, t->dptr); /* no room to remember it: give it back */
        }
    }
    s->device_used -= t->dsize;
    t->dptr = 0;
    t->dsize = 0;
}

/* ---- opening ---- */

static uint64_t or_default(uint64_t v, uint64_t d) { return v ? v : d; }

FERRY_API int ferry_store_new(ferry_device *dev, const ferry_store_opts *opts, ferry_store **out)
{
    if (!dev || !out) return FERRY_E_INVAL;
    *out = NULL;
    ferry_ctx *ctx = fy_device_ctx(dev);
    ferry_store_opts o = {0};
    if (opts) {
        FY_RETURN_IF(opts->size < sizeof(uint32_t) || opts->size > sizeof o, &ctx->err, FERRY_E_INVAL,
                     "ferry_store_new: opts->size is %u, expected %zu", opts->size, sizeof o);
        memcpy(&o, opts, opts->size);
    }
    o.size = sizeof o;
    if (o.load.size == 0) o.load.size = sizeof o.load; /* all defaults */
    o.device_reserve = or_default(o.device_reserve, 512ull << 20);
    o.host_reserve = or_default(o.host_reserve, 1ull << 30);
    if (!o.device_budget) {
        uint64_t fr = 0, tot = 0;
        FY_TRY(ferry_device_mem_info(dev, &fr, &tot));
        o.device_budget = fr > o.device_reserve ? fr - o.device_reserve : 0;
    }
    if (!o.host_budget) {
        uint64_t avail = 0;
        char src[128];
        int rc = fy_host_available(&avail, src, sizeof src);
        if (rc < 0) return fy_seterr(&ctx->err, rc, "ferry_store_new: cannot tell how much host memory is available (%s)",
                                     ferry_strerror(rc));
        o.host_budget = avail > o.host_reserve ? avail - o.host_reserve : 0;
    }
    o.pinned_budget = or_default(o.pinned_budget, o.host_budget / 4);
    if (o.pinned_budget > o.host_budget) o.pinned_budget = o.host_budget;
    o.spill_below = or_default(o.spill_below, 2 * o.host_reserve);
    o.spill_above = or_default(o.spill_above, o.spill_below + (1ull << 30));
    FY_RETURN_IF(o.spill_above < o.spill_below, &ctx->err, FERRY_E_INVAL,
                 "ferry_store_new: spill_above (%" PRIu64 ") is below spill_below (%" PRIu64 ")", o.spill_above,
                 o.spill_below);
    /* the environment (FERRY_SPILL_DIR) is the CLI's and the binding's to read */
    const char *dir = o.spill_dir && *o.spill_dir ? o.spill_dir : "/var/tmp";
    ferry_store *s = fy_calloc(&ctx->mem, 1, sizeof *s);
    char *d = s ? fy_strndup(&ctx->mem, dir, strlen(dir)) : NULL;
    if (!s || !d) {
        fy_free(&ctx->mem, s);
        return fy_seterr(&ctx->err, -ENOMEM, "out of memory");
    }
    s->dev = dev;
    s->ctx = ctx;
    s->m = &ctx->mem;
    s->o = o;
    s->spill_dir = d;
    s->o.spill_dir = d;
    pthread_mutex_init(&s->lock, NULL);
    *out = s;
    return 0;
}

static void model_free(ferry_model *m);

FERRY_API void ferry_store_free(ferry_store *s)
{
    if (!s) return;
    fy_xfer_bind(s->dev);
    for (int i = 0; i < s->nmodels; i++) model_free(s->models[i]);
    fy_free(s->m, s->models);
    cache_release(s, UINT64_MAX);
    fy_free(s->m, s->cache);
    for (int c = 0; c < s->nchunks; c++) {
        fy_xfer_pinned_free(s->dev, s->chunks[c].base);
        fy_ranges_free(&s->chunks[c].fr, s->m);
    }
    fy_free(s->m, s->chunks);
    fy_spill_close(s->spill);
    if (s->sampler) fy_memsampler_stop(s->sampler, NULL);
    fy_free(s->m, s->spill_dir);
    pthread_mutex_destroy(&s->lock);
    fy_free(s->m, s);
}

/* ---- models ---- */

static int cmp_tname(const void *a, const void *b, void *arg)
{
    const ferry_model *m = arg;
    int c = strcmp(m->t[*(const int64_t *)a].name, m->t[*(const int64_t *)b].name);
    if (c) return c;
    return (*(const int64_t *)a > *(const int64_t *)b) - (*(const int64_t *)a < *(const int64_t *)b);
}

/* length of name's module prefix (up to the last '.'), or its whole length */
static size_t prefix_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

static int cmp_prefix(const void *a, const void *b, void *arg)
{
    const ferry_model *m = arg;
    const char *x = m->t[*(const int64_t *)a].name, *y = m->t[*(const int64_t *)b].name;
    size_t lx = prefix_len(x), ly = prefix_len(y);
    int c = memcmp(x, y, lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (*(const int64_t *)a > *(const int64_t *)b) - (*(const int64_t *)a < *(const int64_t *)b);
}

static void model_free(ferry_model *m)
{
    if (!m) return;
    ferry_store *s = m->s;
    fy_spill_hold(s->spill); /* punched later, like after a reload */
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (t->tier == FERRY_TIER_DEVICE) dev_free(s, t);
        else release_copy(s, t);
    }
    fy_free(s->m, m->t);
    fy_free(s->m, m->by_name);
    fy_free(s->m, m->files);
    fy_free(s->m, m->name);
    fy_free(s->m, m);
}

static ferry_model *find_model(ferry_store *s, const char *name)
{
    for (int i = 0; i < s->nmodels; i++)
        if (strcmp(s->models[i]->name, name) == 0) return s->models[i];
    return NULL;
}

FERRY_API int ferry_store_add(ferry_store *s, const char *name, ferry_file *const *files, int nfiles, int priority,
                              ferry_model **out)
{
    if (!s || !name || !files || nfiles <= 0 || !out) return FERRY_E_INVAL;
    *out = NULL;
    for (int k = 0; k < nfiles; k++)
        if (!files[k]) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    ferry_model *m = NULL;
    if (find_model(s, name)) {
        rc = fy_seterr(&s->ctx->err, FERRY_E_INVAL, "ferry_store_add: a model called \"%s\" is already in the store",
                       name);
        goto out;
    }
    int64_t n = 0;
    for (int k = 0; k < nfiles; k++) n += ferry_file_tensor_count(files[k]);
    m = fy_calloc(s->m, 1, sizeof *m);
    if (m) m->s = s; /* model_free needs it on the failure path below */
    if (!m || !(m->name = fy_strndup(s->m, name, strlen(name))) ||
        !(m->files = fy_calloc(s->m, (size_t)nfiles, sizeof *m->files)) ||
        !(m->t = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->t)) ||
        !(m->by_name = fy_calloc(s->m, (size_t)(n ? n : 1), sizeof *m->by_name))) {
        rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
        goto out;
    }
    if (s->nmodels == s->cap_models) {
        int cap = s->cap_models ? 2 * s->cap_models : 8;
        ferry_model **nm = fy_realloc(s->m, s->models, (size_t)cap * sizeof *nm);
        if (!nm) {
            rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
            goto out;
        }
        s->models = nm;
        s->cap_models = cap;
    }
    m->s = s;
    m->priority = priority;
    m->nfiles = nfiles;
    memcpy(m->files, files, (size_t)nfiles * sizeof *files);
    m->n = n;
    int64_t i = 0;
    for (int k = 0; k < nfiles; k++)
        for (int64_t j = 0; j < ferry_file_tensor_count(files[k]); j++, i++) {
            rtensor *t = &m->t[i];
            ferry_tensor_info ti;
            ferry_file_tensor_info(files[k], j, &ti); /* j is in range: cannot fail */
            t->owner = m;
            t->file = k;
            t->idx = j;
            t->name = ti.name;
            t->nbytes = ti.nbytes;
            t->tier = FERRY_TIER_SOURCE;
        }
    /* groups: one per module prefix; a group's id is the index of a member */
    for (i = 0; i < n; i++) m->by_name[i] = i;
    qsort_r(m->by_name, (size_t)n, sizeof *m->by_name, cmp_prefix, m);
    int64_t g = -1;
    for (i = 0; i < n; i++) {
        rtensor *t = &m->t[m->by_name[i]];
        const char *prev = i ? m->t[m->by_name[i - 1]].name : NULL;
        size_t pl = prefix_len(t->name);
        if (!prev || prefix_len(prev) != pl || memcmp(prev, t->name, pl) != 0) g = m->by_name[i];
        t->group = g;
    }
    for (i = 0; i < n; i++) m->by_name[i] = i;
    qsort_r(m->by_name, (size_t)n, sizeof *m->by_name, cmp_tname, m);
    s->models[s->nmodels++] = m;
    *out = m;
    m = NULL;
out:
    if (m) model_free(m);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_store_remove(ferry_model *m)
{
    if (!m) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    for (int64_t i = 0; i < m->n; i++)
        if (m->t[i].pins) {
            pthread_mutex_unlock(&s->lock);
            return fy_seterr(&s->ctx->err, FERRY_E_INVAL, "model \"%s\": tensor %s is pinned: unpin it first", m->name,
                             m->t[i].name);
        }
    for (int i = 0; i < s->nmodels; i++)
        if (s->models[i] == m) {
            s->models[i] = s->models[--s->nmodels];
            break;
        }
    fy_xfer_bind(s->dev);
    model_free(m);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

FERRY_API ferry_model *ferry_store_find(ferry_store *s, const char *name)
{
    if (!s || !name) return NULL;
    pthread_mutex_lock(&s->lock);
    ferry_model *m = find_model(s, name);
    pthread_mutex_unlock(&s->lock);
    return m;
}

FERRY_API const char *ferry_model_name(const ferry_model *m) { return m ? m->name : ""; }
FERRY_API int64_t ferry_model_tensor_count(const ferry_model *m) { return m ? m->n : FERRY_E_INVAL; }

FERRY_API int64_t ferry_model_find(const ferry_model *m, const char *name)
{
    if (!m || !name) return FERRY_E_INVAL;
    int64_t lo = 0, hi = m->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (strcmp(m->t[m->by_name[mid]].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n && strcmp(m->t[m->by_name[lo]].name, name) == 0 ? m->by_name[lo] : FERRY_E_NOTFOUND;
}

FERRY_API int ferry_model_group(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0 || (n && !tensors)) return FERRY_E_INVAL;
    for (int64_t k = 0; k < n; k++)
        if (tensors[k] < 0 || tensors[k] >= m->n) return FERRY_E_INVAL;
    if (n < 2) return 0;
    pthread_mutex_lock(&m->s->lock);
    /* the groups joined must all be in one tier: refuse mixing device and not */
    bool on = m->t[tensors[0]].tier == FERRY_TIER_DEVICE;
    for (int64_t k = 1; k < n; k++)
        for (int64_t i = 0; i < m->n; i++)
            if (m->t[i].group == m->t[tensors[k]].group && (m->t[i].tier == FERRY_TIER_DEVICE) != on) {
                pthread_mutex_unlock(&m->s->lock);
                return fy_seterr(&m->s->ctx->err, FERRY_E_INVAL,
                                 "model \"%s\": cannot group tensors of which some are on the device and some not",
                                 m->name);
            }
    int64_t g = m->t[tensors[0]].group;
    for (int64_t k = 1; k < n; k++) {
        int64_t old = m->t[tensors[k]].group;
        if (old == g) continue;
        for (int64_t i = 0; i < m->n; i++)
            if (m->t[i].group == old) m->t[i].group = g;
    }
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

FERRY_API int ferry_model_set_priority(ferry_model *m, int priority)
{
    if (!m) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    m->priority = priority;
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

/* ---- selection: a request's tensors and their groups ---- */

/* sel[i] = true for tensors[0..n-1] (NULL: all) and every member of their groups */
static int select_groups(ferry_model *m, const int64_t *tensors, int64_t n, bool *sel)
{
    if (!tensors) {
        for (int64_t i = 0; i < m->n; i++) sel[i] = true;
        return 0;
    }
    memset(sel, 0, (size_t)m->n);
    for (int64_t k = 0; k < n; k++) {
        if (tensors[k] < 0 || tensors[k] >= m->n)
            return fy_seterr(&m->s->ctx->err, FERRY_E_INVAL, "model \"%s\": tensor index %" PRId64 " out of range",
                             m->name, tensors[k]);
        sel[tensors[k]] = true;
    }
    /* close over groups: a group is in when any member is */
    for (int64_t i = 0; i < m->n; i++)
        if (sel[i]) sel[m->t[i].group] = true; /* mark the group id (a member index) */
    for (int64_t i = 0; i < m->n; i++)
        if (sel[m->t[i].group]) sel[i] = true;
    return 0;
}

/* ---- eviction (under the lock) ---- */

/* Take the listed device tensors off the device: clean ones dropped; dirty
 * ones saved by the host policy. A tensor whose save failed stays on the
 * device. Returns 0 or the first error. */
static int evict_tensors(ferry_store *s, rtensor **ts, int64_t n)
{
    const ferry_allocator *m = s->m;
    int rc = fy_xfer_bind(s->dev);
    if (rc < 0) return rc;
    /* decide each dirty tensor's destination */
    fy_hoststate h = {.host_budget = s->o.host_budget, .host_used = s->host_used + s->pinned_used,
                      .pinned_budget = s->o.pinned_budget, .pinned_used = s->pinned_used,
                      .spill_below = s->o.spill_below, .spill_above = s->o.spill_above, .spilling = s->spilling};
    bool need_avail = false;
    for (int64_t k = 0; k < n; k++) need_avail |= ts[k]->dirty;
    if (need_avail && fy_host_available(&h.available, NULL, 0) < 0) h.available = 0; /* unknown: spill */
    fy_hostrange *hr = fy_calloc(m, (size_t)(n ? n : 1), sizeof *hr);
    rtensor **hrt = fy_calloc(m, (size_t)(n ? n : 1), sizeof *hrt);
    fy_fdrange *fr = fy_calloc(m, (size_t)(n ? n : 1), sizeof *fr);
    rtensor **frt = fy_calloc(m, (size_t)(n ? n : 1), sizeof *frt);
    int64_t nh = 0, nf = 0;
    if (!hr || !hrt || !fr || !frt) {
        rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int64_t k = 0; k < n; k++) {
        rtensor *t = ts[k];
        if (!t->dirty || t->nbytes == 0) continue; /* an empty tensor has nothing to save */
        fy_dest d = fy_policy_dest(&h, t->nbytes);
        void *p = NULL;
        if (d == FY_DEST_PINNED) {
            if (pool_alloc(s, t->nbytes, &p) == 0) {
                t->host = p;
                t->tier = FERRY_TIER_PINNED; /* provisional: undone on failure */
                h.pinned_used += t->nbytes;
                h.host_used += t->nbytes;
                h.available = h.available > t->nbytes ? h.available - t->nbytes : 0;
                hr[nh] = (fy_hostrange){p, t->dptr, t->nbytes};
                hrt[nh++] = t;
                continue;
            }
            d = FY_DEST_HOST; /* pool could not grow: pageable */
        }
        if (d == FY_DEST_HOST) {
            if ((p = fy_malloc(m, (size_t)t->nbytes)) != NULL) {
                t->host = p;
                t->tier = FERRY_TIER_HOST;
                s->host_used += t->nbytes;
                h.host_used += t->nbytes;
                h.available = h.available > t->nbytes ? h.available - t->nbytes : 0;
                hr[nh] = (fy_hostrange){p, t->dptr, t->nbytes};
                hrt[nh++] = t;
                continue;
            }
        }
        frt[nf] = t;
        fr[nf++] = (fy_fdrange){0, t->nbytes, t->dptr};
    }
    s->spilling = h.spilling;
    /* RAM copies */
    double t0 = fy_now();
    if (nh) {
        rc = fy_xfer_device_to_host(s->dev, hr, nh, NULL);
        if (rc < 0) {
            for (int64_t k = 0; k < nh; k++) {
                release_copy(s, hrt[k]);
                hrt[k]->tier = FERRY_TIER_DEVICE;
            }
            nh = 0;
        }
    }
    /* spills: reserve everything first, so a spill never fails half-way for space */
    if (rc == 0 && nf) {
        if (!s->spill) rc = fy_spill_open(s->spill_dir, s->m, &s->ctx->err, &s->spill);
        int64_t got = 0; /* ranges reserved: fr[0..got-1] */
        for (; rc == 0 && got < nf; got++) {
            rc = fy_spill_reserve(s->spill, fr[got].len, &fr[got].off);
            if (rc < 0) {
                /* fr[got] was not reserved: never release it (its offset is
                 * another tensor's); break before the loop counts it */
                uint64_t need = 0;
                for (int64_t k = got; k < nf; k++) need += fr[k].len;
                char msg[FY_ERRMSG_MAX];
                fy_err_copy(&s->ctx->err, msg, sizeof msg);
                fy_seterr(&s->ctx->err, rc, "spilling %" PRId64 " dirty tensors needs %" PRIu64
                          " more bytes in %s: %s (the tensors stay on the device)", nf - got, need, s->spill_dir, msg);
                break;
            }
        }
        if (rc == 0) rc = fy_xfer_device_to_fd(s->dev, fy_spill_fd(s->spill), s->spill_dir, fr, nf, &s->o.load, NULL);
        if (rc < 0) {
            fy_spill_hold(s->spill);
            for (int64_t k = 0; k < got && k < nf; k++) fy_spill_release(s->spill, fr[k].off, fr[k].len);
            nf = 0;
        } else {
            for (int64_t k = 0; k < nf; k++) {
                frt[k]->tier = FERRY_TIER_SPILL;
                frt[k]->soff = fr[k].off;
                s->c.written += fr[k].len;
            }
        }
    }
    /* after a spill, what it did not reuse goes back to the file system */
    if (nf) fy_spill_flush(s->spill);
    double dt = fy_now() - t0;
    /* A group moves together: when a dirty member could not be saved, the
     * whole group stays on the device (its saved members' copies dropped). */
    int64_t nkeep = 0;
    for (int64_t k = 0; k < n; k++)
        if (ts[k]->dirty && ts[k]->nbytes && ts[k]->tier == FERRY_TIER_DEVICE) nkeep++;
    if (nkeep) {
        for (int64_t k = 0; k < n; k++) {
            rtensor *t = ts[k];
            bool keep = false;
            for (int64_t q = 0; q < n && !keep; q++)
                keep = ts[q]->dirty && ts[q]->nbytes && ts[q]->tier == FERRY_TIER_DEVICE &&
                       ts[q]->owner == t->owner && ts[q]->group == t->group;
            if (!keep) continue;
            if (t->tier != FERRY_TIER_DEVICE) { /* a saved member: undo the save */
                if (t->tier == FERRY_TIER_SPILL) fy_spill_hold(s->spill);
                release_copy(s, t);
                t->tier = FERRY_TIER_DEVICE;
            }
            t->keep = true;
        }
    }
    /* free device memory of what left: the dropped clean ones and the saved dirty ones */
    uint64_t moved = 0;
    for (int64_t k = 0; k < n; k++) {
        rtensor *t = ts[k];
        if (t->keep) { /* its group could not leave whole: it stays */
            t->keep = false;
            continue;
        }
        if (!t->dirty || t->nbytes == 0) {
            s->c.dropped++;
            t->tier = FERRY_TIER_SOURCE; /* an empty dirty tensor keeps its flag: nothing to lose */
        } else {
            moved += t->nbytes;
        }
        dev_free(s, t);
        s->c.evicted++;
    }
    s->c.dtoh += moved;
    s->c.s_dtoh += dt;
out:
    fy_free(m, hr);
    fy_free(m, hrt);
    fy_free(m, fr);
    fy_free(m, frt);
    return rc;
}

/* Room on the device: the budget's room, and the device's real free memory. */
static uint64_t room_now(ferry_store *s)
{
    uint64_t room = s->o.device_budget > s->device_used ? s->o.device_budget - s->device_used : 0;
    uint64_t fr = 0, tot = 0;
    if (ferry_device_mem_info(s->dev, &fr, &tot) == 0 && fr + s->cached < room) room = fr + s->cached;
    return room;
}

/* Make bytes of room, never touching protected tensors (prot: per model, per
 * tensor, may be NULL). *could = what could be freed when impossible. */
static int64_t make_room_locked(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot, uint64_t *could)
{
    uint64_t room = room_now(s);
    uint64_t need = bytes == UINT64_MAX ? UINT64_MAX : (bytes > room ? bytes - room : 0);
    if (could) *could = 0;
    if (need == 0) return 0;
    /* candidates: device groups of every model */
    int64_t nc = 0;
    for (int i = 0; i < s->nmodels; i++) nc += s->models[i]->n;
    fy_cand *c = fy_calloc(s->m, (size_t)(nc ? nc : 1), sizeof *c);
    int64_t *out = fy_calloc(s->m, (size_t)(nc ? nc : 1), sizeof *out);
    int64_t *gm = fy_calloc(s->m, (size_t)(nc ? nc : 1), sizeof *gm); /* candidate -> model */
    if (!c || !out || !gm) {
        fy_free(s->m, c), fy_free(s->m, out), fy_free(s->m, gm);
        return fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
    }
    int64_t *gid = fy_calloc(s->m, (size_t)(nc ? nc : 1), sizeof *gid); /* candidate -> group id */
    if (!gid) {
        fy_free(s->m, c), fy_free(s->m, out), fy_free(s->m, gm);
        return fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
    }
    int64_t k = 0;
    for (int i = 0; i < s->nmodels; i++) {
        ferry_model *m = s->models[i];
        for (int64_t j = 0; j < m->n; j++) {
            if (m->t[j].group != j) continue; /* one candidate per group, at its id */
            fy_cand *cd = &c[k];
            cd->priority = m->priority;
            cd->last_use = m->last_use;
            cd->id = k;
            gm[k] = i;
            gid[k] = j;
            k++;
        }
        /* bytes and protection of each of this model's groups, in one pass */
        for (int64_t q = 0; q < m->n; q++) {
            rtensor *u = &m->t[q];
            if (u->tier != FERRY_TIER_DEVICE) continue;
            int64_t lo = k - 1;
            while (lo >= 0 && gm[lo] == i && gid[lo] != u->group) lo--; /* this model's candidates */
            if (lo < 0 || gm[lo] != i) continue;
            c[lo].bytes += u->nbytes;
            if (u->pins || (m == pm && prot && prot[q])) c[lo].protect = true;
        }
    }
    uint64_t freed = 0;
    int64_t chosen = fy_policy_choose(c, k, need, out, &freed);
    int64_t rc = 0;
    if (chosen < 0) {
        if (could) *could = freed + room;
        rc = fy_seterr(&s->ctx->err, FERRY_E_BUDGET,
                       "the device needs %" PRIu64 " bytes free but only %" PRIu64 " can be made (%" PRIu64
                       " free now + %" PRIu64 " evictable): nothing was evicted", bytes, freed + room, room, freed);
    } else if (chosen > 0) {
        /* the chosen groups' device tensors, in eviction order */
        int64_t nt = 0;
        for (int64_t q = 0; q < chosen; q++) {
            ferry_model *m = s->models[gm[out[q]]];
            for (int64_t j = 0; j < m->n; j++)
                if (m->t[j].group == gid[out[q]] && m->t[j].tier == FERRY_TIER_DEVICE) nt++;
        }
        rtensor **ts = fy_calloc(s->m, (size_t)(nt ? nt : 1), sizeof *ts);
        if (!ts) {
            rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
        } else {
            nt = 0;
            for (int64_t q = 0; q < chosen; q++) {
                ferry_model *m = s->models[gm[out[q]]];
                for (int64_t j = 0; j < m->n; j++)
                    if (m->t[j].group == gid[out[q]] && m->t[j].tier == FERRY_TIER_DEVICE) ts[nt++] = &m->t[j];
            }
            uint64_t before = s->device_used;
            int erc = evict_tensors(s, ts, nt);
            uint64_t got = before - s->device_used;
            fy_free(s->m, ts);
            rc = erc < 0 ? erc : (int64_t)got;
        }
    }
    fy_free(s->m, c);
    fy_free(s->m, out);
    fy_free(s->m, gm);
    fy_free(s->m, gid);
    return rc;
}

FERRY_API int64_t ferry_store_make_room(ferry_store *s, uint64_t bytes, uint64_t *could)
{
    if (!s) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    fy_xfer_bind(s->dev);
    int64_t rc = make_room_locked(s, bytes, NULL, NULL, could);
    /* the caller wants device memory for itself: hand back what the store
     * keeps for reuse, not only what it just evicted */
    if (rc >= 0) cache_release(s, UINT64_MAX);
    if (rc >= 0 && s->spill) fy_spill_flush(s->spill); /* and disk space held for reuse */
    if (rc >= 0) pool_trim(s);                              /* and pinned RAM nobody uses */
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- to the device ---- */

FERRY_API int ferry_model_to_device(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0) return FERRY_E_INVAL; /* tensors NULL: all */
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    bool *sel = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *sel);
    int64_t *idx = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *idx);
    uint64_t *dp = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *dp);
    fy_hostrange *hr = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *hr);
    fy_fdrange *fr = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *fr);
    int rc = 0;
    if (!sel || !idx || !dp || !hr || !fr) {
        rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = select_groups(m, tensors, n, sel)) < 0) goto out;
    uint64_t need = 0;
    for (int64_t i = 0; i < m->n; i++)
        if (sel[i] && m->t[i].tier != FERRY_TIER_DEVICE) need += m->t[i].nbytes;
    m->last_use = ++s->clock;
    int64_t mr = need ? make_room_locked(s, need, m, sel, NULL) : 0; /* empty tensors need no room */
    if (mr < 0) {
        rc = (int)mr;
        char msg[FY_ERRMSG_MAX];
        fy_err_copy(&s->ctx->err, msg, sizeof msg);
        fy_seterr(&s->ctx->err, rc, "model \"%s\": %s", m->name, msg);
        goto out;
    }
    if ((rc = fy_xfer_bind(s->dev)) < 0) goto out;
    /* allocate, then move tier by tier; on failure free what this call allocated */
    for (int64_t i = 0; i < m->n && rc == 0; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || t->tier == FERRY_TIER_DEVICE) continue;
        if (t->nbytes == 0) continue;
        rc = dev_alloc(s, t);
    }
    double t0 = fy_now();
    uint64_t moved = 0, read = 0;
    /* SOURCE: file by file, through the transfer engine */
    for (int k = 0; k < m->nfiles && rc == 0; k++) {
        int64_t cnt = 0;
        for (int64_t i = 0; i < m->n; i++) {
            rtensor *t = &m->t[i];
            if (sel[i] && t->file == k && t->tier == FERRY_TIER_SOURCE && t->nbytes) {
                idx[cnt] = t->idx;
                dp[cnt++] = t->dptr;
                moved += t->nbytes;
            }
        }
        if (cnt) rc = ferry_load_into(s->dev, m->files[k], idx, dp, cnt, &s->o.load, NULL);
    }
    read = moved;
    /* PINNED / HOST: plain copies */
    int64_t nh = 0, nf = 0;
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || !t->nbytes) continue;
        if (t->tier == FERRY_TIER_PINNED || t->tier == FERRY_TIER_HOST) hr[nh++] = (fy_hostrange){t->host, t->dptr, t->nbytes};
        if (t->tier == FERRY_TIER_SPILL) fr[nf++] = (fy_fdrange){t->soff, t->nbytes, t->dptr};
    }
    if (rc == 0 && nh) rc = fy_xfer_host_to_device(s->dev, hr, nh, NULL);
    if (rc == 0 && nf) rc = fy_xfer_fd_to_device(s->dev, fy_spill_fd(s->spill), s->spill_dir, fr, nf, &s->o.load, NULL, NULL);
    double dt = fy_now() - t0;
    for (int64_t i = 0; i < nh; i++) moved += hr[i].len;
    for (int64_t i = 0; i < nf; i++) moved += fr[i].len, read += fr[i].len;
    if (rc < 0) { /* nothing moved: back to where they were */
        for (int64_t i = 0; i < m->n; i++) {
            rtensor *t = &m->t[i];
            if (sel[i] && t->tier != FERRY_TIER_DEVICE && t->dptr) dev_free(s, t);
        }
        goto out;
    }
    /* The spill ranges stay allocated for the next spill: giving 10 GB back to
     * ext4 (truncate or punch) took 0.5-2.8 s on the H200 host, far longer
     * than reading it back. They are punched after the next spill, or by
     * ferry_store_make_room. */
    fy_spill_hold(s->spill);
    for (int64_t i = 0; i < m->n; i++) {
        rtensor *t = &m->t[i];
        if (!sel[i] || t->tier == FERRY_TIER_DEVICE) continue;
        if (t->nbytes == 0) t->dptr = 0;
        release_copy(s, t); /* the device copy is now the one */
        t->tier = FERRY_TIER_DEVICE;
    }
    s->c.htod += moved;
    s->c.read += read;
    s->c.s_htod += dt;
out:
    fy_free(s->m, sel);
    fy_free(s->m, idx);
    fy_free(s->m, dp);
    fy_free(s->m, hr);
    fy_free(s->m, fr);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_model_evict(ferry_model *m, const int64_t *tensors, int64_t n)
{
    if (!m || n < 0) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    bool *sel = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *sel);
    rtensor **ts = fy_calloc(s->m, (size_t)(m->n ? m->n : 1), sizeof *ts);
    int rc = 0;
    if (!sel || !ts) {
        rc = fy_seterr(&s->ctx->err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = select_groups(m, tensors, n, sel)) < 0) goto out;
    int64_t nt = 0;
    for (int64_t i = 0; i < m->n; i++) {
        if (!sel[i] || m->t[i].tier != FERRY_TIER_DEVICE) continue;
        if (m->t[i].pins) {
            rc = fy_seterr(&s->ctx->err, FERRY_E_INVAL, "model \"%s\": tensor %s is pinned: unpin it before evicting",
                           m->name, m->t[i].name);
            goto out;
        }
        ts[nt++] = &m->t[i];
    }
    rc = evict_tensors(s, ts, nt);
out:
    fy_free(s->m, sel);
    fy_free(s->m, ts);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int check_t(ferry_model *m, int64_t t) { return m && t >= 0 && t < m->n ? 0 : FERRY_E_INVAL; }

FERRY_API int ferry_model_mark_dirty(ferry_model *m, int64_t t)
{
    FY_TRY(check_t(m, t));
    pthread_mutex_lock(&m->s->lock);
    int rc = 0;
    if (m->t[t].tier != FERRY_TIER_DEVICE)
        rc = fy_seterr(&m->s->ctx->err, FERRY_E_INVAL, "model \"%s\": %s is not on the device (it is in %s)", m->name,
                       m->t[t].name, ferry_tier_name(m->t[t].tier));
    else
        m->t[t].dirty = true;
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

static int pin(ferry_model *m, int64_t t, int d)
{
    if (!m || t >= m->n) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    int rc = 0;
    for (int64_t i = t < 0 ? 0 : t; i < (t < 0 ? m->n : t + 1); i++) {
        if (d < 0 && m->t[i].pins == 0) {
            rc = fy_seterr(&m->s->ctx->err, FERRY_E_INVAL, "model \"%s\": %s is not pinned", m->name, m->t[i].name);
            continue;
        }
        m->t[i].pins += d;
    }
    pthread_mutex_unlock(&m->s->lock);
    return rc;
}

FERRY_API int ferry_model_pin(ferry_model *m, int64_t t) { return pin(m, t, 1); }
FERRY_API int ferry_model_unpin(ferry_model *m, int64_t t) { return pin(m, t, -1); }

FERRY_API int ferry_model_tensor_state(ferry_model *m, int64_t t, ferry_tensor_state *out)
{
    FY_TRY(check_t(m, t));
    if (!out) return FERRY_E_INVAL;
    pthread_mutex_lock(&m->s->lock);
    const rtensor *r = &m->t[t];
    out->name = r->name;
    out->nbytes = r->nbytes;
    out->tier = r->tier;
    out->dirty = r->dirty;
    out->pins = r->pins;
    out->group = r->group;
    out->dptr = r->tier == FERRY_TIER_DEVICE ? r->dptr : 0;
    pthread_mutex_unlock(&m->s->lock);
    return 0;
}

FERRY_API int ferry_model_read(ferry_model *m, int64_t t, void *buf)
{
    FY_TRY(check_t(m, t));
    if (!buf) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    rtensor *r = &m->t[t];
    int rc = 0;
    if (r->nbytes == 0) {
    } else if (r->tier == FERRY_TIER_DEVICE) {
        fy_hostrange h = {buf, r->dptr, r->nbytes};
        rc = fy_xfer_device_to_host(s->dev, &h, 1, NULL);
    } else if (r->tier == FERRY_TIER_PINNED || r->tier == FERRY_TIER_HOST) {
        memcpy(buf, r->host, (size_t)r->nbytes);
    } else if (r->tier == FERRY_TIER_SOURCE) {
        rc = ferry_file_tensor_read(m->files[r->file], r->idx, 0, buf, (size_t)r->nbytes);
    } else {
        rc = fy_xfer_fd_to_host(s->dev, fy_spill_fd(s->spill), r->soff, buf, r->nbytes);
        if (rc < 0) fy_seterr(&s->ctx->err, rc, "%s: reading back %s from the spill file: %s", s->spill_dir, r->name,
                              ferry_strerror(rc));
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_model_write(ferry_model *m, int64_t t, const void *buf)
{
    FY_TRY(check_t(m, t));
    if (!buf) return FERRY_E_INVAL;
    ferry_store *s = m->s;
    pthread_mutex_lock(&s->lock);
    rtensor *r = &m->t[t];
    int rc = 0;
    if (r->tier != FERRY_TIER_DEVICE) {
        rc = fy_seterr(&s->ctx->err, FERRY_E_INVAL, "model \"%s\": %s is not on the device (it is in %s)", m->name,
                       r->name, ferry_tier_name(r->tier));
    } else if (r->nbytes) {
        fy_hostrange h = {(void *)(uintptr_t)buf, r->dptr, r->nbytes};
        rc = fy_xfer_host_to_device(s->dev, &h, 1, NULL);
    }
    if (rc == 0) r->dirty = true;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- statistics ---- */

static void tiers(ferry_store *s, uint64_t *tb)
{
    memset(tb, 0, FERRY_TIER_COUNT * sizeof *tb);
    for (int i = 0; i < s->nmodels; i++)
        for (int64_t j = 0; j < s->models[i]->n; j++) tb[s->models[i]->t[j].tier] += s->models[i]->t[j].nbytes;
}

FERRY_API int ferry_store_get_stats(ferry_store *s, ferry_store_stats *out)
{
    if (!s || !out) return FERRY_E_INVAL;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->lock);
    tiers(s, out->tier_bytes);
    out->device_budget = s->o.device_budget;
    out->pinned_budget = s->o.pinned_budget;
    out->host_budget = s->o.host_budget;
    fy_host_available(&out->host_available, out->host_source, sizeof out->host_source);
    out->spilling = s->spilling;
    if (s->spill) {
        snprintf(out->spill_path, sizeof out->spill_path, "%s", s->spill_dir);
        uint64_t res = 0;
        fy_spill_usage(s->spill, &res, &out->spill_file_bytes);
    }
    out->bytes_htod = s->c.htod;
    out->bytes_dtoh = s->c.dtoh;
    out->seconds_htod = s->c.s_htod;
    out->seconds_dtoh = s->c.s_dtoh;
    out->bytes_written = s->c.written;
    out->bytes_read = s->c.read;
    out->evicted = s->c.evicted;
    out->dropped = s->c.dropped;
    out->device_cached = s->cached;
    out->pinned_pool_bytes = s->pool_bytes;
    out->models = s->nmodels;
    for (int i = 0; i < s->nmodels; i++) out->tensors += s->models[i]->n;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

FERRY_API int ferry_store_job_begin(ferry_store *s, const char *name)
{
    if (!s || !name) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (s->job_open) {
        rc = fy_seterr(&s->ctx->err, FERRY_E_INVAL, "job \"%s\" is still open: end it before \"%s\"", s->job, name);
    } else if ((rc = fy_memsampler_start(s->m, 10, &s->sampler)) < 0) {
        fy_seterr(&s->ctx->err, rc, "job \"%s\": cannot start the memory sampler: %s", name, ferry_strerror(rc));
    } else {
        s->job_open = true;
        snprintf(s->job, sizeof s->job, "%s", name);
        s->job_t0 = fy_now();
        s->job_c = s->c;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

FERRY_API int ferry_store_job_end(ferry_store *s, ferry_job_stats *out)
{
    if (!s) return FERRY_E_INVAL;
    pthread_mutex_lock(&s->lock);
    if (!s->job_open) {
        pthread_mutex_unlock(&s->lock);
        return fy_seterr(&s->ctx->err, FERRY_E_INVAL, "no job is open");
    }
    fy_memsample_result r;
    fy_memsampler_stop(s->sampler, &r);
    s->sampler = NULL;
    s->job_open = false;
    if (out) {
        memset(out, 0, sizeof *out);
        snprintf(out->job, sizeof out->job, "%s", s->job);
        out->seconds = fy_now() - s->job_t0;
        out->rss = (ferry_mem_range){r.start.rss, r.end.rss, r.peak.rss};
        out->uss = (ferry_mem_range){r.start.uss, r.end.uss, r.peak.uss};
        out->pss = (ferry_mem_range){r.start.pss, r.end.pss, r.peak.pss};
        if (r.has_cgroup) out->cgroup = (ferry_mem_range){r.cg_start, r.cg_end, r.cg_peak};
        uint64_t tb[FERRY_TIER_COUNT];
        tiers(s, tb);
        out->device_bytes = tb[FERRY_TIER_DEVICE];
        out->pinned_bytes = tb[FERRY_TIER_PINNED];
        out->host_bytes = tb[FERRY_TIER_HOST];
        out->spill_bytes = tb[FERRY_TIER_SPILL];
        out->bytes_htod = s->c.htod - s->job_c.htod;
        out->bytes_dtoh = s->c.dtoh - s->job_c.dtoh;
        out->bytes_written = s->c.written - s->job_c.written;
        out->bytes_read = s->c.read - s->job_c.read;
        out->seconds_htod = s->c.s_htod - s->job_c.s_htod;
        out->seconds_dtoh = s->c.s_dtoh - s->job_c.s_dtoh;
        out->evicted = s->c.evicted - s->job_c.evicted;
        out->dropped = s->c.dropped - s->job_c.dropped;
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}
