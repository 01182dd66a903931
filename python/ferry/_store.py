"""_store - the residency store's C objects (ferry_store, ferry_model), with no
framework in sight: ferry.torch.Store is built on this.

Lifetimes: a StoreCore owns one ferry_store and the files of every model in
it; the store is freed (and then the files closed) when the last Python
reference goes. Zero-copy views of device memory hold a reference to the
StoreCore, so the store outlives every view made from it (a view of a tensor
the store has since moved away is stale, not freed memory: the store frees
its blocks only when it is freed or make_room gives them back).

Errors of every store call are reported on the device's ferry_ctx (the store
has no ctx of its own), so they are read from there.
"""
import collections
import ctypes
import os

from . import _core, _lib
from ._lib import lib
from .errors import check, error

TensorState = collections.namedtuple("TensorState", "name nbytes tier dirty pins group dptr")
TensorState.__doc__ = """One tensor of a store's model (ferry_model_tensor_state): tier is
"device", "pinned", "host", "source" or "spill"; dirty: it differs from the
checkpoint; pins: how often it is pinned; group: tensors with the same group
move together; dptr: its device address while tier == "device", else 0."""

UINT64_MAX = (1 << 64) - 1


def tier_name(t):
    return _lib.TIER_NAMES[t] if 0 <= t < len(_lib.TIER_NAMES) else lib.ferry_tier_name(t).decode()


def _struct_dict(st):
    """A ctypes struct of numbers, strings and ferry_mem_range as a dict."""
    out = {}
    for name, typ in st._fields_:
        v = getattr(st, name)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, _lib.MemRange):
            v = {"start": v.start, "end": v.end, "peak": v.peak}
        out[name] = v
    return out


def stats_dict(st):
    """ferry_store_stats as a dict: tier_bytes becomes {tier name: bytes}."""
    out = _struct_dict(st)
    out["tier_bytes"] = {tier_name(i): st.tier_bytes[i] for i in range(len(_lib.TIER_NAMES))}
    out["spilling"] = bool(st.spilling)
    return out


def job_dict(st):
    """ferry_job_stats as a dict (rss, uss, pss, cgroup: {start, end, peak})."""
    return _struct_dict(st)


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

    def __len__(self):
        return len(self.infos)

    def find(self, name):
        """Model index of the tensor called name, or None."""
        return self.index.get(name)

    def filename(self):
        """The file (or files) the model was made of, to name in errors."""
        return self.handles[0].path if len(self.handles) == 1 else None


class StoreCore:
    """A ferry_store on a ferry Device (which the process keeps open)."""

    _store_free = lib.ferry_store_free

    def __init__(self, dev, *, device_budget=0, device_reserve=0, host_budget=0, pinned_budget=0,
                 host_reserve=0, spill_below=0, spill_above=0, spill_dir=None, load_opts=None):
        self.s = None
        self.dev = dev
        self.models = {}  # name -> Model, in the order added
        o = _lib.StoreOpts()
        o.size = ctypes.sizeof(_lib.StoreOpts)
        o.device_budget = device_budget
        o.device_reserve = device_reserve
        o.host_budget = host_budget
        o.pinned_budget = pinned_budget
        o.host_reserve = host_reserve
        o.spill_below = spill_below
        o.spill_above = spill_above
        self._spill_dir = os.fsencode(os.fspath(spill_dir)) if spill_dir is not None else None
        o.spill_dir = self._spill_dir
        if load_opts is not None:
            o.load = load_opts
        out = ctypes.c_void_p()
        self.check(lib.ferry_store_new(dev.dev, ctypes.byref(o), ctypes.byref(out)), dev.spec)
        self.s = out

    def check(self, rc, filename=None):
        return check(rc, self.dev.ctx, filename)

    def __del__(self):
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
        self.check(lib.ferry_store_remove(m.m), m.filename())
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
        self.check(lib.ferry_model_to_device(m.m, arr, n), m.filename())

    def evict(self, m, idx=None):
        arr, n = self._index_array(idx)
        self.check(lib.ferry_model_evict(m.m, arr, n), m.filename())

    def mark_dirty(self, m, i):
        self.check(lib.ferry_model_mark_dirty(m.m, i), m.filename())

    def pin(self, m, i=-1):
        self.check(lib.ferry_model_hold(m.m, i), m.filename())

    def unpin(self, m, i=-1):
        self.check(lib.ferry_model_release(m.m, i), m.filename())

    def set_priority(self, m, priority):
        self.check(lib.ferry_model_set_priority(m.m, int(priority)), m.filename())

    def raw_state(self, m, i, st):
        """Fill st (a _lib.TensorState) with tensor i's state."""
        self.check(lib.ferry_model_tensor_state(m.m, i, ctypes.byref(st)), m.filename())
        return st

    def state(self, m, i):
        st = self.raw_state(m, i, _lib.TensorState())
        return TensorState(st.name.decode("utf-8"), st.nbytes, tier_name(st.tier), bool(st.dirty), st.pins,
                           st.group, st.dptr)

    def read(self, m, i, address):
        """Copy tensor i's bytes (from whichever tier holds them) to address."""
        self.check(lib.ferry_model_read(m.m, i, address), m.filename())

    def write(self, m, i, address):
        self.check(lib.ferry_model_write(m.m, i, address), m.filename())

    def make_room(self, nbytes):
        """Bytes evicted; raises BudgetError (with .could, the most that could
        be made free) when it is impossible."""
        could = ctypes.c_uint64()
        rc = lib.ferry_store_make_room(self.s, nbytes, ctypes.byref(could))
        if rc < 0:
            e = error(rc, _lib.errmsg(self.dev.ctx))
            e.could = could.value
            raise e
        return rc

    def stats(self):
        st = _lib.StoreStats()
        self.check(lib.ferry_store_get_stats(self.s, ctypes.byref(st)))
        return stats_dict(st)

    def job_begin(self, name):
        self.check(lib.ferry_store_job_begin(self.s, name.encode("utf-8")))

    def job_end(self):
        st = _lib.JobStats()
        self.check(lib.ferry_store_job_end(self.s, ctypes.byref(st)))
        return job_dict(st)
