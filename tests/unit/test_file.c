/* SPDX-License-Identifier: Apache-2.0 */
/* test_file.c - ferry_file over real files: open, zero-copy views, shards,
 * hashing, custom allocators, and a fault loop over every system call. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "ferry.h"
#include "io/io.h"

static char dir[256];

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* Write a safetensors file: tensors given as "name:DTYPE:n" with n 1-D elements
 * of deterministic bytes, in the given order in both header and data. */
static void write_st(const char *name, int nt, const char *const *names, const char *const *dts,
                     const int *counts, int byte_seed, size_t pad_data)
{
    char hdr[8192];
    size_t o = 0;
    uint64_t off = 0;
    static const struct {
        const char *n;
        int b;
    } sz[] = {{"U8", 1}, {"BF16", 2}, {"F32", 4}, {"F64", 8}};
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "{\"__metadata__\":{\"k\":\"v\"}");
    for (int i = 0; i < nt; i++) {
        int b = 1;
        for (size_t k = 0; k < 4; k++)
            if (strcmp(sz[k].n, dts[i]) == 0) b = sz[k].b;
        uint64_t len = (uint64_t)counts[i] * (uint64_t)b;
        o += (size_t)snprintf(
            hdr + o, sizeof hdr - o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%llu,%llu]}",
            names[i], dts[i], counts[i], (unsigned long long)off, (unsigned long long)(off + len));
        off += len;
    }
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "}");
    while ((8 + o) % 8) hdr[o++] = ' ';
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    uint64_t n = o;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, o, f);
    /* each tensor's bytes depend on its name, not its place: reordered and
     * sharded copies hold the same tensors */
    for (int i = 0; i < nt; i++) {
        int b = 1;
        for (size_t k = 0; k < 4; k++)
            if (strcmp(sz[k].n, dts[i]) == 0) b = sz[k].b;
        for (uint64_t j = 0; j < (uint64_t)counts[i] * (uint64_t)b; j++)
            fputc(
                (int)((j * 131 + (uint64_t)byte_seed + (uint64_t)names[i][0] * 7 + strlen(names[i])) & 0xFF),
                f);
    }
    for (uint64_t i = 0; i < pad_data; i++) fputc(0, f);
    fclose(f);
}

static void write_text(const char *name, const char *text)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static const char *const N3[] = {"w.0", "w.1", "bias"};
static const char *const D3[] = {"BF16", "F32", "U8"};
static const int C3[] = {1000, 333, 7};

static void make_files(void)
{
    write_st("one.safetensors", 3, N3, D3, C3, 1, 0);
    /* the same tensors, other order: the model hash must not change */
    static const char *const N3r[] = {"bias", "w.1", "w.0"};
    static const char *const D3r[] = {"U8", "F32", "BF16"};
    static const int C3r[] = {7, 333, 1000};
    write_st("rev.safetensors", 3, N3r, D3r, C3r, 1, 0);
    static const char *const A[] = {"w.0"};
    static const char *const DA[] = {"BF16"};
    static const int CA[] = {1000};
    write_st("s-1.safetensors", 1, A, DA, CA, 1, 0);
    static const char *const B[] = {"w.1", "bias"};
    static const char *const DB[] = {"F32", "U8"};
    static const int CB[] = {333, 7};
    write_st("s-2.safetensors", 2, B, DB, CB, 1, 0);
    write_text("m.safetensors.index.json", "{\"metadata\":{\"total_size\":2339},\"weight_map\":{\"w.0\":\"s-"
                                           "1.safetensors\",\"w.1\":\"s-2.safetensors\","
                                           "\"bias\":\"s-2.safetensors\"}}");
    write_text("missing.safetensors.index.json",
               "{\"weight_map\":{\"w.0\":\"s-1.safetensors\",\"w.1\":\"s-2.safetensors\"}}");
    write_text("extra.safetensors.index.json",
               "{\"weight_map\":{\"w.0\":\"s-1.safetensors\",\"w.1\":\"s-2.safetensors\",\"bias\":\"s-2."
               "safetensors\",\"z\":\"s-2.safetensors\"}}");
    write_text("wrong.safetensors.index.json", "{\"weight_map\":{\"w.0\":\"s-2.safetensors\",\"w.1\":\"s-1."
                                               "safetensors\",\"bias\":\"s-2.safetensors\"}}");
    write_text("dup.safetensors.index.json", "{\"weight_map\":{\"w.0\":\"s-1.safetensors\",\"w.1\":\"one."
                                             "safetensors\",\"bias\":\"one.safetensors\"}}");
    write_text("gone.safetensors.index.json", "{\"weight_map\":{\"w.0\":\"nope.safetensors\"}}");
    write_st("trail.safetensors", 3, N3, D3, C3, 1, 5);
}

