/* SPDX-License-Identifier: Apache-2.0 */
/* zip.c - a strict ZIP directory reader over a buffer (see zip.h).
 *
 * Written from PKWARE's APPNOTE (4.3.7 local header, 4.3.12 central directory
 * header, 4.3.14-16 zip64 end record, locator and end record, 4.5.3 zip64
 * extra field). Every read is bounds-checked first: a hostile archive can make
 * this fail, never read outside buf. */
#include "zip.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_Z64_END 0x06064b50u
#define SIG_Z64_LOCATOR 0x07064b50u

#define END_LEN 22u /* fixed part of the end record */
#define Z64_LOCATOR_LEN 20u
#define Z64_END_LEN 56u /* fixed part of the zip64 end record */
#define CENTRAL_LEN 46u /* fixed part of a central directory header */
#define LOCAL_LEN 30u   /* fixed part of a local header */
#define MAX_COMMENT 65535u

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

const char *fy_zip_qname(char *buf, size_t n, const fy_zip_entry *e)
{
    char tmp[256];
    size_t len = e->name_len < sizeof tmp - 1 ? e->name_len : sizeof tmp - 1;
    memcpy(tmp, e->name, len);
    tmp[len] = '\0';
    return fy_quote(buf, n, tmp);
}

void fy_zip_free(fy_zip *z)
{
    if (!z) return;
    fy_free(z->mem, z->e);
    fy_free(z->mem, z->sorted);
    const ferry_allocator *m = z->mem;
    memset(z, 0, sizeof *z);
    z->mem = m;
}

/* Name order for the sorted index: byte-wise, then by position (so that
 * duplicates sort next to each other deterministically). */
typedef struct name_ref {
    const char *name;
    uint32_t len;
    uint64_t idx;
} name_ref;

