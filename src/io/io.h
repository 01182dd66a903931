/* SPDX-License-Identifier: Apache-2.0 */
/* io.h - files and mappings. Every system call of io/, file/ and the spill
 * file goes through one table of function pointers (SQLite's aSyscall[]), so
 * that tests can replace any call by name, or make the Nth call fail. */
#ifndef FERRY_IO_H
#define FERRY_IO_H

#include <sys/types.h>
#include "common/common.h"

/* ---- the system-call table (tests) ----------------------------------------
 * Entries, by name, with the prototype a replacement must have (the real
 * call's, returning -1 and setting errno on failure like it):
 *   "open"      int     (const char *path, int flags, mode_t mode)
 *   "close"     int     (int fd)
 *   "read"      ssize_t (int fd, void *buf, size_t n)
 *   "write"     ssize_t (int fd, const void *buf, size_t n)
 *   "pread"     ssize_t (int fd, void *buf, size_t n, off_t off)
 *   "pwrite"    ssize_t (int fd, const void *buf, size_t n, off_t off)
 *   "stat"      int     (const char *path, struct stat *st)
 *   "fstat"     int     (int fd, struct stat *st)
 *   "fstatfs"   int     (int fd, struct statfs *sf)
 *   "fallocate" int     (int fd, int mode, off_t off, off_t len)
 *   "ftruncate" int     (int fd, off_t len)
 *   "fchmod"    int     (int fd, mode_t mode)
 *   "fsync"     int     (int fd)
 *   "mmap"      void *  (void *addr, size_t len, int prot, int flags, int fd, off_t off)
 *   "munmap"    int     (void *addr, size_t len)
 *   "mincore"   int     (void *addr, size_t len, unsigned char *vec)
 *   "mkostemp"  int     (char *tmpl, int flags)
 *   "rename"    int     (const char *from, const char *to)
 *   "unlink"    int     (const char *path)
 * A call reads its entry with one atomic load, so entries may be replaced
 * while other threads call through them (each call sees the old or the new
 * function, whole). The replacement is called for every use of the entry in
 * the process, checkpoints and /proc files alike: a test that wants one file
 * to fail looks at the path or descriptor and passes the rest on to the real
 * function (fy_sys_get before replacing it). */
typedef void (*fy_sys_fn)(void);
/* Replace the entry `name` with fn (cast to fy_sys_fn); fn NULL restores the
 * real call. 0, or -ENOENT for a name not in the table. */
int fy_sys_set(const char *name, fy_sys_fn fn);
/* The function the entry calls now (the real one unless replaced), or NULL
 * for a name not in the table. */
fy_sys_fn fy_sys_get(const char *name);
/* Every entry back to the real call. */
void fy_sys_reset(void);

/* Counted fault injection, on top of the table: the `nth` counted call from
 * now on (1 = the next) fails with -err before reaching its entry; 0 disarms.
 * Counted: every table call made by the functions below, except where a
 * function says "not a fault point" (its callers fall back, so an injected
 * failure would pass unnoticed; or the call cannot usefully fail). A test
 * loops N = 1, 2, ... until fy_fault_fired() says no fault hit. */
void fy_fault_arm(long nth, int err);
bool fy_fault_fired(void);

/* ---- reading checkpoints ---- */

/* open (O_RDONLY | O_NONBLOCK: a FIFO is refused, not waited on) and fstat: a
 * regular file, its descriptor and size. Errors (with a message naming path):
 * -errno, -EISDIR, FERRY_E_INVAL for anything but a regular file. */
int fy_open_ro(const char *path, int *fd, uint64_t *size, fy_err *err);
/* The same file without the page cache (O_RDONLY | O_DIRECT | O_CLOEXEC):
 * 0 and *fd, or -errno (-EINVAL where the file system lacks O_DIRECT). */
int fy_open_direct(const char *path, int *fd);
/* close(2) of fd >= 0 (fd < 0: nothing, 0). 0 or -errno; the descriptor is
 * gone either way. Not a fault point. */
int fy_close(int fd);
/* The size of the file behind fd now (fstat st_size): 0 or -errno. Not a
 * fault point: its caller (the size check before a device copy) goes on
 * when the size cannot be told. */
int fy_fstat_size(int fd, uint64_t *size);
/* Read exactly n bytes at off; -errno, or FERRY_E_CORRUPT if the file ends first. */
int fy_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* One pread (O_DIRECT callers handle short reads): bytes read, or -errno. */
ssize_t fy_pread_some(int fd, void *buf, size_t n, uint64_t off);
/* A second open file description of the file behind fd (its own file offset
 * and readahead state), read-only: through /proc/thread-self/fd, else path,
 * and only if it is the same inode (a path that names another file by now is
 * not opened). The new descriptor, or -errno. Not a fault point: its callers
 * fall back to fd, so an injected failure would pass unnoticed. */
