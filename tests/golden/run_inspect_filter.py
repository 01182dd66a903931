#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry inspect`: element counts per tensor and in total, --filter GLOB
(the listing and the totals are the matching tensors'; '*' crosses dots), and
the types of metadata values in --json (GGUF numbers, booleans and short
arrays, and an index's non-string values, as JSON values; strings, NaN and
summarised long arrays as strings), with the text listing unchanged.

    run_inspect_filter.py FERRY
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import gguf_writer as gw  # noqa: E402


def typed_metadata(ferry, d, problems):
    """What inspect --json makes of each metadata value's type."""
    g = os.path.join(d, "typed.gguf")
    gw.write(g, [], [
        ("general.architecture", gw.STRING, "llama"), ("llama.block_count", gw.UINT32, 2),
        ("i64", gw.INT64, -(1 << 40)), ("u64.max", gw.UINT64, (1 << 64) - 1),
        ("eps", gw.FLOAT32, 1e-5), ("f64", gw.FLOAT64, 0.1), ("nan", gw.FLOAT32, float("nan")),
        ("inf", gw.FLOAT64, float("-inf")), ("flag", gw.BOOL, True), ("off", gw.BOOL, False),
        ("num.text", gw.STRING, "2"), ("arr.f32", gw.ARRAY, (gw.FLOAT32, [0.5, -1.25])),
        ("arr.str", gw.ARRAY, (gw.STRING, ["a", "b\"c"])), ("arr.nul", gw.ARRAY, (gw.STRING, ["n\0ul"])),
        ("arr.nan", gw.ARRAY, (gw.FLOAT32, [1.0, float("nan")])),
        ("arr.nested", gw.ARRAY, (gw.ARRAY, [(gw.INT32, [1, 2]), (gw.BOOL, [True])])),
        ("tokens", gw.ARRAY, (gw.STRING, [f"t{i}" for i in range(17)])),
    ])
    r = subprocess.run([ferry, "inspect", "--json", g], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"inspect --json typed.gguf: exit {r.returncode}: {r.stderr.strip()}")
        return
    md = json.loads(r.stdout)["metadata"]
    # (value, type): bool is a subclass of int, so the type is compared exactly
    want = {"general.architecture": ("llama", str), "llama.block_count": (2, int), "i64": (-(1 << 40), int),
            "u64.max": (str((1 << 64) - 1), str),  # past int64: the CLI's JSON library keeps it as text
            "eps": (float("1e-05"), float), "f64": (0.1, float), "nan": ("NaN", str), "inf": ("-Infinity", str),
            "flag": (True, bool), "off": (False, bool), "num.text": ("2", str), "arr.f32": ([0.5, -1.25], list),
            "arr.str": (["a", 'b"c'], list), "arr.nul": (["n\0ul"], list), "arr.nan": ("[1,NaN]", str),
            "arr.nested": ([[1, 2], [True]], list),
            "tokens": ("[STRING x 17]", str)}
    for k, (v, t) in want.items():
        if k not in md or type(md[k]) is not t or md[k] != v:
            problems.append(f"typed.gguf metadata {k!r}: {md.get(k)!r}, expected {v!r} ({t.__name__})")
    if type(md.get("arr.nested", [[None]])[1][0]) is not bool:
        problems.append(f"typed.gguf arr.nested: {md.get('arr.nested')!r}: the inner true is not a boolean")
    if len(md) != len(want):
        problems.append(f"typed.gguf: metadata keys {sorted(md)}, expected {sorted(want)}")
    # the text listing keeps ferry_file_metadata's text
    r = subprocess.run([ferry, "inspect", g], capture_output=True, text=True)
    for line in ("  llama.block_count = 2\n", "  eps = 1e-05\n", "  flag = true\n", "  arr.f32 = [0.5,-1.25]\n",
                 "  nan = NaN\n", "  tokens = [STRING x 17]\n"):
        if line not in r.stdout:
            problems.append(f"inspect typed.gguf (text) lacks {line!r}")
    # an index: strings stay strings, every other JSON value keeps its type
    for n in ("s1", "s2"):
        with open(os.path.join(d, f"{n}.safetensors"), "wb") as f:
            h = json.dumps({n: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode()
            h += b" " * ((8 - len(h) % 8) % 8)
            f.write(struct.pack("<Q", len(h)) + h + bytes(1))
    mdv = {"total_size": 2, "ratio": 0.5, "ok": True, "none": None, "list": [1, "x"], "obj": {"a": [False]},
           "text": "3"}
    with open(os.path.join(d, "m.safetensors.index.json"), "w") as f:
        json.dump({"metadata": mdv, "weight_map": {"s1": "s1.safetensors", "s2": "s2.safetensors"}}, f)
    r = subprocess.run([ferry, "inspect", "--json", os.path.join(d, "m.safetensors.index.json")],
                       capture_output=True, text=True)
    md = json.loads(r.stdout)["metadata"] if r.returncode == 0 else {}
    if md != mdv or any(type(md[k]) is not type(v) for k, v in mdv.items()):
        problems.append(f"index metadata {md!r}, expected {mdv!r}")


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
    typed_metadata(sys.argv[1], d, problems)
    r = subprocess.run([sys.argv[1], "inspect", "--filter"], capture_output=True, text=True)
    if r.returncode != 2:
        problems.append(f"--filter without GLOB: exit {r.returncode}, expected 2")
    for m in problems:
        print("FAIL", m)
    print("PASS" if not problems else "FAIL")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
