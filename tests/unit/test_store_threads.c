/* SPDX-License-Identifier: Apache-2.0 */
/* test_store_threads.c - the store under several threads at once:
 * concurrent callers, models found while their owner removes them, queued
 * moves (ferry_model_to_device_async) with another thread calling in, and
 * eviction's copies with the store's lock dropped. */
#define _GNU_SOURCE
#include "store_common.h"

typedef struct targ {
    ferry_store *s;
    ferry_model *m;
    ferry_file *f;
    int bad;
} targ;

static void *worker(void *a)
{
    targ *t = a;
    for (int i = 0; i < 20; i++) {
        int rc = ferry_model_to_device(t->m, NULL, 0);
        if (rc == 0 && verify(t->m, t->f, -1, 0) != 0) t->bad++;
        if (i % 3 == 0) ferry_store_make_room(t->s, 1 << 20, NULL);
        ferry_model_evict(t->m, NULL, 0);
    }
    return NULL;
}

static void test_threads(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    if (!d || !fa || !fb) goto out;
    ferry_store *s =
        mk_store(d, ferry_file_total_bytes(fa) + ferry_file_total_bytes(fb) / 2, 64 << 20, 32 << 20);
    targ t[4] = {{0}};
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &t[0].m), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 1, &t[1].m), 0);
    t[0].f = t[2].f = fa;
    t[1].f = t[3].f = fb;
    for (int i = 0; i < 4; i++) t[i].s = s;
    t[2].m = t[0].m;
    t[3].m = t[1].m;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, &t[i]);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK_EQ(t[i].bad, 0);
    CHECK_EQ(verify(t[0].m, fa, -1, 0), 0);
    CHECK_EQ(verify(t[1].m, fb, -1, 0), 0);
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* ferry_store_find takes a reference: a model that other threads
 * found and are using is never freed under them; its owner's remove fails
 * with FERRY_E_BUSY until every reference is put back. Run under TSan/ASan:
 * a model freed while a finder is inside a call on it is reported there. */
typedef struct farg {
    ferry_store *s;
    atomic_int stop;
    atomic_long found, calls_bad;
} farg;

static void *finder(void *a)
{
    farg *x = a;
    while (!atomic_load(&x->stop)) {
        ferry_model *m = ferry_store_find(x->s, "a");
        if (m) {
            atomic_fetch_add(&x->found, 1);
            if (strcmp(ferry_model_name(m), "a") != 0 || ferry_model_tensor_count(m) <= 0)
                atomic_fetch_add(&x->calls_bad, 1);
            if (ferry_model_to_device(m, NULL, 0) < 0) atomic_fetch_add(&x->calls_bad, 1);
            ferry_model_evict(m, NULL, 0);
            ferry_model_put(m);
        }
        struct timespec ts = {0, 300 * 1000}; /* leave the owner a window to remove */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_find_remove(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store *s = NULL;
    if (!d || !fa) goto out;
    s = mk_store(d, 64 << 20, 64 << 20, 32 << 20);
    if (!s) goto out;

    /* one thread: a reference blocks the remove, its put lets it through */
    ferry_model *m = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &m), 0);
    ferry_model *r1 = ferry_store_find(s, "a"), *r2 = ferry_store_find(s, "a");
    CHECK(r1 == m && r2 == m);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY);
    CHECK_STR_HAS(ferry_model_errmsg(m), "2 times");
    CHECK_STR_HAS(ferry_model_errmsg(m), "ferry_model_put");
    ferry_model_put(r1);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY); /* one still out */
    ferry_model_put(r2);
    ferry_model_put(r2); /* one too many: ignored */
    ferry_model_put(NULL);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0); /* still usable: nothing was removed */
    CHECK_EQ(verify(m, fa, -1, 0), 0);
    CHECK_EQ(ferry_store_remove(m), 0);
    CHECK(ferry_store_find(s, "a") == NULL);

    /* threads finding and using it while its owner removes and re-adds it */
    farg x = {.s = s};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_create(&th[i], NULL, finder, &x), 0);
    int removed = 0, busy = 0;
    for (int round = 0; round < 20; round++) {
        m = NULL;
        CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &m), 0);
        if (!m) break;
        struct timespec ts = {0, 500 * 1000}; /* let the finders get at it */
        nanosleep(&ts, NULL);
        int rc;
        for (long tries = 0; (rc = ferry_store_remove(m)) == FERRY_E_BUSY && tries < 100000; tries++) {
            busy++;
            struct timespec w = {0, 20 * 1000};
            nanosleep(&w, NULL);
        }
        CHECK_EQ(rc, 0);
        if (rc != 0) break; /* m is still in the store; the store's free takes it */
        removed++;
    }
    atomic_store(&x.stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_EQ(removed, 20);
    CHECK_EQ(atomic_load(&x.calls_bad), 0);
    CHECK(atomic_load(&x.found) > 0);
    fprintf(stderr, "find_remove: %ld finds, %d busy removes\n", (long)atomic_load(&x.found), busy);
out:
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_device_close(d);
}

