"""ferry.torch - checkpoints to PyTorch tensors through libferry.

load_file(path, device="cpu", ...)   like safetensors.torch.load_file, for every format ferry reads
load_into(module, path, ...)         fill an nn.Module's parameters and buffers in place

Written against torch APIs present from 1.13 to 2.x (torch.frombuffer,
Tensor.as_strided, torch.utils.dlpack.from_dlpack, nn.Module.named_modules).
"""
import collections
import os
import threading

import torch

from . import _core, _dlpack, _lib, errors

__all__ = ["load_file", "load_into", "IncompatibleKeys", "dtype_for"]

# ferry dtype name -> torch dtype attribute, taken where this torch has it
_DTYPE_ATTRS = [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("I32", "int32"),
    ("I64", "int64"), ("F16", "float16"), ("BF16", "bfloat16"), ("F32", "float32"),
    ("F64", "float64"), ("C64", "complex64"), ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("F8_E8M0", "float8_e8m0fnu"),
]
DTYPES = {name: getattr(torch, attr) for name, attr in _DTYPE_ATTRS if hasattr(torch, attr)}
"""ferry dtype name -> torch.dtype, for the dtypes this torch has."""

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", "missing_keys unexpected_keys")


def dtype_for(info, path=None):
    """The torch dtype of a ferry TensorInfo; None for ggml's block-quantized
    types (GGUF Q4_K, ...), which load as raw uint8 tensors of shape [nbytes].
    Raises UnsupportedError naming the tensor for dtypes this torch lacks
    (F4, F6_*, and FP8 / U16-U64 before the torch versions that added them)."""
    dt = DTYPES.get(info.dtype)
    if dt is not None:
        return dt
    if _core.is_block_type(info.dtype):
        return None
    raise errors.UnsupportedError(
        _lib.E_UNSUPPORTED,
        f"{path}: tensor '{info.name}': dtype {info.dtype} has no torch dtype in torch {torch.__version__}",
        path)


_ELEMENT_SIZE = {}


def _element_size(dt):
    n = _ELEMENT_SIZE.get(dt)
    if n is None:
        n = _ELEMENT_SIZE[dt] = torch.empty((), dtype=dt).element_size()
    return n


def _frombuffer(buf, dt):
    try:
        return torch.frombuffer(buf, dtype=dt)
    except (TypeError, RuntimeError, ValueError):
        return torch.frombuffer(buf, dtype=torch.uint8).view(dt)


def _shape_view(base, info, dt, byte_offset):
    """info's tensor as a view of the 1-D base that starts byte_offset before it."""
    if dt is None:  # raw bytes of a block-quantized tensor
        return base[byte_offset:byte_offset + info.nbytes]
    es = _element_size(dt)
    if info.strides is None and byte_offset == 0 and base.numel() * es == info.nbytes:
        return base.view(info.shape)
    strides = info.strides if info.strides is not None else _core.contiguous_strides(info.shape)
    return base.as_strided(info.shape, strides, byte_offset // es)


def _empty(info, dt, device):
    return torch.empty(info.shape if dt is not None else (0,), dtype=dt or torch.uint8, device=device)


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


def _alloc(infos, dts, device):
    """Empty device tensors for infos, and the (index, address) pairs ferry
    fills: name -> tensor, [index], [address]."""
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


def _cuda_index(dev):
    if dev.index is not None:
        return dev.index
    if torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0  # ferry's device open then says why there is no GPU


def _sync(dev):
    """Wait for work queued on dev's current stream: memory the caching
    allocator just handed out (or parameters about to be overwritten) may
    still be used by kernels queued there, and ferry copies on its own streams."""
    if torch.cuda.is_available():
        torch.cuda.current_stream(dev).synchronize()


def _by_name(tensors):
    return {k: tensors[k] for k in sorted(tensors)}


def _parse_device(device, owner):
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    if isinstance(device, str) and device.startswith("sim:"):
        if owner != "ferry":
            raise ValueError(f"device {device!r} (ferry's simulated GPU) needs owner='ferry'")
        return device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"ferry.torch: bad device {device!r}: {e}") from None
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a str, int or torch.device, not {type(device).__name__}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"ferry.torch: device must be cpu or cuda (or sim:SIZE with owner='ferry'), "
                         f"not {device}")
    return device


