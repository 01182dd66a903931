/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_cat.c - `ferry cat`: one tensor's raw bytes to stdout. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_cat = {"cat", "write one tensor's raw bytes to stdout",
                         "usage: ferry cat PATH TENSOR > out.bin\n"
                         "\n"
                         "Write the raw bytes of TENSOR (as stored: little-endian, row-major) to\n"
                         "standard output; a strided PyTorch view's elements are gathered from its\n"
                         "storage in row-major order, as `ferry convert` writes them. Refuses to write\n"
                         "binary data to a terminal.\n"
                         "\n"
                         "options:\n"
                         "  -h, --help  show this help\n",
                         run};

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int run(int argc, char **argv)
{
    const char *args[2];
    int na = 0;
    bool opts = true;
    for (int i = 1; i < argc; i++) {
        if (opts && cli_is_help(argv[i])) return cli_help(&cmd_cat);
        if (opts && strcmp(argv[i], "--") == 0) opts = false;
        else if (opts && argv[i][0] == '-' && argv[i][1])
            return cli_usage_error(&cmd_cat, "unknown option '%s'", argv[i]);
        else if (na < 2) args[na++] = argv[i];
        else return cli_usage_error(&cmd_cat, "unexpected argument '%s'", argv[i]);
    }
    if (na < 2) return cli_usage_error(&cmd_cat, "needs PATH and TENSOR");
    if (isatty(STDOUT_FILENO))
        return cli_fail("cat: refusing to write binary data to a terminal; redirect stdout");
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(args[0], 1, &ctx, &f);
    if (ex) return ex;
    int64_t i = ferry_file_find(f, args[1]);
    if (i < 0) {
        ex = cli_fail("%s: no tensor named '%s' (see 'ferry inspect %s')", args[0], args[1], args[0]);
        goto out;
    }
    /* the elements, not a strided view's span in its storage */
    int64_t nb = ferry_file_tensor_gathered_bytes(f, i);
    if (nb < 0) {
        ex = cli_fail("%s: tensor '%s': %s (a strided view of sub-byte elements)", args[0], args[1],
                      ferry_strerror((int)nb));
        goto out;
    }
    uint64_t nbytes = (uint64_t)nb;
    size_t chunk = 8u << 20;
    char *buf = malloc(chunk);
    if (!buf) {
        ex = cli_fail("out of memory");
        goto out;
    }
    for (uint64_t off = 0; off < nbytes;) {
        size_t len = nbytes - off > chunk ? chunk : (size_t)(nbytes - off);
        int rc = ferry_file_tensor_gather(f, i, off, buf, len);
        if (rc < 0) {
            ex = cli_fail_ctx(ctx, rc);
            break;
        }
        rc = write_all(STDOUT_FILENO, buf, len);
        if (rc < 0) {
            ex = cli_fail("cat: writing to stdout: %s", strerror(-rc));
            break;
        }
        off += len;
    }
    free(buf);
out:
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    return ex;
}
