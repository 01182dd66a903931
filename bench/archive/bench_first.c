/* bench_first.c - where does a fresh process's first load lose time?
 *
 *   bench_first FILE MODE [DEVICE]
 *
 * Each MODE runs in its own (fresh) process; bench/archive/gpu_first.sh alternates
 * them. Every mode opens the device, allocates one device block laid out like
 * the file, and loads every tensor into it with ferry_load_into (ring path),
 * timing the phases; the modes differ in what happens before the timed load:
 *   fresh      nothing
 *   memset     the block is written once (cuMemsetD8) before the load
 *   warmcopy   2 GB of pinned copies first (ferry_device_copy_rate)
 *   ringwarm   one small load first, so the ring is pinned and the streams exist
 *   twice      two loads into the same block (prints both)
 *   twice_new  load, free, allocate a new block, load again
 *   reg        register the file, then copy from the mapping: per tensor on 4
 *              streams, and coalesced (consecutive tensors in one copy) in
 *              64 MiB / 256 MiB / whole pieces on 1, 2 and 4 streams
 * Prints one JSON object per measurement on stdout. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"
#include "gpu/gpu.h"
#include "xfer/xfer_test.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct tl {
    double t0;
    double at[11]; /* time when done first reached k * 10 % */
} tl;

static void on_progress(void *opaque, uint64_t done, uint64_t total)
{
    tl *t = opaque;
    int k = total ? (int)(done * 10 / total) : 10;
    for (int i = 0; i <= k && i <= 10; i++)
        if (t->at[i] == 0) t->at[i] = now() - t->t0;
}

static int load(ferry_device *d, ferry_file *f, fy_dptr base, uint64_t lo, const char *label, int64_t ntensors)
{
    int64_t n = ntensors < 0 ? ferry_file_tensor_count(f) : ntensors;
    int64_t *idx = calloc((size_t)n + 1, sizeof *idx);
    uint64_t *dp = calloc((size_t)n + 1, sizeof *dp);
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        idx[i] = i;
        dp[i] = base + (ti.offset - lo);
    }
    tl t = {0};
    ferry_load_opts o = {.size = sizeof o, .route = FERRY_ROUTE_RING, .progress = on_progress, .opaque = &t};
    ferry_load_stats st = {.size = sizeof st};
    t.t0 = now();
    int rc = ferry_load_into(d, f, idx, dp, n, &o, &st);
    double s = now() - t.t0;
    free(idx);
    free(dp);
    if (rc < 0) {
        fprintf(stderr, "load: %s\n", ferry_strerror(rc));
        return rc;
    }
    printf("{\"what\": \"%s\", \"bytes\": %" PRIu64 ", \"seconds\": %.4f, \"gbps\": %.2f, \"deciles\": [", label,
           st.bytes, s, (double)st.bytes / s / 1e9);
    for (int i = 0; i <= 10; i++) printf("%s%.4f", i ? ", " : "", t.at[i]);
    printf("]}\n");
    return 0;
}

