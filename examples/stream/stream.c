/* SPDX-License-Identifier: Apache-2.0 */
/* stream.c - run a model whose weights do not fit a device budget, block by
 * block, with ferry's streaming engine (ferry_streamer_*).
 *
 * An engine that runs a transformer (a DiT, an LLM) calls its repeated
 * blocks one after another, pass after pass (a denoising step, a token).
 * When the weights do not fit, ferry's streamer keeps as many blocks as the
 * budget holds resident on the device and moves the others in, a few blocks
 * ahead of the one computing, while the engine works. The engine only says
 * when a pass and each block begins and ends:
 *
 *     ferry_streamer_pass_begin(st, S);
 *     for each block k:
 *         ferry_streamer_block_begin(st, k, S);   k's weights are on the device
 *         ... the block's kernels on stream S ...
 *         ferry_streamer_block_end(st, k, S);     k may leave once S ran them
 *     ferry_streamer_pass_end(st, S);
 *
 * Here the kernels are a stand-in: a sleep of --block-ms, and in the first
 * and the last pass a read-back of one tensor of each block, compared with
 * the checkpoint's bytes. S is 0: on a sim device the caller's thread, on
 * CUDA the legacy default stream (a real engine passes the CUstream its
 * kernels run on).
 *
 *     stream CHECKPOINT [--device SPEC] [--budget SIZE] [--prefix P] ...
 *     (stream --help lists every option)
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"

typedef struct options {
    const char *checkpoint;
    const char *device; /* ferry_device_open's spec */
    uint64_t budget;    /* device bytes the store (and so the streamer) may use */
    const char *prefix; /* blocks are the tensors named PREFIX<N>.* */
    long passes;
    double block_ms; /* the stand-in compute's time per block */
    int copies;      /* ferry_stream_copies */
    int json;
} options;

/* One block: its tensors (model indices) and their bytes, and the one the
 * stand-in compute reads back, the block's largest (tensors[check]). */
typedef struct block {
    uint64_t number; /* N of PREFIX<N>. */
    const int64_t *tensors;
    int64_t n;
    uint64_t bytes;
    int64_t check;
    uint64_t check_bytes;
} block;

typedef struct pass_result {
    double seconds;      /* the engine's pass time: pass_begin to pass_end */
    double waited;       /* of it, spent inside block_begin and block_end (waiting for moves) */
    uint64_t htod, read; /* bytes moved to the device, and of them read from the checkpoint */
} pass_result;

/* Print "stream: " and the message on stderr; returns ret (for `return fail(2, ...)`). */
__attribute__((format(printf, 2, 3))) static int fail(int ret, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("stream: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return ret;
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: stream CHECKPOINT [options]\n"
        "Run a model larger than its device budget block by block with ferry's streaming engine,\n"
        "a sleep standing in for each block's kernels.\n"
        "  --device SPEC     sim:SIZE[,RATE/s] or cuda[:N] (default sim:512MiB,2GB/s)\n"
        "  --budget SIZE     device bytes for the model (default 256MiB)\n"
        "  --prefix P        blocks are the tensors named P<N>.* (default blocks.)\n"
        "  --passes N        passes over the blocks (default 4)\n"
        "  --block-ms MS     stand-in compute per block, in milliseconds (default 5)\n"
        "  --copies C        where streamed blocks come from after the first pass:\n"
        "                    auto, pinned (copies in pinned RAM) or ring (the checkpoint) (default auto)\n"
        "  --json            print one JSON object instead of text\n"
        "Exits 0, 1 on failure (the library's message on stderr), 2 for a bad command line.\n");
}

