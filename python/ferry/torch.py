"""ferry.torch - checkpoints to PyTorch tensors through libferry.

load_file(path, device="cpu", ...)   like safetensors.torch.load_file, for every format ferry reads
load_into(module, path, ...)         fill an nn.Module's parameters and buffers in place
Store(device, ...)                   the residency store, with nn.Modules that follow their weights

Written against torch APIs present from 1.13 to 2.x (torch.frombuffer,
Tensor.as_strided, torch.utils.dlpack.from_dlpack, nn.Module.named_modules).
"""
import collections
import contextlib
import ctypes
import inspect
import os
import threading

import torch

from . import _core, _dlpack, _lib, _store, errors
from ._store import TensorState

__all__ = ["load_file", "load_into", "IncompatibleKeys", "dtype_for", "Store", "Job", "TensorState"]

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
    return _core.framework_dtype(DTYPES, info, path, f"torch dtype in torch {torch.__version__}")


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


def _torch_device(device, who):
    """device (an int N: cuda:N; a str; a torch.device) as a torch.device;
    ValueError naming who for a bad string, TypeError for anything else."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{who}: bad device {device!r}: {e}") from None
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a str, int or torch.device, not {type(device).__name__}")
    return device


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



# ---- the residency store ----------------------------------------------------

_UINT64_MAX = (1 << 64) - 1
_HOOK_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters


def _store_device(device):
    """(ferry device spec, torch device of the views, DLPack device or None
    for host memory) of a Store's device argument."""
    if isinstance(device, str) and (device.startswith("sim:") or device == "cpu"):
        # ferry's simulated GPU (and its cpu device): "device" memory is host memory
        return device, torch.device("cpu"), None
    device = _torch_device(device, "ferry.torch.Store")
    if device.type != "cuda":
        raise ValueError(f"ferry.torch.Store: device must be cuda[:N], sim:SIZE or cpu, not {device}")
    index = _cuda_index(device)
    return f"cuda:{index}", torch.device("cuda", index), (_dlpack.KDL_CUDA, index)


def _size_opt(v, what):
    if v is None:
        return 0
    try:
        return _core.parse_size(v)
    except ValueError as e:
        raise ValueError(f"ferry.torch.Store: {what}: {e}") from None


class _Attached:
    """A module attached to a model of a Store: which tensor of the model each
    of its parameters and buffers shows, and what it shows now."""

    def __init__(self, module, plan):
        self.module = module
        self.plan = plan  # [(model index, TensorInfo, torch dtype, module entries)]
        self.shown = {}   # model index -> (tier, dptr) the module's tensor is a view of
        self.hooks = []
        self.hook_pins = 0  # pins the forward hooks hold now