typedef int (*memset_fn)(uint64_t, unsigned char, size_t);

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_first FILE MODE [DEVICE]\n");
        return 2;
    }
    const char *mode = argv[2], *spec = argc > 3 ? argv[3] : "cuda:0";
    double t0 = now();
    ferry_ctx *ctx;
    ferry_file *f;
    ferry_device *d;
    if (ferry_ctx_new(NULL, &ctx) < 0) return 1;
    if (ferry_file_open(ctx, argv[1], 0, &f) < 0 || ferry_device_open(ctx, spec, &d) < 0) {
        fprintf(stderr, "%s\n", ferry_ctx_errmsg(ctx));
        return 1;
    }
    double t_open = now() - t0;
    fy_gpu *g = fy_device_gpu(d);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int64_t i = 0; i < ferry_file_tensor_count(f); i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (ti.offset < lo) lo = ti.offset;
        if (ti.offset + ti.nbytes > hi) hi = ti.offset + ti.nbytes;
    }
    fy_dptr base = 0;
    g->ops->bind_thread(g);
    double ta = now();
    if (g->ops->mem_alloc(g, hi - lo, &base) < 0) {
        fprintf(stderr, "alloc: %s\n", ferry_ctx_errmsg(ctx));
        return 1;
    }
    double t_alloc = now() - ta;
    printf("{\"what\": \"setup\", \"mode\": \"%s\", \"open_s\": %.4f, \"alloc_s\": %.4f}\n", mode, t_open, t_alloc);
    int rc = 0;
    if (strcmp(mode, "memset") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        memset_fn ms = h ? (memset_fn)dlsym(h, "cuMemsetD8_v2") : NULL;
        int (*sync)(void) = h ? (int (*)(void))dlsym(h, "cuCtxSynchronize") : NULL;
        double tm = now();
        if (ms && sync) {
            ms(base, 0, hi - lo);
            sync();
        }
        printf("{\"what\": \"memset\", \"seconds\": %.4f, \"ok\": %d}\n", now() - tm, ms != NULL);
    } else if (strcmp(mode, "warmcopy") == 0) {
        double h2d = 0, tw = now();
        ferry_device_copy_rate(d, 2000000000ull, &h2d, NULL);
        printf("{\"what\": \"warmcopy\", \"seconds\": %.4f, \"htod_gbps\": %.2f}\n", now() - tw, h2d);
    } else if (strcmp(mode, "ringwarm") == 0) {
        rc = load(d, f, base, lo, "ringwarm-small", 8);
    }
    if (rc == 0) rc = load(d, f, base, lo, "load", -1);
    if (rc == 0 && strcmp(mode, "twice") == 0) rc = load(d, f, base, lo, "load2-same-block", -1);
    if (rc == 0 && strcmp(mode, "twice_new") == 0) {
        g->ops->mem_free(g, base);
        ta = now();
        g->ops->mem_alloc(g, hi - lo, &base);
        printf("{\"what\": \"realloc\", \"seconds\": %.4f}\n", now() - ta);
        rc = load(d, f, base, lo, "load2-new-block", -1);
    }
    if (rc == 0 && strcmp(mode, "reg") == 0) {
        double tr = now();
        rc = ferry_device_register_file(d, f, 0);
        printf("{\"what\": \"register\", \"seconds\": %.4f, \"rc\": %d}\n", now() - tr, rc);
        const uint8_t *map = NULL;
        ferry_tensor_info t0i = {.size = sizeof t0i};
        ferry_file_tensor_info(f, 0, &t0i);
        ferry_file_tensor_data(f, 0, (const void **)&map);
        map -= t0i.offset - lo; /* map now points at file offset lo */
        fy_stream *st[4];
        for (int k = 0; k < 4; k++) g->ops->stream_new(g, &st[k]);
        /* per tensor, round robin over 4 streams (what run_register does) */
        for (int rep = 0; rep < 2 && rc == 0; rep++) {
            double tc = now();
            for (int64_t i = 0; i < ferry_file_tensor_count(f); i++) {
                ferry_tensor_info ti = {.size = sizeof ti};
                ferry_file_tensor_info(f, i, &ti);
                if (ti.nbytes) g->ops->copy_htod(g, base + (ti.offset - lo), map + (ti.offset - lo), ti.nbytes, st[i % 4]);
            }
            for (int k = 0; k < 4; k++) g->ops->stream_sync(g, st[k]);
            double s = now() - tc;
            printf("{\"what\": \"reg-per-tensor-4streams\", \"gbps\": %.2f}\n", (double)(hi - lo) / s / 1e9);
        }
        const uint64_t chunks[] = {64ull << 20, 256ull << 20, 1ull << 40};
        const int nst[] = {1, 2, 4};
        for (int c = 0; c < 3; c++)
            for (int k = 0; k < 3; k++) {
                double tc = now();
                int s = 0;
                for (uint64_t off = 0; off < hi - lo; off += chunks[c]) {
                    uint64_t len = hi - lo - off < chunks[c] ? hi - lo - off : chunks[c];
                    g->ops->copy_htod(g, base + off, map + off, len, st[s]);
                    s = (s + 1) % nst[k];
                }
                for (int q = 0; q < 4; q++) g->ops->stream_sync(g, st[q]);
                double sec = now() - tc;
                printf("{\"what\": \"reg-coalesced\", \"chunk_mib\": %" PRIu64 ", \"streams\": %d, \"gbps\": %.2f}\n",
                       chunks[c] >> 20, nst[k], (double)(hi - lo) / sec / 1e9);
            }
        for (int k = 0; k < 4; k++) g->ops->stream_free(g, st[k]);
        ferry_device_unregister_file(d, f);
    }
    g->ops->mem_free(g, base);
    ferry_device_close(d);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    return rc < 0;
}
