/* SPDX-License-Identifier: Apache-2.0 */
/* xfer_common.h - what the test_xfer_* binaries share: the checkpoints their
 * cases load (written by xfer_main into a temp dir), the sim device and what
 * it holds, the small ring's options, device memory read and written back,
 * verify_loaded, caller-owned destinations, the progress recorder, the guard
 * of descriptor 0, and each binary's main. The includer defines _GNU_SOURCE. */
#ifndef FERRY_TEST_XFER_COMMON_H
#define FERRY_TEST_XFER_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "fds.h"
#include "ferry.h"
#include "gpu/gpu.h"
#include "io/io.h"
#include "xfer/xfer_test.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define PAGE 4096u

static char dir[256];
static bool direct_ok; /* O_DIRECT works in dir (not on tmpfs) */

static inline void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static inline uint64_t page_round(uint64_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

/* ---- a counting allocator whose nth call can fail: alloc.h ---- */

/* ---- checkpoints ---- */

typedef struct tdef {
    char name[32];
    uint64_t n; /* U8 elements = bytes */
} tdef;

/* Deterministic bytes, different for every (file seed, tensor, position). */
static inline uint8_t byte_at(uint32_t seed, uint32_t t, uint64_t j)
{
    uint64_t x = ((uint64_t)seed << 48) ^ ((uint64_t)t << 32) ^ j;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (uint8_t)(x ^ (x >> 31));
}

/* A safetensors file of U8 tensors in the given order; hdr_pad spaces after
 * the JSON put the data section at an arbitrary (here: odd) file offset. */
static inline uint64_t write_st(const char *file, const tdef *t, int nt, uint32_t seed, size_t hdr_pad)
{
    size_t cap = 256 + (size_t)nt * 128 + hdr_pad;
    char *hdr = malloc(cap);
    size_t o = 0;
    uint64_t off = 0;
    o += (size_t)snprintf(hdr + o, cap - o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < nt; i++) {
        o += (size_t)snprintf(hdr + o, cap - o,
                              ",\"%s\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[%llu,%llu]}",
                              t[i].name, (unsigned long long)t[i].n, (unsigned long long)off,
                              (unsigned long long)(off + t[i].n));
        off += t[i].n;
    }
    o += (size_t)snprintf(hdr + o, cap - o, "}");
    for (size_t k = 0; k < hdr_pad; k++) hdr[o++] = ' ';
    char p[512];
    path_of(p, sizeof p, file);
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(1);
    }
    uint64_t hl = o;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, o, f);
    uint8_t buf[4096];
    for (int i = 0; i < nt; i++) {
        for (uint64_t j = 0; j < t[i].n;) {
            size_t k = 0;
            for (; k < sizeof buf && j < t[i].n; k++, j++) buf[k] = byte_at(seed, (uint32_t)i, j);
            fwrite(buf, 1, k, f);
        }
    }
    fclose(f);
    free(hdr);
    return 8 + hl + off;
}

static inline void write_text(const char *name, const char *text)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static inline tdef *defs(const char *prefix, const uint64_t *sizes, int n)
{
    tdef *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s.%04d", prefix, i);
        t[i].n = sizes[i];
    }
    return t;
}

/* The sharded checkpoint's index, built from the shards' tensor lists. */
static inline void write_index(const char *name, const tdef *a, int na, const char *fa, const tdef *b, int nb,
                               const char *fb)
{
    char *s = malloc(65536);
    size_t o = (size_t)snprintf(s, 65536, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int i = 0; i < na + nb; i++)
        o += (size_t)snprintf(s + o, 65536 - o, "%s\"%s\":\"%s\"", i ? "," : "",
                              i < na ? a[i].name : b[i - na].name, i < na ? fa : fb);
    snprintf(s + o, 65536 - o, "}}");
    write_text(name, s);
    free(s);
}

static const uint64_t ODD[] = {1, 3, 0, 4095, 4097, 0, MiB + 1, 7, 4096, 8191, 5, 0};
static const uint64_t SHA[] = {5000, 1, 0, 3};
static const uint64_t SHB[] = {3, 70000, 4097, 0};
static const uint64_t SMALL[] = {1, 4097, 0, 9000, 3, 5000};
static const uint64_t EMPTY[] = {0, 0, 0};
#define NTINY 2000
#define EDGE_N 8 /* edge.safetensors: 8 tensors of 256 KiB, back to back */