class Job:
    """`with store.job(name) as j:` - per-job memory statistics
    (ferry_store_job_begin/end). j.stats is None inside the block and a dict
    with ferry_job_stats's fields after it: job, seconds, rss, uss, pss and
    cgroup (each {"start", "end", "peak"} in bytes; cgroup all 0 outside a
    cgroup v2), device_bytes, pinned_bytes, host_bytes, spill_bytes (the
    tiers at the end), bytes_htod, bytes_dtoh, bytes_written, bytes_read,
    seconds_htod, seconds_dtoh, evicted, dropped (during the job)."""

    def __init__(self, store, name):
        self.store = store
        self.name = name
        self.stats = None

    def __enter__(self):
        with self.store._lock:
            self.store._live().job_begin(self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        with self.store._lock:
            try:
                self.stats = self.store._live().job_end()
            except (errors.FerryError, OSError, ValueError):
                if exc_type is None:
                    raise  # else the block's own exception is the one to see
        return False

    def __repr__(self):
        return f"<ferry.torch.Job {self.name!r} {'open' if self.stats is None else 'ended'}>"


class Store:
    """ferry's residency store (ferry_store_*) with nn.Modules attached: see
    python/README.md ("Residency store").

        store = ferry.torch.Store("cuda:0", device_budget="20GiB")
        store.add("dit", "dit.safetensors", module=dit)      # dit's tensors now follow the store
        dit(x)                        # a forward pre-hook brings it to the device, pinned while it runs
        store.offload("dit")          # its parameters become meta tensors until the next use

    Every call is thread-safe. After every call that can move tensors, each
    attached module's parameters and buffers are re-pointed: zero-copy views of
    the device copy while the tensor is on the device, meta tensors of the
    right shape and dtype while it is not (so nothing ever points at memory the
    store gave to another tensor). With torch 2.3 and later re-pointing keeps
    the Parameter objects (their contents are swapped, requires_grad kept);
    with older torch it puts new ones in: look them up on the module after a
    store call rather than keeping them."""

    def __init__(self, device="cuda", *, device_budget=None, device_reserve=None, host_budget=None,
                 pinned_budget=None, host_reserve=None, spill_below=None, spill_above=None, spill_dir=None,
                 path_kind="auto", threads=None, ring_buffers=None, ring_buffer_bytes=None):
        self._core = None
        self._lock = threading.RLock()
        self._tls = threading.local()  # the forward pre-hooks' pins, per thread
        self._attached = {}  # model name -> _Attached
        self._states = {}    # model name -> [(tier, dptr)] of every tensor, as of the last call
        spec, self._tdev, self._dl = _store_device(device)
        self.device = spec
        fdev = _core.device(spec)
        opts = _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes)
        self._core = _store.StoreCore(
            fdev, device_budget=_size_opt(device_budget, "device_budget"),
            device_reserve=_size_opt(device_reserve, "device_reserve"),
            host_budget=_size_opt(host_budget, "host_budget"),
            pinned_budget=_size_opt(pinned_budget, "pinned_budget"),
            host_reserve=_size_opt(host_reserve, "host_reserve"),
            spill_below=_size_opt(spill_below, "spill_below"), spill_above=_size_opt(spill_above, "spill_above"),
            spill_dir=spill_dir, load_opts=opts.opts)

    # ---- lookups ----

    def _live(self):
        if self._core is None:
            raise ValueError(f"ferry.torch.Store on {self.device}: the store is closed")
        return self._core

    def _model(self, name):
        core = self._live()
        m = core.models.get(name) if isinstance(name, str) else None
        if m is None:
            have = ", ".join(f'"{k}"' for k in core.models) or "none"
            raise errors.NotFoundError(_lib.E_NOTFOUND, f"ferry.torch.Store on {self.device}: no model called "
                                                        f"{name!r} (models: {have})")
        return m

    def _tensor_index(self, m, key):
        """Model index of a tensor given by name, index, or (for an attached
        module) the tensor itself or a view of its device memory."""
        if isinstance(key, bool):
            raise TypeError("a tensor is named by its name, its index or the tensor itself")
        if isinstance(key, int):
            if not 0 <= key < len(m):
                raise IndexError(f"model \"{m.name}\": tensor index {key} out of range (0..{len(m) - 1})")
            return key
        if isinstance(key, str):
            i = m.find(key)
            if i is None:
                raise errors.NotFoundError(_lib.E_NOTFOUND, f"model \"{m.name}\": no tensor called '{key}'",
                                           m.filename())
            return i
        if isinstance(key, torch.Tensor):
            a = self._attached.get(m.name)
            if a is not None:
                for idx, info, dt, entries in a.plan:
                    if any(key is getattr(mod, attr, None) for _, mod, attr, _, _ in entries):
                        return idx
            if not key.is_meta and key.device.type == self._tdev.type:
                p = key.data_ptr()
                for idx, (tier, dptr) in enumerate(self._states.get(m.name, ())):
                    if tier == _lib.TIER_DEVICE and dptr and dptr <= p < dptr + m.infos[idx].nbytes:
                        return idx
            raise errors.NotFoundError(_lib.E_NOTFOUND, f"model \"{m.name}\": the {tuple(key.shape)} "
                                       f"{key.dtype} tensor given is none of its tensors on the device",
                                       m.filename())
        raise TypeError(f"a tensor is named by its name, its index or the tensor itself, not "
                        f"{type(key).__name__}")

    def _indices(self, m, tensors):
        if tensors is None:
            return None
        if isinstance(tensors, (str, int, torch.Tensor)):
            tensors = [tensors]
        return [self._tensor_index(m, t) for t in tensors]

    def __contains__(self, name):
        return self._core is not None and name in self._core.models

    def __len__(self):
        return 0 if self._core is None else len(self._core.models)

    def names(self):
        """The models' names, in the order added."""
        return list(self._live().models)

    def tensor_names(self, name):
        """The tensors of a model, in the store's numbering (file by file)."""
        return [t.name for t in self._model(name).infos]

    def module(self, name):
        """The module attached to a model, or None."""
        self._model(name)
        a = self._attached.get(name)
        return a.module if a is not None else None

    # ---- views ----

    def _sync(self):
        """Wait for every kernel queued on the store's GPU: tensors about to
        move (or device blocks about to be reused) may still be in use."""
        if self._tdev.type == "cuda":
            torch.cuda.synchronize(self._tdev)

    def _view(self, core, dptr, info, dt):
        """A zero-copy tensor over device memory the store owns (its blocks
        are freed by the store, never by the view; the view keeps the store)."""
        if not info.nbytes:
            return _empty(info, dt, self._tdev)
        if self._dl is None:  # sim / cpu: host memory
            buf = (ctypes.c_ubyte * info.nbytes).from_address(dptr)
            buf._ferry_owner = core
            base = _frombuffer(buf, dt or torch.uint8)
        else:
            cap = _dlpack.capsule(dptr, info.nbytes, self._dl[0], self._dl[1], core)
            raw = torch.utils.dlpack.from_dlpack(cap)
            base = raw if dt is None else raw.view(dt)
        return _shape_view(base, info, dt, 0)

    @staticmethod
    def _placeholder(info, dt):
        return torch.empty(info.shape if dt is not None else (info.nbytes,), dtype=dt or torch.uint8,
                           device="meta")

    def _all_on_device(self, m, idx=None):
        st = self._states.get(m.name)
        if st is None:
            return False
        ids = range(len(st)) if idx is None else idx
        return all(st[i][0] == _lib.TIER_DEVICE for i in ids)

    def _refresh(self, names=None):
        """Read every tensor's tier and address and re-point what changed in
        the attached modules."""
        core = self._core
        raw = _lib.TensorState()
        for name, m in list(core.models.items()):
            if names is not None and name not in names:
                continue
            st = [(s.tier, s.dptr) for s in (core.raw_state(m, i, raw) for i in range(len(m)))]
            self._states[name] = st
            a = self._attached.get(name)
            if a is None:
                continue
            for idx, info, dt, entries in a.plan:
                now = st[idx] if st[idx][0] == _lib.TIER_DEVICE else (st[idx][0], 0)
                if a.shown.get(idx) == now:
                    continue
                if now[0] == _lib.TIER_DEVICE:
                    new = self._view(core, now[1], info, dt)
                else:
                    new = self._placeholder(info, dt)
                _repoint(entries, new)
                a.shown[idx] = now

    # ---- models ----

    def add(self, name, path, *, module=None, priority=0, strict=True):
        """Add a model called name holding every tensor of path (anything
        ferry reads; a list of paths makes one model of several files). Its
        tensors start in the checkpoint (tier "source"): nothing is read yet.
        Higher priority models are evicted later.

        module: an nn.Module whose parameter and persistent buffer names are
        the checkpoint's tensor names. Keys, shapes and dtypes are checked
        first (RuntimeError worded as load_state_dict's; strict=False lets
        module tensors missing from the file stay as they are and file tensors
        the module lacks stay in the store only). Its tensors then become meta
        placeholders (whatever memory they had is dropped) and follow the
        store from then on; a forward pre-hook brings the model to the device
        and pins it while forward runs."""
        if not isinstance(name, str) or not name:
            raise TypeError("the model's name must be a non-empty str")
        paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
        if not paths:
            raise ValueError(f"model \"{name}\": no files")
        with self._lock:
            core = self._live()
            if name in core.models:
                raise errors.InvalidArgumentError(_lib.E_INVAL, f"ferry.torch.Store: a model called "
                                                               f"\"{name}\" is already in the store")
            if module is not None:
                if not isinstance(module, torch.nn.Module):
                    raise TypeError(f"module must be an nn.Module, not {type(module).__name__}")
                if getattr(module, "_ferry_store_model", None) is not None:
                    raise ValueError(f"this {type(module).__name__} is already attached to model "
                                     f"\"{module._ferry_store_model}\" of a ferry store")
            handles, infos = core.open_files(paths)
            plan = _attach_plan(module, infos, handles, strict) if module is not None else None
            core.add(name, handles, infos, priority)
            if module is not None:
                a = self._attached[name] = _Attached(module, plan)
                module._ferry_store_model = name
                self._install_hooks(name, a)
            self._refresh([name])
        return name

    def _install_hooks(self, name, a):
        # Each forward hook undoes the pin of its own thread's pre-hook, if
        # that pre-hook got as far as pinning (torch 2.1+ runs an always_call
        # hook even when a pre-hook raised).
        def pre(mod, args):
            self._enter(name, hook=True)
            stack = self._tls.__dict__.setdefault("pins", [])
            stack.append(name)

        def post(mod, args, out):
            stack = self._tls.__dict__.get("pins")
            if stack and name in stack:
                del stack[len(stack) - 1 - stack[::-1].index(name)]
                self._leave(name, hook=True)

        a.hooks.append(a.module.register_forward_pre_hook(pre))
        if _HOOK_ALWAYS_CALL:  # torch 2.1+: run even when forward raises
            a.hooks.append(a.module.register_forward_hook(post, always_call=True))
        else:
            a.hooks.append(a.module.register_forward_hook(post))

    def _enter(self, name, hook=False):
        """to_device (which also marks the model used now) and pin it all."""
        with self._lock:
            m = self._model(name)
            moving = not self._all_on_device(m)
            if moving:
                self._sync()
            try:
                self._core.to_device(m)
            finally:
                if moving:
                    self._refresh()
            self._core.pin(m, -1)
            if hook:
                self._attached[name].hook_pins += 1

    def _leave(self, name, hook=False):
        with self._lock:
            core = self._core
            m = core.models.get(name) if core is not None else None
            if m is None:
                return  # removed or closed meanwhile: nothing is pinned any more
            if hook:
                a = self._attached.get(name)
                if a is None or a.hook_pins == 0:
                    return
                a.hook_pins -= 1
            core.unpin(m, -1)

    @contextlib.contextmanager
    def use(self, name):
        """`with store.use(name):` - the model on the device and pinned (never
        evicted) inside the block, e.g. while calling its submodules directly
        (the forward hooks are on the attached module only)."""
        self._enter(name)
        try:
            yield self
        finally:
            self._leave(name)

    def unpin(self, name):
        """Drop the pins the forward hooks hold on a model. Needed only with
        torch before 2.1 after a forward that raised (its forward hook did not
        run, so the model stayed pinned and cannot be evicted)."""
        with self._lock:
            m = self._model(name)
            a = self._attached.get(name)
            while a is not None and a.hook_pins:
                a.hook_pins -= 1
                self._core.unpin(m, -1)
            stack = self._tls.__dict__.get("pins")
            while stack and name in stack:
                stack.remove(name)

    def to_device(self, name, tensors=None):
        """Bring a model (or tensors: names, indices or tensors of it, with
        their groups) to the device, evicting others as the policy decides
        (least recently used, lowest priority first, never a pinned tensor).
        Marks the model used now. BudgetError when even that cannot make room
        (nothing evicted or moved then)."""
        with self._lock:
            m = self._model(name)
            idx = self._indices(m, tensors)
            moving = not self._all_on_device(m, idx)
            if moving:
                self._sync()
            try:
                self._core.to_device(m, idx)
            finally:
                if moving:
                    self._refresh()

    def offload(self, name, tensors=None):
        """Take a model (or some of its tensors) off the device: clean tensors
        are dropped, dirty ones saved to pinned RAM, host RAM or the spill
        file. Attached modules' tensors become meta placeholders."""
        with self._lock:
            m = self._model(name)
            idx = self._indices(m, tensors)
            self._sync()
            try:
                self._core.evict(m, idx)
            finally:
                self._refresh([name])

    evict = offload

    def make_room(self, nbytes=None):
        """Make nbytes (int or "2GiB"; None: everything evictable) of device
        memory free for the caller, evicting what the policy picks, and give
        the store's cached device blocks back to the driver. Returns the
        tensor bytes evicted. BudgetError (with the library's message, and
        .could = the most that could be made free) when it is impossible:
        nothing is evicted then."""
        n = _UINT64_MAX if nbytes is None else _size_opt(nbytes, "nbytes")
        with self._lock:
            core = self._live()
            self._sync()
            try:
                return core.make_room(n)
            finally:
                self._refresh()

    def mark_dirty(self, name, tensor):
        """The caller changed tensors of a model in place on the device (names,
        indices or the tensors themselves, e.g. module.blk.weight): they are
        saved, not dropped, when they leave, and come back with the change."""
        with self._lock:
            m = self._model(name)
            for i in self._indices(m, tensor):
                self._core.mark_dirty(m, i)

    def set_priority(self, name, priority):
        with self._lock:
            self._core.set_priority(self._model(name), priority)

    def tensor_state(self, name, tensor):
        """TensorState(name, nbytes, tier, dirty, pins, group, dptr) of one
        tensor (by name, index or the tensor itself)."""
        with self._lock:
            m = self._model(name)
            return self._core.state(m, self._tensor_index(m, tensor))

    def tensor_states(self, name):
        """{tensor name: TensorState} of every tensor of a model."""
        with self._lock:
            m = self._model(name)
            out = {}
            for i in range(len(m)):
                s = self._core.state(m, i)
                out.setdefault(s.name, s)
            return out

    def read(self, name, tensor):
        """A cpu copy of a tensor's current bytes, from whichever tier holds
        them (ferry_model_read)."""
        with self._lock:
            m = self._model(name)
            i = self._tensor_index(m, tensor)
            info = m.infos[i]
            dt = dtype_for(info, m.filename())
            raw = torch.empty(info.nbytes, dtype=torch.uint8)
            if info.nbytes:
                self._sync()
                self._core.read(m, i, raw.data_ptr())
            base = raw if dt is None or not info.nbytes else raw.view(dt)
            return _shape_view(base, info, dt, 0) if info.nbytes else _empty(info, dt, "cpu")

    def write(self, name, tensor, value):
        """Overwrite a tensor on the device with value's bytes (same dtype and
        number of bytes) and mark it dirty (ferry_model_write)."""
        with self._lock:
            m = self._model(name)
            i = self._tensor_index(m, tensor)
            info = m.infos[i]
            src = value.detach().to("cpu").contiguous()
            if src.numel() * src.element_size() != info.nbytes:
                raise ValueError(f"model \"{name}\": {info.name} has {info.nbytes} bytes, the value "
                                 f"{src.numel() * src.element_size()}")
            self._sync()
            dummy = ctypes.c_char()  # ferry_model_write wants a buffer even for 0 bytes
            self._core.write(m, i, src.data_ptr() if info.nbytes else ctypes.addressof(dummy))

    def stats(self):
        """ferry_store_get_stats as a dict: tier_bytes {tier: bytes}, the
        budgets, host_available and host_source, spilling, spill_path,
        spill_file_bytes, bytes and seconds moved each way, bytes_written and
        bytes_read, evicted, dropped, models, tensors, device_cached, pinned_pool_bytes."""
        with self._lock:
            return self._live().stats()

    def job(self, name):
        """`with store.job("denoise") as j: ...` then j.stats: see Job."""
        if not isinstance(name, str):
            raise TypeError("a job's name is a str")
        return Job(self, name)

    def _detach(self, name):
        a = self._attached.pop(name, None)
        if a is None:
            return
        for h in a.hooks:
            h.remove()
        for idx, info, dt, entries in a.plan:
            if a.shown.get(idx, (None,))[0] == _lib.TIER_DEVICE:
                _repoint(entries, self._placeholder(info, dt))
        try:
            del a.module._ferry_store_model
        except AttributeError:
            pass

    def remove(self, name):
        """Remove a model: it frees whatever the store holds of it; an
        attached module is detached (hooks removed, its tensors left as meta
        placeholders). InvalidArgumentError while it is pinned."""
        with self._lock:
            m = self._model(name)
            self._sync()
            self._core.remove(m)
            self._states.pop(name, None)
            self._detach(name)

    def close(self):
        """Detach every module (meta placeholders, hooks removed) and let the
        store go: its memory is freed now unless a view taken from it is still
        alive elsewhere (then when the last one goes)."""
        with self._lock:
            if self._core is None:
                return
            self._sync()
            for name in list(self._attached):
                self._detach(name)
            self._states = {}
            self._core = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._core is None:
            return f"<ferry.torch.Store on {self.device} (closed)>"
        return f"<ferry.torch.Store on {self.device}: {', '.join(self._core.models) or 'no models'}>"


