/* SPDX-License-Identifier: Apache-2.0 */
/* test_gpu.c - the sim device through its ops table (capacity, allocation
 * tables, registration, truly asynchronous streams and events, bounds checks,
 * threads, fault loops) plus fy_parse_size and fy_gpu_open's spec errors. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gpu/gpu.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

static fy_err err;

static fy_gpu *open_sim(uint64_t cap)
{
    fy_gpu *g = NULL;
    int rc = fy_gpu_sim_open(cap, 0, NULL, &err, &g);
    CHECK_EQ(rc, 0);
    return g;
}

static void check_empty(fy_gpu *g, int line)
{
    uint64_t d = 1, p = 1, r = 1, fr = 0, tot = 0;
    CHECK_EQ(fy_gpu_sim_usage(g, &d, &p, &r), 0);
    CHECK_EQ(g->ops->mem_info(g, &fr, &tot), 0);
    if (d || p || r || fr != tot)
        fprintf(
            stderr,
            "line %d: usage not back to zero: device %llu pinned %llu registered %llu free %llu of %llu\n",
            line, (unsigned long long)d, (unsigned long long)p, (unsigned long long)r, (unsigned long long)fr,
            (unsigned long long)tot);
    CHECK(d == 0 && p == 0 && r == 0 && fr == tot);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- fy_parse_size ---- */