/* ---- queued moves (ferry_model_to_device_async) ---- */

typedef struct side {
    ferry_store *s;
    ferry_model *other;
    ferry_op *op;
    int stats_rc, evict_rc, query_after; /* what the other thread saw */
} side;

/* Another thread works on the store while a queued move is in flight: its
 * calls must not wait for the move (the lock is not held across it). */
static void *side_worker(void *a)
{
    side *x = a;
    ferry_store_stats st = {.size = sizeof st};
    x->stats_rc = ferry_store_get_stats(x->s, &st);
    x->evict_rc = ferry_model_evict(x->other, NULL, 0);
    x->query_after = ferry_op_query(x->op);
    return NULL;
}

static void test_async(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    /* copies take modelled time: 64 MiB at 0.25 GB/s is about 0.27 s */
    CHECK_EQ(ferry_device_open(ctx, "sim:512MiB,0.25GB/s", &d), 0);
    ferry_file *fb = open_model(ctx, "big.safetensors"), *fa = open_model(ctx, "a.safetensors");
    if (!d || !fb || !fa) goto out;
    ferry_store *s = mk_store(d, 256 << 20, 256 << 20, 128 << 20);
    ferry_model *m = NULL, *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "big", &fb, 1, 0, &m), 0);
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    /* the big model, dirty, into pinned RAM: the next move is DMA only */
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) CHECK_EQ(ferry_model_mark_dirty(m, i), 0);
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), ferry_file_total_bytes(fb));

    /* queued: returns with the copies in flight, blocks already assigned */
    ferry_op *op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    if (!op) goto free_store;
    ferry_tensor_state st = {.size = sizeof st};
    CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
    CHECK(st.dptr != 0);                  /* the block is there already */
    CHECK_EQ(st.tier, FERRY_TIER_PINNED); /* the old copy stays until the move lands */
    /* a caller's stream ordered after the move sees the bytes, before anyone waited */
    fy_gpu *g = fy_device_gpu(d);
    fy_stream *theirs = NULL;
    CHECK_EQ(g->ops->stream_new(g, &theirs), 0);
    uint8_t *back = malloc(st.nbytes);
    if (theirs && back) {
        CHECK_EQ(ferry_op_stream_wait(op, g->ops->stream_raw(g, theirs)), 0);
        CHECK_EQ(g->ops->copy_dtoh(g, back, st.dptr, (size_t)st.nbytes, theirs), 0);
        /* meanwhile another thread's calls on the store do not wait for the move */
        side x = {.s = s, .other = ma, .op = op, .query_after = -100};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, side_worker, &x), 0);
        pthread_join(th, NULL);
        CHECK_EQ(x.stats_rc, 0);
        CHECK_EQ(x.evict_rc, 0);
        CHECK_EQ(x.query_after, 0); /* the move was still in flight when they returned */
        CHECK_EQ(g->ops->stream_sync(g, theirs), 0);
        uint8_t *want = malloc(st.nbytes);
        CHECK(want && ferry_file_tensor_read(fb, 0, 0, want, st.nbytes) == 0 &&
              memcmp(back, want, st.nbytes) == 0);
        free(want);
    }
    /* the held-back tensors cannot leave while the move is queued */
    CHECK_EQ(ferry_store_make_room(s, UINT64_MAX, NULL) >= 0, 1);
    CHECK_EQ(ferry_op_wait(op), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), ferry_file_total_bytes(fb));
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), 0);
    CHECK_EQ(verify(m, fb, -1, 0), 0);
    CHECK_EQ(ferry_op_wait(NULL), FERRY_E_INVAL);

    /* a read of a tensor whose move is queued lands the move first; removing
     * the model while an op is not waited for is BUSY */
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0); /* dirty: back to pinned */
    op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    CHECK_EQ(ferry_store_remove(m), FERRY_E_BUSY);
    CHECK_STR_HAS(ferry_model_errmsg(m), "ferry_op_wait");
    CHECK_EQ(ferry_model_read(m, 1, back), 0);
    CHECK_EQ(ferry_op_query(op), 1); /* landed by the read */
    CHECK_EQ(ferry_op_wait(op), 0);
    CHECK_EQ(verify(m, fb, -1, 0), 0);

    /* a copy that fails: the wait says so, every tensor stays where it was */
    CHECK_EQ(ferry_model_evict(m, NULL, 0), 0);
    CHECK(fy_gpu_sim_fault(g, FY_OP_COPY, 1) >= 0);
    op = NULL;
    CHECK_EQ(ferry_model_to_device_async(m, NULL, 0, &op), 0);
    CHECK(op != NULL && ferry_op_query(op) < 0);
    CHECK(ferry_op_wait(op) < 0);
    CHECK(strlen(ferry_model_errmsg(m)) > 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, 0), 0);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_PINNED), ferry_file_total_bytes(fb));
    CHECK_EQ(verify(m, fb, -1, 0), 0); /* nothing lost */

    /* release after a stream: held until the work queued there has run */
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(ferry_model_release_after(m, 0, 0), FERRY_E_INVAL); /* not held */
    CHECK_EQ(ferry_model_hold(m, 0), 0);
    if (theirs && back) {
        /* a slow copy on their stream stands in for a kernel still reading */
        CHECK_EQ(g->ops->copy_dtoh(g, back, st.dptr, (size_t)st.nbytes, theirs), 0);
        CHECK_EQ(ferry_model_release_after(m, 0, g->ops->stream_raw(g, theirs)), 0);
        CHECK_EQ(ferry_model_release_after(m, 0, 0), FERRY_E_INVAL); /* its one hold is released already */
        CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
        CHECK_EQ(st.holds, 1); /* still held: the copy runs */
        /* make_room wants everything: it waits for the stream, then evicts */
        CHECK(ferry_store_make_room(s, UINT64_MAX, NULL) > 0);
        CHECK_EQ(ferry_model_tensor_state(m, 0, &st), 0);
        CHECK_EQ(st.holds, 0);
        CHECK(st.tier != FERRY_TIER_DEVICE);
        /* on the caller's own thread (raw 0 on sim) the hold goes at once */
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        CHECK_EQ(ferry_model_hold(m, 1), 0);
        CHECK_EQ(ferry_model_release_after(m, 1, 0), 0);
        CHECK_EQ(ferry_model_tensor_state(m, 1, &st), 0);
        CHECK_EQ(st.holds, 0);
    }
    CHECK_EQ(verify(m, fb, -1, 0), 0);
    if (theirs) g->ops->stream_free(g, theirs);
    free(back);