static int64_t count_tensors(ferry_ctx *ctx, const char *name, int *rc)
{
    char p[512];
    ferry_file *f = NULL;
    path_of(p, sizeof p, name);
    *rc = ferry_file_open(ctx, p, 0, &f);
    int64_t n = *rc == 0 ? ferry_file_tensor_count(f) : -1;
    ferry_file_close(f);
    return n;
}

/* Is addr in a mapping with permissions perms ("r--s")? */
static int mapping_perms(const void *addr, const char *perms)
{
    FILE *m = fopen("/proc/self/maps", "r");
    char line[1024];
    int found = 0;
    while (m && fgets(line, sizeof line, m)) {
        unsigned long lo, hi;
        char pm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, pm) == 3 && (unsigned long)addr >= lo &&
            (unsigned long)addr < hi)
            found = strcmp(pm, perms) == 0 ? 1 : -1;
    }
    if (m) fclose(m);
    return found;
}

static void test_open(ferry_ctx *ctx)
{
    char p[512];
    ferry_file *f = NULL;
    path_of(p, sizeof p, "one.safetensors");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    if (!f) return;
    CHECK_EQ(ferry_file_format(f), FERRY_FORMAT_SAFETENSORS);
    CHECK_EQ(ferry_file_tensor_count(f), 3);
    CHECK_EQ(ferry_file_total_bytes(f), 2000 + 1332 + 7);
    CHECK_EQ(ferry_file_shard_count(f), 1);
    CHECK_EQ(ferry_file_metadata_count(f), 1);
    CHECK_EQ(ferry_file_metadata_kind(f, 0), FERRY_META_TEXT); /* __metadata__ holds strings only */
    CHECK_EQ(ferry_file_metadata_kind(f, 1), FERRY_E_INVAL);
    CHECK_EQ(ferry_file_metadata_kind(f, -1), FERRY_E_INVAL);
    CHECK_EQ(ferry_file_metadata_kind(NULL, 0), FERRY_E_INVAL);
    int64_t i = ferry_file_find(f, "w.1");
    CHECK_EQ(i, 1);
    CHECK_EQ(ferry_file_find(f, "nope"), FERRY_E_NOTFOUND);
    ferry_tensor_info ti = {.size = sizeof ti};
    CHECK_EQ(ferry_file_tensor_info(f, i, &ti), 0);
    CHECK(strcmp(ti.name, "w.1") == 0);
    CHECK_EQ(ti.dtype, FERRY_DTYPE_F32);
    CHECK_EQ(ti.nbytes, 1332);
    CHECK_EQ(ti.ndim, 1);
    CHECK_EQ(ti.shape[0], 333);
    CHECK_EQ(ferry_file_tensor_info(f, 3, &ti), FERRY_E_INVAL);
    CHECK_EQ(ferry_file_tensor_info(f, -1, &ti), FERRY_E_INVAL);
    /* the view is the file's bytes, in a read-only shared mapping */
    const void *data;
    ferry_file_tensor_info(f, i, &ti);
    CHECK_EQ(ferry_file_tensor_data(f, i, &data), 0);
    unsigned char want[1332], got[1332];
    int fd = open(p, O_RDONLY);
    CHECK_EQ(pread(fd, want, sizeof want, (off_t)ti.offset), 1332);
    close(fd);
    CHECK(memcmp(data, want, sizeof want) == 0);
    CHECK_EQ(mapping_perms(data, "r--s"), 1);
    CHECK_EQ(ferry_file_tensor_read(f, i, 0, got, sizeof got), 0);
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK_EQ(ferry_file_tensor_read(f, i, 1000, got, 332), 0);
    CHECK(memcmp(got, want + 1000, 332) == 0);
    CHECK_EQ(ferry_file_tensor_read(f, i, 1000, got, 333), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "outside its 1332 bytes");
    CHECK_EQ(ferry_file_tensor_read(f, i, UINT64_MAX, got, 2), FERRY_E_INVAL);
    ferry_file_close(f);

    int rc;
    CHECK_EQ(count_tensors(ctx, "m.safetensors.index.json", &rc), 3);
    CHECK_EQ(count_tensors(ctx, "missing.safetensors.index.json", &rc), -1);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "holds tensor 'bias', which weight_map does not list");
    CHECK_EQ(count_tensors(ctx, "extra.safetensors.index.json", &rc), -1);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "weight_map lists tensor 'z' in");
    CHECK_EQ(count_tensors(ctx, "wrong.safetensors.index.json", &rc), -1);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "weight_map puts tensor 'w.0' in");
    CHECK_EQ(count_tensors(ctx, "dup.safetensors.index.json", &rc), -1);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "is also in");
    CHECK_EQ(count_tensors(ctx, "gone.safetensors.index.json", &rc), -1);
    CHECK_EQ(rc, -ENOENT);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "nope.safetensors: No such file or directory");
    CHECK_EQ(count_tensors(ctx, "trail.safetensors", &rc), -1);
    CHECK_EQ(rc, FERRY_E_CORRUPT);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "5 bytes after the last tensor");
    CHECK_EQ(count_tensors(ctx, "does-not-exist.safetensors", &rc), -1);
    CHECK_EQ(rc, -ENOENT);
    CHECK_EQ(count_tensors(ctx, ".", &rc), -1);
    CHECK_EQ(rc, -EISDIR);
    CHECK_EQ(ferry_file_open(ctx, "/dev/null", 0, &f), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "not a regular file");
    CHECK_EQ(ferry_file_open(ctx, p, 0x80, &f), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "unknown flags 0x80");
    /* FERRY_OPEN_PRIVATE: the views are writable copy-on-write pages; the
     * file itself never changes */
    f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, FERRY_OPEN_PRIVATE, &f), 0);
    if (f) {
        ferry_tensor_info pti = {.size = sizeof pti};
        void *v = NULL;
        CHECK_EQ(ferry_file_tensor_info(f, 0, &pti), 0);
        CHECK_EQ(ferry_file_tensor_data(f, 0, (const void **)&v), 0);
        CHECK(pti.nbytes > 0 && v != NULL);
        if (v && pti.nbytes) {
            unsigned char before = 0, after = 0;
            CHECK_EQ(ferry_file_tensor_read(f, 0, 0, &before, 1), 0);
            ((unsigned char *)v)[0] = (unsigned char)(before ^ 0xFF);
            CHECK_EQ(((unsigned char *)v)[0], before ^ 0xFF);        /* the view sees the write */
            CHECK_EQ(ferry_file_tensor_read(f, 0, 0, &after, 1), 0); /* pread: the file does not */
            CHECK_EQ(after, before);
        }
        ferry_file_close(f);
    }
    CHECK_EQ(ferry_file_open(ctx, "", 0, &f), FERRY_E_INVAL);
    CHECK_EQ(ferry_file_open(NULL, p, 0, &f), FERRY_E_INVAL);
    ferry_file_close(NULL);

    /* sharded: tensors in shard order, each with its shard's path */
    path_of(p, sizeof p, "m.safetensors.index.json");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    if (f) {
        CHECK_EQ(ferry_file_format(f), FERRY_FORMAT_SAFETENSORS_INDEX);
        CHECK_EQ(ferry_file_shard_count(f), 2);
        const char *k, *v;
        CHECK_EQ(ferry_file_metadata(f, 0, &k, &v), 0);
        CHECK(strcmp(v, "2339") == 0);
        CHECK_EQ(ferry_file_metadata_kind(f, 0), FERRY_META_JSON); /* the index's number, as JSON text */
        CHECK_EQ(ferry_file_tensor_info(f, ferry_file_find(f, "bias"), &ti), 0);
        CHECK_EQ(ti.shard, 1);
        CHECK_STR_HAS(ferry_file_shard_path(f, ti.shard), "s-2.safetensors");
        CHECK(ferry_file_shard_path(f, 2) == NULL);
        ferry_file_close(f);
    }
}

