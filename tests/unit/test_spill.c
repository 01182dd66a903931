/* SPDX-License-Identifier: Apache-2.0 */
/* test_spill.c - the spill file on a real disk: reservation, best-fit reuse,
 * merging, tail truncation, hole punching, tmpfs refusal, free-space checks
 * (one range, and a whole batch's), a failed batch taken back exactly,
 * fault loops over every system call and allocation, and kill -9 leaving
 * nothing behind. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "fds.h"
#include "common/common.h"
#include "io/io.h"
#include "resid/spill.h"

#define K 4096ull
#define MiB (1024ull * 1024ull)
#define TMPFS_MAGIC_ 0x01021994L
#define RAMFS_MAGIC_ 0x858458f6L

/* ---- helpers ------------------------------------------------------------ */

static const ferry_allocator counting_allocator = COUNTING_ALLOCATOR_INIT;
static fy_err err;
static char base[PATH_MAX]; /* a disk-backed directory for the test's own temp dirs */

static const char *msg(void)
{
    return err.msg;
}


static bool dir_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return false;
    bool empty = true;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

static void make_dir(char *out, size_t n, const char *parent)
{
    if (snprintf(out, n, "%s/ferry-spill-XXXXXX", parent) >= (int)n || !mkdtemp(out)) {
        perror(out);
        exit(1);
    }
}

static bool on_ram_fs(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) < 0) return true;
    return (long)sf.f_type == TMPFS_MAGIC_ || (long)sf.f_type == RAMFS_MAGIC_;
}

static struct stat fst(int fd)
{
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) < 0) perror("fstat");
    return st;
}

static uint64_t used(const rs_spill *s)
{
    uint64_t r;
    rs_spill_usage(s, &r, NULL);
    return r;
}
static uint64_t fsize(const rs_spill *s)
{
    uint64_t z;
    rs_spill_usage(s, NULL, &z);
    return z;
}

/* Fill [off, off+len) with bytes derived from seed, and check them. */
static void fill(int fd, uint64_t off, uint64_t len, unsigned seed)
{
    unsigned char *b = malloc(len);
    for (uint64_t i = 0; i < len; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 12));
    CHECK_EQ(fy_pwrite_full(fd, b, len, off), 0);
    free(b);
}
static bool holds(int fd, uint64_t off, uint64_t len, unsigned seed)
{
    unsigned char *b = malloc(len);
    bool ok = pread(fd, b, len, (off_t)off) == (ssize_t)len;
    for (uint64_t i = 0; ok && i < len; i++) ok = b[i] == (unsigned char)(seed * 131u + i * 7u + (i >> 12));
    free(b);
    return ok;
}

static rs_spill *open_in(const char *d)
{
    rs_spill *s = NULL;
    int rc = rs_spill_open(d, &counting_allocator, &err, &s);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "open %s: %s\n", d, msg());
    return s;
}

/* ---- tests -------------------------------------------------------------- */

static void test_basic(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int fds = count_fds();
    rs_spill *s = open_in(d);
    if (!s) return;
    CHECK(dir_empty(d)); /* unnamed from the start */
    CHECK(strcmp(rs_spill_dir(s), d) == 0);
    CHECK(rs_spill_fd(s) >= 0);
    CHECK_EQ(used(s), 0);
    CHECK_EQ(fsize(s), 0);
    CHECK_EQ(fst(rs_spill_fd(s)).st_size, 0);

    /* Alignment: lengths round up, offsets stay aligned. */
    static const uint64_t lens[] = {1, 4095, 4096, 4097, 5000, 3 * 4096 + 1, 1 * MiB, 12345};
    uint64_t offs[8], total = 0;
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(rs_spill_reserve(s, lens[i], &offs[i]), 0);
        uint64_t r = (lens[i] + K - 1) / K * K;
        CHECK_EQ(offs[i] % RS_SPILL_ALIGN, 0);
        CHECK_EQ(offs[i], total); /* nothing free yet: the file grows */
        total += r;
        CHECK_EQ(used(s), total);
        CHECK_EQ(fsize(s), total);
        CHECK_EQ(fst(rs_spill_fd(s)).st_size, (long long)total);
    }
    /* Reserved means allocated: the blocks exist before anything is written. */
    CHECK((uint64_t)fst(rs_spill_fd(s)).st_blocks * 512 >= total);

    for (int i = 0; i < 8; i++) fill(rs_spill_fd(s), offs[i], lens[i], (unsigned)i + 1);
    for (int i = 0; i < 8; i++) CHECK(holds(rs_spill_fd(s), offs[i], lens[i], (unsigned)i + 1));

    /* Invalid requests and releases change nothing. */
    uint64_t o = 77;
    CHECK_EQ(rs_spill_reserve(s, 0, &o), FERRY_E_INVAL);
    CHECK_STR_HAS(msg(), d);
    CHECK_EQ(o, 77);
    CHECK_EQ(rs_spill_reserve(s, UINT64_MAX, &o), -EFBIG);
    CHECK_EQ(rs_spill_reserve(s, (uint64_t)INT64_MAX, &o), -EFBIG); /* rounds up past the limit */
    rs_spill_release(s, offs[1] + 1, K);                            /* unaligned */
    rs_spill_release(s, total, K);                                  /* past the end */
    rs_spill_release(s, total - K, 2 * K);                          /* runs past the end */
    CHECK_EQ(used(s), total);
    CHECK_EQ(fsize(s), total);
    rs_spill_release(s, offs[2], lens[2]);
    rs_spill_release(s, offs[2], lens[2]); /* twice: ignored */
    CHECK_EQ(used(s), total - K);
    rs_spill_release(s, offs[1], 2 * K); /* overlaps the free range: ignored */
    CHECK_EQ(used(s), total - K);
    CHECK(holds(rs_spill_fd(s), offs[3], lens[3], 4)); /* neighbours untouched */
    CHECK(holds(rs_spill_fd(s), offs[1], lens[1], 2));

    for (int i = 0; i < 8; i++)
        if (i != 2) rs_spill_release(s, offs[i], lens[i]);
    CHECK_EQ(used(s), 0);
    CHECK_EQ(fsize(s), 0);
    CHECK_EQ(fst(rs_spill_fd(s)).st_size, 0);
    rs_spill_close(s);
    rs_spill_close(NULL);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(count_fds(), fds);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