free_store:
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* ---- eviction's copies run without the store's lock ---- */

/* A checkpoint of n tensors "blk.K.w" of each bytes, U8, all zeros: a sparse
 * file (its data a hole), so 1 GiB costs neither the disk nor the time to
 * write it. */
static void write_sparse_model(const char *name, int n, uint64_t each)
{
    char hdr[8192], path[512];
    size_t h = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int k = 0; k < n; k++)
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64
                              "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              k ? "," : "", k, each, (uint64_t)k * each, (uint64_t)(k + 1) * each);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = start_checkpoint(name, hdr, h, path);
    long data = ftell(f);
    fclose(f);
    CHECK_EQ(truncate(path, (off_t)data + (off_t)((uint64_t)n * each)), 0);
}

typedef struct evictor {
    ferry_model *m;
    atomic_int started, done;
    double seconds;
    int rc;
} evictor;

static void *evict_all(void *a)
{
    evictor *e = a;
    atomic_store(&e->started, 1);
    double t0 = fy_now();
    e->rc = ferry_model_evict(e->m, NULL, 0);
    e->seconds = fy_now() - t0;
    atomic_store(&e->done, 1);
    return NULL;
}

/* While one thread spills 1 GiB of dirty tensors from a device that copies
 * at 4 GB/s (a quarter of a second at least), another thread's
 * ferry_store_get_stats and ferry_store_make_room return at once: the
 * copies and the spill file's writes run without the store's lock. (With
 * them under it, each call waited for the whole spill: 0.3-0.6 s.) */
