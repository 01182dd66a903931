/* SPDX-License-Identifier: Apache-2.0 */
/* ferry_experimental.h - unsettled API: may change or go in any release.
 *
 * The keeper (docs/KEEPER.md): a daemon that holds tensor bytes in shareable
 * memory across client restarts and hands them out by passing file
 * descriptors over a Unix socket. Only the "sim" backend (memfd memory) is
 * built so far. */
#ifndef FERRY_EXPERIMENTAL_H
#define FERRY_EXPERIMENTAL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- identities -------------------------------------------------------- */

/* What a keeper entry is: a tensor (by name, or by index with an empty name)
 * of a checkpoint file as the client sees the file now. A GET whose
 * file_size, mtime_ns or header_digest differ from the entry's is a miss, and
 * the keeper drops the entry. path: absolute, at most 4096 bytes; tensor: at
 * most 1024 bytes; neither may hold a NUL. */
typedef struct ferry_keep_id {
    const char *path;
    const char *tensor; /* NULL or "" when named by index */
    uint32_t index;
    uint64_t file_size;
    int64_t mtime_ns;
    uint64_t header_digest; /* e.g. ferry_xxh3 of the file's header */
} ferry_keep_id;

/* Fill size, mtime (ns) and digest (XXH3-64 of the file's first
 * min(size, 1 MiB) bytes) for the file at path: 0 or -errno (-EINVAL for
 * anything but a regular file, -EIO when it shrinks while it is read). */
FERRY_API int ferry_keep_file_identity(const char *path, uint64_t *file_size, int64_t *mtime_ns,
                                       uint64_t *header_digest);

/* The same identity for shard i of an open file, taken from what f reads (its
 * descriptor) rather than from whatever a path names now: path (may be NULL:
 * not resolved or checked) receives the absolute path that names the shard
 * now, and the call fails with -ESTALE when no path does (the file was
 * removed, or another file was renamed over it since f was opened: f still
 * reads the old one, which must not be fed to the keeper under the new one's
 * identity). header_digest may be NULL (not computed: no read). 0, -ESTALE,
 * -ENAMETOOLONG (the path does not fit n), FERRY_E_INVAL or -errno; no
 * message is set. */
FERRY_API int ferry_file_keep_identity(const ferry_file *f, int i, char *path, size_t n, uint64_t *file_size,
                                       int64_t *mtime_ns, uint64_t *header_digest);

/* The default socket: $XDG_RUNTIME_DIR/ferry/keep.sock, else
 * /tmp/ferry-keep-UID/keep.sock. 0, or -ENAMETOOLONG when it does not fit n. */
FERRY_API int ferry_keep_default_socket(char *buf, size_t n);

/* ---- the daemon -------------------------------------------------------- */

typedef struct ferry_keep_opts {
    const char *socket; /* NULL: ferry_keep_default_socket */
    const char *device; /* "sim" or "sim:SIZE"; NULL: "sim". "cuda:N": not built yet */
    uint64_t budget;    /* bytes; 0: the sim SIZE, else half the host's available memory;
                           never above the host's available memory (cgroup-aware) */
    int stop_fd;        /* >= 0: the keeper stops when this becomes readable; -1: none */
    int handle_signals; /* nonzero: SIGTERM and SIGINT stop it (handlers restored after; one such
                           keeper per process at a time) */
} ferry_keep_opts;

/* Run the keeper in this thread until stopped (stop_fd, a signal): logs to
 * stderr. The socket's directory must be private (0700, ours) and is made so
 * where it is missing; a socket path longer than a socket address holds (107
 * bytes) is bound through a descriptor of that directory, as
 * /proc/self/fd/N/NAME (-ENAMETOOLONG when even that does not fit); a live
 * keeper on the socket is refused, a dead one's socket replaced. On return
 * the socket is unlinked and every entry freed.
 * 0 after a clean stop, or -errno with the reason in err[0..n-1]. */
FERRY_API int ferry_keep_serve(const ferry_keep_opts *opts, char *err, size_t n);

/* ---- the client -------------------------------------------------------- */

typedef struct ferry_keep ferry_keep;

/* Connect to the keeper at socket (NULL: the default; a path longer than a
 * socket address holds, 107 bytes, is reached through its directory as the
 * keeper binds it) and say HELLO (a listener running as another uid is
 * refused: -EPERM); every later call waits at most timeout_ms (0: 5000) for
 * an answer. 0, or -errno with a message naming the socket in err[0..n-1]. */
FERRY_API int ferry_keep_connect(const char *socket, int timeout_ms, ferry_keep **out, char *err, size_t n);
FERRY_API void ferry_keep_close(ferry_keep *k);
/* The last failed call's message (names the socket and the problem). */
FERRY_API const char *ferry_keep_errmsg(const ferry_keep *k);

/* Reserve an entry of nbytes: *fd (the caller's to close) is memory to write
 * the bytes into (mmap it shared, or pwrite), *entry its id. Invisible to GET
 * until committed; discarded if this connection closes first. 0 or -errno
 * (-ENOSPC: the budget cannot make room). */
