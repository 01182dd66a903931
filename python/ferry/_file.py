# SPDX-License-Identifier: Apache-2.0
"""_file - open checkpoints: ferry.File, the _Handle under it and every view,
and TensorInfo.

Lifetimes: a _Handle owns one ferry_ctx and one ferry_file and closes them
when the last Python reference goes; every zero-copy view (torch tensor, numpy
array) holds a reference to it through its buffer, so the mapping outlives
every view.
"""
import collections
import ctypes
import json
import os

from . import _lib
from ._lib import lib
from .errors import check, check_on


TensorInfo = collections.namedtuple(
    "TensorInfo", "index name dtype shape nbytes offset shard strides flags")
TensorInfo.__doc__ = """One tensor of a checkpoint, as ferry_tensor_info reports it: dtype is
ferry's name ("BF16", "Q4_K"), shape a tuple outermost-first, strides a tuple of
element strides for non-row-major PyTorch views (else None), flags FERRY_TENSOR_*."""


def _fspath(path):
    return os.fsencode(os.fspath(path))


def _tensor_info(i, ti):
    """TensorInfo of tensor i from the ferry_tensor_info struct ti filled for it."""
    nd, dti = ti.ndim, ti.dtype
    names = _lib.DTYPE_NAMES
    dt = names[dti] if 0 <= dti < len(names) else lib.ferry_dtype_name(dti).decode()
    return TensorInfo(i, ti.name.decode("utf-8"), dt, tuple(ti.shape[:nd]), ti.nbytes, ti.offset, ti.shard,
                      tuple(ti.strides[:nd]) if ti.strides else None, ti.flags)


class _Handle:
    """A ferry_ctx and a ferry_file opened on it; freed with the last reference."""

    __slots__ = ("ctx", "f", "path", "flags", "users", "finalized", "__weakref__")

    # bound here so that __del__ still works while the interpreter shuts down
    _file_close = lib.ferry_file_close
    _ctx_free = lib.ferry_ctx_free

    def __init__(self, path, flags=0):
        self.ctx = self.f = None
        self.users = 0          # C objects that need the file open (a Loaded)
        self.finalized = False
        self.path = os.fspath(path)
        self.flags = flags
        ctx = ctypes.c_void_p()
        check(lib.ferry_ctx_new(None, ctypes.byref(ctx)), None, self.path)
        self.ctx = ctx
        f = ctypes.c_void_p()
        rc = lib.ferry_file_open(ctx, _fspath(path), flags, ctypes.byref(f))
        if rc < 0:
            check(rc, ctx, self.path)
        self.f = f

    def __del__(self):
        # In a garbage cycle Python runs the finalizers in no set order: a
        # Loaded of this file may still need it, and then closes it itself.
        if self.users:
            self.finalized = True
            return
        self._close()

    def _close(self):
        if self.f is not None:
            self._file_close(self.f)
            self.f = None
        if self.ctx is not None:
            self._ctx_free(self.ctx)
            self.ctx = None

    def acquire(self):
        self.users += 1

    def release(self):
        self.users -= 1
        if not self.users and self.finalized:
            self._close()

    def check(self, rc):
        """rc, or the exception for it with the message left on this file."""
        return check_on(rc, _lib.file_errmsg, self.f, self.path)

    def count(self):
        return lib.ferry_file_tensor_count(self.f)

    def info(self, i):
        ti = _lib.TensorInfo()
        self.check(lib.ferry_file_tensor_info(self.f, i, ctypes.byref(ti)))
        return _tensor_info(i, ti)

    def infos(self):
        # info() for every tensor, with one struct and the lookups hoisted:
        # ctypes' per-call costs were 2 ms of a 10 GB load's 220 for 540 tensors
        ti = _lib.TensorInfo()
        ref, get, f = ctypes.byref(ti), lib.ferry_file_tensor_info, self.f
        out = []
        for i in range(self.count()):
            rc = get(f, i, ref)
            if rc < 0:
                self.check(rc)
            out.append(_tensor_info(i, ti))
        return out

    def data(self, i):
        """Address of tensor i's bytes in the mapping."""
        p = ctypes.c_void_p()
        self.check(lib.ferry_file_tensor_data(self.f, i, ctypes.byref(p)))
        return p.value or 0

    def buffer(self, address, nbytes):
        """A writable ctypes array over [address, address + nbytes) of the
        mapping that keeps this handle (so the mapping) alive."""
        buf = (ctypes.c_ubyte * nbytes).from_address(address)
        buf._ferry_owner = self
        return buf


