/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_route.c - the route a load takes and what it runs on: the pageable
 * path, ferry_device_prepare, ferry_load_plan_route against the load, and
 * the device's reader pool. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ---- the pageable path ---- */

/* auto copies a small cached load straight from the mapping while the device
 * has no ring pinned (FERRY_ROUTE_PAGEABLE), and takes the ring once one is
 * pinned or the load is larger than FERRY_PAGEABLE_MAX; the path asked for;
 * a file cut after it was opened; the cpu device refuses it. */
static void test_pageable(ferry_ctx *ctx)
{
    uint64_t sizes[5] = {1, 4095, MiB + 3, 2 * MiB, 0};
    tdef *t = defs("pg", sizes, 5);
    write_st("pg.safetensors", t, 5, 21, 3);
    free(t);
    uint64_t big[3] = {FERRY_PAGEABLE_MAX / 2, FERRY_PAGEABLE_MAX / 2, 4096};
    t = defs("pgbig", big, 3);
    write_st("pgbig.safetensors", t, 3, 22, 0);
    free(t);
    ferry_file *f = open_file(ctx, "pg.safetensors"), *fb = open_file(ctx, "pgbig.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    ferry_load_opts o = {.size = sizeof o};
    ferry_load_stats st = {.size = sizeof st};
    ferry_loaded *l = NULL;
    if (!f || !fb || !d) goto out;
    /* larger than the limit: the ring, even with none pinned */
    CHECK_EQ(ferry_load(d, fb, &o, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_RING);
    ferry_loaded_free(l);
    ferry_device_close(d);
    d = open_dev(ctx, "sim:256MiB");
    if (!d) goto out;
    for (int i = 0; i < 2; i++) { /* no ring yet, and none made by it */
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK_EQ(st.route, FERRY_ROUTE_PAGEABLE);
        CHECK_STR_HAS(st.why, "no ring pinned");
        CHECK(st.pin_seconds == 0);
        CHECK(st.seconds >= st.setup_seconds);
        CHECK_EQ(st.bytes, ferry_file_total_bytes(f));
        CHECK_EQ(use_of(d).pinned, 0);
        if (l) CHECK_EQ(verify_loaded(l, f, "auto, pageable"), 0);
        ferry_loaded_free(l);
    }
    /* a ring load pins a ring; auto then uses it */
    ferry_load_opts r = {.size = sizeof r, .route = FERRY_ROUTE_RING};
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &r, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_RING);
    ferry_loaded_free(l);
    CHECK(use_of(d).pinned > 0);
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_RING);
    ferry_loaded_free(l);
    /* asked for, with a ring pinned; and into caller-owned memory */
    ferry_load_opts pg = {.size = sizeof pg, .route = FERRY_ROUTE_PAGEABLE};
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &pg, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_PAGEABLE);
    CHECK_STR_HAS(st.why, "asked for");
    if (l) CHECK_EQ(verify_loaded(l, f, "pageable asked for"), 0);
    if (l) {
        ferry_loaded *l2 = NULL;
        CHECK_EQ(ferry_load(d, f, &r, &l2, NULL), 0); /* a second copy, to load into */
        int64_t idx[2] = {3, 1};
        uint64_t dst[2] = {ferry_loaded_ptr(l2, 3), ferry_loaded_ptr(l2, 1)};
        CHECK_EQ(ferry_load_into(d, f, idx, dst, 2, &pg, &st), 0);
        CHECK_EQ(st.route, FERRY_ROUTE_PAGEABLE);
        if (l2) CHECK_EQ(verify_loaded(l2, f, "pageable load_into"), 0);
        ferry_loaded_free(l2);
    }
    ferry_loaded_free(l);
    /* the file cut after it was opened: an error naming it, not a fault */
    char p[512];
    path_of(p, sizeof p, "pg.safetensors");
    CHECK_EQ(truncate(p, 3000), 0);
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &pg, &l, &st), FERRY_E_CORRUPT);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "pg.safetensors");
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "truncated");
    CHECK(l == NULL);
    CHECK_EQ(use_of(d).dev, 0);
    ferry_device_close(d);
    /* host memory: the ring's threaded pread only */
    d = open_dev(ctx, "cpu");
    if (d) {
        l = NULL;
        CHECK_EQ(ferry_load(d, fb, &pg, &l, NULL), FERRY_E_UNSUPPORTED);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "pageable");
        CHECK(l == NULL);
    }
