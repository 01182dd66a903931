# SPDX-License-Identifier: Apache-2.0
"""_core - the binding's core below every framework: devices, load options,
loads, views planned over a file's tensors, dtypes; and, from _file, the open
files (File, _Handle, TensorInfo), which the rest of the binding takes from
here.

Devices are opened once per spec and per process (their pinned ring is reused
by every load) and stay open until the process exits.
"""
import ctypes
import os
import threading
import warnings

from . import _lib
from ._file import File, TensorInfo, _Handle  # noqa: F401  (the rest of the binding's names for them)
from ._lib import lib
from . import errors
from .errors import check, check_on, error


class Device:
    """An open ferry device ("cuda:N", "cpu", "sim:SIZE"). Get one with
    ferry.device(spec): devices are cached per spec for the process's life."""

    def __init__(self, spec, filename=None):
        self.spec = spec
        ctx = ctypes.c_void_p()
        check(lib.ferry_ctx_new(None, ctypes.byref(ctx)), None, filename or spec)
        self.ctx = ctx
        d = ctypes.c_void_p()
        rc = lib.ferry_device_open(ctx, spec.encode(), ctypes.byref(d))
        if rc < 0:
            msg = _lib.errmsg(ctx)
            lib.ferry_ctx_free(ctx)
            raise error(rc, msg, filename or spec)
        self.dev = d

    def check(self, rc, filename=None):
        """rc, or the exception for it with the message left on this device."""
        return check_on(rc, _lib.device_errmsg, self.dev, filename)

    @property
    def description(self):
        return lib.ferry_device_desc(self.dev).decode("utf-8", "replace")

    def mem_info(self):
        """(free bytes, total bytes)."""
        free, total = ctypes.c_uint64(), ctypes.c_uint64()
        self.check(lib.ferry_device_mem_info(self.dev, ctypes.byref(free), ctypes.byref(total)), self.spec)
        return free.value, total.value

    def copy_rate(self, nbytes=1 << 30):
        """The pinned host-to-device copy rate in GB/s (ferry_device_copy_rate,
        nbytes moved)."""
        r = ctypes.c_double()
        self.check(lib.ferry_device_copy_rate(self.dev, int(nbytes), ctypes.byref(r), None), self.spec)
        return r.value

    def plan_route(self, file=None, route="auto", nbytes=0, threads=None, ring_buffers=None,
                   ring_buffer_bytes=None):
        """What a load with these options would do now, without loading
        (ferry_load_plan_route): a dict with route, threads, buffers,
        buffer_bytes, pins, resident and why. file: a ferry.File (None: auto
        answers the ring it would pin); nbytes: the load's bytes (0: all the
        file's)."""
        opts = LoadOptions(route, threads, ring_buffers, ring_buffer_bytes)
        return route_choice(self, None if file is None else file._handle(), opts, nbytes)

    def probe_cufile(self, file=None):
        """(available, why): whether GPUDirect Storage could read file (a
        ferry.File; None: whether its driver opens). A probe only: cuFile is
        not a route ferry loads through."""
        buf = ctypes.create_string_buffer(512)
        h = None if file is None else file._handle()
        rc = lib.ferry_device_probe_cufile(self.dev, h.f if h is not None else None, buf, len(buf))
        if rc < 0 and rc != _lib.E_NODEV:  # unavailable is an answer; anything else an error of the call
            self.check(rc, self.spec)
        return rc == 0, buf.value.decode("utf-8", "replace")

    def __repr__(self):
        return f"<ferry.Device {self.description!r}>"


_devices = {}
_devices_lock = threading.Lock()


def device(spec, filename=None):
    """The process's ferry device for spec ("cuda:0", "cpu", "sim:24GiB"),
    opened on first use and kept open (with its pinned ring) until exit.
    filename: the file a failure to open it is reported against (the message
    then reads "FILE: cuda:0: why")."""
    with _devices_lock:
        d = _devices.get(spec)
        if d is None:
            d = _devices[spec] = Device(spec, filename)
        return d


def host_available():
    """(bytes, source): the host memory available now, cgroup-aware (what a
    Store's default host budget is taken from, ferry_host_available), and
    where the figure came from ("cgroup /a/b: memory.max", "MemAvailable")."""
    out = ctypes.c_uint64()
    buf = ctypes.create_string_buffer(256)
    rc = lib.ferry_host_available(ctypes.byref(out), buf, len(buf))
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return out.value, buf.value.decode("utf-8", "replace")


def parse_size(s):
    """Bytes in "16MiB", "1.5GB", "4096" (ferry_parse_size); ints pass through."""
    if isinstance(s, int):
        if s < 0:
            raise ValueError(f"negative size {s}")
        return s
    out = ctypes.c_uint64()
    rc = lib.ferry_parse_size(str(s).encode(), ctypes.byref(out))
    if rc < 0:
        raise ValueError(f"not a byte count: {s!r}")
    return out.value


