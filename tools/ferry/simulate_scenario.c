/* SPDX-License-Identifier: Apache-2.0 */
/* simulate_scenario.c - `ferry simulate`'s scenario file: its JSON read and
 * every key checked into the scenario structs, with one-line messages that
 * name the file and the key; then the checkpoints opened, "modify"'s tensor
 * names looked up in them and the blocks of the models a job runs found. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "simulate.h"

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
    json_object_foreach(obj, k, v)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, k) == 0;
        if (!ok) {
            char known[256] = "";
            for (const char *const *a = allowed; *a; a++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         a == allowed ? "" : ", ", *a);
            if (key && *key) return sim_scen_err(sc, key, "unknown key \"%s\" (known: %s)", k, known);
            return sim_scen_err(sc, NULL, "unknown key \"%s\" (known: %s)", k, known);
        }
    }
    return 0;
}

static int get_size(const scenario *sc, const json_t *v, const char *key, uint64_t *out)
{
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0)
            return sim_scen_err(sc, key, "a size cannot be negative (%" JSON_INTEGER_FORMAT ")",
                                json_integer_value(v));
        *out = (uint64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        if (ferry_parse_size(json_string_value(v), out) < 0)
            return sim_scen_err(sc, key, "bad size \"%s\" (expected e.g. \"4096\", \"16MiB\", \"1.5GB\")",
                                json_string_value(v));
        return 0;
    }
    return sim_scen_err(sc, key, "expected a size (a string such as \"2GiB\", or a byte count), not %s",
                        jtype(v));
}

static int find_model(const scenario *sc, const char *name)
{
    for (int i = 0; i < sc->nmodels; i++)
        if (strcmp(sc->models[i].name, name) == 0) return i;
    return -1;
}

static int model_ref(const scenario *sc, const json_t *v, const char *key, int *out)
{
    if (!json_is_string(v))
        return sim_scen_err(sc, key, "expected a model name (a string), not %s", jtype(v));
    int i = find_model(sc, json_string_value(v));
    if (i < 0) {
        char known[512] = "";
        for (int k = 0; k < sc->nmodels; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                     sc->models[k].name);
        return sim_scen_err(sc, key, "no model called \"%s\" in \"models\" (there: %s)", json_string_value(v),
                            known);
    }
    *out = i;
    return 0;
}

/* A list of model names into a fresh array. */
static int model_list(const scenario *sc, const json_t *v, const char *key, int **out, int *n)
{
    if (!json_is_array(v)) return sim_scen_err(sc, key, "expected a list of model names, not %s", jtype(v));
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
        json_t *p = json_object_get(v, "path"), *ps = json_object_get(v, "paths"),
               *pr = json_object_get(v, "priority");
        char k[200];
        if (p && ps) return sim_scen_err(sc, key, "give \"path\" or \"paths\", not both");
        if (!p && !ps)
            return sim_scen_err(sc, key, "needs \"path\" (a checkpoint) or \"paths\" (a list of them)");
        if (p && !json_is_string(p)) {
            snprintf(k, sizeof k, "%.150s.path", key);
            return sim_scen_err(sc, k, "expected a path (a string), not %s", jtype(p));
        }
        if (ps && (!json_is_array(ps) || json_array_size(ps) == 0)) {
            snprintf(k, sizeof k, "%.150s.paths", key);
            return sim_scen_err(sc, k, "expected a non-empty list of paths");
        }
        if (pr) {
            snprintf(k, sizeof k, "%.150s.priority", key);
            if (!json_is_integer(pr) || json_integer_value(pr) < -1000000 || json_integer_value(pr) > 1000000)
                return sim_scen_err(sc, k, "expected an integer from -1000000 to 1000000");
            sm->priority = (int)json_integer_value(pr);
        }
        paths = p ? json_pack("[O]", p) : json_incref(ps);
    } else {
        return sim_scen_err(
            sc, key, "expected a checkpoint path or {\"path\": ..., \"priority\": ...}, not %s", jtype(v));
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
            return sim_scen_err(sc, k, "expected a path (a non-empty string), not %s", jtype(p));
        }
        if (!(sm->paths[i] = resolve(sc->path, json_string_value(p)))) {
            json_decref(paths);
            return cli_fail("out of memory");
        }
    }
    json_decref(paths);
    return 0;
}

/* "25GB/s": a size per second, above 0. */
static bool parse_rate(const char *t, double *out)
{
    size_t n = strlen(t);
    char buf[64];
    uint64_t b = 0;
    if (n <= 2 || n >= sizeof buf || strcmp(t + n - 2, "/s") != 0) return false;
    memcpy(buf, t, n - 2);
    buf[n - 2] = '\0';
    if (ferry_parse_size(buf, &b) < 0 || b == 0) return false;
    *out = (double)b;
    return true;
}

