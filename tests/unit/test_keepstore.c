/* SPDX-License-Identifier: Apache-2.0 */
/* test_keepstore.c - the residency store with a keeper (ferry_store_use_keeper)
 * on the sim device, the keeper in a forked child: a first store reads the
 * checkpoint and feeds the keeper, a fresh one is served by it with nothing
 * read and the same bytes; a checkpoint rewritten in place, touched, or
 * replaced under an open file is read again and never served stale; the
 * keeper killed between and during moves costs only the cache; a dirty
 * tensor is never fed nor served; the pinned cache's moves; no keeper
 * running; the file identity the store uses; and every counted fault. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry_experimental.h"
#include "io/io.h"
#include "keeper_child.h"

static char dir[512], sock[600], logpath[600], path[600];
static ferry_ctx *ctx;

/* ---- the checkpoint: NBLK blocks "blk.K.w" (WBYTES) and "blk.K.b" (16), U8 ---- */

enum { NBLK = 6, NT = 2 * NBLK, WBYTES = 300 << 10 };

static uint8_t val(uint32_t seed, int t, uint64_t j) { return (uint8_t)(seed * 151u + (uint32_t)t * 31u + j * 7u + (j >> 9)); }

/* Write the checkpoint at p: tensor t's bytes from seeds[t]. */
static void write_ckpt(const char *p, const uint32_t *seeds)
{
    char hdr[4096];
    size_t h = (size_t)snprintf(hdr, sizeof hdr, "{");
    uint64_t off = 0;
    for (int t = 0; t < NT; t++) {
        uint64_t n = t % 2 ? 16 : WBYTES;
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s\"blk.%d.%c\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64
                              "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t ? "," : "", t / 2, t % 2 ? 'b' : 'w', n, off, off + n);
        off += n;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    FILE *f = fopen(p, "wb");
    if (!f) return;
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int t = 0; t < NT; t++)
        for (uint64_t j = 0; j < (t % 2 ? 16u : (uint64_t)WBYTES); j++) fputc(val(seeds[t], t, j), f);
    fclose(f);
}

static void seeds_all(uint32_t *s, uint32_t v)
{
    for (int t = 0; t < NT; t++) s[t] = v;
}

/* Set the checkpoint's mtime dsec seconds from now (a change a coarse clock cannot hide). */
static void set_mtime(int dsec)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec += dsec;
    ts[1] = ts[0];
    CHECK_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* ---- stores ---- */

static ferry_file *open_ckpt(void)
{
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, path, 0, &f), 0);
    return f;
}

/* A store on d; with keeper, using the keeper at sock. */
static ferry_store *mk_store(ferry_device *d, bool keeper)
{
    char spill[700];
    snprintf(spill, sizeof spill, "%s", dir);
    ferry_store_opts o = {.size = sizeof o, .device_budget = 64 << 20, .host_budget = 64 << 20,
                          .pinned_budget = 32 << 20, .spill_dir = spill, .spill_below = 1, .spill_above = 2};
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
    o.load = &lo;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (s && keeper) {
        int rc = ferry_store_use_keeper(s, sock, 3000);
        if (rc < 0) fprintf(stderr, "use_keeper: %s\n", ferry_store_errmsg(s));
        CHECK_EQ(rc, 0);
    }
    return s;
}

static ferry_store_stats sstats(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_stats(s, &st), 0);
    return st;
}

static ferry_store_keeper_stats kstats(ferry_store *s)
{
    ferry_store_keeper_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_keeper_stats(s, &st), 0);
    return st;
}

/* Every tensor of m, wherever it is, reads as tensor t of ref (a file
 * opened on the bytes expected); the tensors that differ. */
static int differ(ferry_model *m, ferry_file *ref)
{
    int bad = 0;
    uint8_t *a = malloc(WBYTES), *b = malloc(WBYTES);
    for (int64_t i = 0; i < ferry_model_tensor_count(m) && a && b; i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(ref, i, 0, b, st.nbytes);
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0) {
            fprintf(stderr, "differ: %s (tier %s, %d %d)\n", st.name, ferry_tier_name(st.tier), r1, r2);
            bad++;
        }
    }
    free(a);
    free(b);
    return bad;
}

/* A store on d (with the keeper or not) holding the checkpoint as it is now,
 * moved to the device whole: the model's differences from the file, and the
 * stats of that one move. */
