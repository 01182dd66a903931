/* SPDX-License-Identifier: Apache-2.0 */
/* test_soak.c - a seeded, bounded soak of the residency store on sim: many
 * jobs over several models (use, modify, evict, hold, queued moves, make room,
 * remove and add again, device budget changes), in rounds that alternate
 *   - a fault round, one thread: before each job one fault point is armed in
 *     turn (each counted system call of the fault table with EIO, then
 *     ENOSPC; the sim device's allocations, pinned allocations,
 *     registrations, copies and events), nth = 1, 2, 3 ...; the job may fail,
 *     must fail cleanly; and
 *   - a concurrent round: one thread per model (its adder) running jobs at
 *     once, with budget changes and make_room from all of them.
 * After every job (fault rounds) or round (concurrent ones) every tensor of
 * every model must read back the bytes it should (its file's, XORed with what
 * the jobs wrote), each tensor is in exactly one tier, the pinned pool stays
 * within its budget, and the spill file stays within the bytes of the models. At
 * the end, with the store freed: no device, pinned or registered byte and no
 * file descriptor left.
 *
 * The user's own reads and writes of a tensor (ferry_model_read/_write: the
 * "kernel") run with faults disarmed: a write that fails half-way leaves the
 * device bytes undefined by contract, which a shadow could not follow.
 *
 *     test_soak short                    (CI: a few hundred jobs per kind)
 *     FERRY_SOAK_JOBS=N FERRY_SOAK_SEED=S test_soak long
 * Prints "soak: seed S: J jobs, F faults armed (H hit), B bytes verified, M mismatches". */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "io/io.h"
#include "xfer/xfer_test.h"

enum { NMODELS = 3, MAXT = 64 };

static char dir[256], spill_dir[300];
static ferry_ctx *ctx;

/* ---- checkpoints: model k has nblk[k] modules "blk.J" (a weight of varying size and a 16-byte bias) ---- */

static const int nblk[NMODELS] = {8, 6, 10};

static uint64_t wsize(int k, int j)
{
    return 20000u + (uint64_t)((k * 7 + j * 13) % 9) * 11111u;
}
static uint8_t file_byte(int k, int t, uint64_t i)
{
    return (uint8_t)((i * 2654435761u >> 7) + (uint64_t)t * 31u + (uint64_t)k * 101u);
}

static void write_model(int k)
{
    char hdr[16384], path[512];
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int j = 0; j < nblk[k]; j++) {
        uint64_t w = wsize(k, j);
        h += (size_t)snprintf(
            hdr + h, sizeof hdr - h,
            "%s\"blk.%d.w\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64
            "]},\"blk.%d.b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
            j ? "," : "", j, w, off, off + w, j, off + w, off + w + 16);
        off += w + 16;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    snprintf(path, sizeof path, "%s/m%d.safetensors", dir, k);
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int t = 0; t < 2 * nblk[k]; t++) /* the file's tensor order: w, b, w, b ... */
        for (uint64_t i = 0, n = t % 2 ? 16 : wsize(k, t / 2); i < n; i++) fputc(file_byte(k, t, i), f);
    fclose(f);
}

/* ---- the models and their shadows ---- */

typedef struct model {
    int k;
    ferry_file *f;
    ferry_model *m;
    int64_t n;                /* tensors */
    int64_t file_index[MAXT]; /* model tensor i -> the file's order (w/b interleaved) */
    uint64_t nbytes[MAXT];
    uint8_t key[MAXT]; /* expected bytes: the file's XOR key (0: as in the file) */
    uint32_t rng;
    long jobs, failed;
    int last; /* the last job's kind */
    uint64_t verified;
} model;

typedef struct soak {
    ferry_device *d;
    fy_gpu *g;
    ferry_store *s;
    model mo[NMODELS];
    uint64_t total_bytes;
    uint64_t pinned_budget;
    long faults_armed, faults_hit;
} soak;

