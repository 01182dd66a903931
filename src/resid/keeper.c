/* SPDX-License-Identifier: Apache-2.0 */
/* keeper.c - the store's keeper connection (keeper.h): identities, GETs and
 * their attachments, feeding, and going on without the keeper when it fails.
 * Every socket call runs under the keeper's lock alone; the copies (mapping
 * the keeper's memory, filling it) run with no lock held. */
#define _GNU_SOURCE
#include "keeper.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/io.h"

#define KEEP_PATH_MAX 4096u /* the protocol's longest path and tensor name (docs/KEEPER.md) */
#define KEEP_NAME_MAX 1024u
#define RETRY_S 1.0      /* after a failure, the next connection is tried no sooner, */
#define RETRY_MAX_S 30.0 /* and twice as late after each failed try, up to this */

void rs_keeper_init(rs_keeper *kp, const ferry_allocator *m)
{
    memset(kp, 0, sizeof *kp);
    pthread_mutex_init(&kp->lock, NULL);
    kp->m = m;
    atomic_init(&kp->used, false);
}

void rs_keeper_destroy(rs_keeper *kp)
{
    ferry_keep_close(kp->k);
    fy_free(kp->m, kp->socket);
    pthread_mutex_destroy(&kp->lock);
}

/* The connection failed (message msg, which may be the connection's own:
 * kept before it is closed): close it (its attachments and pending entries
 * go with it on the keeper's side), record why, and wait before the next
 * try. Under kp->lock. */
static void down(rs_keeper *kp, const char *msg)
{
    size_t l = strnlen(msg, sizeof kp->st.last_error - 1); /* (cut to fit) */
    memmove(kp->st.last_error, msg, l);
    kp->st.last_error[l] = '\0';
    ferry_keep_close(kp->k);
    kp->k = NULL;
    kp->gen++;
    kp->st.errors++;
    kp->backoff = kp->backoff > 0 ? (2 * kp->backoff < RETRY_MAX_S ? 2 * kp->backoff : RETRY_MAX_S) : RETRY_S;
    kp->retry_at = fy_now() + kp->backoff;
}

/* A connection, made now where there is none and the wait is over; NULL
 * while down. Under kp->lock. */
static ferry_keep *up(rs_keeper *kp)
{
    if (kp->k || !kp->socket || fy_now() < kp->retry_at) return kp->k;
    char err[512];
    if (ferry_keep_connect(kp->socket, kp->timeout_ms, &kp->k, err, sizeof err) < 0) {
        kp->k = NULL;
        down(kp, err);
        return NULL;
    }
    kp->st.connects++;
    kp->backoff = 0; /* (a keeper that answers again starts the pace over) */
    return kp->k;
}

int rs_keeper_use(rs_keeper *kp, const char *socket, int timeout_ms, char *err, size_t n)
{
    char def[256];
    if (!socket) {
        if (ferry_keep_default_socket(def, sizeof def) < 0) {
            snprintf(err, n, "ferry keep: the default socket path is too long");
            return -ENAMETOOLONG;
        }
        socket = def;
    }
    char *copy = fy_strndup(kp->m, socket, strlen(socket));
    if (!copy) {
        snprintf(err, n, "ferry keep: out of memory");
        return -ENOMEM;
    }
    ferry_keep *k = NULL;
    int rc =
        ferry_keep_connect(socket, timeout_ms, &k, err, n); /* (before the lock: others go on meanwhile) */
    if (rc < 0) {
        fy_free(kp->m, copy);
        return rc;
    }
    pthread_mutex_lock(&kp->lock);
    ferry_keep_close(kp->k);
    kp->k = k;
    kp->gen++;
    fy_free(kp->m, kp->socket);
    kp->socket = copy;
    kp->timeout_ms = timeout_ms;
    kp->retry_at = 0;
    kp->backoff = 0;
    kp->st.connects++;
    atomic_store(&kp->used, true);
    pthread_mutex_unlock(&kp->lock);
    return 0;
}

