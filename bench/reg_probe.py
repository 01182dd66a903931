#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where does a first registered load's time go, and what overlaps with what?
(the register path, registration included.)

    python3 bench/reg_probe.py FILE [--piece-mib 1024] [--threads 16]

FILE should be in the page cache (or on tmpfs). Each step maps FILE afresh
(MAP_SHARED, PROT_READ), so its page-table entries start empty, and unmaps it
after; the device block is allocated and written once first. Steps:
  plain       cuMemHostRegister(READ_ONLY) of the whole mapping, then one copy
  pop1, popN  MADV_POPULATE_READ over the mapping on 1 / N threads first, then
              register, then copy: is registration the driver's own work or
              the kernel faulting the pages in?
  halves      two threads registering one half each at once (populated first)
  overlap     piece 0 registered; its copy queued; piece 1 registered while the
              copy runs: does the copy engine keep going during a registration?
  pipe        populated on N threads, then pieces registered one after another,
              each piece's copy queued right after its registration
  pipe_pop    the same with the populating running ahead on its own threads
              while the pieces register (nothing populated first)
  pipeT2, pipeT4
              populated first, then 2 / 4 threads take the pieces in turn,
              each registering one and queueing its copy: do registrations
              on several threads run at once?
Prints one JSON line per step (seconds per phase, GB/s of the whole), then the
pinned copy rate (cuMemHostAlloc, 256 MiB copies) for scale."""
import argparse
import ctypes
import json
import mmap
import os
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
REG_PORTABLE, REG_READ_ONLY = 0x01, 0x08


def ck(rc, what):
    if rc:
        raise SystemExit(json.dumps({"error": f"{what}: CUresult {rc}"}))


def register(p, n):
    ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), REG_PORTABLE | REG_READ_ONLY), "register")


CTX = ctypes.c_void_p()  # the primary context, made current on every thread that calls the driver


def register_rc(p, n, out):
    """register() for a thread: the CUresult goes into out (a thread's
    SystemExit would be dropped)."""
    cu.cuCtxSetCurrent(CTX)
    out.append(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), REG_PORTABLE | REG_READ_ONLY))


def unregister(p):
    ck(cu.cuMemHostUnregister(ctypes.c_void_p(p)), "unregister")


def populate(p, n, threads):
    per = (n // threads + 4095) & ~4095
    spans = [(p + o, min(per, n - o)) for o in range(0, n, per)]
    errs = []

    def run(a, m):
        if libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(m), MADV_POPULATE_READ):
            errs.append(ctypes.get_errno())
    ts = [threading.Thread(target=run, args=s) for s in spans]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise SystemExit(json.dumps({"error": f"madvise(MADV_POPULATE_READ): errno {errs[0]}"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--piece-mib", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--steps", default="plain,pop1,popN,halves,overlap,pipe,pipe_pop,plain")
    a = ap.parse_args()
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(CTX), dev), "retain")
    ck(cu.cuCtxSetCurrent(CTX), "set current")
    size = os.path.getsize(a.file)
    n = size & ~4095
    d = P()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(n)), "cuMemAlloc")
    ck(cu.cuMemsetD8_v2(d, ctypes.c_ubyte(0), ctypes.c_size_t(n)), "memset")
    stream = ctypes.c_void_p()
    ck(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    ck(cu.cuCtxSynchronize(), "sync")
    fd = os.open(a.file, os.O_RDONLY)
    piece = a.piece_mib << 20

    def fresh_map():
        p = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if p in (None, ctypes.c_void_p(-1).value, 2**64 - 1):
            raise SystemExit(json.dumps({"error": "mmap failed"}))
        return p

    def copy(p, off, m):
        ck(cu.cuMemcpyHtoDAsync_v2(P(d.value + off), ctypes.c_void_p(p + off), ctypes.c_size_t(m), stream), "copy")

    def sync():
        ck(cu.cuStreamSynchronize(stream), "stream sync")

    def finish(name, t0, phases, regs, p):
        total = time.perf_counter() - t0
        t1 = time.perf_counter()
        for r in regs:
            unregister(r)
        t_unreg = time.perf_counter() - t1
        t1 = time.perf_counter()
        libc.munmap(ctypes.c_void_p(p), ctypes.c_size_t(n))
        t_unmap = time.perf_counter() - t1
        print(json.dumps({"step": name, "gbps": round(n / total / 1e9, 2), "seconds": round(total, 4),
                          **{k: round(v, 4) if isinstance(v, float) else v for k, v in phases.items()},
                          "unregister_s": round(t_unreg, 4), "munmap_s": round(t_unmap, 4)}), flush=True)

    def step(name):
        p = fresh_map()
        ph = {}
        t0 = time.perf_counter()
        lap = [t0]

        def mark(k):
            now = time.perf_counter()
            ph[k] = now - lap[0]
            lap[0] = now
        pieces = [(o, min(piece, n - o)) for o in range(0, n, piece)]
        if name in ("plain", "pop1", "popN"):
            if name != "plain":
                populate(p, n, 1 if name == "pop1" else a.threads)
                mark("populate_s")
            register(p, n)
            mark("register_s")
            copy(p, 0, n)
            sync()
            mark("copy_s")
            return finish(name, t0, ph, [p], p)
        if name == "halves":
            populate(p, n, a.threads)
            mark("populate_s")
            h = (n // 2) & ~4095
            rcs = [[], []]
            ts = [threading.Thread(target=register_rc, args=(p, h, rcs[0])),
                  threading.Thread(target=register_rc, args=(p + h, n - h, rcs[1]))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            mark("register_s")
            ph["register_rcs"] = [r[0] for r in rcs]
            if any(r[0] for r in rcs):  # one refused: say so, undo the other, go on
                for k, r in enumerate(rcs):
                    if not r[0]:
                        unregister(p + k * h)
                libc.munmap(ctypes.c_void_p(p), ctypes.c_size_t(n))
                print(json.dumps({"step": name, "error": "a concurrent registration failed", **ph}), flush=True)
                return None
            copy(p, 0, h)  # one copy per registration: a copy across two fails (CUresult 1)
            copy(p, h, n - h)
            sync()
            mark("copy_s")
            return finish(name, t0, ph, [p, p + h], p)
        if name == "overlap":
            populate(p, n, a.threads)
            mark("populate_s")
            (o0, m0), (o1, m1) = pieces[0], pieces[1]
            register(p + o0, m0)
            mark("register0_s")
            copy(p, o0, m0)
            sync()
            mark("copy0_alone_s")
            copy(p, o0, m0)  # the same piece again, now beside piece 1's registration
            register(p + o1, m1)
            mark("register1_beside_copy_s")
            sync()
            mark("copy0_rest_s")
            return finish(name, t0, ph, [p + o0, p + o1], p)
        if name.startswith("pipeT"):  # pipeT2, pipeT4: that many threads register pieces and queue their copies
            nt = int(name[5:])
            populate(p, n, a.threads)
            mark("populate_s")
            lock, nxt, regs, rcs = threading.Lock(), [0], [], []

            def worker():
                cu.cuCtxSetCurrent(CTX)
                while True:
                    with lock:
                        if nxt[0] >= len(pieces):
                            return
                        o, m = pieces[nxt[0]]
                        nxt[0] += 1
                    out = []
                    register_rc(p + o, m, out)
                    with lock:
                        rcs.append(out[0])
                        if out[0] == 0:
                            regs.append(p + o)
                    if out[0] == 0:
                        copy(p, o, m)
            ts = [threading.Thread(target=worker) for _ in range(nt)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            mark("registered_and_queued_s")
            sync()
            mark("copy_tail_s")
            ph["register_failures"] = sum(1 for r in rcs if r)
            return finish(name, t0, ph, regs, p)
        if name in ("pipe", "pipe_pop"):
            popper = None
            if name == "pipe":
                populate(p, n, a.threads)
                mark("populate_s")
            else:
                popper = threading.Thread(target=populate, args=(p, n, a.threads))
                popper.start()
            regs = []
            for o, m in pieces:
                register(p + o, m)
                regs.append(p + o)
                copy(p, o, m)
            mark("registered_and_queued_s")
            sync()
            mark("copy_tail_s")
            if popper:
                popper.join()
            return finish(name, t0, ph, regs, p)
        raise SystemExit(f"unknown step {name}")

    for s in a.steps.split(","):
        step(s)
    h = ctypes.c_void_p()
    m = 256 << 20
    ck(cu.cuMemHostAlloc(ctypes.byref(h), ctypes.c_size_t(m), 1), "cuMemHostAlloc")
    ctypes.memset(h, 1, m)
    for _ in range(2):
        t0 = time.perf_counter()
        for k in range(16):
            ck(cu.cuMemcpyHtoDAsync_v2(P(d.value + k * m % (n - m)), h, ctypes.c_size_t(m), stream), "copy")
        sync()
        dt = time.perf_counter() - t0
    print(json.dumps({"step": "pinned_copy_limit", "gbps": round(16 * m / dt / 1e9, 2)}), flush=True)


if __name__ == "__main__":
    main()
