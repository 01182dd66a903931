/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_memstat.c - libFuzzer target for the /proc and cgroup (v2 and v1)
 * parsers of src/io/memstat.c, driven through a fake tree held in memory.
 *
 * The input is the tree's files one after the other, separated by lines "%%"
 * (the input is cut at every "\n%%\n"), in this order:
 *    0 proc/self/smaps_rollup    1 proc/self/status    2 proc/self/cgroup
 *    3 proc/meminfo
 *    4..7  memory.max, .high, .current, .peak of the v2 cgroup that 2 names
 *    8..11 the same four of its parent (the cgroup root for "0::/a")
 *   12 proc/self/mountinfo       13 memory.stat of the v2 cgroup
 *   14..17 memory.limit_in_bytes, .usage_in_bytes, .max_usage_in_bytes, .stat
 *          of the v1 cgroup that 2's memory line and 12's mount lead to
 *   18 memory.limit_in_bytes of its parent (when the mount shows one)
 * (pieces 12 on came with v1: older inputs keep their meaning). A file the
 * input does not reach, or whose whole text is "-", does not exist. The v2
 * cgroup's files are placed from 2's "0::" line and the v1 ones from its
 * memory line and 12's mount, as worked out here, so any path can be tried;
 * a v2 path too deep or long to be worth placing is not placed (the library
 * must then fail, or go on to v1).
 *
 * The files live in memory: "open", "read" and "close" of io.c's table are
 * replaced (fy_sys_set) by a small file system over the input's bytes, under
 * roots that exist nowhere on disk. Writing a real tree per input spent 88 %
 * of the time in the kernel (perf: ext4 create, mkdir, truncate) and ran 516
 * inputs/s; in memory it runs 7860-8006/s (run_fuzz.sh, 60 and 180 s, on a
 * shared 2-core VM), and what runs is the library's own reading (short reads
 * included: the fake read hands out a chunk size picked from the input).
 *
 * fy_mem_self, fy_cgroup_read and fy_host_available then run, and:
 *  - always: the codes are 0 or negative (errno or FERRY_E_*); on error the
 *    outputs are zeroed as memstat.h says; the cgroup's name and the source
 *    string are terminated within their arrays, one line, and say what kind
 *    of limit it is; a limit is never above a limit value written where the
 *    path leads, and the available memory never above limit - (current -
 *    reclaimable); every descriptor opened is closed;
 *  - where the input is simple enough to be worked out here independently (no
 *    line of PATH_MAX bytes or more, one "0::" line, no escapes in mountinfo,
 *    no two files at one path), the exact results: codes, values, version,
 *    the limit's name.
 * A violated invariant calls __builtin_trap(); the library allocates nothing,
 * so LeakSanitizer has little to find, but it stays on.
 *
 * FERRY_FUZZ_SKIP=exact leaves the worked-out results out (the always-checks
 * stay), to keep fuzzing past a known bug. */
#define _GNU_SOURCE
#include "io/io.h"
#include "io/memstat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "fuzz_memstat: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            __builtin_trap();                                                                              \
        }                                                                                                  \
    } while (0)

#include "fuzz_check.h"

/* ---- the input's pieces --------------------------------------------------- */

enum {
    P_SMAPS,
    P_STATUS,
    P_CGROUP,
    P_MEMINFO,
    P_LEAF,
    P_PARENT = P_LEAF + 4,
    P_MOUNTINFO = P_PARENT + 4,
    P_V2STAT,
    P_V1LEAF,
    P_V1PARENT = P_V1LEAF + 4,
    P_N
};
enum { F_MAX, F_HIGH, F_CURRENT, F_PEAK };         /* offsets from P_LEAF and P_PARENT */
enum { F1_LIMIT, F1_USAGE, F1_MAXUSAGE, F1_STAT }; /* from P_V1LEAF; P_V1PARENT is a limit */
static const char *const cg_files[4] = {"memory.max", "memory.high", "memory.current", "memory.peak"};
static const char *const v1_files[4] = {"memory.limit_in_bytes", "memory.usage_in_bytes",
                                        "memory.max_usage_in_bytes", "memory.stat"};

typedef struct piece {
    const uint8_t *p;
    size_t n;
    bool present;
} piece;

static void split(const uint8_t *data, size_t size, piece out[P_N])
{
    static const char sep[] = "\n%%\n";
    const size_t seplen = sizeof sep - 1;
    memset(out, 0, P_N * sizeof *out);
    if (!data) data = (const uint8_t *)""; /* no arithmetic on NULL */
    size_t pos = 0;
    for (int i = 0; i < P_N && pos <= size; i++) {
        const uint8_t *hit = memmem(data + pos, size - pos, sep, seplen);
        size_t end = hit ? (size_t)(hit - data) : size;
        out[i].p = data + pos;
        out[i].n = end - pos;
        out[i].present = !(out[i].n == 1 && out[i].p[0] == '-');
        if (!hit) break;
        pos = end + seplen;
    }
}

/* ---- the file system in memory -------------------------------------------- */

/* Nothing is ever made on disk: these name no real folder. */
#define BASE "/nonexistent-ferry-fuzz-memstat"
static const char g_proc[] = BASE "/proc", g_cg[] = BASE "/cg";

