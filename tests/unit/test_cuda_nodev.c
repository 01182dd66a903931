/* SPDX-License-Identifier: Apache-2.0 */
/* test_cuda_nodev.c - the CUDA backend. Without a driver or a GPU it must fail
 * cleanly with FERRY_E_NODEV and say why; with a GPU it opens cuda:0 and moves
 * a pattern host -> device -> host through pinned and registered memory, from
 * this thread and from a worker thread that never binds explicitly. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "gpu/gpu.h"

#define MiB (1024u * 1024u)
#define N (64u * MiB)

static char msg[FY_ERRMSG_MAX];
static fy_err err;

static const char *errmsg(void)
{
    fy_err_copy(&err, msg, sizeof msg);
    return msg;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* Exactly the bytes fill() would write. */
static int same(const uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        if (p[i] != (uint8_t)(x >> 24)) {
            fprintf(stderr, "byte %zu differs\n", i);
            return 0;
        }
    }
    return 1;
}

static void test_nodev(int rc, fy_gpu *g)
{
    const char *m = errmsg();
    printf("no usable CUDA device: %s\n", m);
    CHECK_EQ(rc, FERRY_E_NODEV);
    CHECK(g == NULL);
    CHECK_STR_HAS(m, "cuda:0: ");
    CHECK(strstr(m, "libcuda.so.1") || strstr(m, "cuInit") || strstr(m, "no such device"));
    /* Again, through the already-initialised table: same answer, same message. */
    char first[FY_ERRMSG_MAX];
    snprintf(first, sizeof first, "%s", m);
    fy_gpu *g2 = (fy_gpu *)(uintptr_t)1; /* must be reset to NULL */
    CHECK_EQ(fy_gpu_cuda_open(0, NULL, &err, &g2), FERRY_E_NODEV);
    CHECK(g2 == NULL);
    CHECK(strcmp(errmsg(), first) == 0);
    CHECK_EQ(fy_gpu_cuda_open(-1, fy_default_allocator(), &err, &g2), FERRY_E_NODEV);
    CHECK_STR_HAS(errmsg(), "cuda:-1: ");
    /* A NULL err is allowed: only the code comes back. */
    CHECK_EQ(fy_gpu_cuda_open(3, NULL, NULL, &g2), FERRY_E_NODEV);
}

struct job {
    fy_gpu *g;
    fy_dptr d;
    int ok;
};

/* On a fresh thread, without bind_thread: every op must bind by itself. */
static void *worker(void *arg)
{
    struct job *j = arg;
    fy_gpu *g = j->g;
    void *hv = NULL;
    fy_stream *s = NULL;
    fy_event *e = NULL;
    j->ok = g->ops->host_alloc(g, MiB, &hv) == 0 && g->ops->stream_new(g, &s) == 0 &&
            g->ops->event_new(g, &e) == 0;
    uint8_t *h = hv;
    if (j->ok) {
        fill(h, MiB, 7);
        /* h is read asynchronously: wait before overwriting it. */
        j->ok = g->ops->copy_htod(g, j->d + MiB, h, MiB, s) == 0 && g->ops->stream_sync(g, s) == 0;
        memset(h, 0, MiB);
        j->ok = j->ok && g->ops->copy_dtoh(g, h, j->d + MiB, MiB, s) == 0 &&
                g->ops->event_record(g, e, s) == 0 && g->ops->event_sync(g, e) == 0 && same(h, MiB, 7);
    }
    g->ops->event_free(g, e);
    g->ops->stream_free(g, s);
    if (h) j->ok = j->ok && g->ops->host_free(g, h) == 0;
    return NULL;
}

