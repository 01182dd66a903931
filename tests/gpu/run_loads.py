#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Load every valid golden checkpoint (odd sizes and alignments, every dtype,
empty tensors, thousands of tiny tensors, sharded checkpoints) through every
transfer path onto a device, copy each tensor back and compare checksums
(`ferry load --verify`). The same cases run in CI on a sim device and on the
GPU machine on cuda:0.

    run_loads.py FERRY GOLDEN_DIR DEVICE [--paths ring,direct,register,pageable,auto]
                 [--only SUBSTRING] [--repeat N]

--only keeps the checkpoints whose path contains SUBSTRING (e.g. "pt/": the PyTorch
files, whose views of one storage once raced under the sim); --repeat loads each
N times (a race shows in some runs only).
"""
import argparse
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ferry")
    ap.add_argument("golden")
    ap.add_argument("device")
    ap.add_argument("--paths", default="ring,direct,register,pageable,auto")
    ap.add_argument("--only", default="")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    with open(os.path.join(a.golden, "manifest.json")) as f:
        manifest = json.load(f)
    entries = manifest["cases"] if isinstance(manifest, dict) and "cases" in manifest else manifest
    valid = [e for e in entries if e.get("valid") and a.only in e["file"]] * max(1, a.repeat)
    if not valid:
        print(f"no valid checkpoint in {a.golden}" + (f" whose path contains {a.only!r}" if a.only else ""))
        return 1
    passed = failed = 0
    for e in valid:
        path = os.path.join(a.golden, e["file"])
        for p in a.paths.split(","):
            cmd = [a.ferry, "load", "--device", a.device, "--route", p, "--verify", "--json", path]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            ok = r.returncode == 0
            if ok:
                try:
                    out = json.loads(r.stdout)
                    ok = out.get("verified") is True and out["files"][0]["route"] in (p, "ring", "direct", "register", "pageable")
                    if p != "auto":
                        ok = ok and out["files"][0]["route"] == p
                except (ValueError, KeyError, IndexError):
                    ok = False
            if ok:
                passed += 1
            else:
                failed += 1
                print(f"FAIL {e['file']} --route {p}: exit {r.returncode}: {r.stderr.strip()[:300]}")
    print(f"{len(valid)} checkpoints x {len(a.paths.split(','))} paths on {a.device}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
