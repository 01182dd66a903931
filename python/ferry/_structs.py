# SPDX-License-Identifier: Apache-2.0
"""_structs - the ctypes mirrors of ferry.h's structs (and of the one of
ferry_experimental.h the binding uses: KeeperStats), and the progress
callback's type, transcribed from the header because ctypes needs them.
_lib checks each against the layout the loaded library reports
(ferry_abi_sizeof, _offsetof, _field) at import and re-exports them; the
one whose size depends on the library (ferry_store_stats: an array of one
entry per tier) is declared in _lib.
"""
import ctypes


class Struct(ctypes.Structure):
    """A mirror of one of ferry.h's structs. _ferry_name_ is its C name, under
    which the library describes its layout (ferry_abi_*): check_mirror compares
    the two at import. An instance starts with `size` set to sizeof the struct
    (ferry.h's rule for every struct passed in or filled out)."""

    _ferry_name_ = None

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if self._fields_ and self._fields_[0][0] == "size":
            self.size = ctypes.sizeof(self)


class TensorInfo(Struct):
    _ferry_name_ = "ferry_tensor_info"
    _fields_ = [
        ("size", ctypes.c_uint32),
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


class LoadOpts(Struct):
    _ferry_name_ = "ferry_load_opts"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("route", ctypes.c_int),
        ("threads", ctypes.c_uint32),
        ("streams", ctypes.c_uint32),
        ("ring_buffers", ctypes.c_uint32),
        ("ring_buffer_bytes", ctypes.c_uint64),
        ("pinned_budget", ctypes.c_uint64),
        ("progress", PROGRESS_FN),
        ("opaque", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
    ]


class LoadStats(Struct):
    _ferry_name_ = "ferry_load_stats"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("route", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("resident", ctypes.c_double),
        ("why", ctypes.c_char_p),  # static text of the library's
        ("registration", ctypes.c_int),
        ("register_seconds", ctypes.c_double),
        ("setup_seconds", ctypes.c_double),
        ("alloc_seconds", ctypes.c_double),
        ("pin_seconds", ctypes.c_double),
    ]


class RouteChoice(Struct):
    _ferry_name_ = "ferry_route_choice"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("route", ctypes.c_int),
        ("threads", ctypes.c_uint32),
        ("buffers", ctypes.c_uint32),
        ("buffer_bytes", ctypes.c_uint64),
        ("pins", ctypes.c_int32),
        ("resident", ctypes.c_double),
        ("why", ctypes.c_char_p),  # the library's static text
    ]

# ---- residency store (ferry_store_*, ferry_model_*) ---------------------------

class StoreOpts(Struct):
    _ferry_name_ = "ferry_store_opts"
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
        ("load", ctypes.POINTER(LoadOpts)),  # copied by ferry_store_new
        ("pinned_reserve", ctypes.c_uint64),
    ]


class TensorState(Struct):
    _ferry_name_ = "ferry_tensor_state"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("nbytes", ctypes.c_uint64),
        ("tier", ctypes.c_int),
        ("dirty", ctypes.c_int),
        ("holds", ctypes.c_int),
        ("group", ctypes.c_int64),
        ("dptr", ctypes.c_uint64),
        ("cached", ctypes.c_int),
        ("streams", ctypes.c_int),
    ]


class PlanOpts(Struct):
    _ferry_name_ = "ferry_plan_opts"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("blocks", ctypes.POINTER(ctypes.c_int64)),  # copied by ferry_model_plan
        ("nblocks", ctypes.c_int64),
        ("window", ctypes.c_int64),
        ("budget", ctypes.c_uint64),
        ("reserve", ctypes.c_uint64),
        ("pinned_cache", ctypes.c_int),
        ("dry_run", ctypes.c_int64),
    ]


class Plan(Struct):
    _ferry_name_ = "ferry_plan"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("blocks", ctypes.c_int64),
        ("resident_blocks", ctypes.c_int64),
        ("streamed_blocks", ctypes.c_int64),
        ("fixed_bytes", ctypes.c_uint64),
        ("resident_bytes", ctypes.c_uint64),
        ("window_bytes", ctypes.c_uint64),
        ("streamed_bytes", ctypes.c_uint64),
        ("budget", ctypes.c_uint64),
        ("window", ctypes.c_int64),
        ("minimum_bytes", ctypes.c_uint64),
    ]


class StreamerOpts(Struct):
    _ferry_name_ = "ferry_streamer_opts"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("blocks", ctypes.POINTER(ctypes.c_int64)),  # copied by ferry_streamer_new
        ("nblocks", ctypes.c_int64),
        ("prefetch", ctypes.c_int64),
        ("budget", ctypes.c_uint64),
        ("reserve", ctypes.c_uint64),
        ("copies", ctypes.c_int),
        ("fixed", ctypes.POINTER(ctypes.c_int64)),  # copied by ferry_streamer_new; NULL: all outside the blocks
        ("nfixed", ctypes.c_int64),
    ]


class StreamerStats(Struct):
    _ferry_name_ = "ferry_streamer_stats"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("passes", ctypes.c_int64),
        ("blocks", ctypes.c_int64),
        ("resident_blocks", ctypes.c_int64),
        ("streamed_blocks", ctypes.c_int64),
        ("prefetch", ctypes.c_int64),
        ("prefetch_asked", ctypes.c_int64),
        ("budget", ctypes.c_uint64),
        ("budget_asked", ctypes.c_uint64),
        ("minimum_bytes", ctypes.c_uint64),
        ("fixed_bytes", ctypes.c_uint64),
        ("resident_bytes", ctypes.c_uint64),
        ("window_bytes", ctypes.c_uint64),
        ("streamed_bytes", ctypes.c_uint64),
        ("pinned_copies", ctypes.c_int),
        ("pass_htod", ctypes.c_uint64),
        ("pass_read", ctypes.c_uint64),
        ("pass_seconds", ctypes.c_double),
        ("shrinks", ctypes.c_uint64),
        ("grows", ctypes.c_uint64),
        ("retries", ctypes.c_uint64),
        ("prefetch_skipped", ctypes.c_uint64),
    ]


STREAM_COPIES = {"auto": 0, "pinned": 1, "ring": 2}


class MemRange(Struct):
    _ferry_name_ = "ferry_mem_range"
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("peak", ctypes.c_uint64)]


class JobStats(Struct):
    _ferry_name_ = "ferry_job_stats"
    _fields_ = [
        ("size", ctypes.c_uint32),
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


class KeeperStats(Struct):
    """ferry_experimental.h's ferry_store_keeper_stats (ferry_store_get_keeper_stats)."""
    _ferry_name_ = "ferry_store_keeper_stats"
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("used", ctypes.c_int32),
        ("connected", ctypes.c_int32),
        ("bytes_served", ctypes.c_uint64),
        ("bytes_fed", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("stale", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("connects", ctypes.c_uint64),
        ("last_error", ctypes.c_char * 256),
    ]
