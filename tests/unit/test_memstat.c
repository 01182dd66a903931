/* SPDX-License-Identifier: Apache-2.0 */
/* test_memstat.c - memstat against fake /proc and cgroup v2 and v1 trees
 * (limits, ancestors, page cache, mounts, malformed files) and against this
 * process (smaps_rollup, its real cgroup, the sampler catching a peak that is
 * gone by the time it stops). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "io/memstat.h"

#define KB 1024ull
#define MIB (1024ull * 1024ull)

static char base[512]; /* mkdtemp root of every fake tree */
static char cur[1024]; /* the current scenario's tree */

static void mkdirs(char *path) /* mkdir -p of path's parent directories */
{
    for (char *p = path + strlen(base) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(path, 0700);
        *p = '/';
    }
}

/* Write cur/rel atomically (temp + rename): the sampler may be reading it. */
static void put_len(const char *rel, const char *data, size_t len)
{
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/%s", cur, rel);
    mkdirs(path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, data, len) == (ssize_t)len);
    close(fd);
    CHECK(rename(tmp, path) == 0);
}
static void put(const char *rel, const char *data)
{
    put_len(rel, data, strlen(data));
}

static void rm(const char *rel)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", cur, rel);
    unlink(path);
}

/* A new empty scenario: cur/proc and cur/cg become the roots. */
static void tree(const char *name)
{
    char proc[PATH_MAX + 8], cg[PATH_MAX + 8];
    snprintf(cur, sizeof cur, "%s/%s", base, name);
    mkdir(cur, 0700);
    snprintf(proc, sizeof proc, "%s/proc", cur);
    snprintf(cg, sizeof cg, "%s/cg", cur);
    mkdir(proc, 0700);
    mkdir(cg, 0700);
    fy_memstat_set_roots(proc, cg);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static const char meminfo_8g[] = "MemTotal:       16384000 kB\n"
                                 "MemFree:         1000000 kB\n"
                                 "MemAvailable:    8388608 kB\n"
                                 "HugePages_Total:       0\n";

static void poison_cg(fy_cgroup_mem *cg)
{
    memset(cg, 0xA5, sizeof *cg);
}

static int cg_zeroed(const fy_cgroup_mem *cg)
{
    return !cg->limited && !cg->limit && !cg->current && !cg->peak && !cg->has_peak && !cg->path[0];
}

static void test_no_cgroup_v2(void)
{
    tree("v1");
    put("proc/self/cgroup", "12:memory:/user.slice\n4:cpu,cpuacct:/\n1:name=systemd:/user.slice\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/user.slice/memory.current", "100\n");               /* not ours to read without a 0:: line */
    put("cg/memory/user.slice/memory.usage_in_bytes", "100\n"); /* nor v1's without mountinfo */
    fy_cgroup_mem cg;
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    CHECK(cg_zeroed(&cg));

    uint64_t avail = 1;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 8388608 * KB);
    CHECK(strcmp(src, "/proc/meminfo MemAvailable") == 0);
    CHECK_EQ(fy_host_available(&avail, NULL, 0), 0); /* source is optional */
    CHECK_EQ(avail, 8388608 * KB);
    char tiny[6];
    CHECK_EQ(fy_host_available(&avail, tiny, sizeof tiny), 0); /* truncated, terminated */
    CHECK(strcmp(tiny, "/proc") == 0);

    /* no /proc/self/cgroup at all: same answer */
    rm("proc/self/cgroup");
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    CHECK(cg_zeroed(&cg));
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 8388608 * KB);

    /* a 0:: line whose cgroup has no memory.current (controller off) */
    put("proc/self/cgroup", "0::/user.slice\n");
    rm("cg/user.slice/memory.current");
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    CHECK(cg_zeroed(&cg));
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_STR_HAS(src, "MemAvailable");

    /* and no meminfo either */
    rm("proc/meminfo");
    avail = 7;
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), -ENOENT);
    CHECK_EQ(avail, 0);
    CHECK_EQ(src[0], '\0');
}

static void test_unlimited(void)
{
    tree("unlimited");
    put("proc/self/cgroup", "0::/a/b\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/a/b/memory.current", "12345\n");
    put("cg/a/b/memory.peak", "20000\n");
    put("cg/a/b/memory.max", "max\n");
    put("cg/a/b/memory.high", "max\n");
    put("cg/a/memory.max", "max\n");
    put("cg/a/memory.high", "max"); /* no newline */
    /* the root cgroup has neither file */
    fy_cgroup_mem cg;
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 0);
    CHECK_EQ(cg.limit, 0);
    CHECK_EQ(cg.current, 12345);
    CHECK_EQ(cg.peak, 20000);
    CHECK_EQ(cg.has_peak, 1);
    CHECK(strcmp(cg.path, "cgroup /a/b: no limit") == 0);

    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 8388608 * KB);
    CHECK(strcmp(src, "/proc/meminfo MemAvailable") == 0);

    /* the root cgroup itself */
    put("proc/self/cgroup", "0::/\n");
    put("cg/memory.current", "777\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 0);
    CHECK_EQ(cg.current, 777);
    CHECK_EQ(cg.has_peak, 0);
    CHECK(strcmp(cg.path, "cgroup /: no limit") == 0);
}

static void test_own_limit(void)
{
    tree("own");
    put("proc/self/cgroup", "1:name=systemd:/x\n0::/a/b\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/a/b/memory.current", "104857600\n");
    put("cg/a/b/memory.peak", "209715200\n");
    put("cg/a/b/memory.max", "1073741824\n");
    put("cg/a/b/memory.high", "max\n");
    put("cg/a/memory.max", "max\n");
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 1);
    CHECK_EQ(cg.limit, 1073741824);
    CHECK_EQ(cg.current, 104857600);
    CHECK_EQ(cg.peak, 209715200);
    CHECK(strcmp(cg.path, "cgroup /a/b: memory.max") == 0);

    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1073741824ull - 104857600ull);
    CHECK(strcmp(src, "cgroup /a/b: memory.max") == 0);

    /* limited, and meminfo unreadable: the cgroup's room still stands */
    rm("proc/meminfo");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1073741824ull - 104857600ull);
    CHECK(strcmp(src, "cgroup /a/b: memory.max") == 0);

    /* equal max and high at one level: memory.max is named */
    put("cg/a/b/memory.high", "1073741824\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strcmp(cg.path, "cgroup /a/b: memory.max") == 0);
}

