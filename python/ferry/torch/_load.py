# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._load - ferry.torch.load_file: views of a file's mapping and
tensors allocated for a load to fill. The tensor plumbing every part of
ferry.torch shares (dtypes, views, empty tensors, stream syncs, device
arguments) is _tensors; a load with a process_group goes on in _dist.
"""
import os
import threading

import torch

from .. import _core, _dlpack, _lib

from ._tensors import (_by_name, _cuda_index, _element_size, _empty, _frombuffer, _shape_view, _sync,
                       _torch_device, dtype_for)


def _views(h, infos, dts):
    """Zero-copy tensors over h's mapping, name -> tensor."""
    bases, where = _core.plan_views(infos)
    base_tensors = []
    for shard, start, end, first in bases:
        buf = h.buffer(h.data(first), end - start)
        base_tensors.append(_frombuffer(buf, dts[first] or torch.uint8))
    out = {}
    for t in infos:
        dt = dts[t.index]
        if not t.nbytes:
            out[t.name] = _empty(t, dt, "cpu")
        else:
            b, off = where[t.index]
            out[t.name] = _shape_view(base_tensors[b], t, dt, off)
    return out


_RESERVE_MIN = 1 << 20  # PyTorch serves smaller requests from its small pool (2 MiB segments)


def _reserve(infos, device):
    """Make PyTorch's caching allocator hold one free block as large as the
    tensors to come (of 1 MiB and more, each rounded as it rounds them), so
    that each torch.empty below carves it instead of asking the driver: one
    cudaMalloc per load, as ferry's own loads make, rather than one per
    tensor. Where the block cannot be had (the device short, an allocator
    that does not split blocks), the tensors are allocated one by one as
    before."""
    if device.type != "cuda":
        return
    total = sum((t.nbytes + 511) // 512 * 512 for t in infos if t.nbytes >= _RESERVE_MIN)
    if total < 64 * _RESERVE_MIN:
        return
    try:
        block = torch.empty(total, dtype=torch.uint8, device=device)
    except RuntimeError:  # torch.cuda.OutOfMemoryError is one
        return
    del block  # back to the allocator's cache, not to the driver


def _reserve_early(nbytes, count, device):
    """_reserve's block, of nbytes (an upper bound of what _reserve takes:
    the file's tensor bytes plus 511 for each of its count tensors; more by
    the bytes of its tensors under 1 MiB, which stay cached), allocated on a thread
    while the caller lists the tensors: the driver's cudaMalloc (about 1.7 ms
    for 10 GB on the H100 machine) then overlaps the tensor table's 2-3 ms.
    Measured against reserving after the table: 8.6 against 9.3 ms from the
    table to the carved tensors, medians of 6 rounds of a 10 GB file from the
    page cache (bench/profile_py_load.py against its --variant late; bench/RESULTS.md).
    The thread allocates on the caller's current stream,
    so the block lands in the pool the tensors are carved from. The thread,
    to join before allocating, or None."""
    if device.type != "cuda" or nbytes < 64 * _RESERVE_MIN or nbytes < count * _RESERVE_MIN:
        return None  # (tensors of under 1 MiB on average: mostly the small pool's, so _reserve's way)
    stream = torch.cuda.current_stream(device)

    def run():
        try:
            with torch.cuda.device(device), torch.cuda.stream(stream):
                block = torch.empty(nbytes, dtype=torch.uint8, device=device)
            del block  # back to the allocator's cache, not to the driver
        except RuntimeError:  # short of memory: the tensors are allocated one by one
            pass

    th = threading.Thread(target=run, name="ferry-reserve", daemon=True)
    th.start()
    return th


def _alloc(infos, dts, device, reserved=False):
    """Empty device tensors for infos, and the (index, address) pairs ferry
    fills: name -> tensor, [index], [address]. reserved: _reserve_early ran."""
    if not reserved:
        _reserve(infos, device)
    bases, where = _core.plan_views(infos)
    base_tensors = [None] * len(bases)  # made on first use
    out, idx, ptrs = {}, [], []
    for t in infos:
        dt = dts[t.index]
        if not t.nbytes:
            out[t.name] = _empty(t, dt, device)
            continue
        b, off = where[t.index]
        base = base_tensors[b]
        if base is None:
            shard, start, end, first = bases[b]
            if (first == t.index and end - start == t.nbytes and t.strides is None and dt is not None
                    and not t.flags & _lib.TENSOR_SHARED_STORAGE):
                # the common case, a tensor alone in its storage: allocate it as it is
                out[t.name] = torch.empty(t.shape, dtype=dt, device=device)
                idx.append(t.index)
                ptrs.append(out[t.name].data_ptr())
                continue
            bdt = dts[first] or torch.uint8
            base = base_tensors[b] = torch.empty((end - start) // _element_size(bdt), dtype=bdt, device=device)
        out[t.name] = _shape_view(base, t, dt, off)
        idx.append(t.index)
        ptrs.append(base.data_ptr() + off)
    return out, idx, ptrs


def _parse_device(device, owner):
    if isinstance(device, str) and device.startswith("sim:"):
        if owner != "ferry":
            raise ValueError(f"device {device!r} (ferry's simulated GPU) needs owner='ferry'")
        return device
    device = _torch_device(device, "ferry.torch")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"ferry.torch: device must be cpu or cuda (or sim:SIZE with owner='ferry'), "
                         f"not {device}")
    return device


def load_file(path, device="cpu", *, route="auto", ring_buffers=None, ring_buffer_bytes=None,
              threads=None, progress=None, owner="torch", stats=None, process_group=None, path_kind=None):
    """Load every tensor of a checkpoint (safetensors, *.safetensors.index.json,
    GGUF, PyTorch zip) as a dict name -> torch.Tensor, sorted by name, with the
    same dtypes, shapes and bytes as safetensors.torch.load_file.

    device "cpu": zero-copy views of a copy-on-write private mapping of the
    file. Nothing is read until touched; writing to a tensor changes only this
    process's copy, never the file. The file stays mapped while any tensor lives.
    device "cuda" / "cuda:N" / int N (plain "cuda": the current device): each
    tensor is allocated with torch.empty (PyTorch's allocator owns it) and one
    ferry_load_into fills them all through ferry's pinned ring; returns when the
    data is on the device. route ("auto", "ring", "direct", "register",
    "pageable"; path_kind is its deprecated name), ring_buffers, ring_buffer_bytes (int or "16MiB") and threads set
    ferry_load_opts; progress(done, total) is called from ferry's worker
    threads (an exception it raises is raised here after the load). On cpu
    nothing is read, so progress is called once with (total, total).
    progress=True: a tqdm bar in bytes when tqdm is importable (else one
    line on stderr at the end).

    owner="ferry": ferry allocates the memory (ferry_load) and each tensor is
    imported through DLPack; the memory is freed when the last tensor of the
    load dies. device may then also be "sim:SIZE" (ferry's simulated GPU,
    whose memory is host memory: the tensors come back as cpu tensors), and
    "cpu" means a copy into ferry-owned host memory rather than views.

    ggml's block-quantized GGUF tensors come back as raw uint8 tensors of
    shape [nbytes] (their type: ferry.File(path).info(name).dtype). Dtypes this
    torch lacks raise UnsupportedError naming the tensor. Non-row-major PyTorch
    views keep their strides; views of one storage stay views of one storage
    where they overlap. Errors: OSError (with errno and filename) for system
    errors, ferry.FormatError / UnsupportedError / NoDeviceError / ... for the
    library's.

    stats: a dict to fill with the load's ferry_load_stats (route taken, bytes,
    seconds of the transfer itself, resident fraction, why that route); on cpu
    route is "view" and nothing is read. ("path", the same as route, is its
    deprecated name.)

    process_group: a torch.distributed ProcessGroup (or
    torch.distributed.group.WORLD) whose every rank makes this same call: each
    rank reads about 1/N of the bytes from storage and the ranks broadcast
    their shares over the group, so every rank gets every tensor (bit-identical)
    while the file is read about once in all. The tensors are then views of
    one buffer per rank's share, on device (cpu: read with pread, not mapped),
    and stats also gets bytes_read (this rank's), bytes_total, rank and world.
    owner="ferry" is not supported with it (_dist)."""
    path = os.fspath(path)
    path_kind = _core.route_arg(route, path_kind, "ferry.torch.load_file")
    if owner not in ("torch", "ferry"):
        raise ValueError(f"owner must be 'torch' or 'ferry', not {owner!r}")
    device = _parse_device(device, owner)
    if process_group is not None and owner != "torch":
        raise ValueError("ferry.torch.load_file: process_group= needs owner='torch' "
                         "(the ranks' shares are broadcast into buffers PyTorch allocates)")
    progress, bar = _core.progress_fn(progress, os.path.basename(path))
    try:
        if process_group is not None:
            from . import _dist  # torch.distributed is imported only for this
            opts = _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes, progress,
                                     flags=_lib.LOAD_PREAD)
            return _dist.load_file(path, device, process_group, opts, progress, stats)
        return _load_file(path, device, path_kind, ring_buffers, ring_buffer_bytes, threads,
                          progress, owner, stats)
    finally:
        if bar is not None:
            bar.close()