static void test_reuse_merge_truncate(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    int fd = rs_spill_fd(s);
    /*        A     B      C      D     E      F   */
    static const uint64_t len[] = {16 * K, 64 * K, 32 * K, 16 * K, 64 * K, 4 * K};
    uint64_t off[6];
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(rs_spill_reserve(s, len[i], &off[i]), 0);
        fill(fd, off[i], len[i], (unsigned)i + 10);
    }
    CHECK_EQ(off[5], 192 * K);
    CHECK_EQ(fsize(s), 196 * K);

    /* Holes: B [16K,80K) and D [112K,128K). */
    rs_spill_release(s, off[1], len[1]);
    rs_spill_release(s, off[3], len[3]);
    CHECK_EQ(used(s), 196 * K - 80 * K);
    CHECK_EQ(fsize(s), 196 * K); /* holes inside the file do not shrink it */
    CHECK_EQ(fst(fd).st_size, (long long)(196 * K));

    /* Best fit: 12K goes into D's 16K hole, not B's 64K one (first fit would). */
    uint64_t x, y, z;
    CHECK_EQ(rs_spill_reserve(s, 12 * K, &x), 0);
    CHECK_EQ(x, 112 * K);
    /* The 4K left of D's hole is the best fit for 4K. */
    CHECK_EQ(rs_spill_reserve(s, 4 * K, &y), 0);
    CHECK_EQ(y, 124 * K);
    /* 8K now only fits in B's hole, at its start. */
    CHECK_EQ(rs_spill_reserve(s, 8 * K, &z), 0);
    CHECK_EQ(z, 16 * K);
    CHECK_EQ(fsize(s), 196 * K); /* all reused, no growth */
    fill(fd, x, 12 * K, 20);
    fill(fd, y, 4 * K, 21);
    fill(fd, z, 8 * K, 22);
    /* 80K fits in no hole: the file grows. */
    uint64_t g;
    CHECK_EQ(rs_spill_reserve(s, 80 * K, &g), 0);
    CHECK_EQ(g, 196 * K);
    CHECK_EQ(fsize(s), 276 * K);
    rs_spill_release(s, g, 80 * K); /* a tail: cut off again */
    CHECK_EQ(fsize(s), 196 * K);
    CHECK_EQ(fst(fd).st_size, (long long)(196 * K));

    /* Merging: z with the rest of B's hole, then A before it, then C after:
     * one free range [0,112K), which a 112K request must get whole. */
    rs_spill_release(s, z, 8 * K);
    rs_spill_release(s, off[0], len[0]);
    rs_spill_release(s, off[2], len[2]);
    CHECK_EQ(fsize(s), 196 * K);
    uint64_t m;
    CHECK_EQ(rs_spill_reserve(s, 112 * K, &m), 0);
    CHECK_EQ(m, 0);
    CHECK_EQ(fsize(s), 196 * K);
    fill(fd, m, 112 * K, 30);
    rs_spill_release(s, m, 112 * K);

    /* Tail truncation: F alone, then E, then x and y which join the free
     * range [0,112K) and the tail: the file goes back to nothing. */
    CHECK(holds(fd, off[4], len[4], 14));
    rs_spill_release(s, off[5], len[5]);
    CHECK_EQ(fsize(s), 192 * K);
    CHECK_EQ(fst(fd).st_size, (long long)(192 * K));
    rs_spill_release(s, off[4], len[4]);
    CHECK_EQ(fsize(s), 128 * K);
    CHECK_EQ(fst(fd).st_size, (long long)(128 * K));
    CHECK(holds(fd, x, 12 * K, 20));
    CHECK(holds(fd, y, 4 * K, 21));
    rs_spill_release(s, x, 12 * K); /* merges with [0,112K); y still holds the end */
    CHECK_EQ(fsize(s), 128 * K);
    rs_spill_release(s, y, 4 * K);
    CHECK_EQ(fsize(s), 0);
    CHECK_EQ(used(s), 0);
    CHECK_EQ(fst(fd).st_size, 0);
    CHECK_EQ(fst(fd).st_blocks, 0);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

