/* SPDX-License-Identifier: Apache-2.0 */
/* store_impl.h - what the residency store's files share: a store, its models
 * and their tensors, and the functions that run under the store's lock
 * (selection, moves, eviction, and the store's wrappers of its resources:
 * the device arena, arena.h; the pinned pool, pinpool.h; make-room's device
 * index, lru.h; the spill file, spill.h; the keeper, keeper.h). Private to resid/; the resources
 * never include it (ctest layering_resources). The store reaches devices
 * only through xfer.h. */
#ifndef FERRY_STORE_IMPL_H
#define FERRY_STORE_IMPL_H

#include <pthread.h>

#include "common/ranges.h"
#include "xfer/xfer.h"
#include "io/memstat.h"
#include "arena.h"
#include "fences.h"
#include "keeper.h"
#include "lru.h"
#include "pinpool.h"
#include "policy.h"
#include "spill.h"

typedef struct rtensor {
    const struct ferry_model *owner; /* with group: a group's identity across models */
    int32_t file;
    int32_t shard; /* of its file (ferry_tensor_info.shard) */
    int64_t idx;   /* in its file */
    const char *name;
    uint64_t nbytes;
    ferry_tier tier;
    bool dirty;
    int holds;
    int64_t group;
    fy_dptr dptr;   /* DEVICE */
    uint64_t dsize; /* its device memory's size (nbytes rounded up to 512; arena.used counts nbytes) */
    void *host;     /* PINNED / HOST */
    uint64_t soff;  /* SPILL: offset in the spill file */
    bool keep;      /* evict_tensors: stays on the device with its group */
    struct ferry_op *moving; /* a queued move to the device that has not landed: its old
                                copy stays until then, nothing else may move or evict it */
    uint64_t use;            /* the store's clock when its group was last asked for (eviction order
                                within a model) */
    bool streams;            /* its block streams under the model's plan (leaves before the rest) */
    bool cached;             /* host is a clean copy in the pinned pool (a streamed block's, or any
                                tensor's of a model with pinned_cache on), kept beside
                                the device copy (tier DEVICE) or as the copy once it left (tier
                                PINNED); mark_dirty/write drop it, so it is never dirty (rs_uncache
                                still keeps a dirty tensor's only copy, should one ever be cached) */
    bool caching;            /* host is a pinned buffer a queued move is filling for the cache */
    bool evicting;           /* an eviction copies it off the device with the lock dropped: nothing
                                else moves, frees or evicts it until that eviction commits (rs_settle) */
    int busy;                /* reads or writes of its bytes running with the lock dropped: its copies
                                stay where they are (no move, eviction or uncaching) until 0 */
    int wanted;              /* moves being queued that asked for its group: not evicted meanwhile */
    bool kept;               /* its move took its bytes from the keeper (kept.c; the moving op's own,
                                written with the lock dropped, false again before the op is QUEUED) */
} rtensor;

/* A model's streaming plan (ferry_model_plan): the caller's request, kept so
 * a budget change can re-plan, and what was chosen. */
typedef struct rs_plan {
    int64_t *blocks; /* the group id (leader tensor) of each block, in pass order */
    int64_t nblocks;
    int64_t window;
    uint64_t budget, reserve; /* budget 0: follow the store's device budget */
    bool pinned_cache;
    bool *streams; /* per block: it streams */
    bool *counted; /* per tensor of the model: counted outside the blocks (NULL: all are) */
    ferry_plan got;
} rs_plan;

