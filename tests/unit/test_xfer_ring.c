/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_ring.c - the ring pipeline: the ring kept between loads, O_DIRECT's
 * defaults, a checkpoint in tmpfs, the readers' own descriptors, progress,
 * and concurrent loads on one device. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ---- ring reuse ---- */

/* O_DIRECT loads default to their own geometry (8 readers of 1 MiB, 16
 * buffers, fewer for a small load), and read into the default ring when one
 * is pinned already (auto pins it ahead before it knows the load is cold)
 * instead of pinning another; a ring asked for is pinned as asked. */
static void test_direct_defaults(ferry_ctx *ctx)
{
    if (!direct_ok) return;
    ferry_file *f = open_file(ctx, "odd.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !d) goto out;
    ferry_load_opts o = {.size = sizeof o, .route = FERRY_ROUTE_DIRECT};
    static const ferry_route order[] = {FERRY_ROUTE_DIRECT, FERRY_ROUTE_RING, FERRY_ROUTE_DIRECT};
    /* odd.safetensors is just over 1 MiB: two buffers of either size */
    static const uint64_t ring_after[] = {MiB, 4 * MiB, 4 * MiB};
    for (int i = 0; i < 3; i++) {
        o.route = order[i];
        ferry_loaded *l = NULL;
        ferry_load_stats st = {.size = sizeof st};
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK_EQ(st.route, order[i]);
        if (l) CHECK_EQ(verify_loaded(l, f, "direct defaults"), 0);
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).pinned, ring_pinned(2, ring_after[i]));
        if (i == 2) CHECK(st.pin_seconds == 0); /* the ring load's ring, reused */
        if (i == 1) {                           /* pinning ahead for a direct load keeps it too */
            ferry_load_opts direct = {.size = sizeof direct, .route = FERRY_ROUTE_DIRECT};
            CHECK_EQ(ferry_device_prepare(d, &direct, ferry_file_total_bytes(f)), 0);
            CHECK_EQ(use_of(d).pinned, ring_pinned(2, 4 * MiB));
        }
    }
    o.ring_buffer_bytes = 64 * KiB; /* asked for: pinned as asked */
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    if (l) CHECK_EQ(verify_loaded(l, f, "direct, 64 KiB buffers"), 0);
    ferry_loaded_free(l);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN); /* 2 buffers per reader, min(8, CPUs) readers */
    CHECK_EQ(use_of(d).pinned, ring_pinned(2 * (uint32_t)(cpus < 1 ? 1 : cpus < 8 ? cpus : 8), 64 * KiB));
out:
    ferry_device_close(d);
    ferry_file_close(f);
}

static void test_ring_reuse(ferry_ctx *ctx)
{
    ferry_file *f = open_file(ctx, "odd.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !d) goto out;
    CHECK_EQ(use_of(d).pinned, 0);
    ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
    for (int i = 0; i < 4; i++) {
        if (i == 2 && direct_ok) o.route = FERRY_ROUTE_DIRECT; /* direct shares the ring */
        ferry_loaded *l = NULL;
        ferry_load_stats st = {.size = sizeof st};
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        /* the set-up's parts: the first load pins the ring, the later ones reuse it */
        CHECK(i == 0 ? st.pin_seconds > 0 : st.pin_seconds == 0);
        CHECK(st.alloc_seconds > 0);
        /* pinned beside the allocation (ferry_load's helper): each within the set-up */
        CHECK(st.setup_seconds >= st.pin_seconds && st.setup_seconds >= st.alloc_seconds);
        CHECK(st.seconds >= st.setup_seconds);
        CHECK_EQ(use_of(d).pinned, SMALL_RING); /* the same ring, not another one */
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).pinned, SMALL_RING);
    }
    /* other ring options: the old ring is replaced, not kept */
    o.ring_buffers = 5;
    o.ring_buffer_bytes = 64 * KiB;
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    ferry_loaded_free(l);
    CHECK_EQ(use_of(d).pinned, ring_pinned(5, 64 * KiB));
    /* ring_buffers 1 means 2; a register load leaves the ring alone */
    o.ring_buffers = 1;
    o.ring_buffer_bytes = 1;
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    if (l) CHECK_EQ(verify_loaded(l, f, "ring of 2 x 1 byte"), 0);
    ferry_loaded_free(l);
    CHECK_EQ(use_of(d).pinned, ring_pinned(2, PAGE));
    o.route = FERRY_ROUTE_REGISTER;
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    ferry_loaded_free(l);
    CHECK_EQ(use_of(d).pinned, ring_pinned(2, PAGE));
    /* many threads and streams (clamped) on a tiny ring */
    o = small_opts(FERRY_ROUTE_RING);
    o.threads = 100;
    o.streams = 100;
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    if (l) CHECK_EQ(verify_loaded(l, f, "100 threads, 100 streams"), 0);
    ferry_loaded_free(l);
    CHECK_EQ(use_of(d).pinned, SMALL_RING);
    /* a failed ring allocation (one pinned block for every buffer) leaves no ring behind */
    o.ring_buffers = 3;
    fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_ALLOC, 1);
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), -ENOMEM);
    CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_ALLOC, 0), 0);
    CHECK_EQ(use_of(d).pinned, 0);
    CHECK_EQ(use_of(d).dev, 0);
