/* SPDX-License-Identifier: Apache-2.0 */
/* keep_daemon.c - the keeper: one thread, one poll loop, many clients.
 *
 * It holds entries (one backend region each) and hands out their file
 * descriptors; it never reads or computes on the bytes. State:
 *  - entries: a list; a pending entry (PUT_BEGIN'd, not committed) belongs to
 *    its writer's connection, is invisible to GET and is freed when that
 *    connection closes; a committed one is found by its key (path, tensor
 *    name, index) and served only while the client's file identity (size,
 *    mtime, header digest) is the entry's.
 *  - budget: used = the bytes of every entry, pending ones included. A
 *    PUT_BEGIN that does not fit drops committed entries, least recently used
 *    first, skipping those a connection has attached (a GET attaches until
 *    RELEASE or the connection closes); if that is not enough it is refused
 *    with ENOSPC.
 *  - an entry dropped while attached (DROP, stale, replaced) leaves the
 *    keeper's books at once; its memory lives on while clients hold its fd or
 *    a mapping of it.
 * The lookups are linear scans over the entries: fine for thousands; an index
 * is for later. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "io/memstat.h"
#include "keep.h"
#include "keep_backend.h"
#include "keep_proto.h"

#define MAX_CLIENTS 256
#define MAX_PENDING_PER_CLIENT 64
#define SEND_TIMEOUT_MS 2000

typedef struct entry {
    struct entry *next;
    uint64_t id;
    char *path, *tensor;
    uint32_t index;
    uint64_t file_size;
    int64_t mtime_ns;
    uint64_t digest;
    uint64_t nbytes;
    int fd;
    bool committed;
    int owner;         /* pending: the writer's connection slot */
    uint32_t attached; /* connections that have it attached */
    double last_use;
} entry;

typedef struct conn {
    int fd; /* -1: a free slot */
    pid_t pid;
    uid_t uid;
    uint8_t *in;
    size_t inlen;
    uint64_t *att; /* attached entry ids (one per GET hit, released one by one) */
    size_t natt, catt;
    uint32_t npending;
} conn;

typedef struct keeper {
    const fk_backend *be;
    char device[FKP_MAX_DEVICE + 1];
    char sock[FK_SOCK_PATH_MAX + 1];
    uint64_t budget, used, pending_bytes;
    uint32_t nentries, npending;
    uint64_t next_id;
    entry *entries;
    conn conns[MAX_CLIENTS];
    uid_t uid;
    uint8_t *out; /* one reply at a time */
} keeper;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    char buf[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ferry keep: %s\n", buf);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *human(char *b, size_t n, uint64_t v)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)v;
    int i = 0;
    while (x >= 1024 && i < 4) {
        x /= 1024;
        i++;
    }
    if (i == 0) snprintf(b, n, "%" PRIu64 " B", v);
    else snprintf(b, n, "%.2f %s", x, u[i]);
    return b;
}

/* ---- entries ------------------------------------------------------------ */

static void entry_free(keeper *k, entry *e)
{
    k->used -= e->nbytes;
    if (e->committed) k->nentries--;
    else {
        k->npending--;
        k->pending_bytes -= e->nbytes;
        if (e->owner >= 0 && k->conns[e->owner].npending) k->conns[e->owner].npending--;
    }
    k->be->release(e->fd);
    free(e->path);
    free(e->tensor);
    free(e);
}