/* A rate: "25GB/s" or a number of bytes per second. */
static int get_rate(const scenario *sc, const json_t *v, const char *key, double *out)
{
    if (json_is_integer(v) && json_integer_value(v) > 0) {
        *out = (double)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v) && parse_rate(json_string_value(v), out)) return 0;
    return sim_scen_err(sc, key,
                        "expected a copy rate above 0 (a string such as \"25GB/s\", or bytes per second) or "
                        "\"probe\"");
}

/* "blocks" absent is "auto". */
static bool same_blocks(const json_t *a, const json_t *b)
{
    json_t *aut = json_string("auto");
    bool same = json_equal(a ? a : aut, b ? b : aut);
    json_decref(aut);
    return same;
}

static int parse_run(scenario *sc, sim_job *j, json_t *v, const char *key)
{
    static const char *const keys[] = {"model",    "steps",        "block_ms", "blocks",
                                       "prefetch", "pinned_cache", NULL};
    char k[400];
    if (!json_is_object(v))
        return sim_scen_err(
            sc, key, "expected {\"model\": NAME, \"steps\": N, \"block_ms\": MS, ...}, not %s", jtype(v));
    int ex = check_keys(sc, v, key, keys);
    if (ex) return ex;
    sim_run *r = &j->run;
    *r = (sim_run){.steps = 1, .prefetch = 2, .pinned_cache = true};
    json_t *x = json_object_get(v, "model");
    snprintf(k, sizeof k, "%.300s.model", key);
    if (!x) return sim_scen_err(sc, key, "needs \"model\": the model whose blocks the passes run");
    if ((ex = model_ref(sc, x, k, &r->model))) return ex;
    if ((x = json_object_get(v, "steps"))) {
        snprintf(k, sizeof k, "%.300s.steps", key);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 1000000)
            return sim_scen_err(sc, k, "expected a number of passes from 1 to 1000000");
        r->steps = json_integer_value(x);
    }
    if ((x = json_object_get(v, "block_ms"))) {
        snprintf(k, sizeof k, "%.300s.block_ms", key);
        if (!json_is_number(x) || !isfinite(json_number_value(x)) || json_number_value(x) < 0 ||
            json_number_value(x) > 60000)
            return sim_scen_err(sc, k, "expected the milliseconds one block computes, from 0 to 60000%s",
                                json_is_number(x) && json_number_value(x) < 0 ? " (it is negative)" : "");
        r->block_ms = json_number_value(x);
    }
    if ((x = json_object_get(v, "prefetch"))) {
        snprintf(k, sizeof k, "%.300s.prefetch", key);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000)
            return sim_scen_err(sc, k,
                                "expected the blocks queued ahead of the one computing, from 0 to 1000");
        r->prefetch = json_integer_value(x);
    }
    if ((x = json_object_get(v, "pinned_cache"))) {
        snprintf(k, sizeof k, "%.300s.pinned_cache", key);
        if (!json_is_boolean(x)) return sim_scen_err(sc, k, "expected true or false, not %s", jtype(x));
        r->pinned_cache = json_is_true(x);
    }
    x = json_object_get(v, "blocks");
    snprintf(k, sizeof k, "%.300s.blocks", key);
    if (x && !(json_is_string(x) && *json_string_value(x)) && !(json_is_array(x) && json_array_size(x)))
        return sim_scen_err(sc, k,
                            "expected \"auto\", a name prefix such as \"blocks.\" or a list of them, not %s",
                            jtype(x));
    for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++) {
        json_t *e = json_array_get(x, i);
        if (!json_is_string(e) || !*json_string_value(e) || strcmp(json_string_value(e), "auto") == 0) {
            snprintf(k, sizeof k, "%.300s.blocks[%zu]", key, i);
            return sim_scen_err(sc, k,
                                "expected a name prefix such as \"blocks.\" (a non-empty string; \"auto\" "
                                "stands alone), not %s",
                                jtype(e));
        }
    }
    /* a model's blocks become its groups, which can only be joined, never
     * split again: every run of one model must name the same blocks */
    sim_model *sm = &sc->models[r->model];
    if (sm->blocks_key && !same_blocks(sm->blocks_spec, x))
        return sim_scen_err(sc, k,
                            "model \"%s\" is run with other blocks in %s: every run of a model must give the "
                            "same \"blocks\"",
                            sm->name, sm->blocks_key);
    if (!sm->blocks_key) {
        sm->blocks_spec = x;
        if (!(sm->blocks_key = strdup(k))) return cli_fail("out of memory");
    }
    j->has_run = true;
    return 0;
}

