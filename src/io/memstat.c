/* SPDX-License-Identifier: Apache-2.0 */
/* memstat.c - see memstat.h. Every file is read through a fixed buffer and
 * parsed line by line, so an odd file costs a clean error, never a crash. */
#define _GNU_SOURCE
#include "memstat.h"
#include "io.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- roots ---------------------------------------------------------------- */

static char g_proc_root[PATH_MAX] = "/proc";
static char g_cg_root[PATH_MAX] = "/sys/fs/cgroup";
static bool g_proc_bad, g_cg_bad; /* a root too long to hold: every read fails */

static void set_root(char *dst, bool *bad, const char *src, const char *dflt)
{
    if (!src) src = dflt;
    size_t len = strlen(src);
    *bad = len >= PATH_MAX;
    if (*bad) dst[0] = '\0';
    else memcpy(dst, src, len + 1);
}

void fy_memstat_set_roots(const char *proc_root, const char *cgroup_root)
{
    set_root(g_proc_root, &g_proc_bad, proc_root, "/proc");
    set_root(g_cg_root, &g_cg_bad, cgroup_root, "/sys/fs/cgroup");
}

/* dst = a + b + c, or -ENAMETOOLONG. */
static int join3(char *dst, size_t n, const char *a, const char *b, const char *c)
{
    int w = snprintf(dst, n, "%s%s%s", a, b, c);
    if (w < 0 || (size_t)w >= n) return -ENAMETOOLONG;
    return 0;
}

/* ---- reading -------------------------------------------------------------- */

/* Holds any line the kernel writes in these files: a cgroup line is at most
 * "0::" + PATH_MAX. Longer lines are skipped whole, never cut into pieces
 * that could parse as something else. */
#define LINE_BUF (PATH_MAX + 256)

/* fn returns 0 to go on, > 0 to stop early (success), < 0 to fail with it. */
typedef int (*line_fn)(void *arg, const char *line, size_t len);

/* Call fn for every line of path (without its '\n'); a last line without a
 * newline counts too. */
static int for_each_line(const char *path, line_fn fn, void *arg)
{
    int fd = fy_open_sysfile(path);
    if (fd < 0) return fd;
    char buf[LINE_BUF];
    size_t have = 0;
    bool skipping = false; /* inside a line longer than buf */
    int rc = 0;
    for (;;) {
        ssize_t r = fy_read_some(fd, buf + have, sizeof buf - have);
        if (r < 0) {
            rc = (int)r;
            break;
        }
        have += (size_t)r;
        size_t start = 0;
        char *nl;
        while ((nl = memchr(buf + start, '\n', have - start)) != NULL) {
            size_t len = (size_t)(nl - (buf + start));
            if (!skipping) rc = fn(arg, buf + start, len);
            skipping = false;
            start += len + 1;
            if (rc) goto out;
        }
        memmove(buf, buf + start, have - start);
        have -= start;
        if (r == 0) {
            if (have && !skipping) rc = fn(arg, buf, have);
            break;
        }
        if (have == sizeof buf) {
            skipping = true;
            have = 0;
        }
    }
out:
    fy_close(fd);
    return rc < 0 ? rc : 0;
}

/* Strict decimal: digits only, at least one, fits in 64 bits. */
static int parse_u64(const char *s, size_t len, uint64_t *v)
{
    if (len == 0) return -EINVAL;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -EINVAL;
        if (fy_mul_ovf(x, 10, &x) || fy_add_ovf(x, (uint64_t)(s[i] - '0'), &x)) return -EINVAL;
    }
    *v = x;
    return 0;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* "Key:   123 kB" with exactly this key: 1 and *bytes set; 0 for another key;
 * -EINVAL when the key matches but the rest is not a number of kB. */
static int kv_kb(const char *line, size_t len, const char *key, uint64_t *bytes)
{
    size_t klen = strlen(key);
    if (len <= klen || memcmp(line, key, klen) != 0 || line[klen] != ':') return 0;
    size_t i = klen + 1;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t d = i;
    while (i < len && line[i] >= '0' && line[i] <= '9') i++;
    uint64_t kb;
    if (parse_u64(line + d, i - d, &kb) < 0) return -EINVAL;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (len - i < 2 || memcmp(line + i, "kB", 2) != 0) return -EINVAL;
    for (i += 2; i < len; i++)
        if (!is_blank(line[i])) return -EINVAL;
    if (fy_mul_ovf(kb, 1024, bytes)) return -EINVAL;
    return 1;
}

