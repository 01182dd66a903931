#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How often diffusers' own attention returns NaN on this machine's torch,
ferry not in the path: the cause of test_binding_diffusers.py's zero-mask
fixture (bench/RESULTS.md, "On the development machine"). CPU only; it imports
that test module, which imports ferry, so build/ must hold libferry.so:

    .deps/venv/bin/python bench/diffusers_nan_probe.py [--zero-mask] [--threads N] [--calls N]

Counts (1) of --calls forward passes of the test's UNet2DConditionModel
(diffusers' own, from its constructor) on one input, those that return a NaN
and those that differ from the first finite pass; then (2) of 2000
torch.baddbmm calls with a NaN-filled input of the cross-attention's shape
(2, 16, 3) and beta=0, those whose result has a NaN (beta=0 should ignore
the input). --zero-mask runs the model through the test's zero_mask_attention.
Prints one JSON line."""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zero-mask", action="store_true", help="through the test's zero_mask_attention")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--calls", type=int, default=300, help="forward passes (default 300)")
    a = ap.parse_args()
    sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "py")]
    import torch
    import test_binding_diffusers as t  # its model and its fixture's patch

    torch.set_num_threads(a.threads)
    if a.zero_mask:
        t.zero_mask_attention(setattr)
    m = t.cond_unet().eval()
    g = torch.Generator().manual_seed(5)
    x, h = torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 3, 8, generator=g)
    with torch.no_grad():
        first = m(x, 3, h).sample.clone()
        while not torch.isfinite(first).all():
            first = m(x, 3, h).sample.clone()
        nan = differ = 0
        for _ in range(a.calls):
            out = m(x, 3, h).sample  # not kept: its block goes back to the allocator, as in the tests
            nan += out.isnan().any().item()
            differ += not torch.equal(out, first)
    # after the model, so that its NaN blocks are not what the model's empty() finds
    nan_in = sum(torch.baddbmm(torch.full((2, 16, 3), float("nan")), torch.randn(2, 16, 8), torch.randn(2, 8, 3),
                               beta=0).isnan().any().item() for _ in range(2000))
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "zero_mask": a.zero_mask,
                      "baddbmm_nan_of_2000": nan_in, "calls": a.calls, "nan_calls": nan, "differing_calls": differ}))


if __name__ == "__main__":
    main()