#define MAX_FILES 32
typedef struct mfile {
    char path[PATH_MAX];
    const uint8_t *p;
    size_t n;
} mfile;
static mfile g_files[MAX_FILES];
static int g_nfiles;
static bool g_clash; /* two files at one path: which the library sees is not worked out */

/* Descriptors far above any the process has; a slot per open file. */
#define FD_BASE 1000000
#define MAX_OPEN 8
static struct {
    bool used;
    int file;
    size_t off;
} g_open[MAX_OPEN];
static size_t g_chunk; /* the most one read hands out (short reads are legal) */

static void put_file(const char *path, const uint8_t *p, size_t n)
{
    CHECK(strlen(path) < PATH_MAX && g_nfiles < MAX_FILES);
    for (int i = 0; i < g_nfiles; i++)
        if (strcmp(g_files[i].path, path) == 0) g_clash = true;
    mfile *f = &g_files[g_nfiles++];
    memcpy(f->path, path, strlen(path) + 1);
    f->p = p;
    f->n = n;
}

static void put_piece(const char *dir, const char *name, const piece *pc)
{
    if (!pc->present) return;
    char p[2 * PATH_MAX];
    int w = snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK(w > 0 && (size_t)w < PATH_MAX); /* the caller keeps the folders short enough */
    put_file(p, pc->p, pc->n);
}

static int (*real_open)(const char *, int, mode_t);
static ssize_t (*real_read)(int, void *, size_t);
static int (*real_close)(int);

static int mem_open(const char *path, int flags, mode_t mode)
{
    if (strncmp(path, BASE "/", sizeof BASE) != 0) return real_open(path, flags, mode);
    CHECK((flags & O_ACCMODE) == O_RDONLY);
    for (int i = g_nfiles - 1; i >= 0; i--) { /* the last one put wins a clash */
        if (strcmp(g_files[i].path, path) != 0) continue;
        for (int s = 0; s < MAX_OPEN; s++)
            if (!g_open[s].used) {
                g_open[s].used = true;
                g_open[s].file = i;
                g_open[s].off = 0;
                return FD_BASE + s;
            }
        CHECK(!"more than MAX_OPEN files open at once");
    }
    errno = ENOENT;
    return -1;
}

static ssize_t mem_read(int fd, void *buf, size_t n)
{
    if (fd < FD_BASE) return real_read(fd, buf, n);
    CHECK(fd - FD_BASE < MAX_OPEN && g_open[fd - FD_BASE].used);
    const mfile *f = &g_files[g_open[fd - FD_BASE].file];
    size_t *off = &g_open[fd - FD_BASE].off;
    size_t k = f->n - *off;
    if (k > n) k = n;
    if (g_chunk && k > g_chunk) k = g_chunk;
    if (k) memcpy(buf, f->p + *off, k);
    *off += k;
    return (ssize_t)k;
}

static int mem_close(int fd)
{
    if (fd < FD_BASE) return real_close(fd);
    CHECK(fd - FD_BASE < MAX_OPEN && g_open[fd - FD_BASE].used);
    g_open[fd - FD_BASE].used = false;
    return 0;
}

static void check_all_closed(void)
{
    for (int s = 0; s < MAX_OPEN; s++) CHECK(!g_open[s].used);
}

#define MAX_DEPTH 16
#define MAX_REL 1024

/* ---- working out the results independently -------------------------------- */

/* The lines of a piece (a last one without '\n' counts); false at the end. */
static bool next_line(const piece *pc, size_t *pos, const uint8_t **line, size_t *len)
{
    if (*pos >= pc->n) return false;
    const uint8_t *s = pc->p + *pos;
    const uint8_t *nl = memchr(s, '\n', pc->n - *pos);
    *line = s;
    *len = nl ? (size_t)(nl - s) : pc->n - *pos;
    *pos += *len + 1;
    return true;
}

/* A line of PATH_MAX bytes or more: the library may skip it (memstat.c reads
 * through a fixed buffer), so such a file is not worked out here. */
static bool has_long_line(const piece *pc)
{
    size_t pos = 0, len;
    const uint8_t *l;
    while (next_line(pc, &pos, &l, &len))
        if (len >= PATH_MAX) return true;
    return false;
}

