/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_simulate.c - `ferry simulate`: run a scenario of jobs (use, reserve,
 * modify, run, evict, verify) against a residency store and report, per job,
 * the memory the process used and where every byte went, and for a run the
 * plan, the bytes streamed and the stalls of each pass: capacity planning with
 * a sim device, and an end-to-end check of the store with real checkpoints.
 * This file is the command (options, --help, the order of things); the
 * scenario, the jobs and the report are in simulate_*.c (simulate.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "simulate.h"

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
    "                 emulated in host memory, e.g. sim:24GiB; sim:24GiB,25GB/s also\n"
    "                 models the copy rate, so moves take the time they would) or cpu\n"
    "  --json         one JSON object per job, one per line, then {\"summary\": {...}}\n"
    "  --check        read and check the scenario file only (keys, types, sizes, model\n"
    "                 names), opening no checkpoint and no device; exit 0 or 2\n"
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
    "            {\"name\": \"steps\", \"run\": {\"model\": \"unet\", \"steps\": 4, \"block_ms\": 2.0}},\n"
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
    "  pinned_reserve pin this much of the pinned pool ahead, on a thread of the\n"
    "                 store's, from the start (capped at pinned_budget; default 0:\n"
    "                 pinned as evictions need it, which on a GPU runs at the pinning\n"
    "                 rate, about 7 GB/s, rather than the copy rate)\n"
    "  host_reserve   default 1GiB\n"
    "  spill_below, spill_above\n"
    "                 dirty evictions go to the spill file while the host's available\n"
    "                 memory is below spill_below, and to RAM again once it is above\n"
    "                 spill_above (defaults 2 x host_reserve, spill_below + 1GiB)\n"
    "  spill_dir      where the unnamed spill file is made (default $FERRY_SPILL_DIR,\n"
    "                 else /var/tmp); tmpfs and ramfs are refused\n"
    "  copy_rate      the host-to-device copy rate (\"25GB/s\") a run's bound is worked\n"
    "                 out with when the device models none (a sim:SIZE,RATE/s device's\n"
    "                 own rate wins), or \"probe\": measured on the device first (256 MiB\n"
    "                 of pinned copies); without either the bound is left out\n"
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
    "             priority first). They stay held there through reserve, modify\n"
    "             and run, so a later model of the list cannot push out an earlier\n"
    "             one and a reserve cannot take them: the job's models must fit\n"
    "             together.\n"
    "    reserve  a size: make that much of the device budget free (for activations),\n"
    "             evicting other models as above\n"
    "    modify   {model: [tensor, ...]}: each tensor's bytes are read, XORed with a\n"
    "             non-zero byte derived from the job's index and the tensor's name,\n"
    "             and written back, which makes it dirty (saved, not dropped, when it\n"
    "             leaves the device). A tensor not on the device is brought there\n"
    "             first. The expected contents are remembered as an XXH3-64.\n"
    "    run      {\"model\": M, \"steps\": N, \"block_ms\": MS, \"blocks\": \"auto\",\n"
    "              \"prefetch\": P, \"pinned_cache\": true}: N passes (default 1) over\n"
    "             model M's repeated blocks, as a denoising loop runs a DiT that need\n"
    "             not fit: each block becomes one group and the model is planned\n"
    "             (ferry_model_plan: the blocks in order, a window of P + 1 blocks,\n"
    "             the job's \"reserve\" left free, and the budget less the bytes of\n"
    "             the job's \"use\" models) into resident blocks and streamed ones.\n"
    "             A pass moves the tensors outside the blocks (held for the pass),\n"
    "             then per block: its move is queued if it is not yet, it is held\n"
    "             and waited for, the next P blocks' moves are queued (after the\n"
    "             last block, the next pass's first ones), it computes for MS\n"
    "             milliseconds of real time (default 0) and is released. On\n"
    "             sim:SIZE,RATE/s the copies take their real time beside the\n"
    "             compute, so the stalls are measured. P defaults to 2.\n"
    "             blocks: \"auto\" (default) finds tensors named PREFIX.N.rest, N a\n"
    "             number (blocks.3., transformer_blocks.3., model.layers.3.), and\n"
    "             takes the PREFIX whose tensors hold the most bytes; it must have\n"
    "             two blocks or more holding at least half of the model. Or a PREFIX\n"
    "             (\"blocks.\"), or a list of them run one after the other\n"
    "             ([\"double_blocks.\", \"single_blocks.\"]). Blocks run in numeric\n"
    "             order; every other tensor is outside the blocks. Every run of one\n"
    "             model must give the same blocks (groups are never split again).\n"
    "             pinned_cache false: streamed blocks keep no clean copy in pinned\n"
    "             RAM, so every pass reads them from the checkpoint again.\n"
    "    evict    models taken off the device: clean tensors are dropped (0 bytes\n"
    "             written), dirty ones go to pinned RAM, pageable RAM or the spill\n"
    "             file as the budgets decide\n"
    "    verify   true: read every tensor of the job's \"use\" models (of every model\n"
    "             when the job uses none) from wherever it lives and compare it with\n"
    "             the checkpoint, or with the remembered hash when modified\n"
    "  Steps run in that order: use, reserve, modify, run, evict, verify.\n"
    "\n"
    "Failures inside a job are reported in its \"error\" and the command exits 1 at\n"
    "the end. A failed reserve, modify, run, evict or verify leaves the rest of the\n"
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
    "{device, pinned, host, source, spill} bytes}), run and error (null or the\n"
    "message).\n"
    "\n"
    "A run adds a line: the plan (resident and streamed blocks, the resident bytes,\n"
    "the window's, the bytes streamed a pass, the budget planned for), the first\n"
    "pass (it reads the checkpoint) and the mean of the others (steady state): wall\n"
    "time, bytes moved to the device (the store's bytes_htod as moves land), stall\n"
    "(wall time less compute: waiting for copies, queueing moves, file reads);\n"
    "predicted = the median of the steady passes' wall times (a pass still filling\n"
    "the pinned cache after a re-plan does not move it); bound = max(blocks x\n"
    "block_ms, the plan's streamed bytes / the copy rate). In --json, run is null or\n"
    "{model, blocks_prefix, blocks, block_bytes (the first block's), steps,\n"
    "steps_done, block_ms, prefetch, window, pinned_cache, plan (null when planning\n"
    "failed, else {blocks, resident_blocks, streamed_blocks, fixed_bytes,\n"
    "resident_bytes, window_bytes, streamed_bytes, budget, streamed: [block\n"
    "numbers]}), per_step, first_step and steady (null under two passes; means,\n"
    "with steps) as {seconds, compute_seconds, stall_seconds, stall_fraction,\n"
    "wait_seconds (in ferry_op_wait), queue_seconds (queueing, with any file reads),\n"
    "bytes_htod, bytes_dtoh},\n"
    "predicted_step_seconds, compute_seconds, copy_rate, copy_seconds, bound_seconds\n"
    "(null without a rate), device_bytes (the model's, after) and pinned_cache_bytes}.\n"
    "\n"
    "Exit status: 0 every job succeeded, 1 a job failed (or the device or store\n"
    "could not be set up), 2 usage or scenario error (bad JSON, an unknown key, a\n"
    "wrong type, a bad size, a negative block_ms, an unknown model or tensor, a\n"
    "checkpoint that cannot be opened, a run's model without the blocks asked for):\n"
    "the message names the scenario file and the key.\n"
    "\n"
    "Examples: examples/simulate/ (scenario.json and make_checkpoints.sh; seed.json,\n"
    "a 16x scaled-down DiT workflow, and make_seed.sh).\n",
    run};

