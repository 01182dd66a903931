/* SPDX-License-Identifier: Apache-2.0 */
/* abi.c - the public structs' layouts and the enums' extents, by name, so a
 * binding (python/ferry) checks its mirror of ferry.h against the library it
 * loaded instead of trusting a copy. One table per struct; the test in
 * tests/unit/test_abi.c keeps them complete. */
#include <stddef.h>
#include <string.h>

#include "common.h"
#include "ferry_experimental.h"

typedef struct field {
    const char *name;
    size_t off;
} field;

/* clang-format off */
#define F(T, m) {#m, offsetof(T, m)}
/* clang-format on */

static const field f_allocator[] = {F(ferry_allocator, alloc),
                                    F(ferry_allocator, realloc),
                                    F(ferry_allocator, free),
                                    F(ferry_allocator, opaque),
                                    {NULL, 0}};
static const field f_ctx_opts[] = {F(ferry_ctx_opts, size),        F(ferry_ctx_opts, nthreads),
                                   F(ferry_ctx_opts, allocator),   F(ferry_ctx_opts, max_header_bytes),
                                   F(ferry_ctx_opts, max_tensors), {NULL, 0}};
static const field f_tensor_info[] = {F(ferry_tensor_info, size),
                                      F(ferry_tensor_info, name),
                                      F(ferry_tensor_info, dtype),
                                      F(ferry_tensor_info, ndim),
                                      F(ferry_tensor_info, shape),
                                      F(ferry_tensor_info, nbytes),
                                      F(ferry_tensor_info, offset),
                                      F(ferry_tensor_info, shard),
                                      F(ferry_tensor_info, strides),
                                      F(ferry_tensor_info, flags),
                                      {NULL, 0}};
static const field f_load_opts[] = {F(ferry_load_opts, size),
                                    F(ferry_load_opts, route),
                                    F(ferry_load_opts, threads),
                                    F(ferry_load_opts, streams),
                                    F(ferry_load_opts, ring_buffers),
                                    F(ferry_load_opts, ring_buffer_bytes),
                                    F(ferry_load_opts, pinned_budget),
                                    F(ferry_load_opts, progress),
                                    F(ferry_load_opts, opaque),
                                    F(ferry_load_opts, flags),
                                    {NULL, 0}};
static const field f_load_stats[] = {
    F(ferry_load_stats, size),          F(ferry_load_stats, route),
    F(ferry_load_stats, bytes),         F(ferry_load_stats, seconds),
    F(ferry_load_stats, resident),      F(ferry_load_stats, why),
    F(ferry_load_stats, registration),  F(ferry_load_stats, register_seconds),
    F(ferry_load_stats, setup_seconds), F(ferry_load_stats, alloc_seconds),
    F(ferry_load_stats, pin_seconds),   {NULL, 0}};
static const field f_route_choice[] = {
    F(ferry_route_choice, size),     F(ferry_route_choice, route),        F(ferry_route_choice, threads),
    F(ferry_route_choice, buffers),  F(ferry_route_choice, buffer_bytes), F(ferry_route_choice, pins),
    F(ferry_route_choice, resident), F(ferry_route_choice, why),          {NULL, 0}};
static const field f_store_opts[] = {F(ferry_store_opts, size),           F(ferry_store_opts, device_budget),
                                     F(ferry_store_opts, device_reserve), F(ferry_store_opts, host_budget),
                                     F(ferry_store_opts, pinned_budget),  F(ferry_store_opts, host_reserve),
                                     F(ferry_store_opts, spill_below),    F(ferry_store_opts, spill_above),
                                     F(ferry_store_opts, spill_dir),      F(ferry_store_opts, load),
                                     F(ferry_store_opts, pinned_reserve), {NULL, 0}};
static const field f_tensor_state[] = {F(ferry_tensor_state, size),
                                       F(ferry_tensor_state, name),
                                       F(ferry_tensor_state, nbytes),
                                       F(ferry_tensor_state, tier),
                                       F(ferry_tensor_state, dirty),
                                       F(ferry_tensor_state, holds),
                                       F(ferry_tensor_state, group),
                                       F(ferry_tensor_state, dptr),
                                       F(ferry_tensor_state, cached),
                                       F(ferry_tensor_state, streams),
                                       {NULL, 0}};
static const field f_plan_opts[] = {
    F(ferry_plan_opts, size),         F(ferry_plan_opts, blocks),  F(ferry_plan_opts, nblocks),
    F(ferry_plan_opts, window),       F(ferry_plan_opts, budget),  F(ferry_plan_opts, reserve),
    F(ferry_plan_opts, pinned_cache), F(ferry_plan_opts, dry_run), {NULL, 0}};
