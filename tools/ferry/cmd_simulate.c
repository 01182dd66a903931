/* cmd_simulate.c - `ferry simulate`: run a scenario of jobs (use, reserve,
 * modify, evict, verify) against a residency store and report, per job, the
 * memory the process used and where every byte went: capacity planning with
 * a sim device, and an end-to-end check of the store with real checkpoints. */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int run(int argc, char **argv);

const cli_cmd cmd_simulate = {
    "simulate", "run a scenario of jobs against the residency store; memory and moves per job",
    "usage: ferry simulate [OPTIONS] SCENARIO.json\n"
    "\n"
    "Add the scenario's models to a residency store on one device, then run its jobs\n"
    "in order and report, for each, the process's RSS/USS/PSS (start -> end, peak\n"
    "sampled every 10 ms), the cgroup's memory when in a cgroup v2, the bytes in each\n"
    "tier at its end, the bytes moved, the tensors evicted and what verify found.\n"
    "A last line (or JSON object) gives the store's totals. On a sim device the\n"
    "emulated GPU memory is this process's host memory, so it shows in RSS too.\n"
    "\n"
    "options:\n"
    "  --device DEV   overrides the scenario's \"device\": cuda:N, sim:SIZE (a GPU\n"
    "                 emulated in host memory, e.g. sim:24GiB) or cpu\n"
    "  --json         one JSON object per job, one per line, then {\"summary\": {...}}\n"
    "  -h, --help     show this help\n"
    "\n"
    "Scenario (JSON; every key is checked, unknown ones are errors):\n"
    "  {\"device\": \"sim:4GiB\", \"host_budget\": \"2GiB\", \"pinned_budget\": \"1GiB\",\n"
    "   \"device_budget\": \"3GiB\", \"spill_dir\": \"/var/tmp\",\n"
    "   \"models\": {\"unet\": \"unet.safetensors\", \"te\": \"te.safetensors\"},\n"
    "   \"jobs\": [{\"name\": \"encode\", \"use\": [\"te\"]},\n"
    "            {\"name\": \"denoise\", \"use\": [\"unet\"], \"reserve\": \"512MiB\",\n"
    "             \"modify\": {\"unet\": [\"blk.0.w\"]}},\n"
    "            {\"name\": \"offload\", \"evict\": [\"unet\"]},\n"
    "            {\"name\": \"again\", \"use\": [\"te\", \"unet\"], \"verify\": true}]}\n"
    "\n"
    "  device         as --device (one of the two is needed)\n"
    "  device_budget  device bytes the store may hold (default: the device's free\n"
    "                 memory minus device_reserve; mind a small sim device)\n"
    "  device_reserve default 512MiB\n"
    "  host_budget    host RAM for dirty tensors that left the device (default: what\n"
    "                 the cgroup or MemAvailable allows minus host_reserve); \"1\" makes\n"
    "                 every dirty eviction spill\n"
    "  pinned_budget  the page-locked part of host_budget (default a quarter of it)\n"
    "  host_reserve   default 1GiB\n"
    "  spill_below, spill_above\n"
    "                 dirty evictions go to the spill file while the host's available\n"
    "                 memory is below spill_below, and to RAM again once it is above\n"
    "                 spill_above (defaults 2 x host_reserve, spill_below + 1GiB)\n"
    "  spill_dir      where the unnamed spill file is made (default $FERRY_SPILL_DIR,\n"
    "                 else /var/tmp); tmpfs and ramfs are refused\n"
    "  Sizes are strings (\"4096\", \"16MiB\", \"1.5GB\") or byte counts; absent or 0\n"
    "  means the default.\n"
    "\n"
    "  models   name -> a checkpoint path, or {\"path\": P} or {\"paths\": [P, ...]}\n"
    "           (several files make one model), with \"priority\": N (default 0;\n"
    "           higher is evicted later). Relative paths are resolved against the\n"
    "           scenario file's folder. Every file is opened and validated first.\n"
    "  jobs     a list of objects, run in order; each may have:\n"
    "    name     shown in the report (default \"job N\")\n"
    "    use      models brought to the device whole (from the checkpoint, RAM or the\n"
    "             spill file, evicting others least recently used and lowest\n"
    "             priority first). They stay pinned there through reserve and\n"
    "             modify, so a later model of the list cannot push out an earlier\n"
    "             one and a reserve cannot take them: the job's models must fit\n"
    "             together.\n"
    "    reserve  a size: make that much of the device budget free (for activations),\n"
    "             evicting other models as above\n"
    "    modify   {model: [tensor, ...]}: each tensor's bytes are read, XORed with a\n"
    "             non-zero byte derived from the job's index and the tensor's name,\n"
    "             and written back, which makes it dirty (saved, not dropped, when it\n"
    "             leaves the device). A tensor not on the device is brought there\n"
    "             first. The expected contents are remembered as an XXH3-64.\n"
    "    evict    models taken off the device: clean tensors are dropped (0 bytes\n"
    "             written), dirty ones go to pinned RAM, pageable RAM or the spill\n"
    "             file as the budgets decide\n"
    "    verify   true: read every tensor of the job's \"use\" models (of every model\n"
    "             when the job uses none) from wherever it lives and compare it with\n"
    "             the checkpoint, or with the remembered hash when modified\n"
    "  Steps run in that order: use, reserve, modify, evict, verify.\n"
    "\n"
    "Failures inside a job are reported in its \"error\" and the command exits 1 at\n"
    "the end. A failed reserve, modify, evict or verify leaves the rest of the\n"
    "scenario running (a reserve that cannot be met evicts nothing). A failed \"use\"\n"
    "skips the rest of its job and stops the scenario: the jobs after it were\n"
    "written for a state that did not come about.\n"
    "\n"
    "Output, per job: name, seconds, rss/uss/pss start -> end (peak), the bytes in\n"
    "device/pinned/host/spill at its end, bytes read and written, tensors evicted\n"
    "(dropped: clean ones), verified. With --json each job is one object with: job,\n"
    "index, seconds, rss, uss, pss and cgroup ({start, end, peak} in bytes; cgroup\n"
    "null outside a cgroup v2), device_bytes, pinned_bytes, host_bytes, spill_bytes,\n"
    "bytes_htod, bytes_dtoh, seconds_htod, seconds_dtoh, bytes_written (to the\n"
    "spill file), bytes_read (checkpoints and spill file), evicted, dropped, reserve\n"
    "and reserve_freed (null without a reserve), modified and modified_bytes,\n"
    "verified (tensors checked, null when not asked), mismatches, models ({name:\n"
    "{device, pinned, host, source, spill} bytes}) and error (null or the message).\n"
    "\n"
    "Exit status: 0 every job succeeded, 1 a job failed (or the device or store\n"
    "could not be set up), 2 usage or scenario error (bad JSON, an unknown key, a\n"
    "wrong type, a bad size, an unknown model or tensor, a checkpoint that cannot be\n"
    "opened): the message names the scenario file and the key.\n"
    "\n"
    "Example: examples/simulate/ (scenario.json and make_checkpoints.sh).\n",
    run};

