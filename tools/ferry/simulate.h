/* SPDX-License-Identifier: Apache-2.0 */
/* simulate.h - private to `ferry simulate`: the scenario read from its JSON
 * file (simulate_scenario.c), a model's repeated blocks found by their names
 * (simulate_blocks.c), its jobs run against the residency store
 * (simulate_run.c; a "run" job's passes over a streamed model in
 * simulate_stream.c) and their report (simulate_report.c); cmd_simulate.c is
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
    /* its repeated blocks, when a job runs it (simulate_blocks.c) */
    const json_t *blocks_spec; /* the first "run"'s "blocks" (the others must agree) */
    char *blocks_key;          /* and where it was, for messages */
    char blocks_desc[256];     /* the prefixes, e.g. "blocks." */
    int64_t nblocks;
    int64_t *block_first;   /* nblocks + 1 offsets into block_tensors */
    int64_t *block_tensors; /* model tensor indices, block by block, each block's in file order */
    uint64_t *block_bytes;
    int64_t *fixed, nfixed; /* the tensors outside every block */
    uint64_t fixed_bytes;
} sim_model;

typedef struct sim_mod {
    int model;
    int64_t t;
} sim_mod;

/* A "run": passes over a model's blocks, each block computing for block_ms. */
typedef struct sim_run {
    int model;
    int64_t steps;
    double block_ms;
    int64_t prefetch; /* blocks queued ahead of the one computing; the window is prefetch + 1 */
    bool pinned_cache;
} sim_run;

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
    bool has_run;
    sim_run run;
} sim_job;

typedef struct scenario {
    const char *path;
    json_t *root;
    const char *device;
    double copy_rate; /* bytes/s for the run report's bound: the sim's modelled rate, else
                         the scenario's "copy_rate" (measured when "probe"), else 0 (unknown) */
    bool probe_rate;
    ferry_store_opts o;
    sim_model *models;
    int nmodels;
    sim_job *jobs;
    int njobs;
} scenario;

/* One pass over the blocks. */
typedef struct step_result {
    double seconds; /* wall time of the pass */
    double compute; /* of which spent computing (sleeping block_ms per block) */
    double wait;    /* in ferry_op_wait: copies not done when their block was due */
    double queue;   /* in ferry_model_to_device_async: room made, file reads (which run in the call) */
    uint64_t htod;  /* bytes moved to the device (the store's bytes_htod, as moves landed) */
    uint64_t dtoh;
} step_result;

/* What a job's "run" did. */
typedef struct run_result {
    bool planned;
    ferry_plan plan;
    bool *streams; /* per block: it streams under the plan */
    step_result *steps;
    int64_t nsteps;        /* passes completed */
    uint64_t device_bytes; /* the model's bytes on the device after the passes */
    uint64_t pinned_cache_bytes;
    uint64_t shrinks, grows, retries; /* the engine's: moves that found no room, and what it gave back */
    int64_t prefetch_now;             /* the moves queued ahead at the end (after any shrinking) */
} run_result;

/* What one job did and what went wrong in it, for the report. */
typedef struct job_result {
    char err[2048];
    bool failed, stop;
    int64_t reserve_freed;
    int64_t modified;
    uint64_t modified_bytes;
    int64_t verified, mismatches;
    run_result run;
} job_result;

/* The jobs' scratch buffers (allocated by cmd_simulate.c once the models are known). */
typedef struct bufs {
    uint8_t *a; /* a whole tensor */
    uint8_t *b; /* a window of the checkpoint */
    size_t bn;
} bufs;

/* ---- simulate_scenario.c ---- */

/* "ferry simulate: SCENARIO: KEY: message"; returns EXIT_USAGE. */
int sim_scen_err(const scenario *sc, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Read and check sc->path into sc (a sc->device set beforehand, from --device,
 * wins over the file's); 0, or an exit status with the message printed. */
int sim_scenario_parse(scenario *sc);
/* Open every model's files, turn "modify"'s tensor names into model indices
 * and find the blocks of the models a job runs; 0, or an exit status with the
 * message printed. */
int sim_scenario_open(scenario *sc, ferry_ctx *ctx);
/* Close the files and free what parsing allocated; sc itself is the caller's. */
void sim_scenario_free(scenario *sc);

/* ---- simulate_blocks.c ---- */

/* Find sm's blocks (its files open) as spec says: "auto" or a prefix or a
 * list of them (simulate --help); key names spec in messages. Fills sm's
 * block fields; 0, or EXIT_USAGE with the message printed. */
int sim_find_blocks(const scenario *sc, sim_model *sm, const json_t *spec, const char *key);

/* ---- simulate_stream.c ---- */

/* Job ji's "run": plan the model (cmd_simulate.c made each block a group
 * when it added the model) and run its passes. budget: the device bytes the
 * plan may use (0: the store's). Fills r->run; failures go to r. */
void sim_run_stream(ferry_ctx *ctx, ferry_store *store, scenario *sc, int ji, uint64_t budget, job_result *r);

/* ---- simulate_run.c ---- */

/* Mark the job failed and add the message to r->err ("; " between them). */
void sim_job_err(job_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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