typedef struct loaded {
    int rc, bad;
    uint64_t read;
    ferry_store_keeper_stats k;
} loaded;

static loaded load_fresh(ferry_device *d, bool keeper)
{
    loaded r = {.rc = -1};
    ferry_file *f = open_ckpt();
    ferry_store *s = f ? mk_store(d, keeper) : NULL;
    ferry_model *m = NULL;
    if (s && ferry_store_add(s, "m", &f, 1, 0, &m) == 0) {
        r.rc = ferry_model_to_device(m, NULL, 0);
        r.read = sstats(s).bytes_read;
        r.k = kstats(s);
        r.bad = differ(m, f);
    }
    ferry_store_free(s);
    ferry_file_close(f);
    return r;
}

/* The keeper's committed entries and their bytes, asked on a connection of
 * its own; -1 when it cannot be asked. */
static int keeper_holds(uint64_t *bytes)
{
    ferry_keep *k = NULL;
    char err[1400];
    if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) < 0) return -1;
    ferry_keep_status *st = NULL;
    int n = -1;
    if (ferry_keep_status_get(k, &st) == 0) {
        n = (int)st->nentries;
        if (bytes) *bytes = st->used - st->pending_bytes;
    }
    ferry_keep_status_free(st);
    ferry_keep_close(k);
    return n;
}

static pid_t setup_case(const char *name)
{
    CHECK_EQ(check_tmpdir(dir, sizeof dir, name), 0);
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    snprintf(logpath, sizeof logpath, "%s/keeper.log", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint32_t seeds[NT];
    seeds_all(seeds, 1);
    write_ckpt(path, seeds);
    pid_t kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(kp > 0);
    return kp;
}

static void end_case(pid_t kp)
{
    if (kp > 0) CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

static const uint64_t TOTAL = NBLK * ((uint64_t)WBYTES + 16);

/* ---- cases ---- */

static void test_served(void)
{
    pid_t kp = setup_case("kstore-served");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    if (kp <= 0 || !d) goto out;
    /* without the keeper: every byte read */
    loaded a = load_fresh(d, false);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.read, TOTAL);
    CHECK_EQ(a.k.used, 0);
    CHECK_EQ(keeper_holds(NULL), 0);
    /* the first store with it: every byte read, every tensor fed */
    a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0);
    CHECK_EQ(a.read, TOTAL);
    CHECK_EQ(a.k.used, 1);
    CHECK_EQ(a.k.connected, 1);
    CHECK_EQ(a.k.misses, NT);
    CHECK_EQ(a.k.hits, 0);
    CHECK_EQ(a.k.bytes_fed, TOTAL);
    CHECK_EQ(a.k.bytes_served, 0);
    uint64_t held = 0;
    CHECK_EQ(keeper_holds(&held), NT);
    CHECK_EQ(held, TOTAL);
    /* a fresh store (a new file handle, a new connection): nothing read, the same bytes */
    a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0);
    CHECK_EQ(a.read, 0);
    CHECK_EQ(a.k.hits, NT);
    CHECK_EQ(a.k.misses, 0);
    CHECK_EQ(a.k.bytes_served, TOTAL);
    CHECK_EQ(a.k.bytes_fed, 0);
    CHECK_EQ(a.k.errors, 0);
    /* evicted (clean: dropped) and moved again: served again; bytes_htod counts both moves */
    ferry_file *f = open_ckpt();
    ferry_store *s = f ? mk_store(d, true) : NULL;
    ferry_model *m = NULL;
    if (s && ferry_store_add(s, "m", &f, 1, 0, &m) == 0) {
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        CHECK(ferry_model_evict(m, NULL, 0) >= 0);
        CHECK_EQ(sstats(s).tier_bytes[FERRY_TIER_SOURCE], TOTAL);
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        ferry_store_stats st = sstats(s);
        CHECK_EQ(st.bytes_read, 0);
        CHECK_EQ(st.bytes_htod, 2 * TOTAL);
        CHECK_EQ(kstats(s).bytes_served, 2 * TOTAL);
        CHECK_EQ(differ(m, f), 0);
        /* one tensor asked for: its group (blk.0) alone comes */
        CHECK(ferry_model_evict(m, NULL, 0) >= 0);
        int64_t t = ferry_model_find(m, "blk.0.w");
        CHECK_EQ(ferry_model_to_device(m, &t, 1), 0);
        CHECK_EQ(kstats(s).hits, 2 * NT + 2);
    }
    ferry_store_free(s);
    ferry_file_close(f);
    CHECK_EQ(keeper_holds(NULL), NT); /* (each attachment released) */
