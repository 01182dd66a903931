/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_load.c - `ferry load`: bring checkpoints to a device and report the speed. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "folder.h"

static int run(int argc, char **argv);

const cli_cmd cmd_load = {
    "load", "load checkpoints to a GPU (or a simulated one) and report GB/s and peak RSS",
    "usage: ferry load [OPTIONS] PATH...\n"
    "\n"
    "Check that every PATH opens, then load every tensor of each checkpoint into\n"
    "device memory, one after the other, and report bytes,\n"
    "seconds, GB/s (from 64 MiB up: a smaller load is mostly its setup), the\n"
    "route taken (and why), for the register route whether the load\n"
    "registered the file or reused a registration, and the process's peak RSS\n"
    "(VmHWM). A progress bar is drawn when stderr is a terminal.\n"
    "\n"
    "PATH is a checkpoint (as for ferry inspect) or a model folder, taken as ferry\n"
    "inspect takes it: a diffusers pipeline's components that hold a checkpoint,\n"
    "each loaded in turn (by name), or a folder's one checkpoint; `ferry inspect\n"
    "DIR` shows which file each is and why. A folder with nothing to load, or with\n"
    "several checkpoints to choose from, is a usage error.\n"
    "\n"
    "options:\n"
    "  --device DEV        cuda:N (default cuda:0); sim:SIZE, e.g. sim:24GiB: a GPU\n"
    "                      emulated in host memory (tests, capacity planning); or cpu:\n"
    "                      pageable host memory, read into straight (ring/auto only)\n"
    "  --route R           auto (default), ring, direct, register or pageable:\n"
    "                        ring      threaded pread from the page cache into pinned buffers\n"
    "                        direct    the same with O_DIRECT reads (cold files)\n"
    "                        register  page-lock the file mapping and copy from it directly\n"
    "                        pageable  copy straight from the mapping, unpinned (the\n"
    "                                  driver stages it; nothing pinned first)\n"
    "                      auto picks from page-cache residency: ring when mostly\n"
    "                      cached, direct when cold, register when already registered,\n"
    "                      pageable for a cached load of at most 32 MiB while no ring\n"
    "                      is pinned (pinning one costs more than such a copy).\n"
    "                      GPUDirect Storage (cuFile) is not a route: `ferry bench`\n"
    "                      reports its probe (whether it could read the file, and why not)\n"
    "  --threads N         reader threads (default min(12, CPUs); direct: min(8, CPUs))\n"
    "  --streams N         copy streams (default 4, at least 2)\n"
    "  --buffers N         pinned staging buffers (default 2 x threads)\n"
    "  --buffer-size SIZE  bytes per staging buffer (default 4MiB; direct reads 1MiB at\n"
    "                      a time, into the ring already pinned when it is larger)\n"
    "  --repeat N          load each checkpoint N times in this process (the ring and\n"
    "                      the CUDA context are set up once; shows the steady rate).\n"
    "                      The repeats load into the first load's device memory, as a\n"
    "                      server reloading weights in place would (memory freed and\n"
    "                      allocated again copies ~10% slower for a moment: the\n"
    "                      driver clears it); with --verify each gets fresh memory.\n"
    "                      With --route register the first load's registration is\n"
    "                      kept for the repeats (registered once per checkpoint)\n"
    "  --pinned-budget SIZE  most bytes a register load may page-lock (default: no limit)\n"
    "  --verify            copy every tensor back and compare its XXH3-64 with the file's\n"
    "  --json              print one JSON object\n"
    "  -h, --help          show this help\n",
    run};

/* Below this a load's time is mostly setting it up (threads, buffers, the first
 * copy), so a GB/s figure would say nothing about the route: text output gives
 * the time alone (--json keeps gbps). */
#define RATE_MIN_BYTES (64ull << 20)

static bool parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *e;
    long v = strtol(s, &e, 10);
    if (*e || e == s || v < (long)lo || v > (long)hi) return false;
    *out = (uint32_t)v;
    return true;
}

