/* SPDX-License-Identifier: Apache-2.0 */
/* spill.c - see spill.h. The file is carved into reserved and free ranges;
 * only the free ones are recorded, in a sorted array (a store holds at most a
 * few thousand spilled tensors, so linear best fit costs nothing next to the
 * write that follows it). */
#define _GNU_SOURCE
#include "spill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "common/ranges.h"
#include "io/io.h"

struct rs_spill {
    ferry_allocator mem;
    fy_err *err;
    char *dir;
    int fd;
    uint64_t size;     /* file size as we keep it: every byte below is free or reserved */
    uint64_t reserved; /* bytes in reserved ranges */
    uint64_t nlive;    /* reserved ranges not yet released */
    fy_ranges free;    /* the free ranges below size */
    bool holding;      /* rs_spill_hold: releases wait for rs_spill_flush to punch */
};

static const char *errtext(int rc)
{
    return ferry_strerror(rc);
}

/* Where O_TMPFILE is missing: a named file that lives only until the unlink
 * below. */
static int open_named_then_unlink(rs_spill *s, int *fd)
{
    size_t n = strlen(s->dir) + sizeof "/.ferry-spill-XXXXXX";
    char *path = fy_malloc(&s->mem, n);
    if (!path) return -ENOMEM;
    snprintf(path, n, "%s/.ferry-spill-XXXXXX", s->dir);
    int f = -1;
    int rc = fy_mkstemp(path, &f);
    if (rc == 0 && (rc = fy_unlink(path)) < 0) fy_close(f);
    fy_free(&s->mem, path);
    if (rc == 0) *fd = f;
    return rc;
}

int rs_spill_open(const char *dir, const ferry_allocator *mem, fy_err *err, rs_spill **out)
{
    if (out) *out = NULL;
    FY_RETURN_IF(!dir || !*dir || !out, err, FERRY_E_INVAL, "spill: no directory given");
    if (!mem) mem = fy_default_allocator();
    rs_spill *s = fy_calloc(mem, 1, sizeof *s);
    FY_RETURN_IF(!s, err, -ENOMEM, "%s: out of memory opening the spill file", dir);
    s->mem = *mem;
    s->err = err;
    s->fd = -1;
    s->dir = fy_strndup(mem, dir, strlen(dir));
    if (!s->dir) {
        rs_spill_close(s);
        return fy_seterr(err, -ENOMEM, "%s: out of memory opening the spill file", dir);
    }

    int fd = -1;
    int rc = fy_open_tmpfile(dir, &fd);
    if (rc == -EOPNOTSUPP || rc == -EISDIR) rc = open_named_then_unlink(s, &fd);
    if (rc < 0) {
        rs_spill_close(s);
        return fy_seterr(err, rc, "%s: cannot create the spill file there: %s", dir, errtext(rc));
    }
    s->fd = fd;

    long type = 0;
    rc = fy_fs_info(fd, NULL, &type);
    if (rc < 0) {
        rs_spill_close(s);
        return fy_seterr(err, rc, "%s: cannot query the spill directory's file system: %s", dir, errtext(rc));
    }
    if (type == FY_TMPFS_MAGIC || type == FY_RAMFS_MAGIC) {
        rs_spill_close(s);
        return fy_seterr(
            err, FERRY_E_INVAL,
            "%s: is on %s, whose pages are RAM: spilling there frees no memory; choose a directory on disk",
            dir, type == FY_TMPFS_MAGIC ? "tmpfs" : "ramfs");
    }
    *out = s;
    return 0;
}

void rs_spill_close(rs_spill *s)
{
    if (!s) return;
    fy_close(s->fd);
    ferry_allocator m = s->mem;
    fy_ranges_free(&s->free, &m);
    fy_free(&m, s->dir);
    fy_free(&m, s);
}

int rs_spill_fd(const rs_spill *s)
{
    return s ? s->fd : -1;
}
const char *rs_spill_dir(const rs_spill *s)
{
    return s ? s->dir : NULL;
}

void rs_spill_usage(const rs_spill *s, uint64_t *reserved, uint64_t *file_size)
{
    if (reserved) *reserved = s ? s->reserved : 0;
    if (file_size) *file_size = s ? s->size : 0;
}

