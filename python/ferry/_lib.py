"""_lib - ctypes declarations of include/ferry.h and the search for libferry.so.

Everything here is a transcription of the C header: structs with the same
fields in the same order, one argtypes/restype pair per function. The library
is found, in this order:
  1. the copy bundled into the installed package (ferry/libferry.so, put there
     by `pip install ./python`, see python/setup.py),
  2. the file (or folder holding libferry.so) named by $FERRY_LIBRARY,
  3. ../build/libferry.so next to a source checkout (python/ferry/../../build).
"""
import ctypes
import errno
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

# The oldest library this binding was written against (FERRY_VERSION_NUMBER).
MIN_VERSION = 100  # 0.1.0

# ---- error codes (ferry.h) -------------------------------------------------
E_CORRUPT = -4097
E_UNSUPPORTED = -4098
E_FORMAT = -4099
E_INVAL = -4100
E_NOTFOUND = -4101
E_BUDGET = -4102
E_NODEV = -4103
E_DEVICE = -4104
E_LIMIT = -4105
E_INTERNAL = -4106

OPEN_PRIVATE = 0x1
TENSOR_NONCONTIGUOUS = 0x1
TENSOR_SHARED_STORAGE = 0x2

# ferry_dtype values, in the order of the enum (0 = INVALID)
DTYPE_NAMES = [
    "INVALID", "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32",
    "F64", "C64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3",
    "F6_E3M2", "F4", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
    "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
]
# the first of ggml's block-quantized types: these travel as raw bytes
DTYPE_FIRST_BLOCK = DTYPE_NAMES.index("Q4_0")

