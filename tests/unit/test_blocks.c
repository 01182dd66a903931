/* SPDX-License-Identifier: Apache-2.0 */
/* test_blocks.c - the segment arena of
 * src/resid/arena.c against what ferry.h promises: make_room's room is real,
 * a budget shrink gives the memory back. White-box: the store's segments
 * are read through store_impl.h to check its accounting too. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "resid/store_impl.h"
#include "xfer/xfer_test.h"

enum { NT = 64, TB = 2 << 20 };
#define MiB ((uint64_t)1 << 20)

static char dir[256], spill_dir[300], path[512];

/* NT tensors "t.K.w" of TB bytes (U8), each its own group */
static void write_model(void)
{
    char *hdr = malloc(1 << 16);
    size_t h = 0;
    h += (size_t)snprintf(hdr + h, 1 << 16, "{");
    for (int k = 0; k < NT; k++)
        h += (size_t)snprintf(hdr + h, (1 << 16) - h,
                              "%s\"t.%d.w\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%" PRIu64
                              ",%" PRIu64 "]}",
                              k ? "," : "", k, TB, (uint64_t)k * TB, (uint64_t)(k + 1) * TB);
    h += (size_t)snprintf(hdr + h, (1 << 16) - h, "}");
    while (h % 8) hdr[h++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    fflush(f);
    if (ftruncate(fileno(f), (off_t)(8 + h + (uint64_t)NT * TB)) != 0) perror("ftruncate");
    fclose(f);
    free(hdr);
}

typedef struct run {
    ferry_device *d;
    ferry_file *f;
    ferry_store *s;
    ferry_model *m;
    int64_t t[NT];
} run;

static bool start(run *r, ferry_ctx *ctx, const char *spec, uint64_t budget)
{
    memset(r, 0, sizeof *r);
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = budget,
                          .host_budget = 1ull << 30,
                          .pinned_budget = 256 * MiB,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2};
    if (ferry_device_open(ctx, spec, &r->d) || ferry_file_open(ctx, path, 0, &r->f) ||
        ferry_store_new(r->d, &o, &r->s) || ferry_store_add(r->s, "m", &r->f, 1, 0, &r->m)) {
        CHECK(0);
        return false;
    }
    for (int k = 0; k < NT; k++) {
        char n[32];
        snprintf(n, sizeof n, "t.%d.w", k);
        r->t[k] = ferry_model_find(r->m, n);
        CHECK(r->t[k] >= 0);
    }
    return true;
}

static void stop(run *r)
{
    ferry_store_free(r->s);
    ferry_file_close(r->f);
    ferry_device_close(r->d);
}

static uint64_t dev_held(run *r)
{
    uint64_t fr = 0, tot = 0;
    CHECK_EQ(ferry_device_mem_info(r->d, &fr, &tot), 0);
    return tot - fr;
}

static uint64_t dev_free(run *r)
{
    uint64_t fr = 0, tot = 0;
    CHECK_EQ(ferry_device_mem_info(r->d, &fr, &tot), 0);
    return fr;
}

/* the store's own books: free bytes in segments == cached; carved == the
 * device tensors' dsize; arena.used == their nbytes */
static void check_books(run *r)
{
    ferry_store *s = r->s;
    uint64_t freeb = 0, carved = 0, dsz = 0, nb = 0, segbytes = 0;
    for (int i = 0; i < s->arena.nsegs; i++) {
        freeb += s->arena.segs[i].size - s->arena.segs[i].used;
        carved += s->arena.segs[i].used;
        segbytes += s->arena.segs[i].size;
    }
    for (int64_t i = 0; i < r->m->n; i++)
        if (r->m->t[i].tier == FERRY_TIER_DEVICE) dsz += r->m->t[i].dsize, nb += r->m->t[i].nbytes;
    CHECK_EQ(freeb, s->arena.cached);
    CHECK_EQ(carved, dsz);
    CHECK_EQ(nb, s->arena.used);
    CHECK_EQ(segbytes, dev_held(r));
}

