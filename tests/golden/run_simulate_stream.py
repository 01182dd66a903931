#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry simulate`'s "run" jobs end to end on sim devices with a modelled copy
rate: passes over a sample DiT's blocks under a budget that holds only part
of it, asserted from the --json report:

  1 a cyclic pass over a model about 3x its budget streams only what does not
    fit: after the first pass, each pass moves the plan's streamed bytes
    (within a block), the resident blocks stay, every job succeeds
  2 a model that fits: every block resident, nothing moves after the first pass
  3 copies slower than compute stall the passes; compute 5x slower than the
    copies hides them (behaviour, with wide margins: stall fraction > 0.3
    against < 0.5)
  4 pinned_cache false: streamed blocks keep no pinned copy and still move
    the plan's bytes a pass
  5 the text report has the run's line; --check reads the scenario alone
  6 bad runs exit 2 naming the file and the key: unknown key, negative
    block_ms, steps 0, a model with no repeated blocks, a prefix that names
    none, two runs of one model with other blocks, an unknown model
  7 blocks found by name in a hand-built checkpoint: "auto" takes the
    numbered prefix with the most bytes (double_blocks.N., not a block's own
    numbered parts), a list of prefixes runs one kind of block after the other

    run_simulate_stream.py FERRY      (ctest: test `simulate_run`)

Prints a "N passed, N failed" line; exits 1 if any check failed, 77 if
python3 cannot run the sample writer.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_simulate import MAKE_SAMPLE, Checks, Sim, expect, inspect, why  # noqa: E402
from run_simulate import ROOT  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
import stwriter  # noqa: E402

BLOCKS = 16
HIDDEN = 256


def layout(info):
    """(bytes per block number, bytes outside the blocks) of a make_sample checkpoint"""
    blocks, fixed = {}, 0
    for t in info["tensors"]:
        m = re.match(r"blocks\.(\d+)\.", t["name"])
        if m:
            blocks[int(m.group(1))] = blocks.get(int(m.group(1)), 0) + t["nbytes"]
        else:
            fixed += t["nbytes"]
    return blocks, fixed


