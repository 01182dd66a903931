#!/usr/bin/env python3
"""How fast can a small cached file reach the GPU without a pinned ring?
(issue 13: the 25 MB file within 2 x bytes / copy rate + 5 ms; ferry's auto
takes its `pageable` path there, one thread copying from the file mapping.)

    python3 bench/pageable_probe.py FILE [--rounds 3] [--steps ...]

FILE should be in the page cache (or on tmpfs). Each step maps FILE afresh
(MAP_SHARED, PROT_READ, so its page-table entries start empty) and unmaps it
after; the device block is allocated and written once first. Steps:
  t1          cuMemcpyHtoDAsync from the mapping in 4 MiB pieces on one thread
              and one stream (ferry's pageable path today)
  pop_t1      MADV_POPULATE_READ over the mapping first, then t1
  t2, t4      2 / 4 threads, each with its own stream, copying one contiguous
              slice of the mapping: does the driver stage pageable copies from
              several threads at once?
  pin8        a pinned ring of 2 x 4 MiB (cuMemHostAlloc, its pinning timed
              inside the step), memcpy from the mapping into it and copies out
              on one thread
Each step runs --rounds times, alternated; the first step of the process
also pays the driver's first-copy set-up, so the order rotates each round.
Prints one JSON line per run (ms and GB/s), then a summary line (median ms per
step). Plain CUDA driver calls through ctypes, no ferry."""
import argparse
import ctypes
import json
import mmap
import os
import statistics
import threading
import time

cu = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
P = ctypes.c_uint64
MADV_POPULATE_READ = 22
PIECE = 4 << 20
CTX = ctypes.c_void_p()


def ck(rc, what):
    if rc:
        raise SystemExit(json.dumps({"error": f"{what}: CUresult {rc}"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="t1,pop_t1,t2,t4,pin8")
    a = ap.parse_args()
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(CTX), dev), "retain")
    ck(cu.cuCtxSetCurrent(CTX), "set current")
    n = os.path.getsize(a.file)
    d = P()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(n)), "cuMemAlloc")
    ck(cu.cuMemsetD8_v2(d, ctypes.c_ubyte(0), ctypes.c_size_t(n)), "memset")
    streams = []
    for _ in range(4):
        s = ctypes.c_void_p()
        ck(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        streams.append(s)
    ck(cu.cuCtxSynchronize(), "sync")
    fd = os.open(a.file, os.O_RDONLY)

    def fresh_map():
        p = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if p in (None, ctypes.c_void_p(-1).value, 2**64 - 1):
            raise SystemExit(json.dumps({"error": "mmap failed"}))
        return p

    def copy_range(p, lo, hi, stream, errs):
        cu.cuCtxSetCurrent(CTX)
        for off in range(lo, hi, PIECE):
            m = min(PIECE, hi - off)
            rc = cu.cuMemcpyHtoDAsync_v2(P(d.value + off), ctypes.c_void_p(p + off), ctypes.c_size_t(m), stream)
            if rc:
                errs.append(rc)
                return
        rc = cu.cuStreamSynchronize(stream)
        if rc:
            errs.append(rc)

    def threaded(p, k):
        per = (n // k + 4095) & ~4095
        errs = []
        ts = [threading.Thread(target=copy_range, args=(p, lo, min(lo + per, n), streams[i], errs))
              for i, lo in enumerate(range(0, n, per))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise SystemExit(json.dumps({"error": f"copy: CUresult {errs[0]}"}))

    def step(name, p):
        if name == "t1":
            threaded(p, 1)
        elif name == "pop_t1":
            if libc.madvise(ctypes.c_void_p(p), ctypes.c_size_t(n), MADV_POPULATE_READ):
                raise SystemExit(json.dumps({"error": f"madvise: errno {ctypes.get_errno()}"}))
            threaded(p, 1)
        elif name in ("t2", "t4"):
            threaded(p, int(name[1]))
        elif name == "pin8":
            h = ctypes.c_void_p()
            ck(cu.cuMemHostAlloc(ctypes.byref(h), ctypes.c_size_t(2 * PIECE), 0), "cuMemHostAlloc")
            evs = []
            for _ in range(2):
                e = ctypes.c_void_p()
                ck(cu.cuEventCreate(ctypes.byref(e), 2), "event")  # CU_EVENT_DISABLE_TIMING
                evs.append(e)
            used = [False, False]
            for i, off in enumerate(range(0, n, PIECE)):
                b = i % 2
                if used[b]:
                    ck(cu.cuEventSynchronize(evs[b]), "event sync")
                m = min(PIECE, n - off)
                ctypes.memmove(h.value + b * PIECE, p + off, m)
                ck(cu.cuMemcpyHtoDAsync_v2(P(d.value + off), ctypes.c_void_p(h.value + b * PIECE), ctypes.c_size_t(m),
                                           streams[0]), "copy")
                ck(cu.cuEventRecord(evs[b], streams[0]), "record")
                used[b] = True
            ck(cu.cuStreamSynchronize(streams[0]), "sync")
            for e in evs:
                cu.cuEventDestroy_v2(e)
            ck(cu.cuMemFreeHost(h), "cuMemFreeHost")
        else:
            raise SystemExit(json.dumps({"error": f"unknown step {name}"}))

    names = a.steps.split(",")
    times = {s: [] for s in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for s in order:
            p = fresh_map()
            t = time.perf_counter()
            step(s, p)
            sec = time.perf_counter() - t
            libc.munmap(ctypes.c_void_p(p), ctypes.c_size_t(n))
            times[s].append(sec)
            print(json.dumps({"round": r + 1, "step": s, "ms": round(sec * 1e3, 3), "gbps": round(n / sec / 1e9, 2)}),
                  flush=True)
    print(json.dumps({"bytes": n, "median_ms": {s: round(statistics.median(v) * 1e3, 3) for s, v in times.items()}}))


if __name__ == "__main__":
    main()
