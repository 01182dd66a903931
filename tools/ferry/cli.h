/* SPDX-License-Identifier: Apache-2.0 */
/* cli.h - shared pieces of the ferry command-line tool. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"

/* Exit statuses: 0 success, 1 failure, 2 usage error. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

typedef struct cli_cmd {
    const char *name;
    const char *summary;
    const char *usage; /* full --help text */
    int (*run)(int argc, char **argv);
} cli_cmd;

extern const cli_cmd cmd_inspect, cmd_cat, cmd_hash, cmd_load, cmd_bench, cmd_convert, cmd_simulate, cmd_keep;

/* Print "ferry CMD: message" and return EXIT_USAGE. */
int cli_usage_error(const cli_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print "ferry: message" and return EXIT_FAIL. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Report a failed library call with the context's message. */
int cli_fail_ctx(ferry_ctx *ctx, int rc);

/* -h / --help? */
bool cli_is_help(const char *arg);
int cli_help(const cli_cmd *c);

/* The caps on files' headers given before the command (--max-tensors,
 * --max-header-bytes); 0: none. Every context the commands make gets them. */
extern uint64_t cli_max_tensors, cli_max_header_bytes;
/* A context with nthreads (0: the default) and the caps above; prints the
 * error and returns an exit status on failure, else 0. */
int cli_ctx_new(uint32_t nthreads, ferry_ctx **ctx);
/* Open ctx + file, or print the error; returns 0 or an exit status. */
int cli_open(const char *path, uint32_t nthreads, ferry_ctx **ctx, ferry_file **f);

/* Whether s ends with end. */
bool cli_ends_with(const char *s, const char *end);

/* "1 tensor", "2 tensors": one when n is 1, else many */
const char *cli_plural(int64_t n, const char *one, const char *many);

/* "1.50 GiB" */
const char *cli_human(char *buf, size_t n, uint64_t bytes);

/* A progress bar on stderr when it is a terminal; quiet otherwise. */
typedef struct cli_progress {
    bool on;
    const char *label;
    double t0;
    double last;
} cli_progress;
void cli_progress_start(cli_progress *p, const char *label);
void cli_progress_update(void *p, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress *p);
double cli_now(void);
/* Peak RSS of this process in KiB (VmHWM: reset at exec, unlike ru_maxrss). */
long cli_vmhwm_kib(void);
/* "16MiB", "1.5GB", "4096" -> bytes */
bool cli_parse_size(const char *s, uint64_t *out);

#endif
