/* fuzz_memstat.c - libFuzzer target for the /proc and cgroup v2 parsers of
 * src/io/memstat.c, driven through a fake tree on disk.
 *
 * The input is the tree's files one after the other, separated by lines "%%"
 * (the input is cut at every "\n%%\n"), in this order:
 *    0 proc/self/smaps_rollup    1 proc/self/status    2 proc/self/cgroup
 *    3 proc/meminfo
 *    4..7  memory.max, .high, .current, .peak of the cgroup that 2 names
 *    8..11 the same four of its parent (the cgroup root for "0::/a")
 * A file the input does not reach, or whose whole text is "-", does not
 * exist. The cgroup's folders are made from 2's "0::" line, so any path can be
 * tried ("0::/../../x", very long ones); a path that could leave the tree, or
 * that is too deep or long to be worth making, is not made (the library must
 * then fail). The tree lives in a mkdtemp folder of $TMPDIR (or /tmp), made
 * once per process; every input rewrites it and removes its cgroup folders.
 *
 * fy_mem_self, fy_cgroup_read and fy_host_available then run, and:
 *  - always: the codes are 0 or negative (errno or FERRY_E_*); on error the
 *    outputs are zeroed as memstat.h says; the cgroup's name and the source
 *    string are terminated within their arrays, one line, and say what kind
 *    of limit it is; a limit is never above a memory.max or memory.high value
 *    written where the path leads, and the available memory never above
 *    limit - current;
 *  - where the input is simple enough to be worked out here independently (no
 *    line of PATH_MAX bytes or more, one "0::" line, nothing in the way of the
 *    files), the exact results: codes, values, the limit's name.
 * A violated invariant calls __builtin_trap(); the library allocates nothing,
 * so LeakSanitizer has little to find, but it stays on.
 *
 * FERRY_FUZZ_SKIP=exact leaves the worked-out results out (the always-checks
 * stay), to keep fuzzing past a known bug. */
#define _GNU_SOURCE
#include "io/memstat.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_memstat: invariant violated at %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                    \
            __builtin_trap();                                                            \
        }                                                                                \
    } while (0)

#include "fuzz_check.h"

/* ---- the input's pieces --------------------------------------------------- */

enum { P_SMAPS, P_STATUS, P_CGROUP, P_MEMINFO, P_LEAF, P_PARENT = P_LEAF + 4, P_N = P_PARENT + 4 };
enum { F_MAX, F_HIGH, F_CURRENT, F_PEAK }; /* offsets from P_LEAF and P_PARENT */
static const char *const cg_files[4] = {"memory.max", "memory.high", "memory.current", "memory.peak"};

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

/* ---- the fake tree -------------------------------------------------------- */

