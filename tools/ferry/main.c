/* SPDX-License-Identifier: Apache-2.0 */
/* main.c - the ferry command-line tool: dispatch to subcommands. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cli_cmd *const cmds[] = {&cmd_inspect, &cmd_hash,    &cmd_cat,      &cmd_load,
                                      &cmd_bench,   &cmd_convert, &cmd_simulate, &cmd_keep};
#define NCMDS (sizeof cmds / sizeof cmds[0])

static void usage(FILE *out)
{
    fprintf(out,
            "ferry %s - move model weights between disk, host RAM and GPU memory\n"
            "\n"
            "usage: ferry COMMAND [OPTIONS] ...\n"
            "       ferry COMMAND --help     options of one command\n"
            "       ferry --version\n"
            "       ferry [GLOBAL OPTIONS] COMMAND ...\n"
            "\n"
            "global options (before COMMAND):\n"
            "  --stats                 also print wall time and peak RSS (VmHWM) on stderr\n"
            "  --max-tensors N         refuse a checkpoint of more than N tensors (all shards)\n"
            "  --max-header-bytes SIZE refuse a checkpoint whose headers and tensor table take\n"
            "                          more than SIZE bytes of memory (e.g. 64MiB); for files\n"
            "                          from untrusted sources. Default for both: no cap beyond\n"
            "                          the formats' own (a safetensors header is at most 100 MB)\n"
            "\n"
            "commands:\n",
            ferry_version_string());
    for (size_t i = 0; i < NCMDS; i++) fprintf(out, "  %-10s %s\n", cmds[i]->name, cmds[i]->summary);
    fprintf(out, "\n"
                 "Devices: cuda:N (the CUDA driver is loaded at run time; no GPU needed to build),\n"
                 "sim:SIZE[,RATE/s], a GPU emulated in host memory (e.g. sim:24GiB, or sim:24GiB,25GB/s\n"
                 "to model the copy rate of each direction), or cpu.\n"
                 "\n"
                 "Checkpoints: .safetensors files, sharded checkpoints opened through their\n"
                 "*.safetensors.index.json, GGUF files and PyTorch zip checkpoints (.pt, .ckpt,\n"
                 ".bin; read by an unpickler that runs nothing). Files are validated completely\n"
                 "before use and mapped read-only; nothing is ever written to them.\n"
                 "\n"
                 "Exit status: 0 success, 1 failure (message on stderr), 2 usage error.\n");
}

static int dispatch(int argc, char **argv);

/* A global option's value: a whole number (--max-tensors) or a size. */
static bool global_value(const char *opt, const char *v, bool size, uint64_t *out)
{
    char *end = NULL;
    if (v && size && cli_parse_size(v, out)) return true;
    if (v && !size && *v >= '0' && *v <= '9') {
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno == 0 && *end == '\0') {
            *out = (uint64_t)x;
            return true;
        }
    }
    fprintf(stderr, "ferry: %s needs %s, not '%s' (see 'ferry --help')\n", opt,
            size ? "a size (4096, 64MiB, 1GB)" : "a whole number", v ? v : "");
    return false;
}

int main(int argc, char **argv)
{
    bool stats = false;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--stats") == 0) stats = true;
        else if (strcmp(a, "--max-tensors") == 0 || strcmp(a, "--max-header-bytes") == 0) {
            bool size = a[6] == 'h';
            if (!global_value(a, i + 1 < argc ? argv[i + 1] : NULL, size,
                              size ? &cli_max_header_bytes : &cli_max_tensors))
                return EXIT_USAGE;
            i++;
        } else break;
    }
    /* the command sees itself as argv[1] */
    argv[i - 1] = argv[0];
    argc -= i - 1;
    argv += i - 1;
    if (!stats) return dispatch(argc, argv);
    double t0 = cli_now();
    int ex = dispatch(argc, argv);
    fflush(stdout);
    fprintf(stderr, "ferry: %.1f ms, peak RSS (VmHWM) %.1f MiB, exit %d\n", (cli_now() - t0) * 1e3,
            (double)cli_vmhwm_kib() / 1024.0, ex);
    return ex;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *c = argv[1];
    if (cli_is_help(c) || strcmp(c, "help") == 0) {
        if (strcmp(c, "help") == 0 && argc > 2) {
            for (size_t i = 0; i < NCMDS; i++)
                if (strcmp(argv[2], cmds[i]->name) == 0) return cli_help(cmds[i]);
            fprintf(stderr, "ferry: no command '%s' (see 'ferry --help')\n", argv[2]);
            return EXIT_USAGE;
        }
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(c, "--version") == 0 || strcmp(c, "-V") == 0) {
        printf("ferry %s\n", ferry_version_string());
        return EXIT_OK;
    }
    for (size_t i = 0; i < NCMDS; i++)
        if (strcmp(c, cmds[i]->name) == 0) return cmds[i]->run(argc - 1, argv + 1);
    fprintf(stderr, "ferry: no command '%s' (see 'ferry --help')\n", c);
    return EXIT_USAGE;
}