/* The options, or 2 after a message (0 with --help: *help set). */
static int parse_args(int argc, char **argv, options *o, int *help)
{
    *o = (options){.device = "sim:512MiB,2GB/s",
                   .budget = 256ull << 20,
                   .prefix = "blocks.",
                   .passes = 4,
                   .block_ms = 5,
                   .copies = FERRY_STREAM_COPIES_AUTO};
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return *help = 1, 0;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o->checkpoint) return fail(2, "one checkpoint only (%s and %s)", o->checkpoint, a);
            o->checkpoint = a;
            continue;
        }
        if (!v) return fail(2, "%s needs a value (stream --help)", a);
        i++; /* the rest take a value: v */
        if (strcmp(a, "--device") == 0) {
            o->device = v;
        } else if (strcmp(a, "--budget") == 0) {
            if (ferry_parse_size(v, &o->budget) < 0 || o->budget == 0)
                return fail(2, "--budget %s: expected a size above 0 (256MiB, 1.5GB, 1000000)", v);
        } else if (strcmp(a, "--prefix") == 0) {
            o->prefix = v;
        } else if (strcmp(a, "--passes") == 0) {
            o->passes = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || o->passes < 1 || o->passes > 1000000)
                return fail(2, "--passes %s: expected a whole number from 1", v);
        } else if (strcmp(a, "--block-ms") == 0) {
            o->block_ms = strtod(v, &end);
            if (*v == '\0' || *end != '\0' || !(o->block_ms >= 0 && o->block_ms <= 60000))
                return fail(2, "--block-ms %s: expected milliseconds from 0 to 60000", v);
        } else if (strcmp(a, "--copies") == 0) {
            if (strcmp(v, "auto") == 0) o->copies = FERRY_STREAM_COPIES_AUTO;
            else if (strcmp(v, "pinned") == 0) o->copies = FERRY_STREAM_COPIES_PINNED;
            else if (strcmp(v, "ring") == 0) o->copies = FERRY_STREAM_COPIES_RING;
            else return fail(2, "--copies %s: expected auto, pinned or ring", v);
        } else {
            return fail(2, "unknown option %s (stream --help)", a);
        }
    }
    if (!o->checkpoint) {
        usage(stderr);
        return 2;
    }
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(double ms)
{
    time_t sec = (time_t)(ms / 1000);
    struct timespec ts = {.tv_sec = sec, .tv_nsec = (long)((ms - (double)sec * 1000) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) { /* a signal: sleep the rest */
    }
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1 << 20);
}

/* N when name is PREFIX<N>.something, else -1. */
static int64_t block_number(const char *name, const char *prefix)
{
    size_t l = strlen(prefix);
    if (strncmp(name, prefix, l) != 0) return -1;
    const char *p = name + l;
    int64_t n = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++) n = n * 10 + (*p - '0');
    return digits > 0 && *p == '.' ? n : -1;
}

typedef struct numbered {
    int64_t number, tensor;
} numbered;

