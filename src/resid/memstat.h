/* memstat.h - what the host really allows, and what this process uses.
 * Reads /proc and cgroup v2 files; every path is relative to roots that tests
 * can redirect to a fake tree. Depends on common/ only. */
#ifndef FERRY_MEMSTAT_H
#define FERRY_MEMSTAT_H

#include "../common/common.h"

/* Tests: read "/proc/..." from proc_root and "/sys/fs/cgroup/..." from
 * cgroup_root instead (NULL restores the real ones). Not thread-safe. */
void fy_memstat_set_roots(const char *proc_root, const char *cgroup_root);

/* This process now: rss = Rss, pss = Pss, uss = Private_Clean + Private_Dirty
 * from /proc/self/smaps_rollup (bytes). Without smaps_rollup (old kernels):
 * rss from /proc/self/status VmRSS, uss = pss = 0, and -ENOENT. */
typedef struct fy_memsnap {
    uint64_t rss, uss, pss;
} fy_memsnap;
int fy_mem_self(fy_memsnap *out);

/* The process's cgroup v2 (from /proc/self/cgroup's "0::/path"): limit = the
 * smallest memory.max and memory.high of it and its ancestors ("max" =
 * none; limited = whether any is set), current = its memory.current, peak =
 * its memory.peak (has_peak = 0 when the kernel lacks the file). path names
 * the cgroup and which file set the limit. -ENOENT when there is no cgroup v2
 * (then *out is zeroed). */
typedef struct fy_cgroup_mem {
    int limited;
    uint64_t limit, current, peak;
    int has_peak;
    char path[96]; /* "cgroup /system.slice/x.service: memory.max" */
} fy_cgroup_mem;
int fy_cgroup_read(fy_cgroup_mem *out);

/* Memory the host can still give this process: limit - current when the
 * process is in a limited cgroup v2 (0 if over), else MemAvailable of
 * /proc/meminfo. source (may be NULL, n bytes) says which: "cgroup /a/b:
 * memory.max" or "/proc/meminfo MemAvailable". 0 or -errno. */
int fy_host_available(uint64_t *avail, char *source, size_t n);

/* A thread sampling fy_mem_self (and the cgroup's memory.current) every
 * period_ms, keeping the peaks, from start to stop. */
typedef struct fy_memsampler fy_memsampler;
typedef struct fy_memsample_result {
    fy_memsnap start, end, peak;
    uint64_t cg_start, cg_end, cg_peak; /* memory.current at start and end; cg_peak: the
                                           highest memory.current sampled (memory.peak is the
                                           cgroup's lifetime peak, not this job's) */
    int has_cgroup;
} fy_memsample_result;
int fy_memsampler_start(const ferry_allocator *mem, unsigned period_ms, fy_memsampler **out);
/* Stop, join and free the sampler; fills *out (may be NULL). */
void fy_memsampler_stop(fy_memsampler *s, fy_memsample_result *out);

#endif
