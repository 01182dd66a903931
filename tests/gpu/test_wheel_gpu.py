#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The binding's wheel on the GPU machine (its Python, its torch): install a
built wheel into a fresh target folder, and from outside the source tree,
with FERRY_LIBRARY unset, import ferry from there (its bundled libferry.so)
and load a checkpoint onto cuda:0 through ferry.torch.load_file, bit for bit
against the bytes torch wrote.

    python3 tests/gpu/test_wheel_gpu.py WHEEL
Prints `N passed, N failed`; exit 0 when all passed, 77 when there is no CUDA.
"""
import os
import subprocess
import sys
import tempfile

PROBE = r"""
import os, sys, struct, json
import torch
import ferry, ferry.torch
p = ferry.library_path
assert os.path.dirname(p) == os.path.dirname(ferry.__file__), p
assert p.startswith(sys.argv[2]), (p, sys.argv[2])
g = torch.Generator().manual_seed(0)
ref = {"a": torch.randn(1024, 4096, generator=g).to(torch.bfloat16),
       "b": torch.randn(3, 5, generator=g),
       "c": torch.arange(1000, dtype=torch.int64)}
# a safetensors file written by hand (no safetensors package needed)
hdr, blobs, off = {}, [], 0
for k, t in ref.items():
    b = t.contiguous().view(torch.uint8).numpy().tobytes()
    hdr[k] = {"dtype": {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64"}[t.dtype],
              "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
path = os.path.join(sys.argv[1], "w.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
out = ferry.torch.load_file(path, device="cuda:0")
assert sorted(out) == sorted(ref), sorted(out)
for k, t in ref.items():
    assert out[k].device.type == "cuda", (k, out[k].device)
    assert out[k].dtype == t.dtype and out[k].shape == t.shape, k
    assert torch.equal(out[k].cpu().view(torch.uint8), t.view(torch.uint8)), k
print("wheel:", ferry.__version__, "python", sys.version.split()[0], "torch", torch.__version__, "from", p)
"""


def main():
    whl = os.path.abspath(sys.argv[1])
    try:
        import torch
        if not torch.cuda.is_available():
            print("test_wheel_gpu: no CUDA device: skipped")
            return 77
    except ImportError:
        print("test_wheel_gpu: no torch: skipped")
        return 77
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-gpu-") as tmp:
        site = os.path.join(tmp, "site")
        env = {k: v for k, v in os.environ.items() if k not in ("FERRY_LIBRARY", "PYTHONPATH")}
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--disable-pip-version-check", "--target", site, whl], env=env)
        ok = r.returncode == 0
        print(("PASS" if ok else "FAIL"), "pip install --target", os.path.basename(whl))
        passed, failed = passed + ok, failed + (not ok)
        if ok:
            env["PYTHONPATH"] = site
            r = subprocess.run([sys.executable, "-c", PROBE, tmp, site], env=env, cwd=tmp)
            ok = r.returncode == 0
            print(("PASS" if ok else "FAIL"), "import from the wheel, load_file to cuda:0, bit-identical")
            passed, failed = passed + ok, failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
