/* SPDX-License-Identifier: Apache-2.0 */
/* replay.c - runs a libFuzzer target over saved inputs, for builds without
 * libFuzzer (gcc, or clang without -fsanitize=fuzzer).
 *
 *     fuzz_replay_X PATH...
 *
 * Each PATH is a file or a directory (its regular files, in name order; names
 * starting with '.' or "README" are skipped). Every input is passed to
 * LLVMFuzzerTestOneInput(); an invariant the target checks traps, so a bad
 * input shows up as a crash of this program (run it under ASan/UBSan to catch
 * memory errors and leaks too; under LeakSanitizer leaks are checked after
 * each input). Prints "N passed, M failed"; an input that cannot be read or
 * that leaked counts as failed. Exits 1 if anything failed or if no input was
 * found at all. FERRY_REPLAY_VERBOSE=1 names every input as it runs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdbool.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* From the sanitizer runtime, when there is one: called before it exits on an error. */
extern void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));
/* From LeakSanitizer, when linked: reports leaks so far and returns non-zero if any. */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static int npassed, nfailed, verbose;
static const char *volatile g_current; /* the input being run, for crash reports */

static void say_current(void)
{
    const char *p = g_current;
    if (!p) return;
    static const char pre[] = "replay: crashed on input ";
    ssize_t r = write(2, pre, sizeof pre - 1);
    r = write(2, p, strlen(p));
    r = write(2, "\n", 1);
    (void)r;
}

static void on_signal(int sig)
{
    say_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        nfailed++;
        return;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "replay: %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        nfailed++;
        return;
    }
    if (verbose) fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    /* An exact-size copy, so that ASan sees reads past the end of the input. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        nfailed++;
        return;
    }
    memcpy(exact, buf, n);
    free(buf);
    g_current = path;
    LLVMFuzzerTestOneInput(exact, n);
    g_current = NULL;
    free(exact);
    /* Leaks are checked input by input, so that the report names the input.
     * LeakSanitizer reports a leak again at every later check, so only the
     * first leaking input is named (the exit-time check fails the run too). */
    static bool leak_checks = true;
    if (leak_checks && __lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "replay: %s: leaked memory (report above)\n", path);
        leak_checks = false;
        nfailed++;
        return;
    }
    npassed++;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        nfailed++;
        return;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, "README", 6) == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn) break;
            names = nn;
        }
        names[n] = strdup(e->d_name);
        if (names[n]) n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 0; i < n; i++) {
        char *p;
        struct stat st;
        if (asprintf(&p, "%s/%s", dir, names[i]) < 0) {
            nfailed++;
            continue;
        }
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) run_file(p);
        free(p);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    const char *prog = argc > 0 ? argv[0] : "replay";
    verbose = getenv("FERRY_REPLAY_VERBOSE") != NULL;
    /* Name the input that crashed: traps (SIGILL) and aborts here, sanitizer
     * reports through their death callback; SIGSEGV too when no sanitizer owns it. */
    signal(SIGILL, on_signal);
    signal(SIGABRT, on_signal);
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(say_current);
    } else {
        signal(SIGSEGV, on_signal);
        signal(SIGBUS, on_signal);
        signal(SIGFPE, on_signal);
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", prog);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            nfailed++;
        } else if (S_ISDIR(st.st_mode)) {
            run_dir(argv[i]);
        } else {
            run_file(argv[i]);
        }
    }
    printf("%s: %d passed, %d failed\n", prog, npassed, nfailed);
    fflush(stdout); /* LeakSanitizer's exit-time check leaves without flushing */
    if (npassed + nfailed == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return nfailed ? 1 : 0;
}
