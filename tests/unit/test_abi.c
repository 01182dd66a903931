/* SPDX-License-Identifier: Apache-2.0 */
/* test_abi.c - the ABI can grow: structs of an older (smaller) size still
 * work and are never written past their size, every size is checked, the
 * library's own description of its structs (ferry_abi_*) matches the header,
 * and each handle keeps its own error message. Runs on the sim device. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry.h"
#include "check.h"

static char dir[256];

/* a safetensors file of n U8 tensors "blk.K.w" of len bytes each */
static void write_st(const char *path, int n, unsigned len)
{
    char hdr[8192];
    size_t h = (size_t)snprintf(hdr, sizeof hdr, "{");
    for (int k = 0; k < n; k++)
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[%u,%u]}",
                              k ? "," : "", k, len, k * len, (k + 1) * len);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (unsigned i = 0; i < (unsigned)n * len; i++) fputc((int)(i * 7u), f);
    fclose(f);
}

/* Canary bytes after an older caller's struct: the library must leave them. */
#define CANARY 0xA5
static int intact(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != CANARY) return 0;
    return 1;
}

static ferry_ctx *ctx;
static char model_path[300];

/* ---- old sizes ---- */

static void test_old_tensor_info(void)
{
    ferry_file *f = NULL;
    CHECK_EQ(ferry_file_open(ctx, model_path, 0, &f), 0);
    if (!f) return;
    /* a caller built before strides and flags were appended */
    unsigned char buf[sizeof(ferry_tensor_info) + 64];
    memset(buf, CANARY, sizeof buf);
    ferry_tensor_info *old = (ferry_tensor_info *)buf;
    const size_t osz = offsetof(ferry_tensor_info, strides);
    old->size = (uint32_t)osz;
    CHECK_EQ(ferry_file_tensor_info(f, 1, old), 0);
    CHECK(strcmp(old->name, "blk.1.w") == 0);
    CHECK_EQ(old->nbytes, 100);
    CHECK_EQ(old->ndim, 1);
    CHECK_EQ(old->size, osz); /* its own size is kept */
    CHECK(intact(buf + osz, sizeof buf - osz));
    /* the current size fills everything; a newer, larger one gets what we know */
    ferry_tensor_info cur = {.size = sizeof cur};
    CHECK_EQ(ferry_file_tensor_info(f, 1, &cur), 0);
    CHECK(cur.strides == NULL && cur.flags == 0 && cur.offset == old->offset);
    memset(buf, CANARY, sizeof buf);
    old->size = (uint32_t)sizeof buf;
    CHECK_EQ(ferry_file_tensor_info(f, 1, old), 0);
    CHECK_EQ(old->nbytes, 100);
    CHECK(intact(buf + sizeof(ferry_tensor_info), sizeof buf - sizeof(ferry_tensor_info)));
    /* no size: refused, nothing written past the size field */
    memset(buf, CANARY, sizeof buf);
    old->size = 0;
    CHECK_EQ(ferry_file_tensor_info(f, 1, old), FERRY_E_INVAL);
    CHECK(intact(buf + sizeof(uint32_t), sizeof buf - sizeof(uint32_t)));
    ferry_file_close(f);
}

static void test_old_load_structs(void)
{
    ferry_file *f = NULL;
    ferry_device *d = NULL;
    CHECK_EQ(ferry_file_open(ctx, model_path, 0, &f), 0);
    CHECK_EQ(ferry_device_open(ctx, "sim:64MiB", &d), 0);
    if (!f || !d) goto out;
    /* options of a caller that knew only size, route and threads; stats
     * without why */
    ferry_load_opts o = {
        .size = (uint32_t)offsetof(ferry_load_opts, streams), .route = FERRY_ROUTE_RING, .threads = 2};
    unsigned char sb[sizeof(ferry_load_stats) + 32];
    memset(sb, CANARY, sizeof sb);
    ferry_load_stats *st = (ferry_load_stats *)sb;
    const size_t ssz = offsetof(ferry_load_stats, why);
    st->size = (uint32_t)ssz;
    ferry_loaded *l = NULL;
    CHECK_EQ(ferry_load(d, f, &o, &l, st), 0);
    CHECK_EQ(st->route, FERRY_ROUTE_RING);
    CHECK_EQ(st->bytes, 4 * 100);
    CHECK(intact(sb + ssz, sizeof sb - ssz));
    unsigned char back[100];
    CHECK_EQ(ferry_loaded_read(l, 2, back), 0);
    CHECK_EQ(back[0], (unsigned char)(200 * 7u));
    ferry_loaded_free(l);
    /* sizes outside what the library accepts, each named in the message */
    l = NULL;
    ferry_load_opts big = {.size = sizeof big + 8};
    CHECK_EQ(ferry_load(d, f, &big, &l, NULL), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_device_errmsg(d), "opts->size");
    ferry_load_opts none = {.size = 0};
    CHECK_EQ(ferry_load(d, f, &none, &l, NULL), FERRY_E_INVAL);
    ferry_load_stats zero = {.size = 0};
    CHECK_EQ(ferry_load(d, f, NULL, &l, &zero), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_device_errmsg(d), "stats->size");
    CHECK(l == NULL);
out:
    ferry_device_close(d);
    ferry_file_close(f);
}

