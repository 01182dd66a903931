/* SPDX-License-Identifier: Apache-2.0 */
/* block_loads.c - what a streamed pass costs through the ring when it reads
 * its blocks one load at a time (as the store's mover does, a ferry_load_into
 * per block), against one load of the same bytes:
 *
 *   block_loads FILE [DEVICE] [PREFIX] [ROUNDS]
 *
 * FILE's tensors named PREFIX<N>.* (default "blocks.") form block N. The file
 * is loaded once (ferry_load: the device memory every later load fills), then
 * per round: every block's tensors in one ferry_load_into; the same, a load
 * per block; and a load per block with 16 readers and 8 MiB buffers. One JSON
 * line per measurement (GB/s of the blocks' bytes; the file must be hot). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int block_of(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return -1;
    char *end = NULL;
    long k = strtol(name + n, &end, 10);
    return end != name + n && *end == '.' && k >= 0 && k < 100000 ? (int)k : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(stderr, "usage: block_loads FILE [DEVICE (cuda)] [PREFIX (blocks.)] [ROUNDS (3)]\n");
        return 2;
    }
    const char *path = argv[1], *spec = argc > 2 ? argv[2] : "cuda", *prefix = argc > 3 ? argv[3] : "blocks.";
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    ferry_ctx *ctx = NULL;
    ferry_device *d = NULL;
    ferry_file *f = NULL;
    ferry_loaded *all = NULL;
    if (ferry_ctx_new(NULL, &ctx) < 0 || ferry_device_open(ctx, spec, &d) < 0 ||
        ferry_file_open(ctx, path, 0, &f) < 0) {
        fprintf(stderr, "block_loads: %s\n", ctx ? ferry_ctx_errmsg(ctx) : "no context");
        return 1;
    }
    ferry_load_opts lo = {.size = sizeof lo};
    if (ferry_load(d, f, &lo, &all, NULL) < 0) {
        fprintf(stderr, "block_loads: %s: %s\n", path, ferry_ctx_errmsg(ctx));
        return 1;
    }
    int64_t n = ferry_file_tensor_count(f);
    int64_t *idx = calloc((size_t)n, sizeof *idx), *first = calloc((size_t)n + 2, sizeof *first);
    uint64_t *dp = calloc((size_t)n, sizeof *dp), bytes = 0;
    int nb = 0;
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        int k = block_of(ti.name, prefix);
        if (k + 1 > nb) nb = k + 1;
    }
    /* the tensors block by block */
    int64_t m = 0;
    for (int k = 0; k < nb; k++) {
        first[k] = m;
        for (int64_t i = 0; i < n; i++) {
            ferry_tensor_info ti = {.size = sizeof ti};
            ferry_file_tensor_info(f, i, &ti);
            if (block_of(ti.name, prefix) != k) continue;
            idx[m] = i;
            dp[m++] = ferry_loaded_ptr(all, i);
            bytes += ti.nbytes;
        }
    }
    first[nb] = m;
    printf("{\"file\": \"%s\", \"device\": \"%s\", \"blocks\": %d, \"block_bytes\": %" PRIu64 "}\n", path,
           ferry_device_desc(d), nb, bytes);
    ferry_load_opts wide = {.size = sizeof wide, .threads = 16, .ring_buffer_bytes = 8 << 20};
    for (int r = 0; r < rounds; r++) {
        for (int how = 0; how < 3; how++) {
            const ferry_load_opts *o = how == 2 ? &wide : &lo;
            double t0 = now();
            int rc = 0;
            if (how == 0) rc = ferry_load_into(d, f, idx, dp, m, o, NULL);
            else
                for (int k = 0; k < nb && rc == 0; k++)
                    rc = ferry_load_into(d, f, idx + first[k], dp + first[k], first[k + 1] - first[k], o,
                                         NULL);
            double s = now() - t0;
            if (rc < 0) {
                fprintf(stderr, "block_loads: %s\n", ferry_ctx_errmsg(ctx));
                return 1;
            }
            static const char *const what[] = {"one load", "a load per block",
                                               "a load per block, 16 readers, 8 MiB"};
            printf("{\"round\": %d, \"how\": \"%s\", \"seconds\": %.4f, \"gbps\": %.2f, \"ms_per_block\": "
                   "%.3f}\n",
                   r, what[how], s, (double)bytes / s / 1e9, s * 1e3 / (how ? nb : 1));
            fflush(stdout);
        }
    }
    ferry_loaded_free(all);
    ferry_file_close(f);
    ferry_device_close(d);
    ferry_ctx_free(ctx);
    free(idx);
    free(first);
    free(dp);
    return 0;
}
