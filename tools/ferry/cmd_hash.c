/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_hash.c - `ferry hash`: XXH3-64 checksums per tensor and for the model,
 * or (--sha256) each file's SHA-256, the digest model hubs publish. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sha256.h"

static int run(int argc, char **argv);

const cli_cmd cmd_hash = {
    "hash", "checksum every tensor (XXH3-64) and the whole model, with many threads",
    "usage: ferry hash [--json] [--threads N] PATH\n"
    "       ferry hash --sha256 [--json] PATH...\n"
    "\n"
    "Print the XXH3-64 checksum of each tensor's bytes (the same value as\n"
    "`ferry cat PATH NAME | xxhsum -H3`; a strided PyTorch view's bytes are its\n"
    "elements in row-major order, as `ferry convert` writes them) and one for the\n"
    "whole model. The model hash\n"
    "covers each tensor's name, dtype, shape and data checksum, in name order: it\n"
    "does not depend on the file layout or sharding, so a checkpoint and a converted\n"
    "or re-sharded copy of it hash the same. Use it to compare what two\n"
    "checkpoints hold, or to find which tensors changed.\n"
    "\n"
    "--sha256 hashes whole files instead, byte for byte, as `sha256sum` does and\n"
    "prints the same lines (`ferry hash --sha256 F | sha256sum -c` checks them):\n"
    "the digest model hubs publish for each file (Hugging Face shows it for every\n"
    "LFS file), so use it to check a download. It depends on the file's layout, so\n"
    "a converted copy hashes differently. A sharded checkpoint's *.index.json\n"
    "stands for its shard files: each shard is hashed, not the index itself (for\n"
    "that: ferry hash --sha256 - < INDEX). Any other PATH is hashed as it is,\n"
    "whatever it holds; - is standard input.\n"
    "An unreadable PATH is reported and the others are still hashed (exit 1).\n"
    "\n"
    "options:\n"
    "  --sha256      the SHA-256 of each file (see above); with --json, print\n"
    "                [{\"path\", \"bytes\", \"sha256\": HEX}, ...]\n"
    "  --json        print {\"algorithm\": \"xxh3-64\", \"model\": HEX, \"total_bytes\": N,\n"
    "                \"seconds\": S, \"tensors\": [{\"name\", \"xxh3\": HEX, \"nbytes\"}, ...]}\n"
    "                (nbytes: the bytes hashed; total_bytes: their sum)\n"
    "  --threads N   reader threads (default: number of CPUs)\n"
    "  -h, --help    show this help\n",
    run};

/* What ferry_file_hash hashed of tensor i: its row-major elements, or for a
 * strided view of sub-byte elements (which cannot be gathered) its span. */
static uint64_t hashed_bytes(const ferry_file *f, int64_t i)
{
    int64_t g = ferry_file_tensor_gathered_bytes(f, i);
    if (g >= 0) return (uint64_t)g;
    ferry_tensor_info ti = {.size = sizeof ti};
    ferry_file_tensor_info(f, i, &ti);
    return ti.nbytes;
}

/* ---- --sha256: whole files -------------------------------------------- */

/* Read size: large sequential reads keep the read path's per-call cost far
 * below the hash's (bench/RESULTS.md, "ferry hash --sha256"). */
#define SHA_CHUNK ((size_t)4 << 20)

/* The file's path on a sha256sum line: a name with a backslash or a newline
 * is written escaped (\\ and \n) after a leading backslash, as coreutils does,
 * so that `sha256sum -c` reads it back. */
static void print_sha_line(const char *hex, const char *path)
{
    bool esc = strpbrk(path, "\\\n") != NULL;
    printf("%s%s  ", esc ? "\\" : "", hex);
    for (const char *c = path; *c; c++) {
        if (esc && *c == '\\') fputs("\\\\", stdout);
        else if (esc && *c == '\n') fputs("\\n", stdout);
        else putchar(*c);
    }
    putchar('\n');
}