out:
    ferry_device_close(d);
    end_case(kp);
}

static void test_changed(void)
{
    pid_t kp = setup_case("kstore-changed");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    if (kp <= 0 || !d) goto out;
    CHECK_EQ(load_fresh(d, true).k.bytes_fed, TOTAL);
    /* rewritten in place past the digest's first MiB: same size, same
     * digest, only the mtime tells (set well apart from the first) */
    uint32_t seeds[NT];
    seeds_all(seeds, 1);
    seeds[NT - 2] = 2;
    write_ckpt(path, seeds);
    set_mtime(10);
    loaded a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0); /* the file's new bytes, not the keeper's */
    CHECK_EQ(a.read, TOTAL);
    CHECK_EQ(a.k.hits, 0);
    CHECK_EQ(a.k.stale, 1); /* the first GET dropped the old file's entries */
    CHECK_EQ(a.k.bytes_fed, TOTAL);
    a = load_fresh(d, true);
    CHECK_EQ(a.k.hits, NT);
    CHECK_EQ(a.bad, 0);
    /* touched: the same bytes, still not served */
    set_mtime(20);
    a = load_fresh(d, true);
    CHECK_EQ(a.k.hits, 0);
    CHECK_EQ(a.k.stale, 1);
    CHECK_EQ(a.read, TOTAL);
    CHECK_EQ(a.bad, 0);
    /* replaced (a new file renamed over it) while a store holds the old one
     * open: that store reads its own file and feeds nothing */
    ferry_file *old = open_ckpt();
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    seeds_all(seeds, 3);
    write_ckpt(tmp, seeds);
    CHECK_EQ(rename(tmp, path), 0);
    ferry_store *s = old ? mk_store(d, true) : NULL;
    ferry_model *m = NULL;
    if (s && ferry_store_add(s, "m", &old, 1, 0, &m) == 0) {
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        ferry_store_keeper_stats k = kstats(s);
        CHECK_EQ(k.hits + k.misses, 0); /* not asked */
        CHECK_EQ(k.bytes_fed, 0);
        CHECK_EQ(sstats(s).bytes_read, TOTAL);
        CHECK_EQ(differ(m, old), 0);
    }
    ferry_store_free(s);
    ferry_file_close(old);
    uint64_t held = 0;
    CHECK_EQ(keeper_holds(&held), NT); /* still the touched file's, fed above */
    /* the new file: read (stale), fed, then served with its own bytes */
    a = load_fresh(d, true);
    CHECK_EQ(a.k.stale, 1);
    CHECK_EQ(a.read, TOTAL);
    CHECK_EQ(a.bad, 0);
    a = load_fresh(d, true);
    CHECK_EQ(a.k.hits, NT);
    CHECK_EQ(a.read, 0);
    CHECK_EQ(a.bad, 0);
out:
    ferry_device_close(d);
    end_case(kp);
}

/* A thread moving the model on and off the device until told to stop. */
typedef struct mover {
    ferry_model *m;
    ferry_file *f;
    atomic_int stop, rounds, failed;
} mover;

static void *move_loop(void *arg)
{
    mover *v = arg;
    while (!atomic_load(&v->stop)) {
        int rc = ferry_model_to_device(v->m, NULL, 0);
        if (rc < 0 || differ(v->m, v->f) != 0) {
            fprintf(stderr, "move_loop: %d %s\n", rc, ferry_model_errmsg(v->m));
            atomic_fetch_add(&v->failed, 1);
        }
        if (ferry_model_evict(v->m, NULL, 0) < 0) atomic_fetch_add(&v->failed, 1);
        atomic_fetch_add(&v->rounds, 1);
    }
    return NULL;
}

