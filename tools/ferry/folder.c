/* SPDX-License-Identifier: Apache-2.0 */
/* folder.c - a Hugging Face / diffusers model folder as the checkpoints in it
 * (which file of a component folder is its checkpoint; see folder.h). */
#define _GNU_SOURCE
#include "folder.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The names python/ferry/diffusers.py's weights_file looks for, in its order,
 * then transformers' name for a .bin checkpoint. */
static const struct {
    const char *stem, *ext;
} known[] = {
    {"diffusion_pytorch_model", "safetensors"},
    {"model", "safetensors"},
    {"diffusion_pytorch_model", "bin"},
    {"model", "bin"},
    {"pytorch_model", "bin"},
};
static const char *const ckpt_ends[] = {".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt"};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef struct names {
    char **v;
    int n;
} names;

static void names_free(names *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL, l->n = 0;
}

static bool names_add(names *l, const char *s)
{
    char **nv = realloc(l->v, (size_t)(l->n + 1) * sizeof *nv);
    if (!nv) return false;
    l->v = nv;
    if (!(l->v[l->n] = strdup(s))) return false;
    l->n++;
    return true;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool names_has(const names *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i], s) == 0) return true;
    return false;
}

/* "a, b, c" into buf */
static const char *names_join(const names *l, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", l->v[i]);
    return buf;
}

static char *join(const char *dir, const char *name)
{
    char *p;
    size_t l = strlen(dir);
    bool slash = l && dir[l - 1] == '/';
    return asprintf(&p, "%s%s%s", dir, slash ? "" : "/", name) < 0 ? NULL : p;
}

bool cli_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The regular files of dir (symlinks followed, as in a Hugging Face cache),
 * or the directories when dirs; sorted. -errno on failure. */
static int list(const char *dir, bool dirs, names *out)
{
    DIR *d = opendir(dir);
    if (!d) return -errno;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = join(dir, e->d_name);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        bool want = dirs ? cli_is_dir(p) : is_file(p);
        free(p);
        if (want && !names_add(out, e->d_name)) {
            rc = -ENOMEM;
            break;
        }
    }
    closedir(d);
    if (rc) names_free(out);
    else if (out->n) qsort(out->v, (size_t)out->n, sizeof *out->v, by_name);
    return rc;
}

/* The variant of name if it is STEM.VARIANT.EXT or STEM.EXT.index.VARIANT.json
 * (diffusers' variant names), copied to v; else false. */
static bool variant_of(const char *name, const char *stem, const char *ext, char *v, size_t vn)
{
    size_t sl = strlen(stem), el = strlen(ext), nl = strlen(name);
    if (strncmp(name, stem, sl) || name[sl] != '.') return false;
    const char *r = name + sl + 1; /* VARIANT.EXT or EXT.index.VARIANT.json */
    size_t rl = nl - sl - 1, vl;
    const char *vs;
    if (strncmp(r, ext, el) == 0 && strncmp(r + el, ".index.", 7) == 0 && cli_ends_with(r, ".json")) {
        vs = r + el + 7;
        vl = rl - el - 7 >= 5 ? rl - el - 7 - 5 : 0;
    } else if (rl > el + 1 && r[rl - el - 1] == '.' && strcmp(r + rl - el, ext) == 0) {
        vs = r;
        vl = rl - el - 1;
    } else {
        return false;
    }
    if (vl == 0 || vl >= vn || memchr(vs, '.', vl)) return false;
    memcpy(v, vs, vl);
    v[vl] = '\0';
    return true;
}

enum { PICKED, NONE, SEVERAL };

/* The checkpoint of the folder dir, whose files are fs (folder.h gives the
 * order): PICKED with *path (and maybe *note: how it was picked), NONE, or
 * SEVERAL with *note naming them; -ENOMEM. */