/* Unlink e from the list and free it. */
static void entry_drop(keeper *k, entry *e)
{
    for (entry **p = &k->entries; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    entry_free(k, e);
}

static bool same_key(const entry *e, const fkp_ident *id)
{
    return e->index == id->index && strcmp(e->path, id->path) == 0 && strcmp(e->tensor, id->tensor) == 0;
}

static bool same_file(const entry *e, const fkp_ident *id)
{
    return e->file_size == id->file_size && e->mtime_ns == id->mtime_ns && e->digest == id->digest;
}

static entry *find_committed(keeper *k, const fkp_ident *id)
{
    for (entry *e = k->entries; e; e = e->next)
        if (e->committed && same_key(e, id)) return e;
    return NULL;
}

static entry *find_id(keeper *k, uint64_t id)
{
    for (entry *e = k->entries; e; e = e->next)
        if (e->id == id) return e;
    return NULL;
}

/* Drop least-recently-used committed, unattached entries until need more
 * bytes fit: true when they do. */
static bool make_room(keeper *k, uint64_t need)
{
    while (k->budget - k->used < need) {
        entry *lru = NULL;
        for (entry *e = k->entries; e; e = e->next)
            if (e->committed && e->attached == 0 && (!lru || e->last_use < lru->last_use)) lru = e;
        if (!lru) return false;
        char h[32];
        logf_("dropped %s [%s#%u] (%s, least recently used) to make room", lru->path, lru->tensor, lru->index,
              human(h, sizeof h, lru->nbytes));
        entry_drop(k, lru);
    }
    return true;
}

/* ---- connections -------------------------------------------------------- */

static void conn_close(keeper *k, int slot, const char *why)
{
    conn *c = &k->conns[slot];
    if (c->fd < 0) return;
    /* pending entries die with their writer; attachments end */
    entry **p = &k->entries;
    uint32_t discarded = 0;
    while (*p) {
        entry *e = *p;
        if (!e->committed && e->owner == slot) {
            *p = e->next;
            entry_free(k, e);
            discarded++;
        } else p = &e->next;
    }
    for (size_t i = 0; i < c->natt; i++) {
        entry *e = find_id(k, c->att[i]);
        if (e && e->attached) e->attached--;
    }
    if (why || discarded) /* (a client gone mid-put is worth a line even when it left cleanly) */
        logf_("client pid %d: %s%s", (int)c->pid, why ? why : "disconnected",
              discarded ? " (its unfinished puts discarded)" : "");
    close(c->fd);
    free(c->in);
    free(c->att);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

/* Send len bytes of k->out (and fd, if >= 0): 0, or -1 after closing the
 * connection. */
static int send_reply(keeper *k, int slot, size_t len, int fd)
{
    conn *c = &k->conns[slot];
    size_t off = 0;
    while (off < len) {
        struct iovec iov = {k->out + off, len - off};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } cm;
        if (fd >= 0 && off == 0) {
            memset(&cm, 0, sizeof cm);
            mh.msg_control = cm.buf;
            mh.msg_controllen = sizeof cm.buf;
            struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
            ch->cmsg_level = SOL_SOCKET;
            ch->cmsg_type = SCM_RIGHTS;
            ch->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(ch), &fd, sizeof fd);
        }
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            conn_close(k, slot,
                       errno == EAGAIN ? "not reading its replies: disconnected" : "gone while answered");
            return -1;
        }
        off += (size_t)w;
    }
    return 0;
}

static int reply(keeper *k, int slot, const fkp_msg *m, int fd)
{
    int len = fkp_encode(m, k->out, FKP_HDR + FKP_MAX_BODY);
    if (len < 0) { /* a message the keeper made itself: cannot happen */
        conn_close(k, slot, "internal error encoding a reply");
        return -1;
    }
    return send_reply(k, slot, (size_t)len, fd);
}

static int reply_error(keeper *k, int slot, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int reply_error(keeper *k, int slot, int code, const char *fmt, ...)
{
    fkp_msg m;
    memset(&m, 0, sizeof m);
    m.type = FKP_ERROR;
    m.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof m.text, fmt, ap);
    va_end(ap);
    return reply(k, slot, &m, -1);
}

static int reply_simple(keeper *k, int slot, uint16_t type)
{
    fkp_msg m;
    memset(&m, 0, sizeof m);
    m.type = type;
    return reply(k, slot, &m, -1);
}

/* ---- requests ----------------------------------------------------------- */

