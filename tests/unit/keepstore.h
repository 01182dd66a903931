/* SPDX-License-Identifier: Apache-2.0 */
/* keepstore.h - what test_keepstore and test_keepfail share: a checkpoint of
 * NBLK blocks of U8 tensors written from seeds, stores on a sim device with
 * the keeper at sock or without, a fresh store's load with its figures, the
 * keeper's holdings asked on a connection of their own, and a case's temp
 * dir with a keeper in a forked child (keeper_child.h). */
#ifndef FERRY_TEST_KEEPSTORE_H
#define FERRY_TEST_KEEPSTORE_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry_experimental.h"
#include "keeper_child.h"

static char dir[512], sock[600], logpath[600], path[600];
static ferry_ctx *ctx;

/* ---- the checkpoint: NBLK blocks "blk.K.w" (WBYTES) and "blk.K.b" (16), U8 ---- */

enum { NBLK = 6, NT = 2 * NBLK, WBYTES = 300 << 10 };

static inline uint8_t val(uint32_t seed, int t, uint64_t j)
{
    return (uint8_t)(seed * 151u + (uint32_t)t * 31u + j * 7u + (j >> 9));
}

/* Write the checkpoint at p: tensor t's bytes from seeds[t]. */
static inline void write_ckpt(const char *p, const uint32_t *seeds)
{
    char hdr[4096];
    size_t h = (size_t)snprintf(hdr, sizeof hdr, "{");
    uint64_t off = 0;
    for (int t = 0; t < NT; t++) {
        uint64_t n = t % 2 ? 16 : WBYTES;
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              "%s\"blk.%d.%c\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64
                              "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              t ? "," : "", t / 2, t % 2 ? 'b' : 'w', n, off, off + n);
        off += n;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    FILE *f = fopen(p, "wb");
    if (!f) return;
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int t = 0; t < NT; t++)
        for (uint64_t j = 0; j < (t % 2 ? 16u : (uint64_t)WBYTES); j++) fputc(val(seeds[t], t, j), f);
    fclose(f);
}

static inline void seeds_all(uint32_t *s, uint32_t v)
{
    for (int t = 0; t < NT; t++) s[t] = v;
}

/* Set the checkpoint's mtime dsec seconds from now (a change a coarse clock cannot hide). */
static inline void set_mtime(int dsec)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec += dsec;
    ts[1] = ts[0];
    CHECK_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* ---- stores ---- */

static inline ferry_file *open_ckpt(void)
{
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, path, 0, &f), 0);
    return f;
}

/* A store on d; with keeper, using the keeper at sock. */
static inline ferry_store *mk_store(ferry_device *d, bool keeper)
{
    char spill[700];
    snprintf(spill, sizeof spill, "%s", dir);
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = 64 << 20,
                          .host_budget = 64 << 20,
                          .pinned_budget = 32 << 20,
                          .spill_dir = spill,
                          .spill_below = 1,
                          .spill_above = 2};
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
    o.load = &lo;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (s && keeper) {
        int rc = ferry_store_use_keeper(s, sock, 3000);
        if (rc < 0) fprintf(stderr, "use_keeper: %s\n", ferry_store_errmsg(s));
        CHECK_EQ(rc, 0);
    }
    return s;
}

static inline ferry_store_stats sstats(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_stats(s, &st), 0);
    return st;
}

static inline ferry_store_keeper_stats kstats(ferry_store *s)
{
    ferry_store_keeper_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_keeper_stats(s, &st), 0);
    return st;
}

/* Every tensor of m, wherever it is, reads as tensor t of ref (a file
 * opened on the bytes expected); the tensors that differ. */
static inline int differ(ferry_model *m, ferry_file *ref)
{
    int bad = 0;
    uint8_t *a = malloc(WBYTES), *b = malloc(WBYTES);
    for (int64_t i = 0; i < ferry_model_tensor_count(m) && a && b; i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(ref, i, 0, b, st.nbytes);
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0) {
            fprintf(stderr, "differ: %s (tier %s, %d %d)\n", st.name, ferry_tier_name(st.tier), r1, r2);
            bad++;
        }
    }
    free(a);
    free(b);
    return bad;
}

/* A store on d (with the keeper or not) holding the checkpoint as it is now,
 * moved to the device whole: the model's differences from the file, and the
 * stats of that one move. */
typedef struct loaded {
    int rc, bad;
    uint64_t read;
    ferry_store_keeper_stats k;
} loaded;