def _load_file(path, device, path_kind, ring_buffers, ring_buffer_bytes, threads, progress, owner, stats):
    # A file in tmpfs is copied out of a mapping (the library's default): on
    # the H200 a fresh /dev/shm copy loaded at 45.4-45.5 GB/s that way against
    # 21.8-23.9 with pread, now that the mapping is unmapped in pieces and no
    # longer stalls the allocations after it (ferry.torch.load_file with each
    # path, a fresh process per load; bench/RESULTS.md)
    opts = _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes, progress)
    if owner == "ferry":
        return _load_owned(path, device, opts, stats)
    if device.type == "cpu":
        h = _core._Handle(path, _lib.OPEN_PRIVATE)
        infos = h.infos()
        dts = {t.index: dtype_for(t, h.path) for t in infos}
        out = _views(h, infos, dts)
        if progress is not None:
            total = sum(t.nbytes for t in infos)
            progress(total, total)
        if stats is not None:
            stats.update(route="view", path="view", bytes=0, seconds=0.0, resident=-1.0,
                         why="zero-copy views of a private mapping: nothing read")
        return _by_name(out)
    index = _cuda_index(device)
    fdev = _core.device(f"cuda:{index}", path)
    h = _core._Handle(path, 0)
    # The ring is pinned on a thread while the tensors are listed and
    # allocated here (pinning the default ring cost ~5 ms on the H200, about
    # what this side's work takes for a few hundred tensors), when the
    # library says the load would pin one (ferry_load_plan_route).
    pin = None
    total = _core.lib.ferry_file_total_bytes(h.f)
    if _core.route_choice(fdev, h, opts)["pins"]:
        pin = threading.Thread(target=_core.prepare, args=(fdev, opts, total), name="ferry-pin", daemon=True)
        pin.start()
    tdev = torch.device("cuda", index)
    reserving = None
    try:
        count = h.count()
        reserving = _reserve_early(total + 511 * count, count, tdev)
        infos = h.infos()
        dts = {t.index: dtype_for(t, h.path) for t in infos}
        if reserving is not None:
            reserving.join()
        out, idx, ptrs = _alloc(infos, dts, tdev, reserved=reserving is not None)
        _sync(tdev)
    finally:
        if reserving is not None:
            reserving.join()  # (a listing that failed: the block is back in the cache)
        if pin is not None:
            pin.join()  # its failure, if any, is the load's to report: it pins again
    st = _core.load_into(fdev, h, idx, ptrs, opts)
    if stats is not None:
        stats.update(st)
    return _by_name(out)


