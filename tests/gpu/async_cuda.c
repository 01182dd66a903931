/* SPDX-License-Identifier: Apache-2.0 */
/* async_cuda.c - queued moves on a real GPU: a dirty model sent to pinned RAM,
 * brought back with ferry_model_to_device_async, a CUDA stream of the
 * caller's ordered after the move with ferry_op_stream_wait (no host wait),
 * and that stream's own copy back compared with the file, before anyone
 * waited on the op; then ferry_model_release_after on that stream.
 *   async_cuda CHECKPOINT [cuda:N]     exit 77 when there is no CUDA driver
 * (The CUDA driver is reached with dlopen, as libferry does.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

typedef int (*stream_create_fn)(void **s, unsigned flags);
typedef int (*stream_sync_fn)(void *s);
typedef int (*stream_destroy_fn)(void *s);
typedef int (*dtoh_async_fn)(void *dst, unsigned long long src, size_t n, void *s);
typedef int (*host_alloc_fn)(void **p, size_t n, unsigned flags);
typedef int (*host_free_fn)(void *p);

static int fails;
#define EXPECT(c)                                                           \
    do {                                                                    \
        if (!(c)) {                                                         \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #c); \
            fails++;                                                        \
        }                                                                   \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: async_cuda CHECKPOINT [cuda:N]\n");
        return 2;
    }
    const char *spec = argc > 2 ? argv[2] : "cuda:0";
    ferry_ctx *ctx = NULL;
    ferry_device *d = NULL;
    ferry_file *f = NULL;
    if (ferry_ctx_new(NULL, &ctx) < 0) return 1;
    if (ferry_device_open(ctx, spec, &d) < 0) {
        fprintf(stderr, "async_cuda: %s: %s (skipped)\n", spec, ferry_ctx_errmsg(ctx));
        ferry_ctx_free(ctx);
        return 77;
    }
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    stream_create_fn s_create = cu ? (stream_create_fn)dlsym(cu, "cuStreamCreate") : NULL;
    stream_sync_fn s_sync = cu ? (stream_sync_fn)dlsym(cu, "cuStreamSynchronize") : NULL;
    stream_destroy_fn s_destroy = cu ? (stream_destroy_fn)dlsym(cu, "cuStreamDestroy_v2") : NULL;
    dtoh_async_fn dtoh = cu ? (dtoh_async_fn)dlsym(cu, "cuMemcpyDtoHAsync_v2") : NULL;
    host_alloc_fn h_alloc = cu ? (host_alloc_fn)dlsym(cu, "cuMemHostAlloc") : NULL;
    host_free_fn h_free = cu ? (host_free_fn)dlsym(cu, "cuMemFreeHost") : NULL;
    if (!s_create || !s_sync || !s_destroy || !dtoh || !h_alloc || !h_free) {
        fprintf(stderr, "async_cuda: the driver lacks a call this check needs\n");
        return 1;
    }
    if (ferry_file_open(ctx, argv[1], 0, &f) < 0) {
        fprintf(stderr, "async_cuda: %s\n", ferry_ctx_errmsg(ctx));
        return 1;
    }
    uint64_t total = ferry_file_total_bytes(f);
    ferry_store_opts o = {.size = sizeof o,
                          .device_budget = 2 * total + (1 << 20),
                          .host_budget = 2 * total + (1 << 30),
                          .pinned_budget = total + (1 << 30),
                          .spill_below = 1,
                          .spill_above = 2};
    ferry_store *s = NULL;
    ferry_model *m = NULL;
    EXPECT(ferry_store_new(d, &o, &s) == 0);
    EXPECT(s && ferry_store_add(s, "m", &f, 1, 0, &m) == 0);
    if (!m) return 1;
    /* the ferry calls run in the device's primary context (made current by
     * libferry on this thread); the stream below is created in it too */
    EXPECT(ferry_model_to_device(m, NULL, 0) == 0);
    int64_t n = ferry_model_tensor_count(m);
    for (int64_t i = 0; i < n; i++) EXPECT(ferry_model_mark_dirty(m, i) == 0);
    EXPECT(ferry_model_evict(m, NULL, 0) == 0); /* dirty: into the pinned pool */
    ferry_store_stats st = {.size = sizeof st};
    EXPECT(ferry_store_get_stats(s, &st) == 0 && st.tier_bytes[FERRY_TIER_PINNED] == total);

    void *theirs = NULL;
    EXPECT(s_create(&theirs, 1 /* CU_STREAM_NON_BLOCKING */) == 0);
    unsigned char *back = NULL;
    EXPECT(h_alloc((void **)&back, (size_t)total, 0) == 0);
    ferry_op *op = NULL;
    EXPECT(ferry_model_to_device_async(m, NULL, 0, &op) == 0);
    if (!op || !theirs || !back) return 1;
    int q0 = ferry_op_query(op);
    EXPECT(ferry_op_stream_wait(op, (uint64_t)(uintptr_t)theirs) == 0);
    /* their stream copies every tensor back, ordered after the move only */
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        ferry_tensor_state ts = {.size = sizeof ts};
        EXPECT(ferry_model_tensor_state(m, i, &ts) == 0 && (ts.nbytes == 0 || ts.dptr != 0));
        if (ts.nbytes) EXPECT(dtoh(back + off, ts.dptr, (size_t)ts.nbytes, theirs) == 0);
        off += ts.nbytes;
    }
    EXPECT(s_sync(theirs) == 0);
    /* compare with the file */
    off = 0;
    int64_t bad = 0;
    unsigned char *want = malloc(1 << 20);
    for (int64_t i = 0; i < n && want; i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        for (uint64_t done = 0; done < ti.nbytes;) {
            size_t len = ti.nbytes - done < (1u << 20) ? (size_t)(ti.nbytes - done) : (1u << 20);
            if (ferry_file_tensor_read(f, i, done, want, len) < 0 ||
                memcmp(want, back + off + done, len) != 0) {
                bad++;
                break;
            }
            done += len;
        }
        off += ti.nbytes;
    }
    free(want);
    EXPECT(bad == 0);
    EXPECT(ferry_op_wait(op) == 0);
    EXPECT(ferry_store_get_stats(s, &st) == 0 && st.tier_bytes[FERRY_TIER_DEVICE] == total);

    /* release after their stream: held until it has run that far */
    EXPECT(ferry_model_hold(m, -1) == 0);
    off = 0;
    for (int64_t i = 0; i < n; i++) { /* some work on their stream that reads the tensors */
        ferry_tensor_state ts = {.size = sizeof ts};
        ferry_model_tensor_state(m, i, &ts);
        if (ts.nbytes) EXPECT(dtoh(back + off, ts.dptr, (size_t)ts.nbytes, theirs) == 0);
        off += ts.nbytes;
    }
    EXPECT(ferry_model_release_after(m, -1, (uint64_t)(uintptr_t)theirs) == 0);
    int64_t freed = ferry_store_make_room(s, UINT64_MAX, NULL); /* waits for their stream, then evicts */
    EXPECT(freed == (int64_t)total);
    ferry_tensor_state ts = {.size = sizeof ts};
    EXPECT(ferry_model_tensor_state(m, 0, &ts) == 0 && ts.holds == 0 && ts.tier != FERRY_TIER_DEVICE);
    printf(
        "async_cuda: %s, %lld tensors, %.2f GB: queued move (query right after queueing: %d), their stream "
        "ordered after it read back %s; release_after then make_room(all) freed %lld bytes; %s\n",
        ferry_device_desc(d), (long long)n, (double)total / 1e9, q0, bad ? "WRONG bytes" : "the file's bytes",
        (long long)freed, fails ? "FAILED" : "ok");
    s_destroy(theirs);
    h_free(back);
    ferry_store_free(s);
    ferry_file_close(f);
    ferry_device_close(d);
    ferry_ctx_free(ctx);
    return fails ? 1 : 0;
}
