#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python binding on a real GPU (not run by ctest: CI has no GPU).

    tests/gpu/test_torch_gpu.py [--big PATH --ferry build/ferry] [--device cuda:0]

1. A small diffusion-transformer-like module (patch embedding, adaLN
   attention + MLP blocks, BF16) saved with the reference safetensors package
   (torch.save when it is missing) is loaded with
   ferry.torch.load_file(device="cuda"), ferry.torch.load_file(owner="ferry")
   and ferry.torch.load_model (in place on cuda, and from a meta module): every
   tensor and the module's output must be bit-identical to the module loaded
   with safetensors.torch.load_file (torch.load without it). Also every load
   path, a sharded index, torch.save views on cuda, progress, and errors.
2. ferry.torch.Store on the GPU: the same module attached to a store, at least
   five offload/reload cycles with weights (and a buffer) changed in place on
   the GPU and marked dirty, saved to pinned RAM or (host_budget "1") the spill
   file: the output must equal, every cycle, that of a reference module loaded
   with plain torch and changed the same way. Also two models under a device
   budget of one, each use evicting the other.
3. With --big PATH: the hot-load speed of ferry.torch.load_file(device="cuda")
   against the `ferry load` CLI on the same file (both after warming the page
   cache, best of --repeat). Both figures are printed; the binding must be
   within 5% of the CLI.

Prints PASS/FAIL per check and a final "N passed, N failed" line; exits 1 on
a failure and 77 when there is no GPU. libferry.so: $FERRY_LIBRARY, else
build/libferry.so of this checkout.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))

import torch  # noqa: E402

from gpucheck import check, results  # noqa: E402 (tests/gpu/gpucheck.py, beside this script)

nn = torch.nn


def same(a, b, what=""):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert tuple(a.shape) == tuple(b.shape), f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.device == b.device, f"{what}: device {a.device} != {b.device}"
    if a.numel():
        x, y = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
        if a.dtype == torch.bool:
            x, y = x.to(torch.uint8), y.to(torch.uint8)
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{what}: bytes differ"


def same_dict(a, b):
    assert set(a) == set(b), f"names differ: {sorted(set(a) ^ set(b))[:5]}"
    for k in b:
        same(a[k], b[k], k)


# ---- a small DiT-like module ------------------------------------------------

class Attention(nn.Module):
    def __init__(self, dim, heads, **kw):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, **kw)
        self.proj = nn.Linear(dim, dim, **kw)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax((q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5), dim=-1) @ v
        return self.proj(a.transpose(1, 2).reshape(b, n, d))


class DiTBlock(nn.Module):
    def __init__(self, dim, heads, **kw):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, **kw)
        self.attn = Attention(dim, heads, **kw)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, **kw)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, **kw), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * dim, dim, **kw))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim, **kw))

    def forward(self, x, c):
        s1, g1, a1, s2, g2, a2 = self.adaLN_modulation(c).unsqueeze(1).chunk(6, dim=-1)
        x = x + a1 * self.attn(self.norm1(x) * (1 + g1) + s1)
        return x + a2 * self.mlp(self.norm2(x) * (1 + g2) + s2)