static inline void make_files(void)
{
    tdef *t = defs("odd", ODD, 12);
    write_st("odd.safetensors", t, 12, 1, 3); /* 3 pad bytes: the data starts at an odd offset */
    free(t);

    uint64_t tiny[NTINY];
    for (int i = 0; i < NTINY; i++) tiny[i] = (uint64_t)((i * 7919) % 9); /* 0..8 bytes */
    t = defs("tiny", tiny, NTINY);
    write_st("tiny.safetensors", t, NTINY, 2, 0);
    free(t);

    tdef *a = defs("sh.a", SHA, 4), *b = defs("sh.b", SHB, 4);
    write_st("sh-00001-of-00002.safetensors", a, 4, 3, 1);
    write_st("sh-00002-of-00002.safetensors", b, 4, 4, 6);
    write_index("sh.safetensors.index.json", a, 4, "sh-00001-of-00002.safetensors", b, 4,
                "sh-00002-of-00002.safetensors");
    free(a);
    free(b);

    t = defs("small", SMALL, 6);
    write_st("small.safetensors", t, 6, 5, 5);
    free(t);

    t = defs("empty", EMPTY, 3);
    write_st("empty.safetensors", t, 3, 6, 0);
    free(t);

    uint64_t edge[EDGE_N];
    for (int i = 0; i < EDGE_N; i++) edge[i] = 256 * KiB;
    t = defs("edge", edge, EDGE_N);
    write_st("edge.safetensors", t, EDGE_N, 7, 0);
    free(t);
}

static inline ferry_file *open_file(ferry_ctx *ctx, const char *name)
{
    char p[512];
    ferry_file *f = NULL;
    path_of(p, sizeof p, name);
    int rc = ferry_file_open(ctx, p, 0, &f);
    if (rc < 0) fprintf(stderr, "open %s: %s\n", name, ferry_ctx_errmsg(ctx));
    CHECK_EQ(rc, 0);
    return f;
}

/* Copy the test file named from (in the test directory) to the path to. */
static inline bool copy_file(const char *from, const char *to)
{
    char src[512];
    path_of(src, sizeof src, from);
    FILE *in = fopen(src, "rb"), *out = in ? fopen(to, "wb") : NULL;
    bool ok = in && out;
    for (int c; ok && (c = fgetc(in)) != EOF;) ok = fputc(c, out) != EOF;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = false;
    return ok;
}

/* Does O_DIRECT work where the test files are? */
static inline bool probe_direct(void)
{
    char p[512];
    path_of(p, sizeof p, "small.safetensors");
    int fd = open(p, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        fprintf(stderr, "note: O_DIRECT open fails in %s (%s): direct cases skipped\n", dir, strerror(errno));
        return false;
    }
    close(fd);
    return true;
}

/* ---- devices ---- */

typedef struct usage {
    uint64_t dev, pinned, reg;
} usage;

static inline usage use_of(ferry_device *d)
{
    usage u = {0, 0, 0};
    CHECK_EQ(fy_gpu_sim_usage(fy_device_gpu(d), &u.dev, &u.pinned, &u.reg), 0);
    return u;
}

static inline ferry_device *open_dev(ferry_ctx *ctx, const char *spec)
{
    ferry_device *d = NULL;
    int rc = ferry_device_open(ctx, spec, &d);
    if (rc < 0) fprintf(stderr, "device %s: %s\n", spec, ferry_ctx_errmsg(ctx));
    CHECK_EQ(rc, 0);
    return d;
}

/* The ring of opts o: its buffers and their O_DIRECT slack. */
static inline uint64_t ring_pinned(uint32_t nbuf, uint64_t bytes)
{
    return nbuf * (page_round(bytes) + 2 * PAGE);
}

/* The small ring's buffers. */
static uint32_t small_bufs = 2;

static inline ferry_load_opts small_opts(ferry_route p)
{
    ferry_load_opts o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.route = p;
    o.threads = 3;
    o.ring_buffers = small_bufs;
    o.ring_buffer_bytes = 4096;
    return o;
}
#define SMALL_RING ring_pinned(small_bufs, 4096)

static inline bool uses_ring(ferry_route p)
{
    return p == FERRY_ROUTE_RING || p == FERRY_ROUTE_DIRECT || p == FERRY_ROUTE_AUTO;
}

/* Copy n bytes of device memory back, synchronously. */
static inline int dev_read(ferry_device *d, uint64_t src, void *dst, size_t n)
{
    fy_gpu *g = fy_device_gpu(d);
    fy_stream *s = NULL;
    int rc = g->ops->stream_new(g, &s);
    if (rc < 0) return rc;
    rc = g->ops->copy_dtoh(g, dst, src, n, s);
    int r2 = g->ops->stream_sync(g, s);
    g->ops->stream_free(g, s);
    return rc < 0 ? rc : r2;
}