class File:
    """An open checkpoint (safetensors, *.safetensors.index.json, GGUF, PyTorch
    zip): its tensor table and metadata, without reading any tensor data.

    private=True maps it copy-on-write (FERRY_OPEN_PRIVATE): views may then be
    written, and writes change only this process's copy. close() (or leaving a
    with block) drops this object's hold on the mapping; views made from it
    keep it mapped until they are gone too."""

    def __init__(self, path, *, private=False):
        self._h = _Handle(path, _lib.OPEN_PRIVATE if private else 0)
        self.path = self._h.path
        self._infos = None
        self._names = None

    def _handle(self):
        if self._h is None:
            raise ValueError(f"{self.path}: file is closed")
        return self._h

    def close(self):
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def format(self):
        """"safetensors", "safetensors-index", "gguf" or "pytorch"."""
        h = self._handle()
        return lib.ferry_format_name(lib.ferry_file_format(h.f)).decode()

    @property
    def total_bytes(self):
        return lib.ferry_file_total_bytes(self._handle().f)

    @property
    def shards(self):
        h = self._handle()
        return [lib.ferry_file_shard_path(h.f, i).decode("utf-8", "surrogateescape")
                for i in range(lib.ferry_file_shard_count(h.f))]

    def _metadata(self, typed):
        h = self._handle()
        out = {}
        k, v = ctypes.c_char_p(), ctypes.c_char_p()
        for i in range(lib.ferry_file_metadata_count(h.f)):
            h.check(lib.ferry_file_metadata(h.f, i, ctypes.byref(k), ctypes.byref(v)))
            text = v.value.decode("utf-8")
            if typed and lib.ferry_file_metadata_kind(h.f, i) == _lib.META_JSON:
                text = json.loads(text)
            out[k.value.decode("utf-8")] = text
        return out

    @property
    def metadata(self):
        """{key: value} as text (GGUF numbers in decimal, short arrays as JSON)."""
        return self._metadata(False)

    @property
    def typed_metadata(self):
        """metadata with the values the file types as Python values: a GGUF's
        integers, floats, booleans and arrays of up to 16 items, an index's
        non-string values; strings, NaN, Infinity and summarised long arrays
        ("[STRING x 151936]") stay strings."""
        return self._metadata(True)

    @property
    def tensors(self):
        """TensorInfo of every tensor, in file order."""
        h = self._handle()
        if self._infos is None:
            self._infos = h.infos()
        return list(self._infos)

    def keys(self):
        return [t.name for t in self.tensors]

    def __len__(self):
        return lib.ferry_file_tensor_count(self._handle().f)

    def __contains__(self, name):
        return self.find(name) is not None

    def find(self, name):
        """Index of the tensor called name, or None."""
        h = self._handle()
        i = lib.ferry_file_find(h.f, name.encode("utf-8"))
        if i == _lib.E_NOTFOUND:
            return None
        return h.check(i)

    def info(self, key):
        """TensorInfo of a tensor, by name or index (KeyError if absent)."""
        if isinstance(key, str):
            i = self.find(key)
            if i is None:
                raise KeyError(f"{self.path}: no tensor '{key}'")
            key = i
        return self._handle().info(key)

    def read(self, key):
        """A copy of a tensor's bytes (read with pread, not through the mapping)."""
        h = self._handle()
        t = self.info(key)
        buf = ctypes.create_string_buffer(t.nbytes)
        if t.nbytes:
            h.check(lib.ferry_file_tensor_read(h.f, t.index, 0, buf, t.nbytes))
        return buf.raw

    def resident(self):
        """Fraction (0..1) of the file's pages in the page cache, or -1."""
        return lib.ferry_file_resident(self._handle().f)

    def __repr__(self):
        state = "closed" if self._h is None else f"{self.format}, {len(self)} tensors"
        return f"<ferry.File {self.path!r} ({state})>"
