/* SPDX-License-Identifier: Apache-2.0 */
/* memstat.h - what the host really allows, and what this process uses.
 * Reads /proc and cgroup (v2, or v1's memory controller) files through io.c's
 * system-call table ("open", "read", "close": replaceable, not counted fault
 * points); every path is relative to roots that tests can redirect to a fake
 * tree.
 *
 * Parsing is strict and never trusts the files: a value that is not a plain
 * decimal number (or "max" where the kernel writes it), that overflows 64 bits
 * once converted to bytes, or a field that is missing, gives -EINVAL; a file
 * that does not exist gives -ENOENT; other system errors pass through as
 * -errno. Nothing here prints, aborts or allocates except the sampler. */
#ifndef FERRY_MEMSTAT_H
#define FERRY_MEMSTAT_H

#include "common/common.h"

/* Tests: read "/proc/..." from proc_root and "/sys/fs/cgroup/..." from
 * cgroup_root instead (each NULL restores its real one): "/proc/meminfo" is
 * proc_root + "/meminfo", "/proc/self/cgroup" proc_root + "/self/cgroup", a
 * cgroup v2's files cgroup_root + "<cgroup path>/memory.max", and a cgroup v1
 * mount that mountinfo puts at "/sys/fs/cgroup/memory" is read at cgroup_root
 * + "/memory" (mount points elsewhere are read where they are, and only while
 * cgroup_root is the real one). The strings are copied; a root of PATH_MAX
 * bytes or more makes every read fail with -ENAMETOOLONG. Not thread-safe:
 * call it while no other memstat call (nor a sampler's start) runs; a running
 * sampler keeps the roots it started with. */
void fy_memstat_set_roots(const char *proc_root, const char *cgroup_root);

/* This process now: rss = Rss, pss = Pss, uss = Private_Clean + Private_Dirty
 * (+ Private_Hugetlb where the kernel reports it) from /proc/self/smaps_rollup,
 * converted from kB to bytes. Rss, Pss, Private_Clean and Private_Dirty must
 * all be there once (else -EINVAL, *out zeroed). Without smaps_rollup (old
 * kernels): rss from /proc/self/status VmRSS (0 when that fails too),
 * uss = pss = 0, and -ENOENT. Thread-safe. */
typedef struct fy_memsnap {
    uint64_t rss, uss, pss;
} fy_memsnap;
int fy_mem_self(fy_memsnap *out);

/* The process's memory cgroup.
 *
 * cgroup v2 (/proc/self/cgroup's "0::/path", when its memory.current exists):
 * limit = the smallest memory.max and memory.high of it and its ancestors up
 * to the root ("max" = none; a missing file = none at that level), current =
 * its memory.current, peak = its memory.peak (has_peak = 0 when the kernel
 * lacks the file), reclaimable = inactive_file of its memory.stat.
 *
 * Else cgroup v1 (the "N:memory:/path" line, possibly "N:cpu,memory:/path",
 * and the mount of type cgroup with option memory in /proc/self/mountinfo
 * whose root holds that path): limit = the smallest memory.limit_in_bytes of
 * it and its ancestors up to the mount's root (from 2^62 up = none: the
 * kernel's "unlimited" is 9223372036854771712), or its memory.stat's
 * hierarchical_memory_limit when that is smaller (it covers ancestors above
 * the mount, as in a container), current = memory.usage_in_bytes, peak =
 * memory.max_usage_in_bytes, reclaimable = total_inactive_file of its
 * memory.stat.
 *
 * Either way limited says whether any limit is set, version is 2 or 1, and a
 * missing memory.stat (or key) gives reclaimable 0. reclaimable is the page
 * cache the kernel drops first, not this cgroup's debt (memstat.c says why
 * just that); current still includes it. path names the cgroup and which
 * file set the limit, e.g. "cgroup /a: memory.high" (on a tie the deepest
 * level and memory.max win), "cgroup /a: memory.limit_in_bytes", "cgroup /a:
 * memory.stat hierarchical_memory_limit", or "cgroup /a/b: no limit"; the
 * cgroup is named by its path in the hierarchy, as /proc/self/cgroup writes
 * it; a path too long for it keeps its end: "cgroup .../x.service:
 * memory.max". -ENOENT when neither version is found (no line, no mount, or
 * no memory.current / memory.usage_in_bytes); -EINVAL for a malformed line or
 * value, or a path with "." or ".." components. On any error *out is zeroed.
 * Thread-safe. */
typedef struct fy_cgroup_mem {
    int limited;
    uint64_t limit, current, peak;
    int has_peak;
    int version;          /* 2 or 1 */
    uint64_t reclaimable; /* inactive page cache within current */
    char path[96];        /* "cgroup /system.slice/x.service: memory.max" */
} fy_cgroup_mem;
int fy_cgroup_read(fy_cgroup_mem *out);

/* Memory the host can still give this process. In a limited cgroup (v2 or
 * v1): limit - (current - reclaimable) (0 if over), or MemAvailable of
 * /proc/meminfo when that is smaller (the host can be tighter than the
 * cgroup; a meminfo that cannot be read is then ignored). Otherwise (no
 * cgroup, or no limit): MemAvailable. source (may be NULL, n bytes, always
 * terminated when n > 0) says which: "cgroup /a/b: memory.max", "cgroup /a/b:
 * memory.max (host MemAvailable is lower)" or "/proc/meminfo MemAvailable".
 * Returns 0, or -errno with *avail = 0 and source "": a cgroup that exists
 * but cannot be read (-EINVAL, -EACCES...) is an error rather than silently
 * ignored, since guessing MemAvailable inside a limited container could
 * overrun its limit; -ENOENT when meminfo lacks MemAvailable (kernels before
 * 3.14). Thread-safe. */
int fy_host_available(uint64_t *avail, char *source, size_t n);

/* A thread sampling fy_mem_self (and the cgroup's memory.current, or v1's
 * memory.usage_in_bytes) every
 * period_ms (clamped to 1..1000), keeping the peaks, from start to stop.
 * start takes the first snapshot before it returns, stop the last after the
 * thread has ended; peak is the maximum over every snapshot, start and end
 * included, per field (so its fields may come from different moments). A
 * snapshot that fails is left out of the peaks (a -ENOENT one from the VmRSS
 * fallback still counts its rss). */
typedef struct fy_memsampler fy_memsampler;
typedef struct fy_memsample_result {
    fy_memsnap start, end, peak;
    uint64_t cg_start, cg_end, cg_peak; /* memory.current at start and end; cg_peak: the
                                           highest memory.current sampled (memory.peak is the
                                           cgroup's lifetime peak, not this job's) */
    int has_cgroup; /* the cgroup's memory.current could be read at start; cg_* are 0 if not */
} fy_memsample_result;
/* mem may be NULL (malloc). On success *out owns a running sampler, to be
 * ended with fy_memsampler_stop. Returns 0, -EINVAL (out NULL), -ENOMEM, or
 * the -errno of a failed thread creation. */
int fy_memsampler_start(const ferry_allocator *mem, unsigned period_ms, fy_memsampler **out);
/* Stop, join and free the sampler; fills *out (may be NULL). Returns within
 * about one sample's time, whatever the period. s may be NULL (then *out is
 * zeroed). */
void fy_memsampler_stop(fy_memsampler *s, fy_memsample_result *out);

#endif