/* Read back and compare every tensor; returns mismatches (or -1 on error). */
static int64_t verify(ferry_ctx *ctx, ferry_file *f, ferry_loaded *l)
{
    int64_t n = ferry_file_tensor_count(f), bad = 0;
    uint64_t *want = calloc((size_t)(n ? n : 1), sizeof *want), maxb = 1;
    if (!want) return -1;
    if (ferry_file_hash(ctx, f, want, NULL, NULL, NULL) < 0) {
        free(want);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (ti.nbytes > maxb) maxb = ti.nbytes;
    }
    void *buf = malloc((size_t)maxb);
    if (!buf) {
        free(want);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (ti.strides) {
            /* a load copies a strided view's span; ferry_file_hash hashed its elements */
            if (ferry_file_tensor_read(f, i, 0, buf, (size_t)ti.nbytes) < 0) {
                bad = -1;
                break;
            }
            want[i] = ferry_xxh3(buf, (size_t)ti.nbytes);
        }
        if (ferry_loaded_read(l, i, buf) < 0) {
            bad = -1;
            break;
        }
        if (ferry_xxh3(buf, (size_t)ti.nbytes) != want[i]) {
            if (bad < 5) fprintf(stderr, "ferry: verify: tensor '%s' differs on the device\n", ti.name);
            bad++;
        }
    }
    free(buf);
    free(want);
    return bad;
}

/* The checkpoints to load, in order: a PATH as given, or a model folder's
 * components that hold a checkpoint (folder.h, as ferry inspect lists them). */
typedef struct load_list {
    const char **path, **folder, **component; /* folder, component: NULL for a PATH given as such */
    int n, cap;
    cli_folder *fo; /* the folders opened (they own those strings) */
    int nfo;
} load_list;

static int list_push(load_list *l, const char *path, const char *folder, const char *component)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        const char **p = realloc(l->path, (size_t)cap * sizeof *p);
        if (p) l->path = p;
        const char **f = p ? realloc(l->folder, (size_t)cap * sizeof *f) : NULL;
        if (f) l->folder = f;
        const char **c = f ? realloc(l->component, (size_t)cap * sizeof *c) : NULL;
        if (c) l->component = c;
        if (!c) return cli_fail("out of memory");
        l->cap = cap;
    }
    l->path[l->n] = path, l->folder[l->n] = folder, l->component[l->n] = component;
    l->n++;
    return EXIT_OK;
}

static int list_add(load_list *l, const char *arg)
{
    if (!cli_is_dir(arg)) return list_push(l, arg, NULL, NULL);
    cli_folder *fo = realloc(l->fo, (size_t)(l->nfo + 1) * sizeof *fo);
    if (!fo) return cli_fail("out of memory");
    l->fo = fo;
    int ex = cli_folder_open(&cmd_load, arg, &l->fo[l->nfo]);
    if (ex) return ex;
    cli_folder *f = &l->fo[l->nfo++];
    for (int i = 0; i < f->n && !ex; i++)
        if (f->c[i].path) ex = list_push(l, f->c[i].path, arg, f->c[i].name);
    return ex;
}

static void list_free(load_list *l)
{
    for (int i = 0; i < l->nfo; i++) cli_folder_free(&l->fo[i]);
    free(l->fo), free(l->path), free(l->folder), free(l->component);
    memset(l, 0, sizeof *l);
}

