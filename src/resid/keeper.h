/* SPDX-License-Identifier: Apache-2.0 */
/* keeper.h - the store's keeper (ferry keep, docs/KEEPER.md) as a resource:
 * one connection shared by every thread of a store behind a lock of its own,
 * the identities of the checkpoint files it asks about, what it asked and
 * got, and how it gives up: any failure of the connection closes it,
 * records why, and the store reads checkpoints until a later call connects
 * again (a second after the failure, twice as late after each failed try, up
 * to 30 s). The keeper's lock is a leaf: nothing takes
 * another lock while holding it, and the store's lock is never held when it
 * is taken. Depends on common/, io/ and the keeper's client
 * (ferry_experimental.h). */
#ifndef FERRY_RS_KEEPER_H
#define FERRY_RS_KEEPER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/common.h"
#include "ferry_experimental.h"

/* One shard of a model's checkpoint as the keeper knows it: its identity,
 * taken from the descriptor the ferry_file reads (ferry_file_keep_identity)
 * once, and checked again (fstat and the path's inode, no read) at every
 * move that asks for its tensors; a change recomputes the digest. Guarded
 * by the keeper's lock. */
typedef struct rs_kfile {
    char *path; /* absolute; NULL until known */
    uint64_t size;
    int64_t mtime;
    uint64_t digest;
    bool known;       /* the fields above hold the identity */
    bool refused;     /* the last check failed (no path names it, or a replaced file): not asked */
    uint64_t checked; /* the batch that checked it last */
} rs_kfile;

/* Where a served tensor's bytes are. RS_KV_HOST: host memory (the keeper's
 * region mapped read-only), copied to the device by DMA. A keeper that
 * holds device memory would add a kind whose bytes are already on the
 * device (nothing copied); none is built. */
enum { RS_KV_NONE = 0, RS_KV_HOST = 1 };

/* A tensor asked of the keeper. The caller fills the first fields; a hit
 * fills the rest until rs_keeper_detach. */
typedef struct rs_kreq {
    rs_kfile *kf;
    const ferry_file *f;
    int shard;
    const char *name;
    uint32_t index; /* its index in f */
    uint64_t nbytes;
    int64_t tag;      /* the caller's */
    int kind;         /* RS_KV_*: NONE, a miss */
    const void *host; /* RS_KV_HOST: the bytes */
    void *map;
    uint64_t maplen;
    uint64_t entry, gen; /* the keeper's entry, attached on the connection of that generation */
    bool attached;       /* until rs_keeper_detach (kind stays: it was a hit) */
    bool asked;          /* rs_keeper_get asked for it, with its file's identity then: */
    uint64_t fsize, fdigest;
    int64_t fmtime; /* (a feed goes under that identity, and only if the file still has it) */
} rs_kreq;

typedef struct rs_keeper {
    pthread_mutex_t lock;
    const ferry_allocator *m;
    atomic_bool used; /* rs_keeper_use succeeded once (read without the lock) */
    ferry_keep *k;    /* NULL while down */
    char *socket;
    int timeout_ms;
    uint64_t gen;                /* the connection's generation: bumped each time one goes */
    uint64_t batch;              /* rs_keeper_get's calls, for rs_kfile.checked */
    double retry_at;             /* while down: no connection is tried before */
    double backoff;              /* the wait after the last failure (doubling while they follow each other) */
    ferry_store_keeper_stats st; /* counters (size, used and connected filled by rs_keeper_stats) */
} rs_keeper;

void rs_keeper_init(rs_keeper *kp, const ferry_allocator *m);
void rs_keeper_destroy(rs_keeper *kp);
/* Connect to the keeper at socket (NULL: the default) now, replacing any
 * other: 0, or -errno with the message in err[0..n-1] (nothing changed). */
int rs_keeper_use(rs_keeper *kp, const char *socket, int timeout_ms, char *err, size_t n);
static inline bool rs_keeper_used(rs_keeper *kp)
{
    return atomic_load(&kp->used);
}
/* The counters, and whether it is used and connected now. */
void rs_keeper_stats(rs_keeper *kp, ferry_store_keeper_stats *out);
/* Forget the identities of kf[0..n-1] (their paths freed). */
void rs_kfile_clear(rs_keeper *kp, rs_kfile *kf, int n);

/* Ask the keeper for r[0..n-1]: each file's identity checked first (a file
 * that changed is asked with its new identity, so the keeper drops what it
 * held of the old one: stale), then a GET per tensor whose file may be
 * asked. Hits are mapped (kind RS_KV_HOST) and stay attached until
 * rs_keeper_detach. Never fails: the misses are read from the checkpoint.
 * The number of hits. */
int64_t rs_keeper_get(rs_keeper *kp, rs_kreq *r, int64_t n);
/* Unmap the hits of r[0..n-1] and release their entries (they stay hits:
 * rs_keeper_feed skips them); served: their bytes were used (counted in
 * bytes_served). */
void rs_keeper_detach(rs_keeper *kp, rs_kreq *r, int64_t n, bool served);

/* Fill dst (r->nbytes) with r's bytes: 0 or < 0 (the entry is then not
 * committed). */
typedef int (*rs_kfill_fn)(void *arg, const rs_kreq *r, void *dst);
/* Feed the keeper the misses of r[0..n-1] (kind RS_KV_NONE) that
 * rs_keeper_get asked for, each under the identity its file had then: filled
 * by fill into the memory the keeper hands out, committed only when whole and
 * the file still has that size and mtime (fstat); stops at the first the
 * keeper refuses for room. Never fails the caller. */
void rs_keeper_feed(rs_keeper *kp, const rs_kreq *r, int64_t n, rs_kfill_fn fill, void *arg);

#endif
