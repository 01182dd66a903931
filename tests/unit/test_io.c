/* SPDX-License-Identifier: Apache-2.0 */
/* test_io.c - io/'s system-call table: entries replaced one at a time (a
 * failing fsync, mincore or cgroup read, short reads and writes, a tmpfs seen
 * where there is none) must give clean errors with nothing leaked, counted
 * faults must reach the calls they document and no others, and reset must
 * bring the real calls back. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "fds.h"
#include "ferry.h"
#include "io/io.h"
#include "io/memstat.h"
#include "resid/spill.h"

static const ferry_allocator counting_allocator = COUNTING_ALLOCATOR_INIT;
static char dir[1024];

/* The real calls, for replacements that pass most calls on. */
typedef ssize_t pread_fn(int, void *, size_t, off_t);
typedef ssize_t rw_fn(int, void *, size_t);
typedef ssize_t write_fn(int, const void *, size_t);
typedef int open_fn(const char *, int, mode_t);
static pread_fn *real_pread;
static rw_fn *real_read;
static write_fn *real_write;
static open_fn *real_open;
static atomic_long calls;

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}


/* Entries of d other than . and .., whose names start with prefix. */
static int count_entries(const char *d, const char *prefix)
{
    DIR *dd = opendir(d);
    if (!dd) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(dd);
    return n;
}

static void put(const char *path, const void *data, size_t len)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0700);
            *p = '/';
        }
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(data, 1, len, f);
    fclose(f);
}

static uint8_t byte_at(uint64_t i)
{
    return (uint8_t)(i * 131u + (i >> 8));
}

/* A safetensors file with two tensors: "a" F32[300] and "b" U8[77]. */
static void make_st(const char *name)
{
    static const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[300],\"data_offsets\":[0,1200]},"
                              "\"b\":{\"dtype\":\"U8\",\"shape\":[77],\"data_offsets\":[1200,1277]}}";
    size_t hl = sizeof hdr - 1, n = 8 + hl + 1277;
    uint8_t *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (size_t i = 0; i < 1277; i++) buf[8 + hl + i] = byte_at(i);
    char p[PATH_MAX];
    path_of(p, sizeof p, name);
    put(p, buf, n);
    free(buf);
}

/* ---- replacements ---- */

static int fail_fd_eio(int fd)
{
    (void)fd;
    atomic_fetch_add(&calls, 1);
    errno = EIO;
    return -1;
}

static int fail_rename_exdev(const char *a, const char *b)
{
    (void)a, (void)b;
    errno = EXDEV;
    return -1;
}

static int fail_unlink_eperm(const char *p)
{
    (void)p;
    errno = EPERM;
    return -1;
}

static int fail_mincore(void *addr, size_t len, unsigned char *vec)
{
    (void)addr, (void)len, (void)vec;
    errno = ENOMEM;
    return -1;
}

static int fail_fstat(int fd, struct stat *st)
{
    (void)fd, (void)st;
    errno = EACCES;
    return -1;
}

static int open_emfile(const char *path, int flags, mode_t mode)
{
    (void)path, (void)flags, (void)mode;
    errno = EMFILE;
    return -1;
}

/* At most 7 bytes a call: every caller must loop. */
static ssize_t short_pread(int fd, void *buf, size_t n, off_t off)
{
    atomic_fetch_add(&calls, 1);
    return real_pread(fd, buf, n < 7 ? n : 7, off);
}

static ssize_t eof_pread(int fd, void *buf, size_t n, off_t off)
{
    (void)fd, (void)buf, (void)n, (void)off;
    return 0;
}

static ssize_t short_write(int fd, const void *buf, size_t n)
{
    atomic_fetch_add(&calls, 1);
    return real_write(fd, buf, n > 1 ? n / 2 : n);
}

static ssize_t one_byte_read(int fd, void *buf, size_t n)
{
    atomic_fetch_add(&calls, 1);
    return real_read(fd, buf, n ? 1 : 0);
}