static int parse_job(scenario *sc, int ji, json_t *v)
{
    static const char *const keys[] = {"name", "use", "reserve", "modify", "run", "evict", "verify", NULL};
    sim_job *j = &sc->jobs[ji];
    char key[160], k[320];
    snprintf(key, sizeof key, "jobs[%d]", ji);
    snprintf(j->defname, sizeof j->defname, "job %d", ji + 1);
    j->name = j->defname;
    if (!json_is_object(v)) return sim_scen_err(sc, key, "expected a job (an object), not %s", jtype(v));
    int ex = check_keys(sc, v, key, keys);
    if (ex) return ex;
    json_t *x;
    if ((x = json_object_get(v, "name"))) {
        if (!json_is_string(x) || !*json_string_value(x))
            return sim_scen_err(sc, key, "\"name\" must be a non-empty string, not %s", jtype(x));
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
            return sim_scen_err(sc, k, "expected true or false, not %s", jtype(x));
        }
        j->verify = json_is_true(x);
    }
    if ((x = json_object_get(v, "run"))) {
        snprintf(k, sizeof k, "%.150s.run", key);
        if ((ex = parse_run(sc, j, x, k))) return ex;
    }
    if ((x = json_object_get(v, "modify"))) {
        snprintf(k, sizeof k, "%.150s.modify", key);
        if (!json_is_object(x))
            return sim_scen_err(sc, k, "expected {model: [tensor, ...]}, not %s", jtype(x));
        const char *mname;
        json_t *list;
        size_t total = 0;
        json_object_foreach(x, mname, list) total += json_is_array(list) ? json_array_size(list) : 0;
        j->mod = calloc(total ? total : 1, sizeof *j->mod);
        if (!j->mod) return cli_fail("out of memory");
        json_object_foreach(x, mname, list)
        {
            char mk[400];
            snprintf(mk, sizeof mk, "%s.%s", k, mname);
            int mi = find_model(sc, mname);
            if (mi < 0) {
                json_t *s = json_string(mname);
                ex = model_ref(sc, s, mk, &mi);
                json_decref(s);
                return ex ? ex : EXIT_USAGE;
            }
            if (!json_is_array(list))
                return sim_scen_err(sc, mk, "expected a list of tensor names, not %s", jtype(list));
            for (size_t i = 0; i < json_array_size(list); i++) {
                json_t *tn = json_array_get(list, i);
                if (!json_is_string(tn)) {
                    char tk[448];
                    snprintf(tk, sizeof tk, "%s[%zu]", mk, i);
                    return sim_scen_err(sc, tk, "expected a tensor name (a string), not %s", jtype(tn));
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
        json_t *mods =
            json_object_get(json_array_get(json_object_get(sc->root, "jobs"), (size_t)ji), "modify");
        const char *mname;
        json_t *list;
        int q = 0;
        json_object_foreach(mods, mname, list)
        {
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
                    return sim_scen_err(sc, k, "model \"%s\" has no tensor \"%s\" (%s%s)", mname, tn,
                                        sm->paths[0], sm->npaths > 1 ? " and the other files" : "");
                }
            }
        }
    }
    return 0;
}

