# SPDX-License-Identifier: Apache-2.0
"""_lib - libferry.so found, loaded and declared to ctypes.

The functions' restype and argtypes are in _signatures, the struct mirrors
in _structs (re-exported here: the binding's other modules take every
declaration from _lib). Each mirror is checked at import against the layout
the loaded library reports (ferry_abi_sizeof, _offsetof, _field): a mirror
that differs in size, field order or any offset is an ImportError naming the
struct and the field. Enum tables (dtype, route, tier and format names, error
codes and their names) are not copied: they are read from the library
(ferry_abi_enum_count and the ferry_*_name functions). The library is found,
in this order:
  1. the copy bundled into the installed package (ferry/libferry.so, put there
     by `pip install ./python`, see python/setup.py),
  2. the file (or folder holding libferry.so) named by $FERRY_LIBRARY,
  3. ../build/libferry.so next to a source checkout (python/ferry/../../build).
"""
import ctypes
import errno
import os
import sys

from ._signatures import FUNCTIONS, _P, _cp, _i32, _i64, _vp
from ._structs import (  # noqa: F401  (the mirrors are _lib's names for the rest of the binding)
    JobStats, KeeperStats, LoadOpts, LoadStats, MemRange, Plan, PlanOpts, PROGRESS_FN, RouteChoice, StoreOpts,
    STREAM_COPIES, StreamerOpts, StreamerStats, Struct, TensorInfo, TensorState,
)

_HERE = os.path.dirname(os.path.abspath(__file__))

# The oldest library this binding was written against (FERRY_VERSION_NUMBER).
MIN_VERSION = 100  # 0.1.0

OPEN_PRIVATE = 0x1
TENSOR_NONCONTIGUOUS = 0x1
TENSOR_SHARED_STORAGE = 0x2
LOAD_PREAD = 1 << 1  # FERRY_LOAD_PREAD
PAGEABLE_MAX = 32 << 20  # FERRY_PAGEABLE_MAX: auto's largest pageable load
META_JSON = 1  # ferry_meta_kind FERRY_META_JSON: the value is JSON text

# ferry's own codes start here and go down (FERRY_E_BASE); how many there are
# and their names come from the library (ferry_abi_enum_count, ferry_error_name).
E_BASE = -4097


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


# every function this binding declares: name -> (restype, argtypes);
# tests/py/test_binding_signatures.py checks each against include/ferry.h and
# include/ferry_experimental.h
SIGNATURES = {}

# functions of those headers this binding leaves out, and why (the same test
# checks that every other exported function is in SIGNATURES)
UNBOUND = {
    "ferry_file_tensor_gathered_bytes": "strided PyTorch views: the CLI's cat and hash (torch reads them itself)",
    "ferry_file_tensor_gather": "strided PyTorch views: the CLI's cat and hash (torch reads them itself)",
    "ferry_file_convert": "file conversion: the CLI's `ferry convert`",
    "ferry_file_convert_with": "file conversion: the CLI's `ferry convert`",
    "ferry_file_hash": "checkpoint hashes: the CLI's `ferry hash` and `ferry load --verify`",
    "ferry_xxh3": "checkpoint hashes: the CLI's `ferry hash` and `ferry load --verify`",
    "ferry_device_register_file": "page-locking a file's mapping for the register route: the CLI's load and bench",
    "ferry_device_unregister_file": "page-locking a file's mapping for the register route: the CLI's load and bench",
    # ferry_experimental.h: the keeper itself is the CLI's (`ferry keep`); the store talks to it in C
    **{name: "the keeper's daemon and client: the CLI's `ferry keep`; the store uses them in C" for name in (
        "ferry_keep_serve", "ferry_keep_connect", "ferry_keep_close", "ferry_keep_errmsg", "ferry_keep_put_begin",
        "ferry_keep_put_commit", "ferry_keep_get", "ferry_keep_release", "ferry_keep_drop", "ferry_keep_status_get",
        "ferry_keep_status_free")},
    "ferry_keep_file_identity": "keeper identities: the store computes its own (ferry_file_keep_identity) in C",
    "ferry_file_keep_identity": "keeper identities: the store computes its own in C",
}


