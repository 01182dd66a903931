/* cmd_hash.c - `ferry hash`: XXH3-64 checksums per tensor and for the model. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_hash = {
    "hash", "checksum every tensor (XXH3-64) and the whole model, with many threads",
    "usage: ferry hash [--json] [--threads N] PATH\n"
    "\n"
    "Print the XXH3-64 checksum of each tensor's bytes (the same value as\n"
    "`ferry cat PATH NAME | xxhsum -H3`; a strided PyTorch view's bytes are its\n"
    "elements in row-major order, as `ferry convert` writes them) and one for the\n"
    "whole model. The model hash\n"
    "covers each tensor's name, dtype, shape and data checksum, in name order: it\n"
    "does not depend on the file layout or sharding, so a checkpoint and a converted\n"
    "or re-sharded copy of it hash the same.\n"
    "\n"
    "options:\n"
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

static int run(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false, opts = true;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        if (opts && cli_is_help(argv[i])) return cli_help(&cmd_hash);
        if (opts && strcmp(argv[i], "--json") == 0) json = true;
        else if (opts && strcmp(argv[i], "--threads") == 0) {
            char *end;
            if (i + 1 >= argc) return cli_usage_error(&cmd_hash, "--threads needs a number");
            threads = strtol(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > 64)
                return cli_usage_error(&cmd_hash, "--threads takes 1..64, not '%s'", argv[i]);
        } else if (opts && strcmp(argv[i], "--") == 0) opts = false;
        else if (opts && argv[i][0] == '-' && argv[i][1]) return cli_usage_error(&cmd_hash, "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(&cmd_hash, "one PATH only, got '%s' too", argv[i]);
    }
    if (!path) return cli_usage_error(&cmd_hash, "missing PATH");
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(path, (uint32_t)threads, &ctx, &f);
    if (ex) return ex;
    int64_t n = ferry_file_tensor_count(f);
    uint64_t *h = calloc((size_t)(n ? n : 1), sizeof *h), model = 0;
    if (!h) { ex = cli_fail("out of memory"); goto out; }
    cli_progress p;
    cli_progress_start(&p, "hash");
    double t0 = cli_now();
    int rc = ferry_file_hash(ctx, f, h, &model, cli_progress_update, &p);
    double secs = cli_now() - t0;
    cli_progress_end(&p);
    if (rc < 0) { ex = cli_fail_ctx(ctx, rc); goto out; }
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
        if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0) ex = cli_fail("writing JSON failed");
        fputc('\n', stdout);
        json_decref(o);
    } else {
        for (int64_t i = 0; i < n; i++) {
            ferry_tensor_info ti = {.size = sizeof ti};
            ferry_file_tensor_info(f, i, &ti);
            printf("%016" PRIx64 "  %s\n", h[i], ti.name);
        }
        char hb[32];
        printf("%016" PRIx64 "  (model: %" PRId64 " tensors, %s, %.2f s, %.2f GB/s)\n", model, n,
               cli_human(hb, sizeof hb, total), secs,
               secs > 0 ? (double)total / secs / 1e9 : 0.0);
    }
out:
    free(h);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail("writing to stdout failed");
    return ex;
}