int sim_scenario_parse(scenario *sc)
{
    static const char *const keys[] = {
        "device",       "device_budget", "device_reserve", "host_budget", "pinned_budget",
        "host_reserve", "spill_below",   "spill_above",    "spill_dir",   "copy_rate",
        "models",       "jobs",          "pinned_reserve", NULL};
    json_error_t je;
    sc->root = json_load_file(sc->path, JSON_REJECT_DUPLICATES, &je);
    if (!sc->root) {
        if (je.line > 0) {
            fprintf(stderr, "ferry simulate: %s:%d:%d: %s\n", sc->path, je.line, je.column, je.text);
            return EXIT_USAGE;
        }
        return sim_scen_err(sc, NULL, "%s", je.text);
    }
    if (!json_is_object(sc->root))
        return sim_scen_err(sc, NULL, "expected a JSON object, not %s", jtype(sc->root));
    int ex = check_keys(sc, sc->root, NULL, keys);
    if (ex) return ex;
    json_t *x;
    if ((x = json_object_get(sc->root, "device"))) {
        if (!json_is_string(x))
            return sim_scen_err(sc, "device", "expected a device (cuda:N, sim:SIZE, cpu), not %s", jtype(x));
        if (!sc->device) sc->device = json_string_value(x);
    }
    struct {
        const char *k;
        uint64_t *p;
    } sizes[] = {{"device_budget", &sc->o.device_budget}, {"device_reserve", &sc->o.device_reserve},
                 {"host_budget", &sc->o.host_budget},     {"pinned_budget", &sc->o.pinned_budget},
                 {"host_reserve", &sc->o.host_reserve},   {"spill_below", &sc->o.spill_below},
                 {"spill_above", &sc->o.spill_above},     {"pinned_reserve", &sc->o.pinned_reserve}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if ((x = json_object_get(sc->root, sizes[i].k)) && (ex = get_size(sc, x, sizes[i].k, sizes[i].p)))
            return ex;
    if ((x = json_object_get(sc->root, "spill_dir"))) {
        if (!json_is_string(x) || !*json_string_value(x))
            return sim_scen_err(sc, "spill_dir", "expected a directory (a non-empty string), not %s",
                                jtype(x));
        sc->o.spill_dir = json_string_value(x);
    } else {
        /* the library reads no environment: the CLI passes the default on */
        const char *env = getenv("FERRY_SPILL_DIR");
        if (env && *env) sc->o.spill_dir = env;
    }
    if ((x = json_object_get(sc->root, "copy_rate"))) {
        if (json_is_string(x) && strcmp(json_string_value(x), "probe") == 0) sc->probe_rate = true;
        else if ((ex = get_rate(sc, x, "copy_rate", &sc->copy_rate))) return ex;
    }
    x = json_object_get(sc->root, "models");
    if (!x) return sim_scen_err(sc, NULL, "no \"models\": give {name: checkpoint path, ...}");
    if (!json_is_object(x) || json_object_size(x) == 0)
        return sim_scen_err(sc, "models", "expected {name: checkpoint path, ...} with at least one model");
    sc->nmodels = (int)json_object_size(x);
    sc->models = calloc((size_t)sc->nmodels, sizeof *sc->models);
    if (!sc->models) return cli_fail("out of memory");
    const char *name;
    json_t *mv;
    int mi = 0;
    json_object_foreach(x, name, mv)
    {
        char k[200];
        snprintf(k, sizeof k, "models.%.140s", name);
        if (!*name) return sim_scen_err(sc, "models", "a model needs a non-empty name");
        sc->models[mi].name = name;
        if ((ex = parse_model(sc, &sc->models[mi], mv, k))) return ex;
        mi++;
    }
    x = json_object_get(sc->root, "jobs");
    if (!x) return sim_scen_err(sc, NULL, "no \"jobs\": give a list of {\"name\", \"use\", ...}");
    if (!json_is_array(x)) return sim_scen_err(sc, "jobs", "expected a list of jobs, not %s", jtype(x));
    sc->njobs = (int)json_array_size(x);
    sc->jobs = calloc((size_t)(sc->njobs ? sc->njobs : 1), sizeof *sc->jobs);
    if (!sc->jobs) return cli_fail("out of memory");
    for (int i = 0; i < sc->njobs; i++)
        if ((ex = parse_job(sc, i, json_array_get(x, (size_t)i)))) return ex;
    if (!sc->device)
        return sim_scen_err(sc, NULL, "no device: give \"device\" (e.g. \"sim:24GiB\") or --device");
    /* a sim device's modelled rate is the one its copies keep to */
    const char *comma = strncmp(sc->device, "sim:", 4) == 0 ? strchr(sc->device, ',') : NULL;
    double rate = 0;
    if (comma && parse_rate(comma + 1, &rate)) { /* a bad one: the device's open says why */
        sc->copy_rate = rate;
        sc->probe_rate = false;
    }
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
                return sim_scen_err(sc, k, "%s", *msg ? msg : ferry_strerror(rc));
            }
            sm->first[f] = sm->n;
            int64_t cnt = ferry_file_tensor_count(sm->files[f]);
            for (int64_t t = 0; t < cnt; t++) {
                ferry_tensor_info ti = {.size = sizeof ti};
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

int sim_scenario_open(scenario *sc, ferry_ctx *ctx)
{
    int ex = open_models(sc, ctx);
    if (!ex) ex = resolve_mods(sc);
    for (int i = 0; i < sc->nmodels && !ex; i++)
        if (sc->models[i].blocks_key)
            ex = sim_find_blocks(sc, &sc->models[i], sc->models[i].blocks_spec, sc->models[i].blocks_key);
    return ex;
}

void sim_scenario_free(scenario *sc)
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
        free(sm->blocks_key);
        free(sm->block_first);
        free(sm->block_tensors);
        free(sm->block_bytes);
        free(sm->fixed);
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
