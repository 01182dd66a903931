# SPDX-License-Identifier: Apache-2.0
"""_dlpack - export memory ferry owns (a ferry_load's device blocks) as DLPack
capsules, so that frameworks wrap it without a copy.

Each capsule carries a DLManagedTensor (DLPack's stable C ABI, the legacy
"dltensor" capsule every framework version reads) describing one tensor's
bytes as a 1-D uint8 array; the framework reinterprets dtype and shape. Its
manager_ctx is a key into _live, which holds the owner (a ferry Loaded) and
the ctypes memory of the struct: the deleter, called by the framework when its
tensor dies, drops that entry, and the owner frees the device memory once the
last entry naming it is gone. A capsule nobody consumed calls the deleter
from its own destructor.
"""
import ctypes
import itertools
import threading

KDL_CPU = 1
KDL_CUDA = 2
_KDL_UINT = 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_CAPSULE_NAME = b"dltensor"
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_live = {}  # manager_ctx key -> (owner, DLManagedTensor, shape, strides)
_lock = threading.Lock()
_keys = itertools.count(1)


def _release(managed_address):
    if not managed_address:
        return
    key = DLManagedTensor.from_address(managed_address).manager_ctx
    with _lock:
        entry = _live.pop(key, None)
    del entry  # the owner may free its memory here, outside the lock


@_DELETER
def _deleter(managed_address):
    _release(managed_address)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule_address):
    # A consumer renames the capsule ("used_dltensor") and calls the deleter
    # itself; only a capsule nobody consumed still holds its tensor here.
    if _api.PyCapsule_IsValid(capsule_address, _CAPSULE_NAME):
        _release(_api.PyCapsule_GetPointer(capsule_address, _CAPSULE_NAME))


def capsule(address, nbytes, device_type, device_id, owner):
    """A "dltensor" capsule over nbytes bytes at address (a 1-D uint8 array)
    that keeps owner alive until the consumer's tensor is freed."""
    m = DLManagedTensor()
    shape = (ctypes.c_int64 * 1)(nbytes)
    strides = (ctypes.c_int64 * 1)(1)  # explicit: older consumers do not accept NULL strides
    t = m.dl_tensor
    t.data = address
    t.device = DLDevice(device_type, device_id)
    t.ndim = 1
    t.dtype = DLDataType(_KDL_UINT, 8, 1)
    t.shape = shape
    t.strides = strides
    t.byte_offset = 0
    key = next(_keys)
    m.manager_ctx = key
    m.deleter = _deleter
    with _lock:
        _live[key] = (owner, m, shape, strides)
    return _api.PyCapsule_New(ctypes.addressof(m), _CAPSULE_NAME, _capsule_destructor)


def live_count():
    """Exported tensors not yet released (for tests)."""
    with _lock:
        return len(_live)
