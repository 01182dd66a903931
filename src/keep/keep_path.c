/* SPDX-License-Identifier: Apache-2.0 */
/* keep_path.c - where the keeper's socket lives and who may use it, and a
 * checkpoint file's identity as the keeper compares it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry_experimental.h"
#include "keep.h"
#include "common/common.h"
#include "io/io.h"

bool fk_peer_allowed(uid_t peer, uid_t self)
{
    return peer == self;
}

int ferry_keep_default_socket(char *buf, size_t n)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int w;
    if (xdg && xdg[0] == '/') w = snprintf(buf, n, "%s/ferry/keep.sock", xdg);
    else w = snprintf(buf, n, "/tmp/ferry-keep-%u/keep.sock", (unsigned)getuid());
    if (w < 0 || (size_t)w >= n || w > FK_SUN_MAX) {
        if (n) buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    return 0;
}

int fk_private_dir(const char *socket_path, bool create, uid_t self, char *err, size_t n)
{
    char dir[4096];
    const char *slash = strrchr(socket_path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == socket_path) snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - socket_path) >= sizeof dir) {
        snprintf(err, n, "%s: path too long", socket_path);
        return -ENAMETOOLONG;
    } else snprintf(dir, sizeof dir, "%.*s", (int)(slash - socket_path), socket_path);
    struct stat st;
    if (lstat(dir, &st) != 0) {
        int e = errno;
        if (e != ENOENT || !create) {
            snprintf(err, n, "socket directory %s: %s", dir, strerror(e));
            return -e;
        }
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            e = errno;
            snprintf(err, n, "cannot make the socket directory %s: %s", dir, strerror(e));
            return -e;
        }
        if (lstat(dir, &st) != 0) {
            e = errno;
            snprintf(err, n, "socket directory %s: %s", dir, strerror(e));
            return -e;
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, n, "socket directory %s is not a directory (a symlink is refused)", dir);
        return -ENOTDIR;
    }
    if (st.st_uid != self) {
        snprintf(err, n, "socket directory %s belongs to uid %u, not to this user (uid %u): refused", dir,
                 (unsigned)st.st_uid, (unsigned)self);
        return -EPERM;
    }
    if (st.st_mode & 077) {
        snprintf(err, n, "socket directory %s has mode %04o: it must be private (chmod 700 %s)", dir,
                 (unsigned)(st.st_mode & 07777), dir);
        return -EPERM;
    }
    return 0;
}

int fk_sock_addr(const char *path, struct sockaddr_un *a, int *dirfd, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    *dirfd = -1;
    size_t len = strlen(path);
    if (len == 0) {
        snprintf(err, n, "an empty socket path");
        return -EINVAL;
    }
    if (len > FK_SOCK_PATH_MAX) {
        snprintf(err, n, "%.200s...: a socket path is at most %d bytes", path, FK_SOCK_PATH_MAX);
        return -ENAMETOOLONG;
    }
    if (len <= FK_SUN_MAX) {
        memcpy(a->sun_path, path, len + 1);
        return 0;
    }
    /* too long for sun_path: through a descriptor of its directory, named by
     * the /proc/self/fd link (bind and connect resolve it as a path; fchdir
     * would move every thread's working directory) */
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!*name) {
        snprintf(err, n, "%s: names a directory, not a socket", path);
        return -EINVAL;
    }
    char dir[FK_SOCK_PATH_MAX + 1];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, n, "socket directory %s: %s", dir, strerror(e));
        return -e;
    }
    int w = snprintf(a->sun_path, sizeof a->sun_path, "/proc/self/fd/%d/%s", fd, name);
    if (w < 0 || w > FK_SUN_MAX) {
        int room = FK_SUN_MAX - snprintf(NULL, 0, "/proc/self/fd/%d/", fd);
        snprintf(
            err, n,
            "%s: too long for a Unix socket address (at most %d bytes); reached through its "
            "directory as /proc/self/fd/%d/NAME, its name may have %d bytes, not %zu: use a shorter name",
            path, FK_SUN_MAX, fd, room, strlen(name));
        close(fd);
        memset(a->sun_path, 0, sizeof a->sun_path);
        return -ENAMETOOLONG;
    }
    *dirfd = fd;
    return 0;
}

int ferry_keep_file_identity(const char *path, uint64_t *file_size, int64_t *mtime_ns,
                             uint64_t *header_digest)
{
    /* through io/ (fault points, and a FIFO refused rather than waited on);
     * ferry's own codes become the errno this call promises */
    fy_err e;
    fy_err_init(&e);
    int fd = -1;
    uint64_t size = 0;
    int rc = fy_open_ro(path, &fd, &size, &e);
    fy_err_destroy(&e);
    if (rc < 0) return rc <= FERRY_E_CORRUPT ? -EINVAL : rc;
    int64_t mtime = 0;
    uint64_t digest = 0;
    rc = fy_file_ident(fd, NULL, &size, &mtime);
    if (rc == 0) rc = fy_head_digest(fd, size, &digest);
    fy_close(fd);
    if (rc < 0) return rc <= FERRY_E_CORRUPT ? -EIO : rc; /* (the file shrank while it was read) */
    *file_size = size;
    *mtime_ns = mtime;
    *header_digest = digest;
    return 0;
}