/* A one-value cgroup file: a number, or "max" (*unlimited = true) when
 * max_ok. A uint64 has at most 20 digits, so anything long is malformed. */
static int read_cg_value(const char *path, bool max_ok, uint64_t *v, bool *unlimited)
{
    int fd = fy_open_sysfile(path);
    if (fd < 0) return fd;
    char buf[64];
    size_t have = 0;
    ssize_t r = 0;
    while (have < sizeof buf && (r = fy_read_some(fd, buf + have, sizeof buf - have)) > 0) have += (size_t)r;
    fy_close(fd);
    if (r < 0) return (int)r;
    if (have == sizeof buf) return -EINVAL;
    while (have && is_blank(buf[have - 1])) have--;
    *unlimited = false;
    *v = 0;
    if (max_ok && have == 3 && memcmp(buf, "max", 3) == 0) {
        *unlimited = true;
        return 0;
    }
    return parse_u64(buf, have, v);
}

/* ---- this process --------------------------------------------------------- */

enum { K_RSS, K_PSS, K_PCLEAN, K_PDIRTY, K_PHUGE, K_N };
static const char *const rollup_keys[K_N] = {"Rss", "Pss", "Private_Clean", "Private_Dirty",
                                             "Private_Hugetlb"};

typedef struct rollup {
    uint64_t v[K_N];
    unsigned seen;
} rollup;

static int rollup_line(void *arg, const char *line, size_t len)
{
    rollup *r = arg;
    for (int k = 0; k < K_N; k++) {
        uint64_t b;
        int rc = kv_kb(line, len, rollup_keys[k], &b);
        if (rc < 0) return rc;
        if (rc == 0) continue;
        if (r->seen & (1u << k)) return -EINVAL; /* which of two values would be true? */
        r->seen |= 1u << k;
        r->v[k] = b;
        return 0;
    }
    return 0;
}

typedef struct one_kb {
    const char *key;
    uint64_t v;
    bool found;
} one_kb;

static int one_kb_line(void *arg, const char *line, size_t len)
{
    one_kb *o = arg;
    int rc = kv_kb(line, len, o->key, &o->v);
    if (rc > 0) o->found = true;
    return rc;
}

/* Read "Key: N kB" from a file: 0, -ENOENT when absent, -EINVAL, -errno. */
static int read_kb_field(const char *path, const char *key, uint64_t *bytes)
{
    one_kb o = {key, 0, false};
    int rc = for_each_line(path, one_kb_line, &o);
    if (rc < 0) return rc;
    if (!o.found) return -ENOENT;
    *bytes = o.v;
    return 0;
}

static int mem_self_at(const char *proc_root, fy_memsnap *out)
{
    char path[PATH_MAX];
    memset(out, 0, sizeof *out);
    if (!proc_root) return -ENAMETOOLONG;
    FY_TRY(join3(path, sizeof path, proc_root, "/self/smaps_rollup", ""));
    rollup r = {{0}, 0};
    int rc = for_each_line(path, rollup_line, &r);
    if (rc == -ENOENT) {
        uint64_t rss;
        if (join3(path, sizeof path, proc_root, "/self/status", "") == 0 &&
            read_kb_field(path, "VmRSS", &rss) == 0)
            out->rss = rss;
        return -ENOENT;
    }
    if (rc < 0) return rc;
    const unsigned need = 1u << K_RSS | 1u << K_PSS | 1u << K_PCLEAN | 1u << K_PDIRTY;
    if ((r.seen & need) != need) return -EINVAL;
    uint64_t uss;
    if (fy_add_ovf(r.v[K_PCLEAN], r.v[K_PDIRTY], &uss) || fy_add_ovf(uss, r.v[K_PHUGE], &uss)) return -EINVAL;
    out->rss = r.v[K_RSS];
    out->pss = r.v[K_PSS];
    out->uss = uss;
    return 0;
}

