/* SPDX-License-Identifier: Apache-2.0 */
/* bench_swap.c - model swap latency through the store, in one process:
 *
 *   bench_swap FILE_A FILE_B [DEVICE] [SWAPS]
 *
 * Two models used alternately under a device budget that holds one of them
 * (the larger, plus 1/16) and a host budget that holds both. Reported, each
 * as one JSON line, beside the pinned host-to-device copy limit measured at
 * the start and at the end of the run:
 *   1. cold: model A from its checkpoint with the page cache dropped first;
 *   2. hot: A again from the page cache (after a clean eviction and a read
 *      of both files, since the cold load read around the page cache);
 *   3. swaps without the pinned cache: "use the other model" until it is on
 *      the device, the leaving one dropped, the coming one read through the
 *      ring from the page cache (SWAPS times, alternating);
 *   4. the first loads with ferry_model_set_pinned_cache on (each model read
 *      into pinned RAM and copied from there);
 *   5. swaps with the pinned cache: one DMA from pinned RAM each.
 * A swap's time is the whole ferry_model_to_device call: choosing and
 * evicting the leaving model, allocating, copying, landing. At the end every
 * tensor of both models is read back and compared with its file. FILE_B may
 * be FILE_A (the same bytes as two models). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

static ferry_ctx *ctx;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "bench_swap: %s: %s\n", what, ferry_ctx_errmsg(ctx));
    exit(1);
}

static double peak_rss_gib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = strtod(line + 6, NULL);
    if (f) fclose(f);
    return kb / (1024.0 * 1024.0);
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Read the file once (as cat or a download fills the page cache). */
static void warm_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    size_t n = 64u << 20;
    char *buf = malloc(n);
    while (buf && read(fd, buf, n) > 0) {}
    free(buf);
    close(fd);
}

static double limit(ferry_device *d)
{
    double h = 0;
    if (ferry_device_copy_rate(d, 1ull << 30, &h, NULL) < 0) die("copy rate");
    printf("{\"step\": \"copy limit\", \"htod_gbps\": %.2f}\n", h);
    fflush(stdout);
    return h;
}

/* Time one ferry_model_to_device(m) and print it. */
static double use(ferry_store *s, ferry_model *m, uint64_t bytes, const char *step, int k)
{
    ferry_store_stats a = {.size = sizeof a}, b = {.size = sizeof b};
    ferry_store_get_stats(s, &a);
    double t0 = now();
    if (ferry_model_to_device(m, NULL, 0) < 0) die(step);
    double sec = now() - t0;
    ferry_store_get_stats(s, &b);
    printf("{\"step\": \"%s\", \"k\": %d, \"model\": \"%s\", \"bytes\": %" PRIu64 ", \"seconds\": %.4f, "
           "\"gbps\": %.2f, \"read_bytes\": %" PRIu64 ", \"written_bytes\": %" PRIu64
           ", \"pinned_cache_bytes\": %" PRIu64 ", \"peak_rss_gib\": %.2f}\n",
           step, k, ferry_model_name(m), bytes, sec, (double)bytes / sec / 1e9, b.bytes_read - a.bytes_read,
           b.bytes_written - a.bytes_written, b.pinned_cache_bytes, peak_rss_gib());
    fflush(stdout);
    return sec;
}

/* Every tensor of m against its file; returns the mismatches. */
static int64_t verify(ferry_model *m, ferry_file *f)
{
    int64_t bad = 0, n = ferry_model_tensor_count(m);
    uint8_t *a = NULL, *b = NULL;
    size_t cap = 0;
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_state st = {.size = sizeof st};
        if (ferry_model_tensor_state(m, i, &st) < 0) return n;
        if (st.nbytes + 1 > cap) {
            cap = st.nbytes + 1;
            free(a), free(b);
            a = malloc(cap), b = malloc(cap);
            if (!a || !b) die("verify: out of memory");
        }
        if (ferry_model_read(m, i, a) < 0 || ferry_file_tensor_read(f, i, 0, b, st.nbytes) < 0 ||
            memcmp(a, b, st.nbytes) != 0)
            bad++;
    }
    free(a), free(b);
    return bad;
}