static void test_punch(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    int fd = rs_spill_fd(s);
    uint64_t o[3];
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(rs_spill_reserve(s, 4 * MiB, &o[i]), 0);
        fill(fd, o[i], 4 * MiB, (unsigned)i + 40);
    }
    long long before = (long long)fst(fd).st_blocks * 512;
    CHECK(before >= (long long)(12 * MiB));
    rs_spill_release(s, o[1], 4 * MiB);
    long long after = (long long)fst(fd).st_blocks * 512;
    CHECK(before - after >= (long long)(4 * MiB));    /* the middle range's blocks are gone */
    CHECK_EQ(fst(fd).st_size, (long long)(12 * MiB)); /* but the file keeps its size */
    /* The hole reads as zeros, its neighbours as written. */
    unsigned char *z = malloc(4 * MiB), *zero = calloc(1, 4 * MiB);
    CHECK(pread(fd, z, 4 * MiB, (off_t)o[1]) == (ssize_t)(4 * MiB) && memcmp(z, zero, 4 * MiB) == 0);
    free(z);
    free(zero);
    CHECK(holds(fd, o[0], 4 * MiB, 40));
    CHECK(holds(fd, o[2], 4 * MiB, 42));
    /* Reuse takes the blocks back before anything is written. */
    uint64_t r;
    CHECK_EQ(rs_spill_reserve(s, 4 * MiB, &r), 0);
    CHECK_EQ(r, o[1]);
    CHECK((long long)fst(fd).st_blocks * 512 >= after + (long long)(4 * MiB));
    fill(fd, r, 4 * MiB, 50);
    CHECK(holds(fd, r, 4 * MiB, 50));
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

/* Random reserves and releases against a page map: every offset must be the
 * best fit the contract describes, ranges never overlap, data survives, and
 * the file ends where the last reserved range ends. */
#define MODEL_PAGES 16384
static void test_model(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    int fd = rs_spill_fd(s);
    static unsigned char page[MODEL_PAGES]; /* 0 free, else 1 */
    struct {
        uint64_t off, len;
        unsigned seed;
    } live_r[256];
    int nl = 0;
    uint64_t reserved = 0, size = 0;
    unsigned rng = 12345;
    int bad_fit = 0, bad_data = 0, bad_usage = 0;
    for (int step = 0; step < 1500; step++) {
        rng = rng * 1103515245u + 12345u;
        bool add = nl == 0 || (nl < 256 && (rng >> 16) % 100 < 55);
        if (add) {
            rng = rng * 1103515245u + 12345u;
            uint64_t pages = 1 + (rng >> 16) % 24;
            uint64_t bytes = pages * K - ((rng >> 8) % 2 ? (rng >> 20) % K : 0);
            /* expected: smallest free run inside the file that fits, lowest first */
            uint64_t best_off = size / K, best_len = UINT64_MAX;
            for (uint64_t p = 0; p < size / K;) {
                if (page[p]) {
                    p++;
                    continue;
                }
                uint64_t q = p;
                while (q < size / K && !page[q]) q++;
                if (q - p >= pages && q - p < best_len) {
                    best_len = q - p;
                    best_off = p;
                }
                p = q;
            }
            uint64_t off;
            int rc = rs_spill_reserve(s, bytes, &off);
            CHECK_EQ(rc, 0);
            if (rc) break;
            if (off != best_off * K) bad_fit++;
            for (uint64_t p = off / K; p < off / K + pages; p++) {
                if (p >= MODEL_PAGES || page[p]) {
                    bad_fit++;
                    break;
                }
                page[p] = 1;
            }
            if (off + pages * K > size) size = off + pages * K;
            reserved += pages * K;
            unsigned seed = (unsigned)step;
            fill(fd, off, bytes, seed);
            live_r[nl].off = off;
            live_r[nl].len = bytes;
            live_r[nl].seed = seed;
            nl++;
        } else {
            rng = rng * 1103515245u + 12345u;
            int i = (int)((rng >> 16) % (unsigned)nl);
            if (!holds(fd, live_r[i].off, live_r[i].len, live_r[i].seed)) bad_data++;
            uint64_t pages = (live_r[i].len + K - 1) / K;
            rs_spill_release(s, live_r[i].off, live_r[i].len);
            for (uint64_t p = live_r[i].off / K; p < live_r[i].off / K + pages; p++) page[p] = 0;
            reserved -= pages * K;
            while (size && !page[size / K - 1]) size -= K;
            live_r[i] = live_r[--nl];
        }
        if (used(s) != reserved || fsize(s) != size || (uint64_t)fst(fd).st_size != size) bad_usage++;
    }
    CHECK_EQ(bad_fit, 0);
    CHECK_EQ(bad_data, 0);
    CHECK_EQ(bad_usage, 0);
    while (nl) {
        nl--;
        CHECK(holds(fd, live_r[nl].off, live_r[nl].len, live_r[nl].seed));
        rs_spill_release(s, live_r[nl].off, live_r[nl].len);
    }
    CHECK_EQ(used(s), 0);
    CHECK_EQ(fsize(s), 0);
    CHECK_EQ(fst(fd).st_size, 0);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

static void test_refusals(void)
{
    /* tmpfs */
    struct statfs sf;
    if (statfs("/dev/shm", &sf) == 0 && (long)sf.f_type == TMPFS_MAGIC_) {
        char d[PATH_MAX];
        make_dir(d, sizeof d, "/dev/shm");
        rs_spill *s = (rs_spill *)&err; /* must be reset */
        int fds = count_fds();
        CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), FERRY_E_INVAL);
        CHECK(s == NULL);
        CHECK_STR_HAS(msg(), d);
        CHECK_STR_HAS(msg(), "tmpfs");
        CHECK_STR_HAS(msg(), "RAM");
        CHECK_EQ(atomic_load(&live), 0);
        CHECK_EQ(count_fds(), fds);
        CHECK(dir_empty(d));
        CHECK_EQ(rmdir(d), 0);
    } else {
        printf("note: /dev/shm missing or not tmpfs: tmpfs refusal not checked\n");
    }

    /* A directory that does not exist. */
    char d[PATH_MAX + 32];
    snprintf(d, sizeof d, "%s/no-such-dir-%d/deeper", base, (int)getpid());
    rs_spill *s = NULL;
    CHECK_EQ(rs_spill_open(d, &counting_allocator, &err, &s), -ENOENT);
    CHECK(s == NULL);
    CHECK_STR_HAS(msg(), d);
    CHECK_EQ(atomic_load(&live), 0);

    /* A regular file, not a directory. */
    snprintf(d, sizeof d, "%s/not-a-dir-%d", base, (int)getpid());
    int f = open(d, O_CREAT | O_WRONLY | O_EXCL, 0600);
    CHECK(f >= 0);
    close(f);
    int rc = rs_spill_open(d, &counting_allocator, &err, &s);
    CHECK(rc < 0);
    CHECK(s == NULL);
    CHECK_STR_HAS(msg(), d);
    CHECK_EQ(atomic_load(&live), 0);
    unlink(d);

    /* Bad arguments. */
    CHECK_EQ(rs_spill_open(NULL, NULL, &err, &s), FERRY_E_INVAL);
    CHECK_EQ(rs_spill_open("", NULL, &err, &s), FERRY_E_INVAL);
    CHECK_EQ(rs_spill_open(base, NULL, &err, NULL), FERRY_E_INVAL);
}