out:
    ferry_device_close(d);
    ferry_file_close(f);
    ferry_file_close(fb);
}

/* ferry_device_prepare pins the ring a load would, and the load uses it */
static void test_prepare(ferry_ctx *ctx)
{
    uint64_t sizes[3] = {5, MiB + 1, 3 * 4096};
    tdef *t = defs("prep", sizes, 3);
    write_st("prep.safetensors", t, 3, 23, 1);
    free(t);
    ferry_file *f = open_file(ctx, "prep.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    ferry_load_opts o = {.size = sizeof o};
    ferry_load_stats st = {.size = sizeof st};
    if (!f || !d) goto out;
    CHECK_EQ(ferry_device_prepare(NULL, NULL, 0), FERRY_E_INVAL);
    ferry_load_opts bad = {.size = 2};
    CHECK_EQ(ferry_device_prepare(d, &bad, 0), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "ferry_device_prepare");
    bad = (ferry_load_opts){.size = sizeof bad, .route = FERRY_ROUTE_COUNT};
    CHECK_EQ(ferry_device_prepare(d, &bad, 0), FERRY_E_INVAL);
    /* paths without a ring pin nothing */
    ferry_load_opts reg = {.size = sizeof reg, .route = FERRY_ROUTE_REGISTER};
    CHECK_EQ(ferry_device_prepare(d, &reg, 1 << 30), 0);
    reg.route = FERRY_ROUTE_PAGEABLE;
    CHECK_EQ(ferry_device_prepare(d, &reg, 1 << 30), 0);
    CHECK_EQ(use_of(d).pinned, 0);
    /* a failed pinning leaves none */
    fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_ALLOC, 1);
    CHECK_EQ(ferry_device_prepare(d, NULL, 10 * MiB), -ENOMEM);
    CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_ALLOC, 0), 0);
    CHECK_EQ(use_of(d).pinned, 0);
    /* 10 MiB: 3 buffers of 4 MiB; again: the same ring */
    CHECK_EQ(ferry_device_prepare(d, NULL, 10 * MiB), 0);
    CHECK_EQ(use_of(d).pinned, ring_pinned(3, 4 * MiB));
    CHECK_EQ(ferry_device_prepare(d, &o, 1), 0);
    CHECK_EQ(use_of(d).pinned, ring_pinned(3, 4 * MiB));
    /* the load finds it pinned: the ring, and no pinning of its own */
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
    CHECK_EQ(st.route, FERRY_ROUTE_RING);
    CHECK(st.pin_seconds == 0);
    CHECK_EQ(use_of(d).pinned, ring_pinned(3, 4 * MiB));
    if (l) CHECK_EQ(verify_loaded(l, f, "after prepare"), 0);
    ferry_loaded_free(l);
    ferry_device_close(d);
    d = open_dev(ctx, "cpu");
    if (d) CHECK_EQ(ferry_device_prepare(d, NULL, 1 << 30), 0); /* host memory: no ring */
out:
    ferry_device_close(d);
    ferry_file_close(f);
}

/* ferry_load_plan_route answers what the load then does (one decision for
 * both), and cufile is a probe, not a route */