static void test_ancestor_limit(void)
{
    tree("ancestor");
    put("proc/self/cgroup", "0::/a/b/c\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/a/b/c/memory.current", "1048576\n");
    put("cg/a/b/c/memory.max", "2147483648\n");
    /* b has no memory.max at all: no limit at that level */
    put("cg/a/memory.max", "536870912\n");
    put("cg/memory.max", "1073741824\n"); /* looser, higher up */
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 1);
    CHECK_EQ(cg.limit, 536870912);
    CHECK_EQ(cg.current, 1048576); /* its own, not the ancestor's */
    CHECK(strcmp(cg.path, "cgroup /a: memory.max") == 0);

    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 536870912ull - 1048576ull);
    CHECK(strcmp(src, "cgroup /a: memory.max") == 0);

    /* a limit at the very root counts as well */
    put("cg/memory.max", "1000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 1000);
    CHECK(strcmp(cg.path, "cgroup /: memory.max") == 0);
}

static void test_high_below_max(void)
{
    tree("high");
    put("proc/self/cgroup", "0::/svc\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/svc/memory.current", "0\n");
    put("cg/svc/memory.max", "1073741824\n");
    put("cg/svc/memory.high", "805306368\n");
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 1);
    CHECK_EQ(cg.limit, 805306368);
    CHECK(strcmp(cg.path, "cgroup /svc: memory.high") == 0);
    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 805306368);
    CHECK(strcmp(src, "cgroup /svc: memory.high") == 0);

    /* only memory.high set, memory.max "max" */
    put("cg/svc/memory.max", "max\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 805306368);
    CHECK_STR_HAS(cg.path, "memory.high");
}

static void test_missing_peak(void)
{
    tree("nopeak");
    put("proc/self/cgroup", "0::/a\n");
    put("cg/a/memory.current", "4096\n");
    put("cg/a/memory.max", "8192\n");
    fy_cgroup_mem cg;
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.has_peak, 0);
    CHECK_EQ(cg.peak, 0);
    CHECK_EQ(cg.current, 4096);
    CHECK_EQ(cg.limit, 8192);
}

static void test_over_limit(void)
{
    tree("over");
    put("proc/self/cgroup", "0::/a\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/a/memory.current", "2000000\n");
    put("cg/a/memory.max", "1000000\n");
    uint64_t avail = 1;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 0);
    CHECK(strcmp(src, "cgroup /a: memory.max") == 0);
    put("cg/a/memory.current", "1000000\n"); /* exactly at the limit */
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 0);
}

static void test_host_lower(void)
{
    tree("hostlow");
    put("proc/self/cgroup", "0::/a/b\n");
    put("proc/meminfo", "MemTotal: 100000 kB\nMemAvailable:  1024 kB\n");
    put("cg/a/b/memory.current", "1048576\n");
    put("cg/a/memory.max", "1073741824\n");
    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1024 * KB);
    CHECK(strcmp(src, "cgroup /a: memory.max (host MemAvailable is lower)") == 0);

    /* equal: the cgroup is named alone */
    put("proc/meminfo", "MemAvailable: 1047552 kB\n"); /* == 1 GiB - 1 MiB */
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1073741824ull - 1048576ull);
    CHECK(strcmp(src, "cgroup /a: memory.max") == 0);
}

static void test_malformed_cgroup(void)
{
    tree("badcg");
    put("proc/meminfo", meminfo_8g);
    put("proc/self/cgroup", "0::/a\n");
    put("cg/a/memory.current", "100\n");
    fy_cgroup_mem cg;
    uint64_t avail;
    char src[128];

    static const char *const bad_max[] = {
        "12abc\n",
        "-1\n",
        "",
        "\n",
        " 12\n",
        "1 2\n",
        "0x10\n",
        "maximum\n",
        "max max\n",
        "18446744073709551616\n",                      /* 2^64 */
        "99999999999999999999999999999999999999999\n", /* long */
        "1111111111111111111111111111111111111111111111111111111111111111111111111111\n",
    };
    for (size_t i = 0; i < sizeof bad_max / sizeof *bad_max; i++) {
        put("cg/a/memory.max", bad_max[i]);
        poison_cg(&cg);
        int rc = fy_cgroup_read(&cg);
        CHECK_EQ(rc, -EINVAL);
        if (rc != -EINVAL) fprintf(stderr, "  memory.max \"%s\"\n", bad_max[i]);
        CHECK(cg_zeroed(&cg));
        /* a cgroup that cannot be read is not silently treated as unlimited */
        avail = 5;
        strcpy(src, "x");
        CHECK_EQ(fy_host_available(&avail, src, sizeof src), -EINVAL);
        CHECK_EQ(avail, 0);
        CHECK_EQ(src[0], '\0');
    }
    put_len("cg/a/memory.max",
            "12\0"
            "34\n",
            6); /* a NUL inside */
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);

    put("cg/a/memory.max", "18446744073709551615\n"); /* 2^64 - 1: legal */
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 1);
    CHECK(cg.limit == UINT64_MAX);
    put("cg/a/memory.max", "max\n");

    put("cg/a/memory.high", "lots\n");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    rm("cg/a/memory.high");

    put("cg/a/memory.current", "max\n"); /* "max" only where the kernel writes it */
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    put("cg/a/memory.current", "");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    put("cg/a/memory.current", "100\n");
    put("cg/a/memory.peak", "?\n");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    rm("cg/a/memory.peak");
    CHECK_EQ(fy_cgroup_read(&cg), 0);

    /* /proc/self/cgroup's v2 line */
    static const char *const bad_line[] = {
        "0::\n", "0::a/b\n", "0::/a/../b\n", "0::/..\n", "0::/a/.\n", "0::/./a\n", "0:: /a\n",
    };
    for (size_t i = 0; i < sizeof bad_line / sizeof *bad_line; i++) {
        put("proc/self/cgroup", bad_line[i]);
        poison_cg(&cg);
        int rc = fy_cgroup_read(&cg);
        CHECK_EQ(rc, -EINVAL);
        if (rc != -EINVAL) fprintf(stderr, "  cgroup line \"%s\"\n", bad_line[i]);
        CHECK(cg_zeroed(&cg));
    }
    put_len("proc/self/cgroup", "0::/a\0/b\n", 9);
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    static const char *const no_line[] = {"", "\n\n", "garbage", "0:/a\n", "10::/a\n", "0\n"};
    for (size_t i = 0; i < sizeof no_line / sizeof *no_line; i++) {
        put("proc/self/cgroup", no_line[i]);
        CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    }

    /* odd but sound: no trailing newline, doubled and trailing slashes, a
     * line far longer than any buffer before the v2 line */
    put("cg/a/b/memory.current", "5\n");
    put("cg/a/b/memory.max", "50\n");
    put("proc/self/cgroup", "0::/a/b");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strcmp(cg.path, "cgroup /a/b: memory.max") == 0);
    put("proc/self/cgroup", "0:://a//b/\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 50);
    CHECK(strcmp(cg.path, "cgroup /a/b: memory.max") == 0);
    size_t big = 3 * PATH_MAX;
    char *huge = malloc(big + 32);
    CHECK(huge != NULL);
    if (huge) {
        memcpy(huge, "3:cpu:/", 7);
        memset(huge + 7, 'x', big - 7);
        memcpy(huge + big, "0::/wrong\n", 10); /* part of the long line, not a line */
        memcpy(huge + big + 10, "0::/a/b", 7);
        put_len("proc/self/cgroup", huge, big + 17);
        poison_cg(&cg);
        CHECK_EQ(fy_cgroup_read(&cg), 0);
        CHECK_EQ(cg.current, 5);
        CHECK(strcmp(cg.path, "cgroup /a/b: memory.max") == 0);
        free(huge);
    }

    /* a path too long for PATH_MAX once under the root */
    char *deep = malloc(PATH_MAX + 16);
    CHECK(deep != NULL);
    if (deep) {
        strcpy(deep, "0::");
        for (size_t o = 3; o + 2 < PATH_MAX - 8; o += 2) memcpy(deep + o, "/d", 3);
        put("proc/self/cgroup", deep);
        CHECK(fy_cgroup_read(&cg) < 0);
        CHECK(cg_zeroed(&cg));
        free(deep);
    }
}