FERRY_API int ferry_keep_put_begin(ferry_keep *k, const ferry_keep_id *id, uint64_t nbytes, int *fd,
                                   uint64_t *entry);
/* Make the entry visible; it replaces an entry of the same key, and drops the
 * file's entries of another size, mtime or digest. */
FERRY_API int ferry_keep_put_commit(ferry_keep *k, uint64_t entry);
/* 1: a hit, *fd (the caller's to close) holds the bytes at *offset, *nbytes
 * long, and the entry stays attached to this connection (never dropped to
 * make room) until ferry_keep_release or the connection closes. 0: a miss
 * (*stale = 1 when an entry of another file identity was there and was
 * dropped; stale may be NULL). -errno on error. */
FERRY_API int ferry_keep_get(ferry_keep *k, const ferry_keep_id *id, int *fd, uint64_t *offset,
                             uint64_t *nbytes, uint64_t *entry, int *stale);
FERRY_API int ferry_keep_release(ferry_keep *k, uint64_t entry);

enum { FERRY_KEEP_DROP_ENTRY = 0, FERRY_KEEP_DROP_FILE = 1, FERRY_KEEP_DROP_ALL = 2 };
/* Drop id's entry, every entry of id->path, or everything (id may be NULL):
 * the number dropped, or -errno. */
FERRY_API int ferry_keep_drop(ferry_keep *k, int scope, const ferry_keep_id *id);

typedef struct ferry_keep_entry_info {
    uint64_t id;
    const char *path;
    const char *tensor;
    uint32_t index;
    uint64_t nbytes;
    uint32_t attached; /* connections that have it attached now */
    uint64_t file_size;
    int64_t mtime_ns;
    uint64_t header_digest;
    uint64_t idle_ms; /* since it was last put or got */
} ferry_keep_entry_info;

typedef struct ferry_keep_client_info {
    int32_t pid;
    uint32_t uid;
    uint32_t attached; /* entries it has attached */
    uint32_t pending;  /* puts begun, not committed */
} ferry_keep_client_info;

typedef struct ferry_keep_status {
    const char *device;
    uint64_t budget;
    uint64_t used;          /* bytes of committed and pending entries */
    uint64_t pending_bytes; /* of which pending */
    uint32_t nentries;      /* committed entries */
    uint32_t npending;
    uint32_t nclients;                       /* connections, this one included */
    uint32_t listed_entries, listed_clients; /* as many as fit in one reply */
    ferry_keep_entry_info *entries;
    ferry_keep_client_info *clients;
} ferry_keep_status;

/* What the keeper holds now: *out (free with ferry_keep_status_free). */
FERRY_API int ferry_keep_status_get(ferry_keep *k, ferry_keep_status **out);
FERRY_API void ferry_keep_status_free(ferry_keep_status *s);

/* ---- the residency store with a keeper --------------------------------- */

/* From now on the store asks the keeper at socket (NULL: the default) for
 * each clean tensor it would read from a checkpoint, and feeds the keeper
 * the tensors it did read (docs/KEEPER.md, "The store and the keeper").
 * Connects at once: 0, or -errno with the message on the store (no keeper
 * running there: -ENOENT or -ECONNREFUSED); the store is then as it was.
 * timeout_ms bounds every wait for the keeper (0: 5000). A second call
 * replaces the first keeper. Dirty tensors are never fed nor served. A
 * keeper that fails later (killed, hung past the timeout, refusing) costs
 * the store only the cache: it reads its checkpoints, records the error
 * (ferry_store_get_keeper_stats) and connects again at a later move (a
 * second after the failure, twice as late after each failed try, up to
 * 30 s). No socket call or copy runs under the store's lock. */
FERRY_API int ferry_store_use_keeper(ferry_store *s, const char *socket, int timeout_ms);

typedef struct ferry_store_keeper_stats {
    uint32_t size;         /* sizeof(ferry_store_keeper_stats), set by the caller */
    int32_t used;          /* ferry_store_use_keeper succeeded once */
    int32_t connected;     /* connected now (0 after a failure, until a move connects again) */
    uint64_t bytes_served; /* tensor bytes the keeper served (not in ferry_store_stats.bytes_read) */
    uint64_t bytes_fed;    /* tensor bytes committed to the keeper */
    uint64_t hits, misses; /* tensors asked for */
    uint64_t stale;        /* of the misses: the keeper held the tensor for another file identity */
    uint64_t refused;      /* feeds the keeper refused for room (its budget held by attached entries) */
    uint64_t errors;       /* connections lost or refused: each time the store went on without it */
    uint64_t connects;     /* connections made (the first, and each after an error) */
    char last_error[256];  /* the last error's message ("" before any) */
} ferry_store_keeper_stats;

/* What the store got from its keeper so far. 0 or FERRY_E_INVAL. */
FERRY_API int ferry_store_get_keeper_stats(ferry_store *s, ferry_store_keeper_stats *out);

#ifdef __cplusplus
}
#endif
#endif