static uint32_t rnd(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static int add_model(soak *z, model *mo)
{
    int rc = ferry_store_add(z->s, mo->k == 0 ? "m0" : mo->k == 1 ? "m1" : "m2", &mo->f, 1, mo->k, &mo->m);
    if (rc < 0) {
        mo->m = NULL;
        return rc;
    }
    mo->n = ferry_model_tensor_count(mo->m);
    for (int64_t i = 0; i < mo->n && i < MAXT; i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(mo->m, i, &st);
        const char *nm = st.name; /* "blk.J.w" / "blk.J.b" */
        int j = atoi(nm + 4);
        mo->file_index[i] = 2 * j + (nm[strlen(nm) - 1] == 'b');
        mo->nbytes[i] = st.nbytes;
        mo->key[i] = 0;
    }
    return 0;
}

/* Every tensor of mo reads back as expected; 0 or the number of mismatches. */
static long verify_model(model *mo)
{
    if (!mo->m) return 0;
    long bad = 0;
    uint8_t *buf = malloc(1 << 20);
    for (int64_t i = 0; i < mo->n; i++) {
        int rc = ferry_model_read(mo->m, i, buf);
        uint64_t off = 0;
        if (rc == 0)
            for (; off < mo->nbytes[i]; off++)
                if (buf[off] != (uint8_t)(file_byte(mo->k, (int)mo->file_index[i], off) ^ mo->key[i])) break;
        if (rc < 0 || off < mo->nbytes[i]) {
            if (bad < 3)
                fprintf(stderr, "soak: m%d tensor %" PRId64 " %s (key %02x)%s%s\n", mo->k, i,
                        rc < 0 ? "unreadable" : "differs", mo->key[i], rc < 0 ? ": " : "",
                        rc < 0 ? ferry_model_errmsg(mo->m) : "");
            bad++;
        }
        mo->verified += mo->nbytes[i];
    }
    free(buf);
    return bad;
}

/* The store's invariants: each tensor in one tier, budgets kept, spill file bounded. */
static int check_store(soak *z)
{
    ferry_store_stats st = {.size = sizeof st};
    if (ferry_store_get_stats(z->s, &st) < 0) return 1;
    uint64_t in_tiers = 0, models = 0;
    for (int t = 0; t < FERRY_TIER_COUNT; t++) in_tiers += st.tier_bytes[t];
    for (int k = 0; k < NMODELS; k++)
        if (z->mo[k].m)
            for (int64_t i = 0; i < z->mo[k].n; i++) models += z->mo[k].nbytes[i];
    int bad = 0;
    if (in_tiers != models)
        fprintf(stderr, "soak: tiers hold %" PRIu64 " bytes, models %" PRIu64 "\n", in_tiers, models), bad++;
    if (st.pinned_pool_bytes > z->pinned_budget)
        fprintf(stderr, "soak: pinned pool %" PRIu64 " over budget\n", st.pinned_pool_bytes), bad++;
    if (st.spill_file_bytes > z->total_bytes + (16u << 20))
        fprintf(stderr, "soak: spill file %" PRIu64 " bytes for %" PRIu64 " of models\n", st.spill_file_bytes,
                z->total_bytes),
            bad++;
    return bad;
}

/* ---- jobs ---- */

static void pick(model *mo, int64_t *ts, int64_t *n)
{
    int64_t a = rnd(&mo->rng) % mo->n, len = 1 + rnd(&mo->rng) % (mo->n < 8 ? mo->n : 8);
    *n = 0;
    for (int64_t i = a; i < mo->n && *n < len; i++) ts[(*n)++] = i;
}

/* The user's kernel: XOR tensor t on the device with x (faults disarmed by the caller). */
static int kernel_write(model *mo, int64_t t, uint8_t x)
{
    uint8_t *b = malloc(mo->nbytes[t] ? mo->nbytes[t] : 1);
    int rc = ferry_model_read(mo->m, t, b);
    for (uint64_t j = 0; rc == 0 && j < mo->nbytes[t]; j++) b[j] ^= x;
    if (rc == 0) rc = ferry_model_write(mo->m, t, b);
    free(b);
    if (rc == 0) mo->key[t] ^= x;
    return rc;
}

typedef void (*disarm_fn)(soak *);

/* One job on mo. disarm (may be NULL) is called before the kernel's own read
 * and write. Returns 0 or the job's error (a failure must leave every byte). */
static int job(soak *z, model *mo, disarm_fn disarm)
{
    int64_t ts[8], n;
    int rc = 0;
    if (!mo->m) { /* removed earlier: add it back */
        return add_model(z, mo);
    }
    switch ((mo->last = (int)(rnd(&mo->rng) % 10))) {
    case 0: /* use all */ rc = ferry_model_to_device(mo->m, NULL, 0); break;
    case 1: /* use some */
        pick(mo, ts, &n);
        rc = ferry_model_to_device(mo->m, ts, n);
        break;
    case 2: { /* a queued move, waited for */
        ferry_op *op = NULL;
        pick(mo, ts, &n);
        rc = ferry_model_to_device_async(mo->m, ts, n, &op);
        if (rc == 0) rc = ferry_op_wait(op);
        break;
    }
    case 3:
    case 4: { /* modify: bring one tensor to the device, change it there */
        int64_t t = rnd(&mo->rng) % mo->n;
        rc = ferry_model_to_device(mo->m, &t, 1);
        if (rc == 0) {
            rc = ferry_model_hold(mo->m, t);
            if (rc == 0) {
                if (disarm) disarm(z);
                uint8_t x = (uint8_t)(1 + rnd(&mo->rng) % 255);
                rc = kernel_write(mo, t, x);
                int r2 = ferry_model_release(mo->m, t);
                if (rc == 0) rc = r2;
            }
        }
        break;
    }
    case 5: /* evict some */
        pick(mo, ts, &n);
        rc = ferry_model_evict(mo->m, ts, n);
        break;
    case 6: /* evict all */ rc = ferry_model_evict(mo->m, NULL, 0); break;
    case 7: { /* the device budget changes (another model, activations) */
        uint64_t b = z->total_bytes / 4 + rnd(&mo->rng) % (z->total_bytes / 2);
        rc = ferry_store_set_device_budget(z->s, b);
        break;
    }
    case 8: { /* make room for the caller */
        uint64_t could = 0;
        int64_t r = ferry_store_make_room(z->s, rnd(&mo->rng) % (z->total_bytes / 3), &could);
        rc = r < 0 ? (int)r : 0;
        break;
    }
    case 9: /* remove (its dirty bytes go with it) and add again */
        rc = ferry_store_remove(mo->m);
        if (rc == 0) {
            mo->m = NULL;
            rc = add_model(z, mo);
        }
        break;
    }
    mo->jobs++;
    if (rc < 0) mo->failed++;
    return rc;
}

/* ---- fault points, in turn ---- */

typedef struct fault_point {
    const char *what;
    int sys_err;  /* a counted system call failing with -sys_err, or 0 */
    fy_gpu_op op; /* a sim device call, when sys_err is 0 */
} fault_point;

static const fault_point points[] = {
    {"system call, EIO", EIO, FY_OP_ANY},
    {"system call, ENOSPC", ENOSPC, FY_OP_ANY},
    {"system call, ENOMEM", ENOMEM, FY_OP_ANY},
    {"device allocation", 0, FY_OP_MEM_ALLOC},
    {"pinned allocation", 0, FY_OP_HOST_ALLOC},
    {"registration", 0, FY_OP_HOST_REGISTER},
    {"copy", 0, FY_OP_COPY},
    {"event", 0, FY_OP_EVENT},
};
enum { NPOINTS = sizeof points / sizeof points[0] };

static void disarm_all(soak *z)
{
    fy_fault_arm(0, 0);
    for (int o = FY_OP_MEM_ALLOC; o < FY_OP_COUNT; o++) fy_gpu_sim_fault(z->g, (fy_gpu_op)o, 0);
}

static void arm(soak *z, const fault_point *p, long nth)
{
    if (p->sys_err) fy_fault_arm(nth, p->sys_err);
    else fy_gpu_sim_fault(z->g, p->op, nth);
    z->faults_armed++;
}

/* Did the armed fault fire? (the sim's: its counter is gone when it fired) */
static bool fired(soak *z, const fault_point *p)
{
    if (p->sys_err) return fy_fault_fired();
    /* re-arming with 0 returns how many calls were still to go: > 0 means not hit */
    return fy_gpu_sim_fault(z->g, p->op, 0) == 0;
}

static long fault_round(soak *z, long jobs, long *cursor)
{
    long bad = 0;
    model *mo = &z->mo[0];
    for (long j = 0; j < jobs; j++) {
        const fault_point *p = &points[(*cursor / 6) % NPOINTS];
        long nth = 1 + *cursor % 6; /* the 1st..6th call of that kind in the job */
        (*cursor)++;
        mo = &z->mo[rnd(&z->mo[0].rng) % NMODELS];
        arm(z, p, nth);
        int rc = job(z, mo, disarm_all);
        bool hit = fired(z, p);
        z->faults_hit += hit;
        disarm_all(z);
        /* what a failed job left: the bytes all there, the store consistent */
        long b = check_store(z);
        for (int k = 0; k < NMODELS; k++) b += verify_model(&z->mo[k]);
        if (b && !bad)
            fprintf(stderr, "soak: first mismatch after job %ld (kind %d on m%d, %s, call %ld%s): rc %d %s\n",
                    j, mo->last, mo->k, p->what, nth, hit ? ", hit" : "", rc,
                    rc < 0 && mo->m ? ferry_model_errmsg(mo->m) : "");
        bad += b;
    }
    return bad;
}

typedef struct worker {
    soak *z;
    model *mo;
    long jobs;
} worker;

static void *work(void *a)
{
    worker *w = a;
    for (long j = 0; j < w->jobs; j++) (void)job(w->z, w->mo, NULL);
    return NULL;
}

static long concurrent_round(soak *z, long jobs)
{
    pthread_t th[NMODELS];
    worker w[NMODELS];
    for (int k = 0; k < NMODELS; k++) {
        w[k] = (worker){z, &z->mo[k], jobs / NMODELS};
        pthread_create(&th[k], NULL, work, &w[k]);
    }
    for (int k = 0; k < NMODELS; k++) pthread_join(th[k], NULL);
    long bad = check_store(z);
    for (int k = 0; k < NMODELS; k++) bad += verify_model(&z->mo[k]);
    if (bad) fprintf(stderr, "soak: mismatch after a concurrent round\n");
    return bad;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void soak_run(long jobs, uint32_t seed)
{
    int fds0 = count_fds();
    soak z;
    memset(&z, 0, sizeof z);
    CHECK_EQ(ferry_device_open(ctx, "sim:64MiB", &z.d), 0);
    if (!z.d) return;
    z.g = fy_device_gpu(z.d);
    for (int k = 0; k < NMODELS; k++) {
        char p[512];
        snprintf(p, sizeof p, "%s/m%d.safetensors", dir, k);
        z.mo[k].k = k;
        z.mo[k].rng = seed * 2654435761u + (uint32_t)k * 40503u + 1u;
        CHECK_EQ(ferry_file_open(ctx, p, 0, &z.mo[k].f), 0);
        z.total_bytes += ferry_file_total_bytes(z.mo[k].f);
    }
    /* the device holds about half of the models; dirty tensors overflow the
     * pinned pool and host budget into the spill file */
    z.pinned_budget = z.total_bytes / 8;
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = z.total_bytes / 2,
                          .host_budget = z.total_bytes / 4,
                          .pinned_budget = z.pinned_budget,
                          .spill_dir = spill_dir,
                          .spill_below = 1,
                          .spill_above = 2};
    static const ferry_load_opts lo = {.size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
    o.load = &lo;
    CHECK_EQ(ferry_store_new(z.d, &o, &z.s), 0);
    for (int k = 0; k < NMODELS && z.s; k++) CHECK_EQ(add_model(&z, &z.mo[k]), 0);
    /* the device's own pinned ring (made by the first load, kept until the
     * device closes) is the only pinned memory allowed to outlive the store */
    uint64_t ring = 0;
    if (z.s) {
        int64_t t0 = 0;
        CHECK_EQ(ferry_model_to_device(z.mo[0].m, &t0, 1), 0);
        CHECK_EQ(ferry_model_evict(z.mo[0].m, &t0, 1), 0);
        CHECK_EQ(fy_gpu_sim_usage(z.g, NULL, &ring, NULL), 0);
    }
    long bad = 0, cursor = 0, done = 0;
    while (z.s && done < jobs) {
        long n = jobs - done < 96 ? jobs - done : 96;
        bad += fault_round(&z, n / 2, &cursor);
        bad += concurrent_round(&z, n - n / 2);
        done += n;
    }
    long total_jobs = 0, failed = 0;
    uint64_t verified = 0;
    for (int k = 0; k < NMODELS; k++)
        total_jobs += z.mo[k].jobs, failed += z.mo[k].failed, verified += z.mo[k].verified;
    ferry_store_stats st = {.size = sizeof st};
    if (z.s) ferry_store_get_stats(z.s, &st);
    printf("soak: seed %u: %ld jobs (%ld failed cleanly), %ld faults armed (%ld hit, over %d fault points), "
           "%" PRIu64 " bytes verified, %ld mismatches; %" PRIu64 " evictions (%" PRIu64
           " clean drops), %" PRIu64 " bytes spilled, %" PRIu64 " moved to the device\n",
           seed, total_jobs, failed, z.faults_armed, z.faults_hit, NPOINTS, verified, bad, st.evicted,
           st.dropped, st.bytes_written, st.bytes_htod);
    CHECK_EQ(bad, 0);
    CHECK(z.faults_hit > 0);
    CHECK(total_jobs >= jobs / 2);
    ferry_store_free(z.s);
    uint64_t dev = 1, pin = 1, reg = 1;
    CHECK_EQ(fy_gpu_sim_usage(z.g, &dev, &pin, &reg), 0);
    CHECK_EQ(dev, 0);
    CHECK_EQ(pin, ring);
    CHECK_EQ(reg, 0);
    for (int k = 0; k < NMODELS; k++) ferry_file_close(z.mo[k].f);
    ferry_device_close(z.d);
    CHECK_EQ(count_fds(), fds0);
    DIR *sd = opendir(spill_dir); /* the spill file is unnamed (O_TMPFILE) or unlinked: nothing left */
    int left = 0;
    for (struct dirent *e; sd && (e = readdir(sd));) left += e->d_name[0] != '.';
    if (sd) closedir(sd);
    CHECK_EQ(left, 0);
}

/* A read failing in a queued move (the mover thread's reads): the op fails
 * and no tensor holds wrong bytes, for each counted call in turn. */
static void test_queued_read_fault(void)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:64MiB", &d), 0);
    model mo = {.k = 2, .rng = 5};
    char p[512];
    snprintf(p, sizeof p, "%s/m2.safetensors", dir);
    CHECK_EQ(ferry_file_open(ctx, p, 0, &mo.f), 0);
    if (!d || !mo.f) return;
    uint64_t total = ferry_file_total_bytes(mo.f);
    for (long nth = 1; nth < 40; nth++) {
        ferry_store_opts o = {.size = sizeof o,
                              .device_budget = total * 2,
                              .host_budget = total,
                              .pinned_budget = total / 2,
                              .spill_dir = spill_dir,
                              .spill_below = 1,
                              .spill_above = 2};
        static const ferry_load_opts lo = {
            .size = sizeof lo, .ring_buffers = 4, .ring_buffer_bytes = 64 << 10};
        o.load = &lo;
        soak z = {.d = d};
        CHECK_EQ(ferry_store_new(d, &o, &z.s), 0);
        CHECK_EQ(add_model(&z, &mo), 0);
        int64_t ts[4] = {4, 5, 6, 7};
        ferry_op *op = NULL;
        fy_fault_arm(nth, EIO);
        int rc = ferry_model_to_device_async(mo.m, ts, 4, &op);
        if (rc == 0) rc = ferry_op_wait(op);
        bool hit = fy_fault_fired();
        fy_fault_arm(0, 0);
        long bad = verify_model(&mo);
        if (bad)
            fprintf(stderr, "queued_read_fault: call %ld%s: rc %d, %ld tensors wrong\n", nth,
                    hit ? " (hit)" : "", rc, bad);
        CHECK_EQ(bad, 0);
        if (hit) CHECK(rc < 0);
        ferry_store_free(z.s);
        if (!hit) break;
    }
    ferry_file_close(mo.f);
    ferry_device_close(d);
}

static void test_short(void)
{
    soak_run(600, 1);
}

static void test_long(void)
{
    const char *j = getenv("FERRY_SOAK_JOBS"), *s = getenv("FERRY_SOAK_SEED");
    if (!j) {
        check_skip("the long soak runs when FERRY_SOAK_JOBS is set (scripts/soak.sh)");
        return;
    }
    soak_run(atol(j), s ? (uint32_t)strtoul(s, NULL, 0) : 7);
}

#define CASES(CASE)                                   \
    CASE(queued_read_fault, test_queued_read_fault()) \
    CASE(short, test_short())                         \
    CASE(long, test_long())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    if (check_tmpdir(dir, sizeof dir, "soak") < 0) return 1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    if (mkdir(spill_dir, 0700) != 0) return 1;
    for (int k = 0; k < NMODELS; k++) write_model(k);
    CHECK_EQ(ferry_ctx_new(NULL, &ctx), 0);
    if (ctx) check_run();
    ferry_ctx_free(ctx);
    check_rmtree(dir);
    return check_summary();
}
