/* cmd_inspect.c - `ferry inspect`: what a checkpoint holds. */
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_inspect = {
    "inspect", "list a checkpoint's tensors, dtypes, shapes, sizes and metadata",
    "usage: ferry inspect [--json] [--filter GLOB]... PATH\n"
    "\n"
    "Validate a checkpoint completely and describe it: format, tensor count, total\n"
    "bytes, metadata, and per tensor its name, dtype, shape, byte size and absolute\n"
    "byte offset in its file. Only the header is read, so this takes milliseconds\n"
    "even for checkpoints of tens of GB.\n"
    "\n"
    "PATH is a .safetensors file, a sharded checkpoint's *.safetensors.index.json,\n"
    "a GGUF file, or a PyTorch torch.save zip checkpoint (.pt, .pth, .ckpt, .bin).\n"
    "\n"
    "options:\n"
    "  --json      print one JSON object:\n"
    "              {\"format\", \"path\", \"metadata\": {...}, \"tensor_count\", \"total_bytes\",\n"
    "               \"files\": [...], \"tensors\": [{\"name\", \"dtype\", \"shape\", \"nbytes\",\n"
    "               \"offset\", \"file\"}, ...]}  (tensors in file order); a strided view\n"
    "              (PyTorch) adds \"strides\" (in elements) and \"flags\": [\"noncontiguous\"],\n"
    "              its nbytes spanning first to last element; views of one storage\n"
    "              add \"shared_storage\" to \"flags\"\n"
    "              each tensor also has \"numel\" (its element count) and the\n"
    "              object \"total_numel\" (the parameters of the tensors listed)\n"
    "  --filter GLOB  list only tensors whose name matches GLOB (fnmatch: '*'\n"
    "              matches dots too; repeat for any of several); the counts and\n"
    "              totals are then those of the matching tensors\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 valid, 1 invalid or unreadable (message on stderr), 2 usage error.\n",
    run};

static const char **filters;
static int nfilters;

static bool listed(const char *name)
{
    for (int i = 0; i < nfilters; i++)
        if (fnmatch(filters[i], name, 0) == 0) return true;
    return nfilters == 0;
}

static uint64_t numel_of(const ferry_tensor_info *ti)
{
    uint64_t n = 1;
    for (int d = 0; d < ti->ndim; d++) n *= (uint64_t)ti->shape[d];
    return n;
}

static int print_json(ferry_file *f, const char *path)
{
    json_t *o = json_object(), *meta = json_object(), *ts = json_array(), *files = json_array();
    int64_t n = ferry_file_tensor_count(f);
    json_object_set_new(o, "format", json_string(ferry_format_name(ferry_file_format(f))));
    json_object_set_new(o, "path", json_string(path));
    for (int64_t i = 0; i < ferry_file_metadata_count(f); i++) {
        const char *k, *v;
        ferry_file_metadata(f, i, &k, &v);
        json_object_set_new(meta, k, json_string(v));
    }
    json_object_set_new(o, "metadata", meta);
    int64_t cnt = 0;
    uint64_t tb = 0, tn = 0;
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (!listed(ti.name)) continue;
        cnt++, tb += ti.nbytes, tn += numel_of(&ti);
    }
    json_object_set_new(o, "tensor_count", json_integer(cnt));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)tb));
    json_object_set_new(o, "total_numel", json_integer((json_int_t)tn));
    for (int s = 0; s < ferry_file_shard_count(f); s++)
        json_array_append_new(files, json_string(ferry_file_shard_path(f, s)));
    json_object_set_new(o, "files", files);
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (!listed(ti.name)) continue;
        json_t *t = json_object(), *shape = json_array();
        for (int d = 0; d < ti.ndim; d++) json_array_append_new(shape, json_integer(ti.shape[d]));
        json_object_set_new(t, "name", json_string(ti.name));
        json_object_set_new(t, "dtype", json_string(ferry_dtype_name(ti.dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "nbytes", json_integer((json_int_t)ti.nbytes));
        json_object_set_new(t, "numel", json_integer((json_int_t)numel_of(&ti)));
        json_object_set_new(t, "offset", json_integer((json_int_t)ti.offset));
        json_object_set_new(t, "file", json_string(ferry_file_shard_path(f, ti.shard)));
        if (ti.strides) {
            json_t *st = json_array();
            for (int d = 0; d < ti.ndim; d++) json_array_append_new(st, json_integer(ti.strides[d]));
            json_object_set_new(t, "strides", st);
        }
        if (ti.flags) {
            json_t *fl = json_array();
            if (ti.flags & FERRY_TENSOR_NONCONTIGUOUS) json_array_append_new(fl, json_string("noncontiguous"));
            if (ti.flags & FERRY_TENSOR_SHARED_STORAGE) json_array_append_new(fl, json_string("shared_storage"));
            json_object_set_new(t, "flags", fl);
        }
        json_array_append_new(ts, t);
    }
    json_object_set_new(o, "tensors", ts);
    int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc < 0) return cli_fail("writing JSON failed (out of memory?)");
    fputc('\n', stdout);
    return EXIT_OK;
}