static void test_evict_unlocked(ferry_ctx *ctx)
{
    enum { N = 4 };
    const uint64_t each = 256ull << 20, limit_ms = 10;
    write_sparse_model("gig.safetensors", N, each);
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:2GiB,4GB/s", &d), 0);
    ferry_file *f = open_model(ctx, "gig.safetensors");
    if (!d || !f) goto out;
    ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 8 << 20};
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = 1536ull << 20,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2,
                          .load = &lo};
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    ferry_model *m = NULL;
    CHECK_EQ(ferry_store_add(s, "gig", &f, 1, 0, &m), 0);
    if (!s || !m) goto out_store;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    for (int64_t i = 0; i < N; i++) CHECK_EQ(ferry_model_mark_dirty(m, i), 0);
    evictor e = {.m = m};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, evict_all, &e), 0);
    while (!atomic_load(&e.started)) sched_yield();
    fy_sleep_until(fy_now() + 0.02); /* into its copies */
    double worst_stats = 0, worst_room = 0;
    int probes = 0, retried = 0;
    while (!atomic_load(&e.done)) {
        double ts = 0, tr = 0;
        /* a probe slower than the limit is tried again (up to 3 times)
         * while the spill still runs: this machine may be shared, and a
         * thread put off the CPU for a while is no lock held (under the
         * lock, the first try waits for the whole spill, and a slow try
         * after the spill ended stands) */
        for (int attempt = 0; attempt < 4; attempt++) {
            ferry_store_stats st = {.size = sizeof st};
            double t0 = fy_now();
            CHECK_EQ(ferry_store_get_stats(s, &st), 0);
            double t1 = fy_now();
            uint64_t could = 0;
            CHECK(ferry_store_make_room(s, 16 << 20, &could) >= 0);
            double t2 = fy_now();
            ts = t1 - t0, tr = t2 - t1;
            if ((ts < limit_ms * 1e-3 && tr < limit_ms * 1e-3) || atomic_load(&e.done)) break;
            retried++;
        }
        if (atomic_load(&e.done) && probes > 0 && ts < limit_ms * 1e-3 && tr < limit_ms * 1e-3)
            break; /* (this probe may have started after the spill) */
        worst_stats = ts > worst_stats ? ts : worst_stats;
        worst_room = tr > worst_room ? tr : worst_room;
        probes++;
        fy_sleep_until(fy_now() + 0.01);
    }
    pthread_join(th, NULL);
    fprintf(stderr,
            "evict_unlocked: the spill took %.0f ms; %d probes meanwhile (%d tried again), the slowest "
            "stats %.1f ms, make_room %.1f ms\n",
            e.seconds * 1e3, probes, retried, worst_stats * 1e3, worst_room * 1e3);
    CHECK_EQ(e.rc, 0);
    CHECK(e.seconds > 0.1); /* the spill was slow enough to tell */
    CHECK(probes >= 2);
    CHECK(worst_stats * 1e3 < (double)limit_ms);
    CHECK(worst_room * 1e3 < (double)limit_ms);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_SPILL), N * each);
    CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), 0);
    /* nothing lost: the spilled copies read back as the checkpoint's zeros */
    uint8_t *buf = malloc(each);
    for (int64_t i = 0; i < N && buf; i++) {
        memset(buf, 0xa5, each);
        CHECK_EQ(ferry_model_read(m, i, buf), 0);
        bool zero = true;
        for (uint64_t j = 0; j < each && zero; j += 4096) zero = buf[j] == 0 && buf[j + 4095] == 0;
        CHECK(zero);
    }
    free(buf);
out_store:
    ferry_store_free(s);
out:
    ferry_file_close(f);
    ferry_device_close(d);
}

#define CASES(CASE)                          \
    CASE(threads, test_threads(ctx))         \
    CASE(find_remove, test_find_remove(ctx)) \
    CASE(async, test_async(ctx))             \
    CASE(evict_unlocked, test_evict_unlocked(ctx))
CHECK_CASES_MAIN(CASES, store_main)
