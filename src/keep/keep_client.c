/* SPDX-License-Identifier: Apache-2.0 */
/* keep_client.c - the keeper's client: one connection, one request at a time,
 * every wait bounded (SO_RCVTIMEO / SO_SNDTIMEO), every error naming the
 * socket. A keeper that dies mid-call is an error (-EPIPE / -ECONNRESET),
 * never a hang or a signal (MSG_NOSIGNAL). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry_experimental.h"
#include "keep.h"
#include "keep_proto.h"

struct ferry_keep {
    int fd;
    int timeout_ms;
    char sock[FK_SOCK_PATH_MAX + 1];
    char msg[FKP_MAX_ERRMSG + FK_SOCK_PATH_MAX + 128];
    uint8_t buf[FKP_HDR + FKP_MAX_BODY];
    fkp_msg m; /* the last reply */
};

static int fail(ferry_keep *k, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ferry_keep *k, int code, const char *fmt, ...)
{
    char what[FKP_MAX_ERRMSG + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(k->msg, sizeof k->msg, "ferry keep: %s: %s", k->sock, what);
    return code;
}

const char *ferry_keep_errmsg(const ferry_keep *k)
{
    return k ? k->msg : "ferry keep: no connection";
}

/* An I/O error on the connection, worded for the person reading it. */
static int io_fail(ferry_keep *k, int e, const char *doing)
{
    if (e == EAGAIN || e == EWOULDBLOCK)
        return fail(k, -ETIMEDOUT, "no answer from the keeper in %d ms (%s)", k->timeout_ms, doing);
    if (e == EPIPE || e == ECONNRESET || e == 0)
        return fail(k, e ? -e : -ECONNRESET, "the keeper closed the connection (%s): it exited or was killed",
                    doing);
    return fail(k, -e, "%s: %s", doing, strerror(e));
}

/* Send the encoded request in k->buf[0..len-1]. */
static int send_all(ferry_keep *k, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(k->fd, k->buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_fail(k, w < 0 ? errno : 0, "sending a request");
        off += (size_t)w;
    }
    return 0;
}

/* Receive exactly n bytes into p; the first recvmsg may carry an fd (into
 * *fd when fd is not NULL, else closed). */
static int recv_all(ferry_keep *k, uint8_t *p, size_t n, int *fd)
{
    size_t off = 0;
    while (off < n) {
        struct iovec iov = {p + off, n - off};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * 4)];
        } cm;
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof cm.buf};
        ssize_t r = recvmsg(k->fd, &mh, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return io_fail(k, r < 0 ? errno : 0, "waiting for a reply");
        for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch; ch = CMSG_NXTHDR(&mh, ch)) {
            if (ch->cmsg_level != SOL_SOCKET || ch->cmsg_type != SCM_RIGHTS) continue;
            size_t nfd = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int f;
                memcpy(&f, CMSG_DATA(ch) + i * sizeof(int), sizeof f);
                if (fd && *fd < 0) *fd = f;
                else close(f);
            }
        }
        off += (size_t)r;
    }
    return 0;
}

/* Send request q, receive the reply into k->m (and its fd, if any, into *fd:
 * -1 when none). A reply of type ERROR becomes -code with its message. */
static int call(ferry_keep *k, const fkp_msg *q, int *fd)
{
    if (fd) *fd = -1;
    if (k->fd < 0) return fail(k, -ENOTCONN, "not connected");
    int len = fkp_encode(q, k->buf, sizeof k->buf);
    if (len < 0)
        return fail(k, -EINVAL,
                    "a request the protocol cannot carry (a path over %d bytes, a tensor name over %d, or "
                    "not absolute)",
                    FKP_MAX_PATH, FKP_MAX_NAME);
    int rc = send_all(k, (size_t)len);
    int got = -1;
    if (rc == 0) rc = recv_all(k, k->buf, FKP_HDR, &got);
    fkp_hdr h = {0, 0};
    if (rc == 0 && fkp_hdr_decode(k->buf, &h) < 0)
        rc = fail(k, -EPROTO,
                  "not a keeper's reply (another program on the socket, or another protocol version)");
    if (rc == 0) rc = recv_all(k, k->buf + FKP_HDR, h.len, &got);
    if (rc == 0 && h.type == FKP_STATUS_REPLY) {
        k->m.type = h.type;
    } else if (rc == 0 && fkp_body_decode(h.type, k->buf + FKP_HDR, h.len, &k->m) < 0) {
        rc = fail(k, -EPROTO, "a malformed reply (type 0x%02x)", h.type);
    }
    if (rc == 0 && h.type == FKP_ERROR) rc = fail(k, -k->m.code, "%s", k->m.text);
    if (rc < 0) {
        if (got >= 0) close(got);
        /* a broken stream cannot be resynchronised */
        if (rc != -k->m.code || h.type != FKP_ERROR) {
            close(k->fd);
            k->fd = -1;
        }
        return rc;
    }
    if (fd) *fd = got;
    else if (got >= 0) close(got);
    return 0;
}