static int pick(const char *dir, const names *fs, char **path, char **note)
{
    char buf[1024], list_buf[768], v[128];
    *path = *note = NULL;
    const char *hit = NULL;
    names vars = {0};
    /* the plain names, noting the variants passed over */
    for (size_t k = 0; k < COUNT(known) && !hit; k++) {
        const char *stem = known[k].stem, *ext = known[k].ext;
        char idx[128], one[128];
        snprintf(idx, sizeof idx, "%s.%s.index.json", stem, ext);
        snprintf(one, sizeof one, "%s.%s", stem, ext);
        hit = names_has(fs, idx) ? idx : names_has(fs, one) ? one : NULL;
        for (int i = 0; hit && i < fs->n; i++)
            if (variant_of(fs->v[i], stem, ext, v, sizeof v) && !names_has(&vars, v) && !names_add(&vars, v))
                goto oom;
        if (hit) {
            if (!(*path = join(dir, hit))) goto oom;
            if (vars.n) {
                snprintf(buf, sizeof buf, "the plain file, over the variant%s %s", vars.n > 1 ? "s" : "",
                         names_join(&vars, list_buf, sizeof list_buf));
                if (!(*note = strdup(buf))) goto oom;
            }
            names_free(&vars);
            return PICKED;
        }
    }
    /* no plain name: the first variant (an index before a single file) */
    for (size_t k = 0; k < COUNT(known); k++) {
        const char *stem = known[k].stem, *ext = known[k].ext;
        for (int i = 0; i < fs->n; i++)
            if (variant_of(fs->v[i], stem, ext, v, sizeof v) && !names_has(&vars, v) && !names_add(&vars, v))
                goto oom;
        if (!vars.n) continue;
        qsort(vars.v, (size_t)vars.n, sizeof *vars.v, by_name);
        char idx[256], one[256];
        snprintf(idx, sizeof idx, "%s.%s.index.%s.json", stem, ext, vars.v[0]);
        snprintf(one, sizeof one, "%s.%s.%s", stem, vars.v[0], ext);
        if (!(*path = join(dir, names_has(fs, idx) ? idx : one))) goto oom;
        snprintf(buf, sizeof buf, "the %s variant: no plain %s.%s%s%s", vars.v[0], stem, ext,
                 vars.n > 1 ? "; variants: " : "",
                 vars.n > 1 ? names_join(&vars, list_buf, sizeof list_buf) : "");
        names_free(&vars);
        return (*note = strdup(buf)) ? PICKED : -ENOMEM;
    }
    /* any other name: the one index, else the one checkpoint file */
    names idxs = {0}, ckpts = {0};
    for (int i = 0; i < fs->n; i++) {
        bool ck = false;
        for (size_t k = 0; k < COUNT(ckpt_ends); k++) ck |= cli_ends_with(fs->v[i], ckpt_ends[k]);
        if (cli_ends_with(fs->v[i], ".safetensors.index.json") ? !names_add(&idxs, fs->v[i])
                                                               : ck && !names_add(&ckpts, fs->v[i])) {
            names_free(&idxs), names_free(&ckpts);
            return -ENOMEM;
        }
    }
    const names *from = idxs.n ? &idxs : &ckpts;
    int rc = from->n == 0 ? NONE : from->n > 1 ? SEVERAL : PICKED;
    if (rc == PICKED && !(*path = join(dir, from->v[0]))) rc = -ENOMEM;
    if (rc == SEVERAL && !(*note = strdup(names_join(from, buf, sizeof buf)))) rc = -ENOMEM;
    names_free(&idxs), names_free(&ckpts);
    return rc;
oom:
    names_free(&vars);
    free(*path);
    *path = NULL;
    return -ENOMEM;
}

static int add(cli_folder *f, const char *name, char *path, char *note)
{
    cli_component *nc = realloc(f->c, (size_t)(f->n + 1) * sizeof *nc);
    char *nm = strdup(name);
    if (!nc || !nm) {
        if (nc) f->c = nc;
        free(nm), free(path), free(note);
        return -ENOMEM;
    }
    f->c = nc;
    f->c[f->n++] = (cli_component){nm, path, note};
    return 0;
}