/* Where O_TMPFILE is refused the file is named for an instant and unlinked. */
static void test_fallback(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = NULL;
    fy_fault_arm(1, EOPNOTSUPP);
    int rc = rs_spill_open(d, &counting_allocator, &err, &s);
    bool fired = fy_fault_fired();
    fy_fault_arm(0, 0);
    CHECK_EQ(rc, 0);
    CHECK(fired);
    CHECK(dir_empty(d));
    if (s) {
        uint64_t o;
        CHECK_EQ(rs_spill_reserve(s, 3 * K, &o), 0);
        fill(rs_spill_fd(s), o, 3 * K, 7);
        CHECK(holds(rs_spill_fd(s), o, 3 * K, 7));
        CHECK(dir_empty(d));
        rs_spill_close(s);
    }
    /* Older kernels answer EISDIR for an unknown O_TMPFILE. */
    fy_fault_arm(1, EISDIR);
    rc = rs_spill_open(d, &counting_allocator, &err, &s);
    fy_fault_arm(0, 0);
    CHECK_EQ(rc, 0);
    rs_spill_close(s);
    CHECK(dir_empty(d));
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

static void test_enospc(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    uint64_t o;
    CHECK_EQ(rs_spill_reserve(s, 8 * K, &o), 0);
    struct stat st0 = fst(rs_spill_fd(s));
    struct statvfs sv;
    CHECK_EQ(statvfs(d, &sv), 0);
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    uint64_t ask = avail + 1024 * MiB;
    err.msg[0] = '\0';
    CHECK_EQ(rs_spill_reserve(s, ask, &o), -ENOSPC);
    CHECK_STR_HAS(msg(), d);
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)((ask + K - 1) / K * K));
    CHECK_STR_HAS(msg(), num); /* the bytes needed */
    CHECK_STR_HAS(msg(), "free");
    CHECK_EQ(used(s), 8 * K);
    CHECK_EQ(fsize(s), 8 * K);
    struct stat st1 = fst(rs_spill_fd(s));
    CHECK_EQ(st1.st_size, st0.st_size);
    CHECK_EQ(st1.st_blocks, st0.st_blocks);
    /* A request the disk can hold still works afterwards. */
    CHECK_EQ(rs_spill_reserve(s, 8 * K, &o), 0);
    CHECK_EQ(o, 8 * K);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

/* A failed batch is taken back with rs_spill_unreserve, last range first:
 * the file's size, its blocks and its free ranges are as before the batch
 * (the same batch reserved again lands on the same offsets), whether its
 * ranges reused holes, grew the file, or both; also while holding, where the
 * reused ranges are punched (fallocate may have filled them) and no more. */
