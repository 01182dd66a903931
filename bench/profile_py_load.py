#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where ferry.torch.load_file(device="cuda:0") spends a fresh process's first
load, beside the CLI's figure. One load per process:

    python3 bench/profile_py_load.py FILE [--variant reserve|late|noreserve|owner_ferry]

Prints one JSON line: the whole call's seconds (what bench/compare_load.py's
ferry_py method times) and its phases: opening ferry's device (the ring is
pinned there), allocating the tensors (torch.empty), the wait for the current
stream, and ferry_load_into itself (what the CLI's `seconds` covers, plus the
CLI's own device block allocation); opening the file (open), its tensor
table (infos), the dict by name (by_name), the ring's pinning on its thread
(pin: not part of the sum) and how long the binding waited for it after the
allocation (pin_wait, part of other); starting the thread that reserves the
tensors' block (reserve_start) and waiting for it (reserve_wait, part of other); other: the call's seconds not in the
summed phases. Variants: reserve (the default binding:
one cached block reserved first, on a thread while the tensor table is read),
late (the same block reserved after the table, on the calling thread),
noreserve (one torch.empty per tensor), owner_ferry (ferry allocates one block per shard, tensors imported
through DLPack: the CLI's way), oneblock (a probe, not a binding: one
torch.empty block per shard laid out as the file is, every tensor a view of it
at its file offset, so ferry_load_into makes the copies the CLI's load makes:
a small tensor between two large ones no longer breaks a copy run; does the
binding's load_into trail the CLI's for its separate allocations?),
oneblock_small (the same, but tensors under 1 MiB allocated one by one from
PyTorch's small pool, as the binding allocates them). --repeat N loads N times
in the process (each load's GB/s in "repeats"); --pread asks the ring to read a tmpfs file with
pread (FERRY_LOAD_PREAD) instead of copying it out of a mapping as the CLI
and the binding do."""
import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--variant", default="reserve", choices=["reserve", "late", "noreserve", "owner_ferry", "oneblock", "oneblock_small"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--pread", action="store_true")
    a = ap.parse_args()
    import torch
    import ferry.torch as ft
    from ferry import _core
    from ferry.torch import _load
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    t_init = time.perf_counter() - T0
    phases = {}

    def timed(name, fn):
        def wrap(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrap

    if a.variant == "noreserve":
        _load._RESERVE_MIN = 1 << 62  # no tensor is large enough: nothing reserved
    if a.variant == "late":
        _load._reserve_early = lambda *args: None  # _alloc reserves, after the table
    reserve_early = timed("reserve_start", _load._reserve_early)

    class Joined:  # the reserving thread, its joins timed (reserve_wait, part of other)
        def __init__(self, th):
            self.th = th

        def join(self):
            t = time.perf_counter()
            self.th.join()
            phases["reserve_wait"] = phases.get("reserve_wait", 0.0) + time.perf_counter() - t

    def reserve_marked(*args):
        th = reserve_early(*args)
        return None if th is None else Joined(th)

    _load._reserve_early = reserve_marked
    if a.variant in ("oneblock", "oneblock_small"):
        apart = (1 << 20) if a.variant == "oneblock_small" else 0  # tensors under it: torch.empty each
        _load._reserve_early = lambda *args: None

        def alloc_oneblock(infos, dts, device, reserved=False):
            span = {}
            for t in infos:
                if t.nbytes:
                    lo, hi = span.get(t.shard, (t.offset, t.offset + t.nbytes))
                    span[t.shard] = (min(lo, t.offset), max(hi, t.offset + t.nbytes))
            blocks = {s: torch.empty(hi - lo, dtype=torch.uint8, device=device) for s, (lo, hi) in span.items()}
            out, idx, ptrs = {}, [], []
            for t in infos:
                dt = dts[t.index]
                if not t.nbytes:
                    out[t.name] = _load._empty(t, dt, device)
                    continue
                if t.nbytes < apart and dt is not None and t.strides is None:
                    out[t.name] = torch.empty(t.shape, dtype=dt, device=device)
                    idx.append(t.index)
                    ptrs.append(out[t.name].data_ptr())
                    continue
                off = t.offset - span[t.shard][0]
                raw = blocks[t.shard][off:off + t.nbytes]
                out[t.name] = raw if dt is None else _load._shape_view(raw.view(dt), t, dt, 0)
                idx.append(t.index)
                ptrs.append(blocks[t.shard].data_ptr() + off)
            return out, idx, ptrs

        _load._alloc = alloc_oneblock
    _load._alloc = timed("alloc", _load._alloc)
    marks = {}
    sync = timed("sync", _load._sync)

    def sync_marked(*args, **kw):  # its end: where the binding joins the pinning thread
        try:
            return sync(*args, **kw)
        finally:
            marks["sync_end"] = time.perf_counter()

    _load._sync = sync_marked
    prepare = _core.prepare

    def prepare_marked(*args, **kw):  # on the pinning thread
        marks["pin_start"] = time.perf_counter()
        try:
            return prepare(*args, **kw)
        finally:
            marks["pin_end"] = time.perf_counter()

    _core.prepare = prepare_marked
    _core._Handle.__init__ = timed("open", _core._Handle.__init__)
    _core._Handle.infos = timed("infos", _core._Handle.infos)
    _load._by_name = timed("by_name", _load._by_name)
    _core.device = timed("device_open", _core.device)
    _core.load_into = timed("load_into", _core.load_into)
    if a.pread:
        from ferry import _lib
        options = _core.LoadOptions
        more = _lib.LOAD_PREAD
        _core.LoadOptions = lambda *args, flags=0, **kw: options(*args, flags=flags | more, **kw)
    repeats = []
    for r in range(a.repeat):
        if r:
            del out
        stats = {}
        t = time.perf_counter()
        out = ft.load_file(a.file, device="cuda:0", stats=stats,
                           owner="ferry" if a.variant == "owner_ferry" else "torch")
        torch.cuda.synchronize()
        sec = time.perf_counter() - t
        if r == 0:
            if "pin_end" in marks and "sync_end" in marks:  # the pinning thread outlasting the allocation
                phases["pin"] = marks["pin_end"] - marks["pin_start"]
                phases["pin_wait"] = max(0.0, marks["pin_end"] - marks["sync_end"])
            phases["other"] = sec - sum(v for k, v in phases.items() if k not in ("pin", "pin_wait", "reserve_wait"))
            first = (sec, dict(phases), stats.get("seconds"), {k: v for k, v in stats.items() if k != "why"})
        nbytes = sum(v.numel() * v.element_size() for v in out.values())
        repeats.append(round(nbytes / sec / 1e9, 2))
    sec, phases = first[0], first[1]
    stats_last = stats
    print(json.dumps({"variant": a.variant, "seconds": sec, "gbps": nbytes / sec / 1e9, "bytes": nbytes,
                      "tensors": len(out), "init_seconds": t_init, "phases": phases,
                      "ferry_seconds": first[2], "route": stats_last.get("path"), "repeats": repeats,
                      "pread": a.pread, "ferry_stats": first[3],
                      "ferry_lib": os.environ.get("FERRY_LIBRARY")}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
