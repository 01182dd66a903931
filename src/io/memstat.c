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

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

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
static const char *const rollup_keys[K_N] = {"Rss", "Pss", "Private_Clean", "Private_Dirty", "Private_Hugetlb"};

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

/* ---- cgroup v2 ------------------------------------------------------------ */

typedef struct cg_line {
    char *rel; /* PATH_MAX bytes: "" for the root, else "/a/b" */
    int rc;    /* 1 found, < 0 malformed */
} cg_line;

/* "0::/a/b" -> "/a/b" with empty components dropped; "." and ".." refused so
 * that walking up can never leave the cgroup root. */
static int cgroup_line(void *arg, const char *line, size_t len)
{
    cg_line *c = arg;
    if (len < 3 || memcmp(line, "0::", 3) != 0) return 0;
    const char *p = line + 3, *end = line + len;
    if (p == end || *p != '/' || memchr(p, '\0', (size_t)(end - p))) return c->rc = -EINVAL;
    size_t o = 0;
    while (p < end) {
        while (p < end && *p == '/') p++;
        const char *q = p;
        while (q < end && *q != '/') q++;
        size_t n = (size_t)(q - p);
        if (n == 0) break;
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return c->rc = -EINVAL;
        if (o + 1 + n >= PATH_MAX) return c->rc = -ENAMETOOLONG;
        c->rel[o++] = '/';
        memcpy(c->rel + o, p, n);
        o += n;
        p = q;
    }
    c->rel[o] = '\0';
    return c->rc = 1;
}

/* The process's cgroup v2 path relative to the cgroup root ("" = the root). */
static int cgroup_rel(const char *proc_root, char rel[PATH_MAX])
{
    char path[PATH_MAX];
    if (!proc_root) return -ENAMETOOLONG;
    FY_TRY(join3(path, sizeof path, proc_root, "/self/cgroup", ""));
    cg_line c = {rel, 0};
    int rc = for_each_line(path, cgroup_line, &c);
    if (rc < 0) return rc;
    return c.rc == 1 ? 0 : -ENOENT;
}

/* "cgroup <rel>: <what>" into out->path; a long path keeps its end, where the
 * service or container name is, and control bytes become '?'. */
static void name_limit(char *dst, size_t n, const char *rel, const char *what)
{
    const char *shown = rel[0] ? rel : "/";
    size_t fixed = strlen("cgroup ") + strlen(": ") + strlen(what) + 1;
    size_t room = n > fixed ? n - fixed : 0, len = strlen(shown);
    const char *ell = "";
    if (len > room && room > 3) {
        shown += len - (room - 3);
        while (((unsigned char)*shown & 0xC0) == 0x80) shown++; /* not inside a UTF-8 character */
        ell = "...";
    }
    snprintf(dst, n, "cgroup %s%s: %s", ell, shown, what);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

static int cgroup_read_at(const char *proc_root, const char *cg_root, fy_cgroup_mem *out)
{
    char rel[PATH_MAX], path[PATH_MAX];
    bool unl;
    memset(out, 0, sizeof *out);
    if (!cg_root) return -ENAMETOOLONG;
    FY_TRY(cgroup_rel(proc_root, rel));

    FY_TRY(join3(path, sizeof path, cg_root, rel, "/memory.current"));
    FY_TRY(read_cg_value(path, false, &out->current, &unl));
    FY_TRY(join3(path, sizeof path, cg_root, rel, "/memory.peak"));
    int rc = read_cg_value(path, false, &out->peak, &unl);
    if (rc == 0) out->has_peak = 1;
    else if (rc != -ENOENT) return rc;

    /* Walk up: the kernel enforces every ancestor's limit on us too. */
    static const char *const files[2] = {"/memory.max", "/memory.high"};
    char level[PATH_MAX];
    memcpy(level, rel, strlen(rel) + 1);
    for (;;) {
        for (int f = 0; f < 2; f++) {
            uint64_t v;
            FY_TRY(join3(path, sizeof path, cg_root, level, files[f]));
            rc = read_cg_value(path, true, &v, &unl);
            if (rc == -ENOENT || (rc == 0 && unl)) continue;
            if (rc < 0) return rc;
            if (!out->limited || v < out->limit) {
                out->limited = 1;
                out->limit = v;
                name_limit(out->path, sizeof out->path, level, files[f] + 1);
            }
        }
        if (!level[0]) break;
        *strrchr(level, '/') = '\0';
    }
    if (!out->limited) name_limit(out->path, sizeof out->path, rel, "no limit");
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
        uint64_t room = cg.limit > cg.current ? cg.limit - cg.current : 0;
        bool host_lower = hrc == 0 && host < room;
        *avail = host_lower ? host : room;
        if (source && n) snprintf(source, n, "%s%s", cg.path, host_lower ? " (host MemAvailable is lower)" : "");
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
    char current_path[PATH_MAX];
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
        while (!s->stop && pthread_cond_timedwait(&s->wake, &s->lock, &dl) == 0) {
        }
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

    char rel[PATH_MAX];
    uint64_t v;
    bool unl;
    if (!g_cg_bad && cgroup_rel(s->proc_bad ? NULL : s->proc_root, rel) == 0 &&
        join3(s->current_path, sizeof s->current_path, g_cg_root, rel, "/memory.current") == 0 &&
        read_cg_value(s->current_path, false, &v, &unl) == 0)
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
