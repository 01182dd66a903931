#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""examples/stream (the C streaming example) end to end on a sim device,
over a small sample DiT (scripts/make_sample.py: 8 blocks, 4.5 MiB),
asserted from its --json report and exit codes:

  1 a budget that holds the whole model: every block resident, nothing
    moves after the first pass; the report gives the minimum budget
  2 a budget of 40 % of the model: some blocks stream, the first pass moves
    the whole model, each later pass the plan's streamed bytes (the second
    may move less), every block read back in the first and the last pass
    matches the checkpoint
  3 the exact minimum (the tensors outside the blocks + the largest block):
    it runs, one block at a time (no prefetch)
  4 one byte below the minimum: exit 1, the engine's message naming the
    minimum and the budget, nothing on stdout
  5 --copies ring: later passes read the streamed blocks from the checkpoint
  6 the text report; bad command lines exit 2, a missing checkpoint 1
    naming it

    run_example_stream.py STREAM      (ctest: test `example_stream`)

Prints a "N passed, N failed" line; exits 1 if any check failed, 77 if
python3 cannot run the sample writer.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_simulate import MAKE_SAMPLE, Checks, expect  # noqa: E402

BLOCKS = 8
HIDDEN = 128


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    stream = os.path.abspath(sys.argv[1])
    checks = Checks()
    work = tempfile.mkdtemp(prefix="ferry-example-stream-")
    try:
        ckpt = os.path.join(work, "dit.safetensors")
        r = subprocess.run([sys.executable, MAKE_SAMPLE, ckpt, "--blocks", str(BLOCKS), "--hidden", str(HIDDEN),
                            "--seed", "5"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"skip: make_sample.py failed: {r.stderr.strip()}")
            return 77

        def run(*args):
            """(exit code, the --json report or None, stdout, stderr)"""
            r = subprocess.run([stream, ckpt, "--device", "sim:64MiB,2GB/s", *args], capture_output=True, text=True,
                               timeout=120)
            rep = None
            if "--json" in args and r.returncode == 0:
                try:
                    rep = json.loads(r.stdout)
                except ValueError:
                    pass
            return r.returncode, rep, r.stdout, r.stderr

        def report_ok(p, rc, rep, err, passes):
            return expect(p, rc == 0 and rep is not None and rep["passes_done"] == passes
                          and len(rep["per_pass"]) == passes and rep["blocks"] == BLOCKS
                          and rep["blocks_verified"] == (2 if passes > 1 else 1) * BLOCKS,
                          f"exit {rc}, {passes} passes done and 2 of them checked: {rep} {err}")

        # 1: it fits; the report says the model's size and the minimum
        p = []
        rc, rep, _, err = run("--budget", "32MiB", "--passes", "2", "--block-ms", "1", "--json")
        total = minimum = 0
        if report_ok(p, rc, rep, err, 2):
            plan = rep["plan"]
            total, minimum = rep["model_bytes"], plan["minimum_bytes"]
            expect(p, plan["streamed_blocks"] == 0 and plan["resident_blocks"] == BLOCKS,
                   f"every block resident: {plan}")
            expect(p, rep["per_pass"][0]["bytes_htod"] == total and rep["per_pass"][1]["bytes_htod"] == 0,
                   f"the first pass moves the model ({total}), the second nothing: {rep['per_pass']}")
            expect(p, 0 < plan["fixed_bytes"] < minimum < total, f"fixed < minimum < model: {plan}")
        checks.case("1 a model that fits stays resident", p)
        if not total:
            print(f"{checks.passed} passed, {checks.failed} failed")
            return 1

        # 2: 40 % of the model
        p = []
        budget = total * 4 // 10
        rc, rep, _, err = run("--budget", str(budget), "--passes", "4", "--block-ms", "2", "--json")
        if report_ok(p, rc, rep, err, 4):
            plan = rep["plan"]
            expect(p, plan["streamed_blocks"] > 0 and plan["resident_blocks"] + plan["streamed_blocks"] == BLOCKS
                   and plan["budget"] == budget and plan["minimum_bytes"] == minimum,
                   f"plan: blocks stream at budget {budget}: {plan}")
            expect(p, plan["resident_bytes"] + plan["window_bytes"] <= budget,
                   f"resident + window within the budget: {plan}")
            expect(p, rep["per_pass"][0]["bytes_htod"] == total,
                   f"the first pass moves the model: {rep['per_pass'][0]}")
            # (the second pass may find a streamed block the first left on the device)
            if plan["shrinks"] == 0:
                for k, s in enumerate(rep["per_pass"][1:], 2):
                    want = plan["streamed_bytes"]
                    expect(p, s["bytes_htod"] == want or k == 2 and s["bytes_htod"] < want,
                           f"pass {k} moves {s['bytes_htod']}, the plan's streamed bytes are {plan['streamed_bytes']}")
        checks.case("2 at 40 % of the model some blocks stream, each pass moves them, the bytes check", p)

        # 3: the exact minimum
        p = []
        rc, rep, _, err = run("--budget", str(minimum), "--passes", "3", "--block-ms", "1", "--json")
        if report_ok(p, rc, rep, err, 3):
            plan = rep["plan"]
            expect(p, plan["streamed_blocks"] > 0 and plan["prefetch"] == 0 and plan["budget"] == minimum,
                   f"one block at a time: {plan}")
        checks.case("3 the exact minimum runs, one block at a time", p)

        # 4: one byte below it
        p = []
        rc, rep, out, err = run("--budget", str(minimum - 1), "--json")
        expect(p, rc == 1 and not out, f"exit {rc} (want 1), stdout {out!r}")
        expect(p, "at least" in err and f"at least {minimum} device bytes" in err
               and f"budget is {minimum - 1}" in err and ckpt in err and err.count("\n") == 1,
               f"one line naming the file, the minimum ({minimum}) and the budget: {err!r}")
        checks.case("4 below the minimum: exit 1 with the engine's message", p)

        # 5: --copies ring
        p = []
        rc, rep, _, err = run("--budget", str(budget), "--passes", "2", "--block-ms", "1", "--copies", "ring", "--json")
        if report_ok(p, rc, rep, err, 2):
            plan, last = rep["plan"], rep["per_pass"][1]
            expect(p, not plan["pinned_copies"] and (plan["shrinks"] or last["bytes_read"] == plan["streamed_bytes"]),
                   f"no pinned copies: pass 2 reads the streamed blocks from the checkpoint: {plan} {last}")
        checks.case("5 --copies ring reads the streamed blocks from the checkpoint every pass", p)

        # 6: text, bad command lines, a missing checkpoint
        p = []
        rc, _, out, err = run("--budget", str(budget), "--passes", "2", "--block-ms", "0")
        lines = out.splitlines()
        expect(p, rc == 0 and len(lines) == 6 and lines[0].startswith(ckpt + ": ") and lines[2].startswith("pass 1: ")
               and lines[3].startswith("pass 2: ") and lines[4].startswith("plan: "),
               f"text report: exit {rc}:\n{out}{err}")
        for bad in (["--passes", "0"], ["--copies", "some"], ["--budget", "lots"], ["--frobnicate", "1"]):
            rc, _, out, err = run(*bad)
            expect(p, rc == 2 and bad[0] in err and not out, f"{bad}: exit {rc} (want 2): {err!r}")
        r = subprocess.run([stream, os.path.join(work, "none.safetensors")], capture_output=True, text=True, timeout=60)
        expect(p, r.returncode == 1 and "none.safetensors" in r.stderr,
               f"missing file: exit {r.returncode} {r.stderr!r}")
        r = subprocess.run([stream, "--help"], capture_output=True, text=True, timeout=60)
        expect(p, r.returncode == 0 and r.stdout.startswith("usage: stream CHECKPOINT"), f"--help: {r.returncode}")
        checks.case("6 the text report; bad command lines exit 2, a missing checkpoint 1", p)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