static char g_base[PATH_MAX / 4], g_proc[PATH_MAX / 4 + 8], g_cg[PATH_MAX / 4 + 8];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void remove_tree(void)
{
    if (g_base[0]) nftw(g_base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_dir(const char *a, const char *b)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", a, b);
    CHECK(mkdir(p, 0700) == 0);
}

static void init_tree(void)
{
    const char *tmp = getenv("TMPDIR");
    int w = snprintf(g_base, sizeof g_base, "%s/ferry-fuzz-memstat.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(w > 0 && (size_t)w < sizeof g_base);
    if (!mkdtemp(g_base)) {
        fprintf(stderr, "fuzz_memstat: mkdtemp %s: %s\n", g_base, strerror(errno));
        CHECK(!"a temporary folder");
    }
    atexit(remove_tree);
    snprintf(g_proc, sizeof g_proc, "%s/proc", g_base);
    snprintf(g_cg, sizeof g_cg, "%s/cg", g_base);
    make_dir(g_proc, "");
    make_dir(g_proc, "/self");
    make_dir(g_cg, "");
    /* Bait above the cgroup root: a walk that climbed out of it would find a
     * limit of 1 byte here and report it. */
    static const char *const bait[] = {"memory.max", "memory.high", "memory.current"};
    for (int i = 0; i < 3; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", g_base, bait[i]);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        CHECK(fd >= 0);
        CHECK(write(fd, "1\n", 2) == 2);
        close(fd);
    }
}

/* Write path with the piece's bytes: true when it now holds exactly them. */
static bool write_file(const char *path, const piece *pc)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    size_t done = 0;
    while (done < pc->n) {
        ssize_t w = write(fd, pc->p + done, pc->n - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    close(fd);
    return done == pc->n;
}

static void put_proc(const char *rel, const piece *pc)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_proc, rel);
    if (pc->present) CHECK(write_file(p, pc));
    else CHECK(unlink(p) == 0 || errno == ENOENT);
}

/* What the input made under the cgroup root, to be removed after it. */
#define MAX_DEPTH 16
#define MAX_REL 1024
static char g_made[MAX_DEPTH + 8][PATH_MAX];
static int g_nmade;

static void remember(const char *p)
{
    CHECK(g_nmade < (int)(sizeof g_made / sizeof g_made[0]));
    memcpy(g_made[g_nmade++], p, strlen(p) + 1);
}

static void clean_cgroup(void)
{
    /* Files and folders in reverse order of making: children first. */
    while (g_nmade > 0) {
        const char *p = g_made[--g_nmade];
        struct stat st;
        CHECK(lstat(p, &st) == 0);
        CHECK((S_ISDIR(st.st_mode) ? rmdir(p) : unlink(p)) == 0);
    }
}

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

static bool blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

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
        CG_UNKNOWN,  /* long lines, or several "0::" lines */
        CG_NONE,     /* no file, or no "0::" line: -ENOENT */
        CG_INVALID,  /* not "/...", a NUL, "." or "..": -EINVAL */
        CG_FAR,      /* valid but not made here: nothing found there */
        CG_SIMPLE,   /* made here */
    } kind;
    int depth;
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

/* Make the cgroup's folders and its files (and its parent's): false when
 * something is in the way (a component named like one of the files). */