struct ferry_model {
    ferry_store *s;
    fy_err err; /* this model's messages (also the store's and the context's) */
    char *name;
    int priority;
    uint64_t last_use;
    ferry_file **files;
    int nfiles;
    rtensor *t;
    int64_t n;
    int64_t *by_name; /* tensor indices sorted by name */
    /* the groups' members (rs_group_index): group g's (g a member's index)
     * are gmem[gat[g] .. gat[g] + gcnt[g] - 1], so a block's move looks at
     * its block alone, never at every tensor of the model */
    int64_t *gmem, *gat, *gcnt;
    uint64_t *gmark, gstamp; /* rs_select: a group's mark, the last mark given */
    /* make-room's candidates: the groups with device memory (a reference per
     * member holding some: rs_dev_alloc, rs_dev_free), by group id, list 1 the
     * streamed blocks', list 0 the others', each oldest use first */
    rs_lru dev;
    rs_plan *plan;     /* NULL unless ferry_model_plan made one */
    int64_t refs;      /* taken by ferry_store_find, not yet put back; ferry_store_remove waits for 0 */
    bool pinned_cache; /* ferry_model_set_pinned_cache: every clean tensor read from the
                          checkpoint keeps a pinned copy as room allows */
    /* the keeper's view of its files' shards: file k's are kf[kf_at[k] ..
     * kf_at[k + 1] - 1] (guarded by the keeper's lock, not the store's) */
    rs_kfile *kf;
    int *kf_at;
};

typedef struct counters {
    uint64_t htod, dtoh, written, read, evicted, dropped;
    double s_htod, s_dtoh;
} counters;

struct ferry_store {
    ferry_device *dev;
    fy_err err;           /* this store's messages (also the context's) */
    ferry_load_opts load; /* ring geometry for every move (a copy of the caller's) */
    ferry_ctx *ctx;
    const ferry_allocator *m;
    pthread_mutex_t lock;
    ferry_store_opts o;
    char *spill_dir;
    ferry_model **models;
    int nmodels, cap_models;
    uint64_t clock;
    uint64_t host_used; /* pageable copies (the pool's bytes in use are pool.used) */
    /* the pinned pool and its pinner (pinpool.h); pool.budget is o.pinned_budget */
    rs_pinpool pool;
    rs_spill *spill;
    bool spilling;
    int64_t evicting; /* tensors marked evicting (their copies run with the lock dropped) */
    /* device memory: segments from the driver, carved into tensors and kept
     * when they leave, for reuse (no driver call, and memory the copy engine
     * has written before: bench_alloc) until ferry_store_make_room gives the
     * free ones back (arena.h, arena.c); arena.used is the device tensors'
     * bytes, arena.budget follows o.device_budget */
    rs_arena arena;
    uint64_t cache_used; /* of pinned_used: clean copies of streamed blocks */
    counters c;
    uint64_t room_visits; /* groups make-room has looked at (a count for tests) */
    /* the open job */
    bool job_open;
    char *job; /* the open job, else the last one (NULL before the first) */
    double job_t0;
    counters job_c;
    fy_memsampler *sampler;
    /* queued moves (ferry_op) not yet waited for; landed: one finished landing */
    struct ferry_op *ops;
    pthread_cond_t landed;
    /* the mover: one thread, started on first use, that runs the transfers of
     * queued moves that read files (so ferry_model_to_device_async returns
     * before they are read), in the order queued */
    pthread_t mover;
    bool mover_on, mover_stop;
    struct ferry_op *mq, **mq_tail;
    pthread_cond_t mq_cv;
    /* release fences (fences.h): pending, the holds to drop once work queued
     * on a caller's stream is done (an item is a held rtensor); reuse, those
     * whose holds dropped early (rs_defer_releases): the memory their clean
     * tensors left may be reused, each new write to the device ordered after
     * them first (rs_reuse_order); kept until done */
    rs_fences fences;
    /* the keeper (keeper.h; ferry_store_use_keeper): asked for clean tensors
     * before their checkpoints are read, fed after (kept.c); its lock is
     * never taken with this store's held */
    rs_keeper keeper;
};

/* ---- fetch.c: moves to the device, synchronous and queued ---- */
/* MOVING: the transfers run (lock dropped), in the queueing call or, for a
 * queued move that reads files, on the store's mover thread;
 * QUEUED: they are queued or done; LANDING: one thread waits for the copies;
 * LANDED: the tiers are committed. Anyone may land an op, once. */
