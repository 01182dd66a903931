/* spill.c - see spill.h. The file is carved into reserved and free ranges;
 * only the free ones are recorded, in a sorted array (a store holds at most a
 * few thousand spilled tensors, so linear best fit costs nothing next to the
 * write that follows it). */
#define _GNU_SOURCE
#include "spill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/io.h"

/* linux/magic.h */
#define FY_TMPFS_MAGIC 0x01021994L
#define FY_RAMFS_MAGIC 0x858458f6L

typedef struct spill_range {
    uint64_t off, len;
} spill_range;

struct fy_spill {
    ferry_allocator mem;
    fy_err *err;
    char *dir;
    int fd;
    uint64_t size;     /* file size as we keep it: every byte below is free or reserved */
    uint64_t reserved; /* bytes in reserved ranges */
    uint64_t nlive;    /* reserved ranges not yet released */
    spill_range *free; /* sorted by offset, never adjacent (merged), never empty */
    size_t nfree, capfree;
    bool holding;      /* fy_spill_hold: releases wait for fy_spill_flush to punch */
};

static const char *errtext(int rc) { return ferry_strerror(rc); }

/* Where O_TMPFILE is missing: a named file that lives only until the unlink
 * below. mkostemp is not in the fault table; it is the rare path. */
static int open_named_then_unlink(fy_spill *s, int *fd)
{
    size_t n = strlen(s->dir) + sizeof "/.ferry-spill-XXXXXX";
    char *path = fy_malloc(&s->mem, n);
    if (!path) return -ENOMEM;
    snprintf(path, n, "%s/.ferry-spill-XXXXXX", s->dir);
    int f = mkostemp(path, O_CLOEXEC);
    if (f < 0) {
        int rc = -errno;
        fy_free(&s->mem, path);
        return rc;
    }
    if (unlink(path) < 0) {
        int rc = -errno;
        close(f);
        fy_free(&s->mem, path);
        return rc;
    }
    fy_free(&s->mem, path);
    *fd = f;
    return 0;
}

int fy_spill_open(const char *dir, const ferry_allocator *mem, fy_err *err, fy_spill **out)
{
    if (out) *out = NULL;
    FY_RETURN_IF(!dir || !*dir || !out, err, FERRY_E_INVAL, "spill: no directory given");
    if (!mem) mem = fy_default_allocator();
    fy_spill *s = fy_calloc(mem, 1, sizeof *s);
    FY_RETURN_IF(!s, err, -ENOMEM, "%s: out of memory opening the spill file", dir);
    s->mem = *mem;
    s->err = err;
    s->fd = -1;
    s->dir = fy_strndup(mem, dir, strlen(dir));
    if (!s->dir) {
        fy_spill_close(s);
        return fy_seterr(err, -ENOMEM, "%s: out of memory opening the spill file", dir);
    }

    int fd = -1;
    int rc = fy_open_tmpfile(dir, &fd);
    if (rc == -EOPNOTSUPP || rc == -EISDIR) rc = open_named_then_unlink(s, &fd);
    if (rc < 0) {
        fy_spill_close(s);
        return fy_seterr(err, rc, "%s: cannot create the spill file there: %s", dir, errtext(rc));
    }
    s->fd = fd;

    long type = 0;
    rc = fy_fs_info(fd, NULL, &type);
    if (rc < 0) {
        fy_spill_close(s);
        return fy_seterr(err, rc, "%s: cannot query the spill directory's file system: %s", dir, errtext(rc));
    }
    if (type == FY_TMPFS_MAGIC || type == FY_RAMFS_MAGIC) {
        fy_spill_close(s);
        return fy_seterr(err, FERRY_E_INVAL,
                         "%s: is on %s, whose pages are RAM: spilling there frees no memory; choose a directory on disk",
                         dir, type == FY_TMPFS_MAGIC ? "tmpfs" : "ramfs");
    }
    *out = s;
    return 0;
}

void fy_spill_close(fy_spill *s)
{
    if (!s) return;
    fy_close(s->fd);
    ferry_allocator m = s->mem;
    fy_free(&m, s->free);
    fy_free(&m, s->dir);
    fy_free(&m, s);
}

int fy_spill_fd(const fy_spill *s) { return s ? s->fd : -1; }
const char *fy_spill_dir(const fy_spill *s) { return s ? s->dir : NULL; }

void fy_spill_usage(const fy_spill *s, uint64_t *reserved, uint64_t *file_size)
{
    if (reserved) *reserved = s ? s->reserved : 0;
    if (file_size) *file_size = s ? s->size : 0;
}

/* Room for want free ranges, so that release never has to allocate. */
static int ensure_cap(fy_spill *s, uint64_t want)
{
    if (want <= s->capfree) return 0;
    uint64_t cap = s->capfree ? s->capfree : 16, bytes;
    while (cap < want) cap *= 2;
    if (fy_mul_ovf(cap, sizeof *s->free, &bytes) || bytes > SIZE_MAX) return -ENOMEM;
    spill_range *p = fy_realloc(&s->mem, s->free, (size_t)bytes);
    if (!p) return -ENOMEM;
    s->free = p;
    s->capfree = (size_t)cap;
    return 0;
}

static void remove_at(fy_spill *s, size_t i)
{
    memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
    s->nfree--;
}

