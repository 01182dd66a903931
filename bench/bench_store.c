/* SPDX-License-Identifier: Apache-2.0 */
/* bench_store.c - the residency store's moves on a real device, in one process:
 *
 *   bench_store FILE SPILL_DIR [DEVICE]
 *
 * 1. load the model into a store (hot), 2. evict it clean (0 bytes written),
 * 3. mark every tensor dirty and evict to pinned RAM and back (twice: the
 * first eviction also pins the pool), 3b. the same with the pool pinned
 * ahead (opts.pinned_reserve, beside the first load), 4. the disk's sequential write rate
 * (buffered writes + fsync of a file as large as the model in SPILL_DIR),
 * 5. spill the dirty model (host budget 1 byte) and 6. bring it back from the
 * spill file (hot), with each step's peak RSS from the store's job statistics.
 * Prints one JSON object per step. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ferry_ctx *ctx;

_Noreturn static void die(const char *what)
{
    fprintf(stderr, "bench_store: %s: %s\n", what, ferry_ctx_errmsg(ctx));
    exit(1);
}

static void report(ferry_store *s, const char *step, uint64_t bytes, int (*fn)(ferry_model *), ferry_model *m)
{
    ferry_store_job_begin(s, step);
    double t0 = now();
    if (fn(m) < 0) die(step);
    double sec = now() - t0;
    ferry_job_stats js = {.size = sizeof js};
    ferry_store_job_end(s, &js);
    printf("{\"step\": \"%s\", \"bytes\": %" PRIu64
           ", \"seconds\": %.4f, \"gbps\": %.2f, \"ms_per_gb\": %.3f, "
           "\"bytes_written\": %" PRIu64
           ", \"rss_start_mib\": %.1f, \"rss_peak_mib\": %.1f, \"rss_end_mib\": %.1f, "
           "\"extra_rss_peak_mib\": %.1f, \"device\": %" PRIu64 ", \"pinned\": %" PRIu64
           ", \"host\": %" PRIu64 ", \"spill\": %" PRIu64 "}\n",
           step, bytes, sec, (double)bytes / sec / 1e9, sec * 1e3 / ((double)bytes / 1e9), js.bytes_written,
           (double)js.rss.start / 1048576, (double)js.rss.peak / 1048576, (double)js.rss.end / 1048576,
           ((double)js.rss.peak - (double)js.rss.start) / 1048576, js.device_bytes, js.pinned_bytes,
           js.host_bytes, js.spill_bytes);
    fflush(stdout);
}

/* Diagnosis: find the store's unnamed spill file among this process's
 * descriptors (its link is "DIR/#NNN (deleted)"), and report how much of it is
 * in the page cache (mincore) and how fast one thread reads 1 GiB of it. */
static void spill_probe(const char *dir, const char *label)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int fd = -1;
    char link[4096], path[300];
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (strncmp(link, dir, strlen(dir)) == 0 && strstr(link, "(deleted)")) fd = atoi(e->d_name);
    }
    if (d) closedir(d);
    if (fd < 0) return;
    off_t size = lseek(fd, 0, SEEK_END);
    double resident = -1;
    void *map = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (map != MAP_FAILED) {
        size_t pages = ((size_t)size + 4095) / 4096, in = 0;
        unsigned char *vec = malloc(pages);
        if (vec && mincore(map, (size_t)size, vec) == 0)
            for (size_t i = 0; i < pages; i++) in += vec[i] & 1;
        resident = (double)in / (double)pages;
        free(vec);
        munmap(map, (size_t)size);
    }
    size_t chunk = 4u << 20, total = 0;
    char *buf = malloc(chunk);
    double t0 = now();
    while (buf && total < (1u << 30) && (off_t)total < size) {
        ssize_t r = pread(fd, buf, chunk, (off_t)total);
        if (r <= 0) break;
        total += (size_t)r;
    }
    double sec = now() - t0;
    free(buf);
    printf("{\"step\": \"spill file probe: %s\", \"size\": %lld, \"resident\": %.3f, "
           "\"one_thread_read_gbps\": %.2f}\n",
           label, (long long)size, resident, (double)total / sec / 1e9);
    fflush(stdout);
}

static int to_dev(ferry_model *m)
{
    return ferry_model_to_device(m, NULL, 0);
}
static int evict(ferry_model *m)
{
    return ferry_model_evict(m, NULL, 0);
}
static int dirty_all(ferry_model *m)
{
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++)
        if (ferry_model_mark_dirty(m, i) < 0) return -1;
    return 0;
}

/* The device's pinned copy rates both ways, for the ratios. */
static void limits(ferry_device *d, const char *when)
{
    double h = 0, b = 0;
    if (ferry_device_copy_rate(d, 2ull << 30, &h, &b) < 0) die("copy rate");
    printf("{\"step\": \"copy limits (%s)\", \"htod_gbps\": %.2f, \"dtoh_gbps\": %.2f}\n", when, h, b);
    fflush(stdout);
}

/* The RAM store: host and pinned budgets hold the whole model. reserve: the
 * pool (pinned_budget) is pinned ahead from ferry_store_new on, and the steps
 * say so ("[reserve]"). */
