/* io.h - files and mappings. Every system call that can fail in an interesting
 * way goes through one table (SQLite's aSyscall[]) so tests can make call N fail. */
#ifndef FERRY_IO_H
#define FERRY_IO_H

#include <sys/types.h>
#include "../common/common.h"

/* Fault injection for tests: the `nth` faultable call from now on (1 = the
 * next) fails with -err; 0 disarms. fy_fault_calls() counts faultable calls
 * made since the last arm, so a test can loop N = 1, 2, ... until no fault hits. */
void fy_fault_arm(long nth, int err);
long fy_fault_calls(void);
bool fy_fault_fired(void);

int fy_open_ro(const char *path, int *fd, uint64_t *size, fy_err *err);
int fy_close(int fd);
/* Read exactly n bytes at off; -errno, or FERRY_E_CORRUPT if the file ends first. */
int fy_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* One pread (O_DIRECT callers handle short reads): bytes read, or -errno. */
ssize_t fy_pread_some(int fd, void *buf, size_t n, uint64_t off);
int fy_map_ro(int fd, uint64_t size, void **out);
/* A second open file description of the file behind fd (its own file offset
 * and readahead state), read-only: through /proc/thread-self/fd, else path,
 * and only if it is the same inode (a path that names another file by now is
 * not opened). The new descriptor, or -errno. Not a fault point: its callers
 * fall back to fd, so an injected failure would pass unnoticed. */
int fy_reopen_ro(int fd, const char *path);
void fy_unmap(void *p, uint64_t size);
/* A private, writable mapping of the file (copy-on-write: writes land in
 * private anonymous pages, the file never changes). Never register one with
 * the device (DESIGN.md §7). */
int fy_map_private(int fd, uint64_t size, void **out);

/* Writing (the spill file). Each is a fault-injection point. */
/* Write exactly n bytes at off; -errno (e.g. -ENOSPC, -EIO). */
int fy_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* fallocate(2): 0 or -errno. */
int fy_fallocate(int fd, int mode, uint64_t off, uint64_t len);
int fy_ftruncate(int fd, uint64_t len);
/* Free bytes for an unprivileged user (f_bavail * f_bsize) and the file
 * system's magic number (statfs f_type) of the file system holding fd. */
int fy_fs_info(int fd, uint64_t *free_bytes, long *fs_type);
/* An unnamed file in dir (O_TMPFILE | O_RDWR, mode 0600): gone when its last
 * descriptor closes, however the process ends. 0 and *fd, or -errno
 * (-EOPNOTSUPP/-EISDIR where the file system lacks O_TMPFILE). */
int fy_open_tmpfile(const char *dir, int *fd);

#endif