out:
    ferry_device_close(d);
    ferry_file_close(f);
}

/* A checkpoint in tmpfs: the ring copies it out of the mapping rather than
 * pread it (ring.c), with the same bytes; truncated before the load, it is
 * the same clear error as pread's, not SIGBUS. Needs /dev/shm on tmpfs. */
static atomic_int tmpfs_preads;
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t counting_pread(int fd, void *buf, size_t n, off_t off)
{
    atomic_fetch_add(&tmpfs_preads, 1);
    return real_pread(fd, buf, n, off);
}

static void test_tmpfs_ring(ferry_ctx *ctx)
{
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || sf.f_type != 0x01021994) {
        fprintf(stderr, "tmpfs_ring: /dev/shm is not tmpfs here; skipped\n");
        return;
    }
    tdef *t = defs("shm", SMALL, 6);
    write_st("shm.safetensors", t, 6, 8, 0);
    free(t);
    char p[256];
    snprintf(p, sizeof p, "/dev/shm/ferry-test-xfer-%d.safetensors", (int)getpid());
    CHECK(copy_file("shm.safetensors", p));
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !d) goto out;
    for (int k = 0; k < 2; k++) { /* the small ring: many batches; the default one */
        ferry_load_opts o = small_opts(k ? FERRY_ROUTE_AUTO : FERRY_ROUTE_RING);
        if (k) o.ring_buffers = 0, o.ring_buffer_bytes = 0;
        ferry_loaded *l = NULL;
        ferry_load_stats st = {.size = sizeof st};
        real_pread = (ssize_t(*)(int, void *, size_t, off_t))fy_sys_get("pread");
        atomic_store(&tmpfs_preads, 0);
        CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)counting_pread), 0);
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        fy_sys_set("pread", NULL);
        CHECK_EQ(atomic_load(&tmpfs_preads), 0); /* copied from the mapping */
        CHECK(l != NULL);
        if (l) CHECK_EQ(verify_loaded(l, f, "tmpfs ring"), 0);
        CHECK_EQ(st.route, FERRY_ROUTE_RING);
        ferry_loaded_free(l);
    }
    { /* FERRY_LOAD_PREAD: read as any other file */
        ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
        o.flags = FERRY_LOAD_PREAD;
        ferry_loaded *l = NULL;
        atomic_store(&tmpfs_preads, 0);
        CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)counting_pread), 0);
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
        fy_sys_set("pread", NULL);
        CHECK(atomic_load(&tmpfs_preads) > 0);
        if (l) CHECK_EQ(verify_loaded(l, f, "tmpfs pread"), 0);
        ferry_loaded_free(l);
    }
    CHECK_EQ(truncate(p, 3000), 0);
    ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_CORRUPT);
    CHECK(l == NULL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "ended early");
    CHECK_EQ(use_of(d).dev, 0);
out:
    ferry_device_close(d);
    ferry_file_close(f);
    unlink(p);
}