static bool blank(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Decimal digits only, at least one, below 2^64. */
static bool decimal(const uint8_t *s, size_t n, uint64_t *v)
{
    if (n == 0) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        if (x > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10) return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    *v = x;
    return true;
}

/* A "Key: N kB" line: 1 with *bytes when it is key's and well formed, -1 when
 * it is key's and malformed (or N kB overflows), 0 when it is another key's. */
static int kb_line(const uint8_t *l, size_t n, const char *key, uint64_t *bytes)
{
    size_t k = strlen(key);
    if (n < k + 1 || memcmp(l, key, k) != 0 || l[k] != ':') return 0;
    size_t i = k + 1, e = n;
    while (i < e && (l[i] == ' ' || l[i] == '\t')) i++;
    while (e > i && blank(l[e - 1])) e--;
    if (e - i < 2 || l[e - 2] != 'k' || l[e - 1] != 'B') return -1;
    e -= 2;
    while (e > i && (l[e - 1] == ' ' || l[e - 1] == '\t')) e--;
    uint64_t kb;
    if (!decimal(l + i, e - i, &kb) || kb > UINT64_MAX / 1024) return -1;
    *bytes = kb * 1024;
    return 1;
}

/* The first line of key's in pc: 0 with *bytes, -EINVAL if it is malformed,
 * -ENOENT without one (or without the file). Unknown (1) with a long line. */
static int want_kb_field(const piece *pc, const char *key, uint64_t *bytes)
{
    if (!pc->present) return -ENOENT;
    if (has_long_line(pc)) return 1;
    size_t pos = 0, len;
    const uint8_t *l;
    while (next_line(pc, &pos, &l, &len)) {
        int r = kb_line(l, len, key, bytes);
        if (r > 0) return 0;
        if (r < 0) return -EINVAL;
    }
    return -ENOENT;
}

typedef struct want_self {
    bool known;
    int rc;
    fy_memsnap m;
} want_self;

static want_self want_mem_self(const piece pcs[P_N])
{
    want_self w = {true, 0, {0, 0, 0}};
    const piece *sm = &pcs[P_SMAPS];
    if (!sm->present) {
        uint64_t rss = 0;
        int r = want_kb_field(&pcs[P_STATUS], "VmRSS", &rss);
        if (r > 0) w.known = false;
        w.rc = -ENOENT;
        w.m.rss = r == 0 ? rss : 0;
        return w;
    }
    if (has_long_line(sm)) {
        w.known = false;
        return w;
    }
    static const char *const keys[5] = {"Rss", "Pss", "Private_Clean", "Private_Dirty", "Private_Hugetlb"};
    uint64_t v[5] = {0};
    unsigned seen = 0;
    size_t pos = 0, len;
    const uint8_t *l;
    w.rc = -EINVAL; /* until proven otherwise */
    while (next_line(sm, &pos, &l, &len)) {
        for (int k = 0; k < 5; k++) {
            uint64_t b;
            int r = kb_line(l, len, keys[k], &b);
            if (r < 0 || (r > 0 && (seen & 1u << k))) return w;
            if (r > 0) {
                seen |= 1u << k;
                v[k] = b;
            }
        }
    }
    if ((seen & 15u) != 15u) return w;
    uint64_t uss;
    if (__builtin_add_overflow(v[2], v[3], &uss) || __builtin_add_overflow(uss, v[4], &uss)) return w;
    w.rc = 0;
    w.m.rss = v[0];
    w.m.pss = v[1];
    w.m.uss = uss;
    return w;
}

/* A one-value cgroup file. */
enum { V_ABSENT, V_NUMBER, V_MAX, V_BAD };
static int cg_value(const piece *pc, uint64_t *v)
{
    if (!pc->present) return V_ABSENT;
    if (pc->n >= 64) return V_BAD; /* no kernel value is that long */
    size_t n = pc->n;
    while (n && blank(pc->p[n - 1])) n--;
    if (n == 3 && memcmp(pc->p, "max", 3) == 0) return V_MAX;
    return decimal(pc->p, n, v) ? V_NUMBER : V_BAD;
}

/* The cgroup line of pcs[P_CGROUP] and what fy_cgroup_read should do with it. */
typedef struct cg_path {
    enum {
        CG_UNKNOWN, /* long lines, or several "0::" lines */
        CG_NONE,    /* no file, or no "0::" line: -ENOENT, or v1's outcome */
        CG_INVALID, /* not "/...", a NUL, "." or "..": -EINVAL */
        CG_FAR,     /* valid but not placed here: nothing found there */
        CG_SIMPLE,  /* placed here */
    } kind;
    int depth;
    size_t far_len;                 /* CG_FAR: the cleaned path's length */
    const uint8_t *comp[MAX_DEPTH]; /* components, empty ones dropped */
    size_t clen[MAX_DEPTH];
} cg_path;

static cg_path parse_cgroup(const piece *pc)
{
    cg_path c;
    memset(&c, 0, sizeof c);
    c.kind = CG_NONE;
    if (!pc->present) return c;
    if (has_long_line(pc)) {
        c.kind = CG_UNKNOWN;
        return c;
    }
    const uint8_t *line = NULL, *l;
    size_t pos = 0, len, n = 0;
    int count = 0;
    while (next_line(pc, &pos, &l, &len)) {
        if (len >= 3 && memcmp(l, "0::", 3) == 0) {
            if (count++ == 0) {
                line = l + 3;
                n = len - 3;
            }
        }
    }
    if (count == 0) return c;
    if (count > 1) {
        c.kind = CG_UNKNOWN; /* which one wins is not promised */
        return c;
    }
    if (n == 0 || line[0] != '/' || memchr(line, '\0', n)) {
        c.kind = CG_INVALID;
        return c;
    }
    bool far = false;
    size_t total = 0;
    for (size_t i = 0; i < n;) {
        if (line[i] == '/') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && line[j] != '/') j++;
        size_t cl = j - i;
        if ((cl == 1 && line[i] == '.') || (cl == 2 && line[i] == '.' && line[i + 1] == '.')) {
            c.kind = CG_INVALID;
            return c;
        }
        total += 1 + cl;
        if (c.depth == MAX_DEPTH || cl > NAME_MAX || total > MAX_REL) far = true;
        else {
            c.comp[c.depth] = line + i;
            c.clen[c.depth] = cl;
            c.depth++;
        }
        i = j;
    }
    c.kind = far ? CG_FAR : CG_SIMPLE;
    c.far_len = total;
    return c;
}

