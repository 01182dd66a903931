/* SPDX-License-Identifier: Apache-2.0 */
/* io.c - the system-call table, its counted fault injection, and the calls
 * built on them. Nothing here calls the C library's system calls directly:
 * every one goes through sys[] below. */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- the table ------------------------------------------------------------ */

enum {
    S_OPEN,
    S_CLOSE,
    S_READ,
    S_WRITE,
    S_PREAD,
    S_PWRITE,
    S_STAT,
    S_FSTAT,
    S_FSTATFS,
    S_FALLOCATE,
    S_FTRUNCATE,
    S_FCHMOD,
    S_FSYNC,
    S_MMAP,
    S_MUNMAP,
    S_MINCORE,
    S_MKOSTEMP,
    S_RENAME,
    S_UNLINK,
    S_READLINK,
    S_COUNT
};

/* open(2) is variadic; the table's entry takes its mode always. */
static int real_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}

static struct sys_entry {
    const char *name;
    fy_sys_fn real;
    _Atomic(fy_sys_fn) now; /* NULL: the real call */
} sys[S_COUNT] = {
    [S_OPEN] = {.name = "open", .real = (fy_sys_fn)real_open},
    [S_CLOSE] = {.name = "close", .real = (fy_sys_fn)close},
    [S_READ] = {.name = "read", .real = (fy_sys_fn)read},
    [S_WRITE] = {.name = "write", .real = (fy_sys_fn)write},
    [S_PREAD] = {.name = "pread", .real = (fy_sys_fn)pread},
    [S_PWRITE] = {.name = "pwrite", .real = (fy_sys_fn)pwrite},
    [S_STAT] = {.name = "stat", .real = (fy_sys_fn)stat},
    [S_FSTAT] = {.name = "fstat", .real = (fy_sys_fn)fstat},
    [S_FSTATFS] = {.name = "fstatfs", .real = (fy_sys_fn)fstatfs},
    [S_FALLOCATE] = {.name = "fallocate", .real = (fy_sys_fn)fallocate},
    [S_FTRUNCATE] = {.name = "ftruncate", .real = (fy_sys_fn)ftruncate},
    [S_FCHMOD] = {.name = "fchmod", .real = (fy_sys_fn)fchmod},
    [S_FSYNC] = {.name = "fsync", .real = (fy_sys_fn)fsync},
    [S_MMAP] = {.name = "mmap", .real = (fy_sys_fn)mmap},
    [S_MUNMAP] = {.name = "munmap", .real = (fy_sys_fn)munmap},
    [S_MINCORE] = {.name = "mincore", .real = (fy_sys_fn)mincore},
    [S_MKOSTEMP] = {.name = "mkostemp", .real = (fy_sys_fn)mkostemp},
    [S_RENAME] = {.name = "rename", .real = (fy_sys_fn)rename},
    [S_UNLINK] = {.name = "unlink", .real = (fy_sys_fn)unlink},
    [S_READLINK] = {.name = "readlink", .real = (fy_sys_fn)readlink},
};

static fy_sys_fn sys_fn(int i)
{
    fy_sys_fn f = atomic_load_explicit(&sys[i].now, memory_order_acquire);
    return f ? f : sys[i].real;
}

/* Each entry called with its own type (io.h lists them). */
#define SYS(i, type) ((type *)sys_fn(i))
typedef int open_fn(const char *, int, mode_t);
typedef int fd_fn(int);
typedef ssize_t read_fn(int, void *, size_t);
typedef ssize_t write_fn(int, const void *, size_t);
typedef ssize_t pread_fn(int, void *, size_t, off_t);
typedef ssize_t pwrite_fn(int, const void *, size_t, off_t);
typedef int stat_fn(const char *, struct stat *);
typedef int fstat_fn(int, struct stat *);
typedef int fstatfs_fn(int, struct statfs *);
typedef int fallocate_fn(int, int, off_t, off_t);
typedef int ftruncate_fn(int, off_t);
typedef int fchmod_fn(int, mode_t);
typedef void *mmap_fn(void *, size_t, int, int, int, off_t);
typedef int munmap_fn(void *, size_t);
typedef int mincore_fn(void *, size_t, unsigned char *);
typedef int mkostemp_fn(char *, int);
typedef int rename_fn(const char *, const char *);
typedef int path_fn(const char *);
typedef ssize_t readlink_fn(const char *, char *, size_t);