void rs_keeper_stats(rs_keeper *kp, ferry_store_keeper_stats *out)
{
    pthread_mutex_lock(&kp->lock);
    *out = kp->st;
    out->size = sizeof *out;
    out->used = rs_keeper_used(kp);
    out->connected = kp->k != NULL;
    pthread_mutex_unlock(&kp->lock);
}

void rs_kfile_clear(rs_keeper *kp, rs_kfile *kf, int n)
{
    for (int i = 0; kf && i < n; i++) {
        fy_free(kp->m, kf[i].path);
        memset(&kf[i], 0, sizeof kf[i]);
    }
}

/* Check r's file's identity once per batch (under kp->lock): whether it may
 * be asked for, with its identity in kf. */
static bool file_ok(rs_keeper *kp, const rs_kreq *r)
{
    rs_kfile *kf = r->kf;
    if (kf->checked == kp->batch) return !kf->refused;
    kf->checked = kp->batch;
    char path[KEEP_PATH_MAX + 1];
    uint64_t size = 0, digest = 0;
    int64_t mtime = 0;
    int rc = ferry_file_keep_identity(r->f, r->shard, path, sizeof path, &size, &mtime, NULL);
    if (rc == 0 && !(kf->known && kf->size == size && kf->mtime == mtime && strcmp(kf->path, path) == 0)) {
        /* first asked, or changed: the digest too (a read of its head) */
        rc = ferry_file_keep_identity(r->f, r->shard, NULL, 0, &size, &mtime, &digest);
        char *p = rc == 0 ? fy_strndup(kp->m, path, strlen(path)) : NULL;
        if (rc == 0 && !p) rc = -ENOMEM;
        if (rc == 0) {
            fy_free(kp->m, kf->path);
            kf->path = p;
            kf->size = size, kf->mtime = mtime, kf->digest = digest;
            kf->known = true;
        }
    }
    kf->refused = rc < 0;
    return rc == 0;
}

/* r's keeper id, with the identity its file had when it was asked for. */
static ferry_keep_id ident_of(const rs_kreq *r)
{
    ferry_keep_id id = {r->kf->path, r->name, r->index, r->fsize, r->fmtime, r->fdigest};
    return id;
}

/* Errors of the request itself (a name the protocol cannot carry, memory)
 * leave the connection as it is; any other means it is gone. */
static bool local_error(int rc)
{
    return rc == -EINVAL || rc == -ENOMEM;
}

int64_t rs_keeper_get(rs_keeper *kp, rs_kreq *r, int64_t n)
{
    for (int64_t i = 0; i < n; i++) r[i].kind = RS_KV_NONE, r[i].attached = r[i].asked = false;
    int64_t hits = 0;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pg = page > 0 ? (uint64_t)page : 4096;
    pthread_mutex_lock(&kp->lock);
    kp->batch++;
    for (int64_t i = 0; i < n && up(kp); i++) {
        if (!file_ok(kp, &r[i]) || !r[i].name || strlen(r[i].name) > KEEP_NAME_MAX) continue;
        r[i].asked = true;
        r[i].fsize = r[i].kf->size, r[i].fmtime = r[i].kf->mtime, r[i].fdigest = r[i].kf->digest;
        ferry_keep_id id = ident_of(&r[i]);
        int fd = -1, stale = 0;
        uint64_t off = 0, nb = 0, entry = 0;
        int rc = ferry_keep_get(kp->k, &id, &fd, &off, &nb, &entry, &stale);
        if (rc < 0) {
            if (!local_error(rc)) down(kp, ferry_keep_errmsg(kp->k));
            continue;
        }
        if (rc == 0) {
            kp->st.misses++;
            kp->st.stale += stale != 0;
            continue;
        }
        /* a hit: attached to this connection until released */
        uint64_t skew = off % pg;
        void *map = NULL;
        if (nb == r[i].nbytes && fy_map_at(fd, off - skew, skew + nb, false, &map) == 0) {
            r[i].kind = RS_KV_HOST;
            r[i].map = map;
            r[i].maplen = skew + nb;
            r[i].host = (const uint8_t *)map + skew;
            r[i].entry = entry;
            r[i].gen = kp->gen;
            r[i].attached = true;
            kp->st.hits++;
            hits++;
        } else { /* another size than the checkpoint's, or no mapping: read the file instead */
            kp->st.misses++;
            if (ferry_keep_release(kp->k, entry) < 0) down(kp, ferry_keep_errmsg(kp->k));
        }
        fy_close(fd);
    }
    pthread_mutex_unlock(&kp->lock);
    return hits;
}