static ssize_t fail_read(int fd, void *buf, size_t n)
{
    (void)fd, (void)buf, (void)n;
    errno = EIO;
    return -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The cgroup's memory.max cannot be read; every other file can. */
static int open_no_max(const char *path, int flags, mode_t mode)
{
    if (ends_with(path, "/memory.max")) {
        errno = EACCES;
        return -1;
    }
    return real_open(path, flags, mode);
}

/* A file system without O_TMPFILE. */
static int open_no_tmpfile(const char *path, int flags, mode_t mode)
{
    if ((flags & O_TMPFILE) == O_TMPFILE) {
        errno = EOPNOTSUPP;
        return -1;
    }
    return real_open(path, flags, mode);
}

static long fake_fs_type = 0xEF53; /* ext4 */
static int fake_fstatfs(int fd, struct statfs *sf)
{
    (void)fd;
    memset(sf, 0, sizeof *sf);
    sf->f_type = fake_fs_type;
    sf->f_bsize = 4096;
    sf->f_bavail = 1u << 20;
    return 0;
}

/* f_bsize is the preferred I/O size, f_frsize the unit f_bavail counts in */
static int fake_fstatfs_frsize(int fd, struct statfs *sf)
{
    (void)fd;
    memset(sf, 0, sizeof *sf);
    sf->f_type = 0xEF53;
    sf->f_bsize = 1 << 20;
    sf->f_frsize = 1024;
    sf->f_bavail = 10;
    return 0;
}

/* ---- the table itself ---- */

static void test_table(void)
{
    static const char *const names[] = {"open",      "close",    "read",   "write",   "pread",
                                        "pwrite",    "stat",     "fstat",  "fstatfs", "fallocate",
                                        "ftruncate", "fchmod",   "fsync",  "mmap",    "munmap",
                                        "mincore",   "mkostemp", "rename", "unlink"};
    fy_sys_fn real[sizeof names / sizeof *names];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        real[i] = fy_sys_get(names[i]);
        CHECK(real[i] != NULL);
    }
    CHECK(fy_sys_get("nosuchcall") == NULL);
    CHECK(fy_sys_get(NULL) == NULL);
    CHECK_EQ(fy_sys_set("nosuchcall", (fy_sys_fn)fail_fd_eio), -ENOENT);
    CHECK_EQ(fy_sys_set(NULL, (fy_sys_fn)fail_fd_eio), -ENOENT);

    CHECK_EQ(fy_sys_set("fsync", (fy_sys_fn)fail_fd_eio), 0);
    CHECK(fy_sys_get("fsync") == (fy_sys_fn)fail_fd_eio);
    CHECK(fy_sys_get("close") == real[1]);  /* only that entry */
    CHECK_EQ(fy_sys_set("fsync", NULL), 0); /* NULL: the real call again */
    CHECK(fy_sys_get("fsync") == real[12]);

    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        CHECK_EQ(fy_sys_set(names[i], (fy_sys_fn)fail_fd_eio), 0);
    fy_sys_reset();
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) CHECK(fy_sys_get(names[i]) == real[i]);
}

/* ---- reading ---- */

