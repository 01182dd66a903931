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
void fy_unmap(void *p, uint64_t size);

#endif