static void test_unreserve(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    for (int holding = 0; holding < 2; holding++) {
        rs_spill *s = open_in(d);
        if (!s) return;
        int fd = rs_spill_fd(s);
        /* in pages: live [0,16) free [16,48) live [48,56) free [56,88) live [88,96) [96,116) */
        uint64_t o[6];
        static const uint64_t lens[6] = {16 * K, 32 * K, 8 * K, 32 * K, 8 * K, 20 * K};
        for (int i = 0; i < 6; i++) {
            CHECK_EQ(rs_spill_reserve(s, lens[i], &o[i]), 0);
            fill(fd, o[i], lens[i], (unsigned)i + 1);
        }
        if (holding) rs_spill_hold(s); /* the freed ranges keep their blocks */
        rs_spill_release(s, o[1], lens[1]);
        rs_spill_release(s, o[3], lens[3]);
        uint64_t r0 = used(s), z0 = fsize(s);
        struct stat st0 = fst(fd);
        CHECK_EQ(z0, 116 * K);
        /* a batch: the first hole whole, part of the second, growing, and
         * the second hole again (unaligned: two pages) */
        static const uint64_t blen[4] = {32 * K, 12 * K, 64 * K, 5000};
        uint64_t bo[4], again[4];
        for (int round = 0; round < 2; round++) {
            for (int i = 0; i < 4; i++) CHECK_EQ(rs_spill_reserve(s, blen[i], round ? &again[i] : &bo[i]), 0);
            CHECK_EQ(fsize(s), 116 * K + 64 * K);
            CHECK((uint64_t)fst(fd).st_blocks * 512 >= (52 + 110) * K); /* the live ranges and the batch */
            for (int i = 4; i-- > 0;) rs_spill_unreserve(s, round ? again[i] : bo[i], blen[i]);
            CHECK_EQ(used(s), r0);
            CHECK_EQ(fsize(s), z0);
            struct stat st1 = fst(fd);
            CHECK_EQ(st1.st_size, st0.st_size);
            if (holding)
                CHECK(st1.st_blocks <= st0.st_blocks + 8); /* the reused ranges punched, nothing kept */
            /* as before, but for one block of the file system's own metadata:
             * ext4 keeps an extent-tree block once a file had more than four
             * extents, even after the punch and truncate (seen under CI) */
            else CHECK(st1.st_blocks >= st0.st_blocks && st1.st_blocks <= st0.st_blocks + 8);
        }
        for (int i = 0; i < 4; i++) CHECK_EQ(again[i], bo[i]); /* the same free ranges: the same best fits */
        CHECK_EQ(bo[0], o[1]);
        CHECK_EQ(bo[1], o[3]);
        CHECK_EQ(bo[2], 116 * K);
        CHECK_EQ(bo[3], o[3] + 12 * K);
        for (int i = 0; i < 6; i++)
            if (i != 1 && i != 3)
                CHECK(holds(fd, o[i], lens[i], (unsigned)i + 1)); /* the live ranges untouched */
        /* nonsense is ignored: unaligned, past the end, overlapping a free range */
        rs_spill_unreserve(s, o[0] + 1, K);
        rs_spill_unreserve(s, z0, K);
        rs_spill_unreserve(s, o[1], K);
        rs_spill_unreserve(s, o[0], 0);
        rs_spill_unreserve(NULL, 0, K);
        CHECK_EQ(used(s), r0);
        CHECK_EQ(fsize(s), z0);
        uint64_t t;
        rs_spill_release(s, o[5], lens[5]); /* holding: a free tail, kept */
        if (holding) {
            /* taking back a free tail that was reused whole: cut off rather
             * than kept (the next flush would cut it anyway) */
            CHECK_EQ(fsize(s), z0);
            CHECK_EQ(rs_spill_reserve(s, lens[5], &t), 0);
            CHECK_EQ(t, o[5]);
            rs_spill_unreserve(s, t, lens[5]);
        }
        CHECK_EQ(fsize(s), o[5]);
        CHECK_EQ(fst(fd).st_size, (long long)o[5]);
        CHECK_EQ(rs_spill_reserve(s, 2 * K, &t), 0);
        CHECK_EQ(t, o[1]);
        rs_spill_unreserve(s, t, 2 * K);
        CHECK_EQ(fsize(s), o[5]);
        CHECK_EQ(used(s), r0 - lens[5]);
        for (int i = 0; i < 6; i++)
            if (i != 1 && i != 3 && i != 5) rs_spill_release(s, o[i], lens[i]);
        if (holding) rs_spill_flush(s);
        CHECK_EQ(used(s), 0);
        CHECK_EQ(fsize(s), 0);
        CHECK_EQ(fst(fd).st_size, 0);
        CHECK_EQ(fst(fd).st_blocks, 0);
        rs_spill_close(s);
    }
    CHECK_EQ(atomic_load(&live), 0);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

/* Taking a batch back never allocates and survives failing punches and
 * truncates: the books stay true to the file. */
static void test_unreserve_faults(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int n, failed = 0;
    for (n = 1; n < 100; n++) {
        rs_spill *s = open_in(d);
        if (!s) return;
        int fd = rs_spill_fd(s);
        uint64_t a, b, h, x, y;
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &a), 0);
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &h), 0);
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &b), 0);
        rs_spill_release(s, h, 8 * K);
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &x), 0); /* the hole */
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &y), 0); /* growing */
        CHECK_EQ(x, h);
        alloc_arm(1);
        fy_fault_arm(n, EIO);
        rs_spill_unreserve(s, y, 8 * K);
        rs_spill_unreserve(s, x, 8 * K);
        bool fired = fy_fault_fired();
        fy_fault_arm(0, 0);
        CHECK(!atomic_load(&alloc_fired));
        alloc_arm(0);
        CHECK_EQ(used(s), 16 * K);
        CHECK_EQ(fsize(s), (uint64_t)fst(fd).st_size);
        if (!fired) CHECK_EQ(fsize(s), 24 * K);
        if (fired && n == 1) CHECK_EQ(fsize(s), 32 * K); /* the truncate failed: the tail kept, free */
        /* everything is reusable and goes away */
        uint64_t r;
        CHECK_EQ(rs_spill_reserve(s, 8 * K, &r), 0);
        CHECK_EQ(r, h);
        rs_spill_release(s, r, 8 * K);
        rs_spill_release(s, a, 8 * K);
        rs_spill_release(s, b, 8 * K);
        CHECK_EQ(used(s), 0);
        CHECK_EQ(fsize(s), 0);
        CHECK_EQ(fst(fd).st_size, 0);
        rs_spill_close(s);
        if (!fired) break;
        failed++;
    }
    CHECK_EQ(failed, 2); /* the truncate of the grown range, the punch of the reused one */
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

/* The batch's free-space check, on what fstatfs says (f_bavail * f_frsize:
 * f_bsize is made different to tell them apart). */
