#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Does one host-to-device copy that spans two separate cuMemAlloc allocations,
adjacent in the device's address space, work? (The ring, pageable and register
paths merge copies of pieces that continue one another on the device; with a
caller's pointers, two such pieces may lie in two allocations.)

    python3 bench/span_copy.py

Allocates pairs of 64 MiB blocks with cuMemAlloc until one pair is adjacent,
then copies 128 MiB of pinned memory across both with cuMemcpyHtoD and
cuMemcpyHtoDAsync, checks the bytes that landed, and asks cuMemGetAddressRange
where each block starts. Prints one JSON line."""
import ctypes
import json

cu = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_uint64


def ck(rc, what):
    if rc:
        raise SystemExit(json.dumps({"error": f"{what}: CUresult {rc}"}))


ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "set current")
N = 64 << 20
blocks, pair = [], None
for _ in range(32):
    d = P()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(N)), "cuMemAlloc")
    for b in blocks:
        if b + N == d.value:
            pair = (b, d.value)
        elif d.value + N == b:
            pair = (d.value, b)
    blocks.append(d.value)
    if pair:
        break
out = {"adjacent_pair_found": pair is not None, "blocks_tried": len(blocks)}
if pair:
    h = ctypes.c_void_p()
    ck(cu.cuMemHostAlloc(ctypes.byref(h), ctypes.c_size_t(2 * N), 1), "cuMemHostAlloc")
    ctypes.memset(h, 0x5A, 2 * N)
    for name, fn in (("sync", lambda: cu.cuMemcpyHtoD_v2(P(pair[0]), h, ctypes.c_size_t(2 * N))),
                     ("async", lambda: cu.cuMemcpyHtoDAsync_v2(P(pair[0]), h, ctypes.c_size_t(2 * N), None))):
        for b in pair:  # each block cleared on its own first
            ck(cu.cuMemsetD8_v2(P(b), ctypes.c_ubyte(0), ctypes.c_size_t(N)), "cuMemsetD8")
        ck(cu.cuCtxSynchronize(), "sync")
        rc = fn()
        sync = cu.cuCtxSynchronize()
        back = (ctypes.c_ubyte * 16)()
        rb = cu.cuMemcpyDtoH_v2(back, P(pair[1] + N - 16), ctypes.c_size_t(16))
        out[name] = {"rc": rc, "sync_rc": sync, "readback_rc": rb, "landed": bytes(back) == b"\x5a" * 16}
    for k, b in enumerate(pair):
        base, size = P(), ctypes.c_size_t()
        rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), P(b + 8))
        out[f"range{k}"] = {"rc": rc, "base_is_block": base.value == b, "size": size.value}
print(json.dumps(out))