static void test_long_name(void)
{
    tree("longname");
    char name[160], rel[256], line[256];
    memset(name, 'n', sizeof name);
    memcpy(name, "docker-", 7);
    memcpy(name + sizeof name - 9, ".service", 9); /* includes the NUL */
    snprintf(line, sizeof line, "0::/system.slice/%s\n", name);
    put("proc/self/cgroup", line);
    snprintf(rel, sizeof rel, "cg/system.slice/%s/memory.current", name);
    put(rel, "1\n");
    snprintf(rel, sizeof rel, "cg/system.slice/%s/memory.max", name);
    put(rel, "2\n");
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strlen(cg.path) < sizeof cg.path);
    CHECK(strncmp(cg.path, "cgroup ...", 10) == 0);
    size_t n = strlen(cg.path), tl = strlen("nnnnn.service: memory.max");
    CHECK(n >= tl && strcmp(cg.path + n - tl, "nnnnn.service: memory.max") == 0);

    /* control bytes do not reach the message */
    put("proc/self/cgroup", "0::/t\tab\n");
    put("cg/t\tab/memory.current", "1\n");
    put("cg/t\tab/memory.max", "2\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strcmp(cg.path, "cgroup /t?ab: memory.max") == 0);
}

static void test_meminfo_malformed(void)
{
    tree("badmeminfo");
    uint64_t avail;
    char src[128];
    static const char *const bad[] = {
        "MemAvailable: 12x kB\n",
        "MemAvailable:  kB\n",
        "MemAvailable: 5\n",
        "MemAvailable: 5 MB\n",
        "MemAvailable: 5 kB trailing\n",
        "MemAvailable: -5 kB\n",
        "MemAvailable: 18014398509481984 kB\n", /* 2^54 kB = 2^64 bytes */
        "MemAvailable: 99999999999999999999999 kB\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put("proc/meminfo", bad[i]);
        avail = 3;
        int rc = fy_host_available(&avail, src, sizeof src);
        CHECK_EQ(rc, -EINVAL);
        if (rc != -EINVAL) fprintf(stderr, "  meminfo \"%s\"\n", bad[i]);
        CHECK_EQ(avail, 0);
    }
    put("proc/meminfo", "MemTotal: 1 kB\nMemFree: 1 kB\n");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), -ENOENT);
    put("proc/meminfo", "MemAvailableX: 5 kB\nXMemAvailable: 6 kB\n");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), -ENOENT);
    put("proc/meminfo", "");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), -ENOENT);
    put("proc/meminfo", "MemAvailable: 18014398509481983 kB"); /* the largest, no newline */
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK(avail == 18014398509481983ull * 1024ull);
    put("proc/meminfo", "MemAvailable:\t42 kB  \r\n");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 42 * KB);
}

static const char rollup_full[] =
    "5584a2922000-7ffd5e1d3000 ---p 00000000 00:00 0                          [rollup]\n"
    "Rss:                1000 kB\n"
    "Pss_Dirty:           111 kB\n"
    "Pss:                 600 kB\n"
    "Pss_Anon:            112 kB\n"
    "Shared_Clean:        500 kB\n"
    "Private_Clean:       200 kB\n"
    "Private_Dirty:       300 kB\n"
    "Shared_Hugetlb:      999 kB\n"
    "Private_Hugetlb:       4 kB\n"
    "Swap:                  0 kB";