def run_of(jobs, name):
    for j in jobs:
        if j["job"] == name:
            return j
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    ferry = os.path.abspath(sys.argv[1])
    checks = Checks()
    work = tempfile.mkdtemp(prefix="ferry-simulate-run-")
    try:
        for name, blocks, seed in (("dit", BLOCKS, 1), ("flat", 0, 2)):
            # --bf16-only: every block the same size, as in a real DiT
            r = subprocess.run([sys.executable, MAKE_SAMPLE, os.path.join(work, name + ".safetensors"),
                                "--blocks", str(blocks), "--hidden", str(HIDDEN), "--bf16-only", "--seed", str(seed)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"skip: make_sample.py failed: {r.stderr.strip()}")
                return 77
        info = inspect(ferry, os.path.join(work, "dit.safetensors"))
        TOTAL = info["total_bytes"]
        blocks, FIXED = layout(info)
        assert len(blocks) == BLOCKS and len(set(blocks.values())) == 1, "make_sample --bf16-only: equal blocks"
        B = blocks[0]
        sim = Sim(ferry, work)
        models = {"dit": "dit.safetensors"}
        # a copy of one block takes 10 ms at this rate
        RATE = B * 100
        dev = f"sim:64MiB,{RATE}/s"

        # 1: a model ~3x its budget: the window is 3 blocks, 2.5 more fit
        p = []
        budget = FIXED + int(5.5 * B)
        sc = {"device": dev, "device_budget": budget, "host_budget": "256MiB", "pinned_budget": "128MiB",
              "host_reserve": "16MiB", "models": models,
              "jobs": [{"name": "denoise", "run": {"model": "dit", "steps": 4, "block_ms": 1, "prefetch": 2}}]}
        rc, jobs, summ, err, _ = sim.run(sc)
        if expect(p, rc == 0 and len(jobs) == 1 and jobs[0]["error"] is None and jobs[0]["run"],
                  f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
            run = jobs[0]["run"]
            plan = run["plan"]
            expect(p, run["blocks"] == BLOCKS and run["blocks_prefix"] == "blocks." and run["window"] == 3
                   and run["steps_done"] == 4 and len(run["per_step"]) == 4,
                   f"run: {BLOCKS} blocks of blocks., window 3, 4 passes: {run}")
            expect(p, plan and plan["blocks"] == BLOCKS and plan["resident_blocks"] + plan["streamed_blocks"] == BLOCKS
                   and plan["resident_blocks"] >= 1 and plan["streamed_blocks"] >= 1
                   and plan["streamed_bytes"] == plan["streamed_blocks"] * B and plan["fixed_bytes"] == FIXED
                   and len(plan["streamed"]) == plan["streamed_blocks"],
                   f"plan: some blocks resident, the rest streamed: {plan}")
            expect(p, plan and plan["resident_bytes"] + plan["window_bytes"] <= budget,
                   f"plan: resident {plan and plan['resident_bytes']} + window {plan and plan['window_bytes']} "
                   f"within the budget {budget}")
            first, steady = run["first_step"], run["steady"]
            expect(p, abs(first["bytes_htod"] - TOTAL) <= B,
                   f"first pass moves the whole model once: {first['bytes_htod']} (want {TOTAL} +- {B})")
            expect(p, steady and steady["steps"] == 3 and plan and abs(steady["bytes_htod"] - plan["streamed_bytes"]) <= B,
                   f"steady passes move the plan's streamed bytes: {steady and steady['bytes_htod']} "
                   f"(want {plan and plan['streamed_bytes']} +- {B})")
            for k, s in enumerate(run["per_step"][1:], 2):
                expect(p, plan and abs(s["bytes_htod"] - plan["streamed_bytes"]) <= B,
                       f"pass {k} moves {s['bytes_htod']} (want {plan and plan['streamed_bytes']} +- {B})")
            expect(p, steady and steady["bytes_htod"] < BLOCKS * B - B,
                   f"no thrashing: a steady pass moves {steady and steady['bytes_htod']}, less than the blocks "
                   f"({BLOCKS * B})")
            expect(p, run["copy_rate"] == RATE and run["bound_seconds"] is not None and plan
                   and abs(run["copy_seconds"] - plan["streamed_bytes"] / RATE) < 1e-6,
                   f"bound from the sim's rate: {run['copy_rate']}, {run['copy_seconds']}, {run['bound_seconds']}")
            walls = sorted(s["seconds"] for s in run["per_step"][1:])
            expect(p, run["predicted_step_seconds"] == walls[1] and steady["seconds"] > 0,
                   f"predicted = the median steady pass's time: {run['predicted_step_seconds']} ({walls})")
            expect(p, run["pinned_cache_bytes"] > 0,
                   f"a roomy pinned budget keeps streamed blocks' copies: {run['pinned_cache_bytes']}")
            expect(p, jobs[0]["device_bytes"] <= budget, f"device {jobs[0]['device_bytes']} within {budget}")
        checks.case("1 a cyclic pass over a model ~3x its budget moves only the streamed blocks after the first", p)

        # 2: a model that fits: nothing moves after the first pass
        p = []
        sc2 = dict(sc, device_budget=TOTAL + B)
        rc, jobs, summ, err, _ = sim.run(sc2)
        if expect(p, rc == 0 and len(jobs) == 1 and jobs[0]["error"] is None, f"exit {rc}: {why(err, jobs)}"):
            run = jobs[0]["run"]
            expect(p, run["plan"]["streamed_blocks"] == 0 and run["plan"]["resident_blocks"] == BLOCKS
                   and run["plan"]["streamed_bytes"] == 0, f"plan: every block resident: {run['plan']}")
            expect(p, run["first_step"]["bytes_htod"] == TOTAL and run["steady"]["bytes_htod"] == 0,
                   f"moves: first {run['first_step']['bytes_htod']} (want {TOTAL}), steady "
                   f"{run['steady']['bytes_htod']} (want 0)")
            expect(p, run["device_bytes"] == TOTAL, f"the model stays on the device: {run['device_bytes']}")
        checks.case("2 a model that fits is planned all resident and moves nothing after the first pass", p)

        # 3: stalls when the copies are slower than compute, none to speak of when compute is 5x slower
        p = []
        frac = {}
        for label, ms in (("copy-bound", 1), ("compute-bound", 50)):
            sc3 = dict(sc, jobs=[{"name": label, "run": {"model": "dit", "steps": 3, "block_ms": ms, "prefetch": 2}}])
            rc, jobs, summ, err, _ = sim.run(sc3)
            if expect(p, rc == 0 and len(jobs) == 1 and jobs[0]["error"] is None, f"{label}: exit {rc}: {why(err, jobs)}"):
                st = jobs[0]["run"]["steady"]
                frac[label] = st["stall_fraction"]
                expect(p, abs(st["stall_seconds"] - (st["seconds"] - st["compute_seconds"])) < 1e-6
                       and st["compute_seconds"] >= BLOCKS * ms / 1000 * 0.95,
                       f"{label}: stall is the pass less its compute: {st}")
        if expect(p, len(frac) == 2, "both runs"):
            expect(p, frac["copy-bound"] > 0.3, f"copy-bound (10 ms copies, 1 ms compute): stall fraction "
                   f"{frac['copy-bound']:.2f}, want > 0.3")
            expect(p, frac["compute-bound"] < 0.5, f"compute-bound (10 ms copies, 50 ms compute): stall fraction "
                   f"{frac['compute-bound']:.2f}, want < 0.5")
            expect(p, frac["compute-bound"] < frac["copy-bound"], f"stalls: {frac}")
        checks.case("3 copies slower than compute stall the passes; compute 5x slower hides the copies", p)

        # 4: pinned_cache false: no pinned copies, the same bytes a pass (from the checkpoint)
        p = []
        sc4 = dict(sc, jobs=[{"name": "nocache",
                              "run": {"model": "dit", "steps": 3, "block_ms": 1, "pinned_cache": False}}])
        rc, jobs, summ, err, _ = sim.run(sc4)
        if expect(p, rc == 0 and len(jobs) == 1 and jobs[0]["error"] is None, f"exit {rc}: {why(err, jobs)}"):
            run = jobs[0]["run"]
            expect(p, run["pinned_cache"] is False and run["pinned_cache_bytes"] == 0,
                   f"no pinned copies: {run['pinned_cache_bytes']}")
            expect(p, abs(run["steady"]["bytes_htod"] - run["plan"]["streamed_bytes"]) <= B,
                   f"steady passes move {run['steady']['bytes_htod']} (want {run['plan']['streamed_bytes']} +- {B})")
        checks.case("4 pinned_cache false: no pinned copies, the streamed blocks still move once a pass", p)

        # 5: the text report, and --check
        p = []
        path = os.path.join(work, "text.json")
        with open(path, "w") as f:
            json.dump(dict(sc, jobs=[{"name": "denoise", "run": {"model": "dit", "steps": 2, "block_ms": 1}}]), f)
        r = subprocess.run([ferry, "simulate", path], capture_output=True, text=True, timeout=300)
        lines = r.stdout.splitlines()
        expect(p, r.returncode == 0 and len(lines) == 3 and lines[0].startswith("[1/1] denoise: ")
               and lines[1].startswith(f"    run dit: 2 of 2 passes over {BLOCKS} blocks (blocks.), 1 ms each")
               and " | plan: " in lines[1] and " | pass 1: " in lines[1] and "steady (passes 2-2)" in lines[1]
               and "; bound " in lines[1] and lines[2].startswith("summary: 1 of 1 jobs run, 0 failed"),
               f"text report: exit {r.returncode}:\n{r.stdout}{r.stderr}")
        with open(path, "w") as f:
            json.dump(dict(sc, models={"dit": "nowhere.safetensors"}), f)
        r = subprocess.run([ferry, "simulate", "--check", path], capture_output=True, text=True, timeout=60)
        expect(p, r.returncode == 0 and not r.stdout, f"--check opens no checkpoint: exit {r.returncode} {r.stderr}")
        with open(path, "w") as f:
            json.dump(dict(sc, jobs=[{"run": {"model": "dit", "blockms": 1}}]), f)
        r = subprocess.run([ferry, "simulate", "--check", path], capture_output=True, text=True, timeout=60)
        expect(p, r.returncode == 2 and '"blockms"' in r.stderr, f"--check refuses a bad key: exit {r.returncode} "
               f"{r.stderr}")
        checks.case("5 the run's line of text; --check reads the scenario alone", p)

        # 6: bad runs
        base = {"device": dev, "device_budget": budget, "models": {"dit": "dit.safetensors", "flat": "flat.safetensors"},
                "jobs": []}
        bad = [
            ("unknown key", [{"run": {"model": "dit", "stesp": 3}}], ["jobs[0].run", 'unknown key "stesp"']),
            ("negative block_ms", [{"name": "d", "run": {"model": "dit", "block_ms": -2}}],
             ['jobs[0] ("d").run.block_ms', "negative"]),
            ("steps 0", [{"run": {"model": "dit", "steps": 0}}], ["jobs[0].run.steps"]),
            ("no model", [{"run": {"steps": 2}}], ["jobs[0].run", '"model"']),
            ("unknown model", [{"run": {"model": "vae"}}], ["jobs[0].run.model", '"vae"']),
            ("no repeated blocks", [{"run": {"model": "flat"}}], ["jobs[0].run.blocks", '"flat"', "no repeated blocks"]),
            ("prefix naming none", [{"run": {"model": "dit", "blocks": "layers."}}],
             ["jobs[0].run.blocks", '"layers.N.', '"blocks." has the most']),
            ("other blocks in a second run", [{"run": {"model": "dit"}}, {"run": {"model": "dit", "blocks": "blocks."}}],
             ["jobs[1].run.blocks", "jobs[0].run.blocks"]),
            ("bad blocks type", [{"run": {"model": "dit", "blocks": 3}}], ["jobs[0].run.blocks", "prefix"]),
            ("bad prefetch", [{"run": {"model": "dit", "prefetch": -1}}], ["jobs[0].run.prefetch"]),
        ]
        for name, jobs_, want in bad:
            p = []
            rc, jobs, summ, err, path = sim.run(dict(base, jobs=jobs_))
            expect(p, rc == 2 and not jobs, f"exit {rc} (want 2), {len(jobs)} jobs run")
            expect(p, path in err and all(w in err for w in want) and "\n" not in err,
                   f"message {err!r} should be one line naming {path} and {want}")
            checks.case(f"6 bad run: {name}", p)

        # 7: blocks by name: two kinds of blocks, numbered parts inside them
        p = []
        t = [("img_in.weight", "BF16", [64, 64])]
        t += [(f"double_blocks.{i}.{part}", "BF16", [64, 64]) for i in range(3)
              for part in ("attn.0.weight", "mlp.2.weight")]
        t += [(f"single_blocks.{i}.linear.weight", "BF16", [64, 64]) for i in range(4)]
        K = 64 * 64 * 2
        stwriter.write(os.path.join(work, "flux.safetensors"),
                       [(n, d, sh, (lambda k: (lambda m: bytes([k % 251]) * m))(i)) for i, (n, d, sh) in enumerate(t)])
        for spec, nb, prefix, fixed in (("auto", 3, "double_blocks.", K + 4 * K),
                                        (["double_blocks.", "single_blocks."], 7, "double_blocks., single_blocks.", K)):
            sc7 = {"device": dev, "device_budget": "1MiB", "host_budget": "64MiB", "host_reserve": "16MiB",
                   "models": {"flux": "flux.safetensors"},
                   "jobs": [{"name": "pass", "run": {"model": "flux", "blocks": spec, "steps": 2}},
                            {"name": "check", "verify": True}]}
            rc, jobs, summ, err, _ = sim.run(sc7)
            if expect(p, rc == 0 and len(jobs) == 2 and all(j["error"] is None for j in jobs),
                      f"{spec}: exit {rc}: {why(err, jobs)}"):
                run = jobs[0]["run"]
                expect(p, run["blocks"] == nb and run["blocks_prefix"] == prefix and run["plan"]["blocks"] == nb
                       and run["plan"]["fixed_bytes"] == fixed and run["block_bytes"] == 2 * K,
                       f"{spec}: {run['blocks']} blocks of {run['blocks_prefix']!r}, fixed "
                       f"{run['plan']['fixed_bytes']} (want {nb} of {prefix!r}, fixed {fixed})")
                expect(p, jobs[1]["verified"] == len(t) and jobs[1]["mismatches"] == 0, f"verify: {jobs[1]}")
        checks.case("7 blocks by name: auto takes the prefix with the most bytes; a list runs both kinds", p)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
