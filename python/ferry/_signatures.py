# SPDX-License-Identifier: Apache-2.0
# Generated from include/ferry.h and include/ferry_experimental.h by
# scripts/gen_signatures.py: edit the headers (or _lib.py, _structs.py) and run it
# again; ctest python_signatures fails while this file differs from its output.
"""_signatures - the restype and argtypes of each function of ferry.h the
binding calls, beyond the few _lib declares itself to load and check the
library (version, ABI queries, ferry_store_get_stats, whose struct _lib
declares). _lib binds them; tests/py/test_binding_signatures.py checks every
one against include/ferry.h.
"""
import ctypes

from ._structs import (JobStats, KeeperStats, LoadOpts, LoadStats, Plan, PlanOpts, RouteChoice, StoreOpts,
                       StreamerOpts, StreamerStats, TensorInfo, TensorState)

_vp = ctypes.c_void_p
_i32, _u32, _i64, _u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
_cp = ctypes.c_char_p
_P = ctypes.POINTER

# name: (restype, argtypes)
FUNCTIONS = {
    "ferry_strerror": (_cp, [_i32]),
    "ferry_ctx_new": (_i32, [_vp, _P(_vp)]),
    "ferry_ctx_free": (None, [_vp]),
    "ferry_ctx_errmsg": (_cp, [_vp]),
    "ferry_file_errmsg": (_cp, [_vp]),
    "ferry_device_errmsg": (_cp, [_vp]),
    "ferry_store_errmsg": (_cp, [_vp]),
    "ferry_model_errmsg": (_cp, [_vp]),
    "ferry_file_open": (_i32, [_vp, _cp, _u32, _P(_vp)]),
    "ferry_file_close": (None, [_vp]),
    "ferry_file_format": (_i32, [_vp]),
    "ferry_file_tensor_count": (_i64, [_vp]),
    "ferry_file_total_bytes": (_u64, [_vp]),
    "ferry_file_shard_count": (_i32, [_vp]),
    "ferry_file_shard_path": (_cp, [_vp, _i32]),
    "ferry_file_metadata_count": (_i64, [_vp]),
    "ferry_file_metadata": (_i32, [_vp, _i64, _P(_cp), _P(_cp)]),
    "ferry_file_metadata_kind": (_i32, [_vp, _i64]),
    "ferry_file_tensor_info": (_i32, [_vp, _i64, _P(TensorInfo)]),
    "ferry_file_find": (_i64, [_vp, _cp]),
    "ferry_file_tensor_data": (_i32, [_vp, _i64, _P(_vp)]),
    "ferry_file_tensor_read": (_i32, [_vp, _i64, _u64, _vp, ctypes.c_size_t]),
    "ferry_parse_size": (_i32, [_cp, _P(_u64)]),
    "ferry_device_open": (_i32, [_vp, _cp, _P(_vp)]),
    "ferry_device_close": (None, [_vp]),
    "ferry_device_desc": (_cp, [_vp]),
    "ferry_device_mem_info": (_i32, [_vp, _P(_u64), _P(_u64)]),
    "ferry_route_parse": (_i32, [_cp]),
    "ferry_device_prepare": (_i32, [_vp, _P(LoadOpts), _u64]),
    "ferry_load_plan_route": (_i32, [_vp, _vp, _P(LoadOpts), _u64, _P(RouteChoice)]),
    "ferry_device_probe_cufile": (_i32, [_vp, _vp, _cp, ctypes.c_size_t]),
    "ferry_load": (_i32, [_vp, _vp, _P(LoadOpts), _P(_vp), _P(LoadStats)]),
    "ferry_loaded_ptr": (_u64, [_vp, _i64]),
    "ferry_loaded_read": (_i32, [_vp, _i64, _vp]),
    "ferry_loaded_free": (None, [_vp]),
    "ferry_load_into": (_i32, [_vp, _vp, _P(_i64), _P(_u64), _i64, _P(LoadOpts), _P(LoadStats)]),
    "ferry_device_copy_rate": (_i32, [_vp, _u64, _P(ctypes.c_double), _P(ctypes.c_double)]),
    "ferry_file_resident": (ctypes.c_double, [_vp]),
    "ferry_store_new": (_i32, [_vp, _P(StoreOpts), _P(_vp)]),
    "ferry_store_free": (None, [_vp]),
    "ferry_store_add": (_i32, [_vp, _cp, _P(_vp), _i32, _i32, _P(_vp)]),
    "ferry_store_remove": (_i32, [_vp]),
    "ferry_store_find": (_vp, [_vp, _cp]),
    "ferry_model_put": (None, [_vp]),
    "ferry_model_name": (_cp, [_vp]),
    "ferry_model_tensor_count": (_i64, [_vp]),
    "ferry_model_find": (_i64, [_vp, _cp]),
    "ferry_model_group": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_set_priority": (_i32, [_vp, _i32]),
    "ferry_model_set_pinned_cache": (_i32, [_vp, _i32]),
    "ferry_model_to_device": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_to_device_async": (_i32, [_vp, _P(_i64), _i64, _P(_vp)]),
    "ferry_op_wait": (_i32, [_vp]),
    "ferry_op_query": (_i32, [_vp]),
    "ferry_op_stream_wait": (_i32, [_vp, _u64]),
    "ferry_model_release_after": (_i32, [_vp, _i64, _u64]),
    "ferry_model_plan": (_i32, [_vp, _P(PlanOpts), _P(Plan)]),
    "ferry_model_get_plan": (_i32, [_vp, _P(Plan)]),
    "ferry_model_block_streams": (_i32, [_vp, _i64]),
    "ferry_store_set_device_budget": (_i32, [_vp, _u64]),
    "ferry_streamer_new": (_i32, [_vp, _P(StreamerOpts), _P(_vp)]),
    "ferry_streamer_free": (None, [_vp]),
    "ferry_streamer_pass_begin": (_i32, [_vp, _u64]),
    "ferry_streamer_block_begin": (_i32, [_vp, _i64, _u64]),
    "ferry_streamer_block_end": (_i32, [_vp, _i64, _u64]),
    "ferry_streamer_pass_end": (_i32, [_vp, _u64]),
    "ferry_streamer_drain": (_i32, [_vp]),
    "ferry_streamer_set_budget": (_i32, [_vp, _u64, _u64]),
    "ferry_streamer_block_position": (_i64, [_vp, _i64]),
    "ferry_streamer_block_streams": (_i32, [_vp, _i64]),
    "ferry_streamer_get_stats": (_i32, [_vp, _P(StreamerStats)]),
    "ferry_model_evict": (_i32, [_vp, _P(_i64), _i64]),
    "ferry_model_mark_dirty": (_i32, [_vp, _i64]),
    "ferry_model_hold": (_i32, [_vp, _i64]),
    "ferry_model_release": (_i32, [_vp, _i64]),
    "ferry_model_tensor_state": (_i32, [_vp, _i64, _P(TensorState)]),
    "ferry_model_device_addrs": (_i32, [_vp, _P(_i64), _i64, _P(_u64)]),
    "ferry_model_read": (_i32, [_vp, _i64, _vp]),
    "ferry_model_write": (_i32, [_vp, _i64, _vp]),
    "ferry_store_make_room": (_i64, [_vp, _u64, _P(_u64)]),
    "ferry_store_wait_pinned": (_i32, [_vp]),
    "ferry_store_spill_dir": (_cp, [_vp]),
    "ferry_host_available": (_i32, [_P(_u64), _cp, ctypes.c_size_t]),
    "ferry_store_job_begin": (_i32, [_vp, _cp]),
    "ferry_store_job_end": (_i32, [_vp, _P(JobStats)]),
    "ferry_store_job_name": (_cp, [_vp]),
    "ferry_keep_default_socket": (_i32, [_cp, ctypes.c_size_t]),
    "ferry_store_use_keeper": (_i32, [_vp, _cp, _i32]),
    "ferry_store_get_keeper_stats": (_i32, [_vp, _P(KeeperStats)]),
}