static void test_rollup_fake(void)
{
    tree("rollup");
    fy_memsnap m;
    put("proc/self/smaps_rollup", rollup_full);
    memset(&m, 0xA5, sizeof m);
    CHECK_EQ(fy_mem_self(&m), 0);
    CHECK_EQ(m.rss, 1000 * KB);
    CHECK_EQ(m.pss, 600 * KB);
    CHECK_EQ(m.uss, (200 + 300 + 4) * KB);

    /* no Private_Hugetlb (older kernels), no trailing newline */
    put("proc/self/smaps_rollup", "Rss: 8 kB\nPss: 6 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB");
    CHECK_EQ(fy_mem_self(&m), 0);
    CHECK_EQ(m.rss, 8 * KB);
    CHECK_EQ(m.pss, 6 * KB);
    CHECK_EQ(m.uss, 3 * KB);

    static const char *const bad[] = {
        "",
        "Rss: 8 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n",                       /* no Pss */
        "Rss: 8 kB\nPss: 6 kB\nPrivate_Clean: 1 kB\n",                                 /* no Private_Dirty */
        "Rss: 8 kB\nRss: 9 kB\nPss: 6 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n", /* twice */
        "Rss: 8x kB\nPss: 6 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n",
        "Rss: 99999999999999999999999 kB\nPss: 6 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n",
        "Rss: 18014398509481984 kB\nPss: 6 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n",
        /* each fits, the sum does not */
        "Rss: 8 kB\nPss: 6 kB\nPrivate_Clean: 18014398509481983 kB\nPrivate_Dirty: 1 kB\n",
        "\x01\x02\xff garbage \n\n\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put("proc/self/smaps_rollup", bad[i]);
        memset(&m, 0xA5, sizeof m);
        int rc = fy_mem_self(&m);
        CHECK_EQ(rc, -EINVAL);
        if (rc != -EINVAL) fprintf(stderr, "  smaps_rollup #%zu\n", i);
        CHECK(m.rss == 0 && m.uss == 0 && m.pss == 0);
    }

    /* old kernel: no smaps_rollup, VmRSS from status */
    rm("proc/self/smaps_rollup");
    put("proc/self/status", "Name:\tx\nVmPeak:\t 9999 kB\nVmRSS:\t    4321 kB\nThreads:\t1\n");
    memset(&m, 0xA5, sizeof m);
    CHECK_EQ(fy_mem_self(&m), -ENOENT);
    CHECK_EQ(m.rss, 4321 * KB);
    CHECK_EQ(m.uss, 0);
    CHECK_EQ(m.pss, 0);
    rm("proc/self/status");
    memset(&m, 0xA5, sizeof m);
    CHECK_EQ(fy_mem_self(&m), -ENOENT);
    CHECK(m.rss == 0 && m.uss == 0 && m.pss == 0);

    CHECK_EQ(fy_mem_self(NULL), -EINVAL);
    CHECK_EQ(fy_cgroup_read(NULL), -EINVAL);
    CHECK_EQ(fy_host_available(NULL, NULL, 0), -EINVAL);

    /* a root that cannot be held */
    char *longroot = malloc(PATH_MAX + 10);
    CHECK(longroot != NULL);
    if (longroot) {
        memset(longroot, 'r', PATH_MAX + 9);
        longroot[0] = '/';
        longroot[PATH_MAX + 9] = '\0';
        fy_memstat_set_roots(longroot, longroot);
        CHECK_EQ(fy_mem_self(&m), -ENAMETOOLONG);
        fy_cgroup_mem cg;
        CHECK_EQ(fy_cgroup_read(&cg), -ENAMETOOLONG);
        uint64_t avail;
        CHECK_EQ(fy_host_available(&avail, NULL, 0), -ENAMETOOLONG);
        free(longroot);
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* Fresh anonymous memory, every page touched; munmap gives it back at once
 * (free() might keep it, and ASan's allocator surely would). */
static void *touch_new(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    memset(p, 0x5a, n);
    return p;
}

static void test_rollup_real(void)
{
    fy_memstat_set_roots(NULL, NULL);
    fy_memsnap a, b;
    int rc = fy_mem_self(&a);
    if (rc == -ENOENT) { /* kernel without smaps_rollup: the VmRSS fallback */
        CHECK(a.rss > 0);
        return;
    }
    CHECK_EQ(rc, 0);
    CHECK(a.rss > 0);
    CHECK(a.uss > 0);
    CHECK(a.uss <= a.pss && a.pss <= a.rss);

    size_t n = 64 * MIB;
    void *p = touch_new(n);
    CHECK(p != NULL);
    if (!p) return;
    CHECK_EQ(fy_mem_self(&b), 0);
    CHECK(b.rss >= a.rss + 60 * MIB);
    CHECK(b.uss >= a.uss + 60 * MIB);
    CHECK(b.pss >= a.pss + 60 * MIB);
    munmap(p, n);
}

/* A number from a real file, or -1. */
static long long read_num(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* This process's real cgroup, worked out here the simple way: v2 at
 * /sys/fs/cgroup, or v1's memory controller at /sys/fs/cgroup/memory mounted
 * from the hierarchy's root (a host, not a container). Elsewhere the library
 * is only asked to answer, and the case says it skipped the comparison. */
static void test_cgroup_real(void)
{
    fy_memstat_set_roots(NULL, NULL);
    fy_cgroup_mem cg;
    int rc = fy_cgroup_read(&cg);
    CHECK(rc == 0 || rc == -ENOENT);
    if (rc == 0) {
        CHECK(cg.version == 1 || cg.version == 2);
        CHECK(cg.current > 0);
        CHECK(strncmp(cg.path, "cgroup /", 8) == 0);
        if (cg.limited) CHECK(cg.limit > 0);
        printf("this process: cgroup v%d, %s, current %llu MiB (%llu MiB inactive cache)\n", cg.version,
               cg.path, (unsigned long long)(cg.current / MIB), (unsigned long long)(cg.reclaimable / MIB));
    }
    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK(avail > 0);
    CHECK(src[0] != '\0');
    printf("this host: %llu MiB available (%s)\n", (unsigned long long)(avail / MIB), src);

    char line[PATH_MAX + 64], v1[PATH_MAX] = "", v2[PATH_MAX] = "";
    bool has_v1 = false, has_v2 = false;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) {
        check_skip("no /proc/self/cgroup: no cgroup to compare with");
        return;
    }
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        *b = '\0';
        if (!has_v2 && strcmp(line, "0:") == 0) {
            has_v2 = true;
            snprintf(v2, sizeof v2, "%s", strcmp(b + 1, "/") == 0 ? "" : b + 1);
        }
        char *tok, *save = NULL;
        for (tok = strtok_r(a + 1, ",", &save); tok && !has_v1; tok = strtok_r(NULL, ",", &save))
            if (strcmp(tok, "memory") == 0) {
                has_v1 = true;
                snprintf(v1, sizeof v1, "%s", strcmp(b + 1, "/") == 0 ? "" : b + 1);
            }
    }
    fclose(f);

    char dir[PATH_MAX + 64], p[2 * PATH_MAX];
    snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", v2);
    snprintf(p, sizeof p, "%s/memory.current", dir);
    if (has_v2 && access(p, R_OK) == 0) {
        CHECK_EQ(rc, 0);
        CHECK_EQ(cg.version, 2);
        return; /* v2 against its real files: test_cgroup_real has always covered it */
    }
    snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", v1);
    snprintf(p, sizeof p, "%s/memory.usage_in_bytes", dir);
    if (!has_v1 || access(p, R_OK) != 0) {
        check_skip(has_v1 ? "cgroup v1 memory line, but not at /sys/fs/cgroup/memory as on a host"
                          : "no cgroup v2 memory.current and no cgroup v1 memory controller here");
        return;
    }
    CHECK_EQ(rc, 0);
    CHECK_EQ(cg.version, 1);
    /* The smallest limit up to the mount, as the library should find it. */
    long long want = -1;
    for (;;) {
        snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
        long long v = read_num(p);
        CHECK(v > 0);
        if (v > 0 && v < (1ll << 62) && (want < 0 || v < want)) want = v;
        if (strcmp(dir, "/sys/fs/cgroup/memory") == 0) break;
        *strrchr(dir, '/') = '\0';
    }
    CHECK_EQ(cg.limited, want >= 0);
    if (want >= 0) CHECK_EQ(cg.limit, (uint64_t)want);
    CHECK_EQ(cg.has_peak, 1);
    CHECK(cg.peak >= cg.current / 2); /* a lifetime peak, read a moment apart */
}

/* The sampler must use the allocator it is given (alloc.h counts). */

static void test_sampler_real(void)
{
    fy_memstat_set_roots(NULL, NULL);
    ferry_allocator mem = COUNTING_ALLOCATOR_INIT;
    fy_memsampler *s = NULL;
    CHECK_EQ(fy_memsampler_start(&mem, 5, &s), 0);
    CHECK(s != NULL);
    CHECK(atomic_load(&alloc_calls) >= 1);
    size_t n = 128 * MIB;
    void *p = touch_new(n);
    CHECK(p != NULL);
    sleep_ms(60); /* a dozen samples at 5 ms */
    if (p) munmap(p, n);
    sleep_ms(10);
    fy_memsample_result r;
    memset(&r, 0xA5, sizeof r);
    fy_memsampler_stop(s, &r);
    CHECK_EQ(atomic_load(&live), 0);
    CHECK(r.start.rss > 0 && r.end.rss > 0);
    CHECK(r.peak.rss >= r.end.rss + 100 * MIB);
    CHECK(r.peak.uss >= r.end.uss + 100 * MIB);
    CHECK(r.peak.rss >= r.start.rss && r.peak.uss >= r.start.uss && r.peak.pss >= r.start.pss);
    CHECK(r.peak.rss >= r.end.rss && r.peak.uss >= r.end.uss && r.peak.pss >= r.end.pss);
    fy_cgroup_mem cg;
    int has = fy_cgroup_read(&cg) == 0;
    CHECK_EQ(r.has_cgroup, has);
    if (r.has_cgroup) {
        CHECK(r.cg_start > 0 && r.cg_end > 0);
        CHECK(r.cg_peak >= r.cg_start && r.cg_peak >= r.cg_end);
    } else {
        CHECK(r.cg_start == 0 && r.cg_end == 0 && r.cg_peak == 0);
    }
    printf("sampler: rss start %llu MiB, peak %llu MiB, end %llu MiB\n",
           (unsigned long long)(r.start.rss / MIB), (unsigned long long)(r.peak.rss / MIB),
           (unsigned long long)(r.end.rss / MIB));

    /* a long period does not hold stop up; period 0 is clamped to 1 ms */
    CHECK_EQ(fy_memsampler_start(NULL, 1000000, &s), 0);
    sleep_ms(20);
    double t0 = now_s();
    fy_memsampler_stop(s, NULL);
    CHECK(now_s() - t0 < 0.5);
    CHECK_EQ(fy_memsampler_start(NULL, 0, &s), 0);
    sleep_ms(20);
    fy_memsampler_stop(s, &r);
    CHECK(r.peak.rss >= r.start.rss && r.peak.rss >= r.end.rss);

    CHECK_EQ(fy_memsampler_start(NULL, 5, NULL), -EINVAL);
    memset(&r, 0xA5, sizeof r);
    fy_memsampler_stop(NULL, &r);
    CHECK(r.peak.rss == 0 && r.has_cgroup == 0);
    fy_memsampler_stop(NULL, NULL);
}

static void rollup3(uint64_t rss, uint64_t uss, uint64_t pss)
{
    char buf[256];
    snprintf(buf, sizeof buf, "Rss: %llu kB\nPss: %llu kB\nPrivate_Clean: 0 kB\nPrivate_Dirty: %llu kB\n",
             (unsigned long long)rss, (unsigned long long)pss, (unsigned long long)uss);
    put("proc/self/smaps_rollup", buf);
}

/* Peaks per field, from a fake tree whose files change under the sampler. */
static void test_sampler_fake(void)
{
    tree("sampler");
    put("proc/self/cgroup", "0::/job\n");
    put("cg/job/memory.current", "5000\n");
    rollup3(100, 50, 70);
    fy_memsampler *s;
    CHECK_EQ(fy_memsampler_start(NULL, 5, &s), 0);
    /* the sampler keeps the roots it started with */
    fy_memstat_set_roots(NULL, NULL);
    rollup3(300, 40, 60);
    put("cg/job/memory.current", "9000\n");
    sleep_ms(100);
    rollup3(200, 90, 80);
    put("cg/job/memory.current", "7000\n");
    sleep_ms(100);
    rollup3(150, 45, 65);
    put("cg/job/memory.current", "6000\n");
    fy_memsample_result r;
    fy_memsampler_stop(s, &r);
    CHECK_EQ(r.has_cgroup, 1);
    CHECK_EQ(r.start.rss, 100 * KB);
    CHECK_EQ(r.start.uss, 50 * KB);
    CHECK_EQ(r.start.pss, 70 * KB);
    CHECK_EQ(r.end.rss, 150 * KB);
    CHECK_EQ(r.end.uss, 45 * KB);
    CHECK_EQ(r.end.pss, 65 * KB);
    CHECK_EQ(r.peak.rss, 300 * KB);
    CHECK_EQ(r.peak.uss, 90 * KB);
    CHECK_EQ(r.peak.pss, 80 * KB);
    CHECK_EQ(r.cg_start, 5000);
    CHECK_EQ(r.cg_end, 6000);
    CHECK_EQ(r.cg_peak, 9000);

    /* no cgroup v2: cg_* stay 0; a broken sample is left out of the peaks */
    tree("sampler2");
    put("proc/self/cgroup", "1:memory:/x\n");
    rollup3(10, 10, 10);
    CHECK_EQ(fy_memsampler_start(NULL, 5, &s), 0);
    put("proc/self/smaps_rollup", "Rss: 999999 kB\n"); /* no Pss: -EINVAL */
    sleep_ms(50);
    rollup3(20, 5, 5);
    fy_memsampler_stop(s, &r);
    CHECK_EQ(r.has_cgroup, 0);
    CHECK(r.cg_start == 0 && r.cg_end == 0 && r.cg_peak == 0);
    CHECK_EQ(r.peak.rss, 20 * KB);
    CHECK_EQ(r.peak.uss, 10 * KB);
    CHECK_EQ(r.end.uss, 5 * KB);
}

/* ---- cgroup v2's page cache, and cgroup v1 ---------------------------------- */

static void test_v2_page_cache(void)
{
    tree("v2stat");
    put("proc/self/cgroup", "0::/a\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/a/memory.current", "700000000\n");
    put("cg/a/memory.max", "1000000000\n");
    put("cg/a/memory.stat", "anon 100000000\nfile 600000000\nactive_file 200000000\ninactive_file 400000000\n"
                            "shmem 0\n");
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.version, 2);
    CHECK_EQ(cg.current, 700000000);
    CHECK_EQ(cg.reclaimable, 400000000);
    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1000000000ull - 300000000ull); /* the inactive cache is not the cgroup's debt */
    CHECK(strcmp(src, "cgroup /a: memory.max") == 0);

    /* more cache than usage (the counters are not read at one instant): all room */
    put("cg/a/memory.stat", "inactive_file 800000000\n");
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1000000000);
    /* no such key: nothing subtracted; other lines are not ours to judge */
    put("cg/a/memory.stat", "anon 1\nweird line\ntotal_inactive_file 5\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.reclaimable, 0);
    /* the key malformed or twice: the cgroup cannot be read */
    static const char *const bad[] = {"inactive_file x\n",  "inactive_file\n",
                                      "inactive_file  5\n", "inactive_file 5\ninactive_file 5\n",
                                      "inactive_file -5\n", "inactive_file 99999999999999999999999\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put("cg/a/memory.stat", bad[i]);
        poison_cg(&cg);
        int rc = fy_cgroup_read(&cg);
        CHECK_EQ(rc, -EINVAL);
        if (rc != -EINVAL) fprintf(stderr, "  memory.stat \"%s\"\n", bad[i]);
        CHECK(cg_zeroed(&cg));
        CHECK_EQ(fy_host_available(&avail, src, sizeof src), -EINVAL);
    }
    put("cg/a/memory.stat", "inactive_file 5 \n"); /* trailing blanks are fine */
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.reclaimable, 5);
}