int rs_spill_reserve(rs_spill *s, uint64_t len, uint64_t *off)
{
    if (!s || !off) return FERRY_E_INVAL;
    fy_err *err = s->err;
    uint64_t need;
    FY_RETURN_IF(len == 0, err, FERRY_E_INVAL, "%s: spill reservation of 0 bytes", s->dir);
    FY_RETURN_IF(fy_add_ovf(len, RS_SPILL_ALIGN - 1, &need) || need > (uint64_t)INT64_MAX, err, -EFBIG,
                 "%s: spill reservation of %llu bytes is larger than any file", s->dir,
                 (unsigned long long)len);
    need &= ~(uint64_t)(RS_SPILL_ALIGN - 1);

    /* Every live range may come back separately, each adding a free range;
     * one more for a tail that could not be cut off. */
    FY_RETURN_IF(fy_ranges_reserve(&s->free, &s->mem, s->nlive + 2) < 0, err, -ENOMEM,
                 "%s: out of memory reserving spill space", s->dir);

    /* Best fit among the free ranges, lowest offset on ties. */
    size_t best = fy_ranges_best(&s->free, need);
    bool grow = best == s->free.n;
    uint64_t at = grow ? s->size : s->free.v[best].off, end;
    FY_RETURN_IF(fy_add_ovf(at, need, &end) || end > (uint64_t)INT64_MAX, err, -EFBIG,
                 "%s: spill file would pass the largest file size", s->dir);

    /* Growing needs that many free blocks. A reused range may still hold its
     * blocks (releases deferred by rs_spill_hold) or may have been punched:
     * then fallocate itself says ENOSPC, and the range is punched again. */
    int rc;
    if (grow) {
        uint64_t avail = 0;
        rc = fy_fs_info(s->fd, &avail, NULL);
        if (rc < 0)
            return fy_seterr(err, rc, "%s: cannot query free space for the spill file: %s", s->dir,
                             errtext(rc));
        FY_RETURN_IF(avail < need, err, -ENOSPC,
                     "%s: no space to grow the spill file by %llu bytes: %llu bytes free on its file system",
                     s->dir, (unsigned long long)need, (unsigned long long)avail);
    }

    rc = fy_fallocate(s->fd, 0, at, need);
    if (rc < 0) {
        /* fallocate may have allocated part of the range before failing:
         * give those blocks back so that nothing stays reserved. */
        if (grow) (void)fy_ftruncate(s->fd, s->size);
        else (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, need);
        return fy_seterr(err, rc, "%s: cannot reserve %llu bytes in the spill file: %s", s->dir,
                         (unsigned long long)need, errtext(rc));
    }

    if (grow) {
        s->size = end;
    } else {
        fy_ranges_take(&s->free, best, need);
    }
    s->reserved += need;
    s->nlive++;
    *off = at;
    return 0;
}

int rs_spill_check_room(rs_spill *s, uint64_t bytes)
{
    if (!s) return FERRY_E_INVAL;
    uint64_t avail = 0;
    int rc = fy_fs_info(s->fd, &avail, NULL);
    if (rc < 0)
        return fy_seterr(s->err, rc, "%s: cannot query free space for the spill file: %s", s->dir,
                         errtext(rc));
    /* every byte below size is free or reserved */
    uint64_t kept = s->holding ? s->size - s->reserved : 0, have;
    if (fy_add_ovf(avail, kept, &have) || bytes <= have) return 0;
    if (kept)
        return fy_seterr(
            s->err, -ENOSPC,
            "%s: no space to spill: %llu bytes needed, %llu bytes free on its file system and at most "
            "%llu in the spill file's freed ranges",
            s->dir, (unsigned long long)bytes, (unsigned long long)avail, (unsigned long long)kept);
    return fy_seterr(s->err, -ENOSPC,
                     "%s: no space to spill: %llu bytes needed, %llu bytes free on its file system", s->dir,
                     (unsigned long long)bytes, (unsigned long long)avail);
}

/* A range as rs_spill_reserve gave it: rounds len up; false (and nothing to
 * do) for one that cannot have been reserved. */
