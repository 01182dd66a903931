#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Files written by the reference `safetensors` package (numpy API) read by
ferry: names, dtypes, shapes, metadata and every tensor's bytes must match.
Exit 77 (skipped) when the package or numpy is missing.

    test_safetensors_crosscheck.py FERRY
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import save_file, load_file
except ImportError:
    print("safetensors/numpy not installed: skipped")
    sys.exit(77)

FERRY = sys.argv[1]
DT = {np.dtype("bool"): "BOOL", np.dtype("uint8"): "U8", np.dtype("int8"): "I8", np.dtype("uint16"): "U16",
      np.dtype("int16"): "I16", np.dtype("uint32"): "U32", np.dtype("int32"): "I32", np.dtype("uint64"): "U64",
      np.dtype("int64"): "I64", np.dtype("float16"): "F16", np.dtype("float32"): "F32", np.dtype("float64"): "F64"}


def main():
    rng = np.random.default_rng(7)
    cases = {
        "dtypes": {f"t.{d.name}": (rng.integers(0, 2, (3, 5)).astype(d) if d.kind == "b"
                                   else (rng.standard_normal((3, 5)) * 100).astype(d)) for d in DT},
        "shapes": {"scalar": np.array(3.5, dtype=np.float32), "empty": np.zeros((0, 4), np.float16),
                   "big": rng.standard_normal((257, 129)).astype(np.float32), "odd": np.arange(7, dtype=np.int8),
                   "4d": rng.standard_normal((2, 3, 4, 5)).astype(np.float64)},
        "many": {f"layer.{i}.w": rng.standard_normal((i % 7 + 1, 3)).astype(np.float32) for i in range(300)},
    }
    passed = failed = 0
    d = tempfile.mkdtemp(prefix="ferry-st-")
    for name, tensors in cases.items():
        path = os.path.join(d, name + ".safetensors")
        meta = {"format": "np", "case": name}
        save_file(tensors, path, metadata=meta)
        ref = load_file(path)
        r = subprocess.run([FERRY, "inspect", "--json", path], capture_output=True, text=True)
        problems = []
        if r.returncode:
            problems.append(f"inspect exit {r.returncode}: {r.stderr.strip()}")
        else:
            info = json.loads(r.stdout)
            if info["metadata"] != meta:
                problems.append(f"metadata {info['metadata']} != {meta}")
            got = {t["name"]: t for t in info["tensors"]}
            if set(got) != set(ref):
                problems.append("tensor names differ")
            for k, v in ref.items():
                t = got.get(k)
                if not t:
                    continue
                if t["dtype"] != DT[v.dtype] or t["shape"] != list(v.shape):
                    problems.append(f"{k}: {t['dtype']}{t['shape']} != {DT[v.dtype]}{list(v.shape)}")
                data = subprocess.run([FERRY, "cat", "--", path, k], capture_output=True).stdout
                if data != v.tobytes():
                    problems.append(f"{k}: bytes differ")
        if problems:
            failed += 1
            print(f"FAIL {name}: " + "; ".join(problems[:5]))
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