/* Buffered readers read through descriptors of their own (so the kernel's
 * readahead sees each one's sequential run): fy_reopen_ro gives a second open
 * file description of the same inode, also after the path was replaced, and a
 * load leaves no descriptor behind. */

typedef struct fd_seen {
    int before, max;
} fd_seen;

static void on_fd_progress(void *opaque, uint64_t done, uint64_t total)
{
    (void)done;
    (void)total;
    fd_seen *fs = opaque;
    int n = count_fds();
    if (n > fs->max) fs->max = n;
}

static void test_own_fds(ferry_ctx *ctx)
{
    char p[512], q[512];
    path_of(p, sizeof p, "reopen.bin");
    path_of(q, sizeof q, "reopen2.bin");
    write_text("reopen.bin", "0123456789");
    write_text("reopen2.bin", "another file");
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    struct stat a, b;
    CHECK_EQ(fstat(fd, &a), 0);
    int r = fy_reopen_ro(fd, p);
    CHECK(r >= 0 && r != fd);
    if (r >= 0) {
        CHECK_EQ(fstat(r, &b), 0);
        CHECK(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        CHECK_EQ(lseek(r, 7, SEEK_SET), 7);
        CHECK_EQ(lseek(fd, 0, SEEK_CUR), 0); /* its own offset: a new file description */
        close(r);
    }
    /* the path now names another file: still the inode behind fd */
    CHECK_EQ(rename(q, p), 0);
    r = fy_reopen_ro(fd, p);
    CHECK(r >= 0);
    if (r >= 0) {
        CHECK_EQ(fstat(r, &b), 0);
        CHECK(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        close(r);
    }
    CHECK(fy_reopen_ro(-1, p) < 0);
    close(fd);
    unlink(p);

    /* loads through every buffered reader leave the descriptor count as it
     * was; while one reader runs, its own descriptor is open (counted from
     * the progress callback, which that reader calls) */
    ferry_file *f = open_file(ctx, "sh.safetensors.index.json");
    ferry_file *o = open_file(ctx, "odd.safetensors");
    ferry_file *t = open_file(ctx, "tiny.safetensors");
    ferry_file *e = open_file(ctx, "empty.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    ferry_device *c = open_dev(ctx, "cpu");
    if (!f || !o || !t || !e || !d || !c) goto out;
    int before = count_fds();
    CHECK(before > 0);
    const ferry_file *files[4] = {f, o, t, e};
    ferry_device *devs[2] = {d, c};
    for (int k = 0; k < 16; k++) {
        const ferry_file *ff = files[k / 4];
        ferry_load_opts opt = small_opts(FERRY_ROUTE_RING);
        /* one reader (the count in the callback is its own), three, and more
         * readers than batches (tiny: one small batch; empty: none) */
        opt.threads = (uint32_t[]){1, 3, 16, 16}[k % 4];
        fd_seen fs = {before, 0};
        if (opt.threads == 1) {
            opt.progress = on_fd_progress;
            opt.opaque = &fs;
        }
        ferry_loaded *l = NULL;
        CHECK_EQ(ferry_load(devs[k % 2], ff, &opt, &l, NULL), 0);
        if (l) CHECK_EQ(verify_loaded(l, ff, "own descriptors"), 0);
        ferry_loaded_free(l);
        CHECK_EQ(count_fds(), before);
        if (opt.threads == 1 && ferry_file_total_bytes(ff) > 0) CHECK(fs.max > before);
    }
out:
    ferry_device_close(c);
    ferry_device_close(d);
    ferry_file_close(e);
    ferry_file_close(t);
    ferry_file_close(o);
    ferry_file_close(f);
}

/* ---- 6. progress ---- */

static void run_progress(ferry_device *d, const ferry_file *f, ferry_load_opts o, prog *pg)
{
    memset(pg, 0, sizeof *pg);
    pthread_mutex_init(&pg->mu, NULL);
    o.progress = on_progress;
    o.opaque = pg;
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
    ferry_loaded_free(l);
    pthread_mutex_destroy(&pg->mu);
}

static void test_progress(ferry_ctx *ctx)
{
    ferry_file *f = open_file(ctx, "odd.safetensors");
    ferry_file *s = open_file(ctx, "sh.safetensors.index.json");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !s || !d) goto out;
    const ferry_file *files[2] = {f, s};
    for (int k = 0; k < 2; k++) {
        uint64_t total = ferry_file_total_bytes(files[k]);
        for (int pi = 0; pi < NPATHS; pi++) {
            ferry_route p = all_paths[pi];
            if (p == FERRY_ROUTE_DIRECT && !direct_ok) continue;
            /* one reader thread: calls come in order */
            ferry_load_opts o = small_opts(p);
            o.threads = 1;
            prog pg;
            run_progress(d, files[k], o, &pg);
            CHECK(pg.calls >= (p == FERRY_ROUTE_REGISTER ? ferry_file_shard_count(files[k]) : 2));
            CHECK_EQ(pg.backwards, 0);
            CHECK_EQ(pg.bad_total, 0);
            CHECK_EQ(pg.total_seen, total);
            CHECK_EQ(pg.last, total);
            /* three reader threads: every call sees the total, the largest
             * is the total (the order of calls: see known bugs) */
            o.threads = 3;
            run_progress(d, files[k], o, &pg);
            CHECK(pg.calls >= (p == FERRY_ROUTE_REGISTER ? ferry_file_shard_count(files[k]) : 2));
            CHECK_EQ(pg.bad_total, 0);
            CHECK_EQ(pg.total_seen, total);
            CHECK_EQ(pg.max, total);
        }
    }
out:
    ferry_device_close(d);
    ferry_file_close(f);
    ferry_file_close(s);
}

/* ---- concurrent loads on one device ---- */

typedef struct worker {
    ferry_device *d;
    const ferry_file *f;
    ferry_load_opts o;
    int bad;
} worker;

static void *load_worker(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < 6; i++) {
        ferry_loaded *l = NULL;
        if (ferry_load(w->d, w->f, &w->o, &l, NULL) < 0) w->bad++;
        else if (verify_loaded(l, w->f, "concurrent")) w->bad++;
        ferry_loaded_free(l);
    }
    return NULL;
}

static void test_concurrent(ferry_ctx *ctx)
{
    ferry_file *f = open_file(ctx, "odd.safetensors");
    ferry_file *s = open_file(ctx, "sh.safetensors.index.json");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    if (!f || !s || !d) goto out;
    /* two register loads of one file in small pieces: their helper threads
     * register the same pieces, each load using what the other registered */
    fy_device_set_reg_piece(d, 12 * KiB);
    worker w[5] = {{d, f, small_opts(FERRY_ROUTE_RING), 0},
                   {d, s, small_opts(FERRY_ROUTE_RING), 0},
                   {d, s, small_opts(direct_ok ? FERRY_ROUTE_DIRECT : FERRY_ROUTE_RING), 0},
                   {d, f, small_opts(FERRY_ROUTE_REGISTER), 0},
                   {d, f, small_opts(FERRY_ROUTE_REGISTER), 0}};
    w[1].o.ring_buffers = 3; /* a different ring: the device's ring is replaced back and forth */
    pthread_t th[5];
    for (int i = 0; i < 5; i++) pthread_create(&th[i], NULL, load_worker, &w[i]);
    for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 5; i++) CHECK_EQ(w[i].bad, 0);
    usage u = use_of(d);
    CHECK_EQ(u.dev, 0);
    CHECK_EQ(u.reg, 0);
    CHECK(u.pinned == SMALL_RING || u.pinned == ring_pinned(3, 4096));
out:
    ferry_device_close(d);
    ferry_file_close(f);
    ferry_file_close(s);
}

#define CASES(CASE)                                  \
    CASE(ring_reuse, test_ring_reuse(ctx))           \
    CASE(direct_defaults, test_direct_defaults(ctx)) \
    CASE(tmpfs_ring, test_tmpfs_ring(ctx))           \
    CASE(own_fds, test_own_fds(ctx))                 \
    CASE(progress, test_progress(ctx))               \
    CASE(concurrent, test_concurrent(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
