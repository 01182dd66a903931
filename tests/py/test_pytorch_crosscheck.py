#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_pytorch_crosscheck - ferry's PyTorch zip reader against real torch.

    test_pytorch_crosscheck.py FERRY [--seeds DIR]

torch.save writes state dicts of every dtype ferry maps, scalars, empty
tensors, strided views (transposed, stepped, expanded, permuted, narrowed),
views with storage offsets, storages shared by several tensors, the same
tensor under two names, nested and Lightning-like trees (a real Adam
optimizer's state, int keys, non-tensor leaves), nn.Module state dicts
(OrderedDict + _metadata), Parameters, pickle protocols 2, 4 and 5, with the
default and an explicit _use_new_zipfile_serialization=True. For each file,
`ferry inspect --json` must list exactly the tensors torch.load gives back
(named by the same dotted flattening), with torch's dtype, shape, strides (when
not row-major), flags and byte count, and `ferry cat` must give the bytes torch
holds: the tensor's own bytes when contiguous, else the storage's bytes from
its first to one past its last element.

Then the refusals: a checkpoint whose data.pkl calls os.system("touch MARKER")
(built by hand; torch.load of it really runs the command, which is checked
first with a second marker) must be refused naming 'os.system' without the
marker appearing; complex128 and the legacy (non-zip) format are refused as
unsupported.

Needs torch: this Python's, or Debian's python3-torch under /usr/bin/python3
(the test re-runs itself there). Exits 77 (skipped) when neither has it.
--seeds DIR also writes the small checkpoints to DIR/zip/torch113-*.pt and
their data.pkl to DIR/pickle/ (fuzzing seeds). Prints "N passed, N failed".
"""
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

try:
    import torch
except ImportError:
    torch = None


def reexec_or_skip():
    alt = "/usr/bin/python3"
    if os.environ.get("FERRY_XCHECK_REEXEC") or not os.path.exists(alt) or os.path.realpath(sys.executable) == alt:
        print("torch is not importable: pytorch_crosscheck skipped (scripts/deps.sh installs python3-torch)")
        sys.exit(77)
    if subprocess.run([alt, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"torch is importable neither here nor by {alt}: pytorch_crosscheck skipped")
        sys.exit(77)
    env = dict(os.environ, FERRY_XCHECK_REEXEC="1")
    sys.exit(subprocess.call([alt, os.path.abspath(__file__)] + sys.argv[1:], env=env))


if torch is None:
    reexec_or_skip()

FERRY_DTYPE = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.complex64: "C64",
}
for name, fd in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("float8_e4m3fn", "F8_E4M3"),
                 ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, name):
        FERRY_DTYPE[getattr(torch, name)] = fd


class Check:
    def __init__(self, ferry):
        self.ferry = ferry
        self.passed = self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {what}", flush=True)
        return cond

    def run(self, *args):
        return subprocess.run([self.ferry, *args], capture_output=True, timeout=60)


def flatten(obj):
    """(name, tensor) as ferry names them: dict keys (str, int) and list or
    tuple indices joined with dots; other leaves skipped."""
    out = []

    def walk(v, path, depth):
        if isinstance(v, torch.Tensor):
            out.append((path, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, (torch.Tensor, dict, list, tuple)):
                    walk(x, str(k) if depth == 0 else f"{path}.{k}", depth + 1)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                if isinstance(x, (torch.Tensor, dict, list, tuple)):
                    walk(x, str(i) if depth == 0 else f"{path}.{i}", depth + 1)

    walk(obj, "", 0)
    return out


def storage_bytes(t):
    """All bytes of t's storage."""
    if hasattr(t, "untyped_storage"):  # torch 2.x
        u = t.untyped_storage()
        return torch.empty(0, dtype=torch.uint8).set_(u).numpy().tobytes() if u.nbytes() else b""
    st = t.storage()
    if st.size() == 0:
        return b""
    flat = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.size(),), (1,))
    return flat.view(torch.uint8).numpy().tobytes()


def storage_id(t):
    """(address, bytes) of t's storage."""
    if hasattr(t, "untyped_storage"):
        u = t.untyped_storage()
        return u.data_ptr(), u.nbytes()
    return t.storage().data_ptr(), t.storage().size() * t.element_size()


def load(path):
    try:
        return torch.load(path, weights_only=False)
    except TypeError:  # a torch without weights_only
        return torch.load(path)