static int expect(ferry_keep *k, uint16_t type, int *fd)
{
    if (k->m.type == type) return 0;
    if (fd && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return fail(k, -EPROTO, "an unexpected reply (type 0x%02x)", k->m.type);
}

int ferry_keep_connect(const char *socket_path, int timeout_ms, ferry_keep **out, char *err, size_t n)
{
    *out = NULL;
    char def[FK_SUN_MAX + 1];
    if (!socket_path) {
        if (ferry_keep_default_socket(def, sizeof def) < 0) {
            snprintf(err, n, "ferry keep: the default socket path is too long");
            return -ENAMETOOLONG;
        }
        socket_path = def;
    }
    struct sockaddr_un a;
    int dirfd = -1;
    char why[FK_SOCK_PATH_MAX + 256];
    int rc = fk_sock_addr(socket_path, &a, &dirfd, why, sizeof why);
    if (rc < 0) {
        snprintf(err, n, "ferry keep: %s", why);
        return rc;
    }
    ferry_keep *k = calloc(1, sizeof *k);
    if (!k) {
        if (dirfd >= 0) close(dirfd);
        snprintf(err, n, "ferry keep: out of memory");
        return -ENOMEM;
    }
    k->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    snprintf(k->sock, sizeof k->sock, "%s", socket_path);
    k->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (k->fd < 0) rc = fail(k, -errno, "socket: %s", strerror(errno));
    if (rc == 0) {
        struct timeval tv = {k->timeout_ms / 1000, (k->timeout_ms % 1000) * 1000};
        setsockopt(k->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(k->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(k->fd, (struct sockaddr *)&a, sizeof a) != 0) {
            int e = errno;
            struct stat st;
            if (e == ENOENT && dirfd >= 0 &&
                fstatat(dirfd, strrchr(a.sun_path, '/') + 1, &st, AT_SYMLINK_NOFOLLOW) == 0)
                rc = fail(k, -e, "cannot connect through its directory (%s): %s (is /proc mounted?)",
                          a.sun_path, strerror(e));
            else if (e == ENOENT || e == ECONNREFUSED)
                rc = fail(k, -e, "no keeper is running there (%s); start one with `ferry keep`", strerror(e));
            else rc = fail(k, -e, "cannot connect: %s", strerror(e));
        }
    }
    if (dirfd >= 0) close(dirfd);
    if (rc == 0) {
        /* the keeper must be this user's own, as the keeper checks its clients:
         * another user's process on a path we would trust gets no requests */
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(k->fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0)
            rc = fail(k, -errno, "SO_PEERCRED: %s", strerror(errno));
        else if (!fk_peer_allowed(cr.uid, geteuid()))
            rc = fail(
                k, -EPERM,
                "the process listening there (pid %d) runs as uid %u, not as this user (uid %u): refused",
                (int)cr.pid, (unsigned)cr.uid, (unsigned)geteuid());
    }
    if (rc == 0) {
        fkp_msg q;
        memset(&q, 0, sizeof q);
        q.type = FKP_HELLO;
        q.version = FKP_VERSION;
        rc = call(k, &q, NULL);
        if (rc == 0) rc = expect(k, FKP_HELLO_OK, NULL);
        if (rc == 0 && k->m.version != FKP_VERSION)
            rc = fail(k, -EPROTO, "the keeper speaks protocol version %u, this client %d", k->m.version,
                      FKP_VERSION);
    }
    if (rc < 0) {
        snprintf(err, n, "%s", k->msg);
        ferry_keep_close(k);
        return rc;
    }
    *out = k;
    return 0;
}

void ferry_keep_close(ferry_keep *k)
{
    if (!k) return;
    if (k->fd >= 0) close(k->fd);
    free(k);
}

static int ident(ferry_keep *k, const ferry_keep_id *id, fkp_ident *o)
{
    if (!id || !id->path) return fail(k, -EINVAL, "no identity given");
    size_t pl = strlen(id->path), tl = id->tensor ? strlen(id->tensor) : 0;
    if (pl == 0 || pl > FKP_MAX_PATH || id->path[0] != '/')
        return fail(k, -EINVAL, "a checkpoint path must be absolute and at most %d bytes", FKP_MAX_PATH);
    if (tl > FKP_MAX_NAME) return fail(k, -EINVAL, "a tensor name is at most %d bytes", FKP_MAX_NAME);
    memcpy(o->path, id->path, pl + 1);
    if (tl) memcpy(o->tensor, id->tensor, tl);
    o->tensor[tl] = '\0';
    o->index = id->index;
    o->file_size = id->file_size;
    o->mtime_ns = id->mtime_ns;
    o->digest = id->header_digest;
    return 0;
}

int ferry_keep_put_begin(ferry_keep *k, const ferry_keep_id *id, uint64_t nbytes, int *fd, uint64_t *entry)
{
    *fd = -1;
    if (nbytes == 0) return fail(k, -EINVAL, "an entry holds at least 1 byte");
    fkp_msg *q = calloc(1, sizeof *q);
    if (!q) return fail(k, -ENOMEM, "out of memory");
    int rc = ident(k, id, &q->id);
    q->type = FKP_PUT_BEGIN;
    q->nbytes = nbytes;
    if (rc == 0) rc = call(k, q, fd);
    free(q);
    if (rc == 0) rc = expect(k, FKP_PUT_READY, fd);
    if (rc == 0 && *fd < 0) rc = fail(k, -EPROTO, "the keeper sent no memory with its PUT_READY");
    if (rc == 0) *entry = k->m.entry;
    return rc;
}

static int by_entry(ferry_keep *k, uint16_t type, uint64_t entry)
{
    fkp_msg q;
    memset(&q, 0, sizeof q);
    q.type = type;
    q.entry = entry;
    int rc = call(k, &q, NULL);
    return rc ? rc : expect(k, FKP_OK, NULL);
}

int ferry_keep_put_commit(ferry_keep *k, uint64_t entry)
{
    return by_entry(k, FKP_PUT_COMMIT, entry);
}

int ferry_keep_release(ferry_keep *k, uint64_t entry)
{
    return by_entry(k, FKP_RELEASE, entry);
}

int ferry_keep_get(ferry_keep *k, const ferry_keep_id *id, int *fd, uint64_t *offset, uint64_t *nbytes,
                   uint64_t *entry, int *stale)
{
    *fd = -1;
    if (stale) *stale = 0;
    fkp_msg *q = calloc(1, sizeof *q);
    if (!q) return fail(k, -ENOMEM, "out of memory");
    int rc = ident(k, id, &q->id);
    q->type = FKP_GET;
    if (rc == 0) rc = call(k, q, fd);
    free(q);
    if (rc < 0) return rc;
    if (k->m.type == FKP_MISS) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        if (stale) *stale = k->m.reason == FKP_MISS_STALE;
        return 0;
    }
    rc = expect(k, FKP_HIT, fd);
    if (rc == 0 && *fd < 0) rc = fail(k, -EPROTO, "the keeper sent no memory with its HIT");
    if (rc < 0) return rc;
    *offset = k->m.offset;
    *nbytes = k->m.nbytes;
    if (entry) *entry = k->m.entry;
    return 1;
}

int ferry_keep_drop(ferry_keep *k, int scope, const ferry_keep_id *id)
{
    if (scope < FERRY_KEEP_DROP_ENTRY || scope > FERRY_KEEP_DROP_ALL)
        return fail(k, -EINVAL, "no drop scope %d", scope);
    fkp_msg *q = calloc(1, sizeof *q);
    if (!q) return fail(k, -ENOMEM, "out of memory");
    int rc = scope == FERRY_KEEP_DROP_ALL ? 0 : ident(k, id, &q->id);
    q->type = FKP_DROP;
    q->scope = (uint8_t)scope;
    if (rc == 0) rc = call(k, q, NULL);
    free(q);
    if (rc == 0) rc = expect(k, FKP_DROPPED, NULL);
    return rc < 0 ? rc : (int)(k->m.count > 0x7fffffffu ? 0x7fffffff : k->m.count);
}

int ferry_keep_status_get(ferry_keep *k, ferry_keep_status **out)
{
    *out = NULL;
    fkp_msg q;
    memset(&q, 0, sizeof q);
    q.type = FKP_STATUS;
    int rc = call(k, &q, NULL);
    if (rc == 0) rc = expect(k, FKP_STATUS_REPLY, NULL);
    if (rc < 0) return rc;
    fkp_hdr h;
    fkp_hdr_decode(k->buf, &h);
    rc = fkp_status_decode(k->buf + FKP_HDR, h.len, out);
    if (rc == -ENOMEM) return fail(k, rc, "out of memory");
    if (rc < 0) return fail(k, -EPROTO, "a malformed status reply");
    return 0;
}

void ferry_keep_status_free(ferry_keep_status *s)
{
    free(s);
}