static int do_put_begin(keeper *k, int slot, const fkp_msg *q)
{
    conn *c = &k->conns[slot];
    char h1[32], h2[32], h3[32];
    if (c->npending >= MAX_PENDING_PER_CLIENT)
        return reply_error(k, slot, EMFILE, "at most %d unfinished puts per connection",
                           MAX_PENDING_PER_CLIENT);
    if (q->nbytes > k->budget)
        return reply_error(k, slot, ENOSPC, "%s does not fit the keeper's budget of %s",
                           human(h1, sizeof h1, q->nbytes), human(h2, sizeof h2, k->budget));
    if (!make_room(k, q->nbytes)) {
        uint64_t att = 0;
        for (entry *e = k->entries; e; e = e->next)
            if (!e->committed || e->attached) att += e->nbytes;
        return reply_error(
            k, slot, ENOSPC, "no room for %s: budget %s, %s held by attached or unfinished entries",
            human(h1, sizeof h1, q->nbytes), human(h2, sizeof h2, k->budget), human(h3, sizeof h3, att));
    }
    entry *e = calloc(1, sizeof *e);
    if (e) {
        e->path = strdup(q->id.path);
        e->tensor = strdup(q->id.tensor);
    }
    if (!e || !e->path || !e->tensor) {
        if (e) {
            free(e->path);
            free(e->tensor);
            free(e);
        }
        return reply_error(k, slot, ENOMEM, "out of memory");
    }
    char err[256];
    int rc = k->be->alloc(q->nbytes, "ferry-keep", &e->fd, err, sizeof err);
    if (rc < 0) {
        free(e->path);
        free(e->tensor);
        free(e);
        logf_("client pid %d: put of %s failed: %s", (int)c->pid, human(h1, sizeof h1, q->nbytes), err);
        return reply_error(k, slot, -rc, "%s", err);
    }
    e->id = ++k->next_id;
    e->index = q->id.index;
    e->file_size = q->id.file_size;
    e->mtime_ns = q->id.mtime_ns;
    e->digest = q->id.digest;
    e->nbytes = q->nbytes;
    e->owner = slot;
    e->last_use = now_s();
    e->next = k->entries;
    k->entries = e;
    k->used += e->nbytes;
    k->pending_bytes += e->nbytes;
    k->npending++;
    c->npending++;
    fkp_msg m;
    memset(&m, 0, sizeof m);
    m.type = FKP_PUT_READY;
    m.entry = e->id;
    m.nbytes = e->nbytes;
    return reply(k, slot, &m, e->fd);
}

static int do_commit(keeper *k, int slot, uint64_t id)
{
    entry *e = find_id(k, id);
    if (!e || e->committed || e->owner != slot)
        return reply_error(k, slot, ENOENT, "no unfinished put %" PRIu64 " of this connection", id);
    /* an older entry of the key goes, and so does every entry of the same
     * path made from another version of the file */
    entry **p = &k->entries;
    while (*p) {
        entry *o = *p;
        bool replaced = o->index == e->index && strcmp(o->tensor, e->tensor) == 0;
        bool stale = o->file_size != e->file_size || o->mtime_ns != e->mtime_ns || o->digest != e->digest;
        if (o != e && o->committed && strcmp(o->path, e->path) == 0 && (replaced || stale)) {
            *p = o->next;
            entry_free(k, o);
        } else p = &o->next;
    }
    k->be->commit(e->fd);
    e->committed = true;
    e->owner = -1;
    e->last_use = now_s();
    k->npending--;
    k->pending_bytes -= e->nbytes;
    k->nentries++;
    k->conns[slot].npending--;
    return reply_simple(k, slot, FKP_OK);
}