/* Opening touches the header only: after dropping the file's cache, the data
 * pages of a freshly opened file are not resident. */
static void test_open_touches_header_only(ferry_ctx *ctx)
{
    char p[512];
    path_of(p, sizeof p, "big.safetensors");
    FILE *fp = fopen(p, "wb");
    const char *h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[67108864],\"data_offsets\":[0,67108864]}}";
    static char hdr[4096];
    size_t hl = strlen(h);
    memcpy(hdr, h, hl);
    while ((8 + hl) % 4096) hdr[hl++] = ' ';
    uint64_t n = hl;
    fwrite(&n, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    fclose(fp);
    /* data: 64 MiB, really written so the cache has something to drop */
    int fd = open(p, O_WRONLY | O_APPEND);
    static char chunk[1 << 20];
    memset(chunk, 7, sizeof chunk);
    for (int i = 0; i < 64; i++) CHECK_EQ(write(fd, chunk, sizeof chunk), (ssize_t)sizeof chunk);
    fsync(fd);
    close(fd);
    fd = open(p, O_RDONLY);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    if (!f) {
        close(fd);
        return;
    }
    const void *data;
    ferry_file_tensor_data(f, 0, &data);
    size_t pages = (64u << 20) / 4096;
    unsigned char *vec = malloc(pages);
    CHECK_EQ(mincore((void *)((uintptr_t)data & ~(uintptr_t)4095), 64u << 20, vec), 0);
    size_t resident = 0;
    for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
    /* some file systems ignore DONTNEED (tmpfs: everything stays resident) */
    struct stat st;
    fstat(fd, &st);
    if (resident == pages) fprintf(stderr, "note: page cache not droppable here; residency check skipped\n");
    else CHECK(resident < pages / 16);
    free(vec);
    close(fd);
    ferry_file_close(f);
    unlink(p);
}

static void test_hash(ferry_ctx *ctx)
{
    char p[512];
    ferry_file *f = NULL, *g = NULL, *s = NULL;
    uint64_t h[3], hr[3], hs[3], m1 = 0, m2 = 1, m3 = 2, m4 = 3;
    path_of(p, sizeof p, "one.safetensors");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    path_of(p, sizeof p, "rev.safetensors");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &g), 0);
    path_of(p, sizeof p, "m.safetensors.index.json");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &s), 0);
    if (!f || !g || !s) goto out;
    CHECK_EQ(ferry_file_hash(ctx, f, h, &m1, NULL, NULL), 0);
    for (int i = 0; i < 3; i++) {
        const void *d;
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        ferry_file_tensor_data(f, i, &d);
        CHECK(h[i] == ferry_xxh3(d, (size_t)ti.nbytes));
    }
    CHECK_EQ(ferry_file_hash(ctx, g, hr, &m2, NULL, NULL), 0);
    CHECK(m1 == m2); /* same tensors, other layout */
    CHECK(hr[0] == h[2] && hr[2] == h[0]);
    CHECK_EQ(ferry_file_hash(ctx, s, hs, &m3, NULL, NULL), 0);
    CHECK(m1 == m3); /* sharded copy hashes the same */
    ferry_ctx *one;
    ferry_ctx_opts o = {.size = sizeof o, .nthreads = 1};
    CHECK_EQ(ferry_ctx_new(&o, &one), 0);
    CHECK_EQ(ferry_file_hash(one, f, NULL, &m4, NULL, NULL), 0);
    CHECK(m1 == m4);
    ferry_ctx_free(one);
    /* a different byte changes the model hash */
    static const char *const N1[] = {"w.0", "w.1", "bias"};
    write_st("other.safetensors", 3, N1, D3, C3, 2, 0);
    ferry_file *o2 = NULL;
    path_of(p, sizeof p, "other.safetensors");
    CHECK_EQ(ferry_file_open(ctx, p, 0, &o2), 0);
    uint64_t m5 = m1;
    if (o2) CHECK_EQ(ferry_file_hash(ctx, o2, NULL, &m5, NULL, NULL), 0);
    CHECK(m5 != m1);
    ferry_file_close(o2);
    /* a file truncated after opening: an error, not SIGBUS */
    path_of(p, sizeof p, "trunc.safetensors");
    write_st("trunc.safetensors", 3, N1, D3, C3, 3, 0);
    ferry_file *t = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &t), 0);
    CHECK_EQ(truncate(p, 100), 0);
    if (t) {
        CHECK_EQ(ferry_file_hash(ctx, t, NULL, &m5, NULL, NULL), FERRY_E_CORRUPT);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "ended early");
    }
    ferry_file_close(t);