int fy_mem_self(fy_memsnap *out)
{
    if (!out) return -EINVAL;
    return mem_self_at(g_proc_bad ? NULL : g_proc_root, out);
}

/* ---- cgroups -------------------------------------------------------------- */

/* A cgroup path "/a//b/" into out as "/a/b" ("" for the root), from the bytes
 * [p, end), which may be out itself (out never runs ahead of p): it must
 * start with '/' and hold no NUL; "." and ".." components are refused, so
 * that walking up can never leave the hierarchy (nor, for a mount point, the
 * tree it is read from). */
static int clean_path(const char *p, const char *end, char out[PATH_MAX])
{
    if (p == end || *p != '/' || memchr(p, '\0', (size_t)(end - p))) return -EINVAL;
    size_t o = 0;
    while (p < end) {
        while (p < end && *p == '/') p++;
        const char *q = p;
        while (q < end && *q != '/') q++;
        size_t n = (size_t)(q - p);
        if (n == 0) break;
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return -EINVAL;
        if (o + 1 + n >= PATH_MAX) return -ENAMETOOLONG;
        out[o++] = '/';
        memmove(out + o, p, n);
        o += n;
        p = q;
    }
    out[o] = '\0';
    return 0;
}

/* Whether the comma-separated list [p, end) holds the word "memory". */
static bool has_memory(const char *p, const char *end)
{
    while (p < end) {
        const char *q = memchr(p, ',', (size_t)(end - p));
        if (!q) q = end;
        if (q - p == 6 && memcmp(p, "memory", 6) == 0) return true;
        p = q + 1;
    }
    return false;
}

/* /proc/self/cgroup: the v2 line "0::/a/b" and the v1 memory controller's
 * "N:memory:/a/b" (or "N:cpu,memory:/a/b"); the first of each kind counts. */
typedef struct cg_lines {
    char *v2, *v1;  /* PATH_MAX bytes each, cleaned as clean_path does */
    int v2rc, v1rc; /* 0 no such line, 1 found, < 0 malformed */
} cg_lines;

static int cgroup_line(void *arg, const char *line, size_t len)
{
    cg_lines *c = arg;
    const char *end = line + len;
    if (len >= 3 && memcmp(line, "0::", 3) == 0) {
        if (c->v2rc == 0) {
            int rc = clean_path(line + 3, end, c->v2);
            c->v2rc = rc < 0 ? rc : 1;
        }
        return 0;
    }
    const char *a = memchr(line, ':', len);
    const char *b = a ? memchr(a + 1, ':', (size_t)(end - a - 1)) : NULL;
    if (!b || a == line || c->v1rc != 0 || !has_memory(a + 1, b)) return 0;
    int rc = clean_path(b + 1, end, c->v1);
    c->v1rc = rc < 0 ? rc : 1;
    return 0;
}

/* Which files say what, per version. v1 marks "no limit" with a huge number
 * (PAGE_COUNTER_MAX pages: 9223372036854771712 with 4 KiB pages); anything
 * from 2^62 up is taken for that, as no machine has that much memory. The
 * page cache the kernel would drop before it reclaims anything else (the
 * inactive file pages) is not the cgroup's debt: a checkpoint read through
 * the cache is charged to the cgroup that read it, and counting it would make
 * the budget shrink with every load. The active file pages stay counted
 * (reclaimed only once they go inactive), as does shmem (not reclaimable
 * without swap), so what is subtracted is the same as kubelet's working set
 * and is the same on v1 (total_inactive_file: it and its children, as
 * usage_in_bytes) and v2 (inactive_file: memory.current is hierarchical). */
typedef struct cg_files {
    int version;
    const char *current, *peak, *reclaim_key, *limit_key; /* limit_key: in memory.stat, or NULL */
    const char *limits[2];
    bool max_word;  /* "max" means no limit */
    bool huge_none; /* a limit from 2^62 up means none */
} cg_files;

static const cg_files v2_files = {
    2,    "/memory.current", "/memory.peak", "inactive_file", NULL, {"/memory.max", "/memory.high"}, true,
    false};