def load_file(path, device="cpu", *, path_kind="auto", ring_buffers=None, ring_buffer_bytes=None,
              threads=None, progress=None, owner="torch", stats=None):
    """Load every tensor of a checkpoint (safetensors, *.safetensors.index.json,
    GGUF, PyTorch zip) as a dict name -> torch.Tensor, sorted by name, with the
    same dtypes, shapes and bytes as safetensors.torch.load_file.

    device "cpu": zero-copy views of a copy-on-write private mapping of the
    file. Nothing is read until touched; writing to a tensor changes only this
    process's copy, never the file. The file stays mapped while any tensor lives.
    device "cuda" / "cuda:N" / int N (plain "cuda": the current device): each
    tensor is allocated with torch.empty (PyTorch's allocator owns it) and one
    ferry_load_into fills them all through ferry's pinned ring; returns when the
    data is on the device. path_kind ("auto", "ring", "direct", "register",
    "cufile"), ring_buffers, ring_buffer_bytes (int or "16MiB") and threads set
    ferry_load_opts; progress(done, total) is called from ferry's worker
    threads (an exception it raises is raised here after the load). On cpu
    nothing is read, so progress is called once with (total, total).

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

    stats: a dict to fill with the load's ferry_load_stats (path used, bytes,
    seconds of the transfer itself, resident fraction, why that path); on cpu
    path is "view" and nothing is read."""
    path = os.fspath(path)
    if owner not in ("torch", "ferry"):
        raise ValueError(f"owner must be 'torch' or 'ferry', not {owner!r}")
    device = _parse_device(device, owner)
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
            stats.update(path="view", bytes=0, seconds=0.0, resident=-1.0,
                         why="zero-copy views of a private mapping: nothing read")
        return _by_name(out)
    index = _cuda_index(device)
    fdev = _core.device(f"cuda:{index}", path)
    h = _core._Handle(path, 0)
    infos = h.infos()
    dts = {t.index: dtype_for(t, h.path) for t in infos}
    tdev = torch.device("cuda", index)
    out, idx, ptrs = _alloc(infos, dts, tdev)
    _sync(tdev)
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


# ---- load_into ------------------------------------------------------------

def _module_entries(module):
    """(key, owning module, attribute, is parameter, tensor) for everything
    state_dict() would hold: parameters and persistent buffers, a shared
    submodule or tied tensor under each of its names."""
    out = []
    for prefix, m in module.named_modules(remove_duplicate=False):
        p = prefix + "." if prefix else ""
        for name, t in m._parameters.items():
            if t is not None:
                out.append((p + name, m, name, True, t))
        skip = getattr(m, "_non_persistent_buffers_set", ())
        for name, t in m._buffers.items():
            if t is not None and name not in skip:
                out.append((p + name, m, name, False, t))
    return out


def _assign(entries, new):
    """Put new in place of the tensor every entry names (a tied tensor's names
    all get the same new Parameter), keeping requires_grad."""
    param = None
    for key, m, name, is_param, old in entries:
        if is_param:
            if param is None:
                param = torch.nn.Parameter(new, requires_grad=old.requires_grad)
            m._parameters[name] = param
        else:
            m._buffers[name] = new


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


def load_into(module, path, *, strict=True, device=None, path_kind="auto", ring_buffers=None,
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
        raise ValueError(f"ferry.torch.load_into: device must be cpu or cuda, not {target_dev}")
    for es in groups.values():
        if es[0][4].is_meta and target_dev.type == "cpu":
            needs_views = True
    h = _core._Handle(path, _lib.OPEN_PRIVATE if needs_views else 0)
    infos = {t.name: t for t in h.infos()}

    missing, used, plan, error_msgs = [], set(), [], []
    for es in groups.values():
        keys = [e[0] for e in es]
        present = [k for k in keys if k in infos]
        used.update(present)
        if not present:
            missing.extend(keys)
            continue
        info = infos[present[0]]
        cur = es[0][4]
        try:
            dt = dtype_for(info, h.path)
        except errors.UnsupportedError as e:
            error_msgs.append(f"cannot load {present[0]}: {e.message}")
            continue
        if tuple(cur.shape) != tuple(info.shape) and dt is not None:
            error_msgs.append(f"size mismatch for {present[0]}: copying a param with shape "
                              f"{torch.Size(info.shape)} from checkpoint, the shape in current model is "
                              f"{cur.shape}.")
            continue
        if dt != cur.dtype:
            error_msgs.append(f"dtype mismatch for {present[0]}: copying a param with dtype "
                              f"{dt if dt is not None else info.dtype} from checkpoint, the dtype in "
                              f"current model is {cur.dtype}.")
            continue
        plan.append((es, info, dt))
    unexpected = [k for k in infos if k not in used]
    if strict:
        if unexpected:
            error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        if missing:
            error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing)))
    if error_msgs:
        raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
            type(module).__name__, "\n\t".join(error_msgs)))

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
                raise ValueError(f"ferry.torch.load_into: {es[0][0]} is on {cur.device}, "
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