/* ---- the scenario ---- */

typedef struct sim_model {
    const char *name; /* key in "models" (owned by the JSON document) */
    char **paths;     /* resolved */
    int npaths;
    int priority;
    ferry_file **files;
    int64_t *first; /* model index of each file's first tensor */
    int64_t n;
    uint64_t maxbytes;
    ferry_model *m;
    bool *changed;  /* per tensor: modified since the checkpoint ... */
    uint64_t *want; /* ... and then the XXH3-64 of its expected bytes */
} sim_model;

typedef struct sim_mod {
    int model;
    int64_t t;
} sim_mod;

typedef struct sim_job {
    const char *name;
    char defname[32];
    int *use, nuse;
    bool has_reserve;
    uint64_t reserve;
    sim_mod *mod;
    int nmod;
    int *evict, nevict;
    bool verify;
} sim_job;

typedef struct scenario {
    const char *path;
    json_t *root;
    const char *device;
    ferry_store_opts o;
    sim_model *models;
    int nmodels;
    sim_job *jobs;
    int njobs;
} scenario;

/* "ferry simulate: SCENARIO: KEY: message"; returns EXIT_USAGE. */
static int scen_err(const scenario *sc, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int scen_err(const scenario *sc, const char *key, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ferry simulate: %s: ", sc->path);
    if (key && *key) fprintf(stderr, "%s: ", key);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Refuse keys outside allowed (a NULL-terminated list). */
static int check_keys(const scenario *sc, json_t *obj, const char *key, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, k) == 0;
        if (!ok) {
            char known[256] = "";
            for (const char *const *a = allowed; *a; a++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", a == allowed ? "" : ", ", *a);
            if (key && *key) return scen_err(sc, key, "unknown key \"%s\" (known: %s)", k, known);
            return scen_err(sc, NULL, "unknown key \"%s\" (known: %s)", k, known);
        }
    }
    return 0;
}

static int get_size(const scenario *sc, const json_t *v, const char *key, uint64_t *out)
{
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0) return scen_err(sc, key, "a size cannot be negative (%" JSON_INTEGER_FORMAT ")",
                                                       json_integer_value(v));
        *out = (uint64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        if (ferry_parse_size(json_string_value(v), out) < 0)
            return scen_err(sc, key, "bad size \"%s\" (expected e.g. \"4096\", \"16MiB\", \"1.5GB\")",
                            json_string_value(v));
        return 0;
    }
    return scen_err(sc, key, "expected a size (a string such as \"2GiB\", or a byte count), not %s", jtype(v));
}

static int find_model(const scenario *sc, const char *name)
{
    for (int i = 0; i < sc->nmodels; i++)
        if (strcmp(sc->models[i].name, name) == 0) return i;
    return -1;
}