static bool reserved_range(const rs_spill *s, uint64_t off, uint64_t *len, uint64_t *end)
{
    if (*len == 0 || fy_add_ovf(*len, RS_SPILL_ALIGN - 1, len)) return false;
    *len &= ~(uint64_t)(RS_SPILL_ALIGN - 1);
    return off % RS_SPILL_ALIGN == 0 && !fy_add_ovf(off, *len, end) && *end <= s->size && *len <= s->reserved;
}

void rs_spill_unreserve(rs_spill *s, uint64_t off, uint64_t len)
{
    uint64_t end;
    if (!s || !reserved_range(s, off, &len, &end)) return;
    /* A range that grew the file is at its end (the later ones are gone
     * already): cutting it off gives back its blocks and leaves the file as
     * it was before it grew. */
    if (end == s->size && fy_ftruncate(s->fd, off) == 0) {
        s->size = off;
        s->reserved -= len;
        if (s->nlive) s->nlive--;
        return;
    }
    /* A reused range: taken from the front of a free range, so giving it back
     * restores that range. (-ENOMEM cannot happen: reserve kept room.) */
    if (fy_ranges_give(&s->free, &s->mem, off, len) < 0) return;
    s->reserved -= len;
    if (s->nlive) s->nlive--;
    (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
}

void rs_spill_release(rs_spill *s, uint64_t off, uint64_t len)
{
    uint64_t end;
    if (!s || !reserved_range(s, off, &len, &end)) return;

    /* Overlapping a free range: not something we reserved. -ENOMEM: only
     * after a misuse (reserve keeps room for every live range); the range
     * stays reserved. */
    ptrdiff_t at = fy_ranges_give(&s->free, &s->mem, off, len);
    if (at < 0) return;
    s->reserved -= len;
    if (s->nlive) s->nlive--;

    if (s->holding) return; /* rs_spill_flush punches the merged ranges once */
    /* A free tail is cut off; if that fails its blocks are still punched. */
    const fy_range *r = &s->free.v[at];
    if ((size_t)at == s->free.n - 1 && r->off + r->len == s->size && fy_ftruncate(s->fd, r->off) == 0) {
        s->size = r->off;
        s->free.n--;
        return;
    }
    (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
}

void rs_spill_hold(rs_spill *s)
{
    if (s) s->holding = true;
}

void rs_spill_flush(rs_spill *s)
{
    if (!s || !s->holding) return;
    s->holding = false;
    const fy_range *last = s->free.n ? &s->free.v[s->free.n - 1] : NULL;
    if (last && last->off + last->len == s->size && fy_ftruncate(s->fd, last->off) == 0) {
        s->size = last->off;
        s->free.n--;
    }
    /* ranges punched before are holes already: punching them again is cheap */
    for (size_t i = 0; i < s->free.n; i++)
        (void)fy_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, s->free.v[i].off,
                           s->free.v[i].len);
}

int rs_spill_flush_take(rs_spill *s, fy_range **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!s || !s->holding || s->free.n == 0) return 0;
    fy_range *r = fy_calloc(&s->mem, s->free.n, sizeof *r);
    if (!r) return -ENOMEM; /* (still held: the next flush punches them) */
    memcpy(r, s->free.v, s->free.n * sizeof *r);
    *n = s->free.n;
    s->free.n = 0; /* (the list keeps its room: giving them back needs no more than before) */
    *out = r;
    return 0;
}

void rs_spill_punch(int fd, const fy_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        (void)fy_fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, r[i].off, r[i].len);
}

void rs_spill_flush_give(rs_spill *s, fy_range *r, size_t n)
{
    if (!s) return;
    bool released = s->free.n > 0; /* ranges released while these were punched: not punched yet */
    /* -ENOMEM (the list grew meanwhile and cannot grow more): that range's
     * file space stays unused until the file is closed; nothing is lost */
    for (size_t i = 0; i < n; i++) (void)fy_ranges_give(&s->free, &s->mem, r[i].off, r[i].len);
    const fy_range *last = s->free.n ? &s->free.v[s->free.n - 1] : NULL;
    if (last && last->off + last->len == s->size && fy_ftruncate(s->fd, last->off) == 0) {
        s->size = last->off;
        s->free.n--;
    }
    s->holding = released;
    fy_free(&s->mem, r);
}
