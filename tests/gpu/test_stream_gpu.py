#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Block streaming on a real GPU (not run by ctest: CI has no GPU; the same
code paths run on sim in tests/py/test_binding_stream.py).

    tests/gpu/test_stream_gpu.py [--device cuda:0] [--dim 2048] [--depth 24]

A DiT-like module (BF16; attention + MLP blocks, an embedding and a head) is
saved to a safetensors file and attached to ferry.torch.Store with
stream="auto" under device budgets of 100 %, 50 % and 25 % of its weights;
several steps run under torch.inference_mode() and torch.no_grad(). Every
step's output must be bit-identical to the same module resident on the GPU
(loaded with plain torch), the store must stay within its budget, and every
step after the first must move exactly the plan's streamed bytes. Also: a
second model sharing the store (an encoder, evicted and brought back between
steps), and the budget shrinking and growing between steps.

Prints PASS/FAIL per check, then per budget the step times beside the
resident one (information only: bench/stream.py measures), and a final
"N passed, N failed" line; exits 1 on a failure, 77 without a GPU.
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))

import torch  # noqa: E402

from gpucheck import check, results  # noqa: E402 (tests/gpu/gpucheck.py, beside this script)

nn = torch.nn
F = torch.nn.functional


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, h):
        b, n, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v)
        else:  # torch before 2.0 (the sim dry run on Debian's torch)
            a = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), -1) @ v
        a = a.transpose(1, 2).reshape(b, n, d)
        h = h + self.proj(a)
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


class DiT(nn.Module):
    def __init__(self, dim, depth, heads=16):
        super().__init__()
        self.embed = nn.Linear(64, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(depth)])
        self.head = nn.Linear(dim, 64)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def nbytes(m):
    return sum(t.numel() * t.element_size() for t in m.state_dict().values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    sim = args.device.startswith("sim:")  # a dry run of this script on ferry's simulated GPU
    if not sim and not torch.cuda.is_available():
        print("no GPU: skipped")
        return 77
    import ferry.torch as ft
    from stwriter import write

    dev = torch.device("cpu" if sim else args.device)

    def sync():
        if not sim:
            torch.cuda.synchronize(dev)

    # tmpfs where there is one: a file just written to disk may still be in
    # writeback, and the test is about streaming, not about the disk
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = tempfile.mkdtemp(prefix="ferry-stream-gpu-", dir=shm)
    torch.manual_seed(0)
    ref = DiT(args.dim, args.depth).to(torch.bfloat16)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.02)
    path = os.path.join(tmp, "dit.safetensors")
    write(path, [(k, "BF16", list(v.shape), v.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
                 for k, v in ref.state_dict().items()])
    te_ref = DiT(max(64, args.dim // 4), 2).to(torch.bfloat16)
    te_path = os.path.join(tmp, "te.safetensors")
    write(te_path, [(k, "BF16", list(v.shape), v.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
                    for k, v in te_ref.state_dict().items()])
    total = nbytes(ref)
    print(f"model: {total / 2**30:.2f} GiB in {args.depth} blocks of {nbytes(ref.blocks[0]) / 2**20:.1f} MiB")
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, args.tokens, 64, generator=g).to(torch.bfloat16).to(dev) for _ in range(args.steps)]
    res = ref.to(dev)
    times = {}
    with torch.inference_mode():
        want = [res(x) for x in xs]
        sync()
        t0 = time.perf_counter()
        for x in xs:
            res(x)
        sync()
        times["resident"] = (time.perf_counter() - t0) / len(xs)
        te_in = torch.randn(1, 77, 64, generator=g).to(torch.bfloat16).to(dev)
        te_want = te_ref.to(dev)(te_in)
    del res
    if not sim:
        torch.cuda.empty_cache()

    def streamed(frac, mode):
        budget = int(total * frac) + (total >> 8)
        m = DiT(args.dim, args.depth).to(torch.bfloat16)
        with ft.Store(args.device, device_budget=budget) as store:
            store.add("dit", path, module=m, stream="auto")
            ctx = torch.inference_mode if mode == "inference_mode" else torch.no_grad
            with ctx():
                outs = [m(x) for x in xs]
                sync()
                t0 = time.perf_counter()
                for x in xs:
                    m(x)
                sync()
                times[f"{int(frac * 100)}% {mode}"] = (time.perf_counter() - t0) / len(xs)
            st = store.stream_stats("dit")
            for k, (a, b) in enumerate(zip(outs, want)):
                assert torch.equal(a, b), f"step {k}: output differs from the resident module's"
            assert store.stats()["tier_bytes"]["device"] <= budget
            assert st["bytes_per_step"][0] >= total - 1, st["bytes_per_step"]
            if frac < 1:
                assert st["streamed_blocks"] > 0
                later = st["bytes_per_step"][2:]
                assert all(b == st["planned_streamed_bytes"] for b in later), st
            else:
                assert st["streamed_blocks"] == 0 and all(b == 0 for b in st["bytes_per_step"][1:]), st
            print(f"    {frac:.0%} {mode}: {st['resident_blocks']} resident, {st['streamed_blocks']} streamed, "
                  f"prefetch {st['prefetch']}, {st['streamed_bytes_per_step'] / 1e9:.2f} GB/step, "
                  f"pinned cache {store.stats()['pinned_cache_bytes'] / 1e9:.2f} GB")

    for frac in (1.0, 0.5, 0.25):
        for mode in ("inference_mode", "no_grad"):
            check(f"stream at {frac:.0%} of the weights, {mode}: outputs bit-identical", streamed, frac, mode)

    def shared_and_budget():
        m = DiT(args.dim, args.depth).to(torch.bfloat16)
        te = DiT(max(64, args.dim // 4), 2).to(torch.bfloat16)
        with ft.Store(args.device, device_budget=total // 2) as store:
            store.add("dit", path, module=m, stream="auto")
            store.add("te", te_path, module=te)
            with torch.inference_mode():
                for k, x in enumerate(xs):
                    if k == 1:
                        store.set_device_budget(total // 3)
                    if k == 3:
                        store.set_device_budget(total)
                    assert torch.equal(m(x), want[k]), f"step {k} differs"
                    assert store.stats()["tier_bytes"]["device"] <= store.stats()["device_budget"]
                    te_out = te(te_in)
                    assert torch.equal(te_out, te_want), "the encoder's output differs"

    check("two models in one store, budget shrinking and growing between steps", shared_and_budget)
    print("step times (s): " + ", ".join(f"{k} {v:.4f} ({v / times['resident']:.2f}x)" for k, v in times.items()))
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