def _bind(signatures):
    SIGNATURES.update(signatures)
    for name, (res, args) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"ferry: {path} has no {name}: it is older than this binding "
                              f"(python/ferry); rebuild the library or use the binding of its version") from None
        fn.restype = res
        fn.argtypes = args


_bind({
    "ferry_version": (_i32, []),
    "ferry_version_string": (_cp, []),
})
version = lib.ferry_version()
version_string = lib.ferry_version_string().decode()
if version // 10000 != MIN_VERSION // 10000 or version < MIN_VERSION:
    raise ImportError(f"ferry: {path} is version {version_string}; this binding needs "
                      f"{MIN_VERSION // 10000}.{MIN_VERSION // 100 % 100}.x or newer of the same major version")

# ---- what the library says about its own ABI (ferry_abi_*) ---------------------
_bind({
    "ferry_abi_sizeof": (_i64, [_cp]),
    "ferry_abi_offsetof": (_i64, [_cp, _cp]),
    "ferry_abi_field": (_cp, [_cp, _i32]),
    "ferry_abi_enum_count": (_i32, [_cp]),
    "ferry_error_name": (_cp, [_i32]),
    "ferry_dtype_name": (_cp, [_i32]),
    "ferry_route_name": (_cp, [_i32]),
    "ferry_tier_name": (_cp, [_i32]),
    "ferry_format_name": (_cp, [_i32]),
    "ferry_dtype_bits": (_i32, [_i32]),
    "ferry_dtype_block": (_i32, [_i32, _P(_i32), _P(_i32)]),
})


def _enum_count(type_name):
    n = lib.ferry_abi_enum_count(type_name.encode())
    if n < 0:
        raise ImportError(f"ferry: {path} ({version_string}) does not describe the enum {type_name}")
    return n


def _names(type_name, name_fn):
    """The names of an enum's values 0..count-1, in the library's order."""
    return tuple(name_fn(i).decode() for i in range(_enum_count(type_name)))


DTYPE_NAMES = _names("ferry_dtype", lib.ferry_dtype_name)  # index = ferry_dtype value
# ggml's block-quantized types (no whole number of bits per element, yet a
# valid block): these travel as raw bytes
BLOCK_DTYPES = frozenset(n for i, n in enumerate(DTYPE_NAMES)
                         if lib.ferry_dtype_bits(i) == 0 and lib.ferry_dtype_block(i, None, None) == 0)
ROUTES = _names("ferry_route", lib.ferry_route_name)        # "auto", "ring", ...
PATHS = ROUTES  # deprecated: the binding's old name for them (path_kind=), kept for one release
TIER_NAMES = _names("ferry_tier", lib.ferry_tier_name)      # "device", "pinned", ...
FORMAT_NAMES = _names("ferry_format", lib.ferry_format_name)
TIER_COUNT = len(TIER_NAMES)


def _index(names, name, what):
    try:
        return names.index(name)
    except ValueError:
        raise ImportError(f"ferry: {path} ({version_string}) has no {what} {name!r}, which this "
                          f"binding uses (it has {', '.join(names)})") from None


TIER_DEVICE = _index(TIER_NAMES, "device", "tier")
TIER_SOURCE = _index(TIER_NAMES, "source", "tier")

# code -> name ("BUSY") of every FERRY_E_* code, FERRY_E_BASE downwards; E_BASE
# (ferry.h's fixed boundary below the -errno range) must be where they start
if lib.ferry_error_name(E_BASE + 1) is not None or lib.ferry_error_name(E_BASE) is None:
    raise ImportError(f"ferry: {path} ({version_string}): its error codes do not start at {E_BASE}")
ERROR_NAMES = {}
for _k in range(_enum_count("ferry_error")):
    _n = lib.ferry_error_name(E_BASE - _k)
    if _n is None:
        raise ImportError(f"ferry: {path} ({version_string}) has no name for its error code {E_BASE - _k}")
    ERROR_NAMES[E_BASE - _k] = _n.decode()
ERROR_CODES = {name: code for code, name in ERROR_NAMES.items()}


def _error_code(name):
    code = ERROR_CODES.get(name)
    if code is None:
        raise ImportError(f"ferry: {path} ({version_string}) has no FERRY_E_{name}, which this binding uses")
    return code