class DiT(nn.Module):
    def __init__(self, dim=256, depth=4, heads=4, patch=2, channels=4, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.x_embedder = nn.Conv2d(channels, dim, patch, patch, **kw)
        self.t_embedder = nn.Sequential(nn.Linear(256, dim, **kw), nn.SiLU(), nn.Linear(dim, dim, **kw))
        self.register_buffer("pos_embed", torch.zeros(1, 64, dim, **kw))
        self.blocks = nn.ModuleList([DiTBlock(dim, heads, **kw) for _ in range(depth)])
        self.final = nn.Linear(dim, patch * patch * channels, **kw)

    def forward(self, x, t):
        x = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed
        c = self.t_embedder(t)
        for b in self.blocks:
            x = b(x, c)
        return self.final(x)


def make_checkpoint(d):
    torch.manual_seed(0)
    m = DiT(dtype=torch.bfloat16)
    with torch.no_grad():
        m.pos_embed.normal_()
        for p in m.parameters():
            p.normal_(0, 0.05)
    sd = m.state_dict()
    try:
        from safetensors.torch import load_file as st_load
        from safetensors.torch import save_file
        path = os.path.join(d, "dit.safetensors")
        save_file(sd, path, metadata={"format": "pt"})
        ref_load = st_load
        how = "safetensors"
    except ImportError:
        path = os.path.join(d, "dit.pt")
        torch.save(sd, path)
        ref_load = lambda p, device: torch.load(p, map_location=device)  # noqa: E731
        how = "torch.save (no safetensors package)"
    print(f"checkpoint: {path} ({how}, {len(sd)} tensors)")
    return path, ref_load


def run_model(m, dev):
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(2, 4, 16, 16, generator=g).to(dev, torch.bfloat16)
    t = torch.randn(2, 256, generator=g).to(dev, torch.bfloat16)
    with torch.no_grad():
        return m(x, t)


# ---- the residency store ------------------------------------------------------

def _attached_ok(store, name, m, tdev):
    """Every tensor of m is a view of the store's device copy."""
    states = store.tensor_states(name)
    for k, t in m.state_dict().items():
        assert t.device.type == tdev.type, f"{k} is on {t.device}"
        assert states[k].tier == "device" and t.data_ptr() == states[k].dptr, f"{k}: not the store's memory"


def store_cycles(ft, path, ref_load, store_dev, tdev, cycles=6, dirty_tiers=("pinned", "host"), **store_kw):
    """Offload/reload cycles of a DiT attached to a Store on store_dev (views on
    tdev), with weights changed in place on the device and marked dirty; every
    output equal to a plain-torch reference changed the same way."""
    ref = DiT(device=tdev, dtype=torch.bfloat16)
    ref.load_state_dict(ref_load(path, device=str(tdev)))
    m = DiT(device="meta", dtype=torch.bfloat16)
    targets = ["blocks.0.attn.qkv.weight", "blocks.2.mlp.2.weight", "final.bias", "pos_embed",
               "x_embedder.weight", "blocks.3.adaLN_modulation.1.weight"]
    g = torch.Generator(device="cpu").manual_seed(7)
    with ft.Store(store_dev, **store_kw) as store:
        store.add("dit", path, module=m)
        assert all(t.is_meta for t in m.state_dict().values())
        kept = dict(m.named_parameters())  # torch 2.3+: the same objects every cycle
        can_swap = hasattr(torch.utils, "swap_tensors")
        changed = set()
        for cycle in range(cycles):
            out = run_model(m, tdev)  # the forward pre-hook brings it back
            _attached_ok(store, "dit", m, tdev)
            for k, p in m.named_parameters():
                assert (p is kept[k]) == can_swap, \
                    f"cycle {cycle}: {k}: Parameter object {'replaced' if can_swap else 'kept'}"
            assert torch.equal(out, run_model(ref, tdev)), f"cycle {cycle}: output differs after reload"
            name = targets[cycle % len(targets)]
            cur, want = m.state_dict()[name], ref.state_dict()[name]
            delta = (torch.randn(tuple(cur.shape), generator=g) * 0.02).to(tdev, torch.bfloat16)
            with torch.no_grad():
                cur.add_(delta)  # in place, on the device, in the store's memory
                want.add_(delta)
            store.mark_dirty("dit", name)
            changed.add(name)
            assert torch.equal(run_model(m, tdev), run_model(ref, tdev)), f"cycle {cycle}: modified output"
            store.offload("dit")
            assert all(t.is_meta for t in m.state_dict().values()), "parameters left pointing at the device"
            states = store.tensor_states("dit")
            for k, st in states.items():
                if k in changed:
                    assert st.dirty and st.tier in dirty_tiers, f"{k}: {st}"
                else:
                    assert st.tier == "source", f"{k}: {st}"
            assert torch.equal(store.read("dit", name), want.cpu()), f"{name}: saved bytes differ"
        store.to_device("dit")
        got = m.state_dict()
        for k, v in ref.state_dict().items():
            same(got[k], v, k)
        assert torch.equal(run_model(m, tdev), run_model(ref, tdev))
        st = store.stats()
        assert st["bytes_dtoh"] > 0 and st["dropped"] > 0
        if "spill" in dirty_tiers:
            assert st["bytes_written"] > 0
        print(f"    {cycles} cycles on {store_dev}: {len(changed)} tensors changed, dirty ones in "
              f"{sorted({s.tier for k, s in states.items() if k in changed})}; moved "
              f"{st['bytes_htod'] / 1e6:.1f} MB in, {st['bytes_dtoh'] / 1e6:.1f} MB out")


def store_two_models(ft, path, ref_load, store_dev, tdev, rounds=4):
    """Two models (one checkpoint, changed differently) under a device budget
    of one: using one evicts the other, whose parameters become meta."""
    refs, mods = [], []
    for k in range(2):
        r = DiT(device=tdev, dtype=torch.bfloat16)
        r.load_state_dict(ref_load(path, device=str(tdev)))
        refs.append(r)
        mods.append(DiT(device="meta", dtype=torch.bfloat16))
    size = sum(t.numel() * t.element_size() for t in refs[0].state_dict().values())
    with ft.Store(store_dev, device_budget=size) as store:
        for k in range(2):
            store.add(f"m{k}", path, module=mods[k])
        for rnd in range(rounds):
            for k in range(2):
                assert torch.equal(run_model(mods[k], tdev), run_model(refs[k], tdev)), f"round {rnd}, m{k}"
                _attached_ok(store, f"m{k}", mods[k], tdev)
                if rnd:
                    assert all(t.is_meta for t in mods[1 - k].state_dict().values()), f"m{1 - k} not re-pointed"
                if rnd == 1:
                    w, v = mods[k].state_dict()["final.weight"], refs[k].state_dict()["final.weight"]
                    with torch.no_grad():
                        w.mul_(0.5 + k)
                        v.mul_(0.5 + k)
                    store.mark_dirty(f"m{k}", "final.weight")
        assert store.stats()["evicted"] > 0


# ---- checks -----------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", help="a large checkpoint for the hot-load speed check")
    ap.add_argument("--ferry", default=os.path.join(ROOT, "build", "ferry"), help="the ferry CLI")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU visible to torch: skipped")
        return 77
    import ferry
    import ferry.torch as ft
    from ferry import _dlpack
    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}; libferry {ferry.library_version} "
          f"at {ferry.library_path}")
    d = tempfile.mkdtemp(prefix="ferry-gpu-")
    path, ref_load = make_checkpoint(d)
    ref = ref_load(path, device=str(dev))
    ref_model = DiT(device=dev, dtype=torch.bfloat16)
    ref_model.load_state_dict(ref)
    ref_out = run_model(ref_model, dev)

    def t_load_file():
        for spec in (str(dev), "cuda", dev.index):
            got = ft.load_file(path, device=spec)
            same_dict(got, ref)
        m = DiT(device=dev, dtype=torch.bfloat16)
        m.load_state_dict(got)
        assert torch.equal(run_model(m, dev), ref_out)

    def t_reserve_early():
        # a file of large tensors (>= 64 MiB, over 1 MiB each on average):
        # the block the tensors are carved from is allocated on a thread while
        # the table is read; on the caller's current stream, so a load under a
        # side stream still makes one block, not two
        from safetensors.torch import save_file, load_file as st_load
        big = os.path.join(d, "big.safetensors")
        g = torch.Generator().manual_seed(1)
        sd = {f"w{i}": torch.randint(-2**15, 2**15, (1 << 20,), dtype=torch.int16, generator=g).view(torch.bfloat16)
              for i in range(48)}
        sd.update({f"b{i}": torch.randn(17, generator=g) for i in range(8)})
        save_file(sd, big)
        want = st_load(big)
        total = sum(t.numel() * t.element_size() for t in want.values())
        for side in (False, True):
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
            before = torch.cuda.memory_reserved(dev)
            s = torch.cuda.Stream(dev) if side else torch.cuda.current_stream(dev)
            with torch.cuda.stream(s):
                got = ft.load_file(big, device=dev)
            grown = torch.cuda.memory_reserved(dev) - before
            for k, v in want.items():
                assert torch.equal(got[k].cpu().view(torch.uint8), v.view(torch.uint8)), k
            assert total <= grown < total + (16 << 20), (side, grown, total)
            del got

    def t_load_model_cuda_in_place():
        m = DiT(device=dev, dtype=torch.bfloat16)
        ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
        calls = []
        r = ft.load_model(m, path, progress=lambda done, total: calls.append((done, total)))
        assert r == ([], []), r
        assert {k: v.data_ptr() for k, v in m.state_dict().items()} == ptrs, "not in place"
        same_dict(m.state_dict(), ref)
        assert torch.equal(run_model(m, dev), ref_out)
        assert calls and calls[-1][0] == calls[-1][1] == sum(v.nbytes for v in ferry.File(path).tensors)

    def t_load_model_meta():
        for target in (str(dev), "cpu"):
            m = DiT(device="meta", dtype=torch.bfloat16)
            ft.load_model(m, path, device=target)
            assert all(p.device.type == torch.device(target).type for p in m.parameters())
            m = m.to(dev)
            same_dict(m.state_dict(), ref)
            assert torch.equal(run_model(m, dev), ref_out)

    def t_owner_ferry():
        live0 = _dlpack.live_count()
        got = ft.load_file(path, device=str(dev), owner="ferry")
        same_dict(got, ref)
        assert _dlpack.live_count() == live0 + len(got)
        free_loaded = ferry.device(f"cuda:{dev.index}").mem_info()[0]
        del got
        gc.collect()
        assert _dlpack.live_count() == live0
        assert ferry.device(f"cuda:{dev.index}").mem_info()[0] > free_loaded, "memory not freed"

    def t_paths():
        for kind in ("ring", "direct", "register", "auto"):
            same_dict(ft.load_file(path, device=str(dev), route=kind, threads=4, ring_buffers=4,
                                   ring_buffer_bytes="1MiB"), ref)
        try:
            ft.load_file(path, device=str(dev), route="cufile")
        except ferry.UnsupportedError as e:
            assert path in str(e), str(e)

    def t_torch_save_views():
        x = torch.randn(64, 32)
        obj = {"x": x, "t": x.t(), "sl": x[:, 3:9], "h": torch.randn(5, 5).to(torch.bfloat16),
               "b": torch.rand(9) > 0.5, "i": torch.arange(10)}
        p = os.path.join(d, "views.pt")
        torch.save(obj, p)
        want = torch.load(p, map_location=str(dev))
        got = ft.load_file(p, device=str(dev))
        same_dict(got, want)
        for k in want:
            assert got[k].stride() == want[k].stride(), k
        assert got["t"].untyped_storage().data_ptr() == got["x"].untyped_storage().data_ptr()

    def t_dtypes():
        import stwriter
        names = [n for n in stwriter.DTYPE_BITS if n in ft.DTYPES]
        p = os.path.join(d, "dtypes.safetensors")
        blobs = {n: os.urandom(stwriter.nbytes(n, [8, 16])) for n in names}
        blobs["BOOL"] = bytes(b & 1 for b in blobs["BOOL"])
        stwriter.write(p, [(n, n, [8, 16], blobs[n]) for n in names])
        cpu = ft.load_file(p)
        gpu = ft.load_file(p, device=str(dev))
        own = ft.load_file(p, device=str(dev), owner="ferry")
        for n in names:
            assert cpu[n].dtype == ft.DTYPES[n]
            same(gpu[n], cpu[n].to(dev), n)
            same(own[n], cpu[n].to(dev), n)
        print(f"    dtypes on the GPU: {', '.join(names)}")

    def t_sharded():
        import stwriter
        sd = {k: v.cpu() for k, v in ref.items()}
        keys = sorted(sd)
        half = len(keys) // 2
        wm = {}
        for i, part in enumerate((keys[:half], keys[half:])):
            name = f"m-{i + 1:05d}-of-00002.safetensors"
            stwriter.write(os.path.join(d, name),
                           [(k, "BF16", list(sd[k].shape), sd[k].contiguous().view(torch.uint8).numpy().tobytes())
                            for k in part])
            wm.update({k: name for k in part})
        idx = os.path.join(d, "m.safetensors.index.json")
        with open(idx, "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
        same_dict(ft.load_file(idx, device=str(dev)), ref)
        m = DiT(device="meta", dtype=torch.bfloat16)
        ft.load_model(m, idx, device=str(dev))
        assert torch.equal(run_model(m, dev), ref_out)

    def t_errors():
        try:
            ft.load_file(os.path.join(d, "absent.safetensors"), device=str(dev))
        except FileNotFoundError as e:
            assert e.filename.endswith("absent.safetensors")
        else:
            raise AssertionError("no error for a missing file")
        bad = os.path.join(d, "trunc.safetensors")
        with open(path, "rb") as f, open(bad, "wb") as g:
            g.write(f.read(2000))
        try:
            ft.load_file(bad, device=str(dev))
        except ferry.FormatError as e:
            assert bad in str(e)
        else:
            raise AssertionError("no error for a truncated file")
        try:
            ft.load_file(path, device=f"cuda:{torch.cuda.device_count() + 3}")
        except (ferry.NoDeviceError, RuntimeError):
            pass
        else:
            raise AssertionError("no error for a device that does not exist")

    check("load_file(device=cuda) matches the reference, and the model's output", t_load_file)
    check("load_file of large tensors: one block reserved early, on the caller's stream", t_reserve_early)
    check("load_model: a cuda module filled in place", t_load_model_cuda_in_place)
    check("load_model: meta module to cuda and to cpu", t_load_model_meta)
    check("load_file(owner='ferry'): DLPack export, freed with the last tensor", t_owner_ferry)
    check("every load path", t_paths)
    check("torch.save views and shared storage on cuda", t_torch_save_views)
    check("every dtype this torch has, cpu vs cuda vs ferry-owned", t_dtypes)
    check("sharded index to cuda, load_model from it", t_sharded)
    check("errors", t_errors)
    check("Store: 6 offload/reload cycles, dirty weights to pinned RAM",
          store_cycles, ft, path, ref_load, str(dev), dev)
    check("Store: 6 offload/reload cycles, dirty weights through the spill file (host_budget 1)",
          lambda: store_cycles(ft, path, ref_load, str(dev), dev, 6, ("spill",), host_budget="1"))
    check("Store: two models under a device budget of one", store_two_models, ft, path, ref_load, str(dev), dev)
    if a.big:
        check("hot-load speed vs the ferry CLI", speed, a, dev, ft, ferry)
    else:
        print("(no --big PATH: speed check not run)")
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


def speed(a, dev, ft, ferry):
    total = ferry.File(a.big).total_bytes
    r = subprocess.run([a.ferry, "load", "--json", "--device", f"cuda:{dev.index}", "--repeat",
                        str(a.repeat + 1), a.big], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    cli_gbps = max(f["gbps"] for f in cli["files"][1:] or cli["files"])  # first one warms
    best = best_transfer = 0.0
    for _ in range(a.repeat + 1):
        gc.collect()
        torch.cuda.synchronize(dev)
        st = {}
        t0 = time.perf_counter()
        sd = ft.load_file(a.big, device=str(dev), stats=st)
        dt = time.perf_counter() - t0
        best = max(best, total / dt / 1e9)
        best_transfer = max(best_transfer, st["bytes"] / st["seconds"] / 1e9)
        del sd
    extra = ""
    try:
        from safetensors.torch import load_file as st_load
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        sd = st_load(a.big, device=str(dev))
        torch.cuda.synchronize(dev)
        extra = f", safetensors.torch.load_file {total / (time.perf_counter() - t0) / 1e9:.2f} GB/s"
        del sd
    except Exception as e:  # noqa: BLE001 - informative only
        extra = f", safetensors not compared ({type(e).__name__})"
    print(f"    {a.big}: {total / 1e9:.2f} GB, route {st['route']}; ferry.torch.load_file {best:.2f} GB/s "
          f"(the whole call: open, allocate, load; the transfer alone {best_transfer:.2f} GB/s), "
          f"ferry load CLI {cli_gbps:.2f} GB/s (the transfer) -> {best / cli_gbps * 100:.1f}% of it{extra}")
    assert best >= 0.95 * cli_gbps, f"the binding is more than 5% slower than the CLI ({best:.2f} vs {cli_gbps:.2f})"


if __name__ == "__main__":
    sys.exit(main())