def _load_owned(path, device, opts, stats):
    if isinstance(device, str):  # sim:SIZE: host memory behind a GPU's interface
        spec, dl, tdev = device, (_dlpack.KDL_CPU, 0), torch.device("cpu")
    elif device.type == "cpu":
        spec, dl, tdev = "cpu", (_dlpack.KDL_CPU, 0), device
    else:
        index = _cuda_index(device)
        spec, dl, tdev = f"cuda:{index}", (_dlpack.KDL_CUDA, index), torch.device("cuda", index)
    fdev = _core.device(spec, path)
    h = _core._Handle(path, 0)
    infos = h.infos()
    dts = {t.index: dtype_for(t, h.path) for t in infos}
    loaded = _core.Loaded(fdev, h, opts)
    if stats is not None:
        stats.update(loaded.stats)
    out = {}
    for t in infos:
        dt = dts[t.index]
        if not t.nbytes:
            out[t.name] = _empty(t, dt, tdev)
            continue
        cap = _dlpack.capsule(loaded.ptr(t.index), t.nbytes, dl[0], dl[1], loaded)
        raw = torch.utils.dlpack.from_dlpack(cap)
        base = raw if dt is None else raw.view(dt)
        out[t.name] = _shape_view(base, t, dt, 0)
    return _by_name(out)