# the codes the binding itself raises or tests for
E_UNSUPPORTED = _error_code("UNSUPPORTED")
E_INVAL = _error_code("INVAL")
E_NODEV = _error_code("NODEV")
E_NOTFOUND = _error_code("NOTFOUND")
E_INTERNAL = _error_code("INTERNAL")
E_BUSY = _error_code("BUSY")


class StoreStats(Struct):
    _ferry_name_ = "ferry_store_stats"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("tier_bytes", ctypes.c_uint64 * TIER_COUNT),  # FERRY_TIER_COUNT
        ("device_budget", ctypes.c_uint64),
        ("pinned_budget", ctypes.c_uint64),
        ("host_budget", ctypes.c_uint64),
        ("host_available", ctypes.c_uint64),
        ("spilling", ctypes.c_int),
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
        ("pinned_cache_bytes", ctypes.c_uint64),
        ("device_allocs", ctypes.c_uint64),
        ("device_frees", ctypes.c_uint64),
        ("fence_waits", ctypes.c_uint64),
        ("fence_orders", ctypes.c_uint64),
        ("pinned_reserved", ctypes.c_uint64),
        ("pinned_reserve", ctypes.c_uint64),
    ]


MIRRORS = (TensorInfo, LoadOpts, LoadStats, RouteChoice, StoreOpts, TensorState, PlanOpts, Plan, StoreStats, MemRange, JobStats,
           KeeperStats)


def mirror_mismatch(cls):
    """What differs between the ctypes mirror cls and the library's layout of
    cls._ferry_name_ (size, field names in order, each field's offset), as a
    sentence; None when they agree."""
    cname = cls._ferry_name_
    c = cname.encode()
    size = lib.ferry_abi_sizeof(c)
    if size < 0:
        return "the library does not know this struct"
    lib_fields = []
    while True:
        f = lib.ferry_abi_field(c, len(lib_fields))
        if f is None:
            break
        lib_fields.append(f.decode())
    ours = [f[0] for f in cls._fields_]
    for name in ours:
        off = getattr(cls, name).offset
        if name not in lib_fields:
            return f"field '{name}' at {off}: the library has no such field (its fields: {', '.join(lib_fields)})"
        theirs = lib.ferry_abi_offsetof(c, name.encode())
        if theirs != off:
            return f"field '{name}' at {off}, the library has it at {theirs}"
    for name in lib_fields:
        if name not in ours:
            return (f"the library has field '{name}' at {lib.ferry_abi_offsetof(c, name.encode())}, "
                    f"which this mirror lacks")
    if ours != lib_fields:
        return f"fields in the order {', '.join(ours)}, the library's are {', '.join(lib_fields)}"
    if ctypes.sizeof(cls) != size:
        return f"sizeof {ctypes.sizeof(cls)}, the library's is {size}"
    return None


def check_mirror(cls):
    """Raise ImportError naming the first difference between the ctypes
    mirror cls and the loaded library's struct."""
    why = mirror_mismatch(cls)
    if why is not None:
        mod = sys.modules.get(cls.__module__)
        where = getattr(mod, "__file__", None) or cls.__module__
        raise ImportError(f"ferry: {where}'s {cls._ferry_name_} does not match libferry {version_string} "
                          f"({path}): {why}")


for _cls in MIRRORS:
    check_mirror(_cls)

# the functions of _signatures, and the one that takes StoreStats
_bind(FUNCTIONS)
_bind({"ferry_store_get_stats": (_i32, [_vp, _P(StoreStats)])})


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def strerror(code):
    return _text(lib.ferry_strerror(code))


def errmsg(ctx):
    """The context's latest message (ctx None: this thread's last failed ferry_ctx_new)."""
    return _text(lib.ferry_ctx_errmsg(ctx))


# the message a failing call left on the handle it was made on
def file_errmsg(f):
    return _text(lib.ferry_file_errmsg(f))


def device_errmsg(dev):
    return _text(lib.ferry_device_errmsg(dev))


def store_errmsg(s):
    return _text(lib.ferry_store_errmsg(s))


def model_errmsg(m):
    return _text(lib.ferry_model_errmsg(m))


def error_name(code):
    """"BUSY" for FERRY_E_BUSY and so on; None for other codes (-errno)."""
    return ERROR_NAMES.get(code)


def is_system_error(code):
    return -4096 < code < 0


def errno_name(code):
    return errno.errorcode.get(-code, str(-code))
