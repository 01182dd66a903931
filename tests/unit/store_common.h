/* SPDX-License-Identifier: Apache-2.0 */
/* store_common.h - what the test_store_* binaries share: the models their
 * cases add (written by store_main into a temp dir, with the spill
 * directory), reading them back against their checkpoints, changing a
 * tensor, a store on a device with given budgets, its figures, and each
 * binary's main. The includer defines _GNU_SOURCE. */
#ifndef FERRY_TEST_STORE_COMMON_H
#define FERRY_TEST_STORE_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "ferry.h"
#include "io/io.h"
#include "xfer/xfer_test.h"


static char dir[256], spill_dir[300];

static inline uint8_t byte_at(uint32_t seed, int t, uint64_t j)
{
    return (uint8_t)((seed * 131u + (uint32_t)t * 7919u + j * 31u) >> 3);
}

/* Start a safetensors file dir/name: its header hdr (h bytes; hdr has room for
 * 7 more) padded to 8 bytes, then the open file for its data; path gets its
 * path. */
static inline FILE *start_checkpoint(const char *name, char *hdr, size_t h, char path[512])
{
    while (h % 8) hdr[h++] = ' ';
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    return f;
}

/* A safetensors file of nblk modules "blk.K" with a weight (wbytes) and a bias
 * (16 bytes), U8. */
static inline void write_model(const char *name, int nblk, uint64_t wbytes, uint32_t seed)
{
    char hdr[65536], path[512];
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int k = 0; k < nblk; k++) {
        h += (size_t)snprintf(
            hdr + h, sizeof hdr - h,
            "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64
            "]},\"blk.%d.b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
            k ? "," : "", k, wbytes, off, off + wbytes, k, off + wbytes, off + wbytes + 16);
        off += wbytes + 16;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = start_checkpoint(name, hdr, h, path);
    for (int k = 0; k < 2 * nblk; k++) {
        uint64_t n = k % 2 ? 16 : wbytes;
        for (uint64_t j = 0; j < n; j++) fputc(byte_at(seed, k, j), f);
    }
    fclose(f);
}

static inline ferry_file *open_model(ferry_ctx *ctx, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    return f;
}

/* every tensor of m reads back as expected: the file's bytes, or, for tensor
 * `mod` (>= 0), the file's XOR x */
static inline int verify(ferry_model *m, ferry_file *f, int64_t mod, uint8_t x)
{
    int bad = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        uint8_t *a = malloc(st.nbytes + 1), *b = malloc(st.nbytes + 1);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(f, i, 0, b, st.nbytes);
        if (i == mod)
            for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0) {
            fprintf(stderr, "verify: %s (tier %s) differs (%d %d)\n", st.name, ferry_tier_name(st.tier), r1,
                    r2);
            bad++;
        }
        free(a);
        free(b);
    }
    return bad;
}

static inline uint64_t tier_bytes(ferry_store *s, ferry_tier t)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.tier_bytes[t];
}

static inline int modify(ferry_model *m, int64_t t, uint8_t x)
{
    ferry_tensor_state st = {.size = sizeof st};
    ferry_model_tensor_state(m, t, &st);
    uint8_t *b = malloc(st.nbytes);
    int rc = ferry_model_read(m, t, b);
    for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
    if (rc == 0) rc = ferry_model_write(m, t, b);
    free(b);
    return rc;
}

static inline ferry_store *mk_store(ferry_device *d, uint64_t dev_budget, uint64_t host_budget,
                                    uint64_t pinned_budget)
{
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = dev_budget,
                          .host_budget = host_budget,
                          .pinned_budget = pinned_budget,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2}; /* the host's real free memory does not decide here */
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
    o.load = &lo;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    return s;
}

static inline uint64_t bytes_read(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.bytes_read;
}

/* Each test_store_* binary's main: writes the models and makes the ctx its
 * cases share, runs them, and removes the files. */
static inline int store_main(int argc, char **argv, const check_case *cases, int n, ferry_ctx **ctx)
{
    int rc = check_args_(argc, argv, cases, n);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "store") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    write_model("a.safetensors", 6, 100000, 1);
    write_model("b.safetensors", 5, 130001, 2);
    write_model("big.safetensors", 16, 4 << 20, 3);
    CHECK_EQ(ferry_ctx_new(NULL, ctx), 0);
    if (*ctx) check_run_(cases, n);
    ferry_ctx_free(*ctx);
    check_rmtree(dir);
    return check_summary();
}

#endif