static void test_old_store_structs(void)
{
    ferry_file *f = NULL;
    ferry_device *d = NULL;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_file_open(ctx, model_path, 0, &f), 0);
    CHECK_EQ(ferry_device_open(ctx, "sim:64MiB", &d), 0);
    if (!f || !d) goto out;
    /* store options of a caller that knew the budgets only */
    ferry_store_opts o = {.size = (uint32_t)offsetof(ferry_store_opts, spill_below),
                          .device_budget = 1 << 20,
                          .host_budget = 1 << 20,
                          .pinned_budget = 1 << 19};
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (!s) goto out;
    ferry_model *m = NULL;
    CHECK_EQ(ferry_store_add(s, "m", &f, 1, 0, &m), 0);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    /* stats of a caller built before the counters at the end were appended */
    unsigned char sb[sizeof(ferry_store_stats) + 32];
    memset(sb, CANARY, sizeof sb);
    ferry_store_stats *st = (ferry_store_stats *)sb;
    const size_t ssz = offsetof(ferry_store_stats, bytes_htod);
    st->size = (uint32_t)ssz;
    CHECK_EQ(ferry_store_get_stats(s, st), 0);
    CHECK_EQ(st->tier_bytes[FERRY_TIER_DEVICE], 400);
    CHECK_EQ(st->device_budget, 1 << 20);
    CHECK(intact(sb + ssz, sizeof sb - ssz));
    /* tensor state without group and dptr */
    unsigned char tb[sizeof(ferry_tensor_state) + 16];
    memset(tb, CANARY, sizeof tb);
    ferry_tensor_state *ts = (ferry_tensor_state *)tb;
    const size_t tsz = offsetof(ferry_tensor_state, group);
    ts->size = (uint32_t)tsz;
    CHECK_EQ(ferry_model_tensor_state(m, 0, ts), 0);
    CHECK_EQ(ts->tier, FERRY_TIER_DEVICE);
    CHECK_EQ(ts->nbytes, 100);
    CHECK(intact(tb + tsz, sizeof tb - tsz));
    /* job stats without the byte counters */
    CHECK_EQ(ferry_store_job_begin(s, "old"), 0);
    unsigned char jb[sizeof(ferry_job_stats) + 16];
    memset(jb, CANARY, sizeof jb);
    ferry_job_stats *js = (ferry_job_stats *)jb;
    const size_t jsz = offsetof(ferry_job_stats, device_bytes);
    js->size = (uint32_t)jsz;
    CHECK_EQ(ferry_store_job_end(s, js), 0);
    CHECK(js->seconds >= 0 && js->rss.peak > 0);
    CHECK(intact(jb + jsz, sizeof jb - jsz));
    CHECK(strcmp(ferry_store_job_name(s), "old") == 0);
    /* sizes the library refuses */
    ferry_store_stats bad = {.size = 2};
    CHECK_EQ(ferry_store_get_stats(s, &bad), FERRY_E_INVAL);
    ferry_store *s2 = NULL;
    ferry_load_opts lo = {.size = sizeof lo + 4};
    ferry_store_opts o2 = {.size = sizeof o2, .load = &lo};
    CHECK_EQ(ferry_store_new(d, &o2, &s2), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "opts->load");
    CHECK(s2 == NULL);
out:
    ferry_store_free(s);
    ferry_device_close(d);
    ferry_file_close(f);
}

/* ---- the library's description of itself ---- */