/* What this machine's development hosts show (Linux 5.x, hybrid v1 + v2). */
static const char mountinfo_v1[] =
    "22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

static const char stat_v1[] =
    "cache 300000000\nrss 100000000\ninactive_file 1\nactive_file 2\n"
    "hierarchical_memory_limit 9223372036854771712\n"
    "total_cache 300000000\ntotal_inactive_file 250000000\ntotal_active_file 50000000\n";

static void test_v1_limit(void)
{
    tree("v1limit");
    put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/api/job\n3:cpu,cpuacct:/\n0::/\n");
    put("proc/self/mountinfo", mountinfo_v1);
    put("proc/meminfo", meminfo_8g);
    /* the hybrid host's v2 root has no memory.current: v1 is read */
    put("cg/memory/api/job/memory.limit_in_bytes", "9223372036854771712\n"); /* "unlimited" */
    put("cg/memory/api/job/memory.usage_in_bytes", "400000000\n");
    put("cg/memory/api/job/memory.max_usage_in_bytes", "900000000\n");
    put("cg/memory/api/job/memory.stat", stat_v1);
    put("cg/memory/api/memory.limit_in_bytes", "1000000000\n");
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("cg/memory/memory.usage_in_bytes", "5000000000\n");
    fy_cgroup_mem cg;
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.version, 1);
    CHECK_EQ(cg.limited, 1);
    CHECK_EQ(cg.limit, 1000000000);
    CHECK_EQ(cg.current, 400000000);
    CHECK_EQ(cg.has_peak, 1);
    CHECK_EQ(cg.peak, 900000000);
    CHECK_EQ(cg.reclaimable, 250000000); /* total_inactive_file, not cache nor inactive_file */
    CHECK(strcmp(cg.path, "cgroup /api: memory.limit_in_bytes") == 0);
    uint64_t avail;
    char src[128];
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 1000000000ull - 150000000ull);
    CHECK(strcmp(src, "cgroup /api: memory.limit_in_bytes") == 0);

    /* its own limit, tighter; a tie with the parent names the deeper one */
    put("cg/memory/api/job/memory.limit_in_bytes", "1000000000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strcmp(cg.path, "cgroup /api/job: memory.limit_in_bytes") == 0);
    put("cg/memory/api/job/memory.limit_in_bytes", "600000000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 600000000);
    CHECK(strcmp(cg.path, "cgroup /api/job: memory.limit_in_bytes") == 0);

    /* no limit anywhere (2^62 and up is none), no max_usage, no memory.stat */
    put("cg/memory/api/job/memory.limit_in_bytes", "4611686018427387904\n");
    put("cg/memory/api/memory.limit_in_bytes", "9223372036854775807\n");
    rm("cg/memory/api/job/memory.max_usage_in_bytes");
    rm("cg/memory/api/job/memory.stat");
    poison_cg(&cg);
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.version, 1);
    CHECK_EQ(cg.limited, 0);
    CHECK_EQ(cg.limit, 0);
    CHECK_EQ(cg.has_peak, 0);
    CHECK_EQ(cg.peak, 0);
    CHECK_EQ(cg.reclaimable, 0);
    CHECK(strcmp(cg.path, "cgroup /api/job: no limit") == 0);
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK_EQ(avail, 8388608 * KB);
    CHECK(strcmp(src, "/proc/meminfo MemAvailable") == 0);
    put("cg/memory/api/memory.limit_in_bytes", "4611686018427387903\n"); /* just below: a limit */
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 4611686018427387903ull);
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK(strcmp(src, "cgroup /api: memory.limit_in_bytes (host MemAvailable is lower)") == 0);

    /* v2 wins where it has the memory controller */
    put("cg/memory.current", "1234\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.version, 2);
    CHECK_EQ(cg.current, 1234);
    rm("cg/memory.current");

    /* the process in the hierarchy's root */
    put("proc/self/cgroup", "4:memory:/\n");
    put("cg/memory/memory.stat", "total_inactive_file 1000000000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.current, 5000000000ull);
    CHECK_EQ(cg.reclaimable, 1000000000ull);
    CHECK(strcmp(cg.path, "cgroup /: no limit") == 0);
}

/* A container (Docker on a v1 host): its cgroup is the mount's root, and the
 * ancestors' limits reach it only through hierarchical_memory_limit. */
static void test_v1_container(void)
{
    tree("v1ctr");
    put("proc/self/cgroup", "12:memory:/kubepods/pod7/abc\n11:cpuset:/kubepods/pod7/abc\n");
    put("proc/self/mountinfo",
        "1402 1401 0:94 / / rw,relatime master:497 - overlay overlay rw,lowerdir=/x\n"
        "1413 1412 0:32 /kubepods/pod7/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n");
    put("proc/meminfo", meminfo_8g);
    put("cg/memory/memory.limit_in_bytes", "2000000000\n");
    put("cg/memory/memory.usage_in_bytes", "100000000\n");
    put("cg/memory/memory.stat", "total_inactive_file 0\nhierarchical_memory_limit 1500000000\n");
    fy_cgroup_mem cg;
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.version, 1);
    CHECK_EQ(cg.limit, 1500000000);
    CHECK(strcmp(cg.path, "cgroup /kubepods/pod7/abc: memory.stat hierarchical_memory_limit") == 0);
    /* equal: the file that sets it is named */
    put("cg/memory/memory.stat", "hierarchical_memory_limit 2000000000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK(strcmp(cg.path, "cgroup /kubepods/pod7/abc: memory.limit_in_bytes") == 0);
    put("cg/memory/memory.stat", "hierarchical_memory_limit 9223372036854771712\n");
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limited, 0);
    put("cg/memory/memory.stat", "hierarchical_memory_limit 12x\n");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    rm("cg/memory/memory.stat");

    /* a child of the mount's root: the walk stops at the root, named as the hierarchy has it */
    put("proc/self/cgroup", "12:memory:/kubepods/pod7/abc/sub\n");
    put("cg/memory/sub/memory.usage_in_bytes", "7\n");
    put("cg/memory/memory.limit_in_bytes", "3000000000\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.current, 7);
    CHECK(strcmp(cg.path, "cgroup /kubepods/pod7/abc: memory.limit_in_bytes") == 0);

    /* combined controllers, an escaped mount point, optional fields */
    tree("v1combined");
    put("proc/self/cgroup", "5:cpu,memory,cpuacct:/a\n");
    put("proc/self/mountinfo", "35 31 0:32 / /sys/fs/cgroup/cpu\\040mem rw shared:1 master:2 - cgroup cgroup "
                               "rw,cpu,memory,cpuacct\n");
    put("cg/cpu mem/a/memory.usage_in_bytes", "10\n");
    put("cg/cpu mem/a/memory.limit_in_bytes", "100\n");
    put("proc/meminfo", meminfo_8g);
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 100);
    uint64_t avail;
    CHECK_EQ(fy_host_available(&avail, NULL, 0), 0);
    CHECK_EQ(avail, 90);
}

