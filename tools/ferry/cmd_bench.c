/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_bench.c - `ferry bench`: the raw limits and every transfer path, each
 * figure as a ratio of its limit, in one run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_bench = {"bench", "measure the disk and copy limits and every load route against them",
                           "usage: ferry bench [--device DEV] [--cold] [--json] PATH\n"
                           "\n"
                           "In one run: the raw limits (an O_DIRECT read of the checkpoint with 8 threads,\n"
                           "and pinned host->device and device->host copies), then a load through each\n"
                           "route (ring, direct, register; register again once the file is registered),\n"
                           "each as GB/s and as a ratio of its limit: hot loads against the pinned copy\n"
                           "rate, cold loads against the O_DIRECT read rate. A limit is itself measured\n"
                           "once, so a load can beat it a little (a ratio above 1: the table says why).\n"
                           "Below 64 MiB a load is mostly its setup: a smaller file gets times, no rates.\n"
                           "On a GPU it also probes GPUDirect Storage (cuFile) and says whether it could\n"
                           "read the file, and why not (a probe: ferry loads through no cuFile route).\n"
                           "\n"
                           "options:\n"
                           "  --device DEV  cuda:N (default cuda:0), sim:SIZE or cpu. Without a GPU, bench\n"
                           "                says so and measures the disk and a simulated device instead.\n"
                           "                cpu has one route, ring (pread into host memory), measured\n"
                           "                against a host memory copy.\n"
                           "  --cold        also run each route cold (the file dropped from the page cache\n"
                           "                with POSIX_FADV_DONTNEED before each run)\n"
                           "  --json        print one JSON object\n"
                           "  -h, --help    show this help\n",
                           run};

/* Below this a load's time is mostly its setup (threads, buffers, the first
 * copy): rates of smaller files say nothing about the routes. */
#define RATE_MIN_BYTES (64ull << 20)

typedef struct rd_job {
    const char *path;
    uint64_t size;
    atomic_ullong next;
    atomic_int rc;
} rd_job;

#define RD_CHUNK (16u << 20)

static void *rd_worker(void *arg)
{
    rd_job *j = arg;
    int fd = open(j->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    void *buf = NULL;
    if (fd < 0 || posix_memalign(&buf, 4096, RD_CHUNK) != 0) {
        atomic_store(&j->rc, fd < 0 ? -errno : -ENOMEM);
        if (fd >= 0) close(fd);
        return NULL;
    }
    for (;;) {
        uint64_t off = atomic_fetch_add(&j->next, RD_CHUNK);
        if (off >= j->size) break;
        if (pread(fd, buf, RD_CHUNK, (off_t)off) < 0) {
            atomic_store(&j->rc, -errno);
            break;
        }
    }
    free(buf);
    close(fd);
    return NULL;
}

/* O_DIRECT read of one file, 8 threads of 16 MiB reads: adds its bytes and
 * seconds to *bytes and *secs; returns 0 or -errno. */
static int direct_read(const char *path, uint64_t *bytes, double *secs)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -errno;
    off_t size = lseek(fd, 0, SEEK_END);
    close(fd);
    rd_job j = {.path = path, .size = (uint64_t)size};
    atomic_init(&j.next, 0);
    atomic_init(&j.rc, 0);
    pthread_t th[8];
    double t0 = cli_now();
    int n = 0;
    for (; n < 8; n++)
        if (pthread_create(&th[n], NULL, rd_worker, &j) != 0) break;
    if (n == 0) rd_worker(&j);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    *secs += cli_now() - t0;
    *bytes += (uint64_t)size;
    return atomic_load(&j.rc);
}