/* "/a/b" of the first d components ("" for d = 0). */
static void rel_of(const cg_path *c, int d, char *out, size_t cap)
{
    size_t o = 0;
    for (int i = 0; i < d; i++) {
        CHECK(o + 1 + c->clen[i] < cap);
        out[o++] = '/';
        memcpy(out + o, c->comp[i], c->clen[i]);
        o += c->clen[i];
    }
    out[o] = '\0';
}


/* ---- working out cgroup v1 ------------------------------------------------ */

/* A cleaned path (as memstat.h describes: '/'-led, no NUL, no "." or "..",
 * empty components dropped) of [s, s + n) into out: false when it is not one. */
static bool clean(const uint8_t *s, size_t n, char *out, size_t cap)
{
    if (n == 0 || s[0] != '/' || memchr(s, '\0', n)) return false;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == '/') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && s[j] != '/') j++;
        if ((j - i == 1 && s[i] == '.') || (j - i == 2 && s[i] == '.' && s[i + 1] == '.')) return false;
        CHECK(o + 1 + (j - i) < cap);
        out[o++] = '/';
        memcpy(out + o, s + i, j - i);
        o += j - i;
        i = j;
    }
    out[o] = '\0';
    return true;
}

static bool word_in_list(const uint8_t *s, size_t n, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        if (j - i == wl && memcmp(s + i, word, wl) == 0) return true;
        i = j + 1;
    }
    return false;
}

/* Where v1 leads: its cgroup's folder, and its path in the hierarchy. */
typedef struct v1_where {
    enum {
        V1_UNKNOWN, /* not worked out here */
        V1_NONE,    /* no memory line, no mountinfo, or no mount holds it: -ENOENT */
        V1_INVALID, /* a malformed memory line: -EINVAL */
        V1_FOUND,
    } kind;
    char path[PATH_MAX];  /* the memory line's path, cleaned ("" = the root) */
    char dir[PATH_MAX];   /* its folder in the fake tree */
    bool has_parent;      /* the mount shows its parent */
    char pdir[PATH_MAX];  /* and the parent's folder */
    char ppath[PATH_MAX]; /* and the parent's path */
} v1_where;

static void find_v1(const piece pcs[P_N], v1_where *v)
{
    v->kind = V1_NONE;
    const piece *cg = &pcs[P_CGROUP], *mi = &pcs[P_MOUNTINFO];
    if (!cg->present) return;
    if (has_long_line(cg)) {
        v->kind = V1_UNKNOWN;
        return;
    }
    /* The first line "N:list:/path" whose list holds "memory" (not "0::"). */
    size_t pos = 0, len;
    const uint8_t *l;
    bool found = false;
    while (!found && next_line(cg, &pos, &l, &len)) {
        if (len >= 3 && memcmp(l, "0::", 3) == 0) continue;
        const uint8_t *a = memchr(l, ':', len);
        const uint8_t *b = a ? memchr(a + 1, ':', len - (size_t)(a + 1 - l)) : NULL;
        if (!b || a == l || !word_in_list(a + 1, (size_t)(b - a - 1), "memory")) continue;
        found = true;
        if (!clean(b + 1, len - (size_t)(b + 1 - l), v->path, sizeof v->path)) {
            v->kind = V1_INVALID;
            return;
        }
    }
    if (!found || !mi->present) return;
    if (has_long_line(mi) || memchr(mi->p, '\\', mi->n) || memchr(mi->p, '\0', mi->n)) {
        v->kind = V1_UNKNOWN; /* escapes (and NULs) are left to the unit tests */
        return;
    }
    pos = 0;
    while (next_line(mi, &pos, &l, &len)) {
        /* Fields split at every ' ' (so "a  b" has an empty one), as the kernel writes them. */
        const uint8_t *f[64];
        size_t fl[64];
        int nf = 0, dash = -1;
        size_t i = 0;
        while (i < len) {
            if (nf == 64) {
                v->kind = V1_UNKNOWN;
                return;
            }
            size_t j = i;
            while (j < len && l[j] != ' ') j++;
            f[nf] = l + i;
            fl[nf] = j - i;
            if (dash < 0 && nf >= 6 && fl[nf] == 1 && f[nf][0] == '-') dash = nf;
            nf++;
            i = j + 1;
        }
        if (dash < 0 || nf < dash + 4) continue;
        if (fl[dash + 1] != 6 || memcmp(f[dash + 1], "cgroup", 6) != 0) continue;
        if (!word_in_list(f[dash + 3], fl[dash + 3], "memory")) continue;
        char root[PATH_MAX], mp[PATH_MAX];
        if (!clean(f[3], fl[3], root, sizeof root) || !clean(f[4], fl[4], mp, sizeof mp)) continue;
        size_t rl = strlen(root);
        if (strncmp(v->path, root, rl) != 0 || (v->path[rl] && v->path[rl] != '/')) continue;
        if (strncmp(mp, "/sys/fs/cgroup", 14) != 0 || (mp[14] && mp[14] != '/')) continue;
        /* dir = the fake /sys/fs/cgroup + the rest of the mount point + the path below the root */
        const char *sub = v->path + rl;
        if (sizeof g_cg + strlen(mp) + strlen(sub) + 32 >= PATH_MAX) {
            v->kind = V1_UNKNOWN;
            return;
        }
        int w = snprintf(v->dir, sizeof v->dir, "%s%s%s", g_cg, mp + 14, sub);
        CHECK(w > 0 && (size_t)w < sizeof v->dir);
        v->has_parent = sub[0] != '\0';
        if (v->has_parent) {
            memcpy(v->pdir, v->dir, strlen(v->dir) + 1);
            *strrchr(v->pdir, '/') = '\0';
            memcpy(v->ppath, v->path, strlen(v->path) + 1);
            *strrchr(v->ppath, '/') = '\0';
        }
        v->kind = V1_FOUND;
        return;
    }
}