/* dir's checkpoint, as a component called name (path NULL and a note when none) */
static int add_picked(cli_folder *f, const char *name, const char *dir)
{
    names fs = {0};
    char *path, *note;
    int rc = list(dir, false, &fs);
    if (rc < 0) return rc;
    rc = pick(dir, &fs, &path, &note);
    names_free(&fs);
    if (rc < 0) return rc;
    if (rc == SEVERAL) {
        char *n2;
        rc = asprintf(&n2, "several checkpoints (%s): none picked", note);
        free(note);
        if (rc < 0) return -ENOMEM;
        note = n2;
    } else if (rc == NONE) {
        note = strdup("no weights");
        if (!note) return -ENOMEM;
    }
    return add(f, name, path, note);
}

/* the components model_index.json (mi) names */
static int from_model_index(const cli_cmd *cmd, const char *dir, const char *mi, cli_folder *out)
{
    json_error_t je;
    json_t *root = json_load_file(mi, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return root ? cli_fail("%s: not a JSON object: not a diffusers model_index.json", mi)
                    : cli_fail("%s: not valid JSON: %s (line %d)", mi, je.text, je.line);
    }
    names comps = {0};
    const char *k;
    json_t *v;
    int rc = 0;
    /* diffusers: "name": [library, class]; "_..." are not components, and a
     * name is one subfolder (no "/", none above the folder) */
    json_object_foreach(root, k, v) if (k[0] != '_' && k[0] != '.' && k[0] && !strchr(k, '/') &&
                                        json_is_array(v) && !names_add(&comps, k)) rc = -ENOMEM;
    json_decref(root);
    if (comps.n) qsort(comps.v, (size_t)comps.n, sizeof *comps.v, by_name);
    int with = 0;
    for (int i = 0; i < comps.n && rc == 0; i++) {
        char *sub = join(dir, comps.v[i]);
        if (!sub) rc = -ENOMEM;
        else if (!cli_is_dir(sub)) {
            char *note = strdup("no such folder");
            rc = note ? add(out, comps.v[i], NULL, note) : -ENOMEM;
        } else {
            rc = add_picked(out, comps.v[i], sub);
            if (rc == 0 && out->c[out->n - 1].path) with++;
            if (rc > 0 || rc == -ENOENT || rc == -ENOTDIR) rc = 0;
        }
        if (rc < 0 && rc != -ENOMEM) rc = cli_fail("%s: %s", sub, strerror(-rc));
        free(sub);
    }
    names_free(&comps);
    if (rc == -ENOMEM) rc = cli_fail("out of memory");
    if (rc == 0 && with == 0)
        rc = cli_usage_error(cmd, "%s: its model_index.json names no component folder holding a checkpoint",
                             dir);
    if (rc) cli_folder_free(out);
    return rc;
}

int cli_folder_open(const cli_cmd *cmd, const char *dir, cli_folder *out)
{
    memset(out, 0, sizeof *out);
    char *mi = join(dir, "model_index.json");
    if (!mi) return cli_fail("out of memory");
    if (is_file(mi)) {
        int rc = from_model_index(cmd, dir, mi, out);
        free(mi);
        return rc;
    }
    free(mi);
    names fs = {0};
    char *path = NULL, *note = NULL;
    int rc = list(dir, false, &fs);
    if (rc == 0) rc = pick(dir, &fs, &path, &note);
    names_free(&fs);
    if (rc == -ENOMEM) return cli_fail("out of memory");
    if (rc < 0) return cli_fail("%s: %s", dir, strerror(-rc));
    if (rc == NONE)
        return cli_usage_error(cmd,
                               "%s: a folder without model_index.json or a checkpoint (.safetensors, "
                               "*.safetensors.index.json, .gguf, .bin, .pt, .pth, .ckpt)",
                               dir);
    if (rc == SEVERAL) {
        rc = cli_usage_error(cmd, "%s holds several checkpoints (%s): name one of them", dir, note);
        free(note);
        return rc;
    }
    return add(out, ".", path, note) < 0 ? cli_fail("out of memory") : 0;
}

void cli_folder_free(cli_folder *f)
{
    for (int i = 0; i < f->n; i++) free(f->c[i].name), free(f->c[i].path), free(f->c[i].note);
    free(f->c);
    f->c = NULL, f->n = 0;
}