static int do_get(keeper *k, int slot, const fkp_ident *id)
{
    conn *c = &k->conns[slot];
    entry *e = find_committed(k, id);
    fkp_msg m;
    memset(&m, 0, sizeof m);
    if (!e) {
        m.type = FKP_MISS;
        m.reason = FKP_MISS_ABSENT;
        return reply(k, slot, &m, -1);
    }
    if (!same_file(e, id)) {
        logf_("%s changed (size, mtime or header): its entries are dropped", e->path);
        /* every entry of the old version of this file */
        entry **p = &k->entries;
        while (*p) {
            entry *o = *p;
            if (o->committed && strcmp(o->path, id->path) == 0 && !same_file(o, id)) {
                *p = o->next;
                entry_free(k, o);
            } else p = &o->next;
        }
        m.type = FKP_MISS;
        m.reason = FKP_MISS_STALE;
        return reply(k, slot, &m, -1);
    }
    if (c->natt == c->catt) {
        size_t nc = c->catt ? c->catt * 2 : 16;
        uint64_t *a = realloc(c->att, nc * sizeof *a);
        if (!a) return reply_error(k, slot, ENOMEM, "out of memory");
        c->att = a;
        c->catt = nc;
    }
    c->att[c->natt++] = e->id;
    e->attached++;
    e->last_use = now_s();
    m.type = FKP_HIT;
    m.entry = e->id;
    m.offset = 0;
    m.nbytes = e->nbytes;
    return reply(k, slot, &m, e->fd);
}

static int do_release(keeper *k, int slot, uint64_t id)
{
    conn *c = &k->conns[slot];
    for (size_t i = 0; i < c->natt; i++)
        if (c->att[i] == id) {
            c->att[i] = c->att[--c->natt];
            entry *e = find_id(k, id);
            if (e && e->attached) e->attached--;
            return reply_simple(k, slot, FKP_OK);
        }
    return reply_error(k, slot, ENOENT, "entry %" PRIu64 " is not attached to this connection", id);
}

static int do_drop(keeper *k, int slot, const fkp_msg *q)
{
    uint32_t n = 0;
    entry **p = &k->entries;
    while (*p) {
        entry *e = *p;
        bool hit = e->committed && (q->scope == FKP_DROP_ALL ||
                                    (q->scope == FKP_DROP_FILE && strcmp(e->path, q->id.path) == 0) ||
                                    (q->scope == FKP_DROP_ENTRY && same_key(e, &q->id)));
        if (hit) {
            *p = e->next;
            entry_free(k, e);
            n++;
        } else p = &e->next;
    }
    fkp_msg m;
    memset(&m, 0, sizeof m);
    m.type = FKP_DROPPED;
    m.count = n;
    return reply(k, slot, &m, -1);
}

static int do_status(keeper *k, int slot)
{
    ferry_keep_status s;
    memset(&s, 0, sizeof s);
    s.device = k->device;
    s.budget = k->budget;
    s.used = k->used;
    s.pending_bytes = k->pending_bytes;
    s.nentries = k->nentries;
    s.npending = k->npending;
    ferry_keep_client_info cl[MAX_CLIENTS];
    for (int i = 0; i < MAX_CLIENTS; i++) {
        conn *c = &k->conns[i];
        if (c->fd < 0) continue;
        ferry_keep_client_info *ci = &cl[s.listed_clients++];
        ci->pid = (int32_t)c->pid;
        ci->uid = (uint32_t)c->uid;
        ci->attached = (uint32_t)c->natt;
        ci->pending = c->npending;
    }
    s.nclients = s.listed_clients;
    s.clients = cl;
    /* as many entries as fit in one body, most recently used first */
    size_t room =
        FKP_MAX_BODY - (8 * 3 + 4 * 3 + 2 + strlen(k->device) + 4 + 4 + (size_t)s.listed_clients * 16);
    ferry_keep_entry_info *el = calloc(k->nentries ? k->nentries : 1, sizeof *el);
    if (!el) return reply_error(k, slot, ENOMEM, "out of memory");
    double t = now_s();
    for (entry *e = k->entries; e; e = e->next) {
        if (!e->committed) continue;
        size_t sz = fkp_status_entry_size(strlen(e->path), strlen(e->tensor));
        if (sz > room || s.listed_entries >= FKP_MAX_LIST) break;
        room -= sz;
        ferry_keep_entry_info *ei = &el[s.listed_entries++];
        ei->id = e->id;
        ei->path = e->path;
        ei->tensor = e->tensor;
        ei->index = e->index;
        ei->nbytes = e->nbytes;
        ei->attached = e->attached;
        ei->file_size = e->file_size;
        ei->mtime_ns = e->mtime_ns;
        ei->header_digest = e->digest;
        ei->idle_ms = (uint64_t)((t - e->last_use) * 1e3);
    }
    s.entries = el;
    int len = fkp_status_encode(&s, k->out, FKP_HDR + FKP_MAX_BODY);
    free(el);
    if (len < 0) return reply_error(k, slot, EMSGSIZE, "status does not fit one reply");
    return send_reply(k, slot, (size_t)len, -1);
}

