/* SPDX-License-Identifier: Apache-2.0 */
/* test_room.c - make-room's candidates come from the models' device indexes
 * (lru.h, kept by devmem.c): the groups it looks at are bounded by what it
 * evicts, not by the store's tensors (counted, not timed), and what it
 * chooses is what the policy chooses over every group of the store, through
 * moves, evictions, holds, groups joined, streamed flags and priorities.
 * Reads the store through store_impl.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "resid/store_impl.h"

#define MiB ((uint64_t)1 << 20)
enum { TB = 4096 };

static char dir[256], spill_dir[300];

/* n tensors "t.K.w" of TB bytes (U8), each its own group (zeros) */
static void write_model(const char *name, int n)
{
    size_t cap = (size_t)n * 100 + 64, h = 0;
    char *hdr = malloc(cap), path[512];
    h += (size_t)snprintf(hdr + h, cap - h, "{");
    for (int k = 0; k < n; k++)
        h += (size_t)snprintf(hdr + h, cap - h,
                              "%s\"t.%d.w\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%" PRIu64
                              ",%" PRIu64 "]}",
                              k ? "," : "", k, TB, (uint64_t)k * TB, (uint64_t)(k + 1) * TB);
    h += (size_t)snprintf(hdr + h, cap - h, "}");
    while (h % 8) hdr[h++] = ' ';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    fflush(f);
    if (ftruncate(fileno(f), (off_t)(8 + h + (uint64_t)n * TB)) != 0) perror("ftruncate");
    fclose(f);
    free(hdr);
}

typedef struct world {
    ferry_device *d;
    ferry_store *s;
    int nm;
    ferry_file *f[8];
    ferry_model *m[8];
} world;

static bool open_world(world *w, ferry_ctx *ctx, int nm, int nt, uint64_t budget)
{
    memset(w, 0, sizeof *w);
    w->nm = nm;
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = budget,
                          .host_budget = 1ull << 30,
                          .pinned_budget = 256 * MiB,
                          .spill_dir = spill_dir};
    if (ferry_device_open(ctx, "sim:512MiB", &w->d) || ferry_store_new(w->d, &o, &w->s)) {
        CHECK(0);
        return false;
    }
    for (int i = 0; i < nm; i++) {
        char name[32], path[512];
        snprintf(name, sizeof name, "m%d.safetensors", nt);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (access(path, F_OK) != 0) write_model(name, nt);
        snprintf(name, sizeof name, "m%d", i);
        if (ferry_file_open(ctx, path, 0, &w->f[i]) ||
            ferry_store_add(w->s, name, &w->f[i], 1, 0, &w->m[i])) {
            CHECK(0);
            return false;
        }
    }
    return true;
}

static void close_world(world *w)
{
    ferry_store_free(w->s);
    for (int i = 0; i < w->nm; i++) ferry_file_close(w->f[i]);
    ferry_device_close(w->d);
}

static int64_t on_device(world *w)
{
    int64_t n = 0;
    for (int i = 0; i < w->nm; i++)
        for (int64_t j = 0; j < w->m[i]->n; j++) n += w->m[i]->t[j].tier == FERRY_TIER_DEVICE;
    return n;
}

/* 8 models of 2000 groups on the device; room for a few groups at a time:
 * make-room looks at no more groups than it evicts (plus those it skips as
 * held, which it must look at), never at the 16000. */