static void test_parse_size(void)
{
    static const struct {
        const char *s;
        int ok;
        uint64_t v;
    } t[] = {
        {"4096", 1, 4096},
        {"0", 1, 0},
        {"4096B", 1, 4096},
        {"4096b", 1, 4096},
        {"24GiB", 1, 24 * GiB},
        {"24gib", 1, 24 * GiB},
        {"24GIB", 1, 24 * GiB},
        {"24G", 1, 24 * GiB},
        {"24g", 1, 24 * GiB},
        {"512MiB", 1, 512 * MiB},
        {"512M", 1, 512 * MiB},
        {"512m", 1, 512 * MiB},
        {"1K", 1, 1024},
        {"1k", 1, 1024},
        {"1KiB", 1, 1024},
        {"1000kB", 1, 1000000},
        {"1000KB", 1, 1000000},
        {"1000kb", 1, 1000000},
        {"1.5GB", 1, 1500000000},
        {"1.5gb", 1, 1500000000},
        {"1.5GiB", 1, 1536 * MiB},
        {"0.5GiB", 1, 512 * MiB},
        {"1.25KiB", 1, 1280},
        {"0.001kB", 1, 1},
        {"1.0009kB", 1, 1000}, /* rounded down to whole bytes */
        {"2T", 1, UINT64_C(2) << 40},
        {"3TB", 1, UINT64_C(3000000000000)},
        {"1P", 1, UINT64_C(1) << 50},
        {"1EiB", 1, UINT64_C(1) << 60},
        {"15EiB", 1, UINT64_C(15) << 60},
        {"18EB", 1, UINT64_C(18000000000000000000)},
        {"18446744073709551615", 1, UINT64_MAX},
        {"17179869183GiB", 1, UINT64_C(17179869183) << 30},
        {"15.999999999999999999E", 1, UINT64_MAX - 1},
        /* overflow past 2^64 */
        {"16EiB", 0, 0},
        {"19EB", 0, 0},
        {"18446744073709551616", 0, 0},
        {"99999999999999999999", 0, 0},
        {"17179869184GiB", 0, 0},
        {"12345678901234567890.5K", 0, 0},
        /* malformed */
        {"", 0, 0},
        {"-1", 0, 0},
        {"-1GiB", 0, 0},
        {"+1", 0, 0},
        {" 1", 0, 0},
        {"1 ", 0, 0},
        {"1 GiB", 0, 0},
        {"GiB", 0, 0},
        {"G", 0, 0},
        {".5G", 0, 0},
        {"1.G", 0, 0},
        {"1.", 0, 0},
        {"1..5G", 0, 0},
        {"1.5.5G", 0, 0},
        {"1.5", 0, 0}, /* fractional bytes */
        {"1.5B", 0, 0},
        {"1x", 0, 0},
        {"1Gi", 0, 0},
        {"1GiBB", 0, 0},
        {"1GBi", 0, 0},
        {"1iB", 0, 0},
        {"1BB", 0, 0},
        {"1Z", 0, 0},
        {"0x10", 0, 0},
        {"1e9", 0, 0},
        {"1,5G", 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        uint64_t v = 12345;
        bool ok = fy_parse_size(t[i].s, &v);
        if (ok != (bool)t[i].ok || (ok && v != t[i].v))
            fprintf(stderr, "fy_parse_size(\"%s\"): got %s %llu, want %s %llu\n", t[i].s, ok ? "ok" : "fail",
                    (unsigned long long)v, t[i].ok ? "ok" : "fail", (unsigned long long)t[i].v);
        CHECK(ok == (bool)t[i].ok && (!ok || v == t[i].v));
    }
    uint64_t v;
    CHECK(!fy_parse_size(NULL, &v));
    CHECK(!fy_parse_size("1", NULL));
}

/* ---- fy_gpu_open ---- */

static void test_open(void)
{
    static const char *const bad[] = {
        "",          "cuda:",  "cuda:x", "cuda:-1", "cuda:+1", "cuda:1.5", "cuda:0 ", "cuda:99999999999",
        "CUDA",      "cuda0",  "sim",    "sim:",    "sim:0",   "sim:abc",  "sim:-1G", "sim:24GiB ",
        "sim:16EiB", "rocm:0", "gpu",    "sim24G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fy_gpu *g = (fy_gpu *)&err; /* must be cleared */
        err.msg[0] = '\0';
        int rc = fy_gpu_open(bad[i], NULL, &err, &g);
        if (rc != FERRY_E_INVAL) fprintf(stderr, "fy_gpu_open(\"%s\") = %d\n", bad[i], rc);
        CHECK_EQ(rc, FERRY_E_INVAL);
        CHECK(g == NULL);
        CHECK(err.msg[0] != '\0');
    }
    fy_gpu *g = NULL;
    CHECK_EQ(fy_gpu_open("rocm:0", NULL, &err, &g), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "'rocm:0'");
    CHECK_STR_HAS(err.msg, "cuda, cuda:N");
    CHECK_STR_HAS(err.msg, "sim:SIZE");
    CHECK_EQ(fy_gpu_open("sim:lots", NULL, &err, &g), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "bad size");
    CHECK_EQ(fy_gpu_open(NULL, NULL, &err, &g), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_open("sim:1G", NULL, &err, NULL), FERRY_E_INVAL);

    CHECK_EQ(fy_gpu_open("sim:24GiB", NULL, &err, &g), 0);
    if (g) {
        CHECK(strcmp(g->ops->name, "sim") == 0);
        CHECK(strcmp(g->desc, "sim (24.00 GiB)") == 0);
        uint64_t fr = 0, tot = 0;
        CHECK_EQ(g->ops->mem_info(g, &fr, &tot), 0);
        CHECK_EQ(tot, 24 * GiB);
        CHECK_EQ(fr, 24 * GiB);
        CHECK_EQ(g->ops->bind_thread(g), 0);
        fy_gpu_close(g);
    }
    CHECK_EQ(fy_gpu_open("sim:1000000", NULL, &err, &g), 0);
    if (g) {
        CHECK(strcmp(g->desc, "sim (976.56 KiB)") == 0);
        fy_gpu_close(g);
    }
    CHECK_EQ(fy_gpu_open("sim:100", fy_default_allocator(), &err, &g), 0);
    if (g) {
        CHECK(strcmp(g->desc, "sim (100 B)") == 0);
        fy_gpu_close(g);
    }
    /* cuda: works or says why not; either way a clean answer. */
    g = NULL;
    int rc = fy_gpu_open("cuda", NULL, &err, &g);
    CHECK(rc == 0 || rc == FERRY_E_NODEV);
    CHECK(rc == 0 ? g != NULL : g == NULL);
    fy_gpu_close(g);
    fy_gpu_close(NULL);

    /* sim-only calls refuse other devices */
    static const fy_gpu_ops other = {.name = "other"};
    fy_gpu fake = {.ops = &other, .mem = fy_default_allocator(), .err = &err};
    uint64_t d;
    CHECK_EQ(fy_gpu_sim_fault(&fake, FY_OP_ANY, 1), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_usage(&fake, &d, NULL, NULL), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_fault(NULL, FY_OP_ANY, 1), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_open(0, 0, NULL, &err, &g), FERRY_E_INVAL);
}

/* ---- capacity, allocation tables, mem_info ---- */

static void test_capacity(void)
{
    fy_gpu *g = open_sim(4 * GiB);
    if (!g) return;
    const fy_gpu_ops *o = g->ops;
    fy_dptr big = 0, rest = 0, p = 0;
    uint64_t fr = 0, tot = 0;

    /* mapped lazily: nothing here touches these pages */
    CHECK_EQ(o->mem_alloc(g, 3 * GiB + 512 * MiB, &big), 0);
    CHECK(big != 0);
    p = 77;
    CHECK_EQ(o->mem_alloc(g, 1 * GiB, &p), -ENOMEM);
    CHECK_EQ(p, 0);
    CHECK_STR_HAS(err.msg, "sim: out of device memory: 1.00 GiB requested, 512.00 MiB free of 4.00 GiB");
    CHECK_EQ(o->mem_info(g, &fr, &tot), 0);
    CHECK_EQ(fr, 512 * MiB);
    CHECK_EQ(tot, 4 * GiB);
    CHECK_EQ(o->mem_alloc(g, 512 * MiB, &rest), 0);
    CHECK_EQ(o->mem_info(g, &fr, NULL), 0);
    CHECK_EQ(fr, 0);
    CHECK_EQ(o->mem_alloc(g, 1, &p), -ENOMEM);
    CHECK_STR_HAS(err.msg, "1 B requested, 0 B free of 4.00 GiB");
    CHECK_EQ(o->mem_free(g, big), 0);
    CHECK_EQ(o->mem_free(g, rest), 0);
    check_empty(g, __LINE__);

    /* odd sizes, both the malloc and the mmap path: exact accounting, 256-byte alignment */
    static const size_t sizes[] = {1, 255, 256, 257, 4097, 65536, MiB - 1, MiB, MiB + 1, 3 * MiB + 7};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    fy_dptr d[NS];
    uint64_t sum = 0, dev = 0;
    for (int i = 0; i < NS; i++) {
        CHECK_EQ(o->mem_alloc(g, sizes[i], &d[i]), 0);
        CHECK_EQ(d[i] % 256, 0);
        sum += sizes[i];
        CHECK_EQ(o->mem_info(g, &fr, NULL), 0);
        CHECK_EQ(fr, 4 * GiB - sum);
    }
    CHECK_EQ(fy_gpu_sim_usage(g, &dev, NULL, NULL), 0);
    CHECK_EQ(dev, sum);

    /* frees: wrong pointers are clean errors and change nothing */
    int local;
    CHECK_EQ(o->mem_free(g, d[4] + 1), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not its start");
    CHECK_EQ(o->mem_free(g, (fy_dptr)(uintptr_t)&local), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not a live device allocation");
    CHECK_EQ(o->mem_free(g, 0), FERRY_E_INVAL);
    CHECK_EQ(o->mem_free(g, d[0]), 0);
    CHECK_EQ(o->mem_free(g, d[0]), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "freed twice");
    sum -= sizes[0];
    CHECK_EQ(o->mem_info(g, &fr, NULL), 0);
    CHECK_EQ(fr, 4 * GiB - sum);
    for (int i = 1; i < NS; i++) CHECK_EQ(o->mem_free(g, d[i]), 0);
    CHECK_EQ(o->mem_alloc(g, 0, &p), FERRY_E_INVAL);
    CHECK_EQ(o->mem_alloc(g, 1, NULL), FERRY_E_INVAL);
    check_empty(g, __LINE__);

    /* pinned memory: page-aligned, usable, accounted apart from the device */
    void *h1 = NULL, *h2 = NULL;
    CHECK_EQ(o->host_alloc(g, 100, &h1), 0);
    CHECK_EQ(o->host_alloc(g, 8 * MiB, &h2), 0);
    CHECK_EQ((uintptr_t)h1 % 4096, 0);
    CHECK_EQ((uintptr_t)h2 % 4096, 0);
    if (h1 && h2) {
        memset(h1, 1, 100);
        memset(h2, 2, 8 * MiB);
    }
    uint64_t pin = 0;
    CHECK_EQ(fy_gpu_sim_usage(g, &dev, &pin, NULL), 0);
    CHECK_EQ(dev, 0);
    CHECK_EQ(pin, 100 + 8 * MiB);
    CHECK_EQ(o->mem_info(g, &fr, NULL), 0);
    CHECK_EQ(fr, 4 * GiB);
    CHECK_EQ(o->host_free(g, (char *)h2 + 8), FERRY_E_INVAL);
    CHECK_EQ(o->host_free(g, &local), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not a live pinned allocation");
    CHECK_EQ(o->host_free(g, NULL), 0);
    CHECK_EQ(o->host_free(g, h1), 0);
    CHECK_EQ(o->host_free(g, h1), FERRY_E_INVAL);
    CHECK_EQ(o->host_free(g, h2), 0);
    CHECK_EQ(o->host_alloc(g, 0, &h1), FERRY_E_INVAL);
    /* a device pointer is not a pinned one, nor the other way round */
    CHECK_EQ(o->mem_alloc(g, 4096, &p), 0);
    CHECK_EQ(o->host_free(g, (void *)(uintptr_t)p), FERRY_E_INVAL);
    CHECK_EQ(o->mem_free(g, p), 0);
    check_empty(g, __LINE__);
    fy_gpu_close(g);
}

/* ---- registration ---- */

static void test_register(void)
{
    fy_gpu *g = open_sim(64 * MiB);
    if (!g) return;
    const fy_gpu_ops *o = g->ops;
    size_t len = MiB;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *other = malloc(10000);
    CHECK(buf != MAP_FAILED && other);
    if (buf == MAP_FAILED || !other) return;
    uint64_t reg = 0;

    CHECK_EQ(o->host_register(g, buf, len, false), 0);
    CHECK_EQ(fy_gpu_sim_usage(g, NULL, NULL, &reg), 0);
    CHECK_EQ(reg, len);
    CHECK_EQ(o->host_register(g, buf, len, false), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "ALREADY_REGISTERED");
    CHECK_EQ(o->host_register(g, buf + 4096, 4096, true), FERRY_E_INVAL);
    CHECK_EQ(o->host_register(g, buf - 100, 101, false), FERRY_E_INVAL);
    CHECK_EQ(o->host_register(g, other, 10000, true), 0);
    CHECK_EQ(fy_gpu_sim_usage(g, NULL, NULL, &reg), 0);
    CHECK_EQ(reg, len + 10000);
    CHECK_EQ(o->host_unregister(g, buf + 4096), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not its start");
    int local;
    CHECK_EQ(o->host_unregister(g, &local), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not registered");
    CHECK_EQ(o->host_unregister(g, buf), 0);
    CHECK_EQ(o->host_unregister(g, buf), FERRY_E_INVAL);
    CHECK_EQ(o->host_register(g, buf, len, true), 0); /* again after unregistering */

    /* read-only registration: a source, never a destination */
    fy_dptr d = 0;
    fy_stream *s = NULL;
    CHECK_EQ(o->mem_alloc(g, 4096, &d), 0);
    CHECK_EQ(o->stream_new(g, &s), 0);
    memset(buf, 7, 4096);
    CHECK_EQ(o->copy_htod(g, d, buf, 4096, s), 0);
    CHECK_EQ(o->copy_dtoh(g, buf + 8192, d, 4096, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "read-only");
    CHECK_EQ(o->copy_dtoh(g, other, d, 100, s), FERRY_E_INVAL);
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK_EQ(o->host_unregister(g, buf), 0);

    /* two adjacent registrations are two for the driver: a copy may come from
     * either, not cross from one into the next (it failed on the H200), nor
     * run from pageable memory into one */
    CHECK_EQ(o->host_register(g, buf, 8192, true), 0);
    CHECK_EQ(o->host_register(g, buf + 8192, 8192, true), 0);
    CHECK_EQ(o->copy_htod(g, d, buf + 4096, 4096, s), 0);
    CHECK_EQ(o->copy_htod(g, d, buf + 8192, 4096, s), 0);
    CHECK_EQ(o->copy_htod(g, d, buf + 8191, 2, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "crosses the edge of the range registered");
    CHECK_STR_HAS(err.msg, "inside one registration");
    CHECK_EQ(o->copy_htod(g, d, buf + 4096, 4096 + 1, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_htod(g, d, buf + 16384 - 1, 2, s), FERRY_E_INVAL); /* runs out into pageable memory */
    CHECK_EQ(o->copy_htod(g, d, buf + 16384, 4096, s), 0);              /* pageable alone is fine */
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK_EQ(o->host_unregister(g, buf + 8192), 0);
    CHECK_EQ(o->copy_htod(g, d, buf + 8191, 2, s),
             FERRY_E_INVAL); /* from a registration into pageable memory */
    CHECK_EQ(o->host_unregister(g, buf), 0);
    CHECK_EQ(o->copy_htod(g, d, buf + 8191, 2, s), 0);
    CHECK_EQ(o->stream_sync(g, s), 0);
    o->stream_free(g, s);
    CHECK_EQ(o->mem_free(g, d), 0);

    CHECK_EQ(o->host_unregister(g, other), 0);

    /* bad ranges */
    void *pin = NULL;
    CHECK_EQ(o->host_alloc(g, 8192, &pin), 0);
    CHECK_EQ(o->host_register(g, pin, 4096, false), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "pinned memory");
    CHECK_EQ(o->host_free(g, pin), 0);
    CHECK_EQ(o->mem_alloc(g, 4096, &d), 0);
    CHECK_EQ(o->host_register(g, (void *)(uintptr_t)d, 4096, false), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "device memory");
    CHECK_EQ(o->mem_free(g, d), 0);
    CHECK_EQ(o->host_register(g, NULL, 4096, false), FERRY_E_INVAL);
    CHECK_EQ(o->host_register(g, buf, 0, false), FERRY_E_INVAL);
    CHECK_EQ(o->host_register(g, buf, SIZE_MAX, false), FERRY_E_INVAL);
    munmap(buf + len / 2, len / 2);
    CHECK_EQ(o->host_register(g, buf, len, true), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not all of it is mapped");
    munmap(buf, len / 2);
    free(other);
    check_empty(g, __LINE__);
    fy_gpu_close(g);
}

/* ---- a source that cannot be read ---- */

/* A registered file mapping whose file was cut after it was mapped: the
 * sim's copy out of it is an error that the next stream_sync reports (once),
 * not a SIGBUS; the pages still inside the file copy as before. */
static void test_truncated_source(void)
{
    /* where process_vm_readv is refused (a seccomp filter) the sim falls back
     * to memcpy, and this test would die of the SIGBUS it is about */
    char a = 1, b = 0;
    struct iovec l = {&b, 1}, r = {&a, 1};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1) {
        printf("truncated_source: skipped, process_vm_readv: %s\n", strerror(errno));
        return;
    }
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/ferry-gpu-trunc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    unlink(path);
    size_t len = 3 * 4096;
    char *src = malloc(len);
    for (size_t i = 0; i < len; i++) src[i] = (char)(i * 7 + 1);
    CHECK_EQ(pwrite(fd, src, len, 0), (ssize_t)len);
    char *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED);
    fy_gpu *g = open_sim(64 * MiB);
    if (map == MAP_FAILED || !g) goto out;
    const fy_gpu_ops *o = g->ops;
    fy_dptr d = 0;
    fy_stream *s = NULL;
    CHECK_EQ(o->host_register(g, map, len, true), 0);
    CHECK_EQ(o->mem_alloc(g, len, &d), 0);
    CHECK_EQ(o->stream_new(g, &s), 0);
    CHECK_EQ(ftruncate(fd, 4096 + 10), 0); /* page 1 half inside, page 2 past the end */

    CHECK_EQ(o->copy_htod(g, d, map, len, s), 0);
    CHECK_EQ(o->stream_sync(g, s), -EFAULT);
    CHECK_STR_HAS(err.msg, "could not be read");
    CHECK_EQ(o->stream_sync(g, s), 0); /* reported once */

    /* what is still inside the file copies; the rest of page 1 reads as 0 */
    char *back = calloc(1, 2 * 4096);
    CHECK_EQ(o->copy_htod(g, d, map, 2 * 4096, s), 0);
    CHECK_EQ(o->copy_dtoh(g, back, d, 2 * 4096, s), 0);
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK(memcmp(back, src, 4096 + 10) == 0);
    CHECK(back[4096 + 10] == 0 && back[2 * 4096 - 1] == 0);
    free(back);

    /* an unregistered (pageable) source is guarded the same way */
    CHECK_EQ(o->host_unregister(g, map), 0);
    CHECK_EQ(o->copy_htod(g, d, map + 2 * 4096, 100, s), 0);
    CHECK_EQ(o->stream_sync(g, s), -EFAULT);
    o->stream_free(g, s);
    CHECK_EQ(o->mem_free(g, d), 0);
    check_empty(g, __LINE__);
out:
    fy_gpu_close(g);
    if (map != MAP_FAILED) munmap(map, len);
    free(src);
    close(fd);
}

/* ---- asynchronous semantics ---- */

static void test_async(void)
{
    fy_gpu *g = open_sim(1 * GiB);
    if (!g) return;
    const fy_gpu_ops *o = g->ops;
    const size_t n = 256 * MiB;
    fy_dptr d = 0;
    unsigned char *src = NULL, *dst = NULL;
    fy_stream *s = NULL;
    fy_event *e = NULL;
    CHECK_EQ(o->mem_alloc(g, n, &d), 0);
    CHECK_EQ(o->host_alloc(g, n, (void **)&src), 0);
    CHECK_EQ(o->host_alloc(g, n, (void **)&dst), 0);
    CHECK_EQ(o->stream_new(g, &s), 0);
    CHECK_EQ(o->event_new(g, &e), 0);
    if (!d || !src || !dst || !s || !e) return;

    /* never recorded: complete */
    CHECK_EQ(o->event_query(g, e), 1);
    CHECK_EQ(o->event_sync(g, e), 0);

    for (size_t i = 0; i < n; i += 4096) src[i] = (unsigned char)(i >> 12);
    memset(dst, 0, n);
    /* The device pages are untouched: the first copy also faults them in, so
     * it takes tens of milliseconds while the calls below take microseconds. */
    CHECK_EQ(o->copy_htod(g, d, src, n, s), 0);
    CHECK_EQ(o->copy_dtoh(g, dst, d, n, s), 0);
    CHECK_EQ(o->event_record(g, e, s), 0);
    CHECK_EQ(o->event_query(g, e), 0); /* queued behind 512 MiB of copies */
    CHECK_EQ(o->event_sync(g, e), 0);
    CHECK_EQ(o->event_query(g, e), 1);
    int same = 1;
    for (size_t i = 0; i < n; i += 4096) same &= dst[i] == (unsigned char)(i >> 12);
    CHECK(same);

    /* event_query eventually says 1 without anyone syncing */
    for (size_t i = 0; i < n; i += 4096) src[i] ^= 0xFF;
    CHECK_EQ(o->copy_htod(g, d, src, n, s), 0);
    CHECK_EQ(o->copy_dtoh(g, dst, d, n, s), 0);
    CHECK_EQ(o->event_record(g, e, s), 0);
    int q = 0, polls = 0;
    while ((q = o->event_query(g, e)) == 0 && polls < 20000) {
        sleep_ms(1);
        polls++;
    }
    CHECK_EQ(q, 1);
    same = 1;
    for (size_t i = 0; i < n; i += 4096) same &= dst[i] == (unsigned char)((i >> 12) ^ 0xFF);
    CHECK(same);

    /* stream_sync waits for everything queued */
    CHECK_EQ(o->copy_htod(g, d, dst, n, s), 0);
    CHECK_EQ(o->copy_dtoh(g, src, d, n, s), 0);
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK(memcmp(src, dst, n) == 0);

    /* re-recording: the event follows its latest record */
    fy_stream *s2 = NULL;
    CHECK_EQ(o->stream_new(g, &s2), 0);
    CHECK_EQ(o->copy_htod(g, d, src, n, s), 0);
    CHECK_EQ(o->event_record(g, e, s), 0);
    CHECK_EQ(o->event_record(g, e, s2), 0); /* s2 is idle */
    CHECK_EQ(o->event_sync(g, e), 0);
    CHECK_EQ(o->stream_sync(g, s), 0);
    CHECK_EQ(o->event_query(g, e), 1);

    /* freeing memory with copies still queued waits for them (cuMemFree
     * synchronises); freeing an event with a record queued is allowed */
    CHECK_EQ(o->copy_htod(g, d, src, n, s), 0);
    CHECK_EQ(o->event_record(g, e, s), 0);
    o->event_free(g, e);
    CHECK_EQ(o->mem_free(g, d), 0);
    CHECK_EQ(o->copy_htod(g, d, src, 1, s), FERRY_E_INVAL); /* gone */
    for (int i = 0; i < 50; i++) { /* small blocks: ASan sees a use after free if the wait is missing */
        fy_dptr sd = 0;
        void *sp = NULL;
        CHECK_EQ(o->mem_alloc(g, 64 * KiB, &sd), 0);
        CHECK_EQ(o->host_alloc(g, 64 * KiB, &sp), 0);
        CHECK_EQ(o->copy_htod(g, sd, src, 64 * KiB, s), 0);
        CHECK_EQ(o->copy_dtoh(g, sp, sd, 64 * KiB, s), 0);
        CHECK_EQ(o->copy_htod(g, sd, sp, 64 * KiB, s), 0);
        CHECK_EQ(o->host_free(g, sp), 0);
        CHECK_EQ(o->mem_free(g, sd), 0);
    }
    o->stream_free(g, s);
    o->stream_free(g, s2);
    CHECK_EQ(o->host_free(g, src), 0);
    CHECK_EQ(o->host_free(g, dst), 0);
    check_empty(g, __LINE__);
    fy_gpu_close(g);
}

/* ---- bounds and handle checks ---- */

static void test_bounds(void)
{
    fy_gpu *g = open_sim(64 * MiB), *g2 = open_sim(MiB);
    if (!g || !g2) return;
    const fy_gpu_ops *o = g->ops;
    fy_dptr d = 0, d2 = 0;
    fy_stream *s = NULL, *other = NULL, *gone = NULL;
    void *pin = NULL;
    char buf[4096] = {0};
    CHECK_EQ(o->mem_alloc(g, 1000, &d), 0);
    CHECK_EQ(o->mem_alloc(g, 1000, &d2), 0);
    CHECK_EQ(o->host_alloc(g, 4096, &pin), 0);
    CHECK_EQ(o->stream_new(g, &s), 0);
    CHECK_EQ(g2->ops->stream_new(g2, &other), 0);

    CHECK_EQ(o->copy_htod(g, d, buf, 1000, s), 0);
    CHECK_EQ(o->copy_htod(g, d + 999, buf, 1, s), 0);
    CHECK_EQ(o->copy_htod(g, d, buf, 1001, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "runs 1 bytes past the end of the allocation");
    CHECK_EQ(o->copy_htod(g, d + 999, buf, 2, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_htod(g, d + 1000, buf, 1, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "not in any live allocation");
    CHECK_EQ(o->copy_htod(g, d - 1, buf, 2, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_dtoh(g, buf, d, 1001, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_dtoh(g, buf, d + 500, 501, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_dtoh(g, buf, d + 500, 500, s), 0);
    CHECK_EQ(o->copy_dtoh(g, buf, 0, 1, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_htod(g, UINT64_MAX - 10, buf, 100, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_htod(g, d, NULL, 10, s), FERRY_E_INVAL);
    CHECK_EQ(o->copy_htod(g, d, buf, 0, s), 0); /* empty copies are fine */
    /* a device address passed as host memory */
    CHECK_EQ(o->copy_htod(g, d2, (const void *)(uintptr_t)d, 10, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "is device memory");
    CHECK_EQ(o->copy_dtoh(g, (void *)(uintptr_t)d2, d, 10, s), FERRY_E_INVAL);
    /* a copy that runs off a pinned buffer */
    CHECK_EQ(o->copy_htod(g, d, (char *)pin + 4000, 96, s), 0);
    CHECK_EQ(o->copy_htod(g, d, (char *)pin + 4000, 200, s), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "crosses the edge of the pinned buffer");
    CHECK_EQ(o->copy_dtoh(g, (char *)pin + 4095, d, 2, s), FERRY_E_INVAL);
    /* streams: NULL, from another device, freed */
    CHECK_EQ(o->copy_htod(g, d, buf, 10, NULL), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "NULL stream");
    CHECK_EQ(o->copy_htod(g, d, buf, 10, other), FERRY_E_INVAL);
    CHECK_STR_HAS(err.msg, "unknown stream");
    CHECK_EQ(o->stream_new(g, &gone), 0);
    o->stream_free(g, gone);
    CHECK_EQ(o->copy_htod(g, d, buf, 10, gone), FERRY_E_INVAL);
    CHECK_EQ(o->stream_sync(g, gone), FERRY_E_INVAL);
    CHECK_EQ(o->stream_sync(g, NULL), FERRY_E_INVAL);
    /* events: NULL, from another device */
    fy_event *e = NULL, *e2 = NULL;
    CHECK_EQ(o->event_new(g, &e), 0);
    CHECK_EQ(g2->ops->event_new(g2, &e2), 0);
    CHECK_EQ(o->event_record(g, NULL, s), FERRY_E_INVAL);
    CHECK_EQ(o->event_record(g, e, NULL), FERRY_E_INVAL);
    CHECK_EQ(o->event_record(g, e2, s), FERRY_E_INVAL);
    CHECK_EQ(o->event_record(g, e, other), FERRY_E_INVAL);
    CHECK_EQ(o->event_sync(g, e2), FERRY_E_INVAL);
    CHECK_EQ(o->event_query(g, NULL), FERRY_E_INVAL);
    /* freed allocations */
    CHECK_EQ(o->mem_free(g, d2), 0);
    CHECK_EQ(o->copy_htod(g, d2, buf, 1, s), FERRY_E_INVAL);

    CHECK_EQ(o->stream_sync(g, s), 0);
    o->event_free(g, e);
    o->event_free(g, NULL);
    o->stream_free(g, s);
    o->stream_free(g, NULL);
    CHECK_EQ(o->mem_free(g, d), 0);
    CHECK_EQ(o->host_free(g, pin), 0);
    check_empty(g, __LINE__);
    g2->ops->event_free(g2, e2);
    g2->ops->stream_free(g2, other);
    fy_gpu_close(g);
    fy_gpu_close(g2);
}

/* ---- threads ---- */

typedef struct worker_arg {
    fy_gpu *g;
    int id;
    int bad;
} worker_arg;

/* Each thread round-trips patterns through its own stream and checks them. */
static void *worker(void *p)
{
    worker_arg *a = p;
    fy_gpu *g = a->g;
    const fy_gpu_ops *o = g->ops;
    const size_t n = 1 * MiB + 12345;
    fy_dptr d = 0;
    unsigned char *in = NULL, *out = NULL;
    fy_stream *s = NULL;
    fy_event *e = NULL;
    if (o->stream_new(g, &s) || o->event_new(g, &e) || o->mem_alloc(g, n, &d) ||
        o->host_alloc(g, n, (void **)&in) || o->host_alloc(g, n, (void **)&out)) {
        a->bad++;
        goto out;
    }
    for (int it = 0; it < 60; it++) {
        memset(in, (a->id * 61 + it) & 0xFF, n);
        in[it] = (unsigned char)a->id;
        if (o->copy_htod(g, d, in, n / 2, s) || o->copy_htod(g, d + n / 2, in + n / 2, n - n / 2, s) ||
            o->copy_dtoh(g, out, d, n, s) || o->event_record(g, e, s)) {
            a->bad++;
            break;
        }
        if (it % 2) {
            while (o->event_query(g, e) == 0) sched_yield();
        } else if (o->event_sync(g, e)) {
            a->bad++;
        }
        if (memcmp(in, out, n) != 0) a->bad++;
    }
out:
    o->event_free(g, e);
    o->stream_free(g, s);
    if (d) o->mem_free(g, d);
    o->host_free(g, in);
    o->host_free(g, out);
    return NULL;
}

static void test_threads(void)
{
    fy_gpu *g = open_sim(256 * MiB);
    if (!g) return;
    worker_arg a[2] = {{g, 1, 0}, {g, 2, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_create(&t[i], NULL, worker, &a[i]), 0);
    /* meanwhile: allocation churn and mem_info on the same device */
    int bad = 0;
    for (int i = 0; i < 300; i++) {
        fy_dptr d = 0;
        uint64_t fr, tot;
        if (g->ops->mem_alloc(g, (size_t)(i % 7 + 1) * 3000, &d) || g->ops->mem_info(g, &fr, &tot) ||
            fr > tot || g->ops->mem_free(g, d))
            bad++;
    }
    CHECK_EQ(bad, 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(a[i].bad, 0);
    }
    check_empty(g, __LINE__);
    fy_gpu_close(g);
}

/* ---- fault loops ---- */

static char regbuf[3 * 4096] __attribute__((aligned(4096)));

/* A small everything-once job; returns 0 or the first error, and always
 * cleans up after itself. */
static int job(fy_gpu *g)
{
    const fy_gpu_ops *o = g->ops;
    fy_dptr d1 = 0, d2 = 0;
    unsigned char *pin = NULL;
    fy_stream *s = NULL;
    fy_event *e = NULL;
    bool reg = false;
    int rc;
    if ((rc = o->mem_alloc(g, 4096, &d1)) < 0) goto out;
    if ((rc = o->mem_alloc(g, 2 * MiB, &d2)) < 0) goto out;
    if ((rc = o->host_alloc(g, 4096, (void **)&pin)) < 0) goto out;
    if ((rc = o->host_register(g, regbuf, sizeof regbuf, false)) < 0) goto out;
    reg = true;
    if ((rc = o->stream_new(g, &s)) < 0) goto out;
    if ((rc = o->event_new(g, &e)) < 0) goto out;
    memset(pin, 0x5A, 4096);
    memset(regbuf, 0, sizeof regbuf);
    if ((rc = o->copy_htod(g, d1, pin, 4096, s)) < 0) goto out;
    if ((rc = o->copy_htod(g, d2 + MiB, pin, 4096, s)) < 0) goto out;
    if ((rc = o->copy_dtoh(g, regbuf + 4096, d2 + MiB, 4096, s)) < 0) goto out;
    if ((rc = o->event_record(g, e, s)) < 0) goto out;
    if ((rc = o->event_sync(g, e)) < 0) goto out;
    if ((rc = o->stream_sync(g, s)) < 0) goto out;
    if (regbuf[4095] != 0 || regbuf[4096] != 0x5A || regbuf[8191] != 0x5A || regbuf[8192] != 0) rc = -1;
out:
    o->event_free(g, e);
    o->stream_free(g, s);
    if (reg) CHECK_EQ(o->host_unregister(g, regbuf), 0);
    CHECK_EQ(o->host_free(g, pin), 0);
    if (d2) CHECK_EQ(o->mem_free(g, d2), 0);
    if (d1) CHECK_EQ(o->mem_free(g, d1), 0);
    return rc;
}

static void test_faults(void)
{
    static const struct {
        fy_gpu_op op;
        const char *name;
        int code;
        long calls;
    } kinds[] = {
        {FY_OP_ANY, "any", 0, 12},
        {FY_OP_MEM_ALLOC, "mem_alloc", -ENOMEM, 2},
        {FY_OP_HOST_ALLOC, "host_alloc", -ENOMEM, 1},
        {FY_OP_HOST_REGISTER, "host_register", FERRY_E_DEVICE, 1},
        {FY_OP_COPY, "copy", FERRY_E_DEVICE, 3},
        {FY_OP_EVENT, "event", FERRY_E_DEVICE, 3},
    };
    fy_gpu *g = open_sim(16 * MiB);
    if (!g) return;
    CHECK_EQ(job(g), 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COUNT, 1), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_fault(g, (fy_gpu_op)-1, 1), FERRY_E_INVAL);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, -1), FERRY_E_INVAL);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        long n;
        for (n = 1; n < 100; n++) {
            CHECK_EQ(fy_gpu_sim_fault(g, kinds[k].op, n), 0);
            err.msg[0] = '\0';
            int rc = job(g);
            int left = fy_gpu_sim_fault(g, kinds[k].op, 0);
            check_empty(g, __LINE__);
            if (left > 0) { /* ran out of calls before the fault */
                CHECK_EQ(rc, 0);
                break;
            }
            char want[64];
            snprintf(want, sizeof want, "(call %ld)", n);
            if (kinds[k].code) CHECK_EQ(rc, kinds[k].code);
            else CHECK(rc == -ENOMEM || rc == FERRY_E_DEVICE);
            CHECK_STR_HAS(err.msg, "sim: injected failure in ");
            CHECK_STR_HAS(err.msg, want);
            if (kinds[k].op != FY_OP_ANY) CHECK_STR_HAS(err.msg, kinds[k].name);
        }
        if (n - 1 != kinds[k].calls) fprintf(stderr, "fault kind %s: %ld calls\n", kinds[k].name, n - 1);
        CHECK_EQ(n - 1, kinds[k].calls);
    }
    /* disarmed: the device works */
    CHECK_EQ(job(g), 0);
    /* "1 = next": arming counts from now, and the fault fires once */
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_MEM_ALLOC, 1), 0);
    fy_dptr d = 0;
    CHECK_EQ(g->ops->mem_alloc(g, 10, &d), -ENOMEM);
    CHECK_STR_HAS(err.msg, "sim: injected failure in mem_alloc (call 1)");
    CHECK_EQ(g->ops->mem_alloc(g, 10, &d), 0);
    CHECK_EQ(g->ops->mem_free(g, d), 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, 5), 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_COPY, 0), 5);
    check_empty(g, __LINE__);
    fy_gpu_close(g);
}

/* ---- close with everything still alive ---- */

static void test_close_leftovers(void)
{
    fy_gpu *g = open_sim(64 * MiB);
    if (!g) return;
    const fy_gpu_ops *o = g->ops;
    fy_dptr d = 0, big = 0;
    void *pin = NULL;
    fy_stream *s1 = NULL, *s2 = NULL;
    fy_event *e1 = NULL, *e2 = NULL;
    CHECK_EQ(o->mem_alloc(g, 1000, &d), 0);
    CHECK_EQ(o->mem_alloc(g, 32 * MiB, &big), 0);
    CHECK_EQ(o->host_alloc(g, 32 * MiB, &pin), 0);
    CHECK_EQ(o->host_register(g, regbuf, sizeof regbuf, true), 0);
    CHECK_EQ(o->stream_new(g, &s1), 0);
    CHECK_EQ(o->stream_new(g, &s2), 0);
    CHECK_EQ(o->event_new(g, &e1), 0);
    CHECK_EQ(o->event_new(g, &e2), 0);
    if (!pin) return;
    memset(pin, 3, 32 * MiB);
    CHECK_EQ(o->copy_htod(g, big, pin, 32 * MiB, s1), 0);
    CHECK_EQ(o->copy_dtoh(g, pin, big, 32 * MiB, s1), 0); /* same stream: ordered after the htod */
    CHECK_EQ(o->copy_htod(g, d, regbuf, 1000, s2), 0);
    CHECK_EQ(o->event_record(g, e1, s1), 0);
    CHECK_EQ(o->event_record(g, e2, s2), 0);
    o->event_free(g, e2); /* record still queued */
    fy_gpu_close(g);      /* ASan/LSan: nothing may leak */
}

/* `test_gpu CASE` runs one of these, `--list` names them (check.h). */
#define CASES(CASE)                                 \
    CASE(parse_size, test_parse_size())             \
    CASE(open, test_open())                         \
    CASE(capacity, test_capacity())                 \
    CASE(register, test_register())                 \
    CASE(truncated_source, test_truncated_source()) \
    CASE(async, test_async())                       \
    CASE(bounds, test_bounds())                     \
    CASE(threads, test_threads())                   \
    CASE(faults, test_faults())                     \
    CASE(close_leftovers, test_close_leftovers())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    fy_err_init(&err);
    check_run();
    fy_err_destroy(&err);
    return check_summary();
}