static int run(int argc, char **argv)
{
    const char *dev_spec = "cuda:0";
    const char **args = calloc((size_t)argc, sizeof *args);
    int nargs = 0;
    bool json = false, do_verify = false, opts = true;
    uint32_t repeat = 1;
    ferry_load_opts lo = {.size = sizeof lo};
    if (!args) return cli_fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (opts && cli_is_help(a)) {
            free(args);
            return cli_help(&cmd_load);
        }
        if (opts && strcmp(a, "--json") == 0) json = true;
        else if (opts && strcmp(a, "--verify") == 0) do_verify = true;
        else if (opts && strcmp(a, "--") == 0) opts = false;
        else if (opts &&
                 (strcmp(a, "--device") == 0 || strcmp(a, "--route") == 0 || strcmp(a, "--path") == 0 ||
                  strcmp(a, "--threads") == 0 || strcmp(a, "--streams") == 0 || strcmp(a, "--buffers") == 0 ||
                  strcmp(a, "--buffer-size") == 0 || strcmp(a, "--repeat") == 0 ||
                  strcmp(a, "--pinned-budget") == 0)) {
            int ex = EXIT_OK;
            if (!v) ex = cli_usage_error(&cmd_load, "%s needs a value", a);
            else if (strcmp(a, "--device") == 0) dev_spec = v;
            else if (strcmp(a, "--route") == 0 || strcmp(a, "--path") == 0) {
                /* --path: the deprecated spelling, kept out of --help */
                if (a[2] == 'p') fprintf(stderr, "ferry load: --path is deprecated, use --route\n");
                int p = ferry_route_parse(v);
                if (p < 0 || p == FERRY_ROUTE_CUFILE)
                    ex = cli_usage_error(
                        &cmd_load, "--route takes auto, ring, direct, register or pageable, not '%s'%s", v,
                        p == FERRY_ROUTE_CUFILE ? " (cuFile is a probe: ferry bench reports it)" : "");
                else lo.route = (ferry_route)p;
            } else if (strcmp(a, "--threads") == 0) {
                if (!parse_u32(v, 1, 64, &lo.threads))
                    ex = cli_usage_error(&cmd_load, "--threads takes 1..64");
            } else if (strcmp(a, "--repeat") == 0) {
                if (!parse_u32(v, 1, 1000, &repeat))
                    ex = cli_usage_error(&cmd_load, "--repeat takes 1..1000");
            } else if (strcmp(a, "--streams") == 0) {
                if (!parse_u32(v, 2, 16, &lo.streams))
                    ex = cli_usage_error(&cmd_load, "--streams takes 2..16");
            } else if (strcmp(a, "--pinned-budget") == 0) {
                if (!cli_parse_size(v, &lo.pinned_budget) || lo.pinned_budget == 0)
                    ex = cli_usage_error(&cmd_load, "--pinned-budget takes a size, e.g. 16GiB, not '%s'", v);
            } else if (strcmp(a, "--buffers") == 0) {
                if (!parse_u32(v, 2, 4096, &lo.ring_buffers))
                    ex = cli_usage_error(&cmd_load, "--buffers takes 2..4096");
            } else {
                if (!cli_parse_size(v, &lo.ring_buffer_bytes) || lo.ring_buffer_bytes < 4096 ||
                    lo.ring_buffer_bytes > (1ull << 32))
                    ex =
                        cli_usage_error(&cmd_load, "--buffer-size takes 4KiB..4GiB, e.g. 16MiB, not '%s'", v);
            }
            if (ex) {
                free(args);
                return ex;
            }
            i++;
        } else if (opts && a[0] == '-' && a[1]) {
            free(args);
            return cli_usage_error(&cmd_load, "unknown option '%s'", a);
        } else args[nargs++] = a;
    }
    if (!nargs) {
        free(args);
        return cli_usage_error(&cmd_load, "missing PATH");
    }
    /* "cpu" is the only spelling of the cpu device (ferry_device_open), and
     * ferry_load refuses it any route but ring and auto: say so before any work */
    if (strcmp(dev_spec, "cpu") == 0 && lo.route != FERRY_ROUTE_AUTO && lo.route != FERRY_ROUTE_RING) {
        free(args);
        return cli_usage_error(
            &cmd_load, "--device cpu reads straight into host memory: use --route ring or auto, not %s",
            ferry_route_name(lo.route));
    }

    /* a folder is its components' checkpoints, picked as inspect picks them */
    load_list ll = {0};
    int ex = EXIT_OK;
    for (int k = 0; k < nargs && !ex; k++) ex = list_add(&ll, args[k]);
    free(args);
    if (ex) {
        list_free(&ll);
        return ex;
    }
    const char **paths = ll.path;
    int npaths = ll.n;

    ferry_ctx *ctx;
    ferry_device *dev = NULL;
    if ((ex = cli_ctx_new(0, &ctx))) {
        list_free(&ll);
        return ex;
    }
    int rc = ferry_device_open(ctx, dev_spec, &dev);
    if (rc < 0) {
        /* FERRY_E_INVAL: a spec that names no device ("gpu", "sim:banana"), a usage
         * error; others (no driver, no such GPU) are failures */
        if (rc == FERRY_E_INVAL) ex = cli_usage_error(&cmd_load, "--device: %s", ferry_ctx_errmsg(ctx));
        else if (rc == FERRY_E_NODEV && strncmp(dev_spec, "cuda", 4) == 0)
            /* no usable GPU: say what runs here instead */
            ex = cli_fail(
                "%s; without a GPU use --device sim:SIZE (a simulated GPU, e.g. sim:24GiB) or --device cpu "
                "(host memory)",
                ferry_ctx_errmsg(ctx));
        else ex = cli_fail_ctx(ctx, rc);
        goto out;
    }
    /* every checkpoint must open before the first is loaded: a typo in the last
     * PATH should not cost the loads before it. Each is closed again and
     * reopened for its loads, so only one file's registrations are held at a time. */
    for (int k = 0; k < npaths; k++) {
        ferry_file *f;
        if ((rc = ferry_file_open(ctx, paths[k], 0, &f)) < 0) {
            ex = cli_fail_ctx(ctx, rc);
            goto out;
        }
        ferry_file_close(f);
    }
    json_t *files = json_array();
    uint64_t all_bytes = 0;
    double all_secs = 0;
    bool verified_all = true;
    /* A register load keeps its registration (held until the file closes) so
     * that the repeats of one checkpoint, which keep the file open, reuse it
     * as a caller of ferry_device_register_file would; each file is closed
     * after its repeats, so the pages of one checkpoint at most stay locked. */
    lo.flags = lo.route == FERRY_ROUTE_REGISTER ? FERRY_LOAD_KEEP_REGISTRATION : 0;
    ferry_file *f = NULL;
    ferry_loaded *l = NULL; /* kept through a checkpoint's repeats */
    int64_t *all_idx = NULL, nall = 0;
    uint64_t *all_ptr = NULL;
    for (int kk = 0; kk < npaths * (int)repeat && ex == EXIT_OK; kk++) {
        int k = kk / (int)repeat;
        if (kk % (int)repeat == 0 && (rc = ferry_file_open(ctx, paths[k], 0, &f)) < 0) {
            ex = cli_fail_ctx(ctx, rc);
            break;
        }
        cli_progress p;
        cli_progress_start(&p, "load");
        lo.progress = cli_progress_update;
        lo.opaque = &p;
        ferry_load_stats st = {.size = sizeof st};
        bool reused = l != NULL; /* a repeat: into the first load's device memory */
        if (reused) rc = ferry_load_into(dev, f, all_idx, all_ptr, nall, &lo, &st);
        else rc = ferry_load(dev, f, &lo, &l, &st);
        cli_progress_end(&p);
        if (rc < 0) {
            ex = cli_fail_ctx(ctx, rc);
            break;
        }
        if (!reused && repeat > 1) { /* the tensors' addresses, for the repeats */
            nall = ferry_file_tensor_count(f);
            int64_t *ni = realloc(all_idx, (size_t)(nall ? nall : 1) * sizeof *ni);
            if (ni) all_idx = ni;
            uint64_t *np = ni ? realloc(all_ptr, (size_t)(nall ? nall : 1) * sizeof *np) : NULL;
            if (np) all_ptr = np;
            if (!ni || !np) {
                ex = cli_fail("out of memory for the table of %" PRId64 " tensors", nall);
                break;
            }
            for (int64_t i = 0; i < nall; i++) all_idx[i] = i, all_ptr[i] = ferry_loaded_ptr(l, i);
        }
        int64_t bad = 0;
        if (do_verify) {
            bad = verify(ctx, f, l);
            if (bad != 0) {
                verified_all = false;
                ex = bad < 0 ? cli_fail("%s: verify: could not read the tensors back (%s)", paths[k],
                                        *ferry_ctx_errmsg(ctx) ? ferry_ctx_errmsg(ctx) : "out of memory")
                             : cli_fail("%s: %" PRId64 " %s on the device", paths[k], bad,
                                        cli_plural(bad, "tensor differs", "tensors differ"));
            }
        }
        double gbps = st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0;
        all_bytes += st.bytes;
        all_secs += st.seconds;
        json_t *o = json_object();
        json_object_set_new(o, "path", json_string(paths[k]));
        if (ll.folder[k]) { /* from a model folder: which one, which component */
            json_object_set_new(o, "folder", json_string(ll.folder[k]));
            json_object_set_new(o, "component", json_string(ll.component[k]));
        }
        json_object_set_new(o, "tensors", json_integer(ferry_file_tensor_count(f)));
        json_object_set_new(o, "bytes", json_integer((json_int_t)st.bytes));
        json_object_set_new(o, "seconds", json_real(st.seconds));
        json_object_set_new(o, "gbps", json_real(gbps));
        json_object_set_new(o, "route", json_string(ferry_route_name(st.route)));
        json_object_set_new(o, "why", json_string(st.why));
        json_object_set_new(o, "resident_before", json_real(st.resident));
        json_object_set_new(o, "setup_seconds", json_real(st.setup_seconds));
        json_object_set_new(o, "alloc_seconds", json_real(st.alloc_seconds));
        json_object_set_new(o, "pin_seconds", json_real(st.pin_seconds));
        json_object_set_new(o, "device_memory", json_string(reused ? "reused" : "new"));
        if (st.route == FERRY_ROUTE_REGISTER) {
            /* "registered": this load page-locked the file (register_seconds
             * of it, overlapping the copies); "reused": it was registered already */
            json_object_set_new(
                o, "registration",
                json_string(st.registration == FERRY_REGISTRATION_NEW ? "registered" : "reused"));
            json_object_set_new(o, "register_seconds", json_real(st.register_seconds));
        }
        if (do_verify) json_object_set_new(o, "verified", json_boolean(bad == 0));
        json_array_append_new(files, o);
        if (!json) {
            char h[32], cached[48] = "", rate[96];
            int64_t nt = ferry_file_tensor_count(f);
            if (st.resident >= 0) snprintf(cached, sizeof cached, "; %.0f%% cached", st.resident * 100);
            else if (st.route == FERRY_ROUTE_REGISTER && st.registration == FERRY_REGISTRATION_NEW)
                snprintf(cached, sizeof cached, "; registered in %.1f ms", st.register_seconds * 1e3);
            else if (st.route == FERRY_ROUTE_REGISTER)
                snprintf(cached, sizeof cached, "; registration reused");
            if (st.bytes >= RATE_MIN_BYTES)
                snprintf(rate, sizeof rate, "%.3f s = %.2f GB/s", st.seconds, gbps);
            else snprintf(rate, sizeof rate, "%.2f ms (too small for a GB/s figure)", st.seconds * 1e3);
            printf("%s: %" PRId64 " %s, %s in %s via %s (%s%s)%s\n", paths[k], nt,
                   cli_plural(nt, "tensor", "tensors"), cli_human(h, sizeof h, st.bytes), rate,
                   ferry_route_name(st.route), st.why, cached,
                   do_verify && bad == 0 ? "; verified bit-identical" : "");
        }
        if (do_verify) { /* each repeat into fresh memory: the same bytes already there would hide a copy that did not happen */
            ferry_loaded_free(l);
            l = NULL;
        }
        if (kk % (int)repeat == (int)repeat - 1) {
            ferry_loaded_free(l);
            l = NULL;
            ferry_file_close(f);
            f = NULL;
        }
    }
    ferry_loaded_free(l); /* after a failed load */
    ferry_file_close(f);
    free(all_idx);
    free(all_ptr);
    long hwm = cli_vmhwm_kib();
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "device", json_string(ferry_device_desc(dev)));
        json_object_set_new(o, "files", files);
        json_object_set_new(o, "bytes", json_integer((json_int_t)all_bytes));
        json_object_set_new(o, "seconds", json_real(all_secs));
        json_object_set_new(o, "gbps", json_real(all_secs > 0 ? (double)all_bytes / all_secs / 1e9 : 0));
        json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)hwm * 1024));
        if (do_verify) json_object_set_new(o, "verified", json_boolean(verified_all && ex == EXIT_OK));
        json_object_set_new(o, "ok", json_boolean(ex == EXIT_OK));
        json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
    } else {
        json_decref(files);
        printf("device: %s; peak RSS (VmHWM): %.1f MiB\n", ferry_device_desc(dev), (double)hwm / 1024.0);
    }
out:
    ferry_device_close(dev);
    ferry_ctx_free(ctx);
    list_free(&ll);
    return ex;
}
