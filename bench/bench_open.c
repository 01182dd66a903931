/* SPDX-License-Identifier: Apache-2.0 */
/* bench_open.c - what opening a checkpoint costs: wall time of ferry_file_open
 * and the growth of VmRSS it causes, cold (file dropped from the page cache
 * with POSIX_FADV_DONTNEED) and hot, REPS times each.
 *
 *   bench_open PATH [REPS]     -> one JSON line per run, then a summary line */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') v = strtol(line + kl + 1, NULL, 10);
    if (f) fclose(f);
    return v;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_open PATH [REPS]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    ferry_ctx *ctx;
    if (ferry_ctx_new(NULL, &ctx) < 0) return 1;
    double worst_ms[2] = {0, 0};
    long worst_kib[2] = {0, 0};
    for (int r = 0; r < reps; r++) {
        for (int cold = 1; cold >= 0; cold--) {
            if (cold) drop_cache(argv[1]);
            long rss0 = status_kib("VmRSS");
            double t0 = now();
            ferry_file *f;
            int rc = ferry_file_open(ctx, argv[1], 0, &f);
            double ms = (now() - t0) * 1e3;
            long rss1 = status_kib("VmRSS");
            if (rc < 0) {
                fprintf(stderr, "bench_open: %s\n", ferry_ctx_errmsg(ctx));
                return 1;
            }
            printf("{\"run\": %d, \"cache\": \"%s\", \"open_ms\": %.3f, \"rss_growth_kib\": %ld, "
                   "\"tensors\": %lld, "
                   "\"bytes\": %llu}\n",
                   r, cold ? "cold" : "hot", ms, rss1 - rss0, (long long)ferry_file_tensor_count(f),
                   (unsigned long long)ferry_file_total_bytes(f));
            if (ms > worst_ms[cold]) worst_ms[cold] = ms;
            if (rss1 - rss0 > worst_kib[cold]) worst_kib[cold] = rss1 - rss0;
            ferry_file_close(f);
        }
    }
    printf("worst of %d: cold open %.2f ms, +%.2f MiB RSS; hot open %.2f ms, +%.2f MiB RSS; VmHWM %.1f MiB\n",
           reps, worst_ms[1], worst_kib[1] / 1024.0, worst_ms[0], worst_kib[0] / 1024.0,
           status_kib("VmHWM") / 1024.0);
    ferry_ctx_free(ctx);
    return 0;
}