static void test_abi_tables(void)
{
    static const struct {
        const char *name;
        size_t size;
    } known[] = {{"ferry_allocator", sizeof(ferry_allocator)},
                 {"ferry_ctx_opts", sizeof(ferry_ctx_opts)},
                 {"ferry_tensor_info", sizeof(ferry_tensor_info)},
                 {"ferry_load_opts", sizeof(ferry_load_opts)},
                 {"ferry_load_stats", sizeof(ferry_load_stats)},
                 {"ferry_store_opts", sizeof(ferry_store_opts)},
                 {"ferry_tensor_state", sizeof(ferry_tensor_state)},
                 {"ferry_store_stats", sizeof(ferry_store_stats)},
                 {"ferry_mem_range", sizeof(ferry_mem_range)},
                 {"ferry_job_stats", sizeof(ferry_job_stats)},
                 {"ferry_convert_opts", sizeof(ferry_convert_opts)},
                 {"ferry_plan_opts", sizeof(ferry_plan_opts)},
                 {"ferry_plan", sizeof(ferry_plan)},
                 {"ferry_streamer_opts", sizeof(ferry_streamer_opts)},
                 {"ferry_streamer_stats", sizeof(ferry_streamer_stats)}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        CHECK_EQ(ferry_abi_sizeof(known[i].name), (int64_t)known[i].size);
        /* fields in declaration order, inside the struct, none left out at the end */
        int64_t prev = -1;
        int k = 0;
        for (const char *fn; (fn = ferry_abi_field(known[i].name, k)); k++) {
            int64_t off = ferry_abi_offsetof(known[i].name, fn);
            CHECK(off > prev && off < (int64_t)known[i].size);
            prev = off;
        }
        CHECK(k >= 2);
    }
    /* a few offsets against the compiler's */
    CHECK_EQ(ferry_abi_offsetof("ferry_load_stats", "why"), (int64_t)offsetof(ferry_load_stats, why));
    CHECK_EQ(ferry_abi_offsetof("ferry_store_opts", "load"), (int64_t)offsetof(ferry_store_opts, load));
    CHECK_EQ(ferry_abi_offsetof("ferry_job_stats", "dropped"), (int64_t)offsetof(ferry_job_stats, dropped));
    CHECK_EQ(ferry_abi_offsetof("ferry_plan", "minimum_bytes"), (int64_t)offsetof(ferry_plan, minimum_bytes));
    CHECK_EQ(ferry_abi_offsetof("ferry_streamer_stats", "prefetch_skipped"),
             (int64_t)offsetof(ferry_streamer_stats, prefetch_skipped));
    CHECK_EQ(ferry_abi_enum_count("ferry_stream_copies"), FERRY_STREAM_COPIES_RING + 1);
    CHECK_EQ(ferry_abi_offsetof("ferry_tensor_state", "holds"), (int64_t)offsetof(ferry_tensor_state, holds));
    CHECK_EQ(ferry_abi_offsetof("ferry_store_stats", "pinned_pool_bytes"),
             (int64_t)offsetof(ferry_store_stats, pinned_pool_bytes));
    /* the last field listed is the struct's last member */
    CHECK(ferry_abi_field("ferry_job_stats", 17) &&
          strcmp(ferry_abi_field("ferry_job_stats", 17), "dropped") == 0);
    CHECK(ferry_abi_field("ferry_job_stats", 18) == NULL);
    CHECK_EQ(ferry_abi_sizeof("ferry_nothing"), FERRY_E_NOTFOUND);
    CHECK_EQ(ferry_abi_offsetof("ferry_load_opts", "path"), FERRY_E_NOTFOUND);
    CHECK(ferry_abi_field(NULL, 0) == NULL && ferry_abi_field("ferry_load_opts", -1) == NULL);
    /* enums: every value below the count has a name, the count itself not */
    CHECK_EQ(ferry_abi_enum_count("ferry_dtype"), FERRY_DTYPE_COUNT);
    CHECK_EQ(ferry_abi_enum_count("ferry_route"), FERRY_ROUTE_COUNT);
    CHECK_EQ(ferry_abi_enum_count("ferry_tier"), FERRY_TIER_COUNT);
    for (int r = 0; r < FERRY_ROUTE_COUNT; r++)
        CHECK(strcmp(ferry_route_name((ferry_route)r), "unknown") != 0);
    CHECK(strcmp(ferry_route_name(FERRY_ROUTE_COUNT), "unknown") == 0);
    int nerr = ferry_abi_enum_count("ferry_error");
    CHECK_EQ(nerr, FERRY_E_BASE - FERRY_E_LAST + 1);
    for (int c = FERRY_E_BASE; c >= FERRY_E_LAST; c--) {
        CHECK(ferry_error_name(c) != NULL);
        CHECK(strcmp(ferry_strerror(c), "unknown error") != 0);
    }
    CHECK(strcmp(ferry_error_name(FERRY_E_BUSY), "BUSY") == 0);
    CHECK(strcmp(ferry_strerror(FERRY_E_BUSY), "in use") == 0);
    CHECK(ferry_error_name(FERRY_E_LAST - 1) == NULL && ferry_error_name(-EINVAL) == NULL &&
          ferry_error_name(0) == NULL);
}