static void test_reads(ferry_ctx *ctx)
{
    char p[PATH_MAX];
    path_of(p, sizeof p, "r.safetensors");
    make_st("r.safetensors");
    fy_err err;
    fy_err_init(&err);
    int fd = -1;
    uint64_t size = 0;
    CHECK_EQ(fy_open_ro(p, &fd, &size, &err), 0);
    if (fd < 0) return;
    uint64_t hl = size - 1277;
    uint8_t buf[1277];

    /* short reads: fy_pread_full loops until it has everything */
    atomic_store(&calls, 0);
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)short_pread), 0);
    memset(buf, 0, sizeof buf);
    CHECK_EQ(fy_pread_full(fd, buf, sizeof buf, hl), 0);
    bool same = true;
    for (size_t i = 0; i < sizeof buf; i++) same &= buf[i] == byte_at(i);
    CHECK(same);
    CHECK_EQ(atomic_load(&calls), (1277 + 6) / 7);
    CHECK_EQ(fy_pread_some(fd, buf, sizeof buf, hl), 7);

    /* the file ending early: FERRY_E_CORRUPT, and through ferry_file a message */
    ferry_file *f = NULL;
    fy_sys_reset();
    CHECK_EQ(ferry_file_open(ctx, p, 0, &f), 0);
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)eof_pread), 0);
    CHECK_EQ(fy_pread_full(fd, buf, 10, 0), FERRY_E_CORRUPT);
    if (f) {
        CHECK_EQ(ferry_file_tensor_read(f, ferry_file_find(f, "b"), 0, buf, 77), FERRY_E_CORRUPT);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "ended early");
    }

    /* reset: the real pread again */
    fy_sys_reset();
    memset(buf, 0, sizeof buf);
    if (f) {
        CHECK_EQ(ferry_file_tensor_read(f, ferry_file_find(f, "b"), 0, buf, 77), 0);
        same = true;
        for (size_t i = 0; i < 77; i++) same &= buf[i] == byte_at(1200 + i);
        CHECK(same);
    }
    ferry_file_close(f);

    /* fstat fails inside fy_open_ro: a clean error naming the file, the
     * descriptor it opened closed again */
    int fds = count_fds();
    CHECK_EQ(fy_sys_set("fstat", (fy_sys_fn)fail_fstat), 0);
    int fd2 = -7;
    CHECK_EQ(fy_open_ro(p, &fd2, &size, &err), -EACCES);
    CHECK_EQ(fd2, -7);
    CHECK_STR_HAS(err.msg, p);
    uint64_t sz = 12345;
    CHECK_EQ(fy_fstat_size(fd, &sz), -EACCES);
    CHECK_EQ(sz, 12345);
    CHECK_EQ(count_fds(), fds);
    /* and a whole ferry_file_open, with a counting allocator: nothing left */
    ferry_ctx *cc = NULL;
    ferry_ctx_opts o = {.size = sizeof o, .allocator = counting_allocator};
    CHECK_EQ(ferry_ctx_new(&o, &cc), 0);
    long live0 = atomic_load(&live);
    if (cc) {
        ferry_file *g = (ferry_file *)&err;
        CHECK_EQ(ferry_file_open(cc, p, 0, &g), -EACCES);
        CHECK(g == NULL);
        CHECK_STR_HAS(ferry_ctx_errmsg(cc), p);
        CHECK_EQ(atomic_load(&live), live0);
    }
    CHECK_EQ(count_fds(), fds);
    fy_sys_reset();
    CHECK_EQ(fy_fstat_size(fd, &sz), 0);
    CHECK_EQ(sz, size);
    if (cc) {
        ferry_file *g = NULL;
        CHECK_EQ(ferry_file_open(cc, p, 0, &g), 0);
        ferry_file_close(g);
        ferry_ctx_free(cc);
    }
    CHECK_EQ(atomic_load(&live), 0);

    /* O_DIRECT: opens where the file system has it; a failing open leaves *fd */
    int dfd = -7;
    int rc = fy_open_direct(p, &dfd);
    CHECK(rc == 0 || rc == -EINVAL);
    if (rc == 0) CHECK(dfd >= 0 && (fcntl(dfd, F_GETFL) & O_DIRECT));
    fy_close(rc == 0 ? dfd : -1);
    CHECK_EQ(fy_sys_set("open", (fy_sys_fn)open_emfile), 0);
    dfd = -7;
    CHECK_EQ(fy_open_direct(p, &dfd), -EMFILE);
    CHECK_EQ(dfd, -7);
    fy_sys_reset();
    CHECK_EQ(count_fds(), fds);
    fy_close(fd);
}

/* ---- mappings ---- */