/* One complete message in c->in: handle it. 0, or -1 when the connection
 * was closed. */
static int handle(keeper *k, int slot, const fkp_hdr *h)
{
    conn *c = &k->conns[slot];
    fkp_msg *q = malloc(sizeof *q);
    if (!q) {
        conn_close(k, slot, "out of memory");
        return -1;
    }
    int rc = fkp_body_decode(h->type, c->in + FKP_HDR, h->len, q);
    if (rc < 0 || h->type >= FKP_HELLO_OK) {
        free(q);
        reply_error(k, slot, EPROTO, "malformed message (type 0x%02x, %u bytes): disconnected", h->type,
                    h->len);
        if (c->fd >= 0) conn_close(k, slot, "sent a malformed message: disconnected");
        return -1;
    }
    switch (q->type) {
    case FKP_HELLO: {
        fkp_msg m;
        memset(&m, 0, sizeof m);
        m.type = FKP_HELLO_OK;
        m.version = FKP_VERSION;
        m.pid = (uint32_t)getpid();
        m.nbytes = k->budget;
        snprintf(m.text, sizeof m.text, "%s", k->device);
        rc = reply(k, slot, &m, -1);
        break;
    }
    case FKP_PUT_BEGIN: rc = do_put_begin(k, slot, q); break;
    case FKP_PUT_COMMIT: rc = do_commit(k, slot, q->entry); break;
    case FKP_GET: rc = do_get(k, slot, &q->id); break;
    case FKP_RELEASE: rc = do_release(k, slot, q->entry); break;
    case FKP_DROP: rc = do_drop(k, slot, q); break;
    case FKP_STATUS: rc = do_status(k, slot); break;
    default: rc = -1; break;
    }
    free(q);
    return rc;
}

/* Read what the client sent and handle every complete message. */
static void on_readable(keeper *k, int slot)
{
    conn *c = &k->conns[slot];
    for (;;) {
        size_t want = FKP_HDR;
        fkp_hdr h = {0, 0};
        if (c->inlen >= FKP_HDR) {
            if (fkp_hdr_decode(c->in, &h) < 0) {
                reply_error(k, slot, EPROTO,
                            "not a keeper message header (protocol version %d): disconnected", FKP_VERSION);
                if (c->fd >= 0) conn_close(k, slot, "sent a bad message header: disconnected");
                return;
            }
            want = FKP_HDR + h.len;
        }
        if (c->inlen < want) {
            ssize_t r = recv(c->fd, c->in + c->inlen, want - c->inlen, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_close(k, slot, r == 0 ? (c->inlen ? "disconnected mid-message" : NULL) : "read error");
                return;
            }
            c->inlen += (size_t)r;
            continue;
        }
        if (handle(k, slot, &h) < 0) return;
        c->inlen = 0;
    }
}