/* memory.stat: 0 with the two keys' values (seen[k]), -EINVAL when one of
 * them is malformed or there twice; 1 when not worked out (long lines). */
static int want_stat(const piece *pc, const char *const key[2], uint64_t val[2], bool seen[2])
{
    val[0] = val[1] = 0;
    seen[0] = seen[1] = false;
    if (!pc->present) return 0;
    if (has_long_line(pc)) return 1;
    size_t pos = 0, len;
    const uint8_t *l;
    while (next_line(pc, &pos, &l, &len)) {
        for (int k = 0; k < 2; k++) {
            if (!key[k]) continue;
            size_t kl = strlen(key[k]);
            if (len < kl || memcmp(l, key[k], kl) != 0 || (len > kl && l[kl] != ' ')) continue;
            if (seen[k]) return -EINVAL;
            seen[k] = true;
            size_t e = len;
            while (e > kl && blank(l[e - 1])) e--;
            if (e <= kl + 1 || !decimal(l + kl + 1, e - kl - 1, &val[k])) return -EINVAL;
            break;
        }
    }
    return 0;
}

/* The limit's name as memstat.h describes it: true when got is "cgroup
 * <rel>: <what>" (rel "/" for the root), control bytes shown as '?', or, when
 * that does not fit the array, "cgroup ...<end of rel>: <what>" filling it but
 * for the bytes of a UTF-8 character that the cut would have split. */
static bool name_ok(const char *got, const char *rel, const char *what)
{
    const size_t cap = sizeof(((fy_cgroup_mem *)0)->path);
    const char *shown = rel[0] ? rel : "/";
    size_t gl = strlen(got), wl = strlen(what), sl = strlen(shown);
    if (gl >= cap || gl < 7 + 2 + wl) return false;
    if (strncmp(got, "cgroup ", 7) != 0) return false;
    if (memcmp(got + gl - wl - 2, ": ", 2) != 0 || strcmp(got + gl - wl, what) != 0) return false;
    const char *mid = got + 7;
    size_t ml = gl - 7 - 2 - wl, room = cap - (7 + 2 + wl + 1);
    const char *tail = shown;
    if (sl <= room) {
        if (ml != sl) return false;
    } else {
        if (ml < 3 || memcmp(mid, "...", 3) != 0) return false;
        mid += 3;
        ml -= 3;
        if (ml > room - 3) return false;
        tail = shown + sl - ml;
        for (const char *p = shown + sl - (room - 3); p < tail; p++)
            if (((unsigned char)*p & 0xC0) != 0x80) return false; /* cut more than a character */
        if (((unsigned char)*tail & 0xC0) == 0x80) return false;  /* starts inside one */
    }
    for (size_t i = 0; i < ml; i++) {
        unsigned char e = (unsigned char)tail[i];
        char want = e < 0x20 || e == 0x7f ? '?' : (char)e;
        if (mid[i] != want) return false;
    }
    return true;
}

/* ---- the checks ----------------------------------------------------------- */

static bool code_ok(int rc)
{
    return rc == 0 || (rc < 0 && rc > -4096) || (rc <= FERRY_E_BASE && rc >= FERRY_E_LAST);
}

static bool one_line(const char *s, size_t cap)
{
    const char *end = memchr(s, '\0', cap);
    if (!end) return false;
    for (const char *p = s; p < end; p++)
        if (*p == '\n' || *p == '\r') return false;
    return true;
}

static bool g_exact = true;

static void check_mem_self(const piece pcs[P_N])
{
    fy_memsnap m;
    memset(&m, 0xAA, sizeof m);
    int rc = fy_mem_self(&m);
    CHECK(code_ok(rc));
    if (rc == 0) {
        CHECK(m.rss % 1024 == 0 && m.pss % 1024 == 0 && m.uss % 1024 == 0);
    } else if (rc == -ENOENT) {
        CHECK(m.uss == 0 && m.pss == 0 && m.rss % 1024 == 0);
    } else {
        CHECK(m.rss == 0 && m.uss == 0 && m.pss == 0);
    }
    want_self w = want_mem_self(pcs);
    if (!g_exact) return;
    if (w.known) {
        CHECK(rc == w.rc);
        CHECK(m.rss == w.m.rss && m.pss == w.m.pss && m.uss == w.m.uss);
    } else if (!pcs[P_SMAPS].present) {
        CHECK(rc == -ENOENT);
    }
}

/* Place the v2 cgroup's files (and its parent's), and the v1 ones. */
static void place_v2(const cg_path *c, const piece pcs[P_N])
{
    char rel[MAX_REL + 1], dir[PATH_MAX];
    for (int lv = 0; lv < 2; lv++) {
        int d = c->depth - lv;
        if (d < 0) break;
        rel_of(c, d, rel, sizeof rel);
        snprintf(dir, sizeof dir, "%s%s", g_cg, rel);
        for (int f = 0; f < 4; f++) put_piece(dir, cg_files[f], &pcs[(lv ? P_PARENT : P_LEAF) + f]);
        if (lv == 0) put_piece(dir, "memory.stat", &pcs[P_V2STAT]);
    }
}

