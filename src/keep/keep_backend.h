/* SPDX-License-Identifier: Apache-2.0 */
/* keep_backend.h - where the keeper's memory comes from: a region of N bytes
 * that another process can map through a file descriptor.
 *
 * sim: memfd_create memory (host RAM, charged to the keeper's cgroup), sealed
 * against shrinking and growing at once and against new writes on commit.
 * cuda: not built yet (cuMemCreate with a HOST_NUMA location and POSIX fd
 * handles for host memory, device memory likewise, will fill this table). */
#ifndef FERRY_KEEP_BACKEND_H
#define FERRY_KEEP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct fk_backend {
    const char *name; /* "sim" */
    /* A region of nbytes: its fd (the keeper's, close with release), or -errno
     * with the reason in err. */
    int (*alloc)(uint64_t nbytes, const char *label, int *fd, char *err, size_t n);
    /* The writer committed: no new writes (best effort: 0 or -errno, ignored). */
    int (*commit)(int fd);
    void (*release)(int fd);
} fk_backend;

/* The backend for a device string and its size ("sim" -> 0, "sim:SIZE" ->
 * SIZE): 0, or -EINVAL / -ENOTSUP with the reason in err. */
int fk_backend_for(const char *device, const fk_backend **out, uint64_t *size, char *err, size_t n);

#endif