static void ram_store(ferry_device *d, ferry_file *f, uint64_t B, const char *dir, bool reserve)
{
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = B + (4ull << 30),
                          .pinned_budget = B + (1ull << 30),
                          .spill_dir = dir,
                          .spill_below = 1,
                          .spill_above = 2};
    if (reserve) o.pinned_reserve = o.pinned_budget;
    const char *tag = reserve ? " [reserve]" : "";
    char step[160];
    ferry_store *s;
    ferry_model *m;
    double t0 = now();
    if (ferry_store_new(d, &o, &s) < 0 || ferry_store_add(s, "model", &f, 1, 0, &m) < 0) die("store");
    snprintf(step, sizeof step, "load (hot, from the checkpoint)%s", tag);
    report(s, step, B, to_dev, m);
    if (reserve) { /* how long the pool took to pin, from ferry_store_new, the load running beside it */
        double t1 = now();
        if (ferry_store_wait_pinned(s) < 0) die("wait_pinned");
        double t2 = now();
        ferry_store_stats st = {.size = sizeof st};
        ferry_store_get_stats(s, &st);
        printf("{\"step\": \"pool pinned ahead [reserve]\", \"bytes\": %" PRIu64
               ", \"seconds\": %.4f, \"gbps\": %.2f, "
               "\"waited_after_the_load_s\": %.4f, \"pinned_pool_bytes\": %" PRIu64 "}\n",
               st.pinned_reserved, t2 - t0, (double)st.pinned_reserved / (t2 - t0) / 1e9, t2 - t1,
               st.pinned_pool_bytes);
        fflush(stdout);
    }
    if (!reserve) {
        report(s, "evict clean (dropped)", B, evict, m);
        report(s, "load again", B, to_dev, m);
        ferry_store_job_begin(s, "make_room(all)");
        double t1 = now();
        int64_t got = ferry_store_make_room(s, UINT64_MAX, NULL);
        double sec = now() - t1;
        ferry_job_stats js = {.size = sizeof js};
        ferry_store_job_end(s, &js);
        printf(
            "{\"step\": \"make_room(all): evict clean and give the device memory back\", \"bytes\": %" PRId64
            ", \"seconds\": %.4f, \"ms_per_gb\": %.3f, \"bytes_written\": %" PRIu64 "}\n",
            got, sec, sec * 1e3 / ((double)B / 1e9), js.bytes_written);
        report(s, "load again", B, to_dev, m);
    }
    for (int r = 0; r < 2; r++) {
        dirty_all(m);
        snprintf(step, sizeof step, "%s%s",
                 reserve ? (r ? "evict dirty to pinned RAM (second)"
                              : "evict dirty to pinned RAM (first: pinned ahead)")
                         : (r ? "evict dirty to pinned RAM (pool already pinned)"
                              : "evict dirty to pinned RAM (pins the pool)"),
                 tag);
        report(s, step, B, evict, m);
        snprintf(step, sizeof step, "back from pinned RAM%s", tag);
        report(s, step, B, to_dev, m);
    }
    ferry_store_free(s);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_store FILE SPILL_DIR [DEVICE]\n");
        return 2;
    }
    const char *spec = argc > 3 ? argv[3] : "cuda:0";
    ferry_device *d;
    ferry_file *f;
    if (ferry_ctx_new(NULL, &ctx) < 0) return 1;
    if (ferry_file_open(ctx, argv[1], 0, &f) < 0) die("open");
    if (ferry_device_open(ctx, spec, &d) < 0) die("device");
    const uint64_t B = ferry_file_total_bytes(f);

    limits(d, "start");
    ram_store(d, f, B, argv[2], false);
    /* the same with the pool pinned ahead (opts.pinned_reserve): its pinning
     * runs on the store's thread beside the first load */
    ram_store(d, f, B, argv[2], true);
    limits(d, "after the RAM stores");
    ferry_store *s;
    ferry_model *m;

    /* the disk's sequential write rate: buffered writes of B bytes + fsync */
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/ferry-bench-write.tmp", argv[2]);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        size_t chunk = 16u << 20;
        char *buf = malloc(chunk);
        memset(buf, 0x5A, chunk);
        double t0 = now();
        uint64_t done = 0;
        while (fd >= 0 && done < B) {
            ssize_t w = write(fd, buf, chunk);
            if (w <= 0) break;
            done += (uint64_t)w;
        }
        double tw = now() - t0;
        if (fd >= 0) fsync(fd);
        double tf = now() - t0;
        if (fd >= 0) close(fd);
        unlink(path);
        free(buf);
        printf("{\"step\": \"disk sequential write\", \"bytes\": %" PRIu64 ", \"gbps_with_fsync\": %.3f, "
               "\"gbps_without_fsync\": %.3f}\n",
               done, (double)done / tf / 1e9, (double)done / tw / 1e9);
        fflush(stdout);
    }

    /* spill store: 1 byte of host budget, so every dirty byte goes to disk */
    ferry_store_opts so = {.size = sizeof so,
                           .host_budget = 1,
                           .pinned_budget = 1,
                           .spill_dir = argv[2],
                           .spill_below = 1,
                           .spill_above = 2};
    if (ferry_store_new(d, &so, &s) < 0 || ferry_store_add(s, "model", &f, 1, 0, &m) < 0) die("spill store");
    report(s, "load", B, to_dev, m);
    dirty_all(m);
    report(s, "spill dirty model", B, evict, m);
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    printf("{\"step\": \"spill file\", \"bytes_written\": %" PRIu64 ", \"spill_file_bytes\": %" PRIu64 "}\n",
           st.bytes_written, st.spill_file_bytes);
    spill_probe(argv[2], "after the spill");
    report(s, "back from the spill file (hot)", B, to_dev, m);
    dirty_all(m);
    report(s, "spill again (ranges reused)", B, evict, m);
    double ts = now();
    sync(); /* the page cache's writeback of the spill file finishes */
    printf("{\"step\": \"sync (writeback of the spill file)\", \"seconds\": %.3f}\n", now() - ts);
    spill_probe(argv[2], "after sync");
    report(s, "back from the spill file (hot, written back)", B, to_dev, m);
    ferry_store_free(s);
    ferry_device_close(d);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    return 0;
}