static inline int dev_write(ferry_device *d, uint64_t dst, const void *src, size_t n)
{
    fy_gpu *g = fy_device_gpu(d);
    fy_stream *s = NULL;
    int rc = g->ops->stream_new(g, &s);
    if (rc < 0) return rc;
    rc = g->ops->copy_htod(g, dst, src, n, s);
    int r2 = g->ops->stream_sync(g, s);
    g->ops->stream_free(g, s);
    return rc < 0 ? rc : r2;
}

/* Every tensor read back equals the file's bytes, and the layout is the
 * file's: within a shard, device address - file offset is one constant.
 * Returns the number of bad tensors (and says which). */
static inline int verify_loaded(ferry_loaded *l, const ferry_file *f, const char *what)
{
    int bad = 0;
    int64_t n = ferry_file_tensor_count(f);
    int ns = ferry_file_shard_count(f);
    int64_t *delta = calloc((size_t)ns, sizeof *delta);
    bool *seen = calloc((size_t)ns, sizeof *seen);
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        const void *want = NULL;
        if (ferry_file_tensor_info(f, i, &ti) < 0 || ferry_file_tensor_data(f, i, &want) < 0) {
            bad++;
            continue;
        }
        uint8_t *buf = malloc(ti.nbytes ? ti.nbytes : 1);
        memset(buf, 0xEE, ti.nbytes ? ti.nbytes : 1);
        int rc = ferry_loaded_read(l, i, buf);
        bool ok = rc == 0 && (ti.nbytes == 0 || memcmp(buf, want, ti.nbytes) == 0);
        if (ti.nbytes) {
            uint64_t p = ferry_loaded_ptr(l, i);
            if (p == 0) ok = false;
            int64_t dl = (int64_t)(p - ti.offset);
            if (!seen[ti.shard]) seen[ti.shard] = true, delta[ti.shard] = dl;
            else if (delta[ti.shard] != dl) ok = false;
        }
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "%s: tensor %s (%llu bytes): read rc %d, wrong bytes or layout\n", what,
                        ti.name, (unsigned long long)ti.nbytes, rc);
            bad++;
        }
        free(buf);
    }
    free(delta);
    free(seen);
    return bad;
}

/* ---- every path, in the order the loops over them take ---- */

static const ferry_route all_paths[] = {FERRY_ROUTE_RING, FERRY_ROUTE_DIRECT, FERRY_ROUTE_REGISTER,
                                        FERRY_ROUTE_AUTO};
#define NPATHS 4

/* ---- caller-owned destinations ---- */

static inline uint32_t lcg(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

#define CANARY 64

/* Caller-owned destinations for a shuffled subset of f's tensors: two in
 * three, plus one tensor twice (to two places); each with CANARY bytes of
 * 0xAA after it that a load must not touch. */
typedef struct dests {
    int64_t m;
    int64_t *idx;
    uint64_t *dp;
    uint64_t bytes; /* tensor bytes to move */
} dests;

static inline bool dests_new(ferry_device *d, const ferry_file *f, uint32_t seed, dests *x)
{
    fy_gpu *g = fy_device_gpu(d);
    int64_t n = ferry_file_tensor_count(f);
    x->m = 0;
    x->bytes = 0;
    x->idx = calloc((size_t)n + 1, sizeof *x->idx);
    x->dp = calloc((size_t)n + 1, sizeof *x->dp);
    for (int64_t i = 0; i < n; i++)
        if (i % 3 != 1) x->idx[x->m++] = i;
    x->idx[x->m++] = n / 2;
    for (int64_t i = x->m - 1; i > 0; i--) {
        int64_t j = (int64_t)(lcg(&seed) % (uint32_t)(i + 1)), t = x->idx[i];
        x->idx[i] = x->idx[j];
        x->idx[j] = t;
    }
    uint8_t *pat = malloc(2 * MiB);
    memset(pat, 0xAA, 2 * MiB);
    bool ok = true;
    for (int64_t k = 0; k < x->m; k++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, x->idx[k], &ti);
        x->bytes += ti.nbytes;
        if (ti.nbytes + CANARY > 2 * MiB || g->ops->mem_alloc(g, (size_t)ti.nbytes + CANARY, &x->dp[k]) < 0 ||
            dev_write(d, x->dp[k], pat, (size_t)ti.nbytes + CANARY) < 0)
            ok = false;
    }
    free(pat);
    return ok;
}

