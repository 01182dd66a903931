/* SPDX-License-Identifier: Apache-2.0 */
/* simulate_run.c - `ferry simulate`'s jobs run against the residency store:
 * use (to the device, held), reserve, modify (XOR and write back, the
 * expected bytes' hash remembered), run (simulate_stream.c), evict, and
 * verify against the checkpoint or that hash. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "simulate.h"

/* The byte every byte of tensor `name` is XORed with in job ji: never 0. */
static uint8_t mod_key(int ji, const char *name)
{
    uint64_t h = ferry_xxh3(name, strlen(name)) ^ ((uint64_t)(ji + 1) * 0x9E3779B97F4A7C15ull);
    return (uint8_t)(1 + h % 255);
}

/* Compare tensor t's current bytes with what they should be. */
static int check_tensor(ferry_ctx *ctx, sim_model *sm, int64_t t, bufs *b, bool *same, job_result *r)
{
    ferry_tensor_state st = {.size = sizeof st};
    int64_t rc = ferry_model_tensor_state(sm->m, t, &st);
    if (rc == 0) rc = ferry_model_read(sm->m, t, b->a);
    if (rc < 0) {
        sim_job_err(r, "verify: reading %s/%s back: %s", sm->name, st.name ? st.name : "?",
                    sim_errmsg(ctx, rc));
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
            sim_job_err(r, "verify: reading %s/%s from %s: %s", sm->name, st.name, sm->paths[f],
                        sim_errmsg(ctx, rc));
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
            ferry_tensor_state st = {.size = sizeof st};
            ferry_model_tensor_state(sm->m, t, &st);
            if (r->mismatches < 4) {
                size_t l = strlen(bad);
                snprintf(bad + l, badn - l, "%s%s/%s (in %s)", l ? ", " : "", sm->name, st.name,
                         ferry_tier_name(st.tier));
            }
            r->mismatches++;
        }
    }
}

static void modify_tensor(ferry_ctx *ctx, scenario *sc, int ji, const sim_mod *md, bufs *b, job_result *r)
{
    sim_model *sm = &sc->models[md->model];
    ferry_tensor_state st = {.size = sizeof st};
    int64_t rc = ferry_model_tensor_state(sm->m, md->t, &st);
    if (rc == 0 && st.tier != FERRY_TIER_DEVICE) rc = ferry_model_to_device(sm->m, &md->t, 1);
    if (rc == 0) rc = ferry_model_read(sm->m, md->t, b->a);
    if (rc < 0) {
        sim_job_err(r, "modify %s/%s: %s", sm->name, st.name ? st.name : "?", sim_errmsg(ctx, rc));
        return;
    }
    uint8_t k = mod_key(ji, st.name);
    for (uint64_t i = 0; i < st.nbytes; i++) b->a[i] ^= k;
    if ((rc = ferry_model_write(sm->m, md->t, b->a)) < 0) {
        sim_job_err(r, "modify %s/%s: writing: %s", sm->name, st.name, sim_errmsg(ctx, rc));
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
    bool *holding = calloc((size_t)sc->nmodels, sizeof *holding);
    if (!holding) {
        sim_job_err(r, "out of memory");
        r->stop = true;
        return;
    }
    int64_t rc;
    for (int u = 0; u < j->nuse; u++) {
        sim_model *sm = &sc->models[j->use[u]];
        if ((rc = ferry_model_to_device(sm->m, NULL, 0)) < 0) {
            sim_job_err(r, "use %s: %s", sm->name, sim_errmsg(ctx, rc));
            r->stop = true;
            goto release;
        }
        if (!holding[j->use[u]]) {
            if ((rc = ferry_model_hold(sm->m, -1)) < 0) {
                sim_job_err(r, "use %s: holding: %s", sm->name, sim_errmsg(ctx, rc));
                r->stop = true;
                goto release;
            }
            holding[j->use[u]] = true;
        }
    }
    if (j->has_reserve) {
        uint64_t could = 0;
        rc = ferry_store_make_room(store, j->reserve, &could);
        if (rc < 0) {
            char h[32];
            sim_job_err(r, "reserve %s: %s", cli_human(h, sizeof h, j->reserve), sim_errmsg(ctx, rc));
        } else {
            r->reserve_freed = rc;
        }
    }
    for (int q = 0; q < j->nmod; q++) modify_tensor(ctx, sc, ji, &j->mod[q], b, r);
    if (j->has_run) {
        /* the models this job holds stay: the run plans for the rest of the budget */
        uint64_t budget = 0, held = 0;
        for (int i = 0; i < sc->nmodels; i++) {
            if (!holding[i] || i == j->run.model) continue;
            for (int64_t t = 0; t < sc->models[i].n; t++) {
                ferry_tensor_state st = {.size = sizeof st};
                if (ferry_model_tensor_state(sc->models[i].m, t, &st) == 0 && st.tier == FERRY_TIER_DEVICE)
                    held += st.nbytes;
            }
        }
        ferry_store_stats ss = {.size = sizeof ss};
        if (held && ferry_store_get_stats(store, &ss) == 0)
            budget = ss.device_budget > held ? ss.device_budget - held : 1;
        sim_run_stream(ctx, store, sc, ji, budget, r);
    }
release:
    for (int i = 0; i < sc->nmodels; i++)
        if (holding[i] && (rc = ferry_model_release(sc->models[i].m, -1)) < 0)
            sim_job_err(r, "releasing %s: %s", sc->models[i].name, sim_errmsg(ctx, rc));
    free(holding);
    if (r->stop) return;
    for (int e = 0; e < j->nevict; e++) {
        sim_model *sm = &sc->models[j->evict[e]];
        if ((rc = ferry_model_evict(sm->m, NULL, 0)) < 0)
            sim_job_err(r, "evict %s: %s", sm->name, sim_errmsg(ctx, rc));
    }
    if (j->verify) {
        char bad[512] = "";
        int64_t before = r->verified;
        if (j->nuse)
            for (int u = 0; u < j->nuse; u++)
                verify_model(ctx, &sc->models[j->use[u]], b, r, bad, sizeof bad);
        else
            for (int i = 0; i < sc->nmodels; i++) verify_model(ctx, &sc->models[i], b, r, bad, sizeof bad);
        if (r->mismatches)
            sim_job_err(r, "verify: %" PRId64 " of %" PRId64 " tensors differ from what was written: %s%s",
                        r->mismatches, r->verified - before, bad, r->mismatches > 4 ? ", ..." : "");
    }
}

void sim_run_job(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, bufs *b, job_result *r,
                 ferry_job_stats *js)
{
    int rc;
    if ((rc = ferry_store_job_begin(store, sc->jobs[ji].name)) < 0) {
        sim_job_err(r, "starting the job: %s", sim_errmsg(ctx, rc));
        r->stop = true;
    } else {
        run_steps(ctx, store, sc, ji, b, r);
        if ((rc = ferry_store_job_end(store, js)) < 0)
            sim_job_err(r, "ending the job: %s", sim_errmsg(ctx, rc));
    }
}