static void test_killed(void)
{
    pid_t kp = setup_case("kstore-killed");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    ferry_file *f = open_ckpt();
    ferry_store *s = kp > 0 && d && f ? mk_store(d, true) : NULL;
    ferry_model *m = NULL;
    if (!s || ferry_store_add(s, "m", &f, 1, 0, &m) != 0) goto out;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    /* killed between moves: the next reads the checkpoint */
    kill(kp, SIGKILL);
    waitpid(kp, NULL, 0);
    kp = -1;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(differ(m, f), 0);
    CHECK_EQ(sstats(s).bytes_read, 2 * TOTAL);
    ferry_store_keeper_stats k = kstats(s);
    CHECK(k.errors >= 1);
    CHECK_EQ(k.connected, 0);
    CHECK_STR_HAS(k.last_error, sock);
    /* a new keeper: connected again at a move a second later, and fed */
    kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(kp > 0);
    usleep(1100 * 1000);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    k = kstats(s);
    CHECK_EQ(k.connected, 1);
    CHECK_EQ(k.connects, 2);
    CHECK_EQ(k.bytes_fed, 2 * TOTAL);
    CHECK_EQ(keeper_holds(NULL), NT);
    /* killed at random points while another thread moves the model on and
     * off: every move lands whole, with the file's bytes */
    mover v = {.m = m, .f = f};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, move_loop, &v), 0);
    srand(7);
    int served_rounds = 0;
    uint64_t c0 = kstats(s).connects - 1; /* (connected to the keeper running now) */
    for (int round = 0; round < 6; round++) {
        if (kp <= 0) kp = kc_start(sock, logpath, 64 << 20, false);
        /* once the store is connected to this keeper (a second after its
         * last error), a random moment into its moves: mid-GET, mid-feed,
         * between them */
        for (double t0 = kc_now(); kstats(s).connects == c0 && kc_now() - t0 < 5;) usleep(2000);
        served_rounds += kstats(s).connects > c0;
        usleep((useconds_t)(rand() % 60000));
        if (kp > 0) {
            kill(kp, SIGKILL);
            waitpid(kp, NULL, 0);
            kp = -1;
        }
        c0 = kstats(s).connects;
        int r0 = atomic_load(&v.rounds);
        while (atomic_load(&v.rounds) < r0 + 2) usleep(1000);
    }
    CHECK_EQ(served_rounds, 6);
    atomic_store(&v.stop, 1);
    pthread_join(th, NULL);
    CHECK_EQ(atomic_load(&v.failed), 0);
    CHECK(kstats(s).errors >= 6);
    fprintf(stderr, "killed: %d moves, keeper stats: %" PRIu64 " hits, %" PRIu64 " errors, %" PRIu64 " connects\n",
            atomic_load(&v.rounds), kstats(s).hits, kstats(s).errors, kstats(s).connects);
    /* whatever a killed keeper left, a new one serves whole bytes */
    kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(kp > 0);
    loaded a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0);
    a = load_fresh(d, true);
    CHECK_EQ(a.k.hits, NT);
    CHECK_EQ(a.bad, 0);
out:
    ferry_store_free(s);
    ferry_file_close(f);
    ferry_device_close(d);
    end_case(kp);
}

static void test_dirty(void)
{
    pid_t kp = setup_case("kstore-dirty");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    ferry_file *f = open_ckpt();
    ferry_store *s = kp > 0 && d && f ? mk_store(d, true) : NULL;
    ferry_model *m = NULL;
    uint8_t *buf = malloc(WBYTES), *chk = malloc(WBYTES);
    if (!s || !buf || !chk || ferry_store_add(s, "m", &f, 1, 0, &m) != 0) goto out;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    /* the keeper empty again, tensor 0 changed on the device */
    ferry_keep *k = NULL;
    char err[1400];
    CHECK_EQ(ferry_keep_connect(sock, 3000, &k, err, sizeof err), 0);
    if (k) CHECK_EQ(ferry_keep_drop(k, FERRY_KEEP_DROP_ALL, NULL), NT);
    ferry_keep_close(k);
    CHECK_EQ(ferry_model_read(m, 0, buf), 0);
    for (uint64_t j = 0; j < WBYTES; j++) buf[j] ^= 0x5a;
    CHECK_EQ(ferry_model_write(m, 0, buf), 0);
    /* off the device (saved, it is dirty) and back: never asked, never fed */
    ferry_store_keeper_stats k0 = kstats(s);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    ferry_tensor_state ts = {.size = sizeof ts};
    CHECK_EQ(ferry_model_tensor_state(m, 0, &ts), 0);
    CHECK(ts.dirty && ts.tier != FERRY_TIER_SOURCE && ts.tier != FERRY_TIER_DEVICE);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    ferry_store_keeper_stats k1 = kstats(s);
    CHECK_EQ(k1.misses - k0.misses, NT - 1);
    CHECK_EQ(k1.hits - k0.hits, 0);
    CHECK_EQ(k1.bytes_fed - k0.bytes_fed, TOTAL - WBYTES);
    CHECK_EQ(keeper_holds(NULL), NT - 1);
    CHECK_EQ(ferry_model_read(m, 0, chk), 0);
    CHECK(memcmp(buf, chk, WBYTES) == 0); /* the changed bytes */
    /* a fresh store gets the checkpoint's bytes of tensor 0, from the file */
    loaded a = load_fresh(d, true);
    CHECK_EQ(a.k.hits, NT - 1);
    CHECK_EQ(a.k.misses, 1);
    CHECK_EQ(a.read, WBYTES);
    CHECK_EQ(a.bad, 0);
out:
    free(buf);
    free(chk);
    ferry_store_free(s);
    ferry_file_close(f);
    ferry_device_close(d);
    end_case(kp);
}