/* ---- messages per handle ---- */

static void test_errors_per_handle(void)
{
    ferry_file *f = NULL;
    ferry_device *d = NULL;
    ferry_store *s = NULL;
    CHECK_EQ(ferry_file_open(ctx, model_path, 0, &f), 0);
    CHECK_EQ(ferry_device_open(ctx, "sim:64MiB", &d), 0);
    if (!f || !d) goto out;
    ferry_store_opts o = {.size = sizeof o, .device_budget = 250, .host_budget = 1 << 20};
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (!s) goto out;
    ferry_model *a = NULL, *b = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &f, 1, 0, &a), 0);
    CHECK_EQ(ferry_store_add(s, "b", &f, 1, 0, &b), 0);
    CHECK_EQ(ferry_model_to_device(b, (const int64_t[]){0}, 1), 0);
    CHECK_EQ(ferry_model_hold(b, 0), 0);
    /* a's request cannot fit (the budget holds 2 of its 4 tensors, one is held by b) */
    CHECK_EQ(ferry_model_to_device(a, NULL, 0), FERRY_E_BUDGET);
    CHECK_STR_HAS(ferry_model_errmsg(a), "model 'a'");
    CHECK_STR_HAS(ferry_model_errmsg(a), "can be made");
    CHECK_STR_HAS(ferry_store_errmsg(s), "model 'a'"); /* a model's failure reaches its store */
    CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "model 'a'"); /* and the context */
    CHECK(strcmp(ferry_model_errmsg(b), "") == 0);     /* b never failed */
    /* b's own failure: evicting a held tensor is BUSY, with the tensor quoted */
    CHECK_EQ(ferry_model_evict(b, NULL, 0), FERRY_E_BUSY);
    CHECK_STR_HAS(ferry_model_errmsg(b), "tensor 'blk.0.w' is in use");
    CHECK_STR_HAS(ferry_model_errmsg(a), "can be made"); /* a's message is still a's */
    CHECK_EQ(ferry_model_release(b, 0), 0);
    CHECK_EQ(ferry_model_release(b, 0), FERRY_E_INVAL);
    CHECK_STR_HAS(ferry_model_errmsg(b), "not in use");
    /* a file's own failure */
    unsigned char byte;
    CHECK_EQ(ferry_file_tensor_read(f, 0, 99, &byte, 2), FERRY_E_INVAL);
    CHECK(strlen(ferry_file_errmsg(f)) > 0);
    /* a device's: the sim device refuses more than it has */
    ferry_loaded *l = NULL;
    ferry_device *tiny = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:64", &tiny), 0);
    CHECK(ferry_load(tiny, f, NULL, &l, NULL) < 0);
    CHECK(strlen(ferry_device_errmsg(tiny)) > 0);
    CHECK(strcmp(ferry_device_errmsg(d), "") == 0);
    ferry_device_close(tiny);
    /* NULL handles: "" */
    CHECK(strcmp(ferry_model_errmsg(NULL), "") == 0 && strcmp(ferry_store_errmsg(NULL), "") == 0 &&
          strcmp(ferry_file_errmsg(NULL), "") == 0 && strcmp(ferry_device_errmsg(NULL), "") == 0);
    CHECK(ferry_store_spill_dir(s) == NULL); /* no spill yet */
    CHECK(ferry_store_spill_dir(NULL) == NULL && ferry_store_job_name(NULL) == NULL);
    uint64_t avail = 0;
    char src[128] = "";
    CHECK_EQ(ferry_host_available(&avail, src, sizeof src), 0);
    CHECK(avail > 0 && src[0]);
    CHECK_EQ(ferry_host_available(NULL, NULL, 0), FERRY_E_INVAL);
out:
    ferry_store_free(s);
    ferry_device_close(d);
    ferry_file_close(f);
}

/* `test_abi CASE` runs one of these, `--list` names them (check.h); main
 * writes the checkpoint and makes the ctx they share. */
#define CASES(CASE)                                   \
    CASE(old_tensor_info, test_old_tensor_info())     \
    CASE(old_load_structs, test_old_load_structs())   \
    CASE(old_store_structs, test_old_store_structs()) \
    CASE(abi_tables, test_abi_tables())               \
    CASE(errors_per_handle, test_errors_per_handle())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "abi") < 0) return 1;
    snprintf(model_path, sizeof model_path, "%s/m.safetensors", dir);
    write_st(model_path, 4, 100);
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    unlink(model_path);
    rmdir(dir);
    return check_summary();
}
