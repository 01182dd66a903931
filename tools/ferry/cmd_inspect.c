/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_inspect.c - `ferry inspect`: what a checkpoint holds. */
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "folder.h"

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
    "a GGUF file, a PyTorch torch.save zip checkpoint (.pt, .pth, .ckpt, .bin), or\n"
    "a model folder:\n"
    "  - a diffusers pipeline (model_index.json): each component it names (the\n"
    "    subfolders transformer/, vae/, text_encoder/, ...) with the checkpoint\n"
    "    in it; components without one (scheduler/, tokenizer/) say so;\n"
    "  - any other folder: its one checkpoint (a transformers model folder).\n"
    "  A folder's checkpoint is the first of diffusion_pytorch_model, model (then\n"
    "  pytorch_model for .bin) as NAME.safetensors.index.json, NAME.safetensors,\n"
    "  NAME.bin.index.json, NAME.bin, as ferry.diffusers.weights_file picks it;\n"
    "  the plain file over its variants (NAME.fp16.safetensors), else the first\n"
    "  variant by name; else the folder's one index or one checkpoint file. The\n"
    "  listing says which file it picked and why. A folder with nothing to read,\n"
    "  or several checkpoints to choose from, is a usage error.\n"
    "\n"
    "Text output of a folder: a line per component (name, path, format, tensors,\n"
    "bytes, parameters, how it was picked), then each checkpoint as for a file.\n"
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
    "              object \"total_numel\" (the parameters of the tensors listed);\n"
    "              metadata values keep their types where the file has them: GGUF\n"
    "              integers, floats, booleans and arrays of up to 16 items, and an\n"
    "              index's non-string values, are JSON values; strings, and what\n"
    "              JSON cannot hold (NaN, Infinity, an integer past 2^63-1, a long\n"
    "              array summarised as \"[STRING x 151936]\"), are strings\n"
    "              a folder: {\"folder\", \"components\": [{\"name\", \"path\", then\n"
    "              the object above for its checkpoint}, ...]} (by name); \"note\"\n"
    "              says how the file was picked where there was a choice; a\n"
    "              component without weights has \"path\": null and a \"note\" only\n"
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

/* Count, bytes and elements of the tensors listed. */
static void totals(ferry_file *f, int64_t *cnt, uint64_t *bytes, uint64_t *numel)
{
    *cnt = 0, *bytes = 0, *numel = 0;
    for (int64_t i = 0; i < ferry_file_tensor_count(f); i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (!listed(ti.name)) continue;
        (*cnt)++, *bytes += ti.nbytes, *numel += numel_of(&ti);
    }
}

/* Metadata value i as JSON: what the library gives as JSON text parsed (a
 * number, boolean or array), anything else, or JSON that jansson cannot hold
 * (an integer past INT64_MAX), as a string. */