static void test_pinned_cache(void)
{
    pid_t kp = setup_case("kstore-pinned");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    if (kp <= 0 || !d) goto out;
    for (int round = 0; round < 2; round++) {
        ferry_file *f = open_ckpt();
        ferry_store *s = f ? mk_store(d, true) : NULL;
        ferry_model *m = NULL;
        if (s && ferry_store_add(s, "m", &f, 1, 0, &m) == 0) {
            CHECK_EQ(ferry_model_set_pinned_cache(m, 1), 0);
            CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
            ferry_store_stats st = sstats(s);
            ferry_store_keeper_stats k = kstats(s);
            CHECK_EQ(st.pinned_cache_bytes, TOTAL);
            CHECK_EQ(st.bytes_read, round ? 0 : TOTAL);
            CHECK_EQ(k.hits, round ? NT : 0);
            CHECK_EQ(k.bytes_fed, round ? 0 : TOTAL); /* fed from the pinned copies */
            /* off the device and back: from the pinned copies, the keeper not asked */
            CHECK(ferry_model_evict(m, NULL, 0) >= 0);
            CHECK_EQ(sstats(s).tier_bytes[FERRY_TIER_PINNED], TOTAL);
            CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
            CHECK_EQ(kstats(s).hits + kstats(s).misses, (uint64_t)NT);
            CHECK_EQ(differ(m, f), 0);
        }
        ferry_store_free(s);
        ferry_file_close(f);
    }
    CHECK_EQ(keeper_holds(NULL), NT);
out:
    ferry_device_close(d);
    end_case(kp);
}

static void test_no_keeper(void)
{
    pid_t kp = setup_case("kstore-none");
    if (kp > 0) CHECK_EQ(kc_stop(kp), 0);
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    ferry_store *s = d ? mk_store(d, false) : NULL;
    if (s) {
        int rc = ferry_store_use_keeper(s, sock, 1000);
        CHECK(rc == -ENOENT || rc == -ECONNREFUSED);
        CHECK_STR_HAS(ferry_store_errmsg(s), "ferry_store_use_keeper");
        CHECK_STR_HAS(ferry_store_errmsg(s), sock);
        CHECK_STR_HAS(ferry_store_errmsg(s), "no keeper is running there");
        CHECK_EQ(kstats(s).used, 0);
        CHECK_EQ(ferry_store_use_keeper(NULL, sock, 0), FERRY_E_INVAL);
        CHECK_EQ(ferry_store_use_keeper(s, sock, -1), FERRY_E_INVAL);
        ferry_store_keeper_stats small = {.size = 2};
        CHECK_EQ(ferry_store_get_keeper_stats(s, &small), FERRY_E_INVAL);
        /* the layout the binding checks its mirror against */
        CHECK_EQ(ferry_abi_sizeof("ferry_store_keeper_stats"), sizeof(ferry_store_keeper_stats));
        CHECK_EQ(ferry_abi_offsetof("ferry_store_keeper_stats", "last_error"),
                 offsetof(ferry_store_keeper_stats, last_error));
    }
    ferry_store_free(s);
    loaded a = load_fresh(d, false);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0);
    ferry_device_close(d);
    end_case(-1);
}

