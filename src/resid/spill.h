/* spill.h - the store's spill file (DESIGN.md §5): one unnamed file
 * (O_TMPFILE) in a chosen directory, so nothing is left on disk however the
 * process ends. Space is reserved with fallocate before anything is written,
 * freed ranges are reused and punched out. Not thread-safe: the store
 * serialises calls. Depends on common/ and io/. */
#ifndef FERRY_SPILL_H
#define FERRY_SPILL_H

#include "common/common.h"

#define FY_SPILL_ALIGN 4096u /* every range starts and ends on this */

typedef struct fy_spill fy_spill;

/* Create the spill file in dir. Refuses a directory on tmpfs or ramfs (its
 * pages are RAM: spilling there frees nothing) with FERRY_E_INVAL and a message
 * that says so and names dir. Where the file system lacks O_TMPFILE, a file is
 * created with mkstemp and unlinked at once (named for microseconds).
 * Errors: -errno (missing dir, EACCES, ...) with a message naming dir.
 * mem NULL means malloc/free. err must outlive s: fy_spill_reserve writes its
 * messages there too. On failure *out is NULL and nothing is left open. */
int fy_spill_open(const char *dir, const ferry_allocator *mem, fy_err *err, fy_spill **out);
void fy_spill_close(fy_spill *s);
int fy_spill_fd(const fy_spill *s);
const char *fy_spill_dir(const fy_spill *s);

/* Reserve len bytes (rounded up to FY_SPILL_ALIGN): a freed range is reused
 * when one fits (best fit), else the file grows. When growing, the file
 * system's free space is checked first (fstatfs); then the range is
 * fallocate'd (a reused range may still hold its blocks), so later writes
 * into it cannot fail for lack of space. On failure nothing is reserved:
 * -ENOSPC with a message naming the directory, the bytes needed and the bytes
 * free; or the -errno of fallocate. *off receives the range's offset.
 * Also FERRY_E_INVAL for len 0, -EFBIG past the largest file, -ENOMEM. */
int fy_spill_reserve(fy_spill *s, uint64_t len, uint64_t *off);
/* Return a reserved range (off and len as reserved): its blocks are punched
 * out (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) and it is merged with
 * neighbouring free ranges; a free range at the end of the file is cut off
 * with ftruncate. Failures to punch are ignored (the range is still free).
 * A range that cannot have been reserved (unaligned, past the end, overlapping
 * a free range) is ignored. Releasing ranges exactly as reserved never
 * allocates, so it cannot fail for lack of memory. */
void fy_spill_release(fy_spill *s, uint64_t off, uint64_t len);
/* Deferred releases: after fy_spill_hold, fy_spill_release only updates the
 * free list (the blocks stay allocated, ready for reuse); fy_spill_flush then
 * cuts a free tail and punches every free range, once. (Giving 10 GB back to
 * ext4 took 0.5-2.8 s on the H200 host, longer than reading it back.) */
void fy_spill_hold(fy_spill *s);
void fy_spill_flush(fy_spill *s);
/* Bytes reserved now, and the file's size (free holes included). */
void fy_spill_usage(const fy_spill *s, uint64_t *reserved, uint64_t *file_size);

#endif
