/* SPDX-License-Identifier: Apache-2.0 */
/* identity.c - a shard of an open ferry_file as the keeper identifies it: the
 * absolute path that names it now, the size and mtime of the file this
 * ferry_file reads (its descriptor, not whatever the path names), and the
 * digest of its head, the same digest ferry_keep_file_identity computes from
 * a path. Taking the figures from the descriptor is what keeps a checkpoint
 * replaced under an open ferry_file (a rename over it) from being fed to the
 * keeper under the new file's identity. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "ferry_experimental.h"
#include "io/io.h"

#include "file_impl.h"

FERRY_API int ferry_file_keep_identity(const ferry_file *f, int i, char *path, size_t n, uint64_t *file_size,
                                       int64_t *mtime_ns, uint64_t *header_digest)
{
    if (!f || i < 0 || i >= f->nshards || !file_size || !mtime_ns || (path && n == 0)) return FERRY_E_INVAL;
    const shard *sh = &f->shards[i];
    if (sh->fd < 0) return -EBADF;
    if (path) {
        int rc = fy_fd_path(sh->fd, path, n);
        if (rc == -ENOENT && sh->path && sh->path[0] == '/') { /* no /proc: the path as opened */
            if (strlen(sh->path) >= n) return -ENAMETOOLONG;
            snprintf(path, n, "%s", sh->path);
            rc = 0;
        }
        if (rc < 0) return rc;
    }
    uint64_t size = 0;
    int64_t mtime = 0;
    FY_TRY(fy_file_ident(sh->fd, path, &size, &mtime)); /* -ESTALE: path names another file now */
    if (header_digest) {
        int rc = fy_head_digest(sh->fd, size, header_digest);
        if (rc < 0) return rc == FERRY_E_CORRUPT ? -ESTALE : rc; /* cut short since the fstat */
    }
    *file_size = size;
    *mtime_ns = mtime;
    return 0;
}