static ferry_store *new_store(ferry_device *d, uint64_t A, uint64_t B)
{
    uint64_t big = A > B ? A : B;
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = big + big / 16,
                          .host_budget = A + B + (4ull << 30),
                          .pinned_budget = A + B + (1ull << 30),
                          .spill_below = 1,
                          .spill_above = 2};
    ferry_store *s = NULL;
    if (ferry_store_new(d, &o, &s) < 0) die("store");
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_swap FILE_A FILE_B [DEVICE] [SWAPS]\n");
        return 2;
    }
    const char *spec = argc > 3 ? argv[3] : "cuda:0";
    int swaps = argc > 4 ? atoi(argv[4]) : 6;
    if (swaps < 2) swaps = 2;
    ferry_device *d;
    ferry_file *fa, *fb;
    if (ferry_ctx_new(NULL, &ctx) < 0) return 1;
    if (ferry_file_open(ctx, argv[1], 0, &fa) < 0) die(argv[1]);
    if (ferry_file_open(ctx, argv[2], 0, &fb) < 0) die(argv[2]);
    if (ferry_device_open(ctx, spec, &d) < 0) die("device");
    const uint64_t A = ferry_file_total_bytes(fa), B = ferry_file_total_bytes(fb);
    double lim0 = limit(d);

    /* 1-3: no pinned cache */
    ferry_store *s = new_store(d, A, B);
    ferry_model *ma, *mb, *m[2];
    if (ferry_store_add(s, "a", &fa, 1, 0, &ma) < 0 || ferry_store_add(s, "b", &fb, 1, 0, &mb) < 0)
        die("add");
    m[0] = ma, m[1] = mb;
    drop_cache(argv[1]);
    use(s, ma, A, "cold load", 0);
    if (ferry_model_evict(ma, NULL, 0) < 0) die("evict");
    warm_cache(argv[1]); /* the cold load read around the page cache (O_DIRECT) */
    warm_cache(argv[2]);
    use(s, ma, A, "hot load (page cache)", 0);
    use(s, mb, B, "first load of the other model (page cache)", 0);
    for (int k = 0; k < swaps; k++) use(s, m[k % 2], k % 2 ? B : A, "swap from the page cache", k);
    ferry_store_free(s);

    /* 4-5: the pinned cache on */
    s = new_store(d, A, B);
    if (ferry_store_add(s, "a", &fa, 1, 0, &ma) < 0 || ferry_store_add(s, "b", &fb, 1, 0, &mb) < 0)
        die("add");
    if (ferry_model_set_pinned_cache(ma, 1) < 0 || ferry_model_set_pinned_cache(mb, 1) < 0)
        die("pinned cache");
    m[0] = ma, m[1] = mb;
    use(s, ma, A, "first load, pinned cache on (page cache -> pinned -> device)", 0);
    use(s, mb, B, "first load, pinned cache on (page cache -> pinned -> device)", 1);
    for (int k = 0; k < swaps; k++) use(s, m[k % 2], k % 2 ? B : A, "swap from pinned RAM", k);
    int64_t bad = verify(ma, fa);
    if (ferry_model_to_device(mb, NULL, 0) < 0) die("to device");
    bad += verify(mb, fb);
    ferry_store_free(s);
    double lim1 = limit(d);
    printf("{\"step\": \"end\", \"limit_start_gbps\": %.2f, \"limit_end_gbps\": %.2f, "
           "\"mismatched_tensors\": %" PRId64 ", \"peak_rss_gib\": %.2f}\n",
           lim0, lim1, bad, peak_rss_gib());
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
    ferry_ctx_free(ctx);
    return bad ? 1 : 0;
}