static void test_identity(void)
{
    pid_t kp = setup_case("kstore-ident");
    if (kp > 0) CHECK_EQ(kc_stop(kp), 0);
    char cwd[4096], p[4200];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK_EQ(chdir(dir), 0);
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, "model.safetensors", 0, &f), 0); /* a relative path */
    CHECK_EQ(chdir(cwd), 0);
    if (!f) goto out;
    uint64_t size = 0, digest = 0, size2 = 0, digest2 = 0;
    int64_t mtime = 0, mtime2 = 0;
    CHECK_EQ(ferry_file_keep_identity(f, 0, p, sizeof p, &size, &mtime, &digest), 0);
    char *real = realpath(path, NULL);
    CHECK(real && strcmp(p, real) == 0); /* absolute, wherever the process is now */
    free(real);
    CHECK_EQ(ferry_keep_file_identity(path, &size2, &mtime2, &digest2), 0);
    CHECK_EQ(size, size2);
    CHECK_EQ(mtime, mtime2);
    CHECK(digest == digest2); /* the digest a path's identity has */
    CHECK_EQ(ferry_file_keep_identity(f, 1, p, sizeof p, &size, &mtime, NULL), FERRY_E_INVAL); /* one shard */
    CHECK_EQ(ferry_file_keep_identity(f, 0, p, 4, &size, &mtime, NULL), -ENAMETOOLONG);
    /* another file renamed over it: the path names something else now */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    uint32_t seeds[NT];
    seeds_all(seeds, 9);
    write_ckpt(tmp, seeds);
    CHECK_EQ(rename(tmp, path), 0);
    CHECK_EQ(ferry_file_keep_identity(f, 0, p, sizeof p, &size, &mtime, &digest2), -ESTALE);
    CHECK_EQ(ferry_file_keep_identity(f, 0, NULL, 0, &size2, &mtime2, &digest2), 0); /* its own figures, unchecked */
    CHECK_EQ(size2, size);
    CHECK(digest2 == digest);
    ferry_file_close(f);
    /* removed */
    f = open_ckpt();
    CHECK_EQ(unlink(path), 0);
    if (f) CHECK_EQ(ferry_file_keep_identity(f, 0, p, sizeof p, &size, &mtime, NULL), -ESTALE);
out:
    ferry_file_close(f);
    end_case(-1);
}

/* Every counted system call of a served move and of a fed one, failed in
 * turn: each move ends in success with the file's bytes or in a clean
 * error, and the keeper stays whole. */
static void test_faults(void)
{
    pid_t kp = setup_case("kstore-faults");
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &d), 0);
    if (kp <= 0 || !d) goto out;
    for (int fed = 0; fed < 2; fed++) {
        int runs = 0, ok = 0;
        for (long n = 1; n < 400; n++) {
            ferry_file *f = open_ckpt();
            ferry_store *s = f ? mk_store(d, true) : NULL;
            ferry_model *m = NULL;
            if (!s || ferry_store_add(s, "m", &f, 1, 0, &m) != 0) {
                ferry_store_free(s);
                ferry_file_close(f);
                break;
            }
            if (fed == 0) { /* the keeper empty: this move feeds it */
                ferry_keep *k = NULL;
                char err[1400];
                if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) == 0) ferry_keep_drop(k, FERRY_KEEP_DROP_ALL, NULL);
                ferry_keep_close(k);
            }
            fy_fault_arm(n, EIO);
            int rc = ferry_model_to_device(m, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (rc == 0) {
                CHECK_EQ(differ(m, f), 0);
                ok++;
            }
            runs++;
            ferry_store_free(s);
            ferry_file_close(f);
            if (!fired) break;
        }
        fprintf(stderr, "faults (%s): %d runs, %d of them moved\n", fed ? "served" : "fed", runs, ok);
        CHECK(runs > 3);
        CHECK(ok >= 1);
        /* what is left in the keeper is whole */
        loaded a = load_fresh(d, true);
        CHECK_EQ(a.rc, 0);
        CHECK_EQ(a.bad, 0);
        a = load_fresh(d, true);
        CHECK_EQ(a.k.hits, NT);
        CHECK_EQ(a.bad, 0);
    }
out:
    ferry_device_close(d);
    end_case(kp);
}

#define CASES(CASE)                                                              \
    CASE(served, test_served())                                                  \
    CASE(changed, test_changed())                                                \
    CASE(killed, test_killed())                                                  \
    CASE(dirty, test_dirty())                                                    \
    CASE(pinned_cache, test_pinned_cache())                                      \
    CASE(no_keeper, test_no_keeper())                                            \
    CASE(identity, test_identity())                                              \
    CASE(faults, test_faults())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    alarm(300); /* a hung case fails instead of hanging ctest */
    signal(SIGPIPE, SIG_DFL); /* (a SIGPIPE anywhere would kill the test: the store must never raise one) */
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    return check_summary();
}