def _repoint(entries, new):
    """Put new in place of the tensor every entry (key, module, attribute, is
    parameter, requires_grad) names: one Parameter for all the names of a tied
    tensor, the one the module holds now where torch can swap its contents."""
    param = None
    for key, m, name, is_param, requires_grad in entries:
        if is_param:
            if param is None:
                param = _same_param(m._parameters.get(name), new, requires_grad)
            m._parameters[name] = param
        else:
            m._buffers[name] = new


def _same_param(old, new, requires_grad):
    """A Parameter holding new: old itself, its contents swapped for new's
    (torch.utils.swap_tensors, torch 2.3 and later), so references the caller
    keeps to the module's parameters (an optimizer's, a patcher's) stay valid
    across moves; a new Parameter where torch cannot swap (older torch, or a
    tensor with weak references or still held by an autograd graph)."""
    fresh = torch.nn.Parameter(new, requires_grad=requires_grad)
    swap = getattr(torch.utils, "swap_tensors", None)
    if swap is not None and type(old) is type(fresh):
        try:
            swap(old, fresh)
            return old
        except RuntimeError:
            pass
    return fresh


def _match_module(groups, lookup, path, verb, strict, what):
    """Pair a module's tensors with a checkpoint's the way load_state_dict does.
    groups: id(tensor) -> its entries (tied names together); lookup: name ->
    (anything, TensorInfo). Returns ([(entries, looked-up value, TensorInfo,
    dtype)], missing keys, unexpected keys); raises RuntimeError("Error(s) in
    <what>: ...") for shape or dtype mismatches, dtypes this torch lacks, and
    with strict for missing or unexpected keys. ferry moves bytes, it does not
    convert: a block-quantized tensor (dtype None) is a dtype mismatch."""
    matched, missing, used, error_msgs = [], [], set(), []
    for es in groups.values():
        keys = [e[0] for e in es]
        present = [k for k in keys if k in lookup]
        used.update(present)
        if not present:
            missing.extend(keys)
            continue
        val, info = lookup[present[0]]
        cur = es[0][4]
        try:
            dt = dtype_for(info, path)
        except errors.UnsupportedError as e:
            error_msgs.append(f"cannot {verb} {present[0]}: {e.message}")
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
        matched.append((es, val, info, dt))
    unexpected = [k for k in lookup if k not in used]
    if strict:
        if unexpected:
            error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        if missing:
            error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing)))
    if error_msgs:
        raise RuntimeError("Error(s) in {}:\n\t{}".format(what, "\n\t".join(error_msgs)))
    return matched, missing, unexpected


def _attach_plan(module, infos, handles, strict):
    """[(model index, TensorInfo, dtype, entries)] for the module's tensors
    that the checkpoint has; raises RuntimeError as load_state_dict does."""
    fname = handles[0].path if len(handles) == 1 else ", ".join(h.path for h in handles)
    lookup = {}
    for k, t in enumerate(infos):
        lookup.setdefault(t.name, (k, t))
    groups = collections.OrderedDict()
    for e in _module_entries(module):
        groups.setdefault(id(e[4]), []).append(e)
    matched, _, _ = _match_module(groups, lookup, fname, "attach", strict,
                                  f"attaching {type(module).__name__} to {fname}")
    # keep no reference to the module's old tensors: their memory goes once replaced
    return [(idx, info, dt, [(k, mod, attr, is_param, t.requires_grad) for k, mod, attr, is_param, t in es])
            for es, idx, info, dt in matched]
