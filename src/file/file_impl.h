/* SPDX-License-Identifier: Apache-2.0 */
/* file_impl.h - the inside of ferry_file, shared with xfer/ (which reads the
 * shards' descriptors and mappings). */
#ifndef FERRY_FILE_IMPL_H
#define FERRY_FILE_IMPL_H

#include <pthread.h>

#include "common/common.h"
#include "format/format.h"

/* Someone above file/ that keeps state keyed by this file (a device's
 * registrations of its mappings): told, before the mappings go, that the file
 * is closing. file/ may not call xfer/ (the layer rules), so xfer/ hands its
 * callback in. */
typedef struct fy_file_watch {
    void (*closing)(void *owner, const ferry_file *f);
    void *owner;
} fy_file_watch;

typedef struct shard {
    char *path;
    int fd;
    uint64_t size;
    void *map;
} shard;

struct ferry_file {
    ferry_ctx *ctx;
    /* this file's messages (also its context's); calls that take a const
     * ferry_file still record their failures here, so it is mutable */
    fy_err err;
    ferry_format fmt;
    int32_t nshards;
    shard *shards;
    fy_table tb;
    int64_t *by_name; /* tensor indices sorted by name */
    uint64_t total;
    bool private_map;           /* FERRY_OPEN_PRIVATE: copy-on-write mappings, never registered */
    pthread_mutex_t watch_lock; /* guards watch (devices on other threads add and drop theirs) */
    fy_file_watch *watch;
    int nwatch, cap_watch;
};

/* Call closing(owner, f) when f is closed, before its mappings are unmapped
 * (once, even if added twice). The call runs with no lock of f held, so it may
 * take its own. Returns 1 when added, 0 when it was there already, or -ENOMEM. f is not const to the watch list; the
 * const is the caller's view of the file's contents. */
int fy_file_watch_add(const ferry_file *f, void (*closing)(void *, const ferry_file *), void *owner);
/* Forget that watch (nothing if it is not there). */
void fy_file_watch_drop(const ferry_file *f, void (*closing)(void *, const ferry_file *), void *owner);

#endif