static const field f_plan[] = {F(ferry_plan, size),
                               F(ferry_plan, blocks),
                               F(ferry_plan, resident_blocks),
                               F(ferry_plan, streamed_blocks),
                               F(ferry_plan, fixed_bytes),
                               F(ferry_plan, resident_bytes),
                               F(ferry_plan, window_bytes),
                               F(ferry_plan, streamed_bytes),
                               F(ferry_plan, budget),
                               F(ferry_plan, window),
                               F(ferry_plan, minimum_bytes),
                               {NULL, 0}};
static const field f_store_stats[] = {F(ferry_store_stats, size),
                                      F(ferry_store_stats, tier_bytes),
                                      F(ferry_store_stats, device_budget),
                                      F(ferry_store_stats, pinned_budget),
                                      F(ferry_store_stats, host_budget),
                                      F(ferry_store_stats, host_available),
                                      F(ferry_store_stats, spilling),
                                      F(ferry_store_stats, spill_file_bytes),
                                      F(ferry_store_stats, bytes_htod),
                                      F(ferry_store_stats, bytes_dtoh),
                                      F(ferry_store_stats, seconds_htod),
                                      F(ferry_store_stats, seconds_dtoh),
                                      F(ferry_store_stats, bytes_written),
                                      F(ferry_store_stats, bytes_read),
                                      F(ferry_store_stats, evicted),
                                      F(ferry_store_stats, dropped),
                                      F(ferry_store_stats, models),
                                      F(ferry_store_stats, tensors),
                                      F(ferry_store_stats, device_cached),
                                      F(ferry_store_stats, pinned_pool_bytes),
                                      F(ferry_store_stats, pinned_cache_bytes),
                                      F(ferry_store_stats, device_allocs),
                                      F(ferry_store_stats, device_frees),
                                      F(ferry_store_stats, fence_waits),
                                      F(ferry_store_stats, fence_orders),
                                      F(ferry_store_stats, pinned_reserved),
                                      F(ferry_store_stats, pinned_reserve),
                                      {NULL, 0}};
static const field f_mem_range[] = {
    F(ferry_mem_range, start), F(ferry_mem_range, end), F(ferry_mem_range, peak), {NULL, 0}};
static const field f_job_stats[] = {F(ferry_job_stats, size),
                                    F(ferry_job_stats, seconds),
                                    F(ferry_job_stats, rss),
                                    F(ferry_job_stats, uss),
                                    F(ferry_job_stats, pss),
                                    F(ferry_job_stats, cgroup),
                                    F(ferry_job_stats, device_bytes),
                                    F(ferry_job_stats, pinned_bytes),
                                    F(ferry_job_stats, host_bytes),
                                    F(ferry_job_stats, spill_bytes),
                                    F(ferry_job_stats, bytes_htod),
                                    F(ferry_job_stats, bytes_dtoh),
                                    F(ferry_job_stats, bytes_written),
                                    F(ferry_job_stats, bytes_read),
                                    F(ferry_job_stats, seconds_htod),
                                    F(ferry_job_stats, seconds_dtoh),
                                    F(ferry_job_stats, evicted),
                                    F(ferry_job_stats, dropped),
                                    {NULL, 0}};

static const field f_streamer_opts[] = {F(ferry_streamer_opts, size),    F(ferry_streamer_opts, blocks),
                                        F(ferry_streamer_opts, nblocks), F(ferry_streamer_opts, prefetch),
                                        F(ferry_streamer_opts, budget),  F(ferry_streamer_opts, reserve),
                                        F(ferry_streamer_opts, copies),  F(ferry_streamer_opts, fixed),
                                        F(ferry_streamer_opts, nfixed),  {NULL, 0}};
static const field f_streamer_stats[] = {F(ferry_streamer_stats, size),
                                         F(ferry_streamer_stats, passes),
                                         F(ferry_streamer_stats, blocks),
                                         F(ferry_streamer_stats, resident_blocks),
                                         F(ferry_streamer_stats, streamed_blocks),
                                         F(ferry_streamer_stats, prefetch),
                                         F(ferry_streamer_stats, prefetch_asked),
                                         F(ferry_streamer_stats, budget),
                                         F(ferry_streamer_stats, budget_asked),
                                         F(ferry_streamer_stats, minimum_bytes),
                                         F(ferry_streamer_stats, fixed_bytes),
                                         F(ferry_streamer_stats, resident_bytes),
                                         F(ferry_streamer_stats, window_bytes),
                                         F(ferry_streamer_stats, streamed_bytes),
                                         F(ferry_streamer_stats, pinned_copies),
                                         F(ferry_streamer_stats, pass_htod),
                                         F(ferry_streamer_stats, pass_read),
                                         F(ferry_streamer_stats, pass_seconds),
                                         F(ferry_streamer_stats, shrinks),
                                         F(ferry_streamer_stats, grows),
                                         F(ferry_streamer_stats, retries),
                                         F(ferry_streamer_stats, prefetch_skipped),
                                         {NULL, 0}};

static const field f_convert_opts[] = {
    F(ferry_convert_opts, size), F(ferry_convert_opts, dtype), F(ferry_convert_opts, align), {NULL, 0}};

