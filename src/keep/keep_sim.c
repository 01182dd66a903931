/* SPDX-License-Identifier: Apache-2.0 */
/* keep_sim.c - the keeper's sim backend (memfd memory) and the choice of
 * backend by device string. */
#define _GNU_SOURCE
#include "keep_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ferry.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static int sim_alloc(uint64_t nbytes, const char *label, int *fd, char *err, size_t n)
{
    *fd = -1;
    if (nbytes > (uint64_t)INT64_MAX) {
        snprintf(err, n, "%llu bytes is too large", (unsigned long long)nbytes);
        return -EFBIG;
    }
    int f = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0) {
        int e = errno;
        snprintf(err, n, "memfd_create: %s", strerror(e));
        return -e;
    }
    if (ftruncate(f, (off_t)nbytes) != 0) {
        int e = errno;
        snprintf(err, n, "ftruncate of a memfd to %llu bytes: %s", (unsigned long long)nbytes, strerror(e));
        close(f);
        return -e;
    }
    /* The keeper allocates the pages itself: they are charged to its own
     * memory cgroup, not to the client that writes them, and memory that is
     * short fails here (-ENOSPC or -ENOMEM to the client's put) instead of
     * faulting in the client's writes. */
    if (nbytes && fallocate(f, 0, 0, (off_t)nbytes) != 0) {
        int e = errno;
        snprintf(err, n, "allocating %llu bytes of memfd memory: %s", (unsigned long long)nbytes,
                 strerror(e));
        close(f);
        return e == ENOMEM ? -ENOSPC : -e;
    }
    /* no client can shrink it under another's mapping (SIGBUS there) */
    if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        int e = errno;
        snprintf(err, n, "sealing a memfd: %s", strerror(e));
        close(f);
        return -e;
    }
    *fd = f;
    return 0;
}

static int sim_commit(int fd)
{
    /* new writes and writable mappings are refused from now on; the writer's
     * existing mapping stays (F_SEAL_FUTURE_WRITE: Linux 5.1 and later) */
    return fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0 ? 0 : -errno;
}

static void sim_release(int fd)
{
    if (fd >= 0) close(fd);
}

static const fk_backend sim_backend = {"sim", sim_alloc, sim_commit, sim_release};

int fk_backend_for(const char *device, const fk_backend **out, uint64_t *size, char *err, size_t n)
{
    *out = NULL;
    *size = 0;
    if (!device || strcmp(device, "sim") == 0) {
        *out = &sim_backend;
        return 0;
    }
    if (strncmp(device, "sim:", 4) == 0) {
        if (ferry_parse_size(device + 4, size) != 0 || *size == 0) {
            snprintf(err, n, "device %s: SIZE must be a size above 0 (sim:64GiB)", device);
            return -EINVAL;
        }
        *out = &sim_backend;
        return 0;
    }
    if (strncmp(device, "cuda", 4) == 0) {
        snprintf(err, n, "device %s: the CUDA backend is not built yet; use sim:SIZE", device);
        return -ENOTSUP;
    }
    snprintf(err, n, "device %s: not a device the keeper knows (sim, sim:SIZE)", device);
    return -EINVAL;
}