static const cg_files v1_files = {1,
                                  "/memory.usage_in_bytes",
                                  "/memory.max_usage_in_bytes",
                                  "total_inactive_file",
                                  "hierarchical_memory_limit",
                                  {"/memory.limit_in_bytes", NULL},
                                  false,
                                  true};
#define V1_NO_LIMIT (1ull << 62)

/* Where the process's memory cgroup is: dir = base + sub is its folder and
 * name = mount root + sub its path in the hierarchy (for messages); the walk
 * up strips components of sub until dir is dir_top bytes long (the highest
 * level this process can see: the cgroup root for v2, the mount's root for
 * v1). current: its memory.current or memory.usage_in_bytes. */
typedef struct cg_where {
    const cg_files *f;
    char dir[PATH_MAX], name[PATH_MAX];
    size_t dir_top;
    uint64_t current;
} cg_where;

/* mountinfo: "36 25 0:32 ROOT MOUNTPOINT OPTS [OPTIONAL...] - TYPE SOURCE SUPEROPTS". */
typedef struct mnt_find {
    const char *path;    /* the process's v1 path, cleaned */
    const char *cg_root; /* where /sys/fs/cgroup is read from */
    bool redirected;     /* cg_root is not /sys/fs/cgroup */
    cg_where *w;
    int rc; /* 1 found, < 0 the first path error (too long) */
} mnt_find;

/* A mountinfo field with the kernel's octal escapes (\040 for ' ', \011,
 * \012, \134) undone, into out (PATH_MAX bytes): its length, or -1. */
static long unescape(const char *p, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\') {
            if (n - i < 4) return -1;
            unsigned v = 0;
            for (int k = 1; k <= 3; k++) {
                if (p[i + k] < '0' || p[i + k] > '7') return -1;
                v = v * 8 + (unsigned)(p[i + k] - '0');
            }
            if (v == 0 || v > 255) return -1;
            c = (char)v;
            i += 3;
        }
        if (o + 1 >= PATH_MAX) return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return (long)o;
}

static int mount_line(void *arg, const char *line, size_t len)
{
    mnt_find *m = arg;
    const char *fld[64];
    size_t flen[64];
    int nf = 0, dash = -1;
    for (size_t i = 0; i < len && nf < 64;) {
        size_t j = i;
        while (j < len && line[j] != ' ') j++;
        fld[nf] = line + i;
        flen[nf] = j - i;
        if (dash < 0 && nf >= 6 && flen[nf] == 1 && fld[nf][0] == '-') dash = nf;
        nf++;
        i = j + 1;
    }
    /* Lines this does not understand are not the memory controller's mount. */
    if (dash < 0 || nf < dash + 4) return 0;
    if (flen[dash + 1] != 6 || memcmp(fld[dash + 1], "cgroup", 6) != 0) return 0;
    if (!has_memory(fld[dash + 3], fld[dash + 3] + flen[dash + 3])) return 0;
    char root[PATH_MAX], mp[PATH_MAX];
    long n = unescape(fld[3], flen[3], root);
    if (n < 0 || clean_path(root, root + n, root) < 0) return 0;
    n = unescape(fld[4], flen[4], mp);
    if (n < 0 || clean_path(mp, mp + n, mp) < 0) return 0;
    /* The mount shows the hierarchy from root down: is the process in it? */
    size_t rl = strlen(root);
    if (strncmp(m->path, root, rl) != 0 || (m->path[rl] != '\0' && m->path[rl] != '/')) return 0;
    static const char sysfs[] = "/sys/fs/cgroup";
    const size_t sl = sizeof sysfs - 1;
    const char *base_a, *base_b;
    if (strncmp(mp, sysfs, sl) == 0 && (mp[sl] == '\0' || mp[sl] == '/')) {
        base_a = m->cg_root;
        base_b = mp + sl;
    } else if (!m->redirected) {
        base_a = mp;
        base_b = "";
    } else {
        return 0; /* a fake tree holds only what is under /sys/fs/cgroup */
    }
    cg_where *w = m->w;
    int rc = join3(w->dir, sizeof w->dir, base_a, base_b, m->path + rl);
    w->dir_top = strlen(base_a) + strlen(base_b);
    if (rc < 0) {
        if (m->rc == 0) m->rc = rc;
        return 0;
    }
    memcpy(w->name, m->path, strlen(m->path) + 1);
    m->rc = 1;
    return 1;
}