/* Bad destinations: wrong bytes, or bytes written past the tensor. */
static inline int dests_verify(ferry_device *d, const ferry_file *f, const dests *x, const char *what)
{
    int bad = 0;
    uint8_t canary[CANARY];
    memset(canary, 0xAA, sizeof canary);
    for (int64_t k = 0; k < x->m; k++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        const void *want;
        ferry_file_tensor_info(f, x->idx[k], &ti);
        ferry_file_tensor_data(f, x->idx[k], &want);
        uint8_t *buf = malloc((size_t)ti.nbytes + CANARY);
        bool ok = dev_read(d, x->dp[k], buf, (size_t)ti.nbytes + CANARY) == 0 &&
                  (ti.nbytes == 0 || memcmp(buf, want, ti.nbytes) == 0) &&
                  memcmp(buf + ti.nbytes, canary, CANARY) == 0;
        if (!ok && bad++ < 5) fprintf(stderr, "%s: tensor %s wrong at its destination\n", what, ti.name);
        free(buf);
    }
    return bad;
}

static inline void dests_free(ferry_device *d, dests *x)
{
    fy_gpu *g = fy_device_gpu(d);
    for (int64_t k = 0; k < x->m; k++)
        if (x->dp[k]) g->ops->mem_free(g, x->dp[k]);
    free(x->idx);
    free(x->dp);
    memset(x, 0, sizeof *x);
}

/* ---- descriptor 0, and the fault loops' count ---- */

static int total_iters, fd0_closed;

/* Known bug: an allocation failure in run_ring closes descriptor 0 (its
 * j.dfd array is still zeroed when it bails out; main reports the count).
 * Put /dev/null back so that the next file opened does not become
 * descriptor 0 and get closed in turn. */
static inline void fd0_guard(void)
{
    if (fcntl(0, F_GETFD) >= 0 || errno != EBADF) return;
    fd0_closed++;
    int fd = open("/dev/null", O_RDONLY);
    if (fd > 0) {
        dup2(fd, 0);
        close(fd);
    }
}

/* ---- registration ---- */

/* The pages of f's shards, as a registration counts them. */
static inline uint64_t file_pages(const ferry_file *f)
{
    uint64_t n = 0;
    for (int s = 0; s < ferry_file_shard_count(f); s++) {
        struct stat st;
        if (stat(ferry_file_shard_path(f, s), &st) == 0) n += page_round((uint64_t)st.st_size);
    }
    return n;
}

/* ---- progress ---- */

/* What a load's progress calls said (on_progress). */
typedef struct prog {
    pthread_mutex_t mu;
    int calls, backwards, bad_total;
    uint64_t last, max, total_seen;
    bool slow;
} prog;

static inline void on_progress(void *opaque, uint64_t done, uint64_t total)
{
    prog *pg = opaque;
    if (pg->slow) usleep((useconds_t)(done % 7) * 100); /* widen the windows between workers */
    pthread_mutex_lock(&pg->mu);
    pg->calls++;
    if (done < pg->last) pg->backwards++;
    if (done > total) pg->bad_total++;
    if (pg->calls == 1) pg->total_seen = total;
    else if (total != pg->total_seen) pg->bad_total++;
    pg->last = done;
    if (done > pg->max) pg->max = done;
    pthread_mutex_unlock(&pg->mu);
}

/* Each test_xfer_* binary's main: makes the files and the ctx its cases
 * share, runs them, and checks afterwards that the cases left descriptor 0
 * open and freed everything ferry allocated. */
static inline int xfer_main(int argc, char **argv, const check_case *cases, int n, ferry_ctx **ctx)
{
    int rc = check_args_(argc, argv, cases, n);
    if (rc >= 0) return rc;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ferry-xfer-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    make_files();
    direct_ok = probe_direct();
    fd0_guard(); /* descriptor 0 open, so no test file gets it */
    fd0_closed = 0;
    ferry_ctx_opts co = {.size = sizeof co, .nthreads = 2, .allocator = COUNTING_ALLOCATOR_INIT};
    CHECK_EQ(ferry_ctx_new(&co, ctx), 0);
    if (!*ctx) return check_summary();
    check_run_(cases, n);
    /* regressions of bugs these tests found (now fixed): an allocation failure in
     * the ring path closed descriptor 0; a register load dropped a registration
     * made while it ran; progress went backwards; a register load of a file
     * truncated after open died of SIGBUS (test_xfer_faults.regressions) */
    CHECK_EQ(fd0_closed, 0);
    printf("fault loops: %d faulted loads\n", total_iters);
    ferry_ctx_free(*ctx);
    CHECK_EQ(atomic_load(&live), 0); /* everything ferry allocated, it freed */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}

#endif