/* Where v1 is not found, or not readable. */
static void test_v1_not_found(void)
{
    tree("v1none");
    put("proc/meminfo", meminfo_8g);
    put("proc/self/cgroup", "4:memory:/a\n");
    put("cg/memory/a/memory.usage_in_bytes", "10\n");
    put("cg/memory/a/memory.limit_in_bytes", "100\n");
    fy_cgroup_mem cg;
    uint64_t avail;
    char src[128];
    /* no mountinfo: MemAvailable */
    CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
    CHECK(strcmp(src, "/proc/meminfo MemAvailable") == 0);

    static const char *const no_mount[] = {
        "",
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup2 cgroup2 rw\n",          /* not v1 */
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memoryx\n",    /* not the word */
        "35 31 0:32 / /sys/fs/cgroup/memory rw,memory - cgroup cgroup rw\n",     /* a mount option */
        "35 31 0:32 /b /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",    /* root elsewhere */
        "35 31 0:32 /a/b /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",  /* root below us */
        "35 31 0:32 /../a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", /* outside the namespace */
        "35 31 0:32 / /sys/fs/cgroup/../memory rw - cgroup cgroup rw,memory\n",  /* climbs */
        "35 31 0:32 / /cgroup/memory rw - cgroup cgroup rw,memory\n",            /* not in the fake tree */
        "35 31 0:32 / /sys/fs/cgroupmemory rw - cgroup cgroup rw,memory\n",
        "35 31 0:32 / /sys/fs/cgroup/mem\\0ory rw - cgroup cgroup rw,memory\n", /* a broken escape */
        "35 31 0:32 / /sys/fs/cgroup/memory rw cgroup cgroup rw,memory\n",      /* no " - " */
        "35 31 0:32 / /sys/fs/cgroup/memory - cgroup cgroup rw,memory\n",       /* a field short */
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup\n",
        "35 31 0:32 / sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", /* not absolute */
    };
    for (size_t i = 0; i < sizeof no_mount / sizeof *no_mount; i++) {
        put("proc/self/mountinfo", no_mount[i]);
        poison_cg(&cg);
        int rc = fy_cgroup_read(&cg);
        CHECK_EQ(rc, -ENOENT);
        if (rc != -ENOENT) fprintf(stderr, "  mountinfo \"%s\"\n", no_mount[i]);
        CHECK(cg_zeroed(&cg));
        CHECK_EQ(fy_host_available(&avail, src, sizeof src), 0);
        CHECK_EQ(avail, 8388608 * KB);
    }
    /* the first mount that holds the process counts; lines it cannot read are skipped */
    put("proc/self/mountinfo", "35 31 0:32 /b /sys/fs/cgroup/other rw - cgroup cgroup rw,memory\n"
                               "garbage\n\n"
                               "36 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                               "37 31 0:32 / /sys/fs/cgroup/late rw - cgroup cgroup rw,memory\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 100);
    CHECK(strcmp(cg.path, "cgroup /a: memory.limit_in_bytes") == 0);

    /* no usage_in_bytes: not found */
    rm("cg/memory/a/memory.usage_in_bytes");
    CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    put("cg/memory/a/memory.usage_in_bytes", "10\n");

    /* found but malformed: an error, as for v2 */
    static const char *const bad_value[] = {"abc\n", "max\n", "", "-1\n", "18446744073709551616\n"};
    for (size_t i = 0; i < sizeof bad_value / sizeof *bad_value; i++) {
        put("cg/memory/a/memory.limit_in_bytes", bad_value[i]);
        poison_cg(&cg);
        CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
        CHECK(cg_zeroed(&cg));
        avail = 1;
        CHECK_EQ(fy_host_available(&avail, src, sizeof src), -EINVAL);
        CHECK_EQ(avail, 0);
        put("cg/memory/a/memory.limit_in_bytes", "100\n");
        put("cg/memory/a/memory.usage_in_bytes", bad_value[i]);
        CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
        put("cg/memory/a/memory.usage_in_bytes", "10\n");
        put("cg/memory/a/memory.max_usage_in_bytes", bad_value[i]);
        CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
        rm("cg/memory/a/memory.max_usage_in_bytes");
    }
    put("cg/memory/a/memory.stat", "total_inactive_file 1\ntotal_inactive_file 1\n");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    rm("cg/memory/a/memory.stat");

    static const char *const bad_line[] = {"4:memory:a\n", "4:memory:/a/../b\n", "4:memory:\n",
                                           "4:memory:/./a\n"};
    for (size_t i = 0; i < sizeof bad_line / sizeof *bad_line; i++) {
        put("proc/self/cgroup", bad_line[i]);
        CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
    }
    static const char *const no_line[] = {"4:memoryx:/a\n", "4:name=memory:/a\n", "memory:/a\n",
                                          "4:cpu:/a\n"};
    for (size_t i = 0; i < sizeof no_line / sizeof *no_line; i++) {
        put("proc/self/cgroup", no_line[i]);
        CHECK_EQ(fy_cgroup_read(&cg), -ENOENT);
    }
    /* the first memory line counts */
    put("proc/self/cgroup", "4:memory:/a\n5:memory:/elsewhere\n");
    CHECK_EQ(fy_cgroup_read(&cg), 0);
    CHECK_EQ(cg.limit, 100);
    /* a malformed v2 line is an error even where v1 would do */
    put("proc/self/cgroup", "4:memory:/a\n0::/..\n");
    CHECK_EQ(fy_cgroup_read(&cg), -EINVAL);
}