int fy_reopen_ro(int fd, const char *path);
/* The absolute path of the file behind fd now (readlink of
 * /proc/thread-self/fd/FD; a removed file's ends in " (deleted)"): its
 * length, or -errno (-ENOENT for a file that has no path, -ENAMETOOLONG when
 * it does not fit n). Not a fault point: its caller goes on without the path. */
int fy_fd_path(int fd, char *buf, size_t n);
/* The size and mtime (ns) of the file behind fd (fstat); with path, also
 * that path names that same file now (stat: device and inode), else
 * -ESTALE. 0 or -errno. */
int fy_file_ident(int fd, const char *path, uint64_t *size, int64_t *mtime_ns);
/* How much of a file's head the keeper's identity digests. */
#define FY_HEAD_BYTES ((uint64_t)1 << 20)
/* XXH3-64 of the first min(size, FY_HEAD_BYTES) bytes of fd (size: the file's,
 * as fstat told it), read with pread in pieces: 0, -errno, or
 * FERRY_E_CORRUPT when the file ends first (it shrank since). */
int fy_head_digest(int fd, uint64_t size, uint64_t *digest);

/* ---- mappings ---- */

/* MAP_SHARED, PROT_READ of the whole file; size 0 gives NULL (no call). */
int fy_map_ro(int fd, uint64_t size, void **out);
/* A private, writable mapping of the file (copy-on-write: writes land in
 * private anonymous pages, the file never changes). Never register one with
 * the device: registering a MAP_PRIVATE mapping hung the process on an H200
 * host (gpu/cuda.c, cu_host_register). Size 0 gives NULL. */
int fy_map_private(int fd, uint64_t size, void **out);
/* MAP_SHARED of len bytes of fd from off (a multiple of the page size),
 * PROT_READ, or PROT_READ | PROT_WRITE when writable (memory another process
 * shares, such as the keeper's). len 0 gives NULL (no call). 0 or -errno. */
int fy_map_at(int fd, uint64_t off, uint64_t len, bool writable, void **out);
/* munmap; p NULL or size 0: nothing. Not a fault point. */
void fy_unmap(void *p, uint64_t size);
/* fy_unmap for a large, faulted-in mapping that other threads may be waiting
 * to map beside: the pages go in pieces first (io.c says why). */
void fy_unmap_gently(void *p, uint64_t size);
/* mincore(2): which pages of [addr, addr + len) are resident (addr page
 * aligned; vec holds one byte per page). 0 or -errno. Not a fault point:
 * residency is an estimate, and its callers answer "unknown" on failure. */
int fy_mincore(void *addr, size_t len, unsigned char *vec);

/* ---- writing (the spill file, converted checkpoints) ---- */

/* Write exactly n bytes at off; -errno (e.g. -ENOSPC, -EIO). */
int fy_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* Write exactly n bytes at the file offset; -errno (-EIO if nothing goes). */
int fy_write_full(int fd, const void *buf, size_t n);
/* fallocate(2): 0 or -errno. */
int fy_fallocate(int fd, int mode, uint64_t off, uint64_t len);
int fy_ftruncate(int fd, uint64_t len);
int fy_fsync(int fd);
/* fchmod(2): 0 or -errno. Not a fault point: its caller keeps the file's
 * mode as it is when this fails. */
int fy_fchmod(int fd, mode_t mode);
/* Free bytes for an unprivileged user (f_bavail * f_frsize) and the file
 * system's magic number (statfs f_type) of the file system holding fd. */
int fy_fs_info(int fd, uint64_t *free_bytes, long *fs_type);
/* fs_type of a file system whose files live in RAM (tmpfs, ramfs). */
#define FY_TMPFS_MAGIC 0x01021994L
#define FY_RAMFS_MAGIC 0x858458f6L
/* An unnamed file in dir (O_TMPFILE | O_RDWR, mode 0600): gone when its last
 * descriptor closes, however the process ends. 0 and *fd, or -errno
 * (-EOPNOTSUPP/-EISDIR where the file system lacks O_TMPFILE). */
int fy_open_tmpfile(const char *dir, int *fd);
/* mkostemp(tmpl, O_CLOEXEC): tmpl ends in "XXXXXX", which becomes the name
 * made (mode 0600). 0 and *fd, or -errno. */
int fy_mkstemp(char *tmpl, int *fd);
int fy_rename(const char *from, const char *to);
int fy_unlink(const char *path);

/* ---- small system files (/proc, cgroup; memstat.c) ---- */

/* Open read-only (O_CLOEXEC | O_NOCTTY): the descriptor, or -errno. Read:
 * bytes read (0 at the end), or -errno. Both retry EINTR. Not fault points:
 * the sampler thread reads these at any moment, and the store goes on when
 * host memory cannot be told; replace "open" or "read" to make them fail. */
int fy_open_sysfile(const char *path);
ssize_t fy_read_some(int fd, void *buf, size_t n);

#endif