static void place_v1(const v1_where *v, const piece pcs[P_N])
{
    for (int f = 0; f < 4; f++) put_piece(v->dir, v1_files[f], &pcs[P_V1LEAF + f]);
    if (v->has_parent) put_piece(v->pdir, v1_files[F1_LIMIT], &pcs[P_V1PARENT]);
}

#define V1_NO_LIMIT (1ull << 62)

/* What fy_cgroup_read must give, when it can be worked out here. */
typedef struct want_cg {
    bool known;
    int rc;
    fy_cgroup_mem m;
    const char *rel, *what; /* the name, for name_ok */
} want_cg;

static want_cg want_v2(const cg_path *c, const piece pcs[P_N], char *rel)
{
    want_cg w = {true, 0, {0}, rel, NULL};
    uint64_t v[2][4];
    int kind[2][4];
    for (int lv = 0; lv < 2; lv++)
        for (int f = 0; f < 4; f++)
            kind[lv][f] = lv > c->depth ? V_ABSENT : cg_value(&pcs[(lv ? P_PARENT : P_LEAF) + f], &v[lv][f]);
    static const char *const keys[2] = {"inactive_file", NULL};
    uint64_t sv[2];
    bool seen[2];
    int src = want_stat(&pcs[P_V2STAT], keys, sv, seen);
    if (src > 0) {
        w.known = false;
        return w;
    }
    bool einval = src < 0;
    if (kind[0][F_CURRENT] == V_BAD || kind[0][F_CURRENT] == V_MAX) einval = true;
    if (kind[0][F_PEAK] == V_BAD || kind[0][F_PEAK] == V_MAX) einval = true;
    int best_lv = -1, best_f = -1;
    for (int lv = 0; lv < 2; lv++)
        for (int f = F_MAX; f <= F_HIGH; f++) {
            if (kind[lv][f] == V_BAD) einval = true;
            if (kind[lv][f] != V_NUMBER) continue;
            /* A tie goes to the deepest level, then to memory.max. */
            if (best_lv < 0 || v[lv][f] < v[best_lv][best_f]) {
                best_lv = lv;
                best_f = f;
            }
        }
    if (einval) {
        w.rc = -EINVAL;
        return w;
    }
    w.m.version = 2;
    w.m.current = v[0][F_CURRENT];
    w.m.has_peak = kind[0][F_PEAK] == V_NUMBER;
    w.m.peak = w.m.has_peak ? v[0][F_PEAK] : 0;
    w.m.reclaimable = sv[0];
    if (best_lv < 0) {
        rel_of(c, c->depth, rel, MAX_REL + 1);
        w.what = "no limit";
    } else {
        w.m.limited = 1;
        w.m.limit = v[best_lv][best_f];
        rel_of(c, c->depth - best_lv, rel, MAX_REL + 1);
        w.what = cg_files[best_f];
    }
    return w;
}

