#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_gguf_crosscheck - ferry's GGUF reader against the reference `gguf`
package (llama.cpp's gguf-py, from PyPI).

    test_gguf_crosscheck.py FERRY

Files written by gguf.GGUFWriter (F32/F16/F64/I8..I64 from numpy arrays, every
block-quantized type gguf-py knows as raw bytes, metadata of every value type,
a custom alignment) and by ferry's own tests/data/gguf_writer.py are read by
gguf.GGUFReader and by `ferry inspect --json` / `ferry cat`; the two must agree
on every tensor's name, type, shape (ferry reports it outermost-first, GGUF
lists ne innermost-first), byte size, absolute offset and bytes, and on the
metadata's values. A big-endian file from GGUFWriter must be refused with a
message that says so. Exits 77 (skipped) when gguf or numpy cannot be
imported (scripts/deps.sh installs them).
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:
    print(f"skipped: {e} (python3 -m pip install gguf numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import gguf_writer as gw  # noqa: E402

FERRY = None
passed = failed = 0
# gguf-py's size table has Q8_1 as 40 bytes (float d and s); ggml's block_q8_1
# is 36 (two halves), which ferry follows. Q8_1 is never stored in files.
SKIP_TYPES = {"Q8_1"}


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}")
    return cond


def ferry(*args):
    return subprocess.run([FERRY, *args], capture_output=True, timeout=120)


def field_value(f):
    """A reader field as (value type, value) for gguf_writer.value_json."""
    vt = int(f.types[0])
    if vt == gw.ARRAY:
        et = int(f.types[-1])
        if len(f.types) > 2:
            return None  # nested: gguf-py's contents() flattens them
        return vt, (et, f.contents())
    return vt, f.contents()


def compare(path, what):
    r = ferry("inspect", "--json", path)
    if not check(r.returncode == 0, f"{what}: ferry inspect exit {r.returncode}: {r.stderr.decode()[:300]}"):
        return
    info = json.loads(r.stdout)
    check(info["format"] == "gguf", f"{what}: format {info['format']}")
    rd = gguf.GGUFReader(path)
    ref = sorted(enumerate(rd.tensors), key=lambda x: (int(x[1].data_offset), int(x[1].n_bytes), x[0]))
    got = info["tensors"]
    if not check(len(got) == len(ref), f"{what}: {len(got)} tensors, gguf-py reads {len(ref)}"):
        return
    for (_, t), g in zip(ref, got):
        want = {"name": t.name, "dtype": gguf.GGMLQuantizationType(int(t.tensor_type)).name,
                "shape": [int(x) for x in reversed(t.shape.tolist())], "nbytes": int(t.n_bytes),
                "offset": int(t.data_offset)}
        have = {k: g[k] for k in want}
        if not check(have == want, f"{what}: tensor {t.name!r}: ferry {have}, gguf-py {want}"):
            continue
        c = ferry("cat", "--", path, t.name)
        check(c.returncode == 0 and c.stdout == t.data.tobytes(),
              f"{what}: cat {t.name!r}: {len(c.stdout)} bytes differ from gguf-py's {t.data.nbytes}")
    nmeta = 0
    for name, f in rd.fields.items():
        if name.startswith("GGUF."):
            continue
        nmeta += 1
        fv = field_value(f)
        if fv is None:
            check(name in info["metadata"], f"{what}: metadata {name!r} missing")
            continue
        want = gw.value_json(*fv)
        check(info["metadata"].get(name) == want,
              f"{what}: metadata {name!r}: ferry {info['metadata'].get(name)!r}, gguf-py {want!r}")
    check(nmeta == len(info["metadata"]), f"{what}: {len(info['metadata'])} metadata keys, gguf-py {nmeta}")


