/* io.c - system calls behind a fault-injection point. */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* Test machinery only: the production path costs one relaxed atomic load. */
static atomic_long fault_nth, fault_calls;
static atomic_int fault_err, fault_fired;

void fy_fault_arm(long nth, int err)
{
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_err, err);
    atomic_store(&fault_nth, nth);
}

long fy_fault_calls(void) { return atomic_load(&fault_calls); }
bool fy_fault_fired(void) { return atomic_load(&fault_fired) != 0; }

/* 0, or the -errno the current call must fail with. */
static int fault(void)
{
    if (atomic_load_explicit(&fault_nth, memory_order_relaxed) == 0) return 0;
    long c = atomic_fetch_add(&fault_calls, 1) + 1;
    if (c == atomic_load(&fault_nth)) {
        atomic_store(&fault_fired, 1);
        return -atomic_load(&fault_err);
    }
    return 0;
}

int fy_open_ro(const char *path, int *fd, uint64_t *size, fy_err *err)
{
    int rc = fault();
    if (rc) return fy_seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
     * below. It changes nothing for regular files. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        rc = -errno;
        return fy_seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
    struct stat st;
    if (fstat(f, &st) < 0) {
        rc = -errno;
        close(f);
        return fy_seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
    if (S_ISDIR(st.st_mode)) {
        close(f);
        return fy_seterr(err, -EISDIR, "%s: is a directory, not a checkpoint file", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return fy_seterr(err, FERRY_E_INVAL, "%s: not a regular file (ferry maps checkpoints; pipes and devices cannot be mapped)", path);
    }
    *fd = f;
    *size = (uint64_t)st.st_size;
    return 0;
}

int fy_close(int fd) { return fd >= 0 ? close(fd) : 0; }

int fy_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n) {
        int rc = fault();
        if (rc) return rc;
        ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return FERRY_E_CORRUPT;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

ssize_t fy_pread_some(int fd, void *buf, size_t n, uint64_t off)
{
    int rc = fault();
    if (rc) return rc;
    ssize_t r = pread(fd, buf, n, (off_t)off);
    return r < 0 ? -errno : r;
}

int fy_reopen_ro(int fd, const char *path)
{
    struct stat a, b;
    if (fstat(fd, &a) != 0) return -errno;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/thread-self/fd/%d", fd);
    int rc = -ENOENT;
    for (int i = 0; i < 2; i++) {
        const char *p = i == 0 ? proc : path;
        if (!p) continue;
        /* the path may name another file by now: never open that one (a
         * device or FIFO could react to being opened) */
        if (i == 1 && (stat(p, &b) != 0 || b.st_dev != a.st_dev || b.st_ino != a.st_ino)) {
            rc = -ESTALE;
            continue;
        }
        int f = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (f < 0) {
            rc = -errno;
            continue;
        }
        if (fstat(f, &b) != 0) {
            rc = -errno;
        } else if (b.st_dev == a.st_dev && b.st_ino == a.st_ino) {
            return f;
        } else {
            rc = -ESTALE; /* replaced between the stat and the open */
        }
        close(f);
    }
    return rc;
}

int fy_map_ro(int fd, uint64_t size, void **out)
{
    int rc = fault();
    if (rc) return rc;
    if (size == 0) { *out = NULL; return 0; }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
}

void fy_unmap(void *p, uint64_t size)
{
    if (p && size) munmap(p, (size_t)size);
}

int fy_map_private(int fd, uint64_t size, void **out)
{
    int rc = fault();
    if (rc) return rc;
    if (size == 0) { *out = NULL; return 0; }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
}

int fy_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
    const char *p = buf;
    while (n) {
        int rc = fault();
        if (rc) return rc;
        ssize_t r = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int fy_fallocate(int fd, int mode, uint64_t off, uint64_t len)
{
    int rc = fault();
    if (rc) return rc;
    return fallocate(fd, mode, (off_t)off, (off_t)len) < 0 ? -errno : 0;
}

int fy_ftruncate(int fd, uint64_t len)
{
    int rc = fault();
    if (rc) return rc;
    return ftruncate(fd, (off_t)len) < 0 ? -errno : 0;
}

int fy_fs_info(int fd, uint64_t *free_bytes, long *fs_type)
{
    int rc = fault();
    if (rc) return rc;
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0) return -errno;
    if (free_bytes) *free_bytes = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
    if (fs_type) *fs_type = (long)sf.f_type;
    return 0;
}

int fy_open_tmpfile(const char *dir, int *fd)
{
    int rc = fault();
    if (rc) return rc;
    int f = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (f < 0) return -errno;
    *fd = f;
    return 0;
}