static void test_mincore(void)
{
    char p[PATH_MAX];
    path_of(p, sizeof p, "m.safetensors");
    make_st("m.safetensors");
    fy_err err;
    fy_err_init(&err);
    int fd = -1;
    uint64_t size = 0;
    CHECK_EQ(fy_open_ro(p, &fd, &size, &err), 0);
    void *map = NULL;
    CHECK_EQ(fy_map_ro(fd, size, &map), 0);
    if (!map) return;
    unsigned char vec[4] = {0};
    volatile uint8_t touch = ((const uint8_t *)map)[0];
    (void)touch;
    CHECK_EQ(fy_mincore(map, (size_t)size, vec), 0);
    CHECK_EQ(vec[0] & 1, 1); /* just read */
    CHECK_EQ(fy_sys_set("mincore", (fy_sys_fn)fail_mincore), 0);
    CHECK_EQ(fy_mincore(map, (size_t)size, vec), -ENOMEM);
    fy_sys_reset();
    CHECK_EQ(fy_mincore(map, (size_t)size, vec), 0);
    /* size 0 maps nothing and makes no call */
    void *z = (void *)&err;
    CHECK_EQ(fy_map_ro(fd, 0, &z), 0);
    CHECK(z == NULL);
    fy_unmap(map, size);
    fy_close(fd);
}

/* fy_unmap_gently over more than one 64 MiB piece (a sparse file with a mark
 * in every MiB): the mapping is gone afterwards (mincore refuses it), the
 * file's bytes are unchanged (mapped again, every mark is there), and a NULL
 * or empty mapping is nothing. */
static void test_unmap_gently(void)
{
    char p[PATH_MAX];
    path_of(p, sizeof p, "gentle.bin");
    const uint64_t size = 130ull << 20, mib = 1ull << 20;
    int w = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(w >= 0);
    if (w < 0) return;
    CHECK_EQ(ftruncate(w, (off_t)size), 0);
    for (uint64_t off = 0; off < size; off += mib) {
        uint32_t v = (uint32_t)(off / mib) * 2654435761u;
        CHECK_EQ(pwrite(w, &v, sizeof v, (off_t)(off + 100)), (ssize_t)sizeof v);
    }
    close(w);
    fy_err err;
    fy_err_init(&err);
    int fd = -1;
    uint64_t got = 0;
    CHECK_EQ(fy_open_ro(p, &fd, &got, &err), 0);
    CHECK_EQ(got, size);
    for (int round = 0; round < 2 && fd >= 0; round++) {
        void *map = NULL;
        CHECK_EQ(fy_map_ro(fd, size, &map), 0);
        if (!map) break;
        uint64_t bad = 0;
        for (uint64_t off = 0; off < size; off += mib) {
            uint32_t v;
            memcpy(&v, (const uint8_t *)map + off + 100, sizeof v);
            bad += v != (uint32_t)(off / mib) * 2654435761u;
        }
        CHECK_EQ(bad, 0);
        fy_unmap_gently(map, size);
        unsigned char vec[1];
        CHECK_EQ(fy_mincore(map, 4096, vec), -ENOMEM); /* not mapped any more */
    }
    fy_unmap_gently(NULL, size);
    fy_unmap_gently((void *)&err, 0);
    fy_close(fd);
    unlink(p);
    fy_err_destroy(&err);
}

/* ---- converting: write, fsync, rename, through the table ---- */

/* Convert f to out; rc, with the checks every outcome must pass: an error has
 * a message and leaves neither out nor a temporary file; nothing leaks. */
static int convert_checked(ferry_ctx *ctx, ferry_file *f, const char *out)
{
    int fds = count_fds();
    long live0 = atomic_load(&live);
    unlink(out);
    int rc = ferry_file_convert(ctx, f, out, 64, NULL, NULL);
    CHECK_EQ(count_fds(), fds);
    CHECK_EQ(atomic_load(&live), live0);
    CHECK_EQ(count_entries(dir, "out.safetensors.tmp-"), 0);
    if (rc < 0) {
        CHECK(ferry_ctx_errmsg(ctx)[0] != '\0');
        CHECK(access(out, F_OK) != 0);
    }
    return rc;
}

static bool same_file(const char *a, const char *b)
{
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    bool same = x && y;
    while (same) {
        int c = fgetc(x), d = fgetc(y);
        same = c == d;
        if (c == EOF) break;
    }
    if (x) fclose(x);
    if (y) fclose(y);
    return same;
}