def write_with_gguf_py(path, alignment=None, endianess=gguf.GGUFEndian.LITTLE):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "llama", endianess=endianess)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_name("crosscheck")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -7)
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 40))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nwörld")
    w.add_array("t.arr.int", [1, 2, 3])
    w.add_array("t.arr.str", ["a", "b\"c"])
    w.add_array("t.arr.long", list(range(100)))
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(500)])
    w.add_tensor("f32", rng.standard_normal((3, 4), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 5)).astype(np.float16))
    w.add_tensor("f64", rng.standard_normal(7))
    for dt in (np.int8, np.int16, np.int32, np.int64):
        w.add_tensor(f"int.{np.dtype(dt).name}", rng.integers(-100, 100, size=(2, 3), dtype=dt))
    nq = 0
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if block == 1 or qt.name in SKIP_TYPES or qt.name not in gw.GGML_TYPES:
            continue
        rows = 1 + nq % 3
        raw = rng.integers(0, 256, size=(rows, 2 * size), dtype=np.uint8)
        w.add_tensor(f"q.{qt.name.lower()}", raw, raw_dtype=qt)
        nq += 1
    bf = rng.integers(0, 65536, size=(4, 6), dtype=np.uint16).view(np.uint8)
    w.add_tensor("bf16", bf, raw_shape=(4, 6), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return nq


def main():
    global FERRY
    if len(sys.argv) != 2:
        print("usage: test_gguf_crosscheck.py FERRY", file=sys.stderr)
        return 2
    FERRY = os.path.abspath(sys.argv[1])
    # gguf-py's block sizes are ggml's, and so are gguf_writer.py's
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qt.name in gw.GGML_TYPES and qt.name not in SKIP_TYPES:
            check(gw.GGML_TYPES[qt.name] == (int(qt), block, size),
                  f"type {qt.name}: gguf-py {(int(qt), block, size)}, gguf_writer {gw.GGML_TYPES[qt.name]}")
    with tempfile.TemporaryDirectory(prefix="ferry-gguf-xcheck-") as d:
        p = os.path.join(d, "gguf_py.gguf")
        nq = write_with_gguf_py(p)
        check(nq >= 20, f"only {nq} quantized types written")
        compare(p, "GGUFWriter file")
        p = os.path.join(d, "gguf_py_align64.gguf")
        write_with_gguf_py(p, alignment=64)
        compare(p, "GGUFWriter file, alignment 64")
        # ferry's own test writer, read by the reference reader too
        p = os.path.join(d, "gw.gguf")
        rng = np.random.default_rng(3)
        ts = []
        for i, (name, (_, block, size)) in enumerate(gw.GGML_TYPES.items()):
            shape = [2, 3 * block] if block > 1 else [3, 2]
            ts.append((f"gw.{name.lower()}", name, shape, rng.bytes(gw.nbytes(name, shape))))
        kvs = [("general.architecture", gw.STRING, "llama"), ("k.f32", gw.FLOAT32, 1e-5),
               ("k.arr", gw.ARRAY, (gw.INT32, [5, -6])), ("k.bools", gw.ARRAY, (gw.BOOL, [True, False]))]
        known = {q.name for q in gguf.GGMLQuantizationType}  # an older gguf-py may lack the newest types
        gw.write(p, [t for t in ts if t[1] not in SKIP_TYPES and t[1] in known], kvs)
        compare(p, "gguf_writer.py file")
        # big-endian files are refused, by name
        p = os.path.join(d, "big_endian.gguf")
        write_with_gguf_py(p, endianess=gguf.GGUFEndian.BIG)
        r = ferry("inspect", p)
        check(r.returncode == 1 and b"big-endian" in r.stderr and r.stderr.count(b"\n") == 1,
              f"big-endian file: exit {r.returncode}, stderr {r.stderr[:200]!r}")
    check_pack_dequantizers()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def check_pack_dequantizers():
    """The ComfyUI node pack's dequantizers (integrations/comfyui/gguf_quants.py,
    torch) against gguf-py's, bit for bit, on random blocks of every type the
    pack reads: random bytes with the f16 fields drawn sane (random bytes there
    give infinities and NaNs). Skipped where torch cannot be imported."""
    try:
        import importlib.util
        import torch
    except ImportError as e:
        print(f"pack dequantizers: skipped ({e})")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "gguf_quants", os.path.join(here, "..", "..", "integrations", "comfyui", "gguf_quants.py"))
    gq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gq)
    f16_fields = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
                  "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
    check(sorted(f16_fields) == sorted(gq.SIZES), f"pack types {sorted(gq.SIZES)}")
    rng = np.random.default_rng(11)
    for name, (block, size) in gq.SIZES.items():
        qt = getattr(gguf.GGMLQuantizationType, name)
        check(gguf.GGML_QUANT_SIZES[qt] == (block, size), f"{name}: block {(block, size)}")
        n = 61
        raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
        for off in f16_fields[name]:
            raw[:, off:off + 2] = rng.uniform(-1, 1, n).astype("<f2").view(np.uint8).reshape(n, 2)
        want = gguf.quants.dequantize(raw.reshape(-1), qt).reshape(n, block).astype(np.float32)
        got = gq.dequantize(torch.from_numpy(raw.reshape(-1).copy()), name, (n, block)).numpy()
        check(np.array_equal(want, got), f"{name}: the pack's dequantized values differ from gguf-py's "
                                         f"(max {np.abs(want - got).max()})")


if __name__ == "__main__":
    sys.exit(main())