static void on_accept(keeper *k, int lfd)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) {
        logf_("refused a connection: SO_PEERCRED: %s", strerror(errno));
        close(fd);
        return;
    }
    if (!fk_peer_allowed(cr.uid, k->uid)) {
        logf_("refused a connection from pid %d uid %u: the keeper serves only its own user (uid %u)",
              (int)cr.pid, (unsigned)cr.uid, (unsigned)k->uid);
        close(fd);
        return;
    }
    int slot = -1;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (k->conns[i].fd < 0) {
            slot = i;
            break;
        }
    uint8_t *in = slot >= 0 ? malloc(FKP_HDR + FKP_MAX_BODY) : NULL;
    if (!in) {
        logf_("refused a connection from pid %d: %s", (int)cr.pid,
              slot < 0 ? "too many clients" : "out of memory");
        close(fd);
        return;
    }
    struct timeval tv = {SEND_TIMEOUT_MS / 1000, (SEND_TIMEOUT_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    conn *c = &k->conns[slot];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->pid = cr.pid;
    c->uid = cr.uid;
    c->in = in;
}

/* ---- set-up and the loop ------------------------------------------------ */

static volatile sig_atomic_t sig_fd = -1;

static void on_signal(int sig)
{
    (void)sig;
    int e = errno;
    if (sig_fd >= 0) {
        char b = 1;
        ssize_t r = write(sig_fd, &b, 1);
        (void)r;
    }
    errno = e;
}

#define FAIL(code, ...)                \
    do {                               \
        snprintf(err, n, __VA_ARGS__); \
        rc = (code);                   \
        goto out;                      \
    } while (0)

/* A keeper already answering at path? */
static bool live_keeper(const char *path)
{
    struct sockaddr_un a;
    int dirfd;
    char err[FK_SOCK_PATH_MAX + 256];
    if (fk_sock_addr(path, &a, &dirfd, err, sizeof err) < 0) return false;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (dirfd >= 0) close(dirfd);
    return live;
}

int ferry_keep_serve(const ferry_keep_opts *opts, char *err, size_t n)
{
    keeper *k = calloc(1, sizeof *k);
    int rc = 0, lfd = -1, dirfd = -1, pipefd[2] = {-1, -1};
    bool bound = false, handlers = false;
    struct sigaction old_term, old_int;
    struct pollfd *pfd = NULL;
    int *pslot = NULL;
    if (!k) FAIL(-ENOMEM, "out of memory");
    for (int i = 0; i < MAX_CLIENTS; i++) k->conns[i].fd = -1;
    k->uid = geteuid();
    const char *device = opts && opts->device ? opts->device : "sim";
    uint64_t devsize = 0;
    rc = fk_backend_for(device, &k->be, &devsize, err, n);
    if (rc < 0) goto out;
    snprintf(k->device, sizeof k->device, "%s", device);

    /* the budget: asked for (the smaller of --budget and sim:SIZE), else half
     * of what the host has available; never above what it has available */
    uint64_t avail = 0;
    char src[256] = "";
    bool have_avail = fy_host_available(&avail, src, sizeof src) == 0;
    uint64_t want = opts ? opts->budget : 0;
    if (devsize && (!want || devsize < want)) want = devsize;
    if (!want) {
        if (!have_avail)
            FAIL(-EINVAL, "the host's available memory is unknown: give a budget (--budget SIZE)");
        want = avail / 2;
    }
    char h1[32], h2[32];
    if (have_avail && want > avail) {
        logf_("budget %s is above the host's available memory (%s, %s): using that",
              human(h1, sizeof h1, want), human(h2, sizeof h2, avail), src);
        want = avail;
    }
    k->budget = want;

    /* the socket, in a private directory */
    char defsock[FK_SUN_MAX + 1];
    const char *sock = opts ? opts->socket : NULL;
    if (!sock) {
        if (ferry_keep_default_socket(defsock, sizeof defsock) < 0)
            FAIL(-ENAMETOOLONG, "the default socket path is too long: give one (--socket PATH)");
        sock = defsock;
    }
    if (strlen(sock) > FK_SOCK_PATH_MAX)
        FAIL(-ENAMETOOLONG, "%.200s...: a socket path is at most %d bytes", sock, FK_SOCK_PATH_MAX);
    snprintf(k->sock, sizeof k->sock, "%s", sock);
    rc = fk_private_dir(sock, true, k->uid, err, n);
    if (rc < 0) goto out;
    /* (the address is checked before a dead keeper's socket is replaced) */
    struct sockaddr_un a;
    rc = fk_sock_addr(sock, &a, &dirfd, err, n);
    if (rc < 0) goto out;
    struct stat st;
    if (lstat(sock, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) FAIL(-EEXIST, "%s exists and is not a socket: refused", sock);
        if (live_keeper(sock)) FAIL(-EADDRINUSE, "%s: a keeper is already running there", sock);
        unlink(sock); /* a dead keeper's */
    }
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (lfd < 0) FAIL(-errno, "socket: %s", strerror(errno));
    mode_t um = umask(0177); /* the socket itself 0600 */
    int b = bind(lfd, (struct sockaddr *)&a, sizeof a);
    int be = errno;
    umask(um);
    if (b != 0 && dirfd >= 0)
        FAIL(-be, "%s: bind through its directory (%s): %s%s", sock, a.sun_path, strerror(be),
             be == ENOENT ? " (is /proc mounted?)" : "");
    if (b != 0) FAIL(-be, "%s: bind: %s", sock, strerror(be));
    bound = true;
    if (dirfd >= 0) close(dirfd);
    dirfd = -1;
    if (listen(lfd, 64) != 0) FAIL(-errno, "%s: listen: %s", sock, strerror(errno));
    if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) FAIL(-errno, "pipe: %s", strerror(errno));
    k->out = malloc(FKP_HDR + FKP_MAX_BODY);
    pfd = calloc(MAX_CLIENTS + 3, sizeof *pfd);
    pslot = calloc(MAX_CLIENTS + 3, sizeof *pslot);
    if (!k->out || !pfd || !pslot) FAIL(-ENOMEM, "out of memory");
    if (opts && opts->handle_signals) {
        sig_fd = pipefd[1];
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
        handlers = true;
    }
    logf_("serving %s on %s, budget %s (pid %d)", k->device, sock, human(h1, sizeof h1, k->budget),
          (int)getpid());

    for (;;) {
        int np = 0;
        pfd[np] = (struct pollfd){lfd, POLLIN, 0};
        pslot[np++] = -1;
        pfd[np] = (struct pollfd){pipefd[0], POLLIN, 0};
        pslot[np++] = -2;
        if (opts && opts->stop_fd >= 0) {
            pfd[np] = (struct pollfd){opts->stop_fd, POLLIN, 0};
            pslot[np++] = -2;
        }
        for (int i = 0; i < MAX_CLIENTS; i++)
            if (k->conns[i].fd >= 0) {
                pfd[np] = (struct pollfd){k->conns[i].fd, POLLIN, 0};
                pslot[np++] = i;
            }
        int r = poll(pfd, (nfds_t)np, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            FAIL(-errno, "poll: %s", strerror(errno));
        }
        bool stop = false;
        for (int i = 0; i < np; i++) {
            if (!pfd[i].revents) continue;
            if (pslot[i] == -2) stop = true;
            else if (pslot[i] == -1) on_accept(k, lfd);
            else if (k->conns[pslot[i]].fd == pfd[i].fd) on_readable(k, pslot[i]);
        }
        if (stop) break;
    }
    logf_("stopping: %u %s, %s freed", k->nentries, k->nentries == 1 ? "entry" : "entries",
          human(h1, sizeof h1, k->used));
    rc = 0;
out:
    if (handlers) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
        sig_fd = -1;
    }
    if (k) {
        for (int i = 0; i < MAX_CLIENTS; i++) conn_close(k, i, NULL);
        while (k->entries) entry_drop(k, k->entries);
        free(k->out);
    }
    if (bound) unlink(k->sock);
    if (lfd >= 0) close(lfd);
    if (dirfd >= 0) close(dirfd);
    if (pipefd[0] >= 0) close(pipefd[0]);
    if (pipefd[1] >= 0) close(pipefd[1]);
    free(pfd);
    free(pslot);
    free(k);
    return rc;
}
