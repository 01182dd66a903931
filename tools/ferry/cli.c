/* SPDX-License-Identifier: Apache-2.0 */
/* cli.c - helpers shared by the ferry subcommands. */
#define _GNU_SOURCE
#include "cli.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cli_usage_error(const cli_cmd *c, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ferry %s: ", c->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'ferry %s --help')\n", c->name);
    return EXIT_USAGE;
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("ferry: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_FAIL;
}

int cli_fail_ctx(ferry_ctx *ctx, int rc)
{
    const char *m = ferry_ctx_errmsg(ctx);
    if (m && *m) return cli_fail("%s", m);
    return cli_fail("%s", ferry_strerror(rc));
}

bool cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cli_help(const cli_cmd *c)
{
    fputs(c->usage, stdout);
    return EXIT_OK;
}

uint64_t cli_max_tensors, cli_max_header_bytes;

int cli_ctx_new(uint32_t nthreads, ferry_ctx **ctx)
{
    ferry_ctx_opts o = {.size = sizeof o,
                        .nthreads = nthreads,
                        .max_header_bytes = cli_max_header_bytes,
                        .max_tensors = cli_max_tensors};
    if (ferry_ctx_new(&o, ctx) < 0) return cli_fail("%s", ferry_ctx_errmsg(NULL));
    return 0;
}

int cli_open(const char *path, uint32_t nthreads, ferry_ctx **ctx, ferry_file **f)
{
    int ex = cli_ctx_new(nthreads, ctx);
    if (ex) return ex;
    int rc = ferry_file_open(*ctx, path, 0, f);
    if (rc < 0) {
        ex = cli_fail_ctx(*ctx, rc);
        ferry_ctx_free(*ctx);
        *ctx = NULL;
        return ex;
    }
    return 0;
}

bool cli_ends_with(const char *s, const char *end)
{
    size_t a = strlen(s), b = strlen(end);
    return a >= b && strcmp(s + a - b, end) == 0;
}

const char *cli_plural(int64_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

const char *cli_human(char *buf, size_t n, uint64_t b)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 5) v /= 1024, i++;
    if (i == 0) snprintf(buf, n, "%llu B", (unsigned long long)b);
    else snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static pthread_mutex_t progress_lock = PTHREAD_MUTEX_INITIALIZER;

void cli_progress_start(cli_progress *p, const char *label)
{
    p->on = isatty(STDERR_FILENO);
    p->label = label;
    p->t0 = p->last = cli_now();
}

void cli_progress_update(void *arg, uint64_t done, uint64_t total)
{
    cli_progress *p = arg;
    if (!p->on) return;
    /* the library calls this one call at a time; the lock keeps it so */
    pthread_mutex_lock(&progress_lock);
    double now = cli_now();
    if (done < total && now - p->last < 0.1) {
        pthread_mutex_unlock(&progress_lock);
        return;
    }
    p->last = now;
    int width = 30, fill = total ? (int)((double)done / (double)total * width) : width;
    char bar[64], a[32], b[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double el = now - p->t0;
    fprintf(stderr, "\r%s [%s] %s / %s  %.2f GB/s ", p->label, bar, cli_human(a, sizeof a, done),
            cli_human(b, sizeof b, total), el > 0 ? (double)done / el / 1e9 : 0.0);
    pthread_mutex_unlock(&progress_lock);
}

void cli_progress_end(cli_progress *p)
{
    if (p->on) fprintf(stderr, "\r\033[K");
}

long cli_vmhwm_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) v = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return v;
}

bool cli_parse_size(const char *s, uint64_t *out)
{
    return ferry_parse_size(s, out) == 0;
}
