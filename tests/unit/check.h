/* SPDX-License-Identifier: Apache-2.0 */
/* check.h - a minimal test harness: CHECK counts, never aborts, summary at the end;
 * a table of named cases so that one can run alone. */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_pass, check_fail;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) check_pass++;                                                      \
        else {                                                                       \
            check_fail++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)
#define CHECK_EQ(a, b)                                                                                    \
    do {                                                                                                  \
        long long a_ = (long long)(a), b_ = (long long)(b);                                               \
        if (a_ == b_) check_pass++;                                                                       \
        else {                                                                                            \
            check_fail++;                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, \
                    a_, b_);                                                                              \
        }                                                                                                 \
    } while (0)
#define CHECK_STR_HAS(s, sub)                                                                            \
    do {                                                                                                 \
        const char *s_ = (s);                                                                            \
        if (s_ && strstr(s_, (sub))) check_pass++;                                                       \
        else {                                                                                           \
            check_fail++;                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
                    s_ ? s_ : "(null)", (sub));                                                          \
        }                                                                                                \
    } while (0)

/* Cases. Each test binary ends with its list of cases and a main that sets up
 * what they share (temp dir, files, a ctx), then calls check_run:
 *     #define CASES(CASE) CASE(open, test_open(ctx)) CASE(hash, test_hash(ctx))
 *     CHECK_CASES(CASES)
 * `test_x` runs every case in the list's order, `test_x NAME...` only those,
 * `test_x --list` prints the names. tests/unit/CMakeLists.txt reads the
 * CASE(name, lines to register each case as the ctest `test_x.name`, so keep
 * one CASE per line. A case that cannot run here calls check_skip: the exit
 * status is 77 when every case that ran skipped and none failed. */
typedef struct check_case {
    const char *name;
    void (*fn)(void);
} check_case;

#define CHECK_CASE_FN_(name, call)      \
    static void check_case_##name(void) \
    {                                   \
        call;                           \
    }
#define CHECK_CASE_ROW_(name, call) {#name, check_case_##name},
#define CHECK_CASES(list)                                                                 \
    list(CHECK_CASE_FN_) static const check_case check_cases[] = {list(CHECK_CASE_ROW_)}; \
    enum { check_ncases = sizeof check_cases / sizeof check_cases[0] };
/* The end of a test whose cases take a ferry_ctx *ctx and whose main is a
 * shared one, run(argc, argv, cases, n, &ctx) (xfer_common.h's xfer_main,
 * store_common.h's store_main): ctx, declared here, after the cases'
 * functions, so that no parameter of theirs shadows it; the table; main. */
#define CHECK_CASES_MAIN(list, run)                              \
    static ferry_ctx *ctx;                                       \
    CHECK_CASES(list)                                            \
    int main(int argc, char **argv)                              \
    {                                                            \
        return run(argc, argv, check_cases, check_ncases, &ctx); \
    }

static int check_nargs; /* case names given on the command line */
static char **check_argv;
static int check_ran, check_skipped; /* cases run, and of those skipped */
static int check_skipping;           /* the running case called check_skip */

static inline void check_skip(const char *why)
{
    printf("skip: %s\n", why);
    check_skipping = 1;
}

static const check_case *check_find(const check_case *cases, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(cases[i].name, name) == 0) return &cases[i];
    return NULL;
}

/* Reads the command line before any set-up: returns -1 to go on, or the exit
 * status (0 after --list, 2 for a bad argument). */
static int check_args_(int argc, char **argv, const check_case *cases, int n)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < n; i++) printf("%s\n", cases[i].name);
        return 0;
    }
    for (int i = 1; i < argc; i++)
        if (!check_find(cases, n, argv[i])) {
            fprintf(stderr, "%s: no case '%s' (usage: %s [--list | CASE...])\n", argv[0], argv[i], argv[0]);
            return 2;
        }
    check_nargs = argc - 1;
    check_argv = argv + 1;
    return -1;
}
#define check_args(argc, argv) check_args_(argc, argv, check_cases, check_ncases)

/* Runs the cases the command line named, or all of them; a case whose CHECKs
 * failed is named on stderr. */
static void check_run_(const check_case *cases, int n)
{
    int all = check_nargs == 0;
    for (int i = 0; i < (all ? n : check_nargs); i++) {
        const check_case *c = all ? &cases[i] : check_find(cases, n, check_argv[i]);
        int fail = check_fail;
        check_skipping = 0;
        c->fn();
        check_ran++;
        check_skipped += check_skipping;
        if (check_fail > fail) fprintf(stderr, "case %s: %d CHECKs failed\n", c->name, check_fail - fail);
    }
}
#define check_run() check_run_(check_cases, check_ncases)

/* A fresh directory $TMPDIR/ferry-NAME-XXXXXX (/tmp without TMPDIR) into
 * dir[0..n-1], so that parallel cases never share files: 0, or -1 with the
 * reason on stderr. (mkdtemp: the includer defines _GNU_SOURCE.) */
static inline int check_tmpdir(char *dir, size_t n, const char *name)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, n, "%s/ferry-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* Remove dir and everything under it (the case's files); says so when it cannot. */
static inline void check_rmtree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static int check_summary(void)
{
    printf("%d passed, %d failed\n", check_pass, check_fail);
    if (check_fail) return 1;
    return check_ran && check_skipped == check_ran ? 77 : 0;
}
#endif