static int cmp_name(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int64_t fy_zip_find(const fy_zip *z, const char *name, size_t len)
{
    uint64_t lo = 0, hi = z->n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const fy_zip_entry *e = &z->e[z->sorted[mid]];
        size_t n = e->name_len < len ? e->name_len : len;
        int c = memcmp(e->name, name, n);
        if (c == 0 && e->name_len != len) c = e->name_len < len ? -1 : 1;
        if (c == 0) return (int64_t)z->sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static const char *method_name(uint16_t m)
{
    switch (m) {
    case 1: return "shrink";
    case 6: return "implode";
    case 8: return "deflate";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "lzma";
    case 93: return "zstd";
    case 95: return "xz";
    case 98: return "ppmd";
    default: return "unknown";
    }
}

int fy_zip_stored(const char *name, const fy_zip *z, uint64_t i, fy_err *err)
{
    const fy_zip_entry *e = &z->e[i];
    char q[128];
    FY_RETURN_IF(e->flags & 1u, err, FERRY_E_UNSUPPORTED, "%s: zip entry %s is encrypted: not supported",
                 name, fy_zip_qname(q, sizeof q, e));
    FY_RETURN_IF(e->method != 0, err, FERRY_E_UNSUPPORTED,
                 "%s: zip entry %s is compressed (method %u, %s): ferry maps stored entries only "
                 "(torch.save writes them uncompressed; re-save the checkpoint with torch.save)",
                 name, fy_zip_qname(q, sizeof q, e), e->method, method_name(e->method));
    return 0;
}

/* Find the end record: the last signature whose comment reaches exactly to the
 * end of the buffer. */
static bool find_end(const uint8_t *buf, uint64_t size, uint64_t *at)
{
    uint64_t pos = size - END_LEN;
    uint64_t lowest = size - END_LEN > MAX_COMMENT ? size - END_LEN - MAX_COMMENT : 0;
    for (;;) {
        if (rd32(buf + pos) == SIG_END && pos + END_LEN + rd16(buf + pos + 20) == size) {
            *at = pos;
            return true;
        }
        if (pos == lowest) return false;
        pos--;
    }
}

/* The zip64 extra field (header ID 1) of a central directory entry: the
 * 64-bit values of exactly those fields whose 32-bit (16-bit for the disk)
 * value is saturated, in the order usize, csize, offset, disk. */
static int zip64_extra(const char *name, const uint8_t *x, uint32_t xlen, uint64_t idx, uint64_t *usize,
                       uint64_t *csize, uint64_t *off, uint32_t *disk, fy_err *err)
{
    bool need_u = *usize == 0xFFFFFFFFu, need_c = *csize == 0xFFFFFFFFu, need_o = *off == 0xFFFFFFFFu,
         need_d = *disk == 0xFFFFu;
    if (!need_u && !need_c && !need_o && !need_d) return 0;
    uint32_t p = 0;
    while (p < xlen) {
        FY_RETURN_IF(xlen - p < 4, err, FERRY_E_CORRUPT,
                     "%s: zip central directory entry %" PRIu64 ": extra field ends inside a block header",
                     name, idx);
        uint16_t id = rd16(x + p), len = rd16(x + p + 2);
        FY_RETURN_IF(len > xlen - p - 4, err, FERRY_E_CORRUPT,
                     "%s: zip central directory entry %" PRIu64
                     ": extra field block 0x%04x of %u bytes runs past "
                     "the extra field (%u bytes)",
                     name, idx, id, len, xlen);
        if (id == 1) {
            const uint8_t *d = x + p + 4;
            uint32_t want = (need_u ? 8u : 0) + (need_c ? 8u : 0) + (need_o ? 8u : 0) + (need_d ? 4u : 0);
            FY_RETURN_IF(len < want, err, FERRY_E_CORRUPT,
                         "%s: zip central directory entry %" PRIu64
                         ": zip64 extra field holds %u bytes, but the "
                         "saturated sizes and offset need %u",
                         name, idx, len, want);
            if (need_u) *usize = rd64(d), d += 8;
            if (need_c) *csize = rd64(d), d += 8;
            if (need_o) *off = rd64(d), d += 8;
            if (need_d) *disk = rd32(d);
            return 0;
        }
        p += 4u + len;
    }
    return fy_seterr(err, FERRY_E_CORRUPT,
                     "%s: zip central directory entry %" PRIu64
                     ": sizes or offset are 0xFFFFFFFF but there is no "
                     "zip64 extra field",
                     name, idx);
}

/* Parse one central directory header at buf + p (p + CENTRAL_LEN <= cd_end
 * checked by the caller) and its local header; *next gets the next header. */
static int read_entry(const char *name, const uint8_t *buf, uint64_t p, uint64_t cd_off, uint64_t cd_end,
                      uint64_t idx, fy_zip_entry *e, uint64_t *next, fy_err *err)
{
    const uint8_t *h = buf + p;
    char q[128], q2[128];
    uint32_t sig = rd32(h);
    FY_RETURN_IF(sig != SIG_CENTRAL, err, FERRY_E_CORRUPT,
                 "%s: zip central directory entry %" PRIu64 " at offset %" PRIu64
                 " has signature 0x%08x, not "
                 "0x%08x",
                 name, idx, p, sig, SIG_CENTRAL);
    e->flags = rd16(h + 8);
    e->method = rd16(h + 10);
    uint64_t csize = rd32(h + 20), usize = rd32(h + 24);
    uint32_t nlen = rd16(h + 28), xlen = rd16(h + 30), clen = rd16(h + 32);
    uint32_t disk = rd16(h + 34);
    uint64_t off = rd32(h + 42);
    uint64_t total = (uint64_t)CENTRAL_LEN + nlen + xlen + clen;
    FY_RETURN_IF(total > cd_end - p, err, FERRY_E_CORRUPT,
                 "%s: zip central directory entry %" PRIu64 " at offset %" PRIu64 " (%" PRIu64
                 " bytes with its "
                 "name, extra field and comment) runs past the end of the directory at %" PRIu64,
                 name, idx, p, total, cd_end);
    e->name = (const char *)h + CENTRAL_LEN;
    e->name_len = nlen;
    FY_RETURN_IF(nlen == 0, err, FERRY_E_CORRUPT,
                 "%s: zip central directory entry %" PRIu64 " has an empty name", name, idx);
    size_t bad;
    FY_RETURN_IF(memchr(e->name, 0, nlen) != NULL, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: name holds a NUL byte", name, fy_zip_qname(q, sizeof q, e));
    FY_RETURN_IF(!fy_utf8_valid(e->name, nlen, &bad), err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: name is not valid UTF-8 (byte 0x%02x at %zu)", name,
                 fy_zip_qname(q, sizeof q, e), (unsigned char)e->name[bad], bad);
    FY_TRY(zip64_extra(name, h + CENTRAL_LEN + nlen, xlen, idx, &usize, &csize, &off, &disk, err));
    FY_RETURN_IF(disk != 0, err, FERRY_E_UNSUPPORTED,
                 "%s: zip entry %s starts on disk %u: multi-disk archives are "
                 "not supported",
                 name, fy_zip_qname(q, sizeof q, e), disk);
    FY_RETURN_IF(e->method == 0 && !(e->flags & 1u) && csize != usize, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s is stored but its sizes differ (%" PRIu64 " in the archive, %" PRIu64
                 " extracted)",
                 name, fy_zip_qname(q, sizeof q, e), csize, usize);

    /* The local header: its name must be the same; its extra field may differ
     * (torch pads it to align the data), so the data starts after the LOCAL
     * lengths. Everything must end before the central directory. */
    FY_RETURN_IF(off > cd_off || cd_off - off < LOCAL_LEN, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: local header offset %" PRIu64
                 " leaves no room for its header before the central "
                 "directory at %" PRIu64,
                 name, fy_zip_qname(q, sizeof q, e), off, cd_off);
    const uint8_t *l = buf + off;
    sig = rd32(l);
    FY_RETURN_IF(sig != SIG_LOCAL, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: local header at offset %" PRIu64 " has signature 0x%08x, not 0x%08x",
                 name, fy_zip_qname(q, sizeof q, e), off, sig, SIG_LOCAL);
    uint32_t lnlen = rd16(l + 26), lxlen = rd16(l + 28);
    uint64_t data = off + LOCAL_LEN + lnlen + lxlen; /* no overflow: off < cd_off <= size */
    FY_RETURN_IF(data > cd_off, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: local header at %" PRIu64
                 " (name %u bytes, extra %u bytes) runs into the "
                 "central directory at %" PRIu64,
                 name, fy_zip_qname(q, sizeof q, e), off, lnlen, lxlen, cd_off);
    if (lnlen != nlen || memcmp(l + LOCAL_LEN, e->name, nlen) != 0) {
        fy_zip_entry le = {.name = (const char *)l + LOCAL_LEN, .name_len = lnlen};
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: zip entry %s: its local header at %" PRIu64 " names %s",
                         name, fy_zip_qname(q, sizeof q, e), off, fy_zip_qname(q2, sizeof q2, &le));
    }
    uint16_t lmethod = rd16(l + 8);
    FY_RETURN_IF(lmethod != e->method, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: local header says method %u, central directory says %u", name,
                 fy_zip_qname(q, sizeof q, e), lmethod, e->method);
    FY_RETURN_IF(csize > cd_off - data, err, FERRY_E_CORRUPT,
                 "%s: zip entry %s: data at %" PRIu64 " of %" PRIu64
                 " bytes runs past the start of the central "
                 "directory at %" PRIu64,
                 name, fy_zip_qname(q, sizeof q, e), data, csize, cd_off);
    e->csize = csize;
    e->usize = usize;
    e->header = off;
    e->data = data;
    *next = p + total;
    return 0;
}

int fy_zip_open(const char *name, const uint8_t *buf, uint64_t size, const ferry_allocator *mem, fy_zip *z,
                fy_err *err)
{
    memset(z, 0, sizeof *z);
    z->mem = mem;
    FY_RETURN_IF(size < END_LEN, err, FERRY_E_CORRUPT,
                 "%s: %" PRIu64 " bytes: too short for a zip archive (its end record alone is 22 bytes)",
                 name, size);
    uint64_t end;
    FY_RETURN_IF(!find_end(buf, size, &end), err, FERRY_E_CORRUPT,
                 "%s: no zip end of central directory record in the last %" PRIu64
                 " bytes (a truncated archive, or not a zip archive)",
                 name, size < END_LEN + MAX_COMMENT ? size : (uint64_t)END_LEN + MAX_COMMENT);
    const uint8_t *r = buf + end;
    uint64_t disk = rd16(r + 4), cd_disk = rd16(r + 6), n_disk = rd16(r + 8), n = rd16(r + 10);
    uint64_t cd_size = rd32(r + 12), cd_off = rd32(r + 16);
    uint64_t limit = end; /* the directory must end where the next record begins */
    const char *limit_what = "the end record";

    if (end >= Z64_LOCATOR_LEN && rd32(buf + end - Z64_LOCATOR_LEN) == SIG_Z64_LOCATOR) {
        const uint8_t *loc = buf + end - Z64_LOCATOR_LEN;
        uint64_t loc_at = end - Z64_LOCATOR_LEN;
        uint32_t z64_disk = rd32(loc + 4), ndisks = rd32(loc + 16);
        uint64_t at = rd64(loc + 8);
        FY_RETURN_IF(z64_disk != 0 || ndisks > 1, err, FERRY_E_UNSUPPORTED,
                     "%s: zip64 locator names disk %u of %u: multi-disk archives are not supported", name,
                     z64_disk, ndisks);
        FY_RETURN_IF(at > loc_at || loc_at - at < Z64_END_LEN, err, FERRY_E_CORRUPT,
                     "%s: zip64 locator points at offset %" PRIu64
                     ", which leaves no room for the 56-byte zip64 end "
                     "record before the locator at %" PRIu64,
                     name, at, loc_at);
        const uint8_t *x = buf + at;
        uint32_t sig = rd32(x);
        FY_RETURN_IF(sig != SIG_Z64_END, err, FERRY_E_CORRUPT,
                     "%s: zip64 end record at offset %" PRIu64 " has signature 0x%08x, not 0x%08x", name, at,
                     sig, SIG_Z64_END);
        uint64_t rec = rd64(x + 4);
        FY_RETURN_IF(rec < Z64_END_LEN - 12 || rec > loc_at - at - 12, err, FERRY_E_CORRUPT,
                     "%s: zip64 end record at offset %" PRIu64 " claims %" PRIu64
                     " bytes, which do not fit between it and its locator at %" PRIu64,
                     name, at, rec, loc_at);
        uint64_t d64 = rd32(x + 16), cdd64 = rd32(x + 20), nd64 = rd64(x + 24), n64 = rd64(x + 32),
                 size64 = rd64(x + 40), off64 = rd64(x + 48);
        /* Fields of the plain end record that are not saturated must agree. */
        struct {
            const char *what;
            uint64_t plain, sat, wide;
        } f[] = {
            {"disk number", disk, 0xFFFF, d64},
            {"directory disk", cd_disk, 0xFFFF, cdd64},
            {"entries on this disk", n_disk, 0xFFFF, nd64},
            {"entry count", n, 0xFFFF, n64},
            {"directory size", cd_size, 0xFFFFFFFF, size64},
            {"directory offset", cd_off, 0xFFFFFFFF, off64},
        };
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            FY_RETURN_IF(f[i].plain != f[i].sat && f[i].plain != f[i].wide, err, FERRY_E_CORRUPT,
                         "%s: zip64 end record says %s %" PRIu64 ", the end record says %" PRIu64, name,
                         f[i].what, f[i].wide, f[i].plain);
        disk = d64, cd_disk = cdd64, n_disk = nd64, n = n64, cd_size = size64, cd_off = off64;
        limit = at;
        limit_what = "the zip64 end record";
        z->zip64 = true;
    }
    FY_RETURN_IF(disk != 0 || cd_disk != 0 || n_disk != n, err, FERRY_E_UNSUPPORTED,
                 "%s: zip archive spans several disks (disk %" PRIu64 ", directory on disk %" PRIu64
                 ", %" PRIu64 " of %" PRIu64 " entries here): not supported",
                 name, disk, cd_disk, n_disk, n);
    FY_RETURN_IF(cd_off > limit || cd_size != limit - cd_off, err, FERRY_E_CORRUPT,
                 "%s: zip central directory at offset %" PRIu64 " of %" PRIu64
                 " bytes does not end where %s begins "
                 "(offset %" PRIu64 ")",
                 name, cd_off, cd_size, limit_what, limit);
    FY_RETURN_IF(n > cd_size / CENTRAL_LEN, err, FERRY_E_CORRUPT,
                 "%s: zip central directory claims %" PRIu64 " entries, but its %" PRIu64
                 " bytes hold at most %" PRIu64 " (46 bytes each)",
                 name, n, cd_size, cd_size / CENTRAL_LEN);
    FY_RETURN_IF(n > FY_ZIP_MAX_ENTRIES, err, FERRY_E_LIMIT,
                 "%s: zip archive has %" PRIu64 " entries (ferry's limit is %u)", name, n,
                 FY_ZIP_MAX_ENTRIES);

    z->e = fy_calloc(mem, n ? (size_t)n : 1, sizeof *z->e);
    name_ref *refs = fy_calloc(mem, n ? (size_t)n : 1, sizeof *refs);
    z->sorted = fy_calloc(mem, n ? (size_t)n : 1, sizeof *z->sorted);
    int rc = 0;
    if (!z->e || !refs || !z->sorted) {
        rc = fy_seterr(err, -ENOMEM, "%s: out of memory for %" PRIu64 " zip entries", name, n);
        goto out;
    }
    z->n = n;
    z->cd_offset = cd_off;
    z->cd_size = cd_size;
    uint64_t p = cd_off, cd_end = cd_off + cd_size;
    for (uint64_t i = 0; i < n; i++) {
        if (cd_end - p < CENTRAL_LEN) {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: zip central directory ends after %" PRIu64 " of its %" PRIu64 " entries",
                           name, i, n);
            goto out;
        }
        if ((rc = read_entry(name, buf, p, cd_off, cd_end, i, &z->e[i], &p, err)) < 0) goto out;
        refs[i].name = z->e[i].name;
        refs[i].len = z->e[i].name_len;
        refs[i].idx = i;
    }
    if (p != cd_end) {
        rc = fy_seterr(err, FERRY_E_CORRUPT,
                       "%s: zip central directory holds %" PRIu64 " bytes after its %" PRIu64 " entries",
                       name, cd_end - p, n);
        goto out;
    }
    qsort(refs, (size_t)n, sizeof *refs, cmp_name);
    for (uint64_t i = 0; i < n; i++) {
        z->sorted[i] = refs[i].idx;
        if (i && refs[i].len == refs[i - 1].len && memcmp(refs[i].name, refs[i - 1].name, refs[i].len) == 0) {
            char q[128];
            rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: zip entry %s appears twice in the central directory",
                           name, fy_zip_qname(q, sizeof q, &z->e[refs[i].idx]));
            goto out;
        }
    }
out:
    fy_free(mem, refs);
    if (rc < 0) fy_zip_free(z);
    return rc;
}