class ProgressBar:
    """progress=True: a tqdm bar in bytes (tqdm imported only then), made at
    the first report (when the total is known) and advanced as the library
    reports bytes landed. Without tqdm: one plain line on stderr at close."""

    def __init__(self, desc):
        self.desc, self.bar, self.done, self.total = desc, None, 0, 0
        try:
            import tqdm
            self._tqdm = tqdm.tqdm
        except ImportError:
            self._tqdm = None

    def __call__(self, done, total):
        if self._tqdm is not None and self.bar is None:
            self.bar = self._tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                                  desc=self.desc)
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done, self.total = done, total

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self._tqdm is None and self.total:
            import sys
            print(f"ferry: {self.desc}: {self.done} of {self.total} bytes", file=sys.stderr)


def progress_fn(progress, desc):
    """(callable or None, bar or None) for a load's progress= argument."""
    if progress is True:
        bar = ProgressBar(desc)
        return bar, bar
    if progress is False:
        return None, None
    return progress, None


class LoadOptions:
    """ferry_load_opts from the keyword options, plus the progress callback's
    bookkeeping: the ctypes trampoline must live as long as the load, and an
    exception raised by the Python callback (in a worker thread) is kept and
    raised again when the load returns."""

    def __init__(self, route="auto", threads=None, ring_buffers=None, ring_buffer_bytes=None,
                 progress=None, offset=0, total=None, flags=0):
        o = _lib.LoadOpts()  # size set
        o.flags = flags
        if route is None:
            route = "auto"
        p = lib.ferry_route_parse(str(route).encode())
        if p < 0:
            raise ValueError(f"route must be one of {', '.join(_lib.ROUTES)}, not {route!r}")
        o.route = p
        if threads is not None:
            if threads < 0:
                raise ValueError("threads must be >= 0")
            o.threads = threads
        if ring_buffers is not None:
            if ring_buffers < 0:
                raise ValueError("ring_buffers must be >= 0")
            o.ring_buffers = ring_buffers
        if ring_buffer_bytes is not None:
            o.ring_buffer_bytes = parse_size(ring_buffer_bytes)
        self.errors = []
        self._fn = None
        if progress is not None:
            if not callable(progress):
                raise TypeError("progress must be callable(done, total)")

            def trampoline(_opaque, done, tot):
                try:
                    progress(offset + done, tot if total is None else total)
                except BaseException as e:  # noqa: B902 - kept and raised in the caller's thread
                    if not self.errors:
                        self.errors.append(e)

            self._fn = _lib.PROGRESS_FN(trampoline)
            o.progress = self._fn
        self.opts = o

    def raise_pending(self):
        if self.errors:
            e = self.errors[0]
            self.errors = []
            raise e


def route_arg(route, path_kind, where):
    """The route a call was given: route=, or the deprecated path_kind= (a
    DeprecationWarning; kept for one release)."""
    if path_kind is None:
        return route
    warnings.warn(f"{where}: path_kind= is deprecated, use route=", DeprecationWarning, stacklevel=3)
    return path_kind


def stats_dict(st):
    """ferry_load_stats as a dict; "route" is the route taken (ferry_route_name).
    "path", the same, is its deprecated name (kept for one release)."""
    route = _lib.ROUTES[st.route] if 0 <= st.route < len(_lib.ROUTES) else str(st.route)
    return {"route": route, "path": route,
            "bytes": st.bytes, "seconds": st.seconds,
            "resident": st.resident, "why": st.why.decode("utf-8", "replace") if st.why else "",
            "registration": ("none", "new", "reused")[st.registration] if 0 <= st.registration < 3
            else str(st.registration),
            "register_seconds": st.register_seconds, "setup_seconds": st.setup_seconds,
            "alloc_seconds": st.alloc_seconds, "pin_seconds": st.pin_seconds}


def route_choice(dev, handle, opts, nbytes=0):
    """ferry_load_plan_route: what a load of nbytes (0: all) of handle's file
    (None: no file) with opts would do on dev now, as a dict: route, threads,
    buffers, buffer_bytes, pins (it would pin a staging ring first), resident
    (auto's sampled page-cache fraction, else -1) and why."""
    c = _lib.RouteChoice()
    rc = lib.ferry_load_plan_route(dev.dev, handle.f if handle is not None else None,
                                   ctypes.byref(opts.opts), int(nbytes), ctypes.byref(c))
    dev.check(rc, handle.path if handle is not None else dev.spec)
    return {"route": _lib.ROUTES[c.route] if 0 <= c.route < len(_lib.ROUTES) else str(c.route),
            "threads": c.threads, "buffers": c.buffers, "buffer_bytes": c.buffer_bytes, "pins": bool(c.pins),
            "resident": c.resident, "why": c.why.decode("utf-8", "replace") if c.why else ""}