static void drop_cache(ferry_file *f)
{
    for (int s = 0; s < ferry_file_shard_count(f); s++) {
        int fd = open(ferry_file_shard_path(f, s), O_RDONLY);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

typedef struct row {
    char name[48];
    const char *cache;
    double gbps, limit, seconds;
    const char *limit_name;
    char note[320];
    bool ok;
} row;

/* A new row of the table, measured against limit (named limit_name). */
static row *row_add(row *rows, int *nr, const char *name, const char *cache, double limit,
                    const char *limit_name)
{
    row *r = &rows[(*nr)++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->cache = cache;
    r->limit = limit;
    r->limit_name = limit_name;
    return r;
}

/* A load's outcome into r: its rate, or the context's message. */
static int row_result(row *r, ferry_ctx *ctx, int rc, const ferry_load_stats *st)
{
    r->ok = rc == 0;
    if (rc < 0) {
        snprintf(r->note, sizeof r->note, "%s", ferry_ctx_errmsg(ctx));
        return rc;
    }
    r->seconds = st->seconds;
    r->gbps = st->seconds > 0 ? (double)st->bytes / st->seconds / 1e9 : 0;
    return 0;
}

static int load_once(ferry_ctx *ctx, ferry_device *dev, ferry_file *f, ferry_route p, row *r)
{
    ferry_load_opts o = {.size = sizeof o, .route = p};
    ferry_loaded *l = NULL;
    ferry_load_stats st = {.size = sizeof st};
    int rc = ferry_load(dev, f, &o, &l, &st);
    ferry_loaded_free(l);
    return row_result(r, ctx, rc, &st);
}

static int run(int argc, char **argv)
{
    const char *path = NULL, *dev_spec = NULL;
    bool json = false, cold = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) return cli_help(&cmd_bench);
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (strcmp(argv[i], "--cold") == 0) cold = true;
        else if (strcmp(argv[i], "--device") == 0) {
            if (i + 1 >= argc) return cli_usage_error(&cmd_bench, "--device needs a value");
            dev_spec = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error(&cmd_bench, "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(&cmd_bench, "one PATH only");
    }
    if (!path) return cli_usage_error(&cmd_bench, "missing PATH");
    ferry_ctx *ctx;
    ferry_file *f;
    int ex = cli_open(path, 0, &ctx, &f);
    if (ex) return ex;
    ferry_device *dev = NULL;
    char note[512] = "";
    int rc = ferry_device_open(ctx, dev_spec ? dev_spec : "cuda:0", &dev);
    if (rc < 0 && !dev_spec) {
        /* no GPU: say so, and bench a simulated device of the file's size */
        char spec[64];
        snprintf(note, sizeof note, "no GPU (%s): benching a sim device instead", ferry_ctx_errmsg(ctx));
        snprintf(spec, sizeof spec, "sim:%" PRIu64,
                 (uint64_t)(ferry_file_total_bytes(f) + (512ull << 20) + (1ull << 30)));
        rc = ferry_device_open(ctx, spec, &dev);
        if (!json) fprintf(stderr, "ferry: %s\n", note);
    }
    if (rc < 0) {
        /* a spec that names no device ("gpu", "sim:banana") is a usage error */
        ex = rc == FERRY_E_INVAL && dev_spec
                 ? cli_usage_error(&cmd_bench, "--device: %s", ferry_ctx_errmsg(ctx))
                 : cli_fail_ctx(ctx, rc);
        goto out;
    }
    int err = 0;
    double disk = 0, rsecs = 0;
    uint64_t rbytes = 0;
    sync(); /* a checkpoint written just before must not be flushing while we measure the disk */
    for (int s = 0; s < ferry_file_shard_count(f) && !err; s++)
        err = direct_read(ferry_file_shard_path(f, s), &rbytes, &rsecs);
    if (!err && rsecs > 0) disk = (double)rbytes / rsecs / 1e9;
    if (err)
        snprintf(note + strlen(note), sizeof note - strlen(note), "%sO_DIRECT read failed: %s",
                 *note ? "; " : "", ferry_strerror(err));
    double h2d = 0, d2h = 0;
    if ((rc = ferry_device_copy_rate(dev, 4ull << 30, &h2d, &d2h)) < 0) {
        ex = cli_fail_ctx(ctx, rc);
        goto out;
    }
    row rows[16];
    int nr = 0;
    /* the cpu device reads straight into host memory: there is no host->device
     * link, and only the ring route (ferry_load refuses it direct and register) */
    bool cpu = dev_spec && strcmp(dev_spec, "cpu") == 0;
    const char *copy_name = cpu ? "memory copy" : "pinned copy";
    bool small = ferry_file_total_bytes(f) < RATE_MIN_BYTES;
    static const ferry_route paths[] = {FERRY_ROUTE_RING, FERRY_ROUTE_DIRECT, FERRY_ROUTE_REGISTER};
    size_t npaths = cpu ? 1 : 3;
    for (int c = cold ? 0 : 1; c < 2; c++) {
        for (size_t k = 0; k < npaths; k++) {
            row *r = row_add(rows, &nr, ferry_route_name(paths[k]), c == 0 ? "cold" : "hot",
                             c == 0 ? disk : h2d, c == 0 ? "O_DIRECT read" : copy_name);
            if (c == 0) drop_cache(f);
            else if (ferry_file_resident(f) < 0.99) {
                row warm = {0};
                load_once(ctx, dev, f, FERRY_ROUTE_RING, &warm); /* reads the file into the cache */
            }
            load_once(ctx, dev, f, paths[k], r);
        }
    }
    /* register once, then load from the registered mapping */
    if (!cpu) {
        row *r = row_add(rows, &nr, "register (pre-registered)", "hot", h2d, "pinned copy");
        if (ferry_file_resident(f) < 0.99) {
            row warm = {0};
            load_once(ctx, dev, f, FERRY_ROUTE_RING, &warm);
        }
        double t0 = cli_now();
        rc = ferry_device_register_file(dev, f, 0);
        double treg = cli_now() - t0;
        if (rc < 0) {
            snprintf(r->note, sizeof r->note, "%s", ferry_ctx_errmsg(ctx));
        } else {
            row first = {0};
            load_once(ctx, dev, f, FERRY_ROUTE_REGISTER, &first);
            load_once(ctx, dev, f, FERRY_ROUTE_REGISTER, r);
            snprintf(r->note, sizeof r->note,
                     "registering took %.3f s; second load, into device memory just freed by the first",
                     treg);
            /* the same into device memory that was written before (what a caller
             * reloading into its own buffers, or the store, gets): the driver hands
             * out freed memory that the copy engine writes slower the first time
             * (bench_alloc: 49 against 55 GB/s) */
            row *r2 = row_add(rows, &nr, "register (pre-registered)", "hot", h2d, "pinned copy");
            ferry_loaded *l = NULL;
            ferry_load_opts o = {.size = sizeof o, .route = FERRY_ROUTE_REGISTER};
            int64_t n = ferry_file_tensor_count(f);
            int64_t *idx = calloc((size_t)n + 1, sizeof *idx);
            uint64_t *dp = calloc((size_t)n + 1, sizeof *dp);
            ferry_load_stats st = {.size = sizeof st};
            int lr = idx && dp ? ferry_load(dev, f, &o, &l, &st) : -ENOMEM;
            for (int64_t i = 0; lr == 0 && i < n; i++) idx[i] = i, dp[i] = ferry_loaded_ptr(l, i);
            if (lr == 0) lr = ferry_load_into(dev, f, idx, dp, n, &o, &st);
            if (row_result(r2, ctx, lr, &st) == 0)
                snprintf(r2->note, sizeof r2->note, "again, into the device memory the previous load wrote");
            ferry_loaded_free(l);
            free(idx);
            free(dp);
            ferry_device_unregister_file(dev, f);
        }
    }
    /* GPUDirect Storage is probed, not loaded through: whether cuFile could
     * read this file, and why not */
    char cufile_why[320] = "";
    int cufile_rc = cpu ? FERRY_E_NODEV : ferry_device_probe_cufile(dev, f, cufile_why, sizeof cufile_why);
    /* A ratio above 1 is a load that beat its limit, itself one measurement
     * taken before the loads: say why that can be, on the row. */
    bool above = false;
    for (int i = 0; i < nr; i++) {
        row *r = &rows[i];
        if (!r->ok || r->limit <= 0 || r->gbps <= r->limit * 1.005 || small) continue;
        above = true;
        size_t len = strlen(r->note);
        snprintf(
            r->note + len, sizeof r->note - len, "%sabove 1: %s", len ? "; " : "",
            strcmp(r->cache, "cold") == 0
                ? "the probe is one 8-thread O_DIRECT read; this load may have read more at once (readahead, "
                  "more threads) or found pages the cache kept"
                : "the probe's copy ran slower than this load's (the link's rate varies by a few % between "
                  "runs)");
    }
    if (small) {
        char h[32];
        snprintf(note + strlen(note), sizeof note - strlen(note),
                 "%sthe file is %s: below 64 MiB a load is mostly its setup, so times are shown, not rates "
                 "(bench a checkpoint of 1 GiB or more)",
                 *note ? "; " : "", cli_human(h, sizeof h, ferry_file_total_bytes(f)));
    }
    if (cpu)
        snprintf(note + strlen(note), sizeof note - strlen(note),
                 "%scpu: host memory, so only the ring route (direct and register need a GPU or sim:SIZE)",
                 *note ? "; " : "");
    if (json) {
        json_t *o = json_object(), *a = json_array();
        json_object_set_new(o, "file", json_string(path));
        json_object_set_new(o, "bytes", json_integer((json_int_t)ferry_file_total_bytes(f)));
        json_object_set_new(o, "device", json_string(ferry_device_desc(dev)));
        json_object_set_new(o, "note", json_string(note));
        if (cpu)
            json_object_set_new(o, "limits",
                                json_pack("{s:f,s:f}", "direct_read_gbps", disk, "memory_copy_gbps", h2d));
        else
            json_object_set_new(o, "limits",
                                json_pack("{s:f,s:f,s:f}", "direct_read_gbps", disk, "pinned_htod_gbps", h2d,
                                          "pinned_dtoh_gbps", d2h));
        for (int i = 0; i < nr; i++) {
            json_t *x =
                json_pack("{s:s,s:s,s:b,s:f,s:f,s:s}", "route", rows[i].name, "cache", rows[i].cache, "ok",
                          rows[i].ok, "gbps", rows[i].gbps, "seconds", rows[i].seconds, "note", rows[i].note);
            json_object_set_new(x, "ratio",
                                rows[i].limit > 0 && rows[i].ok ? json_real(rows[i].gbps / rows[i].limit)
                                                                : json_null());
            json_object_set_new(x, "limit", json_string(rows[i].limit_name));
            json_array_append_new(a, x);
        }
        json_object_set_new(o, "runs", a);
        if (!cpu)
            json_object_set_new(
                o, "probes",
                json_pack("{s:{s:b,s:s}}", "cufile", "available", cufile_rc == 0, "why", cufile_why));
        json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)cli_vmhwm_kib() * 1024));
        json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
    } else {
        char h[32];
        printf("file:   %s (%s)\ndevice: %s\n", path, cli_human(h, sizeof h, ferry_file_total_bytes(f)),
               ferry_device_desc(dev));
        if (*note) printf("note:   %s\n", note);
        char dk[32] = "-";
        if (!small) snprintf(dk, sizeof dk, "%.2f GB/s", disk);
        if (cpu) printf("limits: O_DIRECT read %s; host memory copy %.2f GB/s\n\n", dk, h2d);
        else
            printf("limits: O_DIRECT read %s; pinned copy host->device %.2f GB/s, device->host %.2f GB/s\n\n",
                   dk, h2d, d2h);
        printf("%-26s %-5s %9s %8s  %s\n", "ROUTE", "CACHE", small ? "ms" : "GB/s", "RATIO", "OF / NOTE");
        for (int i = 0; i < nr; i++) {
            row *r = &rows[i];
            if (r->ok && small)
                printf("%-26s %-5s %9.2f %8s  %s\n", r->name, r->cache, r->seconds * 1e3, "-", r->note);
            else if (r->ok)
                printf("%-26s %-5s %9.2f %8.2f  %s%s%s\n", r->name, r->cache, r->gbps,
                       r->limit > 0 ? r->gbps / r->limit : 0, r->limit_name, *r->note ? "; " : "", r->note);
            else printf("%-26s %-5s %9s %8s  %s\n", r->name, r->cache, "-", "-", r->note);
        }
        if (!cpu)
            printf("\nprobe: cuFile (GPUDirect Storage) %s: %s\n",
                   cufile_rc == 0 ? "could read the file" : "unavailable", cufile_why);
        if (above)
            printf(
                "\nA ratio above 1 beat its limit, which is measured once before the loads (see its row).\n");
        printf("\npeak RSS (VmHWM): %.1f MiB\n", (double)cli_vmhwm_kib() / 1024.0);
    }
out:
    ferry_device_close(dev);
    ferry_file_close(f);
    ferry_ctx_free(ctx);
    return ex;
}
