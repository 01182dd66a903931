# SPDX-License-Identifier: Apache-2.0
"""ferry.numpy - checkpoints as numpy arrays through libferry.

load_file(path) is safetensors.numpy.load_file for every format ferry reads:
a dict name -> numpy.ndarray, sorted by name, zero-copy views of a
copy-on-write private mapping (writable; writes never reach the file).

numpy has no bfloat16 or FP8 dtypes. When ml_dtypes is importable they come
back as ml_dtypes.bfloat16, float8_e4m3fn, ...; without it as unsigned
integers of the same width holding the raw bits (BF16 -> uint16, FP8 ->
uint8): `(a.astype(numpy.uint32) << 16).view(numpy.float32)` widens such a
BF16 array exactly. ggml's block-quantized GGUF tensors come back as raw uint8
arrays of shape [nbytes]; F4 and F6 raise UnsupportedError.
"""
import numpy as np

from . import _core, _lib

__all__ = ["load_file", "dtype_for", "DTYPES"]

DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32), "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16), "F32": np.dtype(np.float32), "F64": np.dtype(np.float64),
    "C64": np.dtype(np.complex64),
}
"""ferry dtype name -> numpy dtype (with ml_dtypes' types where it is importable)."""

_ML = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
       "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}
_RAW = {"BF16": np.dtype(np.uint16), "F8_E4M3": np.dtype(np.uint8), "F8_E5M2": np.dtype(np.uint8),
        "F8_E4M3FNUZ": np.dtype(np.uint8), "F8_E5M2FNUZ": np.dtype(np.uint8), "F8_E8M0": np.dtype(np.uint8)}
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None
for _name, _raw in _RAW.items():
    _t = getattr(ml_dtypes, _ML[_name], None) if ml_dtypes is not None else None
    DTYPES[_name] = np.dtype(_t) if _t is not None else _raw


def dtype_for(info, path=None):
    """numpy dtype of a ferry TensorInfo; None for block-quantized (raw bytes)."""
    return _core.framework_dtype(DTYPES, info, path, "numpy dtype")


def load_file(path):
    """Every tensor of a checkpoint as a zero-copy, copy-on-write numpy array,
    name -> array sorted by name. The file stays mapped while any array (or a
    view of one) lives. Errors as in ferry.torch.load_file."""
    h = _core._Handle(path, _lib.OPEN_PRIVATE)
    infos = h.infos()
    dts = {t.index: dtype_for(t, h.path) for t in infos}
    bases, where = _core.plan_views(infos)
    base_bufs = [h.buffer(h.data(first), end - start) for _, start, end, first in bases]
    out = {}
    for t in infos:
        dt = dts[t.index]
        if dt is None:
            shape, dt, strides = (t.nbytes,), np.dtype(np.uint8), None
        else:
            shape = t.shape
            strides = tuple(s * dt.itemsize for s in t.strides) if t.strides is not None else None
        if not t.nbytes:
            out[t.name] = np.empty(shape, dtype=dt)
            continue
        b, off = where[t.index]
        out[t.name] = np.ndarray(shape, dtype=dt, buffer=base_bufs[b], offset=off, strides=strides)
    return {k: out[k] for k in sorted(out)}