static inline loaded load_fresh(ferry_device *d, bool keeper)
{
    loaded r = {.rc = -1};
    ferry_file *f = open_ckpt();
    ferry_store *s = f ? mk_store(d, keeper) : NULL;
    ferry_model *m = NULL;
    if (s && ferry_store_add(s, "m", &f, 1, 0, &m) == 0) {
        r.rc = ferry_model_to_device(m, NULL, 0);
        r.read = sstats(s).bytes_read;
        r.k = kstats(s);
        r.bad = differ(m, f);
    }
    ferry_store_free(s);
    ferry_file_close(f);
    return r;
}

/* The keeper's committed entries and their bytes, asked on a connection of
 * its own; -1 when it cannot be asked. */
static inline int keeper_holds(uint64_t *bytes)
{
    ferry_keep *k = NULL;
    char err[1400];
    if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) < 0) return -1;
    ferry_keep_status *st = NULL;
    int n = -1;
    if (ferry_keep_status_get(k, &st) == 0) {
        n = (int)st->nentries;
        if (bytes) *bytes = st->used - st->pending_bytes;
    }
    ferry_keep_status_free(st);
    ferry_keep_close(k);
    return n;
}

static inline pid_t setup_case(const char *name)
{
    CHECK_EQ(check_tmpdir(dir, sizeof dir, name), 0);
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    snprintf(logpath, sizeof logpath, "%s/keeper.log", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint32_t seeds[NT];
    seeds_all(seeds, 1);
    write_ckpt(path, seeds);
    pid_t kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(kp > 0);
    return kp;
}

/* Stop the case's keeper (cleanly, else its log is shown) and remove the dir. */
static inline void end_case(pid_t kp)
{
    int st = kp > 0 ? kc_stop(kp) : 0;
    CHECK_EQ(st, 0);
    FILE *lf = st != 0 ? fopen(logpath, "r") : NULL;
    for (char line[1024]; lf && fgets(line, sizeof line, lf);) fprintf(stderr, "keeper log: %s", line);
    if (lf) fclose(lf);
    check_rmtree(dir);
}

#define TOTAL (NBLK * ((uint64_t)WBYTES + 16))

/* A case: its temp dir and checkpoint with a keeper in a child (kp), the
 * sim device, and where asked the checkpoint open (f) as model "m" of a
 * store (s) that uses the keeper or not. */
typedef struct kcase {
    pid_t kp;
    ferry_device *d;
    ferry_file *f;
    ferry_store *s;
    ferry_model *m;
} kcase;

/* false when any of it failed (CHECKed); kcase_close either way. */
static inline bool kcase_open(kcase *c, const char *name, bool store, bool keeper)
{
    memset(c, 0, sizeof *c);
    c->kp = setup_case(name);
    CHECK_EQ(ferry_device_open(ctx, "sim:256MiB", &c->d), 0);
    if (c->kp <= 0 || !c->d) return false;
    if (!store) return true;
    c->f = open_ckpt();
    c->s = c->f ? mk_store(c->d, keeper) : NULL;
    if (c->s) CHECK_EQ(ferry_store_add(c->s, "m", &c->f, 1, 0, &c->m), 0);
    return c->m != NULL;
}

/* The keeper as it is now serves the checkpoint whole: a fresh store loads
 * it with the file's bytes (reading what the keeper lacks, and feeding it),
 * and the next fresh one is served every tensor, the same bytes. */
static inline void check_serves_whole(ferry_device *d)
{
    loaded a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.bad, 0);
    a = load_fresh(d, true);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(a.k.hits, NT);
    CHECK_EQ(a.read, 0);
    CHECK_EQ(a.bad, 0);
}

/* Each test binary's main: its cases under a deadline, SIGPIPE fatal (the
 * store must never raise one), one context. */
static inline int kmain(int argc, char **argv, const check_case *cases, int n)
{
    int rc = check_args_(argc, argv, cases, n);
    if (rc >= 0) return rc;
    alarm(300); /* a hung case fails instead of hanging ctest */
    signal(SIGPIPE, SIG_DFL);
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run_(cases, n);
    ferry_ctx_free(ctx);
    return check_summary();
}

static inline void kcase_close(kcase *c)
{
    ferry_store_free(c->s);
    ferry_file_close(c->f);
    ferry_device_close(c->d);
    end_case(c->kp);
}

#endif
