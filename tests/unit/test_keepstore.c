/* SPDX-License-Identifier: Apache-2.0 */
/* test_keepstore.c - the residency store with a keeper (ferry_store_use_keeper)
 * on the sim device, the keeper in a forked child: a first store reads the
 * checkpoint and feeds the keeper, a fresh one is served by it with nothing
 * read and the same bytes; a checkpoint rewritten in place, touched, or
 * replaced under an open file is read again and never served stale; a dirty
 * tensor is never fed nor served; the pinned cache's moves; no keeper
 * running; the file identity the store uses. The keeper failing (killed,
 * hung) and faults: test_keepfail.c. */
#define _GNU_SOURCE
#include "keepstore.h"

/* ---- cases ---- */

static void test_served(void)
{
    kcase c;
    if (!kcase_open(&c, "kstore-served", false, false)) goto out;
    ferry_device *d = c.d;
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
    kcase_close(&c);
}

static void test_changed(void)
{
    kcase c;
    if (!kcase_open(&c, "kstore-changed", false, false)) goto out;
    ferry_device *d = c.d;
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
    check_serves_whole(d);
out:
    kcase_close(&c);
}

static void test_dirty(void)
{
    kcase c;
    bool ok = kcase_open(&c, "kstore-dirty", true, true);
    ferry_device *d = c.d;
    ferry_store *s = c.s;
    ferry_model *m = c.m;
    uint8_t *buf = malloc(WBYTES), *chk = malloc(WBYTES);
    if (!ok || !buf || !chk) goto out;
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
    kcase_close(&c);
}

static void test_pinned_cache(void)
{
    kcase c;
    if (!kcase_open(&c, "kstore-pinned", false, false)) goto out;
    ferry_device *d = c.d;
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
    kcase_close(&c);
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
    CHECK_EQ(ferry_file_keep_identity(f, 0, NULL, 0, &size2, &mtime2, &digest2),
             0); /* its own figures, unchecked */
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

#define CASES(CASE)                         \
    CASE(served, test_served())             \
    CASE(changed, test_changed())           \
    CASE(dirty, test_dirty())               \
    CASE(pinned_cache, test_pinned_cache()) \
    CASE(no_keeper, test_no_keeper())       \
    CASE(identity, test_identity())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    return kmain(argc, argv, check_cases, check_ncases);
}
