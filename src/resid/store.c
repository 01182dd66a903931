/* SPDX-License-Identifier: Apache-2.0 */
/* store.c - the residency store's life: tier names, opening a store with
 * its budgets (defaults from the device and the host's real limits), and
 * freeing it. resid/ decides, xfer/ moves: the policy is policy.c, the
 * moves xfer.h's, the spill file spill.c, the host's limits memstat. One
 * lock per store, never held over I/O: moves to the device transfer with it
 * dropped (fetch.c), evictions copy and spill with it dropped (evict.c),
 * reads and writes of a tensor's bytes too (tensor.c), the pool pins with it
 * dropped (pinpool.c) and the host's available memory is read without it. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

FERRY_API const char *ferry_tier_name(ferry_tier t)
{
    static const char *const names[] = {"device", "pinned", "host", "source", "spill"};
    return (unsigned)t < FERRY_TIER_COUNT ? names[t] : "unknown";
}

/* ---- opening ---- */

/* The arena's drain: before device memory goes back to the driver, the
 * kernels that may still read what it held (releases dropped early) finish. */
static void drain_reuse(void *arg)
{
    ferry_store *s = arg;
    if (s->fences.reuse) rs_reuse_wait_all(s);
}

static uint64_t or_default(uint64_t v, uint64_t d)
{
    return v ? v : d;
}

FERRY_API int ferry_store_new(ferry_device *dev, const ferry_store_opts *opts, ferry_store **out)
{
    if (!dev || !out) return FERRY_E_INVAL;
    *out = NULL;
    ferry_ctx *ctx = fy_device_ctx(dev);
    ferry_store_opts o;
    ferry_load_opts lo;
    /* messages before the store exists go to the device's context */
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &ctx->err, "ferry_store_new"));
    FY_TRY(fy_struct_in(&lo, sizeof lo, o.load, &ctx->err, "ferry_store_new (opts->load)"));
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
        if (rc < 0)
            return fy_seterr(&ctx->err, rc,
                             "ferry_store_new: cannot tell how much host memory is available (%s)",
                             ferry_strerror(rc));
        o.host_budget = avail > o.host_reserve ? avail - o.host_reserve : 0;
    }
    o.pinned_budget = or_default(o.pinned_budget, o.host_budget / 4);
    if (o.pinned_budget > o.host_budget) o.pinned_budget = o.host_budget;
    o.spill_below = or_default(o.spill_below, 2 * o.host_reserve);
    o.spill_above = or_default(o.spill_above, o.spill_below + (1ull << 30));
    FY_RETURN_IF(o.spill_above < o.spill_below, &ctx->err, FERRY_E_INVAL,
                 "ferry_store_new: spill_above (%" PRIu64 ") is below spill_below (%" PRIu64 ")",
                 o.spill_above, o.spill_below);
    /* the environment (FERRY_SPILL_DIR) is the CLI's and the binding's to read */
    const char *dir = o.spill_dir && *o.spill_dir ? o.spill_dir : "/var/tmp";
    ferry_store *s = fy_calloc(&ctx->mem, 1, sizeof *s);
    char *d = s ? fy_strndup(&ctx->mem, dir, strlen(dir)) : NULL;
    if (!s || !d) {
        fy_free(&ctx->mem, s);
        return fy_seterr(&ctx->err, -ENOMEM, "ferry_store_new: out of memory (%zu bytes)", sizeof *s);
    }
    s->dev = dev;
    fy_err_init_child(&s->err, &ctx->err);
    s->load = lo;
    s->ctx = ctx;
    s->m = &ctx->mem;
    s->o = o;
    s->spill_dir = d;
    s->o.spill_dir = d;
    s->o.load = &s->load;
    rs_arena_init(&s->arena, dev, s->m, &s->err, o.device_budget);
    rs_fences_init(&s->fences, dev, s->m);
    s->arena.drain = drain_reuse;
    s->arena.drain_arg = s;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->landed, NULL);
    pthread_cond_init(&s->mq_cv, NULL);
    s->mq_tail = &s->mq;
    rs_keeper_init(&s->keeper, s->m);
    rs_pinpool_init(&s->pool, dev, s->m, &s->err, &s->lock, o.pinned_budget, o.pinned_reserve);
    int rc = rs_pinpool_start(&s->pool);
    if (rc < 0) { /* (the message reached the context through s->err) */
        ferry_store_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

FERRY_API void ferry_store_free(ferry_store *s)
{
    if (!s) return;
    fy_xfer_bind(s->dev);
    /* moves nobody waited for land now (no copy may still write into memory
     * about to be freed); releases still pending go with the store */
    pthread_mutex_lock(&s->lock);
    while (s->ops) {
        struct ferry_op *op = s->ops;
        rs_op_land(s, op);
        rs_op_free(s, op);
    }
    rs_reap_releases(s, true);
    pthread_mutex_unlock(&s->lock);
    rs_mover_stop(s); /* every queued move landed above, so its queue is empty */
    for (int i = 0; i < s->nmodels; i++) rs_model_free(s->models[i]);
    fy_free(s->m, s->models);
    rs_arena_destroy(&s->arena);
    rs_fences_destroy(&s->fences); /* (what the arena's drain left: nothing, as a rule) */
    rs_pinpool_destroy(&s->pool);  /* (the pinner stops first) */
    rs_spill_close(s->spill);
    rs_keeper_destroy(&s->keeper); /* (after the models: their identities are the keeper's to free) */
    if (s->sampler) fy_memsampler_stop(s->sampler, NULL);
    fy_free(s->m, s->spill_dir);
    pthread_cond_destroy(&s->landed);
    pthread_cond_destroy(&s->mq_cv);
    pthread_mutex_destroy(&s->lock);
    fy_free(s->m, s->job);
    fy_err_destroy(&s->err);
    fy_free(s->m, s);
}

FERRY_API int ferry_store_use_keeper(ferry_store *s, const char *socket, int timeout_ms)
{
    if (!s || timeout_ms < 0) return FERRY_E_INVAL;
    char err[FY_ERRMSG_MAX - 64];
    int rc =
        rs_keeper_use(&s->keeper, socket, timeout_ms, err, sizeof err); /* (no store lock: a socket call) */
    return rc < 0 ? fy_seterr(&s->err, rc, "ferry_store_use_keeper: %s", err) : 0;
}

FERRY_API int ferry_store_wait_pinned(ferry_store *s)
{
    if (!s) return FERRY_E_INVAL;
    return rs_pinpool_wait(&s->pool);
}

FERRY_API const char *ferry_store_errmsg(ferry_store *s)
{
    return s ? fy_err_public(&s->err) : "";
}

FERRY_API const char *ferry_store_spill_dir(const ferry_store *s)
{
    return s && s->spill ? s->spill_dir : NULL;
}

FERRY_API int ferry_host_available(uint64_t *bytes, char *source, size_t n)
{
    if (!bytes) return FERRY_E_INVAL;
    return fy_host_available(bytes, source, source ? n : 0);
}
