# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the Python binding's tests (tests/py/test_binding*.py).

The package is imported from python/ of this checkout (put first on sys.path
unless FERRY_TEST_INSTALLED=1, to test an installed copy); libferry.so is the
one in $FERRY_LIBRARY (run_python_tests.sh passes the built one) or
build/libferry.so.

Reference files come from writers independent of ferry: the `safetensors`
package (in this interpreter, or in another one that has it: see
reference_writer), real torch.save, and ferry's own test-data writers in
tests/data (written from the specifications, not from ferry's C code).
"""
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if os.environ.get("FERRY_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))


def raw_bytes(seed, n, dtype):
    """Deterministic bytes for a tensor: the same in every interpreter (the
    reference writer runs this same code in a subprocess)."""
    b = random.Random(seed).randbytes(n)
    if dtype == "BOOL":
        b = bytes(x & 1 for x in b)
    return b


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# Run by an interpreter that has the safetensors package (and numpy, maybe
# torch): writes the tensors described on stdin with safetensors.numpy (or
# safetensors.torch for dtypes numpy lacks, when torch is there) and prints the
# names it could write.
_WRITER = r'''
import json, random, sys
import numpy as np
from safetensors.numpy import save_file
spec = json.load(sys.stdin)
NP = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
      "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16,
      "F32": np.float32, "F64": np.float64, "C64": np.complex64}
TORCH = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
def raw(seed, n, dtype):
    b = random.Random(seed).randbytes(n)
    return bytes(x & 1 for x in b) if dtype == "BOOL" else b
arrays, tensors = {}, {}
for name, dtype, shape, seed, nbytes in spec["tensors"]:
    if dtype in NP:
        arrays[name] = np.frombuffer(raw(seed, nbytes, dtype), dtype=NP[dtype]).reshape(shape).copy()
    else:
        try:
            import torch
            dt = getattr(torch, TORCH[dtype])
        except (ImportError, AttributeError, KeyError):
            continue
        u8 = torch.frombuffer(bytearray(raw(seed, nbytes, dtype)), dtype=torch.uint8)
        tensors[name] = u8.view(dt).reshape(shape).clone() if nbytes else torch.empty(shape, dtype=dt)
if tensors:
    from safetensors.torch import save_file as save_torch
    import torch
    for k, v in arrays.items():
        try:
            tensors[k] = torch.from_numpy(v)
        except TypeError:  # no uint16/32/64 before torch 2.3 (Debian's 1.13)
            pass
    save_torch(tensors, spec["path"], metadata=spec.get("metadata"))
    wrote = list(tensors)
else:
    save_file(arrays, spec["path"], metadata=spec.get("metadata"))
    wrote = list(arrays)
print(json.dumps(sorted(wrote)))
'''


def _has_safetensors(py):
    try:
        r = subprocess.run([py, "-c", "import safetensors, numpy"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


_reference_python = []


def reference_python():
    """An interpreter that has the safetensors package: this one, else one
    from $FERRY_TEST_PYTHONS or python3 on PATH; None if none has it."""
    if not _reference_python:
        cands = [sys.executable] + os.environ.get("FERRY_TEST_PYTHONS", "").split()
        for name in ("python3", "python"):
            p = shutil.which(name)
            if p:
                cands.append(p)
        found = None
        for py in cands:
            if _has_safetensors(py):
                found = py
                break
        _reference_python.append(found)
    return _reference_python[0]


def write_reference(path, tensors, metadata=None):
    """Write tensors [(name, dtype, shape, seed)] with the reference
    safetensors package. Returns {name: expected bytes} of the tensors it
    wrote (dtypes its interpreter cannot express are left out)."""
    py = reference_python()
    if py is None:
        pytest.skip("the safetensors package is in no interpreter here")
    import stwriter
    spec = {"path": str(path), "metadata": metadata,
            "tensors": [(n, d, list(s), seed, stwriter.nbytes(d, s)) for n, d, s, seed in tensors]}
    r = subprocess.run([py, "-c", _WRITER], input=json.dumps(spec), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"reference writer ({py}) failed:\n{r.stderr}"
    wrote = set(json.loads(r.stdout.strip().splitlines()[-1]))
    return {n: raw_bytes(seed, stwriter.nbytes(d, s), d) for n, d, s, seed in tensors if n in wrote}


@pytest.fixture(scope="session")
def lib_path():
    import ferry
    return ferry.library_path


@pytest.fixture
def sim_free(request):
    """After the test, the module's sim device (its SIM spec) holds nothing:
    every store, streamer and view the test made has let its memory go."""
    yield
    import gc

    import ferry
    gc.collect()
    free, total = ferry.device(request.module.SIM).mem_info()
    assert free == total, f"{total - free} bytes of the sim device still held"