static int model_ref(const scenario *sc, const json_t *v, const char *key, int *out)
{
    if (!json_is_string(v)) return scen_err(sc, key, "expected a model name (a string), not %s", jtype(v));
    int i = find_model(sc, json_string_value(v));
    if (i < 0) {
        char known[512] = "";
        for (int k = 0; k < sc->nmodels; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", sc->models[k].name);
        return scen_err(sc, key, "no model called \"%s\" in \"models\" (there: %s)", json_string_value(v), known);
    }
    *out = i;
    return 0;
}

/* A list of model names into a fresh array. */
static int model_list(const scenario *sc, const json_t *v, const char *key, int **out, int *n)
{
    if (!json_is_array(v)) return scen_err(sc, key, "expected a list of model names, not %s", jtype(v));
    *n = (int)json_array_size(v);
    *out = calloc((size_t)(*n ? *n : 1), sizeof **out);
    if (!*out) return cli_fail("out of memory");
    for (int i = 0; i < *n; i++) {
        char k[200];
        snprintf(k, sizeof k, "%.150s[%d]", key, i);
        int ex = model_ref(sc, json_array_get(v, (size_t)i), k, &(*out)[i]);
        if (ex) return ex;
    }
    return 0;
}

/* dir of the scenario + rel, unless rel is absolute */
static char *resolve(const char *scen, const char *rel)
{
    const char *slash = strrchr(scen, '/');
    size_t dl = slash ? (size_t)(slash - scen) : 0;
    if (rel[0] == '/' || !slash) return strdup(rel);
    char *p = malloc(dl + strlen(rel) + 3);
    if (!p) return NULL;
    if (dl == 0) sprintf(p, "/%s", rel);
    else sprintf(p, "%.*s/%s", (int)dl, scen, rel);
    return p;
}

static int parse_model(scenario *sc, sim_model *sm, json_t *v, const char *key)
{
    static const char *const keys[] = {"path", "paths", "priority", NULL};
    json_t *paths = NULL;
    if (json_is_string(v)) {
        paths = json_pack("[O]", v);
    } else if (json_is_object(v)) {
        int ex = check_keys(sc, v, key, keys);
        if (ex) return ex;
        json_t *p = json_object_get(v, "path"), *ps = json_object_get(v, "paths"), *pr = json_object_get(v, "priority");
        char k[200];
        if (p && ps) return scen_err(sc, key, "give \"path\" or \"paths\", not both");
        if (!p && !ps) return scen_err(sc, key, "needs \"path\" (a checkpoint) or \"paths\" (a list of them)");
        if (p && !json_is_string(p)) {
            snprintf(k, sizeof k, "%.150s.path", key);
            return scen_err(sc, k, "expected a path (a string), not %s", jtype(p));
        }
        if (ps && (!json_is_array(ps) || json_array_size(ps) == 0)) {
            snprintf(k, sizeof k, "%.150s.paths", key);
            return scen_err(sc, k, "expected a non-empty list of paths");
        }
        if (pr) {
            snprintf(k, sizeof k, "%.150s.priority", key);
            if (!json_is_integer(pr) || json_integer_value(pr) < -1000000 || json_integer_value(pr) > 1000000)
                return scen_err(sc, k, "expected an integer from -1000000 to 1000000");
            sm->priority = (int)json_integer_value(pr);
        }
        paths = p ? json_pack("[O]", p) : json_incref(ps);
    } else {
        return scen_err(sc, key, "expected a checkpoint path or {\"path\": ..., \"priority\": ...}, not %s", jtype(v));
    }
    if (!paths) return cli_fail("out of memory");
    sm->npaths = (int)json_array_size(paths);
    sm->paths = calloc((size_t)sm->npaths, sizeof *sm->paths);
    sm->files = calloc((size_t)sm->npaths, sizeof *sm->files);
    sm->first = calloc((size_t)sm->npaths, sizeof *sm->first);
    if (!sm->paths || !sm->files || !sm->first) {
        json_decref(paths);
        return cli_fail("out of memory");
    }
    for (int i = 0; i < sm->npaths; i++) {
        json_t *p = json_array_get(paths, (size_t)i);
        if (!json_is_string(p) || !*json_string_value(p)) {
            char k[200];
            snprintf(k, sizeof k, "%.150s.paths[%d]", key, i);
            json_decref(paths);
            return scen_err(sc, k, "expected a path (a non-empty string), not %s", jtype(p));
        }
        if (!(sm->paths[i] = resolve(sc->path, json_string_value(p)))) {
            json_decref(paths);
            return cli_fail("out of memory");
        }
    }
    json_decref(paths);
    return 0;
}

static int parse_job(scenario *sc, int ji, json_t *v)
{
    static const char *const keys[] = {"name", "use", "reserve", "modify", "evict", "verify", NULL};
    sim_job *j = &sc->jobs[ji];
    char key[160], k[320];
    snprintf(key, sizeof key, "jobs[%d]", ji);
    snprintf(j->defname, sizeof j->defname, "job %d", ji + 1);
    j->name = j->defname;
    if (!json_is_object(v)) return scen_err(sc, key, "expected a job (an object), not %s", jtype(v));
    int ex = check_keys(sc, v, key, keys);
    if (ex) return ex;
    json_t *x;
    if ((x = json_object_get(v, "name"))) {
        if (!json_is_string(x) || !*json_string_value(x))
            return scen_err(sc, key, "\"name\" must be a non-empty string, not %s", jtype(x));
        j->name = json_string_value(x);
        snprintf(key, sizeof key, "jobs[%d] (\"%.100s\")", ji, j->name);
    }
    if ((x = json_object_get(v, "use"))) {
        snprintf(k, sizeof k, "%.150s.use", key);
        if ((ex = model_list(sc, x, k, &j->use, &j->nuse))) return ex;
    }
    if ((x = json_object_get(v, "evict"))) {
        snprintf(k, sizeof k, "%.150s.evict", key);
        if ((ex = model_list(sc, x, k, &j->evict, &j->nevict))) return ex;
    }
    if ((x = json_object_get(v, "reserve"))) {
        snprintf(k, sizeof k, "%.150s.reserve", key);
        if ((ex = get_size(sc, x, k, &j->reserve))) return ex;
        j->has_reserve = true;
    }
    if ((x = json_object_get(v, "verify"))) {
        if (!json_is_boolean(x)) {
            snprintf(k, sizeof k, "%.150s.verify", key);
            return scen_err(sc, k, "expected true or false, not %s", jtype(x));
        }
        j->verify = json_is_true(x);
    }
    if ((x = json_object_get(v, "modify"))) {
        snprintf(k, sizeof k, "%.150s.modify", key);
        if (!json_is_object(x))
            return scen_err(sc, k, "expected {model: [tensor, ...]}, not %s", jtype(x));
        const char *mname;
        json_t *list;
        size_t total = 0;
        json_object_foreach(x, mname, list) total += json_is_array(list) ? json_array_size(list) : 0;
        j->mod = calloc(total ? total : 1, sizeof *j->mod);
        if (!j->mod) return cli_fail("out of memory");
        json_object_foreach(x, mname, list) {
            char mk[400];
            snprintf(mk, sizeof mk, "%s.%s", k, mname);
            int mi = find_model(sc, mname);
            if (mi < 0) {
                json_t *s = json_string(mname);
                ex = model_ref(sc, s, mk, &mi);
                json_decref(s);
                return ex ? ex : EXIT_USAGE;
            }
            if (!json_is_array(list)) return scen_err(sc, mk, "expected a list of tensor names, not %s", jtype(list));
            for (size_t i = 0; i < json_array_size(list); i++) {
                json_t *tn = json_array_get(list, i);
                if (!json_is_string(tn)) {
                    char tk[448];
                    snprintf(tk, sizeof tk, "%s[%zu]", mk, i);
                    return scen_err(sc, tk, "expected a tensor name (a string), not %s", jtype(tn));
                }
                /* resolved to an index once the files are open (resolve_mods) */
                j->mod[j->nmod].model = mi;
                j->mod[j->nmod].t = -1;
                j->nmod++;
            }
        }
    }
    return 0;
}

/* Tensor names of "modify" to model indices; the files are open now. */
static int resolve_mods(scenario *sc)
{
    for (int ji = 0; ji < sc->njobs; ji++) {
        json_t *mods = json_object_get(json_array_get(json_object_get(sc->root, "jobs"), (size_t)ji), "modify");
        const char *mname;
        json_t *list;
        int q = 0;
        json_object_foreach(mods, mname, list) {
            for (size_t i = 0; i < json_array_size(list); i++, q++) {
                const char *tn = json_string_value(json_array_get(list, i));
                sim_mod *md = &sc->jobs[ji].mod[q];
                sim_model *sm = &sc->models[md->model];
                for (int f = 0; f < sm->npaths && md->t < 0; f++) {
                    int64_t idx = ferry_file_find(sm->files[f], tn);
                    if (idx >= 0) md->t = sm->first[f] + idx;
                }
                if (md->t < 0) {
                    char k[400];
                    snprintf(k, sizeof k, "jobs[%d].modify.%s[%zu]", ji, mname, i);
                    return scen_err(sc, k, "model \"%s\" has no tensor \"%s\" (%s%s)", mname, tn, sm->paths[0],
                                    sm->npaths > 1 ? " and the other files" : "");
                }
            }
        }
    }
    return 0;
}

static int parse_scenario(scenario *sc)
{
    static const char *const keys[] = {"device",      "device_budget", "device_reserve", "host_budget",
                                        "pinned_budget", "host_reserve", "spill_below",   "spill_above",
                                        "spill_dir",   "models",        "jobs",           NULL};
    json_error_t je;
    sc->root = json_load_file(sc->path, JSON_REJECT_DUPLICATES, &je);
    if (!sc->root) {
        if (je.line > 0) {
            fprintf(stderr, "ferry simulate: %s:%d:%d: %s\n", sc->path, je.line, je.column, je.text);
            return EXIT_USAGE;
        }
        return scen_err(sc, NULL, "%s", je.text);
    }
    if (!json_is_object(sc->root)) return scen_err(sc, NULL, "expected a JSON object, not %s", jtype(sc->root));
    int ex = check_keys(sc, sc->root, NULL, keys);
    if (ex) return ex;
    json_t *x;
    if ((x = json_object_get(sc->root, "device"))) {
        if (!json_is_string(x)) return scen_err(sc, "device", "expected a device (cuda:N, sim:SIZE, cpu), not %s", jtype(x));
        if (!sc->device) sc->device = json_string_value(x);
    }
    struct { const char *k; uint64_t *p; } sizes[] = {
        {"device_budget", &sc->o.device_budget}, {"device_reserve", &sc->o.device_reserve},
        {"host_budget", &sc->o.host_budget},     {"pinned_budget", &sc->o.pinned_budget},
        {"host_reserve", &sc->o.host_reserve},   {"spill_below", &sc->o.spill_below},
        {"spill_above", &sc->o.spill_above}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if ((x = json_object_get(sc->root, sizes[i].k)) && (ex = get_size(sc, x, sizes[i].k, sizes[i].p))) return ex;
    if ((x = json_object_get(sc->root, "spill_dir"))) {
        if (!json_is_string(x) || !*json_string_value(x))
            return scen_err(sc, "spill_dir", "expected a directory (a non-empty string), not %s", jtype(x));
        sc->o.spill_dir = json_string_value(x);
    }
    x = json_object_get(sc->root, "models");
    if (!x) return scen_err(sc, NULL, "no \"models\": give {name: checkpoint path, ...}");
    if (!json_is_object(x) || json_object_size(x) == 0)
        return scen_err(sc, "models", "expected {name: checkpoint path, ...} with at least one model");
    sc->nmodels = (int)json_object_size(x);
    sc->models = calloc((size_t)sc->nmodels, sizeof *sc->models);
    if (!sc->models) return cli_fail("out of memory");
    const char *name;
    json_t *mv;
    int mi = 0;
    json_object_foreach(x, name, mv) {
        char k[200];
        snprintf(k, sizeof k, "models.%.140s", name);
        if (!*name) return scen_err(sc, "models", "a model needs a non-empty name");
        sc->models[mi].name = name;
        if ((ex = parse_model(sc, &sc->models[mi], mv, k))) return ex;
        mi++;
    }
    x = json_object_get(sc->root, "jobs");
    if (!x) return scen_err(sc, NULL, "no \"jobs\": give a list of {\"name\", \"use\", ...}");
    if (!json_is_array(x)) return scen_err(sc, "jobs", "expected a list of jobs, not %s", jtype(x));
    sc->njobs = (int)json_array_size(x);
    sc->jobs = calloc((size_t)(sc->njobs ? sc->njobs : 1), sizeof *sc->jobs);
    if (!sc->jobs) return cli_fail("out of memory");
    for (int i = 0; i < sc->njobs; i++)
        if ((ex = parse_job(sc, i, json_array_get(x, (size_t)i)))) return ex;
    if (!sc->device) return scen_err(sc, NULL, "no device: give \"device\" (e.g. \"sim:24GiB\") or --device");
    return 0;
}

static int open_models(scenario *sc, ferry_ctx *ctx)
{
    for (int i = 0; i < sc->nmodels; i++) {
        sim_model *sm = &sc->models[i];
        for (int f = 0; f < sm->npaths; f++) {
            int rc = ferry_file_open(ctx, sm->paths[f], 0, &sm->files[f]);
            if (rc < 0) {
                char k[200];
                snprintf(k, sizeof k, "models.%.140s", sm->name);
                const char *msg = ferry_ctx_errmsg(ctx);
                return scen_err(sc, k, "%s", *msg ? msg : ferry_strerror(rc));
            }
            sm->first[f] = sm->n;
            int64_t cnt = ferry_file_tensor_count(sm->files[f]);
            for (int64_t t = 0; t < cnt; t++) {
                ferry_tensor_info ti;
                if (ferry_file_tensor_info(sm->files[f], t, &ti) == 0 && ti.nbytes > sm->maxbytes)
                    sm->maxbytes = ti.nbytes;
            }
            sm->n += cnt;
        }
        sm->changed = calloc((size_t)(sm->n ? sm->n : 1), sizeof *sm->changed);
        sm->want = calloc((size_t)(sm->n ? sm->n : 1), sizeof *sm->want);
        if (!sm->changed || !sm->want) return cli_fail("out of memory");
    }
    return 0;
}

static void free_scenario(scenario *sc)
{
    for (int i = 0; i < sc->nmodels; i++) {
        sim_model *sm = &sc->models[i];
        for (int f = 0; f < sm->npaths; f++) {
            if (sm->files) ferry_file_close(sm->files[f]);
            if (sm->paths) free(sm->paths[f]);
        }
        free(sm->paths);
        free(sm->files);
        free(sm->first);
        free(sm->changed);
        free(sm->want);
    }
    for (int i = 0; i < sc->njobs; i++) {
        free(sc->jobs[i].use);
        free(sc->jobs[i].evict);
        free(sc->jobs[i].mod);
    }
    free(sc->models);
    free(sc->jobs);
    json_decref(sc->root);
}

/* ---- running ---- */

typedef struct job_result {
    char err[2048];
    bool failed, stop;
    int64_t reserve_freed;
    int64_t modified;
    uint64_t modified_bytes;
    int64_t verified, mismatches;
} job_result;

static void job_err(job_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_err(job_result *r, const char *fmt, ...)
{
    size_t l = strlen(r->err);
    if (l && l + 2 < sizeof r->err) {
        memcpy(r->err + l, "; ", 3);
        l += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + l, sizeof r->err - l, fmt, ap);
    va_end(ap);
    r->failed = true;
}

static const char *errmsg(ferry_ctx *ctx, int64_t rc)
{
    const char *m = ferry_ctx_errmsg(ctx);
    return m && *m ? m : ferry_strerror((int)rc);
}

/* The byte every byte of tensor `name` is XORed with in job ji: never 0. */
static uint8_t mod_key(int ji, const char *name)
{
    uint64_t h = ferry_xxh3(name, strlen(name)) ^ ((uint64_t)(ji + 1) * 0x9E3779B97F4A7C15ull);
    return (uint8_t)(1 + h % 255);
}

typedef struct bufs {
    uint8_t *a; /* a whole tensor */
    uint8_t *b; /* a window of the checkpoint */
    size_t bn;
} bufs;

/* Compare tensor t's current bytes with what they should be. */
static int check_tensor(ferry_ctx *ctx, sim_model *sm, int64_t t, bufs *b, bool *same, job_result *r)
{
    ferry_tensor_state st = {0};
    int64_t rc = ferry_model_tensor_state(sm->m, t, &st);
    if (rc == 0) rc = ferry_model_read(sm->m, t, b->a);
    if (rc < 0) {
        job_err(r, "verify: reading %s/%s back: %s", sm->name, st.name ? st.name : "?", errmsg(ctx, rc));
        return (int)rc;
    }
    if (sm->changed[t]) {
        *same = ferry_xxh3(b->a, (size_t)st.nbytes) == sm->want[t];
        return 0;
    }
    int f = sm->npaths - 1;
    while (f > 0 && sm->first[f] > t) f--;
    *same = true;
    for (uint64_t off = 0; off < st.nbytes && *same; off += b->bn) {
        size_t len = st.nbytes - off < b->bn ? (size_t)(st.nbytes - off) : b->bn;
        if ((rc = ferry_file_tensor_read(sm->files[f], t - sm->first[f], off, b->b, len)) < 0) {
            job_err(r, "verify: reading %s/%s from %s: %s", sm->name, st.name, sm->paths[f], errmsg(ctx, rc));
            return (int)rc;
        }
        *same = memcmp(b->a + off, b->b, len) == 0;
    }
    return 0;
}

static void verify_model(ferry_ctx *ctx, sim_model *sm, bufs *b, job_result *r, char *bad, size_t badn)
{
    for (int64_t t = 0; t < sm->n; t++) {
        bool same = false;
        if (check_tensor(ctx, sm, t, b, &same, r) < 0) return;
        r->verified++;
        if (!same) {
            ferry_tensor_state st = {0};
            ferry_model_tensor_state(sm->m, t, &st);
            if (r->mismatches < 4) {
                size_t l = strlen(bad);
                snprintf(bad + l, badn - l, "%s%s/%s (in %s)", l ? ", " : "", sm->name, st.name, ferry_tier_name(st.tier));
            }
            r->mismatches++;
        }
    }
}

static void modify_tensor(ferry_ctx *ctx, scenario *sc, int ji, const sim_mod *md, bufs *b, job_result *r)
{
    sim_model *sm = &sc->models[md->model];
    ferry_tensor_state st = {0};
    int64_t rc = ferry_model_tensor_state(sm->m, md->t, &st);
    if (rc == 0 && st.tier != FERRY_TIER_DEVICE) rc = ferry_model_to_device(sm->m, &md->t, 1);
    if (rc == 0) rc = ferry_model_read(sm->m, md->t, b->a);
    if (rc < 0) {
        job_err(r, "modify %s/%s: %s", sm->name, st.name ? st.name : "?", errmsg(ctx, rc));
        return;
    }
    uint8_t k = mod_key(ji, st.name);
    for (uint64_t i = 0; i < st.nbytes; i++) b->a[i] ^= k;
    if ((rc = ferry_model_write(sm->m, md->t, b->a)) < 0) {
        job_err(r, "modify %s/%s: writing: %s", sm->name, st.name, errmsg(ctx, rc));
        return;
    }
    sm->changed[md->t] = true;
    sm->want[md->t] = ferry_xxh3(b->a, (size_t)st.nbytes);
    r->modified++;
    r->modified_bytes += st.nbytes;
}

static void run_steps(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, bufs *b, job_result *r)
{
    sim_job *j = &sc->jobs[ji];
    bool *pinned = calloc((size_t)sc->nmodels, sizeof *pinned);
    if (!pinned) {
        job_err(r, "out of memory");
        r->stop = true;
        return;
    }
    int64_t rc;
    for (int u = 0; u < j->nuse; u++) {
        sim_model *sm = &sc->models[j->use[u]];
        if ((rc = ferry_model_to_device(sm->m, NULL, 0)) < 0) {
            job_err(r, "use %s: %s", sm->name, errmsg(ctx, rc));
            r->stop = true;
            goto unpin;
        }
        if (!pinned[j->use[u]]) {
            if ((rc = ferry_model_pin(sm->m, -1)) < 0) {
                job_err(r, "use %s: pinning: %s", sm->name, errmsg(ctx, rc));
                r->stop = true;
                goto unpin;
            }
            pinned[j->use[u]] = true;
        }
    }
    if (j->has_reserve) {
        uint64_t could = 0;
        rc = ferry_store_make_room(store, j->reserve, &could);
        if (rc < 0) {
            char h[32];
            job_err(r, "reserve %s: %s", cli_human(h, sizeof h, j->reserve), errmsg(ctx, rc));
        } else {
            r->reserve_freed = rc;
        }
    }
    for (int q = 0; q < j->nmod; q++) modify_tensor(ctx, sc, ji, &j->mod[q], b, r);
unpin:
    for (int i = 0; i < sc->nmodels; i++)
        if (pinned[i] && (rc = ferry_model_unpin(sc->models[i].m, -1)) < 0)
            job_err(r, "unpinning %s: %s", sc->models[i].name, errmsg(ctx, rc));
    free(pinned);
    if (r->stop) return;
    for (int e = 0; e < j->nevict; e++) {
        sim_model *sm = &sc->models[j->evict[e]];
        if ((rc = ferry_model_evict(sm->m, NULL, 0)) < 0) job_err(r, "evict %s: %s", sm->name, errmsg(ctx, rc));
    }
    if (j->verify) {
        char bad[512] = "";
        int64_t before = r->verified;
        if (j->nuse)
            for (int u = 0; u < j->nuse; u++) verify_model(ctx, &sc->models[j->use[u]], b, r, bad, sizeof bad);
        else
            for (int i = 0; i < sc->nmodels; i++) verify_model(ctx, &sc->models[i], b, r, bad, sizeof bad);
        if (r->mismatches)
            job_err(r, "verify: %" PRId64 " of %" PRId64 " tensors differ from what was written: %s%s", r->mismatches,
                    r->verified - before, bad, r->mismatches > 4 ? ", ..." : "");
    }
}

static json_t *jrange(const ferry_mem_range *m)
{
    return json_pack("{s:I,s:I,s:I}", "start", (json_int_t)m->start, "end", (json_int_t)m->end, "peak",
                     (json_int_t)m->peak);
}

static void model_tiers(sim_model *sm, uint64_t *tb)
{
    memset(tb, 0, FERRY_TIER_COUNT * sizeof *tb);
    for (int64_t t = 0; t < sm->n; t++) {
        ferry_tensor_state st;
        if (ferry_model_tensor_state(sm->m, t, &st) == 0 && (unsigned)st.tier < FERRY_TIER_COUNT)
            tb[st.tier] += st.nbytes;
    }
}

static void print_job(scenario *sc, int ji, const ferry_job_stats *js, const job_result *r, bool json)
{
    const sim_job *j = &sc->jobs[ji];
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "job", json_string(j->name));
        json_object_set_new(o, "index", json_integer(ji));
        json_object_set_new(o, "seconds", json_real(js->seconds));
        json_object_set_new(o, "rss", jrange(&js->rss));
        json_object_set_new(o, "uss", jrange(&js->uss));
        json_object_set_new(o, "pss", jrange(&js->pss));
        bool cg = js->cgroup.start || js->cgroup.end || js->cgroup.peak;
        json_object_set_new(o, "cgroup", cg ? jrange(&js->cgroup) : json_null());
        json_object_set_new(o, "device_bytes", json_integer((json_int_t)js->device_bytes));
        json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)js->pinned_bytes));
        json_object_set_new(o, "host_bytes", json_integer((json_int_t)js->host_bytes));
        json_object_set_new(o, "spill_bytes", json_integer((json_int_t)js->spill_bytes));
        json_object_set_new(o, "bytes_htod", json_integer((json_int_t)js->bytes_htod));
        json_object_set_new(o, "bytes_dtoh", json_integer((json_int_t)js->bytes_dtoh));
        json_object_set_new(o, "seconds_htod", json_real(js->seconds_htod));
        json_object_set_new(o, "seconds_dtoh", json_real(js->seconds_dtoh));
        json_object_set_new(o, "bytes_written", json_integer((json_int_t)js->bytes_written));
        json_object_set_new(o, "bytes_read", json_integer((json_int_t)js->bytes_read));
        json_object_set_new(o, "evicted", json_integer((json_int_t)js->evicted));
        json_object_set_new(o, "dropped", json_integer((json_int_t)js->dropped));
        json_object_set_new(o, "reserve", j->has_reserve ? json_integer((json_int_t)j->reserve) : json_null());
        json_object_set_new(o, "reserve_freed",
                            j->has_reserve && r->reserve_freed >= 0 ? json_integer(r->reserve_freed) : json_null());
        json_object_set_new(o, "modified", json_integer(r->modified));
        json_object_set_new(o, "modified_bytes", json_integer((json_int_t)r->modified_bytes));
        json_object_set_new(o, "verified", j->verify ? json_integer(r->verified) : json_null());
        json_object_set_new(o, "mismatches", json_integer(r->mismatches));
        json_t *ms = json_object();
        for (int i = 0; i < sc->nmodels; i++) {
            uint64_t tb[FERRY_TIER_COUNT];
            model_tiers(&sc->models[i], tb);
            json_t *mo = json_object();
            for (int t = 0; t < FERRY_TIER_COUNT; t++)
                json_object_set_new(mo, ferry_tier_name((ferry_tier)t), json_integer((json_int_t)tb[t]));
            json_object_set_new(ms, sc->models[i].name, mo);
        }
        json_object_set_new(o, "models", ms);
        json_object_set_new(o, "error", r->failed ? json_string(r->err) : json_null());
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        fflush(stdout);
        json_decref(o);
        return;
    }
    char a[32], b[32], c[32], d[32];