static void test_visits(ferry_ctx *ctx)
{
    world w;
    enum { NM = 8, NT = 2000 };
    if (!open_world(&w, ctx, NM, NT, (uint64_t)NM * NT * 512 + (uint64_t)NM * NT * TB)) goto out;
    for (int i = 0; i < NM; i++) CHECK_EQ(ferry_model_to_device(w.m[i], NULL, 0), 0);
    CHECK_EQ(on_device(&w), NM * NT);
    /* the oldest groups of the first model (the first to leave) are held:
     * looked at and skipped, once per call */
    for (int64_t j = 0; j < 3; j++) CHECK_EQ(ferry_model_hold(w.m[0], j), 0);
    ferry_store *s = w.s;
    uint64_t visits = 0, evicted = 0;
    for (int round = 0; round < 50; round++) {
        int64_t before = on_device(&w);
        pthread_mutex_lock(&s->lock);
        uint64_t v0 = s->room_visits, room = rs_room_now(s);
        int64_t got = rs_make_room_locked(s, room + (uint64_t)(1 + round % 5) * TB, NULL, NULL, NULL);
        uint64_t v = s->room_visits - v0;
        pthread_mutex_unlock(&s->lock);
        CHECK(got >= (int64_t)(1 + round % 5) * TB);
        int64_t gone = before - on_device(&w);
        CHECK_EQ(gone, 1 + round % 5);
        CHECK(v <= (uint64_t)gone + 3); /* what it evicted, and the 3 held groups */
        visits += v;
        evicted += (uint64_t)gone;
    }
    fprintf(stderr, "50 calls on %d groups: %" PRIu64 " evicted, %" PRIu64 " groups looked at\n", NM * NT,
            evicted, visits);
    CHECK(visits <= evicted + 3 * 50);
    /* a streamed pass's pattern: a model asks for its groups again in turn,
     * each move making room by evicting the least recently used */
    pthread_mutex_lock(&s->lock);
    uint64_t v0 = s->room_visits;
    pthread_mutex_unlock(&s->lock);
    CHECK_EQ(ferry_store_set_device_budget(s, s->arena.used), 0);
    int64_t moved = 0;
    for (int64_t j = 0; j < NT && moved < 150; j++) {
        if (w.m[0]->t[j].tier == FERRY_TIER_DEVICE) continue; /* (the 150 that left above) */
        CHECK_EQ(ferry_model_to_device(w.m[0], &j, 1), 0);    /* room: one group of another model */
        moved++;
    }
    CHECK_EQ(moved, 150);
    pthread_mutex_lock(&s->lock);
    uint64_t v = s->room_visits - v0;
    pthread_mutex_unlock(&s->lock);
    fprintf(stderr, "150 moves at a full budget: %" PRIu64 " groups looked at\n", v);
    CHECK(v <= 150 * (1 + 3));
    for (int64_t j = 0; j < 3; j++) CHECK_EQ(ferry_model_release(w.m[0], j), 0);
out:
    close_world(&w);
}

/* ---- the reference: every group of the store, as a full walk sees it ---- */

typedef struct ref {
    int64_t n;
    rs_cand *c;
    int *mi;
    int64_t *g;
} ref;

static void ref_build(ref *r, ferry_store *s, bool spare, ferry_model *pm, const bool *prot)
{
    int64_t nc = 0;
    for (int i = 0; i < s->nmodels; i++) nc += s->models[i]->n;
    r->c = calloc((size_t)nc, sizeof *r->c);
    r->mi = calloc((size_t)nc, sizeof *r->mi);
    r->g = calloc((size_t)nc, sizeof *r->g);
    r->n = 0;
    for (int i = 0; i < s->nmodels; i++) {
        ferry_model *m = s->models[i];
        for (int64_t j = 0; j < m->n; j++) {
            if (m->t[j].group != j) continue;
            rs_cand *cd = &r->c[r->n];
            *cd = (rs_cand){.priority = m->priority,
                            .last_use = m->last_use,
                            .streams = m->t[j].streams,
                            .use = m->t[j].use,
                            .id = r->n};
            for (int64_t q = 0; q < m->n; q++) {
                rtensor *u = &m->t[q];
                if (u->group != j || (u->tier != FERRY_TIER_DEVICE && !u->moving)) continue;
                if (u->tier == FERRY_TIER_DEVICE) cd->bytes += u->nbytes;
                if (u->holds || u->moving || u->evicting || u->busy || u->wanted ||
                    (m == pm && prot && prot[q]))
                    cd->protect = true;
                if (spare && m == pm && !u->streams) cd->protect = true;
            }
            r->mi[r->n] = i;
            r->g[r->n] = j;
            r->n++;
        }
    }
}

static void ref_free(ref *r)
{
    free(r->c);
    free(r->mi);
    free(r->g);
}

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

/* Random moves, evictions, holds, priorities, groups and streamed flags;
 * at each step make-room's choice (the groups that left) is the policy's
 * over a full walk, and its failures are the same. */
