#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The seed scenario (docs/SIMULATE.md, examples/simulate/README.md) end to end: examples/simulate/make_seed.sh writes
its two checkpoints (a 1.75 GiB DiT of 40 blocks and a 704 MiB encoder, 16x
smaller than the workflow's), then `ferry simulate --json
examples/simulate/seed.json` must run every job: the encoder, a LoRA-like
change of three DiT tensors, two denoise runs streamed through a 1.5 GiB sim
device beside the encoder, and the final check of every modified byte.

    run_simulate_seed.py FERRY      (ctest: test `simulate_seed`)

Prints a "N passed, N failed" line; exits 1 if any check failed, 77 when the
sample writer cannot run (no python3 or no room for the 2.4 GiB of samples).
"""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SEED = os.path.join(ROOT, "examples", "simulate")


def main():
    ferry = sys.argv[1]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what)
        if ok:
            passed += 1
        else:
            failed += 1

    have = all(os.path.exists(os.path.join(SEED, "seed", n)) for n in ("dit.safetensors", "te.safetensors"))
    if not have:
        if shutil.disk_usage(SEED).free < 3 << 30:
            print("simulate_seed: under 3 GiB free beside examples/simulate: skipped")
            return 77
        r = subprocess.run(["sh", os.path.join(SEED, "make_seed.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"simulate_seed: make_seed.sh failed ({r.returncode}): {r.stderr.strip()[-400:]}: skipped")
            return 77
    r = subprocess.run([ferry, "simulate", "--json", os.path.join(SEED, "seed.json")], capture_output=True, text=True)
    check(r.returncode == 0, f"ferry simulate seed.json exits 0 (got {r.returncode}: {r.stderr.strip()[-300:]})")
    jobs, summary = [], None
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        if "summary" in o:
            summary = o["summary"]
        else:
            jobs.append(o)
    want = ["encode", "lora", "denoise", "encode again", "denoise again", "check"]
    check([j.get("job") for j in jobs] == want, f"every job ran, in order: {[j.get('job') for j in jobs]}")
    for j in jobs:
        err = j.get("error")
        check(not err, f"job {j.get('job')!r} succeeded{': ' + str(err) if err else ''}")
        run = j.get("run")
        if isinstance(run, dict):
            check(run.get("steps_done") == run.get("steps"),
                  f"job {j.get('job')!r}: {run.get('steps_done')} of {run.get('steps')} passes")
            plan = run.get("plan") or {}
            check(plan.get("streamed_blocks", 0) > 0, f"job {j.get('job')!r} streams blocks ({plan.get('streamed_blocks')})")
    check(summary is not None, "a summary line")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