/* The process's memory cgroup: v2 where its memory.current exists, else v1's
 * memory controller where mountinfo shows it mounted. *w is filled on 0. */
static int cgroup_find(const char *proc_root, const char *cg_root, cg_where *w)
{
    char path[PATH_MAX], v2[PATH_MAX], v1[PATH_MAX];
    bool unl;
    if (!proc_root || !cg_root) return -ENAMETOOLONG;
    FY_TRY(join3(path, sizeof path, proc_root, "/self/cgroup", ""));
    cg_lines c = {v2, v1, 0, 0};
    FY_TRY(for_each_line(path, cgroup_line, &c));
    if (c.v2rc < 0) return c.v2rc;
    if (c.v2rc == 1) {
        w->f = &v2_files;
        FY_TRY(join3(w->dir, sizeof w->dir, cg_root, v2, ""));
        w->dir_top = strlen(cg_root);
        memcpy(w->name, v2, strlen(v2) + 1);
        FY_TRY(join3(path, sizeof path, w->dir, w->f->current, ""));
        int rc = read_cg_value(path, false, &w->current, &unl);
        if (rc != -ENOENT) return rc; /* else the memory controller is not on v2: a v1 or hybrid host */
    }
    if (c.v1rc <= 0) return c.v1rc < 0 ? c.v1rc : -ENOENT;
    FY_TRY(join3(path, sizeof path, proc_root, "/self/mountinfo", ""));
    mnt_find m = {v1, cg_root, strcmp(cg_root, "/sys/fs/cgroup") != 0, w, 0};
    FY_TRY(for_each_line(path, mount_line, &m));
    if (m.rc <= 0) return m.rc < 0 ? m.rc : -ENOENT;
    w->f = &v1_files;
    FY_TRY(join3(path, sizeof path, w->dir, w->f->current, ""));
    return read_cg_value(path, false, &w->current, &unl);
}

/* memory.stat: "key value" lines; only the keys asked for are checked. */
typedef struct stat_find {
    const char *key[2];
    uint64_t v[2];
    bool seen[2];
} stat_find;

static int stat_line(void *arg, const char *line, size_t len)
{
    stat_find *s = arg;
    for (int k = 0; k < 2; k++) {
        if (!s->key[k]) continue;
        size_t kl = strlen(s->key[k]);
        if (len < kl || memcmp(line, s->key[k], kl) != 0 || (len > kl && line[kl] != ' ')) continue;
        if (s->seen[k]) return -EINVAL; /* which of two values would be true? */
        s->seen[k] = true;
        size_t e = len;
        while (e > kl + 1 && is_blank(line[e - 1])) e--;
        return e > kl ? parse_u64(line + kl + 1, e - kl - 1, &s->v[k]) : -EINVAL;
    }
    return 0;
}

/* "cgroup <rel>: <what>" into dst (n bytes), rel being the first rel_len bytes
 * of a cgroup path; a long path keeps its end, where the service or container
 * name is, and control bytes become '?'. */