def prepare(dev, opts, nbytes):
    """ferry_device_prepare: pin the ring a load of nbytes with opts would
    use, now (ctypes lets go of the GIL meanwhile: call it on a thread to
    overlap the pinning with other work). Returns the library's code, 0 or
    negative: a failure here is the load's to report, when it pins again."""
    return lib.ferry_device_prepare(dev.dev, ctypes.byref(opts.opts), nbytes)


def load_into(dev, handle, idx, ptrs, opts):
    """ferry_load_into: tensor idx[k] of handle's file into address ptrs[k].
    Returns the load's statistics as a dict."""
    n = len(idx)
    st = _lib.LoadStats()
    if n:
        ia = (ctypes.c_int64 * n)(*idx)
        pa = (ctypes.c_uint64 * n)(*ptrs)
        rc = lib.ferry_load_into(dev.dev, handle.f, ia, pa, n, ctypes.byref(opts.opts), ctypes.byref(st))
        if rc < 0:
            opts.errors = []
            dev.check(rc, handle.path)
    opts.raise_pending()
    return stats_dict(st)


class Loaded:
    """A ferry_load: device memory ferry allocated and fills, freed (and the
    file released) when the last reference goes. Exported tensors hold one."""

    _free = lib.ferry_loaded_free

    def __init__(self, dev, handle, opts):
        self.dev = dev
        self.handle = handle
        self.l = None
        out = ctypes.c_void_p()
        st = _lib.LoadStats()
        rc = lib.ferry_load(dev.dev, handle.f, ctypes.byref(opts.opts), ctypes.byref(out), ctypes.byref(st))
        if rc < 0:
            opts.errors = []
            dev.check(rc, handle.path)
        self.l = out
        handle.acquire()
        self.stats = stats_dict(st)
        opts.raise_pending()

    def ptr(self, i):
        return lib.ferry_loaded_ptr(self.l, i)

    def read(self, i, nbytes):
        """A copy of tensor i's bytes, read back from the device."""
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        self.dev.check(lib.ferry_loaded_read(self.l, i, buf), self.handle.path)
        return buf.raw[:nbytes]

    def __del__(self):
        if self.l is not None:
            self._free(self.l)
            self.l = None
            self.handle.release()


def plan_views(infos, shared_ok=True):
    """Group the tensors whose bytes overlap (views of one PyTorch storage,
    flagged FERRY_TENSOR_SHARED_STORAGE, of one dtype) so that each group gets
    one buffer and its tensors stay views of one storage, as torch.load gives.

    Returns (bases, where): bases is a list of (shard, start offset, end
    offset, index of the tensor that starts it); where[i] = (base number, byte
    offset of tensor i in that base) for every tensor with bytes."""
    bases, where = [], {}
    shared = []
    for t in infos:
        if not t.nbytes:
            continue
        if shared_ok and t.flags & _lib.TENSOR_SHARED_STORAGE:
            shared.append(t)
        else:
            where[t.index] = (len(bases), 0)
            bases.append((t.shard, t.offset, t.offset + t.nbytes, t.index))
    shared.sort(key=lambda t: (t.shard, t.dtype, t.offset))
    cur = None
    for t in shared:
        if cur is not None and (t.shard, t.dtype) == cur[0] and t.offset < cur[2]:
            cur[2] = max(cur[2], t.offset + t.nbytes)
        else:
            if cur is not None:
                bases.append((cur[0][0], cur[1], cur[2], cur[3]))
            cur = [(t.shard, t.dtype), t.offset, t.offset + t.nbytes, t.index]
        where[t.index] = (len(bases), t.offset - cur[1])
    if cur is not None:
        bases.append((cur[0][0], cur[1], cur[2], cur[3]))
    return bases, where


def contiguous_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(st))


def is_block_type(dtype_name):
    """ggml's block-quantized types (Q4_K, IQ2_XXS, ...): no framework has them."""
    return dtype_name in _lib.BLOCK_DTYPES


def framework_dtype(table, info, path, what):
    """table's dtype for a ferry TensorInfo; None for ggml's block-quantized
    types (raw bytes); else UnsupportedError naming the file and tensor: its
    dtype "has no <what>"."""
    dt = table.get(info.dtype)
    if dt is not None:
        return dt
    if is_block_type(info.dtype):
        return None
    raise errors.UnsupportedError(
        _lib.E_UNSUPPORTED, f"{path}: tensor '{info.name}': dtype {info.dtype} has no {what}", path)