static void test_convert(void)
{
    ferry_ctx *ctx = NULL;
    ferry_ctx_opts o = {.size = sizeof o, .allocator = counting_allocator};
    CHECK_EQ(ferry_ctx_new(&o, &ctx), 0);
    if (!ctx) return;
    char src[PATH_MAX], out[PATH_MAX], ref[PATH_MAX];
    path_of(src, sizeof src, "c.safetensors");
    path_of(out, sizeof out, "out.safetensors");
    path_of(ref, sizeof ref, "ref.safetensors");
    make_st("c.safetensors");
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, src, 0, &f), 0);
    if (!f) goto out;
    CHECK_EQ(convert_checked(ctx, f, out), 0);
    CHECK_EQ(rename(out, ref), 0);

    /* fsync fails: the data may not be on disk, so no output */
    atomic_store(&calls, 0);
    CHECK_EQ(fy_sys_set("fsync", (fy_sys_fn)fail_fd_eio), 0);
    CHECK_EQ(convert_checked(ctx, f, out), -EIO);
    CHECK_EQ(atomic_load(&calls), 1);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), out);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "writing");
    fy_sys_reset();

    /* rename fails: the temporary file goes */
    CHECK_EQ(fy_sys_set("rename", (fy_sys_fn)fail_rename_exdev), 0);
    CHECK_EQ(convert_checked(ctx, f, out), -EXDEV);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "rename");
    fy_sys_reset();

    /* short writes: the same bytes in the end */
    atomic_store(&calls, 0);
    CHECK_EQ(fy_sys_set("write", (fy_sys_fn)short_write), 0);
    CHECK_EQ(convert_checked(ctx, f, out), 0);
    CHECK(atomic_load(&calls) > 2);
    CHECK(same_file(out, ref));
    fy_sys_reset();

    /* short reads of the source: the same again */
    CHECK_EQ(fy_sys_set("pread", (fy_sys_fn)short_pread), 0);
    CHECK_EQ(convert_checked(ctx, f, out), 0);
    CHECK(same_file(out, ref));
    fy_sys_reset();

    /* counted faults: each of mkostemp, the writes, the reads, fsync and
     * rename in turn; every run a clean -EIO or the same file */
    int n, failed = 0;
    for (n = 1; n < 200; n++) {
        fy_fault_arm(n, EIO);
        int rc = convert_checked(ctx, f, out);
        bool fired = fy_fault_fired();
        fy_fault_arm(0, 0);
        if (!fired) {
            CHECK_EQ(rc, 0);
            CHECK(same_file(out, ref));
            break;
        }
        failed++;
        CHECK_EQ(rc, -EIO);
    }
    CHECK(n < 200);
    CHECK_EQ(failed, 8); /* mkostemp, the header's write, 2 x (read, write), fsync, rename */

    /* after all that, the real calls again */
    CHECK_EQ(convert_checked(ctx, f, out), 0);
    CHECK(same_file(out, ref));
    ferry_file_close(f);
out:
    ferry_ctx_free(ctx);
    CHECK_EQ(atomic_load(&live), 0);
}

/* ---- the spill file ---- */