static int find(const char *name)
{
    for (int i = 0; name && i < S_COUNT; i++)
        if (strcmp(sys[i].name, name) == 0) return i;
    return -1;
}

int fy_sys_set(const char *name, fy_sys_fn fn)
{
    int i = find(name);
    if (i < 0) return -ENOENT;
    atomic_store_explicit(&sys[i].now, fn, memory_order_release);
    return 0;
}

fy_sys_fn fy_sys_get(const char *name)
{
    int i = find(name);
    return i < 0 ? NULL : sys_fn(i);
}

void fy_sys_reset(void)
{
    for (int i = 0; i < S_COUNT; i++) atomic_store_explicit(&sys[i].now, NULL, memory_order_release);
}

/* ---- counted faults ------------------------------------------------------- */

/* Test machinery only: the production path costs one relaxed atomic load. */
static atomic_long fault_nth, fault_calls;
static atomic_int fault_err, fault_fired;

void fy_fault_arm(long nth, int err)
{
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_fired, 0);
    /* an errno either way round (a -EIO would make the call "succeed" with 5) */
    atomic_store(&fault_err, err < 0 ? -err : err ? err : EIO);
    atomic_store(&fault_nth, nth);
}

bool fy_fault_fired(void)
{
    return atomic_load(&fault_fired) != 0;
}

/* 0, or the -errno the current counted call must fail with. */
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

/* ---- the calls, as -errno ------------------------------------------------- */

/* 0 or -errno from a call that returns -1 and sets errno. */
static int rc_of(int r)
{
    return r < 0 ? -errno : 0;
}