static void name_limit(char *dst, size_t n, const char *rel, size_t rel_len, const char *what)
{
    const char *shown = rel_len ? rel : "/";
    size_t len = rel_len ? rel_len : 1;
    size_t fixed = strlen("cgroup ") + strlen(": ") + strlen(what) + 1;
    size_t room = n > fixed ? n - fixed : 0;
    const char *ell = "";
    if (len > room && room > 3) {
        size_t cut = len - (room - 3);
        while (cut < len && ((unsigned char)shown[cut] & 0xC0) == 0x80)
            cut++; /* not inside a UTF-8 character */
        shown += cut;
        len -= cut;
        ell = "...";
    }
    snprintf(dst, n, "cgroup %s%.*s: %s", ell, (int)len, shown, what);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

static int cgroup_read_at(const char *proc_root, const char *cg_root, fy_cgroup_mem *out)
{
    cg_where w;
    char path[PATH_MAX];
    bool unl;
    memset(out, 0, sizeof *out);
    FY_TRY(cgroup_find(proc_root, cg_root, &w));
    const cg_files *f = w.f;
    out->version = f->version;
    out->current = w.current;
    FY_TRY(join3(path, sizeof path, w.dir, f->peak, ""));
    int rc = read_cg_value(path, false, &out->peak, &unl);
    if (rc == 0) out->has_peak = 1;
    else if (rc != -ENOENT) return rc;

    stat_find st = {{f->reclaim_key, f->limit_key}, {0, 0}, {false, false}};
    FY_TRY(join3(path, sizeof path, w.dir, "/memory.stat", ""));
    rc = for_each_line(path, stat_line, &st);
    if (rc < 0 && rc != -ENOENT) return rc;
    out->reclaimable = st.v[0];

    /* Walk up: the kernel enforces every ancestor's limit on us too. */
    size_t dl = strlen(w.dir), nl = strlen(w.name);
    for (;;) {
        for (int i = 0; i < 2 && f->limits[i]; i++) {
            uint64_t v;
            w.dir[dl] = '\0';
            FY_TRY(join3(path, sizeof path, w.dir, f->limits[i], ""));
            rc = read_cg_value(path, f->max_word, &v, &unl);
            if (rc == -ENOENT || (rc == 0 && (unl || (f->huge_none && v >= V1_NO_LIMIT)))) continue;
            if (rc < 0) return rc;
            if (!out->limited || v < out->limit) {
                out->limited = 1;
                out->limit = v;
                name_limit(out->path, sizeof out->path, w.name, nl, f->limits[i] + 1);
            }
        }
        if (dl == w.dir_top) break;
        size_t k = dl;
        while (k > w.dir_top && w.dir[k - 1] != '/') k--;
        k--; /* the '/' before the last component: sub ends in the same bytes in dir and name */
        nl -= dl - k;
        dl = k;
    }
    /* v1 sums the ancestors this process cannot see (a container whose mount
     * starts at its own cgroup) into the leaf's hierarchical_memory_limit. */
    if (st.seen[1] && st.v[1] < V1_NO_LIMIT && (!out->limited || st.v[1] < out->limit)) {
        out->limited = 1;
        out->limit = st.v[1];
        name_limit(out->path, sizeof out->path, w.name, strlen(w.name),
                   "memory.stat hierarchical_memory_limit");
    }
    if (!out->limited) name_limit(out->path, sizeof out->path, w.name, strlen(w.name), "no limit");
    return 0;
}

static int cgroup_read_checked(fy_cgroup_mem *out)
{
    int rc = cgroup_read_at(g_proc_bad ? NULL : g_proc_root, g_cg_bad ? NULL : g_cg_root, out);
    if (rc < 0) memset(out, 0, sizeof *out);
    return rc;
}

int fy_cgroup_read(fy_cgroup_mem *out)
{
    if (!out) return -EINVAL;
    return cgroup_read_checked(out);
}

/* ---- what the host allows ------------------------------------------------- */

static int mem_available(uint64_t *bytes)
{
    char path[PATH_MAX];
    if (g_proc_bad) return -ENAMETOOLONG;
    FY_TRY(join3(path, sizeof path, g_proc_root, "/meminfo", ""));
    return read_kb_field(path, "MemAvailable", bytes);
}

int fy_host_available(uint64_t *avail, char *source, size_t n)
{
    if (source && n) source[0] = '\0';
    if (!avail) return -EINVAL;
    *avail = 0;
    fy_cgroup_mem cg;
    int rc = cgroup_read_checked(&cg);
    if (rc < 0 && rc != -ENOENT) return rc;
    uint64_t host;
    int hrc = mem_available(&host);
    if (rc == 0 && cg.limited) {
        uint64_t used = cg.current > cg.reclaimable ? cg.current - cg.reclaimable : 0;
        uint64_t room = cg.limit > used ? cg.limit - used : 0;
        bool host_lower = hrc == 0 && host < room;
        *avail = host_lower ? host : room;
        if (source && n)
            snprintf(source, n, "%s%s", cg.path, host_lower ? " (host MemAvailable is lower)" : "");
        return 0;
    }
    if (hrc < 0) return hrc;
    *avail = host;
    if (source && n) snprintf(source, n, "/proc/meminfo MemAvailable");
    return 0;
}

/* ---- sampler -------------------------------------------------------------- */

struct fy_memsampler {
    ferry_allocator mem;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC: a clock step must not stall it */
    bool stop;           /* under lock */
    unsigned period_ms;
    fy_memsample_result res; /* the thread's alone until joined */
    /* Captured at start, so that set_roots while running races with nothing. */
    char proc_root[PATH_MAX];
    bool proc_bad;
    char current_path[PATH_MAX]; /* memory.current, or v1's memory.usage_in_bytes */
};

static void fold_snap(fy_memsnap *peak, const fy_memsnap *s)
{
    if (s->rss > peak->rss) peak->rss = s->rss;
    if (s->uss > peak->uss) peak->uss = s->uss;
    if (s->pss > peak->pss) peak->pss = s->pss;
}

/* One sample into the peaks; also into *snap and *cg when they are given. */
static void take_sample(fy_memsampler *s, fy_memsnap *snap, uint64_t *cg)
{
    fy_memsnap m;
    int rc = mem_self_at(s->proc_bad ? NULL : s->proc_root, &m);
    if (rc == 0 || rc == -ENOENT) {
        fold_snap(&s->res.peak, &m);
        if (snap) *snap = m;
    }
    if (s->res.has_cgroup) {
        uint64_t v;
        bool unl;
        if (read_cg_value(s->current_path, false, &v, &unl) == 0) {
            if (v > s->res.cg_peak) s->res.cg_peak = v;
            if (cg) *cg = v;
        }
    }
}

static void *sampler_main(void *arg)
{
    fy_memsampler *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += (long)(s->period_ms % 1000) * 1000000L;
        dl.tv_sec += (time_t)(s->period_ms / 1000) + dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        /* 0 is a signal or a spurious wake-up; ETIMEDOUT (or any error) means sample now. */
        while (!s->stop && pthread_cond_timedwait(&s->wake, &s->lock, &dl) == 0) {}
        if (s->stop) break;
        pthread_mutex_unlock(&s->lock);
        take_sample(s, NULL, NULL);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int fy_memsampler_start(const ferry_allocator *mem, unsigned period_ms, fy_memsampler **out)
{
    if (!out) return -EINVAL;
    *out = NULL;
    if (!mem) mem = fy_default_allocator();
    fy_memsampler *s = fy_calloc(mem, 1, sizeof *s);
    if (!s) return -ENOMEM;
    s->mem = *mem;
    s->period_ms = period_ms < 1 ? 1 : period_ms > 1000 ? 1000 : period_ms;
    s->proc_bad = g_proc_bad;
    memcpy(s->proc_root, g_proc_root, sizeof s->proc_root);

    cg_where w;
    if (cgroup_find(s->proc_bad ? NULL : s->proc_root, g_cg_bad ? NULL : g_cg_root, &w) == 0 &&
        join3(s->current_path, sizeof s->current_path, w.dir, w.f->current, "") == 0)
        s->res.has_cgroup = 1;

    take_sample(s, &s->res.start, &s->res.cg_start);

    int rc;
    pthread_condattr_t ca;
    if ((rc = pthread_condattr_init(&ca)) != 0) goto fail;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&s->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) goto fail;
    if ((rc = pthread_mutex_init(&s->lock, NULL)) != 0) goto fail_cond;
    if ((rc = pthread_create(&s->thread, NULL, sampler_main, s)) != 0) goto fail_mutex;
    *out = s;
    return 0;

fail_mutex:
    pthread_mutex_destroy(&s->lock);
fail_cond:
    pthread_cond_destroy(&s->wake);
fail:
    fy_free(mem, s);
    return -rc;
}

void fy_memsampler_stop(fy_memsampler *s, fy_memsample_result *out)
{
    if (!s) {
        if (out) memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    take_sample(s, &s->res.end, &s->res.cg_end);
    if (out) *out = s->res;
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    ferry_allocator mem = s->mem;
    fy_free(&mem, s);
}