#define H(buf, v) cli_human(buf, sizeof buf, v)
    printf("[%d/%d] %s: %.3f s | rss %s -> %s (peak %s)", ji + 1, sc->njobs, j->name, js->seconds, H(a, js->rss.start),
           H(b, js->rss.end), H(c, js->rss.peak));
    printf(", uss %s -> %s (peak %s)", H(a, js->uss.start), H(b, js->uss.end), H(c, js->uss.peak));
    printf(", pss %s -> %s (peak %s)", H(a, js->pss.start), H(b, js->pss.end), H(c, js->pss.peak));
    if (js->cgroup.start || js->cgroup.end || js->cgroup.peak)
        printf(", cgroup %s -> %s (peak %s)", H(a, js->cgroup.start), H(b, js->cgroup.end), H(c, js->cgroup.peak));
    printf(" | device %s, pinned %s, host %s, spill %s", H(a, js->device_bytes), H(b, js->pinned_bytes),
           H(c, js->host_bytes), H(d, js->spill_bytes));
    printf(" | read %s, written %s | evicted %" PRIu64 " (%" PRIu64 " dropped)", H(a, js->bytes_read),
           H(b, js->bytes_written), js->evicted, js->dropped);
    if (j->has_reserve && r->reserve_freed >= 0)
        printf(" | reserve %s: freed %s", H(a, j->reserve), H(b, (uint64_t)r->reserve_freed));
    if (r->modified) printf(" | modified %" PRId64 " (%s)", r->modified, H(a, r->modified_bytes));
    if (j->verify) printf(" | verified %" PRId64 ", %" PRId64 " mismatches", r->verified, r->mismatches);
    if (r->failed) printf(" | ERROR: %s", r->err);
    putchar('\n');
    fflush(stdout);