enum { OP_MOVING, OP_QUEUED, OP_LANDING, OP_LANDED };

struct ferry_op {
    ferry_model *m;
    struct ferry_op *next; /* in the store's list of ops not yet waited for */
    int64_t *ti, nt;       /* the tensors it moves (each marked moving = this op) */
    fy_xfer_op *xop;       /* queued pinned/RAM copies, or NULL */
    int state;
    int rc;                  /* the first error of the moves */
    char msg[FY_ERRMSG_MAX]; /* the device's message for rc, taken when it failed */
    uint64_t moved, read;
    double t0;
    /* what the transfers need (freed once they ran) */
    int64_t *idx;
    uint64_t *dp;
    fy_hostrange *hr;
    fy_fdrange *fr;
    int64_t nh, nf, nc;
    int spill_fd;
    struct rs_kreq *kr; /* its tensors asked of the keeper (kept.c), while the transfers run */
    int64_t nkr;
    struct ferry_op *mnext; /* in the mover's queue */
};

/* ---- fetch.c: queueing moves, their transfers, the mover ---- */
/* Stop the mover thread (after every queued move has landed). */
void rs_mover_stop(ferry_store *s);

/* ---- kept.c: a move's clean tensors through the keeper ---- */
/* Before op's transfers read checkpoints (lock dropped): ask the keeper for
 * its tensors in tier SOURCE; the hits are copied to the device (waited) or
 * into the pinned cache buffers being filled, and marked kept, so the
 * checkpoint reads skip them. Returns the bytes copied to the device. A
 * failed copy is op's error (rs_op_fail). */
uint64_t rs_kept_fetch(ferry_store *s, ferry_op *op);
/* After the checkpoint reads (lock dropped): when they succeeded, feed the
 * keeper what was read (from the pinned cache buffers, else the checkpoint
 * again); then clear the marks. Called once after rs_kept_fetch. */
void rs_kept_finish(ferry_store *s, ferry_op *op);

/* ---- land.c: landing moves; waiting for a tensor's marks to clear ---- */
/* The first error of op's moves, with the device's message. */
void rs_op_fail(struct ferry_op *op, ferry_store *s, int rc);
/* Land op (its copies done, the tensors' tiers committed or rolled back),
 * waiting for its copies with the lock dropped; idempotent. */
void rs_op_land(ferry_store *s, struct ferry_op *op);
/* Unlink a landed op from the store's list and free it (under the lock). */
void rs_op_free(ferry_store *s, struct ferry_op *op);
/* Land every move of the tensors ti[0..nt-1] of m. */
void rs_land_moving(ferry_store *s, ferry_model *m, const int64_t *ti, int64_t nt);
/* Wait (lock dropped) until none of the tensors ti[0..nt-1] of m is moving
 * (its move is landed), evicting or, with readers, busy. ti NULL: every
 * tensor of m, evicting or busy (moves are not landed). */
void rs_settle(ferry_store *s, ferry_model *m, const int64_t *ti, int64_t nt, bool readers);

/* ---- releases.c: holds dropped after a stream, fences of reused memory ---- */
/* Drop the holds whose streams are done; wait: also wait for the rest.
 * Returns the holds dropped. */
int64_t rs_reap_releases(ferry_store *s, bool wait);
/* Short of room while kernels may still read released tensors: drop the
 * pending holds of the clean ones now (their fences go to s->fences.reuse), so
 * eviction can take them without the host waiting for the kernels; the
 * copies into their memory wait on the device instead (rs_reuse_order).
 * Dirty tensors keep their pending holds (evicting one reads it back).
 * Returns the holds dropped. */