/* SHA-256 of the file at path ("-": standard input) into hex, its size into
 * *bytes. Prints the error, naming the file, and returns EXIT_FAIL on failure. */
static int sha256_file(const char *path, uint8_t *buf, char hex[65], uint64_t *bytes)
{
    bool in = strcmp(path, "-") == 0;
    int fd = in ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cli_fail("%s: %s", path, strerror(errno));
    struct stat st;
    int ex = EXIT_OK;
    if (fstat(fd, &st) != 0) {
        ex = cli_fail("%s: %s", path, strerror(errno));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        ex = cli_fail("%s: %s", path, strerror(EISDIR));
        goto out;
    }
    /* the kernel reads further ahead of a file read front to back */
    if (S_ISREG(st.st_mode)) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t total = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0, done = 0;
    sha256_ctx h;
    sha256_init(&h);
    cli_progress p;
    cli_progress_start(&p, "sha256");
    for (;;) {
        ssize_t n = read(fd, buf, SHA_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            cli_progress_end(&p);
            ex = cli_fail("%s: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0) break;
        sha256_update(&h, buf, (size_t)n);
        done += (uint64_t)n;
        if (total) cli_progress_update(&p, done < total ? done : total, total);
    }
    cli_progress_end(&p);
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_final(&h, d);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    *bytes = done;
out:
    if (!in) close(fd);
    return ex;
}

/* a sharded checkpoint stands for its shards */
static bool is_index(const char *path)
{
    return strlen(path) > strlen(".index.json") && cli_ends_with(path, ".index.json");
}

/* Hash one file: print its line, or add its object to the JSON array out. */
static int sha256_one(const char *path, uint8_t *buf, json_t *out)
{
    char hex[65];
    uint64_t bytes = 0;
    int ex = sha256_file(path, buf, hex, &bytes);
    if (ex) return ex;
    if (!out) {
        print_sha_line(hex, path);
        return EXIT_OK;
    }
    json_t *o = json_object();
    json_object_set_new(o, "path", json_string(path));
    json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(o, "sha256", json_string(hex));
    json_array_append_new(out, o);
    return EXIT_OK;
}

static int run_sha256(char **paths, int npaths, bool json)
{
    uint8_t *buf = malloc(SHA_CHUNK);
    if (!buf) return cli_fail("out of memory");
    json_t *out = json ? json_array() : NULL;
    int ex = EXIT_OK;
    for (int i = 0; i < npaths; i++) {
        int r;
        if (is_index(paths[i])) {
            /* the library resolves the shards the index names, as a load would */
            ferry_ctx *ctx = NULL;
            ferry_file *f = NULL;
            r = cli_open(paths[i], 1, &ctx, &f);
            if (!r) {
                /* an unreadable shard is reported; the others are still hashed */
                for (int s = 0; s < ferry_file_shard_count(f); s++) {
                    int rs = sha256_one(ferry_file_shard_path(f, s), buf, out);
                    if (rs) r = rs;
                }
                ferry_file_close(f);
                ferry_ctx_free(ctx);
            }
        } else {
            r = sha256_one(paths[i], buf, out);
        }
        if (r) ex = r;
        /* a line at a time, so a pipe to sha256sum -c sees each as it comes */
        if (!json) fflush(stdout);
    }
    if (json) {
        if (json_dumpf(out, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
            ex = cli_fail("writing JSON failed");
        fputc('\n', stdout);
        json_decref(out);
    }
    free(buf);
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail("writing to stdout failed");
    return ex;
}

/* ---- tensor hashes ------------------------------------------------------ */

static int run_tensors(const char *path, bool json, long threads);

static int run(int argc, char **argv)
{
    bool json = false, sha = false, opts = true;
    long threads = 0;
    int npaths = 0;
    /* the paths, in argv's own storage: argv[0] (the command's name) is done with */
    char **paths = argv;
    for (int i = 1; i < argc; i++) {
        if (opts && cli_is_help(argv[i])) return cli_help(&cmd_hash);
        if (opts && strcmp(argv[i], "--json") == 0) json = true;
        else if (opts && strcmp(argv[i], "--sha256") == 0) sha = true;
        else if (opts && strcmp(argv[i], "--threads") == 0) {
            char *end;
            if (i + 1 >= argc) return cli_usage_error(&cmd_hash, "--threads needs a number");
            threads = strtol(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > 64)
                return cli_usage_error(&cmd_hash, "--threads takes 1..64, not '%s'", argv[i]);
        } else if (opts && strcmp(argv[i], "--") == 0) opts = false;
        else if (opts && argv[i][0] == '-' && argv[i][1])
            return cli_usage_error(&cmd_hash, "unknown option '%s'", argv[i]);
        else paths[npaths++] = argv[i];
    }
    if (!npaths) return cli_usage_error(&cmd_hash, "missing PATH");
    if (sha) {
        if (threads) return cli_usage_error(&cmd_hash, "--threads is for the tensor hashes, not --sha256");
        return run_sha256(paths, npaths, json);
    }
    if (npaths > 1)
        return cli_usage_error(&cmd_hash, "one PATH only, got '%s' too (several: with --sha256)", paths[1]);
    return run_tensors(paths[0], json, threads);
}

static int run_tensors(const char *path, bool json, long threads)
{
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(path, (uint32_t)threads, &ctx, &f);
    if (ex) return ex;
    int64_t n = ferry_file_tensor_count(f);
    uint64_t *h = calloc((size_t)(n ? n : 1), sizeof *h), model = 0;
    if (!h) {
        ex = cli_fail("out of memory");
        goto out;
    }
    cli_progress p;
    cli_progress_start(&p, "hash");
    double t0 = cli_now();
    int rc = ferry_file_hash(ctx, f, h, &model, cli_progress_update, &p);
    double secs = cli_now() - t0;
    cli_progress_end(&p);
    if (rc < 0) {
        ex = cli_fail_ctx(ctx, rc);
        goto out;
    }
    /* the bytes hashed: a strided view's elements, not its span in the storage */
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += hashed_bytes(f, i);
    char hex[17];
    if (json) {
        json_t *o = json_object(), *ts = json_array();
        json_object_set_new(o, "algorithm", json_string("xxh3-64"));
        snprintf(hex, sizeof hex, "%016" PRIx64, model);
        json_object_set_new(o, "model", json_string(hex));
        json_object_set_new(o, "total_bytes", json_integer((json_int_t)total));
        json_object_set_new(o, "seconds", json_real(secs));
        for (int64_t i = 0; i < n; i++) {
            ferry_tensor_info ti = {.size = sizeof ti};
            ferry_file_tensor_info(f, i, &ti);
            json_t *t = json_object();
            snprintf(hex, sizeof hex, "%016" PRIx64, h[i]);
            json_object_set_new(t, "name", json_string(ti.name));
            json_object_set_new(t, "xxh3", json_string(hex));
            json_object_set_new(t, "nbytes", json_integer((json_int_t)hashed_bytes(f, i)));
            json_array_append_new(ts, t);
        }
        json_object_set_new(o, "tensors", ts);
        if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
            ex = cli_fail("writing JSON failed");
        fputc('\n', stdout);
        json_decref(o);
    } else {
        for (int64_t i = 0; i < n; i++) {
            ferry_tensor_info ti = {.size = sizeof ti};
            ferry_file_tensor_info(f, i, &ti);
            printf("%016" PRIx64 "  %s\n", h[i], ti.name);
        }
        char hb[32];
        printf("%016" PRIx64 "  (model: %" PRId64 " %s, %s, %.2f s, %.2f GB/s)\n", model, n,
               cli_plural(n, "tensor", "tensors"), cli_human(hb, sizeof hb, total), secs,
               secs > 0 ? (double)total / secs / 1e9 : 0.0);
    }
out:
    free(h);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail("writing to stdout failed");
    return ex;
}