out:
    ferry_file_close(f);
    ferry_file_close(g);
    ferry_file_close(s);
}

/* SQLite-style fault loop: fail system call N for N = 1, 2, ... until an open
 * and a hash go through with no fault left to fire. Each run must end in
 * success or a clean error with a message; ASan/LSan catch leaks. */
static void test_faults(ferry_ctx *ctx)
{
    static const char *const files[] = {"one.safetensors", "m.safetensors.index.json"};
    for (size_t k = 0; k < 2; k++) {
        char p[512];
        path_of(p, sizeof p, files[k]);
        int n, ok = 0, failed = 0;
        for (n = 1; n < 1000; n++) {
            fy_fault_arm(n, EIO);
            ferry_file *f = NULL;
            int rc = ferry_file_open(ctx, p, 0, &f);
            if (rc == 0) rc = ferry_file_hash(ctx, f, NULL, NULL, NULL, NULL);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            ferry_file_close(f);
            if (rc < 0) {
                failed++;
                CHECK(fired);
                CHECK_EQ(rc, -EIO);
                CHECK(ferry_ctx_errmsg(ctx)[0] != '\0');
            } else {
                ok++;
            }
            if (!fired) break;
        }
        CHECK(failed > 2);
        CHECK(n < 1000);
        (void)ok;
    }
}