/* The sampler follows v1's usage_in_bytes as it does v2's memory.current. */
static void test_v1_sampler(void)
{
    tree("v1sampler");
    put("proc/self/cgroup", "4:memory:/job\n");
    put("proc/self/mountinfo", mountinfo_v1);
    put("cg/memory/job/memory.usage_in_bytes", "5000\n");
    rollup3(100, 50, 70);
    fy_memsampler *s;
    CHECK_EQ(fy_memsampler_start(NULL, 5, &s), 0);
    put("cg/memory/job/memory.usage_in_bytes", "9000\n");
    sleep_ms(100);
    put("cg/memory/job/memory.usage_in_bytes", "6000\n");
    fy_memsample_result r;
    fy_memsampler_stop(s, &r);
    CHECK_EQ(r.has_cgroup, 1);
    CHECK_EQ(r.cg_start, 5000);
    CHECK_EQ(r.cg_end, 6000);
    CHECK_EQ(r.cg_peak, 9000);
}

/* `test_memstat CASE` runs one of these, `--list` names them (check.h); each
 * scenario makes its own tree under main's temp dir. */
#define CASES(CASE)                                   \
    CASE(no_cgroup_v2, test_no_cgroup_v2())           \
    CASE(unlimited, test_unlimited())                 \
    CASE(own_limit, test_own_limit())                 \
    CASE(ancestor_limit, test_ancestor_limit())       \
    CASE(high_below_max, test_high_below_max())       \
    CASE(missing_peak, test_missing_peak())           \
    CASE(over_limit, test_over_limit())               \
    CASE(host_lower, test_host_lower())               \
    CASE(malformed_cgroup, test_malformed_cgroup())   \
    CASE(long_name, test_long_name())                 \
    CASE(meminfo_malformed, test_meminfo_malformed()) \
    CASE(rollup_fake, test_rollup_fake())             \
    CASE(sampler_fake, test_sampler_fake())           \
    CASE(v2_page_cache, test_v2_page_cache())         \
    CASE(v1_limit, test_v1_limit())                   \
    CASE(v1_container, test_v1_container())           \
    CASE(v1_not_found, test_v1_not_found())           \
    CASE(v1_sampler, test_v1_sampler())               \
    CASE(rollup_real, test_rollup_real())             \
    CASE(cgroup_real, test_cgroup_real())             \
    CASE(sampler_real, test_sampler_real())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/memstat.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    check_run();
    fy_memstat_set_roots(NULL, NULL);
    nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return check_summary();
}