int fy_spill_reserve(fy_spill *s, uint64_t len, uint64_t *off)
{
    if (!s || !off) return FERRY_E_INVAL;
    fy_err *err = s->err;
    uint64_t need;
    FY_RETURN_IF(len == 0, err, FERRY_E_INVAL, "%s: spill reservation of 0 bytes", s->dir);
    FY_RETURN_IF(fy_add_ovf(len, FY_SPILL_ALIGN - 1, &need) || need > (uint64_t)INT64_MAX, err, -EFBIG,
                 "%s: spill reservation of %llu bytes is larger than any file", s->dir, (unsigned long long)len);
    need &= ~(uint64_t)(FY_SPILL_ALIGN - 1);

    /* Every live range may come back separately, each adding a free range;
     * one more for a tail that could not be cut off. */
    FY_RETURN_IF(ensure_cap(s, s->nlive + 2) < 0, err, -ENOMEM, "%s: out of memory reserving spill space", s->dir);

    /* Best fit among the free ranges, lowest offset on ties. */
    size_t best = s->nfree;
    for (size_t i = 0; i < s->nfree; i++)
        if (s->free[i].len >= need && (best == s->nfree || s->free[i].len < s->free[best].len)) best = i;
    bool grow = best == s->nfree;
    uint64_t at = grow ? s->size : s->free[best].off, end;
    FY_RETURN_IF(fy_add_ovf(at, need, &end) || end > (uint64_t)INT64_MAX, err, -EFBIG,
                 "%s: spill file would pass the largest file size", s->dir);

    /* Growing needs that many free blocks. A reused range may still hold its
     * blocks (releases deferred by fy_spill_hold) or may have been punched:
     * then fallocate itself says ENOSPC, and the range is punched again. */
    int rc;
    if (grow) {
        uint64_t avail = 0;
        rc = fy_fs_info(s->fd, &avail, NULL);
        if (rc < 0) return fy_seterr(err, rc, "%s: cannot query free space for the spill file: %s", s->dir, errtext(rc));
        FY_RETURN_IF(avail < need, err, -ENOSPC,
                     "%s: no space to spill: %llu bytes needed, %llu bytes free on its file system", s->dir,
                     (unsigned long long)need, (unsigned long long)avail);
    }

    rc = fy_fallocate(s->fd, 0, at, need);
    if (rc < 0) {
        /* fallocate may have allocated part of the range before failing:
         * give those blocks back so that nothing stays reserved. */
        if (grow)
            (void)fy_ftruncate(s->fd, s->size);
        else
            (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, need);
        return fy_seterr(err, rc, "%s: cannot reserve %llu bytes in the spill file: %s", s->dir,
                         (unsigned long long)need, errtext(rc));
    }

    if (grow) {
        s->size = end;
    } else {
        s->free[best].off += need;
        s->free[best].len -= need;
        if (s->free[best].len == 0) remove_at(s, best);
    }
    s->reserved += need;
    s->nlive++;
    *off = at;
    return 0;
}

void fy_spill_release(fy_spill *s, uint64_t off, uint64_t len)
{
    if (!s || len == 0) return;
    uint64_t end;
    if (fy_add_ovf(len, FY_SPILL_ALIGN - 1, &len)) return;
    len &= ~(uint64_t)(FY_SPILL_ALIGN - 1);
    if (off % FY_SPILL_ALIGN || fy_add_ovf(off, len, &end) || end > s->size || len > s->reserved) return;

    /* i: the first free range at or after off */
    size_t lo = 0, hi = s->nfree;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->free[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    size_t i = lo;
    bool prev = i > 0 && s->free[i - 1].off + s->free[i - 1].len >= off;
    bool next = i < s->nfree && s->free[i].off <= end;
    /* Overlapping a free range: not something we reserved. */
    if ((prev && s->free[i - 1].off + s->free[i - 1].len > off) || (next && s->free[i].off < end)) return;
    if (!prev && !next && ensure_cap(s, s->nfree + 1) < 0) return; /* only after a misuse; the range stays reserved */

    s->reserved -= len;
    if (s->nlive) s->nlive--;
    size_t at;
    if (prev && next) {
        s->free[i - 1].len += len + s->free[i].len;
        remove_at(s, i);
        at = i - 1;
    } else if (prev) {
        s->free[i - 1].len += len;
        at = i - 1;
    } else if (next) {
        s->free[i].off = off;
        s->free[i].len += len;
        at = i;
    } else {
        memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
        s->free[i] = (spill_range){off, len};
        s->nfree++;
        at = i;
    }

    if (s->holding) return; /* fy_spill_flush punches the merged ranges once */
    /* A free tail is cut off; if that fails its blocks are still punched. */
    if (at == s->nfree - 1 && s->free[at].off + s->free[at].len == s->size &&
        fy_ftruncate(s->fd, s->free[at].off) == 0) {
        s->size = s->free[at].off;
        s->nfree--;
        return;
    }
    (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
}

void fy_spill_hold(fy_spill *s)
{
    if (s) s->holding = true;
}

void fy_spill_flush(fy_spill *s)
{
    if (!s || !s->holding) return;
    s->holding = false;
    if (s->nfree && s->free[s->nfree - 1].off + s->free[s->nfree - 1].len == s->size &&
        fy_ftruncate(s->fd, s->free[s->nfree - 1].off) == 0) {
        s->size = s->free[s->nfree - 1].off;
        s->nfree--;
    }
    /* ranges punched before are holes already: punching them again is cheap */
    for (size_t i = 0; i < s->nfree; i++)
        (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, s->free[i].off, s->free[i].len);
}