static void test_allocator(void)
{
    ferry_ctx_opts o = {.size = sizeof o, .nthreads = 3, .allocator = COUNTING_ALLOCATOR_INIT};
    ferry_ctx *ctx;
    CHECK_EQ(ferry_ctx_new(&o, &ctx), 0);
    char p[512];
    path_of(p, sizeof p, "m.safetensors.index.json");
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    CHECK_EQ(ferry_file_hash(ctx, f, NULL, NULL, NULL, NULL), 0);
    ferry_file_close(f);
    path_of(p, sizeof p, "dup.safetensors.index.json");
    CHECK(ferry_file_open(ctx, p, 0, &f) < 0);
    ferry_ctx_free(ctx);
    CHECK_EQ(atomic_load(&live), 0);

    ferry_ctx_opts bad = {.size = sizeof bad, .allocator = {c_alloc, NULL, NULL, NULL}};
    CHECK_EQ(ferry_ctx_new(&bad, &ctx), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(NULL), "allocator");
    bad.size = 3;
    CHECK_EQ(ferry_ctx_new(&bad, &ctx), FERRY_E_INVAL);
    CHECK_EQ(ferry_ctx_new(NULL, NULL), FERRY_E_INVAL);
}

/* ferry_ctx_opts' caps for untrusted files: refused with FERRY_E_LIMIT and a
 * message naming the file, the figure and the cap; within them, opens. */
static void test_caps(void)
{
    static const struct {
        uint64_t max_tensors, max_header_bytes;
        const char *file, *msg; /* msg NULL: opens */
    } cases[] = {
        {2, 0, "one.safetensors", "one.safetensors: header holds 3 tensors, over the cap of 2 (max_tensors)"},
        {3, 0, "one.safetensors", NULL},
        {0, 100, "one.safetensors", "one.safetensors: header is 2"}, /* "... bytes, over the cap of 100" */
        {0, 500, "one.safetensors", "(max_header_bytes)"},           /* the header fits, not its table */
        {0, 4096, "one.safetensors", NULL},
        /* sharded: each shard is within the cap, the checkpoint is not */
        {2, 0, "m.safetensors.index.json",
         "m.safetensors.index.json: holds more than 2 tensors, the cap (max_tensors)"},
        {3, 0, "m.safetensors.index.json", NULL},
        {0, 100, "m.safetensors.index.json", "m.safetensors.index.json: index file is 1"},
        {0, 8192, "m.safetensors.index.json", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ferry_ctx_opts o = {.size = sizeof o,
                            .allocator = COUNTING_ALLOCATOR_INIT,
                            .max_tensors = cases[i].max_tensors,
                            .max_header_bytes = cases[i].max_header_bytes};
        ferry_ctx *c;
        CHECK_EQ(ferry_ctx_new(&o, &c), 0);
        char p[512];
        path_of(p, sizeof p, cases[i].file);
        ferry_file *f = NULL;
        int rc = ferry_file_open(c, p, 0, &f);
        if (cases[i].msg) {
            CHECK_EQ(rc, FERRY_E_LIMIT);
            CHECK_STR_HAS(ferry_ctx_errmsg(c), cases[i].msg);
            CHECK(f == NULL);
        } else {
            CHECK_EQ(rc, 0);
            CHECK_EQ(ferry_file_tensor_count(f), 3);
        }
        ferry_file_close(f);
        ferry_ctx_free(c);
        CHECK_EQ(atomic_load(&live), 0);
    }
    /* a caller built before the caps existed (a shorter struct) gets none */
    ferry_ctx_opts old = {.size = offsetof(ferry_ctx_opts, max_header_bytes), .max_tensors = 1};
    ferry_ctx *c;
    CHECK_EQ(ferry_ctx_new(&old, &c), 0);
    char p[512];
    path_of(p, sizeof p, "one.safetensors");
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(c, p, 0, &f), 0);
    ferry_file_close(f);
    ferry_ctx_free(c);
}

/* `test_file CASE` runs one of these, `--list` names them (check.h); main
 * makes the files and the ctx they share. */
static ferry_ctx *ctx;
#define CASES(CASE)                                                    \
    CASE(open, test_open(ctx))                                         \
    CASE(open_touches_header_only, test_open_touches_header_only(ctx)) \
    CASE(hash, test_hash(ctx))                                         \
    CASE(faults, test_faults(ctx))                                     \
    CASE(allocator, test_allocator())                                  \
    CASE(caps, test_caps())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "test") < 0) return 1;
    make_files();
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
