#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry convert` on every valid golden checkpoint: the output must open, hold
the same tensors (equal model and tensor hashes: names, dtypes, shapes and
bytes; a PyTorch strided view's bytes, in the source as in the output, are
its elements gathered in row-major order), start
its data section at the alignment, and put every tensor whose size is a
multiple of the alignment at an aligned offset. With the reference
`safetensors` package installed, it must load the output with identical bytes.

    run_convert.py FERRY GOLDEN_DIR
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

# dtypes a safetensors file can hold (GGUF's block-quantized ones it cannot)
ST_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64", "C64",
             "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"}


def ferry(*args):
    return subprocess.run([sys.argv[1], *args], capture_output=True, text=True, timeout=120)


def main():
    golden = sys.argv[2]
    with open(os.path.join(golden, "manifest.json")) as f:
        cases = json.load(f)["cases"]
    try:
        from safetensors import safe_open  # noqa: F401
        have_ref = True
    except ImportError:
        have_ref = False
    passed = failed = 0
    checked = [0]
    out_dir = tempfile.mkdtemp(prefix="ferry-convert-")
    for c in (c for c in cases if c.get("valid")):
        src = os.path.join(golden, c["file"])
        for align in (8, 4096):
            out = os.path.join(out_dir, "out.safetensors")
            r = ferry("convert", "--force", "--align", str(align), src, out)
            problems = []
            no_st = sorted({t["dtype"] for t in c["tensors"]} - ST_DTYPES)
            if no_st:  # GGUF's block-quantized types: refused, with a one-line reason
                if r.returncode != 1 or "which safetensors has no dtype for" not in r.stderr:
                    problems.append(f"{no_st[0]} tensors: convert exit {r.returncode} ({r.stderr.strip()}), "
                                    "expected 1 with 'which safetensors has no dtype for'")
            elif r.returncode != 0:
                problems.append(f"convert exit {r.returncode}: {r.stderr.strip()}")
            else:
                j1 = json.loads(ferry("hash", "--json", src).stdout)
                j2 = json.loads(ferry("hash", "--json", out).stdout)
                # a strided view (PyTorch) hashes as its elements in row-major order,
                # which is what convert writes: the model hash must not change
                if j1["model"] != j2["model"]:
                    problems.append(f"model hash {j1['model']} != {j2['model']}")
                x2 = {t["name"]: t for t in j2["tensors"]}
                for t in j1["tensors"]:
                    u = x2.get(t["name"], {})
                    if (t["xxh3"], t["nbytes"]) != (u.get("xxh3"), u.get("nbytes")):
                        problems.append(f"{t['name']}: hash/nbytes {t['xxh3']}/{t['nbytes']} before, "
                                        f"{u.get('xxh3')}/{u.get('nbytes')} after")
                        break
                for t in c["tensors"]:
                    if "gathered_sha256" not in t:
                        continue
                    got = subprocess.run([sys.argv[1], "cat", "--", out, t["name"]], capture_output=True,
                                         timeout=60).stdout
                    if hashlib.sha256(got).hexdigest() != t["gathered_sha256"]:
                        problems.append(f"{t['name']}: converted bytes are not its elements in row-major order")
                        break
                with open(out, "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                if (8 + n) % align:
                    problems.append(f"data starts at {8 + n}, not a multiple of {align}")
                info = json.loads(ferry("inspect", "--json", out).stdout)
                for t in info["tensors"]:
                    if t["nbytes"] % align == 0 and t["offset"] % align:
                        problems.append(f"{t['name']}: {t['nbytes']} bytes at unaligned offset {t['offset']}")
                        break
                if have_ref and not problems:
                    from safetensors import safe_open
                    with safe_open(out, framework="numpy") as sf:
                        keys = set(sf.keys())
                        if keys != {t["name"] for t in info["tensors"]}:
                            problems.append("the safetensors package sees other tensor names")
                        for t in info["tensors"][:200]:
                            try:
                                ref = sf.get_tensor(t["name"]).tobytes()
                            except Exception:  # dtypes numpy lacks (BF16, F8, F4...): names only
                                continue
                            mine = subprocess.run([sys.argv[1], "cat", "--", out, t["name"]], capture_output=True,
                                                  timeout=60).stdout
                            if ref != mine:
                                problems.append(f"{t['name']}: bytes differ from the safetensors package's")
                                break
                            checked[0] += 1
            if problems:
                failed += 1
                print(f"FAIL {c['file']} --align {align}: {'; '.join(problems)}")
            else:
                passed += 1
    if have_ref:
        print(f"{checked[0]} tensors compared byte for byte with the safetensors package")
    else:
        print("the safetensors package is not installed: names and bytes checked through ferry only")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