def expected(t):
    """(strides or None, nbytes, the bytes cat writes) as ferry must report them."""
    el = t.element_size()
    numel = t.numel()
    if numel == 0:
        return None, 0, b""
    contig = t.is_contiguous()
    span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    sb = storage_bytes(t)
    off = t.storage_offset() * el
    if contig:
        own = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        assert own == sb[off:off + numel * el]
        return None, numel * el, own
    # nbytes is the span in the storage; cat writes the elements in row-major order
    return list(t.stride()), span * el, t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def check_file(c, path, what):
    r = c.run("inspect", "--json", path)
    if not c.ok(r.returncode == 0, f"{what}: inspect exit {r.returncode}: {r.stderr.decode().strip()}"):
        return
    out = json.loads(r.stdout)
    c.ok(out["format"] == "pytorch", f"{what}: format {out['format']}")
    loaded = load(path)
    ref = flatten(loaded)
    got = {t["name"]: t for t in out["tensors"]}
    c.ok(sorted(got) == sorted(n for n, _ in ref),
         f"{what}: names {sorted(got)} != torch's {sorted(n for n, _ in ref)}")
    users = collections.Counter(storage_id(t)[0] for _, t in ref if storage_id(t)[1])
    for name, t in ref:
        g = got.get(name)
        if g is None:
            continue
        w = f"{what}: {name!r}"
        strides, nbytes, data = expected(t)
        c.ok(g["dtype"] == FERRY_DTYPE[t.dtype], f"{w}: dtype {g['dtype']}, torch {t.dtype}")
        c.ok(g["shape"] == list(t.shape), f"{w}: shape {g['shape']}, torch {list(t.shape)}")
        c.ok(g.get("strides") == strides, f"{w}: strides {g.get('strides')}, torch {list(t.stride())}")
        c.ok(g["nbytes"] == nbytes, f"{w}: nbytes {g['nbytes']}, expected {nbytes}")
        flags = set(g.get("flags", []))
        c.ok(("noncontiguous" in flags) == (t.numel() > 0 and not t.is_contiguous()), f"{w}: flags {flags}")
        if storage_id(t)[1]:
            shared = users[storage_id(t)[0]] > 1
            c.ok(("shared_storage" in flags) == shared, f"{w}: flags {flags}, shared {shared}")
        r = c.run("cat", "--", path, name)
        c.ok(r.returncode == 0 and r.stdout == data,
             f"{w}: cat gave {len(r.stdout)} bytes (sha {hashlib.sha256(r.stdout).hexdigest()[:12]}), expected "
             f"{len(data)} (sha {hashlib.sha256(data).hexdigest()[:12]}); {r.stderr.decode().strip()}")
    r = c.run("hash", "--json", path)
    c.ok(r.returncode == 0, f"{what}: hash exit {r.returncode}: {r.stderr.decode().strip()}")


def checkpoints():
    """(name, object, save kwargs) of every case."""
    torch.manual_seed(0)
    cases = []
    dt = collections.OrderedDict()
    for d in FERRY_DTYPE:
        if d == torch.bool:
            dt["bool"] = torch.rand(2, 3) > 0.5
        elif d.is_floating_point or d.is_complex:
            dt[str(d).split(".")[1]] = (torch.randn(2, 3) * 10).to(d)
        else:
            dt[str(d).split(".")[1]] = torch.randint(-100 if d != torch.uint8 else 0, 100, (2, 3)).to(d)
    cases.append(("dtypes", dt, {}))
    cases.append(("dtypes_p4", dt, {"pickle_protocol": 4}))
    cases.append(("scalars_empty", {"s.f32": torch.tensor(1.5), "s.i64": torch.tensor(7), "s.bool": torch.tensor(True),
                                    "e1": torch.empty(0), "e2": torch.zeros(3, 0), "e3": torch.ones(0, 2, 5).half()},
                  {"_use_new_zipfile_serialization": True}))
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    v = collections.OrderedDict([
        ("base", base), ("t", base.t()), ("step", base[:, ::2]), ("row", base[2]), ("rows", base[1:3]),
        ("block", base[1:3, 2:5]), ("col", base[:, 4]), ("exp", torch.arange(3.0).expand(5, 3)),
        ("perm", torch.arange(60, dtype=torch.int16).reshape(3, 4, 5).permute(2, 0, 1)),
        ("alias", base), ("tail", base.reshape(-1)[20:]), ("one", base[3:4, 5:6]),
    ])
    cases.append(("views", v, {}))
    cases.append(("views_p5", v, {"pickle_protocol": 5}))
    lin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    lin(torch.randn(5, 4)).sum().backward()
    opt.step()
    cases.append(("module_state_dict", lin.state_dict(), {}))
    cases.append(("lightning", {
        "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.1.0", "state_dict": lin.state_dict(),
        "optimizer_states": [opt.state_dict()], "lr_schedulers": [], "callbacks": {"ModelCheckpoint{}": {
            "best_model_score": torch.tensor(0.25), "best_model_path": "x.ckpt"}},
        "hyper_parameters": {"lr": 1e-3, "sizes": [4, 3, 2], "name": "net"}, "hparams_name": "kwargs"}, {}))
    cases.append(("nested", {"model": {"encoder": {"w": torch.randn(3, 3), "layers": [torch.randn(2), torch.randn(2)]},
                                       "decoder": (torch.ones(1), {"b": torch.zeros(2, dtype=torch.int8)})},
                             "params": {"p": torch.nn.Parameter(torch.randn(2, 2))}, "meta": {"n": 1, "f": 0.5}}, {}))
    enc = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32)
    cases.append(("transformer", enc.state_dict(), {"pickle_protocol": 4}))
    cases.append(("whole_tensor", {"x": torch.randn(5, 5).t().contiguous().t()}, {}))
    return cases


