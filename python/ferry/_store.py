# SPDX-License-Identifier: Apache-2.0
"""_store - the residency store's C objects (ferry_store, ferry_model), with no
framework in sight: ferry.torch.Store is built on this.

Lifetimes: a StoreCore owns one ferry_store and the files of every model in
it; the store is freed (and then the files closed) when the last Python
reference goes. Zero-copy views of device memory hold a reference to the
StoreCore, so the store outlives every view made from it (a view of a tensor
the store has since moved away is stale, not freed memory: the store frees
its blocks only when it is freed or make_room gives them back).

Errors are read from the handle the failing call was made on: the model's
message (ferry_model_errmsg) for ferry_model_* and ferry_store_remove, the
store's (ferry_store_errmsg) for ferry_store_*, and the device's context for
ferry_store_new (the store does not exist yet).

The library reads no environment: when no spill_dir is given, $FERRY_SPILL_DIR
(if set and not empty) is passed, as the CLI does.

A keeper (`ferry keep`, docs/KEEPER.md; ferry_experimental.h) may serve the
store's clean tensors: StoreCore(keeper=True) or use_keeper() at the default
socket, keeper=PATH at another.
"""
import collections
import ctypes
import os
import warnings

from . import _core, _lib
from ._lib import lib
from .errors import check, check_on, error

class TensorState(collections.namedtuple("TensorState", "name nbytes tier dirty holds group dptr cached streams",
                                         defaults=(False, False))):
    __slots__ = ()

    @property
    def pins(self):
        """Deprecated name of holds (kept for one release)."""
        warnings.warn("TensorState.pins is deprecated, use TensorState.holds", DeprecationWarning, stacklevel=2)
        return self.holds


TensorState.__doc__ = """One tensor of a store's model (ferry_model_tensor_state): tier is
"device", "pinned", "host", "source" or "spill"; dirty: it differs from the
checkpoint; holds: how often it is held (ferry_model_hold; never
evicted while > 0; pins is its deprecated name); group: tensors with the same group
move together; dptr: its device address while tier == "device", else 0;
cached: a clean copy is also kept in the pinned pool (a streamed block);
streams: its block streams under the model's plan."""

UINT64_MAX = (1 << 64) - 1


def tier_name(t):
    return _lib.TIER_NAMES[t] if 0 <= t < len(_lib.TIER_NAMES) else lib.ferry_tier_name(t).decode()


def _struct_dict(st, extra=None):
    """A ctypes struct of numbers, strings and ferry_mem_range as a dict,
    without its size field; extra: {field: {key: value}} puts those keys right
    after that field (None: first)."""
    extra = extra or {}
    out = dict(extra.get(None, {}))
    for name, typ in st._fields_:
        if name == "size":
            continue
        v = getattr(st, name)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, _lib.MemRange):
            v = {"start": v.start, "end": v.end, "peak": v.peak}
        out[name] = v
        out.update(extra.get(name, {}))
    return out