int64_t rs_defer_releases(ferry_store *s);
/* Before a move writes device memory: order it after every fence of
 * s->fences.reuse still running. lane: all its copies run on the lane (pinned and
 * RAM copies), which then waits on the device; else (file reads through the
 * ring or the spill file, on streams of their own) the host waits.
 * all: the host waits for every one (before memory goes back to the driver). */
int rs_reuse_order(ferry_store *s, bool lane);
void rs_reuse_wait_all(ferry_store *s);

/* ---- errors.c: messages ---- */
/* Messages name models and tensors one way everywhere: JSON-quoted
 * (model "dit", tensor "blocks.3.w"), so a hostile name cannot break the line. */
#define RS_Q(buf, name) fy_quote((buf), sizeof(buf), (name))
/* A message on m ("model \"name\": ..."), which reaches its store and context. */
int rs_merr(ferry_model *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A call on m failed inside the store (its message is on s->err): give m the
 * same message. Returns rc. */
int rs_model_failed(ferry_model *m, int rc);
/* A move failed inside the device (its message is on the device): give the
 * store (and m, when not NULL) the same message. Returns rc. */
int rs_device_failed(ferry_store *s, ferry_model *m, int rc);

/* Every function below is called with s->lock held. Those that copy, pin,
 * punch or wait (rs_pool_alloc, rs_evict_tensors and the make-room family
 * that calls it, rs_settle, rs_land_moving, rs_store_spill_flush) drop it for a
 * while, after marking what they work on; their callers look at the store
 * again afterwards rather than trusting what they saw before. */

/* ---- the pinned pool (pinpool.h) on a store; copies.c: tensors' host copies ---- */
/* n bytes of the pool. Where no free range fits, it waits for the pinner's
 * next piece or pins a new chunk, with s->lock dropped meanwhile: the caller
 * has marked what it works on (moving, evicting) before calling. */
static inline int rs_pool_alloc(ferry_store *s, uint64_t n, void **out)
{
    return rs_pinpool_alloc(&s->pool, n, out);
}
static inline void rs_pool_free(ferry_store *s, void *p, uint64_t n)
{
    rs_pinpool_free(&s->pool, p, n);
}
/* The pool's idle chunks (not the reserve's) taken out; rs_chunks_drop
 * unpins and frees them, with the lock dropped. */
static inline int rs_pool_trim_take(ferry_store *s, rs_pchunk **out)
{
    return rs_pinpool_trim_take(&s->pool, out);
}
static inline void rs_chunks_drop(ferry_store *s, rs_pchunk *v, int n)
{
    rs_pinpool_drop(&s->pool, v, n);
}
/* A move or an eviction's saves start (+1) or end (-1) (rs_pinpool_yield). */
static inline void rs_pin_yield(ferry_store *s, int d)
{
    rs_pinpool_yield(&s->pool, d);
}
/* Drop whatever copy t has off the device (after it came back, or on removal). */
void rs_release_copy(ferry_store *s, rtensor *t);
/* Give t's pinned cache buffer (cached, or being filled) back to the pool;
 * the flags are the caller's to clear. */
void rs_cache_buffer_free(ferry_store *s, rtensor *t);

/* ---- the device arena (arena.h) on a store's tensors ---- */
/* Give whole free segments back to the driver until at least want bytes were
 * returned (UINT64_MAX: all). */
static inline uint64_t rs_cache_release(ferry_store *s, uint64_t want)
{
    return rs_arena_release(&s->arena, want);
}
/* Device memory for t (t->dptr, t->dsize) from the arena (strict: see
 * rs_arena_alloc); the group index learns its group has device memory. 0,
 * RS_FRAGMENTED or a negative code (message in s->err). */
int rs_dev_alloc(ferry_store *s, rtensor *t, bool strict);
/* t's device memory goes back to the arena (the group index learns it). */
void rs_dev_free(ferry_store *s, rtensor *t);

/* ---- model.c, groups.c: the model catalogue ---- */
void rs_model_free(ferry_model *m);
ferry_model *rs_find_model(ferry_store *s, const char *name);
/* The tensors of the groups of tensors[0..n-1] (NULL: every tensor), each
 * once, group by group: the list in *out (the caller frees it), its length
 * in *nt. Costs the groups' size, not the model's. 0 or a negative code
 * (message on m). */
int rs_select(ferry_model *m, const int64_t *tensors, int64_t n, int64_t **out, int64_t *nt);
/* Rebuild m's group index (after groups changed), and its device index. */
void rs_group_index(ferry_model *m);
/* Rebuild m's device index (m->dev) from its tensors (after groups or their
 * streams flags changed). */
void rs_dev_reindex(ferry_model *m);

/* ---- evict.c: eviction ---- */
/* Take the listed device tensors off the device: clean ones dropped, dirty
 * ones saved by the host policy; a group whose dirty member could not be
 * saved stays. 0 or the first error. The tensors (on the device, none
 * moving, evicting, held or busy) are marked evicting, and while their
 * copies run (device to host, the spill file's writes) and the pool grows,
 * s->lock is dropped; the new tiers are committed under it again. */
int rs_evict_tensors(ferry_store *s, rtensor **ts, int64_t n);
/* Flush the spill file (see rs_spill_flush_take): the punching runs with
 * s->lock dropped. */
void rs_store_spill_flush(ferry_store *s);
/* Free bytes on the device, evicting by policy, protecting prot[] of pm.
 * Bytes freed, or FERRY_E_BUDGET with *could = what could be made. */
int64_t rs_make_room_locked(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot,
                            uint64_t *could);
/* Room on the device now: the budget's, or the device's real free memory
 * plus the store's free pieces, whichever is less. */
uint64_t rs_room_now(ferry_store *s);
/* Evict by policy and give whole free segments back until the store holds at
 * most held_max bytes of device memory (tensors + free pieces), or nothing
 * more can go. The tensor bytes evicted (>= 0). */
int64_t rs_hold_at_most(ferry_store *s, uint64_t held_max);
/* The same; spared_only: pm's resident set (its plan's) is never taken. */
int64_t rs_make_room_ex(ferry_store *s, uint64_t bytes, ferry_model *pm, const bool *prot, uint64_t *could,
                        bool spared_only);
/* Evict down to the device budget (after it shrank): 0 or FERRY_E_BUDGET. */
int rs_fit_budget(ferry_store *s);

/* ---- plan.c: plans ---- */
/* Re-plan every model planned against the store's budget (after it changed). */
void rs_replan(ferry_store *s);
/* Free the plan of m (on removal). */
void rs_plan_free(ferry_store *s, ferry_model *m);
/* ferry_model_plan, counting only the fixed[0..nfixed) tensors outside the
 * blocks (fixed NULL: all of them). */
int rs_model_plan(ferry_model *m, const ferry_plan_opts *opts, const int64_t *fixed, int64_t nfixed,
                  ferry_plan *out);

/* ---- cache.c: cache admission of clean pinned copies ---- */
/* Does t keep a clean pinned copy when it is read from its checkpoint? (a
 * streamed block: its plan's pinned_cache; else its model's) */
bool rs_wants_cache(const ferry_model *m, const rtensor *t);
/* May a clean pinned copy of n more bytes be kept? (the budgets, and the
 * host's available memory avail, read once by the caller) */
bool rs_cache_admits(ferry_store *s, uint64_t n, uint64_t avail);
/* Drop t's cached pinned copy (a PINNED clean tensor goes back to SOURCE). */
void rs_uncache(ferry_store *s, rtensor *t);
/* Drop cached copies (not of held or moving tensors) until want bytes of the
 * pool are free again; returns the bytes dropped. */
uint64_t rs_uncache_bytes(ferry_store *s, uint64_t want);

/* ---- stats.c ---- */
/* Bytes per tier over every model. */
void rs_tiers(ferry_store *s, uint64_t *tb);

#endif