static void test_route_choice(ferry_ctx *ctx)
{
    uint64_t sizes[3] = {5, MiB + 1, 3 * 4096};
    tdef *t = defs("rc", sizes, 3);
    write_st("rc.safetensors", t, 3, 24, 1);
    free(t);
    ferry_file *f = open_file(ctx, "rc.safetensors");
    ferry_device *d = open_dev(ctx, "sim:256MiB");
    ferry_route_choice c = {.size = sizeof c};
    ferry_load_stats st = {.size = sizeof st};
    ferry_loaded *l = NULL;
    if (!f || !d) goto out;
    CHECK_EQ(ferry_load_plan_route(NULL, f, NULL, 0, &c), FERRY_E_INVAL);
    CHECK_EQ(ferry_load_plan_route(d, f, NULL, 0, NULL), FERRY_E_INVAL);
    c.size = 2;
    CHECK_EQ(ferry_load_plan_route(d, f, NULL, 0, &c), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "out->size");
    c.size = sizeof c;
    ferry_load_opts bad = {.size = sizeof bad, .route = FERRY_ROUTE_COUNT};
    CHECK_EQ(ferry_load_plan_route(d, f, &bad, 0, &c), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "unknown route");
    /* small, cached, no ring pinned: pageable, nothing to pin; the load agrees */
    CHECK_EQ(ferry_load_plan_route(d, f, NULL, 0, &c), 0);
    CHECK_EQ(c.route, FERRY_ROUTE_PAGEABLE);
    CHECK_EQ(c.pins, 0);
    CHECK_EQ(c.buffers, 0);
    CHECK_EQ(c.buffer_bytes, 0);
    CHECK(c.resident >= 0.5);
    CHECK_EQ(ferry_load(d, f, NULL, &l, &st), 0);
    CHECK_EQ(st.route, c.route);
    CHECK(st.why == c.why);
    ferry_loaded_free(l);
    /* the ring asked for: it would pin 2 buffers of 4 MiB (fitted to ~1 MiB) */
    ferry_load_opts r = {.size = sizeof r, .route = FERRY_ROUTE_RING, .threads = 3};
    CHECK_EQ(ferry_load_plan_route(d, f, &r, 0, &c), 0);
    CHECK_EQ(c.route, FERRY_ROUTE_RING);
    CHECK_EQ(c.threads, 3);
    CHECK_EQ(c.buffers, 2);
    CHECK_EQ(c.buffer_bytes, 4 * MiB);
    CHECK_EQ(c.pins, 1);
    CHECK(c.resident == -1);
    CHECK_STR_HAS(c.why, "asked for");
    l = NULL;
    CHECK_EQ(ferry_load(d, f, &r, &l, &st), 0);
    CHECK(st.pin_seconds > 0);
    CHECK_EQ(use_of(d).pinned, ring_pinned(2, 4 * MiB));
    ferry_loaded_free(l);
    /* now pinned: nothing to pin, and auto takes the ring */
    CHECK_EQ(ferry_load_plan_route(d, f, &r, 0, &c), 0);
    CHECK_EQ(c.pins, 0);
    CHECK_EQ(ferry_load_plan_route(d, f, NULL, 0, &c), 0);
    CHECK_EQ(c.route, FERRY_ROUTE_RING);
    CHECK_EQ(c.pins, 0);
    /* a larger load than the ring holds: more buffers, so it would pin */
    CHECK_EQ(ferry_load_plan_route(d, f, &r, 20 * MiB, &c), 0);
    CHECK_EQ(c.buffers, 5);
    CHECK_EQ(c.pins, 1);
    /* no file: auto answers the ring ferry_device_prepare pins */
    CHECK_EQ(ferry_load_plan_route(d, NULL, NULL, 10 * MiB, &c), 0);
    CHECK_EQ(c.route, FERRY_ROUTE_RING);
    CHECK_EQ(c.buffers, 3);
    CHECK_EQ(c.pins, 1);
    CHECK_STR_HAS(c.why, "no file");
    CHECK_EQ(ferry_device_prepare(d, NULL, 10 * MiB), 0);
    CHECK_EQ(ferry_load_plan_route(d, NULL, NULL, 10 * MiB, &c), 0);
    CHECK_EQ(c.pins, 0);
    /* registered: the register route, no ring */
    CHECK_EQ(ferry_device_register_file(d, f, 0), 0);
    CHECK_EQ(ferry_load_plan_route(d, f, NULL, 0, &c), 0);
    CHECK_EQ(c.route, FERRY_ROUTE_REGISTER);
    CHECK_EQ(c.buffers, 0);
    CHECK_EQ(c.pins, 0);
    ferry_device_unregister_file(d, f);
    /* cufile: reserved, refused by every entry point with the reason */
    ferry_load_opts cf = {.size = sizeof cf, .route = FERRY_ROUTE_CUFILE};
    CHECK_EQ(ferry_load_plan_route(d, f, &cf, 0, &c), FERRY_E_UNSUPPORTED);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "rc.safetensors");
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "cufile is not a route");
    CHECK_EQ(ferry_device_prepare(d, &cf, MiB), FERRY_E_UNSUPPORTED);
    char why[300];
    CHECK_EQ(ferry_device_probe_cufile(d, f, why, sizeof why), FERRY_E_NODEV);
    CHECK_STR_HAS(why, "rc.safetensors");
    CHECK_STR_HAS(why, "cuda device");
    CHECK_EQ(ferry_device_probe_cufile(d, NULL, why, sizeof why), FERRY_E_NODEV);
    CHECK_EQ(ferry_device_probe_cufile(d, NULL, NULL, 0), FERRY_E_NODEV);
    CHECK_EQ(ferry_device_probe_cufile(NULL, f, why, sizeof why), FERRY_E_INVAL);
    CHECK_EQ(why[0], 0);
    ferry_device_close(d);
    /* the cpu device: its readers, no ring; routes it cannot take refused */
    d = open_dev(ctx, "cpu");
    if (d) {
        CHECK_EQ(ferry_load_plan_route(d, f, &r, 0, &c), 0);
        CHECK_EQ(c.route, FERRY_ROUTE_RING);
        CHECK_EQ(c.threads, 3);
        CHECK_EQ(c.buffers, 0);
        CHECK_EQ(c.pins, 0);
        r.route = FERRY_ROUTE_DIRECT;
        CHECK_EQ(ferry_load_plan_route(d, f, &r, 0, &c), FERRY_E_UNSUPPORTED);
    }