static want_cg want_v1(const v1_where *vw, const piece pcs[P_N])
{
    want_cg w = {true, 0, {0}, NULL, NULL};
    if (vw->kind == V1_UNKNOWN) {
        w.known = false;
        return w;
    }
    if (vw->kind != V1_FOUND) {
        w.rc = vw->kind == V1_INVALID ? -EINVAL : -ENOENT;
        return w;
    }
    uint64_t v[5];
    int kind[5]; /* limit, usage, max_usage, -, parent's limit */
    for (int f = 0; f < 5; f++)
        kind[f] =
            f == F1_STAT || (f == 4 && !vw->has_parent) ? V_ABSENT : cg_value(&pcs[P_V1LEAF + f], &v[f]);
    static const char *const keys[2] = {"total_inactive_file", "hierarchical_memory_limit"};
    uint64_t sv[2];
    bool seen[2];
    int src = want_stat(&pcs[P_V1LEAF + F1_STAT], keys, sv, seen);
    if (src > 0) {
        w.known = false;
        return w;
    }
    if (kind[F1_USAGE] == V_ABSENT) {
        w.rc = -ENOENT;
        return w;
    }
    bool einval = src < 0;
    for (int f = 0; f < 5; f++)
        if (kind[f] == V_BAD || kind[f] == V_MAX) einval = true;
    if (einval) {
        w.rc = -EINVAL;
        return w;
    }
    w.m.version = 1;
    w.m.current = v[F1_USAGE];
    w.m.has_peak = kind[F1_MAXUSAGE] == V_NUMBER;
    w.m.peak = w.m.has_peak ? v[F1_MAXUSAGE] : 0;
    w.m.reclaimable = sv[0];
    w.rel = vw->path;
    w.what = "no limit";
    static const int order[2] = {F1_LIMIT, 4}; /* the deepest first: it wins a tie */
    for (int i = 0; i < 2; i++) {
        int f = order[i];
        if (kind[f] != V_NUMBER || v[f] >= V1_NO_LIMIT) continue;
        if (!w.m.limited || v[f] < w.m.limit) {
            w.m.limited = 1;
            w.m.limit = v[f];
            w.rel = f == 4 ? vw->ppath : vw->path;
            w.what = v1_files[F1_LIMIT];
        }
    }
    if (seen[1] && sv[1] < V1_NO_LIMIT && (!w.m.limited || sv[1] < w.m.limit)) {
        w.m.limited = 1;
        w.m.limit = sv[1];
        w.rel = vw->path;
        w.what = "memory.stat hierarchical_memory_limit";
    }
    return w;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

/* fy_cgroup_read; *got (and its code) is kept for fy_host_available's checks. */
static int check_cgroup(const piece pcs[P_N], const cg_path *c, bool placed, const v1_where *vw,
                        fy_cgroup_mem *got)
{
    memset(got, 0xAA, sizeof *got);
    int rc = fy_cgroup_read(got);
    CHECK(code_ok(rc));
    CHECK(memchr(got->path, '\0', sizeof got->path) != NULL);
    if (rc < 0) {
        CHECK(!got->limited && got->limit == 0 && got->current == 0 && got->peak == 0 && !got->has_peak);
        CHECK(got->version == 0 && got->reclaimable == 0);
        for (size_t i = 0; i < sizeof got->path; i++) CHECK(got->path[i] == '\0');
    } else {
        CHECK(got->version == 1 || got->version == 2);
        CHECK(got->limited == 0 || got->limited == 1);
        CHECK(got->has_peak == 0 || got->has_peak == 1);
        CHECK(got->has_peak || got->peak == 0);
        CHECK(got->limited || got->limit == 0);
        CHECK(one_line(got->path, sizeof got->path));
        CHECK(strncmp(got->path, "cgroup ", 7) == 0);
        if (!got->limited) CHECK(ends_with(got->path, ": no limit"));
        else if (got->version == 2)
            CHECK(ends_with(got->path, ": memory.max") || ends_with(got->path, ": memory.high"));
        else
            CHECK(ends_with(got->path, ": memory.limit_in_bytes") ||
                  ends_with(got->path, ": memory.stat hierarchical_memory_limit"));
        if (got->version == 1) CHECK(!got->limited || got->limit < V1_NO_LIMIT);
    }

    /* What cannot resolve to a folder of the tree cannot succeed. */
    if (c->kind == CG_INVALID) CHECK(rc == -EINVAL);
    bool v1_possible = vw->kind == V1_FOUND || vw->kind == V1_UNKNOWN;
    if (c->kind == CG_NONE && !v1_possible) CHECK(rc == -ENOENT || rc == -EINVAL);
    if (c->kind == CG_FAR && !v1_possible) CHECK(rc == -ENOENT || rc == -ENAMETOOLONG || rc == -EINVAL);

    /* The limit is never above a limit value written where the path leads. */
    if (rc == 0 && got->version == 2 && placed) {
        for (int lv = 0; lv < 2 && lv <= c->depth; lv++)
            for (int f = F_MAX; f <= F_HIGH; f++) {
                uint64_t v;
                if (cg_value(&pcs[(lv ? P_PARENT : P_LEAF) + f], &v) == V_NUMBER)
                    CHECK(got->limited && got->limit <= v);
            }
    }
    if (rc == 0 && got->version == 1 && vw->kind == V1_FOUND && !g_clash) {
        uint64_t v;
        if (cg_value(&pcs[P_V1LEAF + F1_LIMIT], &v) == V_NUMBER && v < V1_NO_LIMIT)
            CHECK(got->limited && got->limit <= v);
        if (vw->has_parent && cg_value(&pcs[P_V1PARENT], &v) == V_NUMBER && v < V1_NO_LIMIT)
            CHECK(got->limited && got->limit <= v);
    }
    if (!g_exact || g_clash || c->kind == CG_UNKNOWN) return rc;

    /* The exact outcome: v2 where its memory.current is there, else v1. */
    char rel[MAX_REL + 1];
    want_cg w;
    uint64_t cur;
    int ck = placed ? cg_value(&pcs[P_LEAF + F_CURRENT], &cur) : V_ABSENT;
    if (c->kind == CG_INVALID) return rc;
    if (c->kind == CG_FAR && strlen(g_cg) + c->far_len + strlen("/memory.current") >= PATH_MAX) {
        CHECK(rc == -ENAMETOOLONG);
        return rc;
    }
    if (ck != V_ABSENT) w = want_v2(c, pcs, rel);
    else w = want_v1(vw, pcs);
    if (!w.known) return rc;
    CHECK(rc == w.rc);
    if (rc < 0) return rc;
    CHECK(got->version == w.m.version);
    CHECK(got->current == w.m.current);
    CHECK(got->has_peak == w.m.has_peak && got->peak == w.m.peak);
    CHECK(got->reclaimable == w.m.reclaimable);
    CHECK(got->limited == w.m.limited && got->limit == w.m.limit);
    CHECK(name_ok(got->path, w.rel, w.what));
    return rc;
}

static void check_host(const piece pcs[P_N], int cg_rc, const fy_cgroup_mem *cg, uint64_t pick)
{
    /* The source buffer: absent, empty, or of some size, allocated to the byte
     * so that AddressSanitizer sees a write past it. */
    static const size_t sizes[] = {0, 0, 1, 2, 12, 27, 40, 64, 96, 128, 200};
    size_t k = (size_t)(pick % (sizeof sizes / sizeof sizes[0]));
    size_t n = sizes[k];
    char *src = k == 0 ? NULL : malloc(n ? n : 1);
    if (k != 0) {
        CHECK(src != NULL);
        memset(src, 'Z', n ? n : 1);
    }
    uint64_t avail = 0xAAAAAAAAAAAAAAAAull;
    int rc = fy_host_available(&avail, src, n);
    CHECK(code_ok(rc));
    if (src && n == 0) CHECK(src[0] == 'Z'); /* n = 0: not one byte written */
    if (src && n) {
        CHECK(one_line(src, n));
        if (rc < 0) CHECK(src[0] == '\0');
    }
    if (rc < 0) CHECK(avail == 0);

    /* A cgroup that exists but cannot be read is an error, not ignored. */
    if (cg_rc < 0 && cg_rc != -ENOENT) CHECK(rc == cg_rc);
    bool limited = cg_rc == 0 && cg->limited;
    uint64_t used = 0, room = 0;
    if (limited) {
        used = cg->current > cg->reclaimable ? cg->current - cg->reclaimable : 0;
        room = cg->limit > used ? cg->limit - used : 0;
        CHECK(rc == 0 && avail <= room);
    }

    uint64_t host = 0;
    int hrc = want_kb_field(&pcs[P_MEMINFO], "MemAvailable", &host);
    char want[256];
    want[0] = '\0';
    if (g_exact && hrc <= 0 && (cg_rc == 0 || cg_rc == -ENOENT)) {
        if (limited) {
            bool lower = hrc == 0 && host < room;
            CHECK(avail == (lower ? host : room));
            snprintf(want, sizeof want, "%s%s", cg->path, lower ? " (host MemAvailable is lower)" : "");
        } else {
            CHECK(rc == hrc);
            if (rc == 0) CHECK(avail == host);
            if (rc == 0) snprintf(want, sizeof want, "/proc/meminfo MemAvailable");
        }
        if (src && n) {
            size_t wl = strlen(want) < n - 1 ? strlen(want) : n - 1;
            CHECK(strlen(src) == wl && memcmp(src, want, wl) == 0);
        }
    }
    free(src);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        init = true;
        g_exact = !skip("exact");
        /* Roots too long to hold: every call fails cleanly, outputs zeroed. */
        static char longroot[PATH_MAX + 1];
        memset(longroot, 'r', PATH_MAX);
        fy_memstat_set_roots(longroot, longroot);
        fy_memsnap m;
        fy_cgroup_mem cg;
        uint64_t a = 1;
        char s[8] = "x";
        CHECK(fy_mem_self(&m) == -ENAMETOOLONG && m.rss == 0 && m.pss == 0 && m.uss == 0);
        CHECK(fy_cgroup_read(&cg) == -ENAMETOOLONG && cg.path[0] == '\0' && !cg.limited);
        CHECK(fy_host_available(&a, s, sizeof s) == -ENAMETOOLONG && a == 0 && s[0] == '\0');
        real_open = (int (*)(const char *, int, mode_t))fy_sys_get("open");
        real_read = (ssize_t(*)(int, void *, size_t))fy_sys_get("read");
        real_close = (int (*)(int))fy_sys_get("close");
        CHECK(fy_sys_set("open", (fy_sys_fn)mem_open) == 0);
        CHECK(fy_sys_set("read", (fy_sys_fn)mem_read) == 0);
        CHECK(fy_sys_set("close", (fy_sys_fn)mem_close) == 0);
        fy_memstat_set_roots(g_proc, g_cg);
    }

    piece pcs[P_N];
    split(data, size, pcs);
    uint64_t h = fnv1a(data, size);
    static const size_t chunks[] = {0, 0, 0, 0, 1, 2, 3, 7, 64, 100, 4095};
    g_chunk = chunks[(h >> 8) % (sizeof chunks / sizeof chunks[0])];
    g_nfiles = 0;
    g_clash = false;
    /* Bait above the cgroup root: a walk that climbed out of it would find a
     * limit of 1 byte here and report it. */
    static const char *const bait[] = {"memory.max", "memory.high", "memory.current", "memory.limit_in_bytes",
                                       "memory.usage_in_bytes"};
    for (size_t i = 0; i < sizeof bait / sizeof *bait; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", BASE, bait[i]);
        put_file(p, (const uint8_t *)"1\n", 2);
    }
    put_piece(g_proc, "self/smaps_rollup", &pcs[P_SMAPS]);
    put_piece(g_proc, "self/status", &pcs[P_STATUS]);
    put_piece(g_proc, "self/cgroup", &pcs[P_CGROUP]);
    put_piece(g_proc, "meminfo", &pcs[P_MEMINFO]);
    put_piece(g_proc, "self/mountinfo", &pcs[P_MOUNTINFO]);
    cg_path c = parse_cgroup(&pcs[P_CGROUP]);
    bool placed = c.kind == CG_SIMPLE;
    if (placed) place_v2(&c, pcs);
    static v1_where vw; /* four paths: too big for libFuzzer's stack to be comfortable */
    find_v1(pcs, &vw);
    if (vw.kind == V1_FOUND) place_v1(&vw, pcs);

    check_mem_self(pcs);
    check_all_closed();
    fy_cgroup_mem cg;
    int cg_rc = check_cgroup(pcs, &c, placed, &vw, &cg);
    check_all_closed();
    check_host(pcs, cg_rc, &cg, h);
    check_all_closed();
    return 0;
}
