/* SPDX-License-Identifier: Apache-2.0 */
/* zip.h - a strict reader of a ZIP archive held in memory, for PyTorch
 * checkpoints: the directory is validated completely and each entry's data is
 * located through its local header; nothing is decompressed. Internal to
 * format/ (and its fuzzers). */
#ifndef FERRY_FORMAT_ZIP_H
#define FERRY_FORMAT_ZIP_H

#include "common/common.h"

typedef struct fy_zip_entry {
    const char *name; /* into the buffer: name_len bytes of UTF-8, no NUL */
    uint32_t name_len;
    uint16_t flags;  /* general purpose bits (bit 0: encrypted) */
    uint16_t method; /* 0 stored, 8 deflate, ... */
    uint64_t csize;  /* bytes in the archive */
    uint64_t usize;  /* bytes once extracted (== csize when stored) */
    uint64_t header; /* absolute offset of the local header */
    uint64_t data;   /* absolute offset of the data, from the local header's lengths */
} fy_zip_entry;

typedef struct fy_zip {
    const ferry_allocator *mem;
    fy_zip_entry *e; /* n entries in central directory order */
    uint64_t n;
    uint64_t *sorted; /* entry indices in name order (byte-wise) */
    uint64_t cd_offset, cd_size;
    bool zip64; /* a zip64 end record was present */
} fy_zip;

/* Sanity bound of ferry's: more entries than this is refused (FERRY_E_LIMIT). */
#define FY_ZIP_MAX_ENTRIES (1u << 24)

/* Read the directory of the archive in buf[0, size): the end record (searched
 * backwards over the last 64 KiB + 22 bytes), its zip64 locator and record when
 * present, every central directory entry (zip64 extra fields included) and
 * every local header. Every offset and size is checked against the buffer and
 * against the directory; names must be valid UTF-8 without NUL and unique.
 * Compressed or encrypted entries are listed (fy_zip_stored refuses them).
 * `name` prefixes every message. On success z owns arrays to be released with
 * fy_zip_free(); on failure z is empty. Errors: FERRY_E_CORRUPT,
 * FERRY_E_UNSUPPORTED (multi-disk archives), FERRY_E_LIMIT, -ENOMEM. */
int fy_zip_open(const char *name, const uint8_t *buf, uint64_t size, const ferry_allocator *mem, fy_zip *z,
                fy_err *err);
void fy_zip_free(fy_zip *z);

/* Index of the entry called exactly name[0, len), or -1. O(log n). */
int64_t fy_zip_find(const fy_zip *z, const char *name, size_t len);

/* 0 when entry i is stored (method 0, not encrypted), so that its bytes are
 * buf[data, data + usize); otherwise FERRY_E_UNSUPPORTED with a message naming
 * the entry and its compression method. */
int fy_zip_stored(const char *name, const fy_zip *z, uint64_t i, fy_err *err);

/* Entry i's name quoted for a message (fy_quote) into buf. */
const char *fy_zip_qname(char *buf, size_t n, const fy_zip_entry *e);

#endif /* FERRY_FORMAT_ZIP_H */