out:
    ferry_device_close(d);
    ferry_file_close(f);
}

/* Threads of this process now (/proc/self/task), -1 unknown. */
static int task_count(void)
{
    DIR *tasks = opendir("/proc/self/task");
    if (!tasks) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(tasks));) n += e->d_name[0] != '.';
    closedir(tasks);
    return n;
}

/* The readers run on the device's pool: the first load makes its threads,
 * later loads (ring, its pin ahead, a tmpfs file's unmapping, the cpu
 * device's readers) make none, and ferry_device_close joins them. */
static void test_reader_pool(ferry_ctx *ctx)
{
    ferry_file *f = open_file(ctx, "odd.safetensors");
    for (int cpu = 0; f && cpu < 2; cpu++) {
        int before = task_count();
        ferry_device *d = open_dev(ctx, cpu ? "cpu" : "sim:256MiB");
        if (!d) break;
        ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
        int after_first = -1;
        for (int i = 0; i < 6; i++) {
            ferry_loaded *l = NULL;
            ferry_load_stats st = {.size = sizeof st};
            if (i == 3) o.threads = 2; /* fewer readers: the pool's idle ones serve */
            CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
            if (l) CHECK_EQ(verify_loaded(l, f, cpu ? "pool, cpu" : "pool, sim"), 0);
            ferry_loaded_free(l);
            if (i == 0) after_first = task_count();
            else CHECK_EQ(task_count(), after_first);
        }
        CHECK(after_first > before); /* the pool's threads stay between loads */
#if !defined(__SANITIZE_THREAD__)    /* (ThreadSanitizer refuses threads started after such a fork) */
        /* a child of fork() has none of the pool's threads: it makes its own */
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            ferry_loaded *l = NULL;
            int rc = ferry_load(d, f, &o, &l, NULL);
            if (rc == 0 && verify_loaded(l, f, "pool, forked child") != 0) rc = -1;
            ferry_loaded_free(l);
            ferry_device_close(d);
            _exit(rc == 0 ? 0 : 3);
        }
        int status = 0;
        if (pid > 0) waitpid(pid, &status, 0);
        CHECK(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
        ferry_device_close(d);
        /* and are joined at close: the 3 readers' at least (a sanitizer's
         * own thread may have started meanwhile, so not the count before) */
        CHECK(task_count() <= after_first - 3);
    }
    ferry_file_close(f);
    /* a file in tmpfs: the load's mapping is unmapped on the pool, and
     * closing the device waits for that */
    struct statfs sf;
    char p[256];
    snprintf(p, sizeof p, "/dev/shm/ferry-test-pool-%d.safetensors", (int)getpid());
    if (statfs("/dev/shm", &sf) == 0 && sf.f_type == 0x01021994 && copy_file("odd.safetensors", p)) {
        ferry_file *g = NULL;
        ferry_device *d = open_dev(ctx, "sim:256MiB");
        if (d && ferry_file_open(ctx, p, 0, &g) == 0) {
            int before = task_count();
            ferry_load_opts o = small_opts(FERRY_ROUTE_RING);
            for (int i = 0; i < 3; i++) {
                ferry_loaded *l = NULL;
                CHECK_EQ(ferry_load(d, g, &o, &l, NULL), 0);
                if (l) CHECK_EQ(verify_loaded(l, g, "pool, tmpfs"), 0);
                ferry_loaded_free(l);
                if (i > 0) CHECK(task_count() <= before + 8);
            }
        }
        ferry_device_close(d);
        ferry_file_close(g);
        unlink(p);
    }
}

#define CASES(CASE)                            \
    CASE(pageable, test_pageable(ctx))         \
    CASE(prepare, test_prepare(ctx))           \
    CASE(route_choice, test_route_choice(ctx)) \
    CASE(reader_pool, test_reader_pool(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