#undef H
}

static void print_summary(ferry_device *dev, ferry_store *store, int njobs, int ran, int failed, bool json)
{
    ferry_store_stats st;
    if (ferry_store_get_stats(store, &st) < 0) memset(&st, 0, sizeof st);
    if (json) {
        json_t *tb = json_object();
        for (int t = 0; t < FERRY_TIER_COUNT; t++)
            json_object_set_new(tb, ferry_tier_name((ferry_tier)t), json_integer((json_int_t)st.tier_bytes[t]));
        json_t *s = json_object();
        json_object_set_new(s, "device", json_string(ferry_device_desc(dev)));
        json_object_set_new(s, "jobs", json_integer(njobs));
        json_object_set_new(s, "jobs_run", json_integer(ran));
        json_object_set_new(s, "jobs_failed", json_integer(failed));
        json_object_set_new(s, "ok", json_boolean(failed == 0 && ran == njobs));
        json_object_set_new(s, "tier_bytes", tb);
        json_object_set_new(s, "device_budget", json_integer((json_int_t)st.device_budget));
        json_object_set_new(s, "host_budget", json_integer((json_int_t)st.host_budget));
        json_object_set_new(s, "pinned_budget", json_integer((json_int_t)st.pinned_budget));
        json_object_set_new(s, "host_available", json_integer((json_int_t)st.host_available));
        json_object_set_new(s, "host_source", json_string(st.host_source));
        json_object_set_new(s, "spilling", json_boolean(st.spilling));
        json_object_set_new(s, "spill_dir", st.spill_path[0] ? json_string(st.spill_path) : json_null());
        json_object_set_new(s, "spill_file_bytes", json_integer((json_int_t)st.spill_file_bytes));
        json_object_set_new(s, "bytes_htod", json_integer((json_int_t)st.bytes_htod));
        json_object_set_new(s, "bytes_dtoh", json_integer((json_int_t)st.bytes_dtoh));
        json_object_set_new(s, "seconds_htod", json_real(st.seconds_htod));
        json_object_set_new(s, "seconds_dtoh", json_real(st.seconds_dtoh));
        json_object_set_new(s, "bytes_written", json_integer((json_int_t)st.bytes_written));
        json_object_set_new(s, "bytes_read", json_integer((json_int_t)st.bytes_read));
        json_object_set_new(s, "evicted", json_integer((json_int_t)st.evicted));
        json_object_set_new(s, "dropped", json_integer((json_int_t)st.dropped));
        json_object_set_new(s, "models", json_integer(st.models));
        json_object_set_new(s, "tensors", json_integer(st.tensors));
        json_t *o = json_pack("{s:o}", "summary", s);
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
        return;
    }
    char a[32], b[32], c[32], d[32], e[32];
#define H(buf, v) cli_human(buf, sizeof buf, v)
    printf("summary: %d of %d jobs run, %d failed, on %s | budgets: device %s, host %s (pinned %s); host available %s"
           " (%s)",
           ran, njobs, failed, ferry_device_desc(dev), H(a, st.device_budget), H(b, st.host_budget),
           H(c, st.pinned_budget), H(d, st.host_available), st.host_source);
    printf(" | now: device %s, pinned %s, host %s, spill %s, source %s", H(a, st.tier_bytes[FERRY_TIER_DEVICE]),
           H(b, st.tier_bytes[FERRY_TIER_PINNED]), H(c, st.tier_bytes[FERRY_TIER_HOST]),
           H(d, st.tier_bytes[FERRY_TIER_SPILL]), H(e, st.tier_bytes[FERRY_TIER_SOURCE]));
    printf(" | to device %s in %.3f s, from device %s in %.3f s | read %s, written %s",
           H(a, st.bytes_htod), st.seconds_htod, H(b, st.bytes_dtoh), st.seconds_dtoh, H(c, st.bytes_read),
           H(d, st.bytes_written));
    if (st.spill_path[0]) printf(" (spill file in %s: %s)", st.spill_path, H(a, st.spill_file_bytes));
    printf(" | evicted %" PRIu64 " (%" PRIu64 " dropped)%s\n", st.evicted, st.dropped,
           st.spilling ? " | spilling now" : "");
#undef H
}