static unsigned long long fake_bavail;
static int fake_statfs_calls;
static int fake_fstatfs(int fd, struct statfs *sf)
{
    if (fstatfs(fd, sf) < 0) return -1;
    fake_statfs_calls++;
    sf->f_frsize = 4096;
    sf->f_bsize = 1 << 20;
    sf->f_bavail = (fsblkcnt_t)fake_bavail;
    return 0;
}

static void test_check_room(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    fake_bavail = 100; /* 400 KiB */
    fake_statfs_calls = 0;
    CHECK_EQ(rs_spill_check_room(s, 100 * K), 0);
    CHECK_EQ(rs_spill_check_room(s, 0), 0);
    CHECK_EQ(fake_statfs_calls, 2);
    err.msg[0] = '\0';
    CHECK_EQ(rs_spill_check_room(s, 100 * K + 1), -ENOSPC);
    CHECK_STR_HAS(msg(), d);
    CHECK_STR_HAS(msg(), "409601 bytes needed");
    CHECK_STR_HAS(msg(), "409600 bytes free");
    CHECK_EQ(fsize(s), 0); /* a check reserves nothing */
    CHECK_EQ(fst(rs_spill_fd(s)).st_size, 0);
    /* while holding, freed ranges may still hold their blocks: they count */
    uint64_t a, b;
    CHECK_EQ(rs_spill_reserve(s, 40 * K, &a), 0);
    CHECK_EQ(rs_spill_reserve(s, 8 * K, &b), 0);
    rs_spill_hold(s);
    rs_spill_release(s, a, 40 * K);
    CHECK_EQ(rs_spill_check_room(s, 140 * K), 0);
    CHECK_EQ(rs_spill_check_room(s, 140 * K + 1), -ENOSPC);
    CHECK_STR_HAS(msg(), "573441 bytes needed");
    CHECK_STR_HAS(msg(), "409600 bytes free");
    CHECK_STR_HAS(msg(), "163840 in the spill file");
    rs_spill_flush(s); /* punched: they count no more */
    CHECK_EQ(rs_spill_check_room(s, 100 * K + 1), -ENOSPC);
    /* no overflow at the extremes */
    fake_bavail = ~0ull >> 8;
    CHECK_EQ(rs_spill_check_room(s, UINT64_MAX), 0); /* f_bavail * f_frsize saturates */
    fy_sys_reset();
    /* fstatfs itself fails: its error, naming the directory */
    fy_fault_arm(1, EIO);
    CHECK_EQ(rs_spill_check_room(s, K), -EIO);
    CHECK(fy_fault_fired());
    fy_fault_arm(0, 0);
    CHECK_STR_HAS(msg(), d);
    CHECK_EQ(rs_spill_check_room(NULL, K), FERRY_E_INVAL);
    /* the real file system: a request past its free space is refused */
    struct statvfs sv;
    CHECK_EQ(statvfs(d, &sv), 0);
    CHECK_EQ(rs_spill_check_room(s, (uint64_t)sv.f_bavail * sv.f_frsize + 1024 * MiB), -ENOSPC);
    CHECK_EQ(rs_spill_check_room(s, K), 0);
    rs_spill_release(s, b, 8 * K);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

/* Fail each faultable call of rs_spill_open in turn. */
static void test_fault_open(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int fds = count_fds();
    int n, failed = 0;
    for (n = 1; n < 100; n++) {
        rs_spill *s = (rs_spill *)&err;
        err.msg[0] = '\0';
        fy_fault_arm(n, EIO);
        int rc = rs_spill_open(d, &counting_allocator, &err, &s);
        bool fired = fy_fault_fired();
        fy_fault_arm(0, 0);
        if (!fired) {
            CHECK_EQ(rc, 0);
            rs_spill_close(s);
            break;
        }
        failed++;
        CHECK_EQ(rc, -EIO);
        CHECK(s == NULL);
        CHECK_STR_HAS(msg(), d);
        CHECK(strchr(msg(), '\n') == NULL);
        CHECK_EQ(atomic_load(&live), 0);
        CHECK_EQ(count_fds(), fds);
        CHECK(dir_empty(d));
    }
    CHECK_EQ(failed, 2); /* O_TMPFILE open, fstatfs */
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(count_fds(), fds);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

/* Fail each allocation of open and of reserve in turn. */
static void test_fault_alloc(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int fds = count_fds();
    int n, failed = 0;
    for (int fallback = 0; fallback < 2; fallback++) {
        for (n = 1; n < 100; n++) {
            rs_spill *s = NULL;
            if (fallback) fy_fault_arm(1, EOPNOTSUPP);
            alloc_arm(n);
            int rc = rs_spill_open(d, &counting_allocator, &err, &s);
            bool hit = atomic_load(&alloc_fired);
            alloc_arm(0);
            fy_fault_arm(0, 0);
            if (!hit) {
                CHECK_EQ(rc, 0);
                rs_spill_close(s);
                break;
            }
            failed++;
            CHECK_EQ(rc, -ENOMEM);
            CHECK(s == NULL);
            CHECK_STR_HAS(msg(), d);
            CHECK_EQ(atomic_load(&live), 0);
            CHECK_EQ(count_fds(), fds);
            CHECK(dir_empty(d));
        }
    }
    CHECK_EQ(failed, 2 + 3); /* struct, dir copy; and the fallback's path */

    rs_spill *s = open_in(d);
    if (!s) return;
    uint64_t o[40];
    failed = 0;
    for (int i = 0; i < 40; i++) {
        for (n = 1; n < 10; n++) {
            alloc_arm(n);
            uint64_t before = used(s), sz = fsize(s);
            int rc = rs_spill_reserve(s, K, &o[i]);
            bool hit = atomic_load(&alloc_fired);
            alloc_arm(0);
            if (!hit) {
                CHECK_EQ(rc, 0);
                break;
            }
            failed++;
            CHECK_EQ(rc, -ENOMEM);
            CHECK_EQ(used(s), before);
            CHECK_EQ(fsize(s), sz);
            CHECK_EQ(fst(rs_spill_fd(s)).st_size, (long long)sz);
        }
    }
    CHECK(failed >= 2); /* the free list's first allocation and at least one growth */
    /* Releasing every other range needs no memory, even with allocation failing. */
    alloc_arm(1);
    for (int i = 0; i < 40; i += 2) rs_spill_release(s, o[i], K);
    CHECK(!atomic_load(&alloc_fired));
    alloc_arm(0);
    CHECK_EQ(used(s), 20 * K);
    for (int i = 1; i < 40; i += 2) rs_spill_release(s, o[i], K);
    CHECK_EQ(fsize(s), 0);
    /* Reserving and releasing over and over does not keep growing the books. */
    alloc_arm(0);
    for (int i = 0; i < 1000; i++) {
        uint64_t a, b;
        CHECK_EQ(rs_spill_reserve(s, K, &a), 0);
        CHECK_EQ(rs_spill_reserve(s, K, &b), 0);
        rs_spill_release(s, a, K);
        rs_spill_release(s, b, K);
    }
    CHECK_EQ(atomic_load(&alloc_calls), 0);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(count_fds(), fds);
    CHECK_EQ(rmdir(d), 0);
}

/* Fail each faultable call of rs_spill_reserve in turn, growing and reusing:
 * a clean error, nothing reserved, the file as it was. */
static void fault_reserve_loop(rs_spill *s, uint64_t len, uint64_t expect_off, int errnum, const char *dir,
                               int expect_failed)
{
    int fd = rs_spill_fd(s);
    int n, failed = 0;
    for (n = 1; n < 100; n++) {
        uint64_t r0 = used(s), z0 = fsize(s);
        struct stat st0 = fst(fd);
        long a0 = atomic_load(&live);
        uint64_t off = 12345;
        err.msg[0] = '\0';
        fy_fault_arm(n, errnum);
        int rc = rs_spill_reserve(s, len, &off);
        bool fired = fy_fault_fired();
        fy_fault_arm(0, 0);
        if (!fired) {
            CHECK_EQ(rc, 0);
            CHECK_EQ(off, expect_off);
            CHECK_EQ(used(s), r0 + len);
            fill(fd, off, len, 99);
            CHECK(holds(fd, off, len, 99));
            rs_spill_release(s, off, len);
            CHECK_EQ(used(s), r0);
            CHECK_EQ(fsize(s), z0);
            break;
        }
        failed++;
        CHECK_EQ(rc, -errnum);
        CHECK_EQ(off, 12345);
        CHECK_STR_HAS(msg(), dir);
        CHECK_EQ(used(s), r0);
        CHECK_EQ(fsize(s), z0);
        struct stat st1 = fst(fd);
        CHECK_EQ(st1.st_size, st0.st_size);
        CHECK_EQ(st1.st_blocks, st0.st_blocks);
        CHECK_EQ(atomic_load(&live), a0);
    }
    CHECK_EQ(failed, expect_failed); /* growing: fstatfs, fallocate; reusing: fallocate */
}

static void test_fault_reserve(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    rs_spill *s = open_in(d);
    if (!s) return;
    uint64_t a, b, c;
    CHECK_EQ(rs_spill_reserve(s, 64 * K, &a), 0);
    CHECK_EQ(rs_spill_reserve(s, 256 * K, &b), 0);
    CHECK_EQ(rs_spill_reserve(s, 64 * K, &c), 0);
    rs_spill_release(s, b, 256 * K); /* a hole to reuse */
    static const int errs[] = {EIO, ENOSPC, EDQUOT};
    for (int e = 0; e < 3; e++) {
        fault_reserve_loop(s, 128 * K, b, errs[e], d, 1);       /* into the hole */
        fault_reserve_loop(s, 2 * MiB, 384 * K, errs[e], d, 2); /* growing: larger than the hole */
    }
    /* Everything is still consistent: the hole is whole, the tail goes. */
    uint64_t h;
    CHECK_EQ(rs_spill_reserve(s, 256 * K, &h), 0);
    CHECK_EQ(h, b);
    rs_spill_release(s, h, 256 * K);
    rs_spill_release(s, a, 64 * K);
    rs_spill_release(s, c, 64 * K);
    CHECK_EQ(used(s), 0);
    CHECK_EQ(fsize(s), 0);
    CHECK_EQ(fst(rs_spill_fd(s)).st_size, 0);
    rs_spill_close(s);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

/* Release never fails, but its punch and truncate can: the range must still
 * come back free and the bookkeeping stay true to the file. */
static void test_fault_release(void)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int n;
    for (int tail = 0; tail < 2; tail++) {
        for (n = 1; n < 100; n++) {
            rs_spill *s = open_in(d);
            if (!s) return;
            int fd = rs_spill_fd(s);
            uint64_t a, b, c = 0;
            CHECK_EQ(rs_spill_reserve(s, 8 * K, &a), 0);
            CHECK_EQ(rs_spill_reserve(s, 8 * K, &b), 0);
            if (!tail) CHECK_EQ(rs_spill_reserve(s, 8 * K, &c), 0);
            fill(fd, b, 8 * K, 3);
            uint64_t r0 = used(s);
            fy_fault_arm(n, EIO);
            rs_spill_release(s, b, 8 * K);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            CHECK_EQ(used(s), r0 - 8 * K);
            CHECK_EQ(fsize(s), (uint64_t)fst(fd).st_size);
            if (tail && !fired) CHECK_EQ(fsize(s), 8 * K);
            if (tail && fired && n == 1) {
                /* truncate failed: the tail stays, its blocks punched instead */
                CHECK_EQ(fsize(s), 16 * K);
                CHECK((uint64_t)fst(fd).st_blocks * 512 <= 8 * K + 4 * K);
            }
            /* The freed range is reused; then everything goes. */
            uint64_t r;
            CHECK_EQ(rs_spill_reserve(s, 8 * K, &r), 0);
            CHECK_EQ(r, b);
            rs_spill_release(s, r, 8 * K);
            rs_spill_release(s, a, 8 * K);
            if (!tail) rs_spill_release(s, c, 8 * K);
            CHECK_EQ(used(s), 0);
            CHECK_EQ(fsize(s), 0);
            CHECK_EQ(fst(fd).st_size, 0);
            rs_spill_close(s);
            if (!fired) break;
        }
        CHECK_EQ(n, 2); /* tail: truncate (then a punch, not counted once truncate fails); middle: punch */
    }
    CHECK_EQ(atomic_load(&live), 0);
    CHECK_EQ(rmdir(d), 0);
}

/* kill -9 of a process holding a spill file with data in it leaves nothing. */
static void test_kill9(int fallback)
{
    char d[PATH_MAX];
    make_dir(d, sizeof d, base);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        CHECK(0);
        return;
    }
    if (pid == 0) {
        close(p[0]);
        alarm(60); /* never outlive a parent that died */
        fy_err e;
        fy_err_init(&e);
        rs_spill *s = NULL;
        int fd = -1;
        if (fallback) fy_fault_arm(1, EOPNOTSUPP);
        int rc = rs_spill_open(d, NULL, &e, &s);
        fy_fault_arm(0, 0);
        uint64_t off = 0;
        if (rc == 0) rc = rs_spill_reserve(s, 8 * MiB, &off);
        char *buf = malloc(8 * MiB);
        if (rc == 0 && buf) {
            memset(buf, 0xA5, 8 * MiB);
            rc = fy_pwrite_full(rs_spill_fd(s), buf, 8 * MiB, off);
        }
        if (rc == 0) rc = fdatasync(rs_spill_fd(s)) < 0 ? -errno : 0;
        if (rc == 0) fd = rs_spill_fd(s);
        else fprintf(stderr, "child: %d %s\n", rc, e.msg);
        if (write(p[1], &fd, sizeof fd) != sizeof fd) _exit(2);
        for (;;) pause();
    }
    close(p[1]);
    int fd = -1;
    CHECK(read(p[0], &fd, sizeof fd) == sizeof fd);
    close(p[0]);
    CHECK(fd >= 0);
    if (fd >= 0) {
        /* The child's file is real and lives in d, though d shows nothing. */
        char link[64], target[PATH_MAX];
        snprintf(link, sizeof link, "/proc/%d/fd/%d", (int)pid, fd);
        struct stat st;
        CHECK_EQ(stat(link, &st), 0);
        CHECK_EQ(st.st_size, (long long)(8 * MiB));
        CHECK((uint64_t)st.st_blocks * 512 >= 8 * MiB);
        ssize_t n = readlink(link, target, sizeof target - 1);
        CHECK(n > 0);
        if (n > 0) {
            target[n] = '\0';
            CHECK(strncmp(target, d, strlen(d)) == 0);
            CHECK_STR_HAS(target, "(deleted)");
        }
        CHECK(dir_empty(d));
    }
    CHECK_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK(dir_empty(d));
    CHECK_EQ(rmdir(d), 0);
}

/* `test_spill CASE` runs one of these, `--list` names them (check.h); each
 * makes its own directory under base. */
#define CASES(CASE)                                         \
    CASE(basic, test_basic())                               \
    CASE(reuse_merge_truncate, test_reuse_merge_truncate()) \
    CASE(punch, test_punch())                               \
    CASE(model, test_model())                               \
    CASE(refusals, test_refusals())                         \
    CASE(fallback, test_fallback())                         \
    CASE(enospc, test_enospc())                             \
    CASE(fault_open, test_fault_open())                     \
    CASE(fault_alloc, test_fault_alloc())                   \
    CASE(fault_reserve, test_fault_reserve())               \
    CASE(fault_release, test_fault_release())               \
    CASE(unreserve, test_unreserve())                       \
    CASE(unreserve_faults, test_unreserve_faults())         \
    CASE(check_room, test_check_room())                     \
    CASE(kill9, test_kill9(0))                              \
    CASE(kill9_fallback, test_kill9(1))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    fy_err_init(&err);
    const char *t = getenv("TMPDIR");
    const char *cand[] = {t && *t ? t : NULL, "/var/tmp"};
    base[0] = '\0';
    for (int i = 0; i < 2; i++)
        if (cand[i] && !on_ram_fs(cand[i])) {
            snprintf(base, sizeof base, "%s", cand[i]);
            break;
        }
    if (!base[0]) {
        printf("skip: neither $TMPDIR nor /var/tmp is on a disk-backed file system\n");
        return 77;
    }
    check_run();
    fy_err_destroy(&err);
    return check_summary();
}
