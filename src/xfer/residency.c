/* residency.c - how much of a checkpoint is in the page cache (mincore):
 * exactly for the caller, sampled for auto's choice of path. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xfer_impl.h"

/* ---- residency ---- */

FERRY_API double ferry_file_resident(const ferry_file *f)
{
    if (!f) return -1.0;
    if (f->total == 0) return 1.0;
    uint64_t in = 0, all = 0;
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), per = 1u << 18; /* pages per mincore call */
    unsigned char *vec = fy_malloc(&f->ctx->mem, per);
    if (!vec) return -1.0; /* unknown */
    for (int32_t s = 0; s < f->nshards; s++) {
        const shard *sh = &f->shards[s];
        if (!sh->map) continue;
        for (uint64_t off = 0; off < sh->size; off += per * pg) {
            uint64_t len = sh->size - off;
            if (len > per * pg) len = per * pg;
            if (fy_mincore((char *)sh->map + off, (size_t)len, vec) < 0) continue;
            uint64_t pages = (len + pg - 1) / pg;
            for (uint64_t p = 0; p < pages; p++) in += vec[p] & 1;
            all += pages;
        }
    }
    fy_free(&f->ctx->mem, vec);
    return all ? (double)in / (double)all : 1.0;
}

/* auto's estimate: mincore on 4096 pages spread evenly over the data. A
 * mincore of every page of a 10 GB file (2.5 M page-cache lookups) took
 * ~0.12 s on the H200 host, a third of a hot load; a sample decides as well. */
double xf_resident_sampled(const ferry_file *f)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t pages = 0;
    for (int32_t s = 0; s < f->nshards; s++)
        if (f->shards[s].map) pages += (f->shards[s].size + pg - 1) / pg;
    if (pages == 0) return 1.0;
    const uint64_t want = pages < 4096 ? pages : 4096;
    uint64_t in = 0, seen = 0;
    for (uint64_t k = 0; k < want; k++) {
        uint64_t page = k * pages / want; /* global page index -> shard */
        for (int32_t s = 0; s < f->nshards; s++) {
            const shard *sh = &f->shards[s];
            if (!sh->map) continue;
            uint64_t np = (sh->size + pg - 1) / pg;
            if (page >= np) {
                page -= np;
                continue;
            }
            unsigned char v = 0;
            if (fy_mincore((char *)sh->map + page * pg, 1, &v) == 0) {
                in += v & 1;
                seen++;
            }
            break;
        }
    }
    return seen ? (double)in / (double)seen : -1.0;
}