static void test_order(ferry_ctx *ctx)
{
    world w;
    enum { NM = 4, NT = 300 };
    if (!open_world(&w, ctx, NM, NT, 8 * MiB)) goto out;
    ferry_store *s = w.s;
    /* groups of several tensors in one model */
    for (int64_t j = 0; j + 3 < NT; j += 7) {
        int64_t gg[3] = {j, j + 1, j + 3};
        CHECK_EQ(ferry_model_group(w.m[2], gg, 3), 0);
    }
    CHECK_EQ(ferry_model_set_priority(w.m[3], 1), 0);
    int held[NM][NT];
    memset(held, 0, sizeof held);
    int64_t *out = calloc((size_t)NM * NT, sizeof *out);
    int fails = 0, checks = 0;
    for (int step = 0; step < 1500; step++) {
        int i = (int)(rnd() % NM);
        ferry_model *m = w.m[i];
        int what = (int)(rnd() % 10);
        if (what < 5) { /* a move of a few tensors (their groups) */
            int64_t t[32];
            int k = 1 + (int)(rnd() % 32);
            for (int q = 0; q < k; q++) t[q] = (int64_t)(rnd() % NT);
            (void)ferry_model_to_device(m, t, k);
        } else if (what == 5) {
            int64_t t = (int64_t)(rnd() % NT);
            (void)ferry_model_evict(m, &t, 1);
        } else if (what == 6) { /* hold or release a tensor on the device */
            int64_t t = (int64_t)(rnd() % NT);
            if (held[i][t]) {
                CHECK_EQ(ferry_model_release(m, t), 0);
                held[i][t] = 0;
            } else if (m->t[t].tier == FERRY_TIER_DEVICE && ferry_model_hold(m, t) == 0) held[i][t] = 1;
        } else if (what == 7) {
            CHECK_EQ(ferry_model_set_priority(m, (int)(rnd() % 3)), 0);
        } else if (what == 8) { /* streamed flags, as a plan sets them */
            pthread_mutex_lock(&s->lock);
            for (int64_t j = 0; j < m->n; j++)
                m->t[j].streams = m->t[m->t[j].group].group % 3 == (int64_t)(step % 3);
            rs_dev_reindex(m);
            pthread_mutex_unlock(&s->lock);
        } else { /* make room, and compare */
            pthread_mutex_lock(&s->lock);
            uint64_t room = rs_room_now(s);
            uint64_t bytes = rnd() % 4 == 0 ? UINT64_MAX : room + (rnd() % (256 << 10));
            uint64_t need = bytes == UINT64_MAX ? UINT64_MAX : bytes - room;
            /* a caller's model whose listed tensors stay (a move's own) */
            ferry_model *pm = rnd() % 2 ? w.m[rnd() % NM] : NULL;
            static bool prot[NT];
            for (int64_t j = 0; j < NT; j++) prot[j] = rnd() % 4 == 0;
            ref r;
            ref_build(&r, s, false, pm, pm ? prot : NULL);
            uint64_t freed = 0;
            int64_t chosen = need ? rs_policy_choose(r.c, r.n, need, out, &freed) : 0;
            /* the groups expected to leave: marked in want */
            static bool want[NM][NT];
            memset(want, 0, sizeof want);
            for (int64_t q = 0; q < chosen; q++) want[r.mi[out[q]]][r.g[out[q]]] = true;
            bool was[NM][NT];
            for (int a = 0; a < NM; a++)
                for (int64_t j = 0; j < NT; j++) was[a][j] = w.m[a]->t[j].tier == FERRY_TIER_DEVICE;
            uint64_t could = 0;
            int64_t got = rs_make_room_locked(s, bytes, pm, pm ? prot : NULL, &could);
            if (chosen < 0) {
                fails++;
                CHECK_EQ(got, FERRY_E_BUDGET);
                CHECK_EQ(could, freed + room);
            } else {
                CHECK(got >= 0);
                for (int a = 0; a < NM; a++)
                    for (int64_t j = 0; j < NT; j++) {
                        bool left = was[a][j] && w.m[a]->t[j].tier != FERRY_TIER_DEVICE;
                        CHECK_EQ(left, want[a][w.m[a]->t[j].group] && was[a][j]);
                    }
                checks++;
            }
            ref_free(&r);
            pthread_mutex_unlock(&s->lock);
        }
    }
    fprintf(stderr, "%d choices compared, %d refusals\n", checks, fails);
    CHECK(checks > 50);
    CHECK(fails > 0);
    for (int i = 0; i < NM; i++)
        for (int64_t j = 0; j < NT; j++)
            if (held[i][j]) CHECK_EQ(ferry_model_release(w.m[i], j), 0);
    free(out);
out:
    close_world(&w);
}

static ferry_ctx *ctx;
#define CASES(CASE)                \
    CASE(visits, test_visits(ctx)) \
    CASE(order, test_order(ctx))
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "room") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
