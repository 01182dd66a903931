#!/usr/bin/env python3
"""What a fresh process's first device allocations cost, PyTorch's beside the
driver's own (the binding's 26 MB question: its 40 torch.empty calls took
1.4-2.4 ms on the H100, ferry's one cuMemAlloc for the same file 0.12-0.19 ms).
One mode per process, right after CUDA is initialised (torch.zeros(1)):

    python3 bench/alloc_probe.py MODE

MODE: driver (cuMemAlloc of the 25 MB file's bytes, through ctypes, on the
context torch made current), torch1 (one torch.empty of those bytes),
small40 (torch.empty of the 25 MB file's 40 tensors: 32 BF16 [400, 1024], 8
F32 [1024]), lora3000 (the LoRA workload's 3000 BF16 tensors). Prints one JSON
line: milliseconds, and PyTorch's reserved bytes after."""
import argparse
import ctypes
import json
import time

import compare_load  # (beside this script) its workloads' tensors


def shapes(torch, plan):
    """(shape, torch dtype) of each tensor of a compare_load workload plan."""
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    return [(shape, dt[d]) for _, d, shape, _ in plan]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["driver", "torch1", "small40", "lora3000"])
    mode = ap.parse_args().mode
    import torch
    plan = compare_load.plan_small()
    nbytes = sum(nb for *_, nb in plan)
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    keep = []
    t = time.perf_counter()
    if mode == "driver":
        cu = ctypes.CDLL("libcuda.so.1")
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes))
        if rc:
            raise SystemExit(f"cuMemAlloc: CUresult {rc}")
    elif mode == "torch1":
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda:0"))
    elif mode in ("small40", "lora3000"):
        for s, d in shapes(torch, plan if mode == "small40" else compare_load.plan_lora(3000)):
            keep.append(torch.empty(s, dtype=d, device="cuda:0"))
    ms = (time.perf_counter() - t) * 1e3
    print(json.dumps({"mode": mode, "ms": round(ms, 3), "tensors": len(keep),
                      "reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1)}))


if __name__ == "__main__":
    main()