static void test_spill(void)
{
    char d[PATH_MAX];
    path_of(d, sizeof d, "spill");
    mkdir(d, 0700);
    fy_err err;
    fy_err_init(&err);
    int fds = count_fds();
    rs_spill *s = NULL;

    /* the file system is whatever fstatfs says: tmpfs is refused */
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    fake_fs_type = 0x01021994; /* TMPFS_MAGIC */
    CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), FERRY_E_INVAL);
    CHECK(s == NULL);
    CHECK_STR_HAS(err.msg, "tmpfs");
    CHECK_EQ(count_fds(), fds);
    CHECK_EQ(atomic_load(&live), 0);
    fake_fs_type = 0xEF53;

    /* free space counts f_bavail in f_frsize units (f_bsize where that is 0) */
    uint64_t fr = 0;
    long ty = 0;
    CHECK_EQ(fy_fs_info(0, &fr, &ty), 0);
    CHECK_EQ(fr, (1ull << 20) * 4096);
    CHECK_EQ(ty, 0xEF53);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs_frsize), 0);
    CHECK_EQ(fy_fs_info(0, &fr, NULL), 0);
    CHECK_EQ(fr, 10240);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);

    /* no O_TMPFILE: a named file, unlinked at once */
    CHECK_EQ(fy_sys_set("open", (fy_sys_fn)open_no_tmpfile), 0);
    CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), 0);
    CHECK_EQ(count_entries(d, ""), 0);
    if (s) {
        uint64_t off;
        CHECK_EQ(rs_spill_reserve(s, 4096, &off), 0);
        rs_spill_close(s);
    }
    CHECK_EQ(count_fds(), fds);

    /* the unlink fails: an error naming the directory, the descriptor closed,
     * the memory freed (the named file cannot be helped: it stays) */
    CHECK_EQ(fy_sys_set("unlink", (fy_sys_fn)fail_unlink_eperm), 0);
    s = (rs_spill *)&err;
    CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), -EPERM);
    CHECK(s == NULL);
    CHECK_STR_HAS(err.msg, d);
    CHECK_EQ(count_fds(), fds);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(count_entries(d, ".ferry-spill-"), 1);
    fy_sys_reset();

    /* counted faults reach mkostemp and unlink in the fallback too */
    CHECK_EQ(fy_sys_set("open", (fy_sys_fn)open_no_tmpfile), 0);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    fy_fault_arm(2, ENOSPC); /* 1: the O_TMPFILE open; 2: mkostemp */
    CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), -ENOSPC);
    CHECK(fy_fault_fired());
    fy_fault_arm(0, 0);
    CHECK(s == NULL);
    CHECK_EQ(count_fds(), fds);
    CHECK_EQ(count_entries(d, ".ferry-spill-"), 1); /* only the one from before */
    fy_sys_reset();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    CHECK_EQ(system(cmd), 0);
}

/* ---- /proc and cgroup reads ---- */

static void test_memstat(void)
{
    char proc[2048], cg[2048], p[PATH_MAX];
    path_of(proc, sizeof proc, "proc");
    path_of(cg, sizeof cg, "cg");
    snprintf(p, sizeof p, "%s/self/cgroup", proc);
    put(p, "0::/a\n", strlen("0::/a\n"));
    snprintf(p, sizeof p, "%s/meminfo", proc);
    const char *meminfo = "MemTotal: 1000000 kB\nMemAvailable: 500000 kB\n";
    put(p, meminfo, strlen(meminfo));
    snprintf(p, sizeof p, "%s/a/memory.current", cg);
    put(p, "1048576\n", strlen("1048576\n"));
    snprintf(p, sizeof p, "%s/a/memory.max", cg);
    put(p, "4194304\n", strlen("4194304\n"));
    fy_memstat_set_roots(proc, cg);
    int fds = count_fds();

    fy_cgroup_mem m;
    uint64_t avail = 0;
    char source[128];
    CHECK_EQ(fy_cgroup_read(&m), 0);
    CHECK_EQ(m.limit, 4194304);
    CHECK_EQ(m.current, 1048576);
    CHECK_EQ(fy_host_available(&avail, source, sizeof source), 0);
    CHECK_EQ(avail, 3145728);
    CHECK_STR_HAS(source, "memory.max");

    /* memory.max cannot be read: an error, not "no limit" */
    CHECK_EQ(fy_sys_set("open", (fy_sys_fn)open_no_max), 0);
    memset(&m, 0x5A, sizeof m);
    CHECK_EQ(fy_cgroup_read(&m), -EACCES);
    CHECK_EQ(m.limited, 0);
    CHECK_EQ(m.current, 0);
    CHECK_EQ(m.path[0], '\0');
    avail = 77;
    strcpy(source, "x");
    CHECK_EQ(fy_host_available(&avail, source, sizeof source), -EACCES);
    CHECK_EQ(avail, 0);
    CHECK_EQ(source[0], '\0');
    CHECK_EQ(count_fds(), fds);
    fy_sys_reset();

    /* a byte per read: the same answers */
    atomic_store(&calls, 0);
    CHECK_EQ(fy_sys_set("read", (fy_sys_fn)one_byte_read), 0);
    CHECK_EQ(fy_cgroup_read(&m), 0);
    CHECK_EQ(m.limit, 4194304);
    CHECK_EQ(m.current, 1048576);
    CHECK_EQ(fy_host_available(&avail, source, sizeof source), 0);
    CHECK_EQ(avail, 3145728);
    CHECK(atomic_load(&calls) > 40);

    /* reads fail: -EIO, every file closed */
    CHECK_EQ(fy_sys_set("read", (fy_sys_fn)fail_read), 0);
    CHECK_EQ(fy_cgroup_read(&m), -EIO);
    CHECK_EQ(fy_host_available(&avail, source, sizeof source), -EIO);
    CHECK_EQ(count_fds(), fds);
    fy_sys_reset();

    /* these reads are not counted fault points (the sampler makes them at
     * any moment); nor are reopen, mincore, fstat_size and close */
    fy_fault_arm(1, EIO);
    CHECK_EQ(fy_cgroup_read(&m), 0);
    CHECK_EQ(fy_host_available(&avail, source, sizeof source), 0);
    CHECK(!fy_fault_fired());
    fy_fault_arm(0, 0);

    fy_memstat_set_roots(NULL, NULL);
}