static int run(int argc, char **argv)
{
    scenario sc = {0};
    bool json = false, opts = true, check = false;
    const char *dev_override = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts && cli_is_help(a)) return cli_help(&cmd_simulate);
        if (opts && strcmp(a, "--json") == 0) json = true;
        else if (opts && strcmp(a, "--check") == 0) check = true;
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
    int ex = sim_scenario_parse(&sc);
    if (ex || check) goto out;
    if ((ex = cli_ctx_new(0, &ctx))) goto out;
    if ((ex = sim_scenario_open(&sc, ctx))) goto out;
    int rc = ferry_device_open(ctx, sc.device, &dev);
    if (rc < 0) {
        if (rc == FERRY_E_INVAL)
            ex = sim_scen_err(&sc, dev_override ? "--device" : "device", "%s", sim_errmsg(ctx, rc));
        else ex = cli_fail_ctx(ctx, rc);
        goto out;
    }
    if (sc.probe_rate) { /* before the store takes the device's memory */
        double htod = 0;
        if ((rc = ferry_device_copy_rate(dev, 256u << 20, &htod, NULL)) < 0) {
            ex = cli_fail("%s: copy_rate: probing %s: %s", sc.path, ferry_device_desc(dev),
                          sim_errmsg(ctx, rc));
            goto out;
        }
        sc.copy_rate = htod * 1e9;
    }
    if ((rc = ferry_store_new(dev, &sc.o, &store)) < 0) {
        ex = rc == FERRY_E_INVAL ? sim_scen_err(&sc, NULL, "%s", sim_errmsg(ctx, rc)) : cli_fail_ctx(ctx, rc);
        goto out;
    }
    ferry_store_stats st0 = {.size = sizeof st0};
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
            ex = cli_fail("%s: models.%s: %s", sc.path, sm->name, sim_errmsg(ctx, rc));
            goto out;
        }
        if (sm->maxbytes > maxb) maxb = sm->maxbytes;
        /* a run's block moves together, so each block is one group */
        for (int64_t k = 0; k < sm->nblocks; k++)
            if ((rc = ferry_model_group(sm->m, sm->block_tensors + sm->block_first[k],
                                        sm->block_first[k + 1] - sm->block_first[k])) < 0) {
                ex = cli_fail("%s: models.%s: grouping block %" PRId64 ": %s", sc.path, sm->name, k,
                              sim_errmsg(ctx, rc));
                goto out;
            }
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
        ferry_job_stats js = {.size = sizeof js};
        sim_run_job(ctx, store, &sc, ji, &b, &r, &js);
        ran++;
        failed += r.failed;
        sim_print_job(&sc, ji, &js, &r, json);
        free(r.run.steps);
        free(r.run.streams);
        if (r.stop) break;
    }
    sim_print_summary(dev, store, sc.njobs, ran, failed, json);
    ex = failed || ran < sc.njobs ? EXIT_FAIL : EXIT_OK;
out:
    free(b.a);
    free(b.b);
    ferry_store_free(store);
    sim_scenario_free(&sc);
    ferry_device_close(dev);
    ferry_ctx_free(ctx);
    return ex;
}