static int run(int argc, char **argv)
{
    scenario sc = {0};
    bool json = false, opts = true;
    const char *dev_override = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts && cli_is_help(a)) return cli_help(&cmd_simulate);
        if (opts && strcmp(a, "--json") == 0) json = true;
        else if (opts && strcmp(a, "--") == 0) opts = false;
        else if (opts && strcmp(a, "--device") == 0) {
            if (i + 1 >= argc) return cli_usage_error(&cmd_simulate, "--device needs a value");
            dev_override = argv[++i];
        } else if (opts && a[0] == '-' && a[1]) {
            return cli_usage_error(&cmd_simulate, "unknown option '%s'", a);
        } else if (sc.path) {
            return cli_usage_error(&cmd_simulate, "one scenario at a time ('%s' and '%s')", sc.path, a);
        } else sc.path = a;
    }
    if (!sc.path) return cli_usage_error(&cmd_simulate, "missing SCENARIO.json");
    sc.device = dev_override;
    sc.o.size = sizeof sc.o;

    ferry_ctx *ctx = NULL;
    ferry_device *dev = NULL;
    ferry_store *store = NULL;
    bufs b = {0};
    int ex = parse_scenario(&sc);
    if (ex) goto out;
    if (ferry_ctx_new(NULL, &ctx) < 0) {
        ex = cli_fail("%s", ferry_ctx_errmsg(NULL));
        goto out;
    }
    if ((ex = open_models(&sc, ctx)) || (ex = resolve_mods(&sc))) goto out;
    int rc = ferry_device_open(ctx, sc.device, &dev);
    if (rc < 0) {
        if (rc == FERRY_E_INVAL)
            ex = scen_err(&sc, dev_override ? "--device" : "device", "%s", errmsg(ctx, rc));
        else
            ex = cli_fail_ctx(ctx, rc);
        goto out;
    }
    if ((rc = ferry_store_new(dev, &sc.o, &store)) < 0) {
        ex = rc == FERRY_E_INVAL ? scen_err(&sc, NULL, "%s", errmsg(ctx, rc)) : cli_fail_ctx(ctx, rc);
        goto out;
    }
    ferry_store_stats st0;
    if (ferry_store_get_stats(store, &st0) == 0 && st0.device_budget == 0) {
        uint64_t fr = 0, tot = 0;
        char h[32];
        ferry_device_mem_info(dev, &fr, &tot);
        fprintf(stderr,
                "ferry simulate: warning: the device budget is 0 (%s free on %s, less device_reserve): set "
                "\"device_budget\" or \"device_reserve\"\n",
                cli_human(h, sizeof h, fr), ferry_device_desc(dev));
    }
    uint64_t maxb = 1;
    for (int i = 0; i < sc.nmodels; i++) {
        sim_model *sm = &sc.models[i];
        if ((rc = ferry_store_add(store, sm->name, sm->files, sm->npaths, sm->priority, &sm->m)) < 0) {
            ex = cli_fail("%s: models.%s: %s", sc.path, sm->name, errmsg(ctx, rc));
            goto out;
        }
        if (sm->maxbytes > maxb) maxb = sm->maxbytes;
    }
    b.bn = 8u << 20;
    b.a = malloc((size_t)maxb);
    b.b = malloc(b.bn);
    if (!b.a || !b.b) {
        ex = cli_fail("out of memory (a buffer for the largest tensor, %" PRIu64 " bytes)", maxb);
        goto out;
    }

    int ran = 0, failed = 0;
    for (int ji = 0; ji < sc.njobs; ji++) {
        job_result r = {.reserve_freed = -1};
        ferry_job_stats js;
        memset(&js, 0, sizeof js);
        if ((rc = ferry_store_job_begin(store, sc.jobs[ji].name)) < 0) {
            job_err(&r, "starting the job: %s", errmsg(ctx, rc));
            r.stop = true;
        } else {
            run_steps(ctx, store, &sc, ji, &b, &r);
            if ((rc = ferry_store_job_end(store, &js)) < 0) job_err(&r, "ending the job: %s", errmsg(ctx, rc));
        }
        ran++;
        failed += r.failed;
        print_job(&sc, ji, &js, &r, json);
        if (r.stop) break;
    }
    print_summary(dev, store, sc.njobs, ran, failed, json);
    ex = failed || ran < sc.njobs ? EXIT_FAIL : EXIT_OK;
out:
    free(b.a);
    free(b.b);
    ferry_store_free(store);
    free_scenario(&sc);
    ferry_device_close(dev);
    ferry_ctx_free(ctx);
    return ex;
}