/* ferry_experimental.h's */
static const field f_store_keeper_stats[] = {F(ferry_store_keeper_stats, size),
                                             F(ferry_store_keeper_stats, used),
                                             F(ferry_store_keeper_stats, connected),
                                             F(ferry_store_keeper_stats, bytes_served),
                                             F(ferry_store_keeper_stats, bytes_fed),
                                             F(ferry_store_keeper_stats, hits),
                                             F(ferry_store_keeper_stats, misses),
                                             F(ferry_store_keeper_stats, stale),
                                             F(ferry_store_keeper_stats, refused),
                                             F(ferry_store_keeper_stats, errors),
                                             F(ferry_store_keeper_stats, connects),
                                             F(ferry_store_keeper_stats, last_error),
                                             {NULL, 0}};

static const struct {
    const char *name;
    size_t size;
    const field *fields;
} structs[] = {
    {"ferry_allocator", sizeof(ferry_allocator), f_allocator},
    {"ferry_ctx_opts", sizeof(ferry_ctx_opts), f_ctx_opts},
    {"ferry_tensor_info", sizeof(ferry_tensor_info), f_tensor_info},
    {"ferry_load_opts", sizeof(ferry_load_opts), f_load_opts},
    {"ferry_load_stats", sizeof(ferry_load_stats), f_load_stats},
    {"ferry_route_choice", sizeof(ferry_route_choice), f_route_choice},
    {"ferry_store_opts", sizeof(ferry_store_opts), f_store_opts},
    {"ferry_tensor_state", sizeof(ferry_tensor_state), f_tensor_state},
    {"ferry_store_stats", sizeof(ferry_store_stats), f_store_stats},
    {"ferry_plan_opts", sizeof(ferry_plan_opts), f_plan_opts},
    {"ferry_plan", sizeof(ferry_plan), f_plan},
    {"ferry_mem_range", sizeof(ferry_mem_range), f_mem_range},
    {"ferry_job_stats", sizeof(ferry_job_stats), f_job_stats},
    {"ferry_convert_opts", sizeof(ferry_convert_opts), f_convert_opts},
    {"ferry_streamer_opts", sizeof(ferry_streamer_opts), f_streamer_opts},
    {"ferry_streamer_stats", sizeof(ferry_streamer_stats), f_streamer_stats},
    {"ferry_store_keeper_stats", sizeof(ferry_store_keeper_stats), f_store_keeper_stats},
};

static int find_struct(const char *type)
{
    for (size_t i = 0; type && i < sizeof structs / sizeof structs[0]; i++)
        if (strcmp(structs[i].name, type) == 0) return (int)i;
    return -1;
}

FERRY_API int64_t ferry_abi_sizeof(const char *type)
{
    int i = find_struct(type);
    return i < 0 ? FERRY_E_NOTFOUND : (int64_t)structs[i].size;
}

FERRY_API int64_t ferry_abi_offsetof(const char *type, const char *field_name)
{
    int i = find_struct(type);
    if (i < 0 || !field_name) return FERRY_E_NOTFOUND;
    for (const field *f = structs[i].fields; f->name; f++)
        if (strcmp(f->name, field_name) == 0) return (int64_t)f->off;
    return FERRY_E_NOTFOUND;
}

FERRY_API const char *ferry_abi_field(const char *type, int k)
{
    int i = find_struct(type);
    if (i < 0 || k < 0) return NULL;
    for (const field *f = structs[i].fields; f->name; f++, k--)
        if (k == 0) return f->name;
    return NULL;
}

FERRY_API int ferry_abi_enum_count(const char *type)
{
    static const struct {
        const char *name;
        int count;
    } enums[] = {{"ferry_dtype", FERRY_DTYPE_COUNT},
                 {"ferry_route", FERRY_ROUTE_COUNT},
                 {"ferry_tier", FERRY_TIER_COUNT},
                 {"ferry_format", FERRY_FORMAT_PYTORCH + 1},
                 {"ferry_stream_copies", FERRY_STREAM_COPIES_RING + 1},
                 {"ferry_error", FERRY_E_BASE - FERRY_E_LAST + 1}};
    for (size_t i = 0; type && i < sizeof enums / sizeof enums[0]; i++)
        if (strcmp(enums[i].name, type) == 0) return enums[i].count;
    return FERRY_E_NOTFOUND;
}

FERRY_API const char *ferry_error_name(int code)
{
    static const char *const names[] = {"CORRUPT", "UNSUPPORTED", "FORMAT", "INVAL",    "NOTFOUND", "BUDGET",
                                        "NODEV",   "DEVICE",      "LIMIT",  "INTERNAL", "BUSY"};
    _Static_assert(sizeof names / sizeof names[0] == FERRY_E_BASE - FERRY_E_LAST + 1,
                   "a name per FERRY_E_* code");
    if (code > FERRY_E_BASE || code < FERRY_E_LAST) return NULL;
    return names[FERRY_E_BASE - code];
}
