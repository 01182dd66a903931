#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The benchmark driver and what the docs say of bench/, checked off the GPU:

    test_bench_refs.py SOURCE

- every bench/*.sh parses (bash -n);
- bench/gpu_run.sh --help names every part the script accepts, an unknown
  part is a usage error (exit 2), and `gpu_run.sh OUT table` turns a part's
  log into OUT/table.md;
- every `bench/gpu_run.sh ... PART` command in the docs names a known part;
- every bench/ path the docs name exists (bench/results/ lives in git history
  only: RESULTS.md cites it with `git show COMMIT:...`).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

src = os.path.realpath(sys.argv[1])
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL", msg)


for sh in sorted(glob.glob(os.path.join(src, "bench", "*.sh"))):
    p = subprocess.run(["bash", "-n", sh], capture_output=True, text=True)
    if p.returncode:
        fail(f"{os.path.relpath(sh, src)} does not parse: {p.stderr.strip()}")

driver = os.path.join(src, "bench", "gpu_run.sh")
text = open(driver, encoding="utf-8").read()
parts = re.search(r'PARTS_OK=" ([^"]*) "', text).group(1).split()
h = subprocess.run(["bash", driver, "--help"], cwd=src, capture_output=True, text=True)
if h.returncode:
    fail(f"gpu_run.sh --help exited {h.returncode}")
for p in parts:
    if not re.search(rf"^  {re.escape(p)}\s", h.stdout, re.M):
        fail(f"gpu_run.sh --help does not describe the part '{p}'")
with tempfile.TemporaryDirectory() as out:
    u = subprocess.run(["bash", driver, out, "nosuchpart"], cwd=src, capture_output=True, text=True)
    if u.returncode != 2:
        fail(f"gpu_run.sh with an unknown part exited {u.returncode}, not 2")
    with open(os.path.join(out, "load.log"), "w") as f:
        f.write('10 GB hot, CLI r1: {"gbps": [47.0], "ms": [222.0]}\n'
                '10 GB hot, CLI r2: {"gbps": [48.0], "ms": [218.0]}\n'
                'fastsafetensors r1: {"gbps": 1.6, "s": 6.5}\n')
    t = subprocess.run(["bash", driver, out, "table"], cwd=src, capture_output=True, text=True,
                       env=dict(os.environ, B="/nonexistent"))
    table = open(os.path.join(out, "table.md")).read() if os.path.exists(os.path.join(out, "table.md")) else ""
    if t.returncode or "| load | 10 GB hot, CLI | 2 | 47.50 (47.00-48.00) | 220.00 (218.00-222.00) |" not in table \
            or "| load | fastsafetensors | 1 | 1.60 | 6500.00 |" not in table:
        fail(f"gpu_run.sh OUT table (exit {t.returncode}) made:\n{table}{t.stderr}")

docs = [os.path.join(src, "README.md")] + glob.glob(os.path.join(src, "docs", "*.md")) \
    + glob.glob(os.path.join(src, "bench", "*.md")) + glob.glob(os.path.join(src, "examples", "*", "README.md")) \
    + [os.path.join(src, p) for p in ("python/README.md", "integrations/comfyui/README.md", "tests/comfyui/README.md")]
for d in docs:
    body = open(d, encoding="utf-8").read()
    rel = os.path.relpath(d, src)
    for m in re.finditer(r"bench/gpu_run\.sh\s+OUT\s+([a-z][a-z,]*)\b", body):
        for p in m.group(1).split(","):
            if p not in parts:
                fail(f"{rel}: `{m.group(0)}` names no part of bench/gpu_run.sh")
    for m in re.finditer(r"(?<![\w/.:-])bench/[\w./{},-]*[\w}]", body):
        path = m.group(0)
        if path.startswith("bench/results/") or body[max(0, m.start() - 1)] == ":":
            continue
        names = [path]
        if "{" in path:  # bench/stream-x.{md,json}
            head, alts, tail = re.match(r"(.*)\{([^}]*)\}(.*)", path).groups()
            names = [head + a + tail for a in alts.split(",")]
        for n in names:
            if not os.path.exists(os.path.join(src, n)):
                fail(f"{rel}: names {n}, which does not exist")

print(f"bench references: {len(fails)} failed" if fails else "bench references: all checks passed")
sys.exit(1 if fails else 0)