static json_t *meta_json(ferry_file *f, int64_t i, const char *v)
{
    if (ferry_file_metadata_kind(f, i) == FERRY_META_JSON) {
        json_t *j = json_loads(v, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (j) return j;
    }
    return json_string(v);
}

/* The fewest significant digits (1..17) that read back as v. */
static int digits_of(double v)
{
    char b[40];
    for (int p = 1; p < 17; p++) {
        snprintf(b, sizeof b, "%.*g", p, v);
        if (strtod(b, NULL) == v) return p;
    }
    return 17;
}

/* The most digits any real in j needs to read back the same (0: none there).
 * Dumped with that precision, 1e-05 stays "1e-05", not "1.0000000000000001e-05". */
static int real_digits(const json_t *j)
{
    int m = 0, d;
    size_t i;
    const char *k;
    json_t *v;
    if (json_is_real(j)) return digits_of(json_real_value(j));
    if (json_is_array(j)) json_array_foreach(j, i, v) if ((d = real_digits(v)) > m) m = d;
    if (json_is_object(j)) json_object_foreach((json_t *)j, k, v) if ((d = real_digits(v)) > m) m = d;
    return m;
}

/* ---- --json, written as it goes ----
 * A checkpoint may list millions of tensors, so the document is never one
 * tree: only its small parts (a file's head: format, path, metadata, counts,
 * files; a folder's components) are built as jansson trees, and the tensors
 * are made and written one at a time, so the peak RSS stays that of the open
 * file (a 1.5 M-tensor header: bench/RESULTS.md, "On the development
 * machine"). Each piece is dumped by jansson with the flags a dump of the
 * whole document takes (indent 2, insertion order, the precision its reals
 * need) and indented for the depth it sits at: the text is what one dump of
 * the whole tree gives, byte for byte (ctest inspect_json). */

static size_t jflags; /* this document's dump flags */
static bool jfailed;  /* a write or an allocation failed */

static int put_bytes(const char *b, size_t n, void *depth)
{
    /* jansson's line breaks are its only '\n' bytes (a string's are escaped):
     * each is followed by the indentation of the depth the piece sits at */
    static const char spaces[] = "                                ";
    int d = depth ? *(const int *)depth : 0;
    size_t extra = 2 * (size_t)d;
    while (n) {
        const char *nl = memchr(b, '\n', n);
        size_t run = nl ? (size_t)(nl - b) + 1 : n;
        if (fwrite(b, 1, run, stdout) != run) return -1;
        for (size_t left = nl ? extra : 0, w; left; left -= w) {
            w = left < sizeof spaces - 1 ? left : sizeof spaces - 1;
            if (fwrite(spaces, 1, w, stdout) != w) return -1;
        }
        b += run, n -= run;
    }
    return 0;
}

static void put_text(const char *s)
{
    if (put_bytes(s, strlen(s), NULL) < 0) jfailed = true;
}

/* A line break and the indentation of depth. */
static void put_indent(int depth)
{
    if (put_bytes("\n", 1, &depth) < 0) jfailed = true;
}

/* v (its reference taken) as JSON text sitting at depth. */
static void put_value(json_t *v, int depth)
{
    if (!v || json_dump_callback(v, put_bytes, &depth, jflags | JSON_ENCODE_ANY) < 0) jfailed = true;
    json_decref(v);
}

/* The next member's key (len bytes) of an object at depth: a comma after
 * the one before, a line of its own. */
static void put_keyn(const char *key, size_t len, int depth, bool *first)
{
    if (!*first) put_text(",");
    *first = false;
    put_indent(depth + 1);
    put_value(json_stringn(key, len), depth + 1);
    put_text(": ");
}

static void put_key(const char *key, int depth, bool *first)
{
    put_keyn(key, strlen(key), depth, first);
}

/* The members of object o, an object at depth (its braces are the caller's). */
static void put_members(json_t *o, int depth, bool *first)
{
    const char *k;
    size_t kl;
    json_t *v;
    json_object_keylen_foreach(o, k, kl, v)
    {
        put_keyn(k, kl, depth, first);
        put_value(json_incref(v), depth + 1);
    }
}

/* What inspect --json says of one checkpoint, but its tensors (put_tensors). */
static json_t *file_head(ferry_file *f, const char *path)
{
    json_t *o = json_object(), *meta = json_object(), *files = json_array();
    if (!o || !meta || !files) {
        json_decref(o), json_decref(meta), json_decref(files);
        return NULL;
    }
    json_object_set_new(o, "format", json_string(ferry_format_name(ferry_file_format(f))));
    json_object_set_new(o, "path", json_string(path));
    for (int64_t i = 0; i < ferry_file_metadata_count(f); i++) {
        const char *k, *v;
        ferry_file_metadata(f, i, &k, &v);
        json_object_set_new(meta, k, meta_json(f, i, v));
    }
    json_object_set_new(o, "metadata", meta);
    int64_t cnt;
    uint64_t tb, tn;
    totals(f, &cnt, &tb, &tn);
    json_object_set_new(o, "tensor_count", json_integer(cnt));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)tb));
    json_object_set_new(o, "total_numel", json_integer((json_int_t)tn));
    for (int s = 0; s < ferry_file_shard_count(f); s++)
        json_array_append_new(files, json_string(ferry_file_shard_path(f, s)));
    json_object_set_new(o, "files", files);
    return o;
}