/* ferry.h: after make_room "the room is real". The room once counted s->arena.cached,
 * the free pieces of segments that still hold tensors, which cannot go back:
 * make_room returned 0 with 128 of the 160 MiB asked for free on the device. */
static void test_make_room_real(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:256MiB", 256 * MiB)) return; /* 8 MiB segments: 4 tensors each */
    CHECK_EQ(ferry_model_to_device(r.m, r.t, NT), 0);     /* 128 MiB in 16 segments */
    check_books(&r);
    int64_t odd[NT / 2];
    for (int k = 0; k < NT / 2; k++) odd[k] = r.t[2 * k + 1];
    CHECK_EQ(ferry_model_evict(r.m, odd, NT / 2), 0); /* half of every segment free */
    check_books(&r);
    CHECK_EQ(dev_free(&r), 128 * MiB);
    /* the caller (PyTorch's OOM retry) wants 160 MiB of the device */
    int64_t rc = ferry_store_make_room(r.s, 160 * MiB, NULL);
    CHECK(rc >= 0);
    fprintf(stderr,
            "make_room(160 MiB) = %" PRId64 "; device free now %" PRIu64 " MiB (cached %" PRIu64 " MiB)\n",
            rc, dev_free(&r) / MiB, r.s->arena.cached / MiB);
    CHECK(dev_free(&r) >= 160 * MiB);
    check_books(&r);
    stop(&r);
}

/* ferry_store_set_device_budget: the store holds at most 1/16 past the new
 * budget after it (or nothing more can go). The tensors left after the shrink sit one in each segment: none
 * was whole free, so nothing went back (the store held 128 MiB for a 16 MiB
 * budget) until the shrink evicted on. */
static void test_shrink_gives_back(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:1GiB", 512 * MiB)) return; /* 16 MiB segments: 8 tensors each */
    CHECK_EQ(ferry_model_to_device(r.m, r.t, NT), 0);   /* 128 MiB in 8 segments */
    for (int k = 0; k < NT; k += 8) CHECK_EQ(ferry_model_to_device(r.m, &r.t[k], 1), 0); /* used last */
    check_books(&r);
    uint64_t budget = 8 * TB; /* room for the 8 used last */
    CHECK_EQ(ferry_store_set_device_budget(r.s, budget), 0);
    ferry_store_stats st = {.size = sizeof st};
    CHECK_EQ(ferry_store_get_stats(r.s, &st), 0);
    fprintf(stderr,
            "budget %" PRIu64 " MiB: tensors %" PRIu64 " MiB, store holds %" PRIu64 " MiB of the device\n",
            budget / MiB, st.tier_bytes[FERRY_TIER_DEVICE] / MiB, dev_held(&r) / MiB);
    CHECK(st.tier_bytes[FERRY_TIER_DEVICE] <= budget);
    CHECK(dev_held(&r) <= budget + budget / 16);
    check_books(&r);
    stop(&r);
}

/* an allocation failing in the middle of a move: the books stay right */
static void test_fault_books(ferry_ctx *ctx)
{
    run r;
    if (!start(&r, ctx, "sim:256MiB", 256 * MiB)) return; /* 8 MiB segments */
    fy_gpu *g = fy_device_gpu(r.d);
    CHECK(fy_gpu_sim_fault(g, FY_OP_MEM_ALLOC, 3) >= 0);
    CHECK(ferry_model_to_device(r.m, r.t, 16) < 0);
    CHECK_EQ(fy_gpu_sim_fault(g, FY_OP_MEM_ALLOC, 0), 0);
    check_books(&r);
    CHECK_EQ(ferry_model_to_device(r.m, r.t, NT), 0);
    check_books(&r);
    CHECK_EQ(ferry_store_make_room(r.s, UINT64_MAX, NULL) >= 0, 1);
    check_books(&r);
    CHECK_EQ(dev_held(&r), 0);
    stop(&r);
}

static ferry_ctx *ctx;
#define CASES(CASE)                                      \
    CASE(make_room_real, test_make_room_real(ctx))       \
    CASE(shrink_gives_back, test_shrink_gives_back(ctx)) \
    CASE(fault_books, test_fault_books(ctx))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "blocks") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    write_model();
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