static void print_text(ferry_file *f, const char *path)
{
    char h[32];
    int64_t n = ferry_file_tensor_count(f);
    printf("path:        %s\n", path);
    printf("format:      %s\n", ferry_format_name(ferry_file_format(f)));
    if (ferry_file_shard_count(f) > 1 || ferry_file_format(f) == FERRY_FORMAT_SAFETENSORS_INDEX)
        printf("files:       %d shards\n", ferry_file_shard_count(f));
    printf("tensors:     %" PRId64 "\n", n);
    printf("total bytes: %" PRIu64 " (%s)\n", ferry_file_total_bytes(f), cli_human(h, sizeof h, ferry_file_total_bytes(f)));
    int64_t nm = ferry_file_metadata_count(f);
    printf("metadata:    %s\n", nm ? "" : "(none)");
    for (int64_t i = 0; i < nm; i++) {
        const char *k, *v;
        ferry_file_metadata(f, i, &k, &v);
        int vl = (int)strlen(v);
        printf("  %s = %.*s%s\n", k, vl > 200 ? 200 : vl, v, vl > 200 ? "..." : "");
    }
    /* dtype summary */
    uint64_t by_dt[FERRY_DTYPE_COUNT] = {0};
    int64_t cnt_dt[FERRY_DTYPE_COUNT] = {0};
    size_t w = 4;
    uint64_t numel = 0, lb = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (!listed(ti.name)) continue;
        numel += numel_of(&ti), lb += ti.nbytes, cnt++;
        by_dt[ti.dtype] += ti.nbytes;
        cnt_dt[ti.dtype]++;
        size_t l = strlen(ti.name);
        if (l > w) w = l;
    }
    if (nfilters) printf("matching:    %" PRId64 " %s, %" PRIu64 " bytes\n", cnt, cli_plural(cnt, "tensor", "tensors"), lb);
    printf("elements:    %" PRIu64 " (%.3g parameters)\n", numel, (double)numel);
    printf("dtypes:     ");
    for (int d = 1; d < FERRY_DTYPE_COUNT; d++)
        if (cnt_dt[d]) printf(" %s x%" PRId64 " (%s)", ferry_dtype_name((ferry_dtype)d), cnt_dt[d], cli_human(h, sizeof h, by_dt[d]));
    printf("\n\n");
    if (w > 60) w = 60;
    printf("%-*s  %-11s  %-24s  %14s  %14s\n", (int)w, "NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET");
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        char shape[256];
        size_t o = 0;
        ferry_file_tensor_info(f, i, &ti);
        if (!listed(ti.name)) continue;
        o += (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < ti.ndim && o < sizeof shape - 24; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? ", " : "", ti.shape[d]);
        snprintf(shape + o, sizeof shape - o, "]");
        printf("%-*s  %-11s  %-24s  %14" PRIu64 "  %14" PRIu64, (int)w, ti.name, ferry_dtype_name(ti.dtype), shape,
               ti.nbytes, ti.offset);
        if (ferry_file_shard_count(f) > 1) printf("  %s", ferry_file_shard_path(f, ti.shard));
        if (ti.strides) { /* a strided view (PyTorch): BYTES is its span in the storage */
            printf("  strides [");
            for (int d = 0; d < ti.ndim && d < 16; d++) printf("%s%" PRId64, d ? ", " : "", ti.strides[d]);
            printf("%s]", ti.ndim > 16 ? ", ..." : "");
        }
        printf("\n");
    }
}

static int run(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false, opts = true;
    for (int i = 1; i < argc; i++) {
        if (opts && cli_is_help(argv[i])) return cli_help(&cmd_inspect);
        if (opts && strcmp(argv[i], "--json") == 0) json = true;
        else if (opts && strcmp(argv[i], "--filter") == 0) {
            if (i + 1 >= argc) return cli_usage_error(&cmd_inspect, "--filter needs a GLOB");
            const char **nf = realloc(filters, (size_t)(nfilters + 1) * sizeof *nf);
            if (!nf) return cli_fail("out of memory");
            filters = nf;
            filters[nfilters++] = argv[++i];
        } else if (opts && strcmp(argv[i], "--") == 0) opts = false;
        else if (opts && argv[i][0] == '-' && argv[i][1]) return cli_usage_error(&cmd_inspect, "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(&cmd_inspect, "one PATH only, got '%s' too", argv[i]);
    }
    if (!path) return cli_usage_error(&cmd_inspect, "missing PATH");
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(path, 1, &ctx, &f);
    if (ex) return ex;
    if (json) ex = print_json(f, path);
    else print_text(f, path);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    free(filters);
    filters = NULL, nfilters = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail("writing to stdout failed");
    return ex;
}
