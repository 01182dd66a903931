#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry convert --dtype` against torch's casts on edge values (zeros,
subnormals, ties, max, Inf, NaN payloads) and 20000 random bit patterns.
F64 -> F16 is checked against numpy (one rounding): torch casts a double to
half through float, rounding twice. NaN only needs to stay NaN (torch writes
one canonical NaN, ferry keeps the payload's top bits).

    run_convert_dtype.py FERRY
"""
import warnings
warnings.simplefilter("ignore")
import sys, struct, subprocess, os, json, tempfile, numpy as np, torch
sys.path.insert(0, "tests/data")
FERRY = sys.argv[1]
d = tempfile.mkdtemp()
# edge values as float32 bits
bits = [0, 0x80000000, 1, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
        0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff, 0x3f808000, 0x3f818000, 0x3f808001, 0x477ff000, 0x477fe000,
        0x33800000, 0x33000000, 0x33000001, 0x387fc000, 0x38800000, 0x7f7f8000, 0x7f7f7fff, 0x3fc00000]
rng = np.random.default_rng(1)
a = np.concatenate([np.array(bits, dtype=np.uint32), rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)]).view(np.float32)
def write(path, tensors):
    hdr = {}; off = 0; blobs = []
    for n, (dt, arr) in tensors.items():
        b = arr.tobytes(); hdr[n] = {"dtype": dt, "shape": [arr.size], "data_offsets": [off, off + len(b)]}; off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
src = os.path.join(d, "in.safetensors")
t32 = torch.from_numpy(a.copy())
f16 = a.astype(np.float16)  # source F16 values
bf = t32.to(torch.bfloat16).view(torch.int16).numpy()
write(src, {"f32": ("F32", a), "f16": ("F16", f16), "bf16": ("BF16", bf), "f64": ("F64", a.astype(np.float64) * 1.0000001), "i32": ("I32", a.view(np.int32))})
bad = 0
for dt, tdt in (("BF16", torch.bfloat16), ("F16", torch.float16), ("F32", torch.float32)):
    out = os.path.join(d, dt + ".safetensors")
    r = subprocess.run([FERRY, "convert", "--force", "--dtype", dt, src, out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hl = struct.unpack("<Q", open(out, "rb").read(8))[0]; raw = open(out, "rb").read(); hdr = json.loads(raw[8:8 + hl])
    for name, srct in (("f32", t32), ("f16", torch.from_numpy(f16.copy())), ("bf16", torch.from_numpy(bf.copy()).view(torch.bfloat16)), ("f64", torch.from_numpy(a.astype(np.float64) * 1.0000001))):
        e = hdr[name]; assert e["dtype"] == dt, (name, e)
        got = torch.frombuffer(bytearray(raw[8 + hl + e["data_offsets"][0]: 8 + hl + e["data_offsets"][1]]), dtype=tdt)
        want = srct.to(tdt)
        if name == "f64" and dt == "F16":
            want = torch.from_numpy(srct.numpy().astype(np.float16))
        gi = got.view(torch.int16 if tdt != torch.float32 else torch.int32); wi = want.view(gi.dtype)
        nan = torch.isnan(want)
        mism = ((gi != wi) & ~nan) | (torch.isnan(got) != nan)
        if mism.any():
            bad += 1; i = int(mism.nonzero()[0]); print("MISMATCH", dt, name, i, srct[i].item(), gi[i].item(), wi[i].item())
        else: print("ok", name, "->", dt, int(nan.sum()), "NaNs")
    assert hdr["i32"]["dtype"] == "I32"
print("FAIL" if bad else "PASS"); sys.exit(1 if bad else 0)
