/* simulate.h - private to `ferry simulate`: the scenario read from its JSON
 * file (simulate_scenario.c), its jobs run against the residency store
 * (simulate_run.c) and their report (simulate_report.c); cmd_simulate.c is
 * the command that ties them together. */
#ifndef FERRY_SIMULATE_H
#define FERRY_SIMULATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

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

/* What one job did and what went wrong in it, for the report. */
typedef struct job_result {
    char err[2048];
    bool failed, stop;
    int64_t reserve_freed;
    int64_t modified;
    uint64_t modified_bytes;
    int64_t verified, mismatches;
} job_result;

/* The jobs' scratch buffers (allocated by cmd_simulate.c once the models are known). */
typedef struct bufs {
    uint8_t *a; /* a whole tensor */
    uint8_t *b; /* a window of the checkpoint */
    size_t bn;
} bufs;

/* ---- simulate_scenario.c ---- */

/* "ferry simulate: SCENARIO: KEY: message"; returns EXIT_USAGE. */
int sim_scen_err(const scenario *sc, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Read and check sc->path into sc (a sc->device set beforehand, from --device,
 * wins over the file's); 0, or an exit status with the message printed. */
int sim_scenario_parse(scenario *sc);
/* Open every model's files and turn "modify"'s tensor names into model
 * indices; 0, or an exit status with the message printed. */
int sim_scenario_open(scenario *sc, ferry_ctx *ctx);
/* Close the files and free what parsing allocated; sc itself is the caller's. */
void sim_scenario_free(scenario *sc);

/* ---- simulate_run.c ---- */

/* ctx's message for rc, else ferry_strerror(rc). */
const char *sim_errmsg(ferry_ctx *ctx, int64_t rc);
/* Run job ji's steps between ferry_store_job_begin and ferry_store_job_end:
 * its stats into *js, what failed into r (r->stop: the scenario stops). */
void sim_run_job(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, bufs *b, job_result *r,
                 ferry_job_stats *js);

/* ---- simulate_report.c ---- */

/* One line of text, or one JSON object, for job ji. */
void sim_print_job(scenario *sc, int ji, const ferry_job_stats *js, const job_result *r, bool json);
/* The store's totals after the jobs: a last line, or {"summary": {...}}. */
void sim_print_summary(ferry_device *dev, ferry_store *store, int njobs, int ran, int failed, bool json);

#endif