static void test_gpu(fy_gpu *g)
{
    const fy_gpu_ops *o = g->ops;
    printf("opened %s\n", g->desc);
    CHECK(strcmp(o->name, "cuda") == 0);
    CHECK_STR_HAS(g->desc, "(cuda:0, ");
    CHECK_STR_HAS(g->desc, " GiB)");
    CHECK_EQ(o->bind_thread(g), 0);

    /* A second device number past the end: NODEV, with the count. */
    fy_gpu *bad = NULL;
    CHECK_EQ(fy_gpu_cuda_open(9999, NULL, &err, &bad), FERRY_E_NODEV);
    CHECK(bad == NULL);
    CHECK_STR_HAS(errmsg(), "cuda:9999: no such device: ");
    CHECK_STR_HAS(msg, "found");

    uint64_t free0 = 0, total = 0, free1 = 0;
    CHECK_EQ(o->mem_info(g, &free0, &total), 0);
    CHECK(total > 0 && free0 <= total);

    /* Out of memory: -ENOMEM and the driver's words. */
    fy_dptr huge = 0;
    CHECK_EQ(o->mem_alloc(g, (size_t)1 << 50, &huge), -ENOMEM);
    CHECK(huge == 0);
    CHECK_STR_HAS(errmsg(), "cuda:0: cuMemAlloc(1125899906842624 bytes): CUDA_ERROR_OUT_OF_MEMORY");

    fy_dptr d = 0;
    CHECK_EQ(o->mem_alloc(g, N, &d), 0);
    CHECK(d != 0);
    CHECK_EQ(o->mem_info(g, &free1, NULL), 0);
    CHECK(free1 + N <= free0 + 16 * MiB); /* other processes may move it a little */

    void *pinv = NULL;
    CHECK_EQ(o->host_alloc(g, N, &pinv), 0);
    uint8_t *pin = pinv;
    void *regv = NULL;
    CHECK_EQ(posix_memalign(&regv, 4096, N), 0);
    uint8_t *reg = regv;
    memset(reg, 0, N);
    CHECK_EQ(o->host_register(g, reg, N, false), 0);
    /* Registering twice is a driver error, reported as such. */
    CHECK_EQ(o->host_register(g, reg, N, false), FERRY_E_DEVICE);
    CHECK_STR_HAS(errmsg(), "cuda:0: cuMemHostRegister(");

    fy_stream *s = NULL;
    fy_event *e = NULL;
    CHECK_EQ(o->stream_new(g, &s), 0);
    CHECK_EQ(o->event_new(g, &e), 0);

    /* pinned -> device -> registered */
    fill(pin, N, 1);
    CHECK_EQ(o->copy_htod(g, d, pin, N, s), 0);
    CHECK_EQ(o->copy_dtoh(g, reg, d, N, s), 0);
    CHECK_EQ(o->event_record(g, e, s), 0);
    CHECK(o->event_query(g, e) >= 0);
    CHECK_EQ(o->event_sync(g, e), 0);
    CHECK_EQ(o->event_query(g, e), 1);
    CHECK(same(reg, N, 1));

    /* registered -> device -> pinned, waited on with a stream sync */
    fill(reg, N, 2);
    memset(pin, 0, N);
    CHECK_EQ(o->copy_htod(g, d, reg, N, s), 0);
    CHECK_EQ(o->copy_dtoh(g, pin, d, N, s), 0);
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK(same(pin, N, 2));

    /* A read-only registered MAP_SHARED file mapping, the zero-copy load path. */
    char path[] = "/tmp/ferry_cuda_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        unlink(path);
        fill(pin, 4 * MiB, 3);
        CHECK_EQ(pwrite(fd, pin, 4 * MiB, 0), (long long)(4 * MiB));
        void *map = mmap(NULL, 4 * MiB, PROT_READ, MAP_SHARED, fd, 0);
        CHECK(map != MAP_FAILED);
        if (map != MAP_FAILED) {
            int rc = o->host_register(g, map, 4 * MiB, true);
            CHECK_EQ(rc, 0);
            if (rc) printf("read-only register: %s\n", errmsg());
            memset(pin, 0, 4 * MiB);
            CHECK_EQ(o->copy_htod(g, d, map, 4 * MiB, s), 0);
            CHECK_EQ(o->copy_dtoh(g, pin, d, 4 * MiB, s), 0);
            CHECK_EQ(o->stream_sync(g, s), 0);
            CHECK(same(pin, 4 * MiB, 3));
            if (rc == 0) CHECK_EQ(o->host_unregister(g, map), 0);
            munmap(map, 4 * MiB);
        }
        close(fd);
    }

    /* A worker thread that never called bind_thread. */
    struct job j = {g, d, 0};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, worker, &j), 0);
    pthread_join(t, NULL);
    CHECK(j.ok);
    if (!j.ok) printf("worker: %s\n", errmsg());

    /* Someone else (PyTorch switching devices) changes this thread's current
     * context behind ferry's back: the next op must still land on cuda:0. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    if (lib) {
        int (*set_current)(void *) = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
        CHECK(set_current && set_current(NULL) == 0);
        uint64_t f = 0;
        CHECK_EQ(o->mem_info(g, &f, NULL), 0);
        CHECK(f > 0);
        dlclose(lib);
    }

    o->event_free(g, e);
    o->stream_free(g, s);
    CHECK_EQ(o->host_unregister(g, reg), 0);
    free(reg);
    CHECK_EQ(o->host_free(g, pin), 0);
    CHECK_EQ(o->mem_free(g, d), 0);
    CHECK_EQ(o->mem_free(g, 0), 0);
    o->stream_free(g, NULL);
    o->event_free(g, NULL);
}

/* Both cases share the one open of cuda:0 main makes: `device` runs where it
 * succeeded, `nodev` where it failed; the other one skips. */
static int open_rc;
static fy_gpu *gpu;

static void case_device(void)
{
    if (open_rc != 0) {
        check_skip("no usable CUDA device");
        return;
    }
    test_gpu(gpu);
    gpu->ops->close(gpu);
    /* Open and close again: the primary context is retained afresh. */
    gpu = NULL;
    CHECK_EQ(fy_gpu_cuda_open(0, NULL, &err, &gpu), 0);
    if (gpu) {
        uint64_t f = 0;
        CHECK_EQ(gpu->ops->mem_info(gpu, &f, NULL), 0);
        gpu->ops->close(gpu);
    }
    gpu = NULL;
}

static void case_nodev(void)
{
    if (open_rc == 0) {
        check_skip("a CUDA device opened");
        return;
    }
    test_nodev(open_rc, gpu);
}

/* `test_cuda_nodev CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)             \
    CASE(device, case_device()) \
    CASE(nodev, case_nodev())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    fy_err_init(&err);
    open_rc = fy_gpu_cuda_open(0, fy_default_allocator(), &err, &gpu);
    check_run();
    if (open_rc == 0 && gpu) gpu->ops->close(gpu); /* `nodev` alone leaves it open */
    fy_err_destroy(&err);
    return check_summary();
}
