#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write a sample diffusion-transformer-like checkpoint with ferry's own test
data writer (tests/data/stwriter.py): patch embedding, N transformer blocks
(attention + MLP in BF16, norms in F32, some FP8 E4M3 weights with F32 scales),
a final layer. Deterministic: the same arguments give the same bytes.

    scripts/make_sample.py OUT.safetensors [--blocks 24] [--hidden 768] [--bf16-only]

--bf16-only stores every tensor in BF16 (biases, norms and embeddings too) and
writes no FP8 weights and no scales: the plain checkpoint the GPU-load benchmark
(bench/compare_load.py) compares loaders with.
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
import stwriter  # noqa: E402

ES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F16": 2}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bf16-only", action="store_true",
                    help="every tensor BF16 (biases, norms too), no FP8 weights or scales")
    a = ap.parse_args()
    h, mlp = a.hidden, 4 * a.hidden
    small_dt = "BF16" if a.bf16_only else "F32"  # dtype of biases, norms, embeddings
    t = []  # (name, dtype, shape)
    t += [("x_embedder.proj.weight", "BF16", [h, 4, 2, 2]), ("x_embedder.proj.bias", small_dt, [h]),
          ("t_embedder.mlp.0.weight", "BF16", [h, 256]), ("t_embedder.mlp.0.bias", small_dt, [h]),
          ("t_embedder.mlp.2.weight", "BF16", [h, h]), ("t_embedder.mlp.2.bias", small_dt, [h]),
          ("pos_embed", small_dt, [1, 256, h])]
    for b in range(a.blocks):
        p = f"blocks.{b}."
        fp8 = b % 4 == 3 and not a.bf16_only  # every fourth block in FP8 with per-tensor scales
        wdt = "F8_E4M3" if fp8 else "BF16"
        t += [(p + "norm1.weight", small_dt, [h]),
              (p + "attn.qkv.weight", wdt, [3 * h, h]), (p + "attn.qkv.bias", small_dt, [3 * h]),
              (p + "attn.proj.weight", wdt, [h, h]), (p + "attn.proj.bias", small_dt, [h]),
              (p + "norm2.weight", small_dt, [h]),
              (p + "mlp.fc1.weight", wdt, [mlp, h]), (p + "mlp.fc1.bias", small_dt, [mlp]),
              (p + "mlp.fc2.weight", wdt, [h, mlp]), (p + "mlp.fc2.bias", small_dt, [h]),
              (p + "adaLN_modulation.1.weight", "BF16", [6 * h, h]), (p + "adaLN_modulation.1.bias", small_dt, [6 * h])]
        if fp8:
            t += [(p + n + ".scale", small_dt, []) for n in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    t += [("final_layer.norm_final.weight", small_dt, [h]),
          ("final_layer.linear.weight", "BF16", [16, h]), ("final_layer.linear.bias", small_dt, [16]),
          ("final_layer.adaLN_modulation.1.weight", "BF16", [2 * h, h]),
          ("final_layer.adaLN_modulation.1.bias", small_dt, [2 * h])]

    rng = random.Random(a.seed)
    block = rng.randbytes(1 << 24)  # 16 MiB of noise, sliced per tensor

    def data_for(i):
        start = (i * 7919 * 4096) % (len(block) - 4096)

        def gen(n, st=[start]):
            out = bytearray()
            while len(out) < n:
                take = min(n - len(out), len(block) - st[0])
                out += block[st[0]:st[0] + take]
                st[0] = (st[0] + take) % len(block)
            return bytes(out)
        return gen

    tensors = [(n, d, s, data_for(i)) for i, (n, d, s) in enumerate(t)]
    meta = {"format": "pt", "generator": "ferry scripts/make_sample.py",
            "architecture": f"dit-like, {a.blocks} blocks, hidden {h}" + (", bf16 only" if a.bf16_only else "")}
    stwriter.write(a.out, tensors, meta)
    total = sum(stwriter.nbytes(d, s) for _, d, s in t)
    print(f"wrote {a.out}: {len(t)} tensors, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