void rs_keeper_detach(rs_keeper *kp, rs_kreq *r, int64_t n, bool served)
{
    bool any = false;
    for (int64_t i = 0; i < n; i++)
        if (r[i].attached) {
            fy_unmap(r[i].map, r[i].maplen);
            r[i].map = NULL;
            r[i].host = NULL;
            any = true;
        }
    if (!any) return;
    pthread_mutex_lock(&kp->lock);
    for (int64_t i = 0; i < n; i++) {
        if (!r[i].attached) continue;
        r[i].attached = false;
        if (served) kp->st.bytes_served += r[i].nbytes;
        /* (a connection that went since has released it already) */
        if (kp->k && r[i].gen == kp->gen && ferry_keep_release(kp->k, r[i].entry) < 0)
            down(kp, ferry_keep_errmsg(kp->k));
    }
    pthread_mutex_unlock(&kp->lock);
}

/* Put r: 0 fed, 1 not (skipped, the connection lost or the file changed),
 * -ENOSPC refused for room. */
static int feed_one(rs_keeper *kp, const rs_kreq *r, rs_kfill_fn fill, void *arg)
{
    pthread_mutex_lock(&kp->lock);
    if (!r->asked || !up(kp)) {
        pthread_mutex_unlock(&kp->lock);
        return 1;
    }
    ferry_keep_id id = ident_of(r);
    uint64_t size = id.file_size, gen = kp->gen, entry = 0;
    int64_t mtime = id.mtime_ns;
    int fd = -1;
    int rc = ferry_keep_put_begin(kp->k, &id, r->nbytes, &fd, &entry);
    if (rc == -ENOSPC) kp->st.refused++;
    else if (rc < 0 && !local_error(rc)) down(kp, ferry_keep_errmsg(kp->k));
    pthread_mutex_unlock(&kp->lock);
    if (rc < 0) return rc == -ENOSPC ? rc : 1;
    /* fill it with no lock held: the entry is pending, this connection's */
    void *p = NULL;
    rc = fy_map_at(fd, 0, r->nbytes, true, &p);
    fy_close(fd);
    if (rc == 0) {
        rc = fill(arg, r, p);
        fy_unmap(p, r->nbytes);
    }
    /* the bytes are the file's as identified only if it did not change while they were read */
    uint64_t size2 = 0;
    int64_t mtime2 = 0;
    if (rc == 0 && (ferry_file_keep_identity(r->f, r->shard, NULL, 0, &size2, &mtime2, NULL) < 0 ||
                    size2 != size || mtime2 != mtime))
        rc = -ESTALE;
    pthread_mutex_lock(&kp->lock);
    if (kp->k && kp->gen == gen) {
        if (rc < 0) {
            /* a pending entry cannot be taken back but by closing its
             * connection: a new one is made at once (not an error of the
             * keeper's) */
            ferry_keep_close(kp->k);
            kp->k = NULL;
            kp->gen++;
        } else if ((rc = ferry_keep_put_commit(kp->k, entry)) < 0) {
            down(kp, ferry_keep_errmsg(kp->k));
        } else {
            kp->st.bytes_fed += r->nbytes;
        }
    }
    pthread_mutex_unlock(&kp->lock);
    return rc == 0 ? 0 : 1;
}

void rs_keeper_feed(rs_keeper *kp, const rs_kreq *r, int64_t n, rs_kfill_fn fill, void *arg)
{
    for (int64_t i = 0; i < n; i++) {
        if (r[i].kind != RS_KV_NONE || r[i].nbytes == 0) continue;
        if (feed_one(kp, &r[i], fill, arg) == -ENOSPC) break; /* the rest would not fit either */
    }
}
