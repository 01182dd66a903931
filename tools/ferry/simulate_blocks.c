/* SPDX-License-Identifier: Apache-2.0 */
/* simulate_blocks.c - a model's repeated blocks found by its tensors' names,
 * for `ferry simulate`'s "run": tensors called PREFIX.N.rest ("blocks.3.",
 * "transformer_blocks.3.", "model.layers.3.") form block N of PREFIX. "auto"
 * takes the prefix whose numbered tensors hold the most bytes, so a block's
 * own numbered parts ("blocks.3.mlp.0.") never win over the blocks. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "simulate.h"

/* A numbered component: the tensor, where its prefix ends, the number. */
typedef struct numbered {
    const char *name;
    size_t plen;
    uint64_t num;
    uint64_t bytes;
    int64_t t;
} numbered;

/* The number of name[at..] when it is digits followed by '.', else -1. */
static int64_t number_at(const char *name, size_t at)
{
    uint64_t v = 0;
    size_t i = at;
    for (; name[i] >= '0' && name[i] <= '9'; i++) {
        if (i - at >= 18) return -1; /* no block count is that long */
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    return i > at && name[i] == '.' ? (int64_t)v : -1;
}

static int cmp_numbered(const void *a, const void *b)
{
    const numbered *x = a, *y = b;
    size_t n = x->plen < y->plen ? x->plen : y->plen;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    if (x->plen != y->plen) return x->plen < y->plen ? -1 : 1;
    if (x->num != y->num) return x->num < y->num ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* The best prefix for "auto": the one with the most bytes among those with
 * at least two numbers. */
typedef struct best {
    const char *name;
    size_t plen;
    uint64_t bytes;
    int64_t blocks;
} best;

static best best_prefix(numbered *e, int64_t ne)
{
    best b = {0};
    qsort(e, (size_t)ne, sizeof *e, cmp_numbered);
    for (int64_t i = 0; i < ne;) {
        int64_t j = i, distinct = 0;
        uint64_t bytes = 0;
        for (; j < ne && e[j].plen == e[i].plen && memcmp(e[j].name, e[i].name, e[i].plen) == 0; j++) {
            distinct += j == i || e[j].num != e[j - 1].num;
            bytes += e[j].bytes;
        }
        if (distinct >= 2 && bytes > b.bytes) b = (best){e[i].name, e[i].plen, bytes, distinct};
        i = j;
    }
    return b;
}

/* Which block of prefixes[] tensor name is in: *pi and *num, or false. */
static bool match(const char *name, const char *const *prefixes, int np, int *pi, uint64_t *num, int *second)
{
    bool found = false;
    *second = -1;
    for (int p = 0; p < np; p++) {
        size_t l = strlen(prefixes[p]);
        int64_t v = strncmp(name, prefixes[p], l) == 0 ? number_at(name, l) : -1;
        if (v < 0) continue;
        if (found) {
            *second = p;
            return true;
        }
        found = true;
        *pi = p;
        *num = (uint64_t)v;
    }
    return found;
}

int sim_find_blocks(const scenario *sc, sim_model *sm, const json_t *spec, const char *key)
{
    int ex = EXIT_FAIL;
    int64_t n = sm->n;
    const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    uint64_t *bytes = calloc((size_t)(n ? n : 1), sizeof *bytes);
    numbered *e = NULL;
    int64_t ne = 0, cap = 0;
    const char **prefixes = NULL;
    int np = 0;
    char hint[400] = "", h1[32], h2[32];
    if (!names || !bytes) goto oom;
    uint64_t total = 0;
    for (int f = 0; f < sm->npaths; f++) {
        int64_t cnt = ferry_file_tensor_count(sm->files[f]);
        for (int64_t i = 0; i < cnt; i++) {
            ferry_tensor_info ti = {.size = sizeof ti};
            if (ferry_file_tensor_info(sm->files[f], i, &ti) < 0) continue; /* cannot happen: i < count */
            names[sm->first[f] + i] = ti.name;
            bytes[sm->first[f] + i] = ti.nbytes;
            total += ti.nbytes;
        }
    }
    /* every numbered component of every name, after a non-empty prefix */
    for (int64_t t = 0; t < n; t++) {
        const char *nm = names[t] ? names[t] : "";
        for (const char *d = strchr(nm, '.'); d; d = strchr(d + 1, '.')) {
            int64_t v = number_at(nm, (size_t)(d + 1 - nm));
            if (v < 0) continue;
            if (ne == cap) {
                cap = cap ? 2 * cap : 256;
                numbered *g = realloc(e, (size_t)cap * sizeof *e);
                if (!g) goto oom;
                e = g;
            }
            e[ne++] = (numbered){nm, (size_t)(d + 1 - nm), (uint64_t)v, bytes[t], t};
        }
    }
    best b = best_prefix(e, ne);
    if (b.blocks)
        snprintf(hint, sizeof hint, "\"%.*s\" has the most: %" PRId64 " %s, %s of %s",
                 (int)(b.plen > 200 ? 200 : b.plen), b.name, b.blocks,
                 cli_plural(b.blocks, "block", "blocks"), cli_human(h1, sizeof h1, b.bytes),
                 cli_human(h2, sizeof h2, total));
    else snprintf(hint, sizeof hint, "no name has a numbered component after a prefix (like \"blocks.3.\")");

    bool is_auto = !spec || (json_is_string(spec) && strcmp(json_string_value(spec), "auto") == 0);
    char *auto_prefix = NULL;
    if (is_auto) {
        /* half the bytes: a model whose numbered parts are a small part of it
         * (t_embedder.mlp.0, .2) has no blocks worth streaming */
        if (!b.blocks || b.bytes < total / 2) {
            ex = sim_scen_err(
                sc, key,
                "model \"%s\" has no repeated blocks: \"auto\" looks for tensors named PREFIX.N. "
                "(\"blocks.3.\","
                " \"layers.3.\") holding at least half of its bytes, and %s; name the prefix instead "
                "(\"blocks\": \"PREFIX.\")",
                sm->name, hint);
            goto out;
        }
        if (!(auto_prefix = strndup(b.name, b.plen))) goto oom;
        prefixes = malloc(sizeof *prefixes);
        if (!prefixes) {
            free(auto_prefix);
            goto oom;
        }
        prefixes[0] = auto_prefix;
        np = 1;
    } else {
        np = json_is_array(spec) ? (int)json_array_size(spec) : 1;
        prefixes = calloc((size_t)np, sizeof *prefixes);
        if (!prefixes) goto oom;
        for (int p = 0; p < np; p++)
            prefixes[p] = json_string_value(json_is_array(spec) ? json_array_get(spec, (size_t)p) : spec);
    }
    /* each tensor to its block, or to the fixed ones */
    ne = 0;
    free(e);
    e = calloc((size_t)(n ? n : 1), sizeof *e);
    int64_t *perp = calloc((size_t)np, sizeof *perp);
    if (!e || !perp) {
        free(perp);
        goto oom_p;
    }
    for (int64_t t = 0; t < n; t++) {
        int pi = 0, second = -1;
        uint64_t num = 0;
        const char *nm = names[t] ? names[t] : "";
        if (!match(nm, prefixes, np, &pi, &num, &second)) continue;
        if (second >= 0) {
            ex = sim_scen_err(
                sc, key,
                "tensor \"%s\" of model \"%s\" is in a block of \"%s\" and of \"%s\": give prefixes "
                "that do not overlap",
                nm, sm->name, prefixes[pi], prefixes[second]);
            free(perp);
            goto out_p;
        }
        /* plen holds the prefix's position in the list, so blocks sort in list order */
        e[ne++] = (numbered){"", (size_t)pi, num, bytes[t], t};
        perp[pi]++;
    }
    for (int p = 0; p < np; p++)
        if (!perp[p]) {
            ex = sim_scen_err(sc, key, "model \"%s\" has no tensor named \"%sN.<name>\" (N a number); %s",
                              sm->name, prefixes[p], hint);
            free(perp);
            goto out_p;
        }
    free(perp);
    qsort(e, (size_t)ne, sizeof *e, cmp_numbered); /* names all "": by list position, number, tensor */
    int64_t nb = 0;
    for (int64_t i = 0; i < ne; i++) nb += i == 0 || e[i].plen != e[i - 1].plen || e[i].num != e[i - 1].num;
    sm->nblocks = nb;
    sm->block_first = calloc((size_t)nb + 1, sizeof *sm->block_first);
    sm->block_tensors = calloc((size_t)(ne ? ne : 1), sizeof *sm->block_tensors);
    sm->block_bytes = calloc((size_t)(nb ? nb : 1), sizeof *sm->block_bytes);
    sm->fixed = calloc((size_t)(n - ne ? n - ne : 1), sizeof *sm->fixed);
    bool *inblock = calloc((size_t)(n ? n : 1), sizeof *inblock);
    if (!sm->block_first || !sm->block_tensors || !sm->block_bytes || !sm->fixed || !inblock) {
        free(inblock);
        goto oom_p;
    }
    for (int64_t i = 0, k = -1; i < ne; i++) {
        if (i == 0 || e[i].plen != e[i - 1].plen || e[i].num != e[i - 1].num) sm->block_first[++k] = i;
        sm->block_tensors[i] = e[i].t;
        sm->block_bytes[k] += e[i].bytes;
        inblock[e[i].t] = true;
    }
    sm->block_first[nb] = ne;
    sm->nfixed = 0;
    sm->fixed_bytes = 0;
    for (int64_t t = 0; t < n; t++)
        if (!inblock[t]) {
            sm->fixed[sm->nfixed++] = t;
            sm->fixed_bytes += bytes[t];
        }
    free(inblock);
    sm->blocks_desc[0] = '\0';
    for (int p = 0; p < np; p++) {
        size_t l = strlen(sm->blocks_desc);
        snprintf(sm->blocks_desc + l, sizeof sm->blocks_desc - l, "%s%s", p ? ", " : "", prefixes[p]);
    }
    ex = 0;
    goto out_p;
oom_p:
    ex = cli_fail("out of memory");
out_p:
    if (is_auto) free((char *)prefixes[0]);
    free(prefixes);
    goto out;
oom:
    ex = cli_fail("out of memory");
out:
    free(names);
    free(bytes);
    free(e);
    return ex;
}
