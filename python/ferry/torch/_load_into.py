# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._load_into - ferry.torch.load_model (safetensors.torch's name
and arguments; load_into is its former name): fill an existing nn.Module in
place (or replace its meta tensors), one ferry load per device.
"""
import collections
import os
import threading
import warnings

import torch

from .. import _core, _lib
from ._load import _views
from ._match import _assign, _match_module, _module_entries
from ._tensors import _cuda_index, _empty, _sync

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", "missing_keys unexpected_keys")


class _Progress:
    """One progress stream over several loads: done counts every earlier batch."""

    def __init__(self, fn, total):
        self.fn, self.total, self.done = fn, total, 0
        self.lock = threading.Lock()

    def batch_opts(self, path_kind, threads, ring_buffers, ring_buffer_bytes):
        return _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes,
                                 self.fn, offset=self.done, total=self.total)

    def add(self, n):
        self.done += n


def load_model(model, filename, strict=True, device=None, *, route="auto", ring_buffers=None,
               ring_buffer_bytes=None, threads=None, progress=None, path_kind=None):
    """Fill model from the checkpoint filename: safetensors.torch.load_model's
    name and arguments (model, filename, strict, device; returns
    (missing_keys, unexpected_keys)), for every format ferry reads, with no
    intermediate state dict. See _load_into for what it does; progress=True
    draws a tqdm bar (as load_file); route as load_file's (path_kind: its
    deprecated name)."""
    path_kind = _core.route_arg(route, path_kind, "ferry.torch.load_model")
    progress, bar = _core.progress_fn(progress, os.path.basename(os.fspath(filename)))
    try:
        return _load_into(model, filename, strict=strict, device=device, path_kind=path_kind,
                          ring_buffers=ring_buffers, ring_buffer_bytes=ring_buffer_bytes,
                          threads=threads, progress=progress)
    finally:
        if bar is not None:
            bar.close()


def load_into(module, path, *, strict=True, device=None, route="auto", ring_buffers=None,
              ring_buffer_bytes=None, threads=None, progress=None, path_kind=None):
    """Deprecated: load_model, under safetensors' name. Kept for one release;
    warns DeprecationWarning."""
    warnings.warn("ferry.torch.load_into is deprecated: use ferry.torch.load_model (safetensors.torch's name; "
                  "the same arguments, strict and device also positional)", DeprecationWarning, stacklevel=2)
    return load_model(module, path, strict=strict, device=device, route=route, ring_buffers=ring_buffers,
                      ring_buffer_bytes=ring_buffer_bytes, threads=threads, progress=progress, path_kind=path_kind)


def _load_into(module, path, *, strict=True, device=None, path_kind="auto", ring_buffers=None,
               ring_buffer_bytes=None, threads=None, progress=None):
    """Fill module's parameters and persistent buffers from a checkpoint
    without an intermediate copy, checking keys, shapes and dtypes first (an
    error leaves the module untouched).

    Tensors already materialised are filled in place: on cuda, one
    ferry_load_into per device writes straight into their storage; on cpu,
    ferry's cpu device reads the file straight into it (a tensor or file view
    that is not contiguous is copied with Tensor.copy_ from the file's view
    instead). Tensors on the meta device are replaced (like
    load_state_dict(assign=True), requires_grad kept) by new tensors on
    `device` (default "cpu": zero-copy copy-on-write views of the file; a cuda
    device: allocated by PyTorch and filled by ferry). Tied tensors (one tensor
    under several names) are loaded once and stay tied; a tied name absent from
    the file is not missing when another of its names is present.

    Returns IncompatibleKeys(missing_keys, unexpected_keys). With strict=True
    missing or unexpected keys raise RuntimeError listing them; shape and dtype
    mismatches always do (ferry moves bytes: it does not convert dtypes)."""
    path = os.fspath(path)
    entries = _module_entries(module)
    groups = collections.OrderedDict()  # id(tensor) -> [entries]
    for e in entries:
        groups.setdefault(id(e[4]), []).append(e)
    needs_views = False
    target_dev = torch.device(device) if device is not None else torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        target_dev = torch.device("cuda", device)
    if target_dev.type not in ("cpu", "cuda"):
        raise ValueError(f"ferry.torch.load_model: device must be cpu or cuda, not {target_dev}")
    for es in groups.values():
        if es[0][4].is_meta and target_dev.type == "cpu":
            needs_views = True
    h = _core._Handle(path, _lib.OPEN_PRIVATE if needs_views else 0)
    infos = {t.name: t for t in h.infos()}

    matched, missing, unexpected = _match_module(
        groups, {name: (None, info) for name, info in infos.items()}, h.path, "load", strict,
        f"loading state_dict for {type(module).__name__}")
    plan = [(es, info, dt) for es, _, info, dt in matched]

    total = sum(info.nbytes for _, info, _ in plan)
    prog = _Progress(progress, total) if progress is not None else None
    views = []  # (entries, info, dt): meta tensors that become cpu views
    loads = {}  # ferry device spec -> [torch device or None, [index], [address], bytes, [(entries, new)]]
    copies = []  # (tensor, info, dt): filled in place through Tensor.copy_
    for es, info, dt in plan:
        cur = es[0][4]
        if cur.is_meta:
            if target_dev.type == "cpu":
                views.append((es, info, dt))
                continue
            tdev = torch.device("cuda", _cuda_index(target_dev))
            _core.device(f"cuda:{tdev.index}", h.path)  # no GPU: say so before allocating
            dest = new = _empty(info, dt, tdev)
        else:
            dest, new = cur, None
            if cur.device.type == "cuda":
                tdev = torch.device("cuda", _cuda_index(cur.device))
            elif cur.device.type == "cpu":
                tdev = None
            else:
                raise ValueError(f"ferry.torch.load_model: {es[0][0]} is on {cur.device}, "
                                 "not on cpu, cuda or meta")
            if info.strides is not None or not cur.is_contiguous():
                copies.append((cur, info, dt))
                continue
        spec = "cpu" if tdev is None else f"cuda:{tdev.index}"
        slot = loads.setdefault(spec, [tdev, [], [], 0, []])
        if info.nbytes:
            slot[1].append(info.index)
            slot[2].append(dest.data_ptr())
            slot[3] += info.nbytes
        if new is not None:
            slot[4].append((es, new))

    with torch.no_grad():
        for spec, (tdev, idx, ptrs, nbytes, assigns) in loads.items():
            fdev = _core.device(spec, h.path)
            if tdev is not None:
                _sync(tdev)
            if prog is not None:
                opts = prog.batch_opts(path_kind, threads, ring_buffers, ring_buffer_bytes)
            else:
                opts = _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes)
            _core.load_into(fdev, h, idx, ptrs, opts)
            if prog is not None:
                prog.add(nbytes)
            for es, new in assigns:
                _assign(es, new)
        if views:
            made = _views(h, [i for _, i, _ in views], {i.index: dt for _, i, dt in views})
            for es, info, dt in views:
                _assign(es, made[info.name])
        if copies:
            # views of the mapping used only as the source of one copy each
            src = _views(h, [i for _, i, _ in copies], {i.index: dt for _, i, dt in copies})
            for cur, info, dt in copies:
                cur.copy_(src[info.name])
            del src
    if prog is not None and (views or copies or not total):
        progress(total, total)
    return IncompatibleKeys(missing, unexpected)