static int x_open(const char *path, int flags, mode_t mode)
{
    int fd;
    do fd = SYS(S_OPEN, open_fn)(path, flags, mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

static int x_fstat(int fd, struct stat *st)
{
    return rc_of(SYS(S_FSTAT, fstat_fn)(fd, st));
}

/* ---- reading checkpoints -------------------------------------------------- */

int fy_open_ro(const char *path, int *fd, uint64_t *size, fy_err *err)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
     * below. It changes nothing for regular files. */
    int f = fault();
    if (f == 0) f = x_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (f < 0) return fy_seterr(err, f, "%s: %s", path, ferry_strerror(f));
    struct stat st;
    int rc = fault();
    if (rc == 0) rc = x_fstat(f, &st);
    if (rc < 0) {
        fy_close(f);
        return fy_seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
    if (S_ISDIR(st.st_mode)) {
        fy_close(f);
        return fy_seterr(err, -EISDIR, "%s: is a directory, not a checkpoint file", path);
    }
    if (!S_ISREG(st.st_mode)) {
        fy_close(f);
        return fy_seterr(
            err, FERRY_E_INVAL,
            "%s: not a regular file (ferry maps checkpoints; pipes and devices cannot be mapped)", path);
    }
    *fd = f;
    *size = (uint64_t)st.st_size;
    return 0;
}

int fy_open_direct(const char *path, int *fd)
{
    int f = fault();
    if (f == 0) f = x_open(path, O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
    if (f < 0) return f;
    *fd = f;
    return 0;
}

int fy_close(int fd)
{
    return fd >= 0 ? rc_of(SYS(S_CLOSE, fd_fn)(fd)) : 0;
}

int fy_fstat_size(int fd, uint64_t *size)
{
    struct stat st;
    int rc = x_fstat(fd, &st);
    if (rc == 0) *size = (uint64_t)st.st_size;
    return rc;
}

int fy_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n) {
        int rc = fault();
        if (rc) return rc;
        ssize_t r = SYS(S_PREAD, pread_fn)(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
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
    ssize_t r = SYS(S_PREAD, pread_fn)(fd, buf, n, (off_t)off);
    return r < 0 ? -errno : r;
}

int fy_reopen_ro(int fd, const char *path)
{
    struct stat a, b;
    int rc = x_fstat(fd, &a);
    if (rc < 0) return rc;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/thread-self/fd/%d", fd);
    rc = -ENOENT;
    for (int i = 0; i < 2; i++) {
        const char *p = i == 0 ? proc : path;
        if (!p) continue;
        /* the path may name another file by now: never open that one (a
         * device or FIFO could react to being opened) */
        if (i == 1 && (SYS(S_STAT, stat_fn)(p, &b) != 0 || b.st_dev != a.st_dev || b.st_ino != a.st_ino)) {
            rc = -ESTALE;
            continue;
        }
        int f = x_open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
        if (f < 0) {
            rc = f;
            continue;
        }
        if ((rc = x_fstat(f, &b)) < 0) {
            /* rc says why */
        } else if (b.st_dev == a.st_dev && b.st_ino == a.st_ino) {
            return f;
        } else {
            rc = -ESTALE; /* replaced between the stat and the open */
        }
        fy_close(f);
    }
    return rc;
}

int fy_fd_path(int fd, char *buf, size_t n)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/thread-self/fd/%d", fd);
    if (n < 2) return -ENAMETOOLONG;
    ssize_t r = SYS(S_READLINK, readlink_fn)(proc, buf, n);
    if (r < 0) return -errno;
    if ((size_t)r >= n) return -ENAMETOOLONG;
    buf[r] = '\0';
    if (buf[0] != '/') return -ENOENT; /* an anonymous file ("memfd:...", "pipe:[...]") has no path */
    return (int)r;
}

int fy_file_ident(int fd, const char *path, uint64_t *size, int64_t *mtime_ns)
{
    struct stat a, b;
    int rc = fault();
    if (rc == 0) rc = x_fstat(fd, &a);
    if (rc < 0) return rc;
    if (path && (SYS(S_STAT, stat_fn)(path, &b) != 0 || b.st_dev != a.st_dev || b.st_ino != a.st_ino))
        return -ESTALE;
    *size = (uint64_t)a.st_size;
    *mtime_ns = (int64_t)a.st_mtim.tv_sec * 1000000000 + a.st_mtim.tv_nsec;
    return 0;
}

int fy_head_digest(int fd, uint64_t size, uint64_t *digest)
{
    uint8_t buf[32 << 10];
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint64_t want = size < FY_HEAD_BYTES ? size : FY_HEAD_BYTES;
    for (uint64_t off = 0; off < want;) {
        size_t n = want - off < sizeof buf ? (size_t)(want - off) : sizeof buf;
        FY_TRY(fy_pread_full(fd, buf, n, off));
        XXH3_64bits_update(&st, buf, n);
        off += n;
    }
    *digest = XXH3_64bits_digest(&st);
    return 0;
}

/* ---- mappings ------------------------------------------------------------- */

static int map(int fd, uint64_t size, int prot, int flags, void **out)
{
    if (size == 0) {
        *out = NULL;
        return 0;
    }
    int rc = fault();
    if (rc) return rc;
    void *p = SYS(S_MMAP, mmap_fn)(NULL, (size_t)size, prot, flags, fd, 0);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
}

int fy_map_ro(int fd, uint64_t size, void **out)
{
    return map(fd, size, PROT_READ, MAP_SHARED, out);
}

int fy_map_at(int fd, uint64_t off, uint64_t len, bool writable, void **out)
{
    *out = NULL;
    if (len == 0) return 0;
    if (off > (uint64_t)INT64_MAX || len > SIZE_MAX) return -EINVAL;
    int rc = fault();
    if (rc) return rc;
    void *p = SYS(S_MMAP, mmap_fn)(NULL, (size_t)len, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                                   MAP_SHARED, fd, (off_t)off);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
}

int fy_map_private(int fd, uint64_t size, void **out)
{
    return map(fd, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, out);
}

void fy_unmap(void *p, uint64_t size)
{
    if (p && size) (void)SYS(S_MUNMAP, munmap_fn)(p, (size_t)size);
}

/* munmap(2) of a faulted-in mapping zaps its page tables holding the
 * process's mmap lock (taken for writing, then for reading): about 0.6 s for
 * 10 GB on the H200, and every mmap, cuMemHostAlloc or cudaMalloc of another
 * thread waits behind it. madvise(MADV_DONTNEED) zaps the same pages taking
 * the lock for reading, so in pieces of 64 MiB (some 4 ms each) a writer gets
 * in between them; the munmap of the emptied range is then short. The
 * advice is only that: where it fails, the munmap does all the work. */
void fy_unmap_gently(void *p, uint64_t size)
{
    if (!p || !size) return;
    const uint64_t piece = 64ull << 20;
    for (uint64_t off = 0; off < size; off += piece) {
        uint64_t n = size - off < piece ? size - off : piece;
        if (madvise((uint8_t *)p + off, (size_t)n, MADV_DONTNEED) != 0) break;
    }
    (void)SYS(S_MUNMAP, munmap_fn)(p, (size_t)size);
}

int fy_mincore(void *addr, size_t len, unsigned char *vec)
{
    return rc_of(SYS(S_MINCORE, mincore_fn)(addr, len, vec));
}

/* ---- writing -------------------------------------------------------------- */

/* Write all n bytes, at off (pwrite) or, with off NULL, at the file offset
 * (write): each piece a fault point, at most 1 GiB a call, EINTR retried. */
static int write_all(int fd, const void *buf, size_t n, const uint64_t *off)
{
    const char *p = buf;
    uint64_t at = off ? *off : 0;
    while (n) {
        int rc = fault();
        if (rc) return rc;
        size_t len = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r =
            off ? SYS(S_PWRITE, pwrite_fn)(fd, p, len, (off_t)at) : SYS(S_WRITE, write_fn)(fd, p, len);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO;
        p += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

int fy_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
    return write_all(fd, buf, n, &off);
}

int fy_write_full(int fd, const void *buf, size_t n)
{
    return write_all(fd, buf, n, NULL);
}

int fy_fallocate(int fd, int mode, uint64_t off, uint64_t len)
{
    int rc = fault();
    if (rc) return rc;
    return rc_of(SYS(S_FALLOCATE, fallocate_fn)(fd, mode, (off_t)off, (off_t)len));
}

int fy_ftruncate(int fd, uint64_t len)
{
    int rc = fault();
    if (rc) return rc;
    return rc_of(SYS(S_FTRUNCATE, ftruncate_fn)(fd, (off_t)len));
}

int fy_fsync(int fd)
{
    int rc = fault();
    if (rc) return rc;
    return rc_of(SYS(S_FSYNC, fd_fn)(fd));
}

int fy_fchmod(int fd, mode_t mode)
{
    return rc_of(SYS(S_FCHMOD, fchmod_fn)(fd, mode));
}

int fy_fs_info(int fd, uint64_t *free_bytes, long *fs_type)
{
    int rc = fault();
    if (rc) return rc;
    struct statfs sf;
    if (SYS(S_FSTATFS, fstatfs_fn)(fd, &sf) < 0) return -errno;
    /* blocks are counted in fragments (statvfs's f_frsize); f_bsize is the
     * preferred I/O size, which need not be the same */
    uint64_t unit = sf.f_frsize > 0 ? (uint64_t)sf.f_frsize : (uint64_t)sf.f_bsize;
    if (free_bytes && fy_mul_ovf((uint64_t)sf.f_bavail, unit, free_bytes)) *free_bytes = UINT64_MAX;
    if (fs_type) *fs_type = (long)sf.f_type;
    return 0;
}

int fy_open_tmpfile(const char *dir, int *fd)
{
    int f = fault();
    if (f == 0) f = x_open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (f < 0) return f;
    *fd = f;
    return 0;
}

int fy_mkstemp(char *tmpl, int *fd)
{
    int rc = fault();
    if (rc) return rc;
    int f = SYS(S_MKOSTEMP, mkostemp_fn)(tmpl, O_CLOEXEC);
    if (f < 0) return -errno;
    *fd = f;
    return 0;
}

int fy_rename(const char *from, const char *to)
{
    int rc = fault();
    if (rc) return rc;
    return rc_of(SYS(S_RENAME, rename_fn)(from, to));
}

int fy_unlink(const char *path)
{
    int rc = fault();
    if (rc) return rc;
    return rc_of(SYS(S_UNLINK, path_fn)(path));
}

/* ---- small system files --------------------------------------------------- */

int fy_open_sysfile(const char *path)
{
    return x_open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY, 0);
}

ssize_t fy_read_some(int fd, void *buf, size_t n)
{
    ssize_t r;
    do r = SYS(S_READ, read_fn)(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}
