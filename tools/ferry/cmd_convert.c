/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_convert.c - `ferry convert`: any readable checkpoint to safetensors. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_convert = {
    "convert", "write a checkpoint (any format ferry reads) as a safetensors file",
    "usage: ferry convert [--align N] [--dtype BF16|F16|F32] [--force] IN OUT.safetensors\n"
    "\n"
    "Stream every tensor of IN into a new safetensors file OUT (bounded memory:\n"
    "one 8 MiB buffer). The data section starts at a multiple of N bytes (the\n"
    "header is padded with spaces) and tensors whose size is a multiple of N come\n"
    "first, so they start aligned too: O_DIRECT reads and page-locking then need\n"
    "no edge handling for most bytes. IN's string metadata is kept. OUT is written\n"
    "beside its final name and renamed into place when complete; it is checked by\n"
    "reopening it before ferry reports success.\n"
    "\n"
    "IN may be any checkpoint ferry opens. A GGUF file holding block-quantized\n"
    "tensors (Q4_K, Q8_0, IQ2_XXS, ...) cannot be converted: safetensors has no\n"
    "dtype for them (its F16, BF16 and F32 tensors alone would convert).\n"
    "\n"
    "options:\n"
    "  --align N   alignment in bytes, a power of two up to 1MiB (default 4096)\n"
    "  --dtype DT  cast every F16, BF16, F32 and F64 tensor to DT (BF16, F16 or\n"
    "              F32): IEEE round to nearest, ties to even; overflow becomes\n"
    "              Inf, underflow goes through the subnormals to a signed zero;\n"
    "              Inf stays Inf; a NaN stays NaN (its sign and top payload bits\n"
    "              kept, made quiet). Integer, BOOL, complex and FP8/FP6/FP4\n"
    "              tensors are copied unchanged. Without it every tensor keeps its\n"
    "              bytes, so `ferry hash` of OUT equals that of IN\n"
    "  --force     replace OUT if it exists\n"
    "  --json      print {\"in\", \"out\", \"tensors\", \"bytes\", \"align\", \"seconds\"}\n"
    "  -h, --help  show this help\n",
    run};

static int run(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    bool force = false, json = false;
    uint64_t align = 4096;
    ferry_dtype dtype = FERRY_DTYPE_INVALID;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) return cli_help(&cmd_convert);
        if (strcmp(a, "--force") == 0) force = true;
        else if (strcmp(a, "--json") == 0) json = true;
        else if (strcmp(a, "--align") == 0) {
            if (i + 1 >= argc || !cli_parse_size(argv[i + 1], &align) || align == 0 ||
                (align & (align - 1)) || align > (1u << 20))
                return cli_usage_error(&cmd_convert, "--align takes a power of two from 1 to 1MiB");
            i++;
        } else if (strcmp(a, "--dtype") == 0) {
            const char *d = i + 1 < argc ? argv[++i] : "";
            if (strcmp(d, "BF16") == 0 || strcmp(d, "bf16") == 0) dtype = FERRY_DTYPE_BF16;
            else if (strcmp(d, "F16") == 0 || strcmp(d, "f16") == 0) dtype = FERRY_DTYPE_F16;
            else if (strcmp(d, "F32") == 0 || strcmp(d, "f32") == 0) dtype = FERRY_DTYPE_F32;
            else return cli_usage_error(&cmd_convert, "--dtype takes BF16, F16 or F32, not '%s'", d);
        } else if (a[0] == '-' && a[1]) return cli_usage_error(&cmd_convert, "unknown option '%s'", a);
        else if (!in) in = a;
        else if (!out) out = a;
        else return cli_usage_error(&cmd_convert, "unexpected argument '%s'", a);
    }
    if (!in || !out) return cli_usage_error(&cmd_convert, "needs IN and OUT");
    struct stat st;
    if (!force && stat(out, &st) == 0) return cli_fail("%s exists (use --force to replace it)", out);
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(in, 0, &ctx, &f);
    if (ex) return ex;
    cli_progress p;
    cli_progress_start(&p, "convert");
    double t0 = cli_now();
    ferry_convert_opts co = {.size = sizeof co, .dtype = dtype, .align = align};
    int rc = ferry_file_convert_with(ctx, f, out, &co, cli_progress_update, &p);
    double secs = cli_now() - t0;
    cli_progress_end(&p);
    if (rc < 0) {
        ex = cli_fail_ctx(ctx, rc);
    } else {
        ferry_file *g;
        if ((rc = ferry_file_open(ctx, out, 0, &g)) < 0) {
            ex = cli_fail("%s was written but does not read back: %s", out, ferry_ctx_errmsg(ctx));
        } else {
            char h[32];
            if (json)
                printf(
                    "{\"in\": \"%s\", \"out\": \"%s\", \"tensors\": %lld, \"bytes\": %llu, \"align\": %llu, "
                    "\"seconds\": %.3f}\n",
                    in, out, (long long)ferry_file_tensor_count(g),
                    (unsigned long long)ferry_file_total_bytes(g), (unsigned long long)align, secs);
            else
                printf("%s -> %s: %lld %s, %s, data aligned to %llu bytes, %.2f s\n", in, out,
                       (long long)ferry_file_tensor_count(g),
                       cli_plural(ferry_file_tensor_count(g), "tensor", "tensors"),
                       cli_human(h, sizeof h, ferry_file_total_bytes(g)), (unsigned long long)align, secs);
            ferry_file_close(g);
        }
    }
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    return ex;
}
