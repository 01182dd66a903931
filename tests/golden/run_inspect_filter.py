#!/usr/bin/env python3
"""`ferry inspect`: element counts per tensor and in total, and --filter GLOB
(the listing and the totals are the matching tensors'; '*' crosses dots).

    run_inspect_filter.py FERRY
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def main():
    d = tempfile.mkdtemp(prefix="ferry-inspect-")
    hdr = {"blk.0.w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
           "blk.1.w": {"dtype": "BF16", "shape": [2, 5], "data_offsets": [48, 68]},
           "out": {"dtype": "I8", "shape": [], "data_offsets": [68, 69]}}
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    p = os.path.join(d, "m.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(69))
    problems = []

    def inspect(*args):
        r = subprocess.run([sys.argv[1], "inspect", "--json", *args, p], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"inspect {args}: exit {r.returncode}: {r.stderr.strip()}")
            return {"tensors": []}
        return json.loads(r.stdout)

    j = inspect()
    if (j.get("total_numel"), [t["numel"] for t in j["tensors"]]) != (23, [12, 10, 1]):
        problems.append(f"numel: {j.get('total_numel')} {[t.get('numel') for t in j['tensors']]}, expected 23 [12, 10, 1]")
    j = inspect("--filter", "blk*w")
    if ([t["name"] for t in j["tensors"]], j.get("tensor_count"), j.get("total_bytes"), j.get("total_numel")) != \
            (["blk.0.w", "blk.1.w"], 2, 68, 22):
        problems.append(f"--filter blk*w: {j}")
    j = inspect("--filter", "out", "--filter", "blk.1.*")
    if [t["name"] for t in j["tensors"]] != ["blk.1.w", "out"]:
        problems.append(f"two filters: {[t['name'] for t in j['tensors']]}")
    r = subprocess.run([sys.argv[1], "inspect", "--filter"], capture_output=True, text=True)
    if r.returncode != 2:
        problems.append(f"--filter without GLOB: exit {r.returncode}, expected 2")
    for m in problems:
        print("FAIL", m)
    print("PASS" if not problems else "FAIL")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