/* Tensor i's object, or NULL when --filter leaves it out. */
static json_t *tensor_json(ferry_file *f, int64_t i)
{
    ferry_tensor_info ti = {.size = sizeof ti};
    ferry_file_tensor_info(f, i, &ti);
    if (!listed(ti.name)) return NULL;
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
    if (!t) jfailed = true;
    return t;
}

/* The "tensors" array of f, sitting at depth (file order; those listed). */
static void put_tensors(ferry_file *f, int depth)
{
    bool any = false;
    for (int64_t i = 0; i < ferry_file_tensor_count(f) && !jfailed; i++) {
        json_t *t = tensor_json(f, i);
        if (!t) continue;
        put_text(any ? "," : "[");
        put_indent(depth + 1);
        put_value(t, depth + 1);
        any = true;
    }
    if (any) put_indent(depth);
    put_text(any ? "]" : "[]");
}

/* The end of a document: a newline, then whether it all went out (a failed
 * write is run's to report, once). */
static int json_end(void)
{
    put_text("\n");
    if (jfailed && !ferror(stdout)) return cli_fail("writing JSON failed (out of memory?)");
    return jfailed ? EXIT_FAIL : EXIT_OK;
}

/* inspect --json of one checkpoint. */
static int emit_file_json(ferry_file *f, const char *path)
{
    json_t *head = file_head(f, path);
    jfailed = !head;
    jflags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(head ? real_digits(head) : 0);
    bool first = true;
    put_text("{");
    if (head) put_members(head, 0, &first);
    put_key("tensors", 0, &first);
    put_tensors(f, 1);
    put_text("\n}");
    json_decref(head);
    return json_end();
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
    printf("total bytes: %" PRIu64 " (%s)\n", ferry_file_total_bytes(f),
           cli_human(h, sizeof h, ferry_file_total_bytes(f)));
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
    if (nfilters)
        printf("matching:    %" PRId64 " %s, %" PRIu64 " bytes\n", cnt, cli_plural(cnt, "tensor", "tensors"),
               lb);
    printf("elements:    %" PRIu64 " (%.3g parameters)\n", numel, (double)numel);
    printf("dtypes:     ");
    for (int d = 1; d < FERRY_DTYPE_COUNT; d++)
        if (cnt_dt[d])
            printf(" %s x%" PRId64 " (%s)", ferry_dtype_name((ferry_dtype)d), cnt_dt[d],
                   cli_human(h, sizeof h, by_dt[d]));
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
        printf("%-*s  %-11s  %-24s  %14" PRIu64 "  %14" PRIu64, (int)w, ti.name, ferry_dtype_name(ti.dtype),
               shape, ti.nbytes, ti.offset);
        if (ferry_file_shard_count(f) > 1) printf("  %s", ferry_file_shard_path(f, ti.shard));
        if (ti.strides) { /* a strided view (PyTorch): BYTES is its span in the storage */
            printf("  strides [");
            for (int d = 0; d < ti.ndim && d < 16; d++) printf("%s%" PRId64, d ? ", " : "", ti.strides[d]);
            printf("%s]", ti.ndim > 16 ? ", ..." : "");
        }
        printf("\n");
    }
}

/* A model folder (folder.h): a summary line per component, then each
 * component's checkpoint as inspect describes one. */