def main():
    args = sys.argv[1:]
    seeds = None
    if "--seeds" in args:
        i = args.index("--seeds")
        seeds = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        print("usage: test_pytorch_crosscheck.py FERRY [--seeds DIR]", file=sys.stderr)
        return 2
    c = Check(os.path.abspath(args[0]))
    print(f"torch {torch.__version__} ({sys.executable})")
    with tempfile.TemporaryDirectory(prefix="ferry-ptx-") as tmp:
        for name, obj, kw in checkpoints():
            path = os.path.join(tmp, name + ".pt")
            torch.save(obj, path, **kw)
            check_file(c, path, name)
            if seeds and os.path.getsize(path) <= 16384:
                os.makedirs(os.path.join(seeds, "zip"), exist_ok=True)
                os.makedirs(os.path.join(seeds, "pickle"), exist_ok=True)
                with open(path, "rb") as f, open(os.path.join(seeds, "zip", f"torch113-{name}.pt"), "wb") as o:
                    o.write(f.read())
                with zipfile.ZipFile(path) as z, open(os.path.join(seeds, "pickle", f"torch113-{name}.pkl"), "wb") as o:
                    o.write(z.read(next(n for n in z.namelist() if n.endswith("/data.pkl"))))

        # A malicious checkpoint: data.pkl runs os.system("touch MARKER").
        for marker_name, mod in (("MARKER", "os"), ("MARKER_posix", "posix")):
            marker = os.path.join(tmp, marker_name)
            cmd = f"touch {marker}".encode()
            pkl = (b"\x80\x02c" + mod.encode() + b"\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.")
            evil = os.path.join(tmp, f"evil_{mod}.pt")
            with zipfile.ZipFile(evil, "w", zipfile.ZIP_STORED) as z:
                z.writestr("evil/data.pkl", pkl)
                z.writestr("evil/version", "3\n")
            r = c.run("inspect", "--json", evil)
            msg = r.stderr.decode()
            c.ok(r.returncode == 1 and f"refuses global '{mod}.system'" in msg,
                 f"malicious {mod}.system: exit {r.returncode}, message {msg.strip()!r}")
            r = c.run("hash", evil)
            c.ok(r.returncode == 1 and f"refuses global '{mod}.system'" in r.stderr.decode(), f"hash of malicious {mod}")
            c.ok(not os.path.exists(marker), f"malicious {mod}.system: {marker} exists: something ran the pickle")
        # ...and it is a real exploit: torch.load (a subprocess, in tmp) runs it.
        proof = os.path.join(tmp, "PROOF")
        cmd = f"touch {proof}".encode()
        pkl = b"\x80\x02cos\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
        evil = os.path.join(tmp, "evil_proof.pt")
        with zipfile.ZipFile(evil, "w", zipfile.ZIP_STORED) as z:
            z.writestr("evil/data.pkl", pkl)
            z.writestr("evil/version", "3\n")
        subprocess.run([sys.executable, "-c", f"import torch\ntry:\n torch.load({evil!r}, weights_only=False)\n"
                        f"except TypeError:\n torch.load({evil!r})"], capture_output=True, cwd=tmp, timeout=120)
        c.ok(os.path.exists(proof), "the malicious file is not a working exploit for torch.load (test is vacuous)")

        # Refused as unsupported, with a reason.
        p = os.path.join(tmp, "c128.pt")
        torch.save({"z": torch.ones(2, dtype=torch.complex128)}, p)
        r = c.run("inspect", p)
        c.ok(r.returncode == 1 and b"complex128" in r.stderr and b"no ferry equivalent" in r.stderr,
             f"complex128: exit {r.returncode}, {r.stderr.decode().strip()!r}")
        p = os.path.join(tmp, "legacy.pt")
        torch.save({"w": torch.ones(2)}, p, _use_new_zipfile_serialization=False)
        r = c.run("inspect", p)
        c.ok(r.returncode == 1 and b"legacy (pre-1.6, non-zip)" in r.stderr,
             f"legacy format: exit {r.returncode}, {r.stderr.decode().strip()!r}")
    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
