/* SPDX-License-Identifier: Apache-2.0 */
/* spill.h - the store's spill file: one unnamed file
 * (O_TMPFILE) in a chosen directory, so nothing is left on disk however the
 * process ends. Space is reserved with fallocate before anything is written,
 * freed ranges are reused and punched out. Not thread-safe: the store
 * serialises calls. Depends on common/ and io/. */
#ifndef FERRY_SPILL_H
#define FERRY_SPILL_H

#include "common/common.h"
#include "common/ranges.h"

#define RS_SPILL_ALIGN 4096u /* every range starts and ends on this */

typedef struct rs_spill rs_spill;

/* Create the spill file in dir. Refuses a directory on tmpfs or ramfs (its
 * pages are RAM: spilling there frees nothing) with FERRY_E_INVAL and a message
 * that says so and names dir. Where the file system lacks O_TMPFILE, a file is
 * created with mkstemp and unlinked at once (named for microseconds).
 * Errors: -errno (missing dir, EACCES, ...) with a message naming dir.
 * mem NULL means malloc/free. err must outlive s: rs_spill_reserve writes its
 * messages there too. On failure *out is NULL and nothing is left open. */
int rs_spill_open(const char *dir, const ferry_allocator *mem, fy_err *err, rs_spill **out);
void rs_spill_close(rs_spill *s);
int rs_spill_fd(const rs_spill *s);
const char *rs_spill_dir(const rs_spill *s);

/* Reserve len bytes (rounded up to RS_SPILL_ALIGN): a freed range is reused
 * when one fits (best fit), else the file grows. When growing, the file
 * system's free space is checked first (fstatfs); then the range is
 * fallocate'd (a reused range may still hold its blocks), so later writes
 * into it cannot fail for lack of space. On failure nothing is reserved:
 * -ENOSPC with a message naming the directory, the bytes needed and the bytes
 * free; or the -errno of fallocate. *off receives the range's offset.
 * Also FERRY_E_INVAL for len 0, -EFBIG past the largest file, -ENOMEM. */
int rs_spill_reserve(rs_spill *s, uint64_t len, uint64_t *off);
/* Before a batch of reservations (one eviction's spill): -ENOSPC, with a
 * message naming the directory, the bytes needed and the bytes free, when the
 * file system cannot hold bytes more (the batch's total, each range rounded up
 * to RS_SPILL_ALIGN), so that a batch that cannot fit fails before reserving
 * any of it. Free means f_bavail * f_frsize (fstatfs); while holding, the
 * freed ranges' bytes count too (their blocks may still be allocated and
 * reusable), so the check never refuses a batch that could fit and a batch it
 * lets through may still fail in rs_spill_reserve. 0, or the -errno of
 * fstatfs (message naming the directory). */
int rs_spill_check_room(rs_spill *s, uint64_t bytes);
/* Take back a range reserved by rs_spill_reserve, when a batch fails: ranges
 * taken back in the reverse order of their reservation, with nothing else
 * reserved or released in between, leave the file's size, its free ranges and
 * its allocated blocks as they were before those reservations (a range at the
 * end of the file is cut off, any other goes back to the free list and its
 * blocks are punched, holding or not, since fallocate may have filled a
 * hole). Exceptions, which keep the books consistent but not identical: a
 * free range that was the file's whole tail and was reused whole is cut off
 * rather than kept, and where ftruncate fails the range is punched and kept
 * free. Never allocates; a range that cannot have been reserved is ignored. */
void rs_spill_unreserve(rs_spill *s, uint64_t off, uint64_t len);
/* Return a reserved range (off and len as reserved): its blocks are punched
 * out (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) and it is merged with
 * neighbouring free ranges; a free range at the end of the file is cut off
 * with ftruncate. Failures to punch are ignored (the range is still free).
 * A range that cannot have been reserved (unaligned, past the end, overlapping
 * a free range) is ignored. Releasing ranges exactly as reserved never
 * allocates, so it cannot fail for lack of memory. */
void rs_spill_release(rs_spill *s, uint64_t off, uint64_t len);
/* Deferred releases: after rs_spill_hold, rs_spill_release only updates the
 * free list (the blocks stay allocated, ready for reuse); rs_spill_flush then
 * cuts a free tail and punches every free range, once. (Giving 10 GB back to
 * ext4 took 0.5-2.8 s on the H200 host, longer than reading it back.) */
void rs_spill_hold(rs_spill *s);
void rs_spill_flush(rs_spill *s);
/* rs_spill_flush in three steps, for a caller that serialises the calls
 * with a lock it must not hold while the file system works: under the lock,
 * rs_spill_flush_take hands over the free ranges to punch (taken off the
 * free list, so no reservation reuses them meanwhile; none, and *out NULL,
 * when nothing was released since the last flush, or out of memory); with
 * the lock dropped, rs_spill_punch punches them (it reads nothing of s but
 * its descriptor); under the lock again, rs_spill_flush_give puts them back
 * (merged with what was released meanwhile), cuts a free tail off the file
 * and frees the list. Releases stay held until then. */
int rs_spill_flush_take(rs_spill *s, fy_range **out, size_t *n);
void rs_spill_punch(int fd, const fy_range *r, size_t n);
void rs_spill_flush_give(rs_spill *s, fy_range *r, size_t n);
/* Bytes reserved now, and the file's size (free holes included). */
void rs_spill_usage(const rs_spill *s, uint64_t *reserved, uint64_t *file_size);

#endif