static void test_uncounted(void)
{
    char p[PATH_MAX];
    path_of(p, sizeof p, "u.safetensors");
    make_st("u.safetensors");
    fy_err err;
    fy_err_init(&err);
    int fd = -1;
    uint64_t size = 0, sz = 0;
    CHECK_EQ(fy_open_ro(p, &fd, &size, &err), 0);
    void *map = NULL;
    CHECK_EQ(fy_map_ro(fd, size, &map), 0);
    unsigned char vec[4];
    fy_fault_arm(1, EIO);
    int r = fy_reopen_ro(fd, p);
    CHECK(r >= 0);
    CHECK_EQ(fy_close(r), 0);
    CHECK_EQ(fy_fstat_size(fd, &sz), 0);
    if (map) CHECK_EQ(fy_mincore(map, (size_t)size, vec), 0);
    fy_unmap(map, size);
    CHECK(!fy_fault_fired());
    /* the next counted call takes it */
    CHECK_EQ(fy_pread_full(fd, vec, 1, 0), -EIO);
    CHECK(fy_fault_fired());
    fy_fault_arm(0, 0);
    CHECK_EQ(fy_close(fd), 0);
}

/* ---- replacing entries while other threads call through them ---- */

static atomic_int stop;
static int shared_fd = -1;
static atomic_int bad;

static void *reader(void *arg)
{
    (void)arg;
    uint8_t buf[64];
    while (!atomic_load(&stop)) {
        if (fy_pread_full(shared_fd, buf, sizeof buf, 0) != 0) atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void test_threads(void)
{
    char p[PATH_MAX];
    path_of(p, sizeof p, "t.safetensors");
    make_st("t.safetensors");
    fy_err err;
    fy_err_init(&err);
    uint64_t size;
    CHECK_EQ(fy_open_ro(p, &shared_fd, &size, &err), 0);
    pthread_t th[4];
    int started = 0;
    for (; started < 4; started++)
        if (pthread_create(&th[started], NULL, reader, NULL) != 0) break;
    CHECK(started > 0);
    for (int i = 0; i < 2000; i++) {
        fy_sys_set("pread", (fy_sys_fn)short_pread);
        fy_sys_reset();
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    CHECK_EQ(atomic_load(&bad), 0);
    fy_close(shared_fd);
}

/* `test_io CASE` runs one of these, `--list` names them (check.h); main makes
 * the temp dir and the ctx they share and remembers the real calls. */
static ferry_ctx *ctx;
#define CASES(CASE)                         \
    CASE(table, test_table())               \
    CASE(reads, if (ctx) test_reads(ctx))   \
    CASE(mincore, test_mincore())           \
    CASE(unmap_gently, test_unmap_gently()) \
    CASE(convert, test_convert())           \
    CASE(spill, test_spill())               \
    CASE(memstat, test_memstat())           \
    CASE(uncounted, test_uncounted())       \
    CASE(threads, test_threads())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "io") < 0) return 1;
    real_pread = (pread_fn *)fy_sys_get("pread");
    real_read = (rw_fn *)fy_sys_get("read");
    real_write = (write_fn *)fy_sys_get("write");
    real_open = (open_fn *)fy_sys_get("open");
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