static bool make_cgroup(const cg_path *c, const piece pcs[P_N])
{
    char rel[MAX_REL + 1], p[PATH_MAX];
    for (int d = 1; d <= c->depth; d++) {
        rel_of(c, d, rel, sizeof rel);
        snprintf(p, sizeof p, "%s%s", g_cg, rel);
        if (mkdir(p, 0700) != 0) return false;
        remember(p);
    }
    for (int lv = 0; lv < 2; lv++) {
        int d = c->depth - lv;
        if (d < 0) break;
        rel_of(c, d, rel, sizeof rel);
        for (int f = 0; f < 4; f++) {
            const piece *pc = &pcs[(lv ? P_PARENT : P_LEAF) + f];
            if (!pc->present) continue;
            snprintf(p, sizeof p, "%s%s/%s", g_cg, rel, cg_files[f]);
            struct stat st;
            if (lstat(p, &st) == 0) return false; /* a folder of the path */
            bool ok = write_file(p, pc);
            if (access(p, F_OK) == 0) remember(p);
            if (!ok) return false;
        }
    }
    return true;
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

/* fy_cgroup_read; *got (and its code) is kept for fy_host_available's checks. */
static int check_cgroup(const piece pcs[P_N], const cg_path *c, bool made, fy_cgroup_mem *got)
{
    memset(got, 0xAA, sizeof *got);
    int rc = fy_cgroup_read(got);
    CHECK(code_ok(rc));
    CHECK(memchr(got->path, '\0', sizeof got->path) != NULL);
    if (rc < 0) {
        CHECK(!got->limited && got->limit == 0 && got->current == 0 && got->peak == 0 && !got->has_peak);
        for (size_t i = 0; i < sizeof got->path; i++) CHECK(got->path[i] == '\0');
    } else {
        CHECK(got->limited == 0 || got->limited == 1);
        CHECK(got->has_peak == 0 || got->has_peak == 1);
        CHECK(got->has_peak || got->peak == 0);
        CHECK(got->limited || got->limit == 0);
        CHECK(one_line(got->path, sizeof got->path));
        CHECK(strncmp(got->path, "cgroup ", 7) == 0);
        size_t n = strlen(got->path);
        const char *what = got->limited ? NULL : ": no limit";
        if (what) CHECK(n > strlen(what) && strcmp(got->path + n - strlen(what), what) == 0);
        else CHECK((n > 12 && strcmp(got->path + n - 12, ": memory.max") == 0) ||
                   (n > 13 && strcmp(got->path + n - 13, ": memory.high") == 0));
    }

    /* What cannot resolve to a folder of the tree cannot succeed. */
    if (c->kind == CG_NONE) CHECK(rc == -ENOENT);
    if (c->kind == CG_INVALID) CHECK(rc == -EINVAL);
    if (c->kind == CG_FAR) CHECK(rc == -ENOENT || rc == -ENAMETOOLONG);
    if (c->kind != CG_SIMPLE || !made) return rc;

    /* The limit is never above a value written at the two levels made. */
    uint64_t v[2][4];
    int kind[2][4];
    for (int lv = 0; lv < 2; lv++)
        for (int f = 0; f < 4; f++) {
            kind[lv][f] = lv > c->depth ? V_ABSENT : cg_value(&pcs[(lv ? P_PARENT : P_LEAF) + f], &v[lv][f]);
        }
    if (rc == 0) {
        for (int lv = 0; lv < 2; lv++)
            for (int f = F_MAX; f <= F_HIGH; f++)
                if (kind[lv][f] == V_NUMBER) CHECK(got->limited && got->limit <= v[lv][f]);
    }
    if (!g_exact) return rc;

    /* The exact outcome: every file read is absent or well formed, or it is an error. */
    bool enoent = false, einval = false;
    if (kind[0][F_CURRENT] == V_ABSENT) enoent = true;
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
    if (enoent || einval) {
        CHECK((enoent && rc == -ENOENT) || (einval && rc == -EINVAL));
        return rc;
    }
    CHECK(rc == 0);
    CHECK(got->current == v[0][F_CURRENT]);
    CHECK(got->has_peak == (kind[0][F_PEAK] == V_NUMBER));
    if (got->has_peak) CHECK(got->peak == v[0][F_PEAK]);
    char rel[MAX_REL + 1];
    if (best_lv < 0) {
        CHECK(!got->limited);
        rel_of(c, c->depth, rel, sizeof rel);
        CHECK(name_ok(got->path, rel, "no limit"));
    } else {
        CHECK(got->limited && got->limit == v[best_lv][best_f]);
        rel_of(c, c->depth - best_lv, rel, sizeof rel);
        CHECK(name_ok(got->path, rel, cg_files[best_f]));
    }
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
    if (limited) {
        uint64_t room = cg->limit > cg->current ? cg->limit - cg->current : 0;
        CHECK(rc == 0 && avail <= room);
    }

    uint64_t host = 0;
    int hrc = want_kb_field(&pcs[P_MEMINFO], "MemAvailable", &host);
    char want[256];
    want[0] = '\0';
    if (g_exact && hrc <= 0 && (cg_rc == 0 || cg_rc == -ENOENT)) {
        if (limited) {
            uint64_t room = cg->limit > cg->current ? cg->limit - cg->current : 0;
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
        init_tree();
        fy_memstat_set_roots(g_proc, g_cg);
    }

    piece pcs[P_N];
    split(data, size, pcs);
    put_proc("self/smaps_rollup", &pcs[P_SMAPS]);
    put_proc("self/status", &pcs[P_STATUS]);
    put_proc("self/cgroup", &pcs[P_CGROUP]);
    put_proc("meminfo", &pcs[P_MEMINFO]);
    cg_path c = parse_cgroup(&pcs[P_CGROUP]);
    bool made = c.kind == CG_SIMPLE && make_cgroup(&c, pcs);

    check_mem_self(pcs);
    fy_cgroup_mem cg;
    int cg_rc = check_cgroup(pcs, &c, made, &cg);
    check_host(pcs, cg_rc, &cg, fnv1a(data, size));

    clean_cgroup();
    return 0;
}