static int inspect_folder(const char *dir, bool json)
{
    cli_folder fo;
    int ex = cli_folder_open(&cmd_inspect, dir, &fo);
    if (ex) return ex;
    ferry_ctx **ctx = calloc((size_t)fo.n, sizeof *ctx);
    ferry_file **f = calloc((size_t)fo.n, sizeof *f);
    if (!ctx || !f) ex = cli_fail("out of memory");
    for (int i = 0; i < fo.n && !ex; i++)
        if (fo.c[i].path) ex = cli_open(fo.c[i].path, 1, &ctx[i], &f[i]);
    if (!ex && json) {
        /* the components' heads first: the document's reals share one precision */
        json_t *top = json_object(), **c = calloc((size_t)fo.n, sizeof *c);
        jfailed = !top || !c;
        int digits = 0;
        json_object_set_new(top, "folder", json_string(dir));
        for (int i = 0; i < fo.n && !jfailed; i++) {
            c[i] = json_object();
            json_object_set_new(c[i], "name", json_string(fo.c[i].name));
            json_object_set_new(c[i], "path", fo.c[i].path ? json_string(fo.c[i].path) : json_null());
            if (fo.c[i].note) json_object_set_new(c[i], "note", json_string(fo.c[i].note));
            json_t *head = f[i] ? file_head(f[i], fo.c[i].path) : NULL;
            if (f[i] && !head) jfailed = true;
            json_object_update(c[i], head); /* (its "path" keeps its place: the same value) */
            json_decref(head);
            int d = real_digits(c[i]);
            if (d > digits) digits = d;
            if (!c[i]) jfailed = true;
        }
        jflags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(digits);
        bool first = true;
        put_text("{");
        if (top) put_members(top, 0, &first);
        put_key("components", 0, &first);
        for (int i = 0; i < fo.n && !jfailed; i++) {
            put_text(i ? "," : "[");
            put_indent(2);
            put_text("{");
            bool cfirst = true;
            put_members(c[i], 2, &cfirst);
            if (f[i]) {
                put_key("tensors", 2, &cfirst);
                put_tensors(f[i], 3);
            }
            if (!cfirst) put_indent(2);
            put_text("}");
        }
        if (fo.n) put_indent(1);
        put_text(fo.n ? "]" : "[]");
        put_text("\n}");
        for (int i = 0; c && i < fo.n; i++) json_decref(c[i]);
        free(c);
        json_decref(top);
        ex = json_end();
    } else if (!ex) {
        char h[32];
        size_t w = 4;
        for (int i = 0; i < fo.n; i++)
            if (strlen(fo.c[i].name) > w) w = strlen(fo.c[i].name);
        printf("folder:      %s\n", dir);
        printf("components:  %d\n", fo.n);
        for (int i = 0; i < fo.n; i++) {
            printf("  %-*s  ", (int)w, fo.c[i].name);
            if (!f[i]) {
                printf("(%s)\n", fo.c[i].note);
                continue;
            }
            int64_t cnt;
            uint64_t tb, tn;
            totals(f[i], &cnt, &tb, &tn);
            printf("%s  %s  %" PRId64 " %s  %" PRIu64 " bytes (%s)  %.3g parameters%s%s%s\n", fo.c[i].path,
                   ferry_format_name(ferry_file_format(f[i])), cnt, cli_plural(cnt, "tensor", "tensors"), tb,
                   cli_human(h, sizeof h, tb), (double)tn, fo.c[i].note ? "  (" : "",
                   fo.c[i].note ? fo.c[i].note : "", fo.c[i].note ? ")" : "");
        }
        for (int i = 0; i < fo.n; i++) {
            if (!f[i]) continue;
            printf("\n== %s\n", fo.c[i].name);
            print_text(f[i], fo.c[i].path);
        }
    }
    for (int i = 0; i < fo.n; i++) {
        if (f) ferry_file_close(f[i]);
        if (ctx) ferry_ctx_free(ctx[i]);
    }
    free(f), free(ctx);
    cli_folder_free(&fo);
    return ex;
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
        else if (opts && argv[i][0] == '-' && argv[i][1])
            return cli_usage_error(&cmd_inspect, "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(&cmd_inspect, "one PATH only, got '%s' too", argv[i]);
    }
    if (!path) return cli_usage_error(&cmd_inspect, "missing PATH");
    int ex;
    if (cli_is_dir(path)) {
        ex = inspect_folder(path, json);
    } else {
        ferry_ctx *ctx;
        ferry_file *f;
        ex = cli_open(path, 1, &ctx, &f);
        if (ex) goto out;
        if (json) ex = emit_file_json(f, path);
        else print_text(f, path);
        ferry_file_close(f);
        ferry_ctx_free(ctx);
    }
out:
    free(filters);
    filters = NULL, nfilters = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail("writing to stdout failed");
    return ex;
}