static int cmp_numbered(const void *a, const void *b)
{
    const numbered *x = a, *y = b;
    if (x->number != y->number) return x->number < y->number ? -1 : 1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* Find the blocks (tensors named PREFIX<N>.*, in the order of N) and make
 * each one group, so that it moves as one: ferry_store_add grouped only the
 * tensors of one module (blocks.3.attn.qkv.weight with blocks.3.attn.qkv.bias).
 * *idx holds every block's tensors, each block's run of them pointed to by
 * its entry of *blocks; the caller frees both. 0, or -1 after a message. */
static int find_blocks(ferry_model *m, const options *o, int64_t **idx, block **blocks, int64_t *nblocks)
{
    int64_t nt = ferry_model_tensor_count(m), n = 0, nb = 0;
    numbered *e = calloc((size_t)(nt > 0 ? nt : 1), sizeof *e);
    *idx = calloc((size_t)(nt > 0 ? nt : 1), sizeof **idx);
    *blocks = calloc((size_t)(nt > 0 ? nt : 1), sizeof **blocks);
    if (!e || !*idx || !*blocks) {
        free(e);
        return fail(-1, "%s: out of memory for %" PRId64 " tensors", o->checkpoint, nt);
    }
    for (int64_t t = 0; t < nt; t++) {
        ferry_tensor_state ts = {.size = sizeof ts};
        if (ferry_model_tensor_state(m, t, &ts) < 0) continue;
        int64_t num = block_number(ts.name, o->prefix);
        if (num >= 0) e[n++] = (numbered){num, t};
    }
    qsort(e, (size_t)n, sizeof *e, cmp_numbered);
    for (int64_t i = 0; i < n; i++) {
        (*idx)[i] = e[i].tensor;
        if (i == 0 || e[i].number != e[i - 1].number) /* a new block starts */
            (*blocks)[nb++] = (block){.number = (uint64_t)e[i].number, .tensors = &(*idx)[i]};
        block *b = &(*blocks)[nb - 1];
        ferry_tensor_state ts = {.size = sizeof ts};
        (void)ferry_model_tensor_state(m, e[i].tensor, &ts);
        if (ts.nbytes > b->check_bytes) b->check = b->n, b->check_bytes = ts.nbytes;
        b->n++;
        b->bytes += ts.nbytes;
    }
    free(e);
    *nblocks = nb;
    if (nb == 0) {
        return fail(-1, "%s: no tensor is named %s<N>.* (--prefix names the blocks)", o->checkpoint,
                    o->prefix);
    }
    for (int64_t k = 0; k < nb; k++) {
        int rc = ferry_model_group(m, (*blocks)[k].tensors, (*blocks)[k].n);
        if (rc < 0) {
            return fail(-1, "%s: grouping block %s%" PRIu64 ".: %s", o->checkpoint, o->prefix,
                        (*blocks)[k].number, ferry_model_errmsg(m));
        }
    }
    return 0;
}

/* The stand-in for block b's kernels. A real engine would take the
 * tensors' device addresses here (ferry_model_device_addrs) and queue its
 * kernels on the stream; this one sleeps, and when check is set reads the
 * block's largest tensor back from the device and compares it with the
 * checkpoint (its bytes in the file mapping, no copy). 0, or -1 after a
 * message. */
static int compute(ferry_model *m, ferry_file *f, const options *o, const block *b, uint64_t *addrs,
                   void *buf, int check)
{
    /* 3 figures a tensor: its address, and the base and size of the device
     * block of the store's that holds it */
    if (ferry_model_device_addrs(m, b->tensors, b->n, addrs) < 0) {
        return fail(-1, "%s: block %s%" PRIu64 ".: its tensors' device addresses: %s", o->checkpoint,
                    o->prefix, b->number, ferry_model_errmsg(m));
    }
    if (b->check_bytes > 0 && addrs[3 * b->check] == 0) { /* after block_begin the block is on the device */
        return fail(-1, "%s: block %s%" PRIu64 ".: not on the device after ferry_streamer_block_begin",
                    o->checkpoint, o->prefix, b->number);
    }
    if (o->block_ms > 0) sleep_ms(o->block_ms);
    if (!check) return 0;
    int64_t t = b->tensors[b->check];
    ferry_tensor_state ts = {.size = sizeof ts};
    const void *want = NULL;
    if (ferry_model_read(m, t, buf) < 0 || ferry_model_tensor_state(m, t, &ts) < 0) {
        return fail(-1, "%s: reading back a tensor of block %s%" PRIu64 ".: %s", o->checkpoint, o->prefix,
                    b->number, ferry_model_errmsg(m));
    }
    if (ts.tier != FERRY_TIER_DEVICE) { /* (ferry_model_read reads whichever tier holds it) */
        return fail(-1, "%s: tensor %s: in tier %s, not on the device, while its block runs", o->checkpoint,
                    ts.name, ferry_tier_name(ts.tier));
    }
    /* the checkpoint's bytes: the model's tensors are this file's, so find it there by name */
    int64_t ft = ferry_file_find(f, ts.name);
    if (ft < 0 || ferry_file_tensor_data(f, ft, &want) < 0) {
        return fail(-1, "%s: tensor %s: not found in the file", o->checkpoint, ts.name);
    }
    if (memcmp(buf, want, (size_t)ts.nbytes) != 0) {
        uint64_t at = 0;
        while (((const unsigned char *)buf)[at] == ((const unsigned char *)want)[at]) at++;
        return fail(-1,
                    "%s: tensor %s (%" PRIu64 " bytes) read back from the device differs from the checkpoint,"
                    " first at byte %" PRIu64,
                    o->checkpoint, ts.name, ts.nbytes, at);
    }
    return 0;
}

/* s as a JSON string. */
static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void report_json(const options *o, ferry_device *dev, int64_t ntensors, uint64_t model_bytes,
                        int64_t nblocks, const pass_result *pr, long done, int64_t verified,
                        const ferry_streamer_stats *e)
{
    printf("{\"checkpoint\": ");
    json_string(o->checkpoint);
    printf(", \"device\": ");
    json_string(ferry_device_desc(dev));
    printf(", \"prefix\": ");
    json_string(o->prefix);
    printf(", \"tensors\": %" PRId64 ", \"model_bytes\": %" PRIu64 ", \"blocks\": %" PRId64
           ", \"budget\": %" PRIu64 ", \"passes\": %ld, \"passes_done\": %ld, \"blocks_verified\": %" PRId64
           ", \"per_pass\": [",
           ntensors, model_bytes, nblocks, o->budget, o->passes, done, verified);
    for (long p = 0; p < done; p++)
        printf("%s{\"seconds\": %.6f, \"waited_seconds\": %.6f, \"bytes_htod\": %" PRIu64
               ", \"bytes_read\": %" PRIu64 "}",
               p ? ", " : "", pr[p].seconds, pr[p].waited, pr[p].htod, pr[p].read);
    printf("], \"plan\": {\"resident_blocks\": %" PRId64 ", \"streamed_blocks\": %" PRId64
           ", \"prefetch\": %" PRId64 ", \"prefetch_asked\": %" PRId64 ", \"budget\": %" PRIu64
           ", \"minimum_bytes\": %" PRIu64 ", \"fixed_bytes\": %" PRIu64 ", \"resident_bytes\": %" PRIu64
           ", \"window_bytes\": %" PRIu64 ", \"streamed_bytes\": %" PRIu64 ", \"shrinks\": %" PRIu64
           ", \"grows\": %" PRIu64 ", \"retries\": %" PRIu64 ", \"prefetch_skipped\": %" PRIu64
           ", \"pinned_copies\": %s}}\n",
           e->resident_blocks, e->streamed_blocks, e->prefetch, e->prefetch_asked, e->budget,
           e->minimum_bytes, e->fixed_bytes, e->resident_bytes, e->window_bytes, e->streamed_bytes,
           e->shrinks, e->grows, e->retries, e->prefetch_skipped, e->pinned_copies ? "true" : "false");
}

int main(int argc, char **argv)
{
    options o;
    int help = 0, rc = parse_args(argc, argv, &o, &help);
    if (rc) return rc;
    if (help) {
        usage(stdout);
        return 0;
    }
    /* every handle starts NULL, so one cleanup frees whatever was made */
    int status = 1;
    ferry_ctx *ctx = NULL;
    ferry_device *dev = NULL;
    ferry_file *f = NULL;
    ferry_store *store = NULL;
    ferry_model *m = NULL;
    ferry_streamer *st = NULL;
    int64_t *idx = NULL, *leaders = NULL, nb = 0, verified = 0;
    block *blocks = NULL;
    uint64_t *addrs = NULL;
    void *buf = NULL;
    pass_result *pr = NULL;
    long done = 0;
    int64_t most = 0;     /* tensors in the largest block */
    uint64_t largest = 0; /* bytes of the largest tensor checked */
    ferry_streamer_stats e = {.size = sizeof e};
    const uint64_t S = 0; /* the stream the blocks run on (see the top of the file) */

    if ((rc = ferry_ctx_new(NULL, &ctx)) < 0) {
        fail(1, "%s", ferry_ctx_errmsg(NULL));
        goto out;
    }
    if ((rc = ferry_device_open(ctx, o.device, &dev)) < 0) {
        fail(1, "device %s: %s", o.device, ferry_ctx_errmsg(ctx));
        goto out;
    }
    if ((rc = ferry_file_open(ctx, o.checkpoint, 0, &f)) < 0) {
        fail(1, "%s", ferry_ctx_errmsg(ctx)); /* (the message names the file) */
        goto out;
    }
    /* The store owns the device memory: the budget caps it, and the streamer
     * plans for the store's budget (ferry_streamer_opts.budget 0). */
    ferry_store_opts so = {.size = sizeof so, .device_budget = o.budget};
    if ((rc = ferry_store_new(dev, &so, &store)) < 0) {
        fail(1, "a store on %s: %s", ferry_device_desc(dev), ferry_ctx_errmsg(ctx));
        goto out;
    }
    /* the model is called by the checkpoint's file name (the library's messages name it) */
    const char *name = strrchr(o.checkpoint, '/') ? strrchr(o.checkpoint, '/') + 1 : o.checkpoint;
    if ((rc = ferry_store_add(store, name, &f, 1, 0, &m)) < 0) {
        fail(1, "%s: %s", o.checkpoint, ferry_store_errmsg(store));
        goto out;
    }
    if (find_blocks(m, &o, &idx, &blocks, &nb) < 0) goto out;

    /* one tensor of each block names it to the streamer; buffers for the
     * largest block's addresses and the largest checked tensor */
    leaders = calloc((size_t)nb, sizeof *leaders);
    pr = calloc((size_t)o.passes, sizeof *pr);
    for (int64_t k = 0; k < nb && leaders; k++) {
        leaders[k] = blocks[k].tensors[0];
        most = blocks[k].n > most ? blocks[k].n : most;
        largest = blocks[k].check_bytes > largest ? blocks[k].check_bytes : largest;
    }
    addrs = calloc((size_t)most * 3, sizeof *addrs);
    buf = malloc(largest ? (size_t)largest : 1);
    if (!leaders || !pr || !addrs || !buf) {
        fail(1, "%s: out of memory", o.checkpoint);
        goto out;
    }

    /* Plan: the blocks that stay resident, the window the others pass
     * through. Below the minimum (the tensors outside the blocks + the
     * largest block) this fails, and the message says both figures. */
    ferry_streamer_opts sopts = {.size = sizeof sopts, .blocks = leaders, .nblocks = nb, .copies = o.copies};
    if ((rc = ferry_streamer_new(m, &sopts, &st)) < 0) {
        fail(1, "%s: %s", o.checkpoint, ferry_model_errmsg(m));
        goto out;
    }
    if (!o.json) {
        (void)ferry_streamer_get_stats(st, &e);
        printf("%s: %" PRId64 " tensors, %.1f MiB; %" PRId64 " blocks %s<N>., %.1f MiB outside them\n",
               o.checkpoint, ferry_model_tensor_count(m), mib(ferry_file_total_bytes(f)), nb, o.prefix,
               mib(e.fixed_bytes));
        printf("%s, budget %.1f MiB: %" PRId64 " blocks resident, %" PRId64 " streamed\n",
               ferry_device_desc(dev), mib(o.budget), e.resident_blocks, e.streamed_blocks);
    }

    for (long p = 0; p < o.passes; p++) {
        int check = p == 0 || p == o.passes - 1;
        double waited = 0, t;
        if ((rc = ferry_streamer_pass_begin(st, S)) < 0) {
            fail(1, "%s: pass %ld: %s", o.checkpoint, p + 1, ferry_model_errmsg(m));
            goto out;
        }
        for (int64_t k = 0; k < nb; k++) {
            t = now();
            rc = ferry_streamer_block_begin(st, k, S);
            waited += now() - t;
            if (rc < 0) {
                fail(1, "%s: pass %ld, block %s%" PRIu64 ".: %s", o.checkpoint, p + 1, o.prefix,
                     blocks[k].number, ferry_model_errmsg(m));
                goto end_pass;
            }
            if (compute(m, f, &o, &blocks[k], addrs, buf, check) < 0) {
                rc = -1;
                (void)ferry_streamer_block_end(st, k, S);
                goto end_pass;
            }
            verified += check;
            t = now();
            rc = ferry_streamer_block_end(st, k, S);
            waited += now() - t;
            if (rc < 0) {
                fail(1, "%s: pass %ld, after block %s%" PRIu64 ".: %s", o.checkpoint, p + 1, o.prefix,
                     blocks[k].number, ferry_model_errmsg(m));
                goto end_pass;
            }
        }
    end_pass:
        /* (after a failure too: the pass's holds are given back) */
        if (ferry_streamer_pass_end(st, S) < 0 && rc == 0) {
            fail(1, "%s: ending pass %ld: %s", o.checkpoint, p + 1, ferry_model_errmsg(m));
            rc = -1;
        }
        if (rc < 0) goto out;
        /* the engine's figures for the pass just ended */
        (void)ferry_streamer_get_stats(st, &e);
        pr[p] = (pass_result){e.pass_seconds, waited, e.pass_htod, e.pass_read};
        done++;
        if (!o.json)
            printf("pass %ld: %.3f s (%.3f s waiting for moves), %.1f MiB to the device, %.1f MiB read from "
                   "the file%s\n",
                   p + 1, e.pass_seconds, waited, mib(e.pass_htod), mib(e.pass_read),
                   check ? ", every block checked" : "");
    }

    (void)ferry_streamer_get_stats(st, &e);
    if (o.json) {
        report_json(&o, dev, ferry_model_tensor_count(m), ferry_file_total_bytes(f), nb, pr, done, verified,
                    &e);
    } else {
        printf("plan: %" PRId64 " of %" PRId64
               " blocks resident (%.1f MiB with the tensors outside the blocks), %" PRId64
               " streamed (%.1f MiB a pass), prefetch %" PRId64 " (asked %" PRId64 ")\n",
               e.resident_blocks, nb, mib(e.resident_bytes), e.streamed_blocks, mib(e.streamed_bytes),
               e.prefetch, e.prefetch_asked);
        printf("      minimum budget %.1f MiB (%" PRIu64 " bytes), %" PRIu64 " shrinks, %" PRIu64
               " grows, pinned copies: %s; %" PRId64 " blocks read back and checked\n",
               mib(e.minimum_bytes), e.minimum_bytes, e.shrinks, e.grows, e.pinned_copies ? "yes" : "no",
               verified);
    }
    status = 0;
out:
    /* in reverse order of making: the streamer lands its moves and drops its
     * holds, the store frees the model's memory, then the file and device */
    ferry_streamer_free(st);
    ferry_store_free(store);
    ferry_file_close(f);
    ferry_device_close(dev);
    ferry_ctx_free(ctx);
    free(idx);
    free(blocks);
    free(leaders);
    free(addrs);
    free(buf);
    free(pr);
    return status;
}