def host_source():
    """Where the host's available memory figure comes from ("cgroup /a/b:
    memory.max", "MemAvailable"): ferry_host_available's source."""
    avail = ctypes.c_uint64()
    buf = ctypes.create_string_buffer(256)
    rc = lib.ferry_host_available(ctypes.byref(avail), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if rc >= 0 else ""


def stats_dict(st, spill_path="", source=""):
    """ferry_store_stats as a dict: tier_bytes becomes {tier name: bytes};
    host_source and spill_path (no longer in the struct: ferry_host_available,
    ferry_store_spill_dir) are put where the struct used to have them."""
    out = _struct_dict(st, {"host_available": {"host_source": source}, "spilling": {"spill_path": spill_path}})
    out["tier_bytes"] = {tier_name(i): st.tier_bytes[i] for i in range(len(_lib.TIER_NAMES))}
    out["spilling"] = bool(st.spilling)
    return out


def keeper_socket():
    """The keeper's default socket path (ferry_keep_default_socket):
    $XDG_RUNTIME_DIR/ferry/keep.sock, else /tmp/ferry-keep-UID/keep.sock."""
    buf = ctypes.create_string_buffer(4096)
    rc = lib.ferry_keep_default_socket(buf, len(buf))
    if rc < 0:
        raise OSError(-rc, "ferry keep: the default socket path is too long ($XDG_RUNTIME_DIR)")
    return os.fsdecode(buf.value)


def _keeper_path(keeper):
    """keeper= as the socket to pass: None for the default (True), bytes for a path."""
    if keeper is True:
        return None
    if isinstance(keeper, (str, bytes, os.PathLike)):
        return os.fsencode(os.fspath(keeper))
    raise TypeError(f"keeper must be None, True (the default socket) or a socket path, not {keeper!r}")


def job_dict(st, job):
    """ferry_job_stats as a dict (rss, uss, pss, cgroup: {start, end, peak}),
    with the job's name first (ferry_store_job_name)."""
    return _struct_dict(st, {None: {"job": job}})


class Model:
    """A model in a StoreCore: its ferry_model, the files it was made of, and
    the TensorInfo of each of its tensors in the store's numbering (file by
    file, each in its own order)."""

    def __init__(self, core, name, m, handles, infos):
        self.core = core
        self.name = name
        self.m = m
        self.handles = handles
        self.infos = infos  # model index -> TensorInfo (index: the index in its file)
        self.index = {}
        for k, t in enumerate(infos):
            self.index.setdefault(t.name, k)  # the first file that has it, as ferry_model_find
        self.removed = False
        self.streamers = []  # its Streamers: freed before the model is

    def __len__(self):
        return len(self.infos)

    def find(self, name):
        """Model index of the tensor called name, or None."""
        return self.index.get(name)

    def filename(self):
        """The file (or files) the model was made of, to name in errors."""
        return self.handles[0].path if len(self.handles) == 1 else None


class Op:
    """A queued move (ferry_op): wait() once, or let it go (it waits then).
    It keeps its store alive, so the store is freed only after its ops."""

    _wait = lib.ferry_op_wait

    def __init__(self, core, m, op):
        self.core, self.m, self._op = core, m, op

    def done(self):
        """True once the copies are done (wait() will not block)."""
        if self._op is None:
            return True
        return self.core.check_model(self.m, lib.ferry_op_query(self._op)) == 1

    def stream_wait(self, stream):
        """Order a raw CUstream (an int, e.g. torch.cuda.current_stream().cuda_stream)
        after the copies, without a host sync for them (the host waits while
        the move's file reads still run: ferry_op_stream_wait)."""
        if self._op is not None:
            self.core.check_model(self.m, lib.ferry_op_stream_wait(self._op, int(stream)))

    def wait(self):
        """Wait until the move has landed; raises what its copies failed with."""
        if self._op is None:
            return
        op, self._op = self._op, None
        self.core.check_model(self.m, self._wait(op))

    def __del__(self):
        if getattr(self, "_op", None) is not None:
            op, self._op = self._op, None
            self._wait(op)  # errors were the caller's to collect with wait()


class Streamer:
    """A ferry_streamer: the C engine that runs a model's passes block by
    block (see ferry.h); the caller reports each pass and each block."""

    _free = lib.ferry_streamer_free

    def __init__(self, core, m, blocks, prefetch, budget, reserve, copies, fixed=None):
        self.core, self.m, self.st = core, m, None
        if copies not in _lib.STREAM_COPIES:
            raise ValueError(f"copies must be one of {sorted(_lib.STREAM_COPIES)}, not {copies!r}")
        o = _lib.StreamerOpts()
        arr = (ctypes.c_int64 * max(len(blocks), 1))(*blocks)
        o.blocks = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        o.nblocks = len(blocks)
        o.prefetch = int(prefetch)
        o.budget = int(budget)
        o.reserve = int(reserve)
        o.copies = _lib.STREAM_COPIES[copies]
        if fixed is not None:
            farr = (ctypes.c_int64 * max(len(fixed), 1))(*fixed)
            o.fixed = ctypes.cast(farr, ctypes.POINTER(ctypes.c_int64))
            o.nfixed = len(fixed)
        out = ctypes.c_void_p()
        core.check_model(m, lib.ferry_streamer_new(m.m, ctypes.byref(o), ctypes.byref(out)))
        self.st = out
        m.streamers.append(self)
        self._stats = _lib.StreamerStats()

    def _check(self, rc):
        return self.core.check_model(self.m, rc)

    def pass_begin(self, stream):
        self._check(lib.ferry_streamer_pass_begin(self.st, stream))

    def block_begin(self, k, stream):
        self._check(lib.ferry_streamer_block_begin(self.st, k, stream))

    def block_end(self, k, stream):
        self._check(lib.ferry_streamer_block_end(self.st, k, stream))

    def pass_end(self, stream):
        self._check(lib.ferry_streamer_pass_end(self.st, stream))

    def drain(self):
        self._check(lib.ferry_streamer_drain(self.st))

    def set_budget(self, budget, reserve):
        self._check(lib.ferry_streamer_set_budget(self.st, int(budget), int(reserve)))

    def position(self, k):
        return self._check(lib.ferry_streamer_block_position(self.st, k))

    def streams(self, k):
        return bool(self._check(lib.ferry_streamer_block_streams(self.st, k)))

    def stats(self):
        self._check(lib.ferry_streamer_get_stats(self.st, ctypes.byref(self._stats)))
        d = _struct_dict(self._stats)
        d["pinned_copies"] = bool(d["pinned_copies"])
        return d

    def close(self):
        if self.st is not None:
            st, self.st = self.st, None
            self._free(st)
            if self in self.m.streamers:
                self.m.streamers.remove(self)

    def __del__(self):
        if getattr(self, "st", None) is not None:
            self.close()


class StoreCore:
    """A ferry_store on a ferry Device (which the process keeps open)."""

    _store_free = lib.ferry_store_free

    def __init__(self, dev, *, device_budget=0, device_reserve=0, host_budget=0, pinned_budget=0,
                 host_reserve=0, spill_below=0, spill_above=0, spill_dir=None, load_opts=None, pinned_reserve=0,
                 keeper=None):
        self.s = None
        self.dev = dev
        self.models = {}  # name -> Model, in the order added
        o = _lib.StoreOpts()  # size set
        o.device_budget = device_budget
        o.device_reserve = device_reserve
        o.host_budget = host_budget
        o.pinned_budget = pinned_budget
        o.host_reserve = host_reserve
        o.spill_below = spill_below
        o.spill_above = spill_above
        o.pinned_reserve = pinned_reserve
        if spill_dir is None:
            spill_dir = os.environ.get("FERRY_SPILL_DIR") or None  # the library reads no environment
        o.spill_dir = os.fsencode(os.fspath(spill_dir)) if spill_dir is not None else None
        if load_opts is not None:
            o.load = ctypes.pointer(load_opts)  # copied by ferry_store_new, as is spill_dir
        out = ctypes.c_void_p()
        # before the store exists its messages go to the device's context
        check(lib.ferry_store_new(dev.dev, ctypes.byref(o), ctypes.byref(out)), dev.ctx, dev.spec)
        self.s = out
        if keeper is not None and keeper is not False:
            self.use_keeper(keeper)

    def use_keeper(self, keeper=True, timeout=None):
        """From now on ask the keeper at keeper (True: the default socket; a
        path) for clean tensors before reading checkpoints, and feed it what
        is read (ferry_store_use_keeper). Raises (OSError: FileNotFoundError
        or ConnectionRefusedError when no keeper runs there) and leaves the
        store as it was. timeout: seconds to wait for each answer (None: 5)."""
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        self.check(lib.ferry_store_use_keeper(self.s, _keeper_path(keeper), ms))

    def keeper_stats(self):
        """ferry_store_get_keeper_stats as a dict: used, connected (bools),
        bytes_served, bytes_fed, hits, misses, stale, refused, errors,
        connects, last_error."""
        st = _lib.KeeperStats()
        self.check(lib.ferry_store_get_keeper_stats(self.s, ctypes.byref(st)))
        d = _struct_dict(st)
        d["used"], d["connected"] = bool(st.used), bool(st.connected)
        return d

    def check(self, rc, filename=None):
        """rc, or the exception for it with the message left on the store."""
        return check_on(rc, _lib.store_errmsg, self.s, filename)

    @staticmethod
    def check_model(m, rc):
        """rc, or the exception for it with the message left on model m."""
        return check_on(rc, _lib.model_errmsg, m.m, m.filename())

    def __del__(self):
        for m in self.models.values():  # (their models go with the store)
            for st in list(m.streamers):
                st.close()
        if self.s is not None:
            self._store_free(self.s)
            self.s = None
        # only now may the files close (ferry_store_free's rule)
        for m in self.models.values():
            for h in m.handles:
                h.release()
        self.models = {}

    # ---- models ----

    @staticmethod
    def open_files(paths):
        """_Handles (opened for reading, not copy-on-write) and the TensorInfo
        of every tensor in the store's numbering."""
        handles, infos = [], []
        for p in paths:
            h = _core._Handle(p, 0)
            handles.append(h)
            infos.extend(h.infos())
        return handles, infos

    def add(self, name, handles, infos, priority=0):
        files = (ctypes.c_void_p * len(handles))(*[h.f.value for h in handles])
        out = ctypes.c_void_p()
        fname = handles[0].path if len(handles) == 1 else None
        self.check(lib.ferry_store_add(self.s, name.encode("utf-8"), files, len(handles), int(priority),
                                       ctypes.byref(out)), fname)
        m = Model(self, name, out, handles, infos)
        for h in handles:
            h.acquire()  # the file stays open until the store is freed or the model removed
        n = lib.ferry_model_tensor_count(out)
        if n != len(infos):  # cannot happen: the store numbers tensors file by file
            lib.ferry_store_remove(out)
            for h in handles:
                h.release()
            raise error(_lib.E_INTERNAL, f"store model \"{name}\": {n} tensors, its files have {len(infos)}")
        self.models[name] = m
        return m

    def remove(self, m):
        for st in list(m.streamers):  # (their holds and plan go first)
            st.close()
        self.check_model(m, lib.ferry_store_remove(m.m))
        m.removed = True
        del self.models[m.name]
        for h in m.handles:
            h.release()

    @staticmethod
    def _index_array(idx):
        if idx is None:
            return None, 0
        return (ctypes.c_int64 * max(len(idx), 1))(*idx), len(idx)

    def to_device(self, m, idx=None):
        arr, n = self._index_array(idx)
        self.check_model(m, lib.ferry_model_to_device(m.m, arr, n))

    def to_device_async(self, m, idx=None):
        """Queue the move of tensors idx (None: all) and their groups: an Op to
        wait on (or to order a stream after) once the copies are queued."""
        arr, n = self._index_array(idx)
        op = ctypes.c_void_p()
        self.check_model(m, lib.ferry_model_to_device_async(m.m, arr, n, ctypes.byref(op)))
        return Op(self, m, op)

    def release_after(self, m, i, stream):
        """Drop a hold of tensor i (-1: all) once the work queued on stream (a
        raw CUstream as an int; 0 the legacy default stream) has run."""
        self.check_model(m, lib.ferry_model_release_after(m.m, i, int(stream)))

    def evict(self, m, idx=None):
        arr, n = self._index_array(idx)
        self.check_model(m, lib.ferry_model_evict(m.m, arr, n))

    def mark_dirty(self, m, i):
        self.check_model(m, lib.ferry_model_mark_dirty(m.m, i))

    def hold(self, m, i=-1):
        """ferry_model_hold: tensor i (-1: all) stays on the device until released."""
        self.check_model(m, lib.ferry_model_hold(m.m, i))

    def release(self, m, i=-1):
        """ferry_model_release: drop one hold of tensor i (-1: all)."""
        self.check_model(m, lib.ferry_model_release(m.m, i))

    def pin(self, m, i=-1):
        """Deprecated name of hold (kept for one release)."""
        warnings.warn("StoreCore.pin is deprecated, use StoreCore.hold", DeprecationWarning, stacklevel=2)
        self.hold(m, i)

    def unpin(self, m, i=-1):
        """Deprecated name of release (kept for one release)."""
        warnings.warn("StoreCore.unpin is deprecated, use StoreCore.release", DeprecationWarning, stacklevel=2)
        self.release(m, i)

    def set_priority(self, m, priority):
        self.check_model(m, lib.ferry_model_set_priority(m.m, int(priority)))

    def set_pinned_cache(self, m, on):
        self.check_model(m, lib.ferry_model_set_pinned_cache(m.m, 1 if on else 0))

    def raw_state(self, m, i, st):
        """Fill st (a _lib.TensorState) with tensor i's state."""
        self.check_model(m, lib.ferry_model_tensor_state(m.m, i, ctypes.byref(st)))
        return st

    def device_addrs(self, m, arr, n, out):
        """ferry_model_device_addrs: tensors arr[0..n-1] (a ctypes int64 array),
        out a ctypes uint64 array of 3n (address, block base, block size)."""
        self.check_model(m, lib.ferry_model_device_addrs(m.m, arr, n, out))
        return out

    def state(self, m, i):
        st = self.raw_state(m, i, _lib.TensorState())
        return TensorState(st.name.decode("utf-8"), st.nbytes, tier_name(st.tier), bool(st.dirty), st.holds,
                           st.group, st.dptr, bool(st.cached), bool(st.streams))

    # ---- streaming plans ----

    def group(self, m, idx):
        arr, n = self._index_array(idx)
        self.check_model(m, lib.ferry_model_group(m.m, arr, n))

    def plan(self, m, blocks, window=0, budget=0, reserve=0, pinned_cache=True, dry_run=False):
        """ferry_model_plan: blocks = one model index per block, in pass
        order (each block already one group). The plan as a dict (dry_run:
        the plan it would be; the model keeps the one it has)."""
        o = _lib.PlanOpts()
        arr = (ctypes.c_int64 * max(len(blocks), 1))(*blocks)
        o.blocks = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        o.nblocks = len(blocks)
        o.window = int(window)
        o.budget = int(budget)
        o.reserve = int(reserve)
        o.pinned_cache = 0 if pinned_cache else -1
        o.dry_run = 1 if dry_run else 0
        out = _lib.Plan()
        self.check_model(m, lib.ferry_model_plan(m.m, ctypes.byref(o), ctypes.byref(out)))
        return _struct_dict(out)

    def get_plan(self, m):
        out = _lib.Plan()
        self.check_model(m, lib.ferry_model_get_plan(m.m, ctypes.byref(out)))
        return _struct_dict(out)

    def block_streams(self, m, k):
        return bool(self.check_model(m, lib.ferry_model_block_streams(m.m, int(k))))

    def set_device_budget(self, nbytes):
        self.check(lib.ferry_store_set_device_budget(self.s, int(nbytes)))

    # ---- the streaming engine ----

    def streamer(self, m, blocks, prefetch=0, budget=0, reserve=0, copies="auto", fixed=None):
        """ferry_streamer_new: blocks = one model index per block (each block
        already one group), in the order they are expected to run; fixed =
        the model indices outside the blocks that the passes bring (None:
        all of them)."""
        return Streamer(self, m, blocks, prefetch, budget, reserve, copies, fixed)

    def read(self, m, i, address):
        """Copy tensor i's bytes (from whichever tier holds them) to address."""
        self.check_model(m, lib.ferry_model_read(m.m, i, address))

    def write(self, m, i, address):
        self.check_model(m, lib.ferry_model_write(m.m, i, address))

    def make_room(self, nbytes):
        """Bytes evicted; raises BudgetError (with .could, the most that could
        be made free) when it is impossible."""
        could = ctypes.c_uint64()
        rc = lib.ferry_store_make_room(self.s, nbytes, ctypes.byref(could))
        if rc < 0:
            e = error(rc, _lib.store_errmsg(self.s))
            e.could = could.value
            raise e
        return rc

    def wait_pinned(self):
        """Wait until the pool asked for by pinned_reserve is pinned; raises
        the error that stopped the pinning (the store works on without it)."""
        self.check(lib.ferry_store_wait_pinned(self.s))

    def stats(self):
        st = _lib.StoreStats()
        self.check(lib.ferry_store_get_stats(self.s, ctypes.byref(st)))
        d = lib.ferry_store_spill_dir(self.s)  # NULL before the first spill
        out = stats_dict(st, os.fsdecode(d) if d else "", host_source())
        k = self.keeper_stats()
        out["bytes_from_keeper"] = k["bytes_served"]  # (not in bytes_read: that is checkpoints and the spill file)
        out["keeper"] = k
        return out

    def job_begin(self, name):
        self.check(lib.ferry_store_job_begin(self.s, name.encode("utf-8")))

    def job_end(self):
        st = _lib.JobStats()
        self.check(lib.ferry_store_job_end(self.s, ctypes.byref(st)))
        name = lib.ferry_store_job_name(self.s)  # the job just ended
        return job_dict(st, name.decode("utf-8", "replace") if name else "")
