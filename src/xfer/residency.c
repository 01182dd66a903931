/* SPDX-License-Identifier: Apache-2.0 */
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

/* auto's estimate: mincore on 64 runs of 64 pages spread evenly over the
 * data, one call per run. A mincore of every page of a 10 GB file (2.5 M
 * page-cache lookups) took ~0.12 s on the H200 host, a third of a hot load;
 * 4096 pages sampled one call each took 3.3 ms for a 26 MB file and 4.4 ms
 * for 10 GB (the call's entry, not the lookup, is the cost): as much as the
 * small file's whole copy. Runs sample as well and cost 64 calls. */
double xf_resident_sampled(const ferry_file *f)
{
    enum { RUN = 64, RUNS = 64 };
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t pages = 0;
    for (int32_t s = 0; s < f->nshards; s++)
        if (f->shards[s].map) pages += (f->shards[s].size + pg - 1) / pg;
    if (pages == 0) return 1.0;
    uint64_t runs = (pages + RUN - 1) / RUN;
    if (runs > RUNS) runs = RUNS;
    uint64_t in = 0, seen = 0;
    unsigned char vec[RUN];
    for (uint64_t k = 0; k < runs; k++) {
        /* the run's first page: runs evenly spread, the last one ending at the last page */
        uint64_t page = runs > 1 ? k * (pages - (pages < RUN ? pages : RUN)) / (runs - 1) : 0;
        for (int32_t s = 0; s < f->nshards; s++) {
            const shard *sh = &f->shards[s];
            if (!sh->map) continue;
            uint64_t np = (sh->size + pg - 1) / pg;
            if (page >= np) {
                page -= np;
                continue;
            }
            uint64_t n = np - page < RUN ? np - page : RUN; /* a run stops at its shard's end */
            if (fy_mincore((char *)sh->map + page * pg, (size_t)(n * pg), vec) == 0) {
                for (uint64_t q = 0; q < n; q++) in += vec[q] & 1;
                seen += n;
            }
            break;
        }
    }
    return seen ? (double)in / (double)seen : -1.0;
}