PATHS = ("auto", "ring", "direct", "register", "cufile")


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("nbytes", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("shard", ctypes.c_int32),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("flags", ctypes.c_uint32),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


class LoadOpts(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("path", ctypes.c_int),
        ("threads", ctypes.c_uint32),
        ("streams", ctypes.c_uint32),
        ("ring_buffers", ctypes.c_uint32),
        ("ring_buffer_bytes", ctypes.c_uint64),
        ("pinned_budget", ctypes.c_uint64),
        ("progress", PROGRESS_FN),
        ("opaque", ctypes.c_void_p),
    ]


class LoadStats(ctypes.Structure):
    _fields_ = [
        ("path", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("resident", ctypes.c_double),
        ("why", ctypes.c_char * 256),
    ]


# ---- residency store (ferry_store_*, ferry_model_*) ---------------------------
TIER_NAMES = ["device", "pinned", "host", "source", "spill"]  # ferry_tier, in enum order
TIER_DEVICE = 0
TIER_SOURCE = 3


class StoreOpts(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("device_budget", ctypes.c_uint64),
        ("device_reserve", ctypes.c_uint64),
        ("host_budget", ctypes.c_uint64),
        ("pinned_budget", ctypes.c_uint64),
        ("host_reserve", ctypes.c_uint64),
        ("spill_below", ctypes.c_uint64),
        ("spill_above", ctypes.c_uint64),
        ("spill_dir", ctypes.c_char_p),
        ("load", LoadOpts),
    ]


class TensorState(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("nbytes", ctypes.c_uint64),
        ("tier", ctypes.c_int),
        ("dirty", ctypes.c_int),
        ("pins", ctypes.c_int),
        ("group", ctypes.c_int64),
        ("dptr", ctypes.c_uint64),
    ]


class StoreStats(ctypes.Structure):
    _fields_ = [
        ("tier_bytes", ctypes.c_uint64 * 5),
        ("device_budget", ctypes.c_uint64),
        ("pinned_budget", ctypes.c_uint64),
        ("host_budget", ctypes.c_uint64),
        ("host_available", ctypes.c_uint64),
        ("host_source", ctypes.c_char * 96),
        ("spilling", ctypes.c_int),
        ("spill_path", ctypes.c_char * 256),
        ("spill_file_bytes", ctypes.c_uint64),
        ("bytes_htod", ctypes.c_uint64),
        ("bytes_dtoh", ctypes.c_uint64),
        ("seconds_htod", ctypes.c_double),
        ("seconds_dtoh", ctypes.c_double),
        ("bytes_written", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("evicted", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("models", ctypes.c_int64),
        ("tensors", ctypes.c_int64),
        ("device_cached", ctypes.c_uint64),
        ("pinned_pool_bytes", ctypes.c_uint64),
    ]


class MemRange(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("peak", ctypes.c_uint64)]


class JobStats(ctypes.Structure):
    _fields_ = [
        ("job", ctypes.c_char * 64),
        ("seconds", ctypes.c_double),
        ("rss", MemRange),
        ("uss", MemRange),
        ("pss", MemRange),
        ("cgroup", MemRange),
        ("device_bytes", ctypes.c_uint64),
        ("pinned_bytes", ctypes.c_uint64),
        ("host_bytes", ctypes.c_uint64),
        ("spill_bytes", ctypes.c_uint64),
        ("bytes_htod", ctypes.c_uint64),
        ("bytes_dtoh", ctypes.c_uint64),
        ("bytes_written", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("seconds_htod", ctypes.c_double),
        ("seconds_dtoh", ctypes.c_double),
        ("evicted", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
    ]


_vp = ctypes.c_void_p
_i32, _u32, _i64, _u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
_cp = ctypes.c_char_p
_P = ctypes.POINTER

# name: (restype, argtypes)
_SIGNATURES = {
    "ferry_version": (_i32, []),
    "ferry_version_string": (_cp, []),
    "ferry_strerror": (_cp, [_i32]),
    "ferry_ctx_new": (_i32, [_vp, _P(_vp)]),
    "ferry_ctx_free": (None, [_vp]),
    "ferry_ctx_errmsg": (_cp, [_vp]),
    "ferry_dtype_name": (_cp, [_i32]),
    "ferry_dtype_bits": (_i32, [_i32]),
    "ferry_dtype_block": (_i32, [_i32, _P(_i32), _P(_i32)]),
    "ferry_format_name": (_cp, [_i32]),
    "ferry_file_open": (_i32, [_vp, _cp, _u32, _P(_vp)]),
    "ferry_file_close": (None, [_vp]),
    "ferry_file_format": (_i32, [_vp]),
    "ferry_file_tensor_count": (_i64, [_vp]),
    "ferry_file_total_bytes": (_u64, [_vp]),
    "ferry_file_shard_count": (_i32, [_vp]),
    "ferry_file_shard_path": (_cp, [_vp, _i32]),
    "ferry_file_metadata_count": (_i64, [_vp]),
    "ferry_file_metadata": (_i32, [_vp, _i64, _P(_cp), _P(_cp)]),
    "ferry_file_tensor_info": (_i32, [_vp, _i64, _P(TensorInfo)]),
    "ferry_file_find": (_i64, [_vp, _cp]),
    "ferry_file_tensor_data": (_i32, [_vp, _i64, _P(_vp)]),
    "ferry_file_tensor_read": (_i32, [_vp, _i64, _u64, _vp, ctypes.c_size_t]),
    "ferry_file_resident": (ctypes.c_double, [_vp]),
    "ferry_parse_size": (_i32, [_cp, _P(_u64)]),
    "ferry_device_open": (_i32, [_vp, _cp, _P(_vp)]),
    "ferry_device_close": (None, [_vp]),
    "ferry_device_desc": (_cp, [_vp]),
    "ferry_device_mem_info": (_i32, [_vp, _P(_u64), _P(_u64)]),
    "ferry_route_name": (_cp, [_i32]),
    "ferry_route_parse": (_i32, [_cp]),
    "ferry_load": (_i32, [_vp, _vp, _P(LoadOpts), _P(_vp), _P(LoadStats)]),
    "ferry_loaded_ptr": (_u64, [_vp, _i64]),
    "ferry_loaded_read": (_i32, [_vp, _i64, _vp]),
    "ferry_loaded_free": (None, [_vp]),
    "ferry_load_into": (_i32, [_vp, _vp, _P(_i64), _P(_u64), _i64, _P(LoadOpts), _P(LoadStats)]),
    "ferry_tier_name": (_cp, [_i32]),
    "ferry_store_new": (_i32, [_vp, _P(StoreOpts), _P(_vp)]),
    "ferry_store_free": (None, [_vp]),
    "ferry_store_add": (_i32, [_vp, _cp, _P(_vp), _i32, _i32, _P(_vp)]),
    "ferry_store_remove": (_i32, [_vp]),
    "ferry_store_find": (_vp, [_vp, _cp]),
    "ferry_model_name": (_cp, [_vp]),
    "ferry_model_tensor_count": (_i64, [_vp]),
    "ferry_model_find": (_i64, [_vp, _cp]),
    "ferry_model_group": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_set_priority": (_i32, [_vp, _i32]),
    "ferry_model_to_device": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_evict": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_mark_dirty": (_i32, [_vp, _i64]),
    "ferry_model_hold": (_i32, [_vp, _i64]),
    "ferry_model_release": (_i32, [_vp, _i64]),
    "ferry_model_tensor_state": (_i32, [_vp, _i64, _P(TensorState)]),
    "ferry_model_read": (_i32, [_vp, _i64, _vp]),
    "ferry_model_write": (_i32, [_vp, _i64, _vp]),
    "ferry_store_make_room": (_i64, [_vp, _u64, _P(_u64)]),
    "ferry_store_get_stats": (_i32, [_vp, _P(StoreStats)]),
    "ferry_store_job_begin": (_i32, [_vp, _cp]),
    "ferry_store_job_end": (_i32, [_vp, _P(JobStats)]),
}


def _candidates():
    """Where to look for libferry.so, in order, with what each place is."""
    out = []
    for name in sorted(os.listdir(_HERE)):
        if name.startswith("libferry.so"):
            out.append((os.path.join(_HERE, name), "bundled with the package"))
            break
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        p = os.path.join(env, "libferry.so") if os.path.isdir(env) else env
        out.append((p, "$FERRY_LIBRARY"))
    out.append((os.path.normpath(os.path.join(_HERE, "..", "..", "build", "libferry.so")),
                "the source checkout's build folder"))
    return out


def _load():
    tried = []
    for path, what in _candidates():
        if not os.path.exists(path):
            tried.append(f"{path} ({what}): not there")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({what}): {e}")
            continue
        return lib, path
    raise ImportError("ferry: cannot find libferry.so; tried:\n  " + "\n  ".join(tried) +
                      "\nInstall the package with `pip install ./python` after building the library, "
                      "or set FERRY_LIBRARY to the built libferry.so.")


lib, path = _load()
path = os.path.abspath(path)
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

version = lib.ferry_version()
version_string = lib.ferry_version_string().decode()
if version // 10000 != MIN_VERSION // 10000 or version < MIN_VERSION:
    raise ImportError(f"ferry: {path} is version {version_string}; this binding needs "
                      f"{MIN_VERSION // 10000}.{MIN_VERSION // 100 % 100}.x or newer of the same major version")


def strerror(code):
    return lib.ferry_strerror(code).decode("utf-8", "replace")


def errmsg(ctx):
    m = lib.ferry_ctx_errmsg(ctx)
    return m.decode("utf-8", "replace") if m else ""


def is_system_error(code):
    return -4096 < code < 0


def errno_name(code):
    return errno.errorcode.get(-code, str(-code))
