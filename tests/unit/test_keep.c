/* SPDX-License-Identifier: Apache-2.0 */
/* test_keep.c - the keeper (src/keep): its message codec, and the daemon run
 * in a forked child with clients in this process and in other children:
 * puts seen across processes, stale identities, LRU under a budget, the
 * same-user rule, clients and the keeper killed with SIGKILL, and nothing left
 * behind when the keeper stops. Every wait is bounded (an alarm ends a hung
 * case). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <poll.h>

#include "check.h"
#include "fds.h"
#include "keeper_child.h"
#include "ferry_experimental.h"
#include "io/io.h"
#include "keep/keep.h"
#include "keep/keep_proto.h"

static char dir[512], sock[600], logpath[600];

/* ---- codec -------------------------------------------------------------- */

static uint8_t wire[FKP_HDR + FKP_MAX_BODY + 64];

/* Encode m, decode it back into *back: the decoder's code. */
static int roundtrip(const fkp_msg *m, fkp_msg *back)
{
    int len = fkp_encode(m, wire, sizeof wire);
    if (len < FKP_HDR) return len < 0 ? len : -1;
    fkp_hdr h;
    int rc = fkp_hdr_decode(wire, &h);
    if (rc < 0) return rc;
    if (h.type != m->type || h.len != (uint32_t)len - FKP_HDR) return -1;
    memset(back, 0x5a, sizeof *back);
    return fkp_body_decode(h.type, wire + FKP_HDR, h.len, back);
}

static fkp_msg *msg_new(uint16_t type)
{
    fkp_msg *m = calloc(1, sizeof *m);
    m->type = type;
    snprintf(m->id.path, sizeof m->id.path, "/models/flux.safetensors");
    snprintf(m->id.tensor, sizeof m->id.tensor, "double_blocks.0.img_attn.qkv.weight");
    m->id.index = 7;
    m->id.file_size = 23800000000ull;
    m->id.mtime_ns = -5; /* before 1970 is representable */
    m->id.digest = 0x0123456789abcdefull;
    return m;
}

static bool same_ident(const fkp_ident *a, const fkp_ident *b)
{
    return strcmp(a->path, b->path) == 0 && strcmp(a->tensor, b->tensor) == 0 && a->index == b->index &&
           a->file_size == b->file_size && a->mtime_ns == b->mtime_ns && a->digest == b->digest;
}

static void test_codec_roundtrip(void)
{
    fkp_msg *m = msg_new(FKP_HELLO), *b = calloc(1, sizeof *b);
    m->version = FKP_VERSION;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK_EQ(b->version, FKP_VERSION);
    m->type = FKP_PUT_BEGIN;
    m->nbytes = 1ull << 40;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(same_ident(&m->id, &b->id));
    CHECK(b->nbytes == 1ull << 40);
    m->type = FKP_GET;
    m->id.tensor[0] = '\0'; /* by index */
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(same_ident(&m->id, &b->id));
    for (int t = FKP_PUT_COMMIT; t <= FKP_RELEASE; t += FKP_RELEASE - FKP_PUT_COMMIT) {
        m->type = (uint16_t)t;
        m->entry = 0xfedcba9876543210ull;
        CHECK_EQ(roundtrip(m, b), 0);
        CHECK(b->entry == m->entry);
    }
    for (int s = FKP_DROP_ENTRY; s <= FKP_DROP_ALL; s++) {
        fkp_msg *d = msg_new(FKP_DROP);
        d->scope = (uint8_t)s;
        CHECK_EQ(roundtrip(d, b), 0);
        CHECK_EQ(b->scope, s);
        if (s != FKP_DROP_ALL) CHECK(same_ident(&d->id, &b->id));
        else CHECK(b->id.path[0] == '\0');
        free(d);
    }
    m->type = FKP_STATUS;
    CHECK_EQ(roundtrip(m, b), 0);
    m->type = FKP_OK;
    CHECK_EQ(roundtrip(m, b), 0);
    m->type = FKP_HELLO_OK;
    m->pid = 4242;
    m->nbytes = 99;
    snprintf(m->text, sizeof m->text, "sim:24GiB");
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(b->pid == 4242 && b->nbytes == 99 && strcmp(b->text, "sim:24GiB") == 0);
    m->type = FKP_PUT_READY;
    m->entry = 3;
    m->nbytes = 4096;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(b->entry == 3 && b->nbytes == 4096);
    m->type = FKP_HIT;
    m->offset = 8192;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(b->entry == 3 && b->offset == 8192 && b->nbytes == 4096);
    m->type = FKP_MISS;
    m->reason = FKP_MISS_STALE;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK_EQ(b->reason, FKP_MISS_STALE);
    m->type = FKP_DROPPED;
    m->count = 12;
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK_EQ(b->count, 12);
    m->type = FKP_ERROR;
    m->code = ENOSPC;
    snprintf(m->text, sizeof m->text, "no room");
    CHECK_EQ(roundtrip(m, b), 0);
    CHECK(b->code == ENOSPC && strcmp(b->text, "no room") == 0);

    /* STATUS_REPLY */
    ferry_keep_entry_info e[2] = {{1, "/a/b.safetensors", "w", 0, 10, 1, 100, 5, 6, 7},
                                  {2, "/a/c.gguf", "", 3, 20, 0, 200, -1, 8, 9}};
    ferry_keep_client_info c[1] = {{123, 1000, 1, 2}};
    ferry_keep_status s = {"sim", 1000, 30, 4, 2, 1, 1, 2, 1, e, c};
    int len = fkp_status_encode(&s, wire, sizeof wire);
    CHECK(len > FKP_HDR);
    fkp_hdr h;
    CHECK_EQ(fkp_hdr_decode(wire, &h), 0);
    CHECK_EQ(h.type, FKP_STATUS_REPLY);
    ferry_keep_status *o = NULL;
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, h.len, &o), 0);
    if (o) {
        CHECK(strcmp(o->device, "sim") == 0 && o->budget == 1000 && o->used == 30 && o->pending_bytes == 4);
        CHECK(o->nentries == 2 && o->npending == 1 && o->nclients == 1);
        CHECK(o->listed_entries == 2 && o->listed_clients == 1);
        CHECK(strcmp(o->entries[0].path, "/a/b.safetensors") == 0 && strcmp(o->entries[1].tensor, "") == 0);
        CHECK(o->entries[1].index == 3 && o->entries[1].mtime_ns == -1 && o->entries[1].idle_ms == 9);
        CHECK(o->clients[0].pid == 123 && o->clients[0].uid == 1000 && o->clients[0].pending == 2);
        free(o);
    }
    free(m);
    free(b);
}

/* Write a header with these fields into wire. */
static void put_hdr(uint32_t magic, uint16_t version, uint16_t type, uint32_t len, uint32_t reserved)
{
    uint8_t *p = wire;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(magic >> (8 * i));
    p[4] = (uint8_t)version;
    p[5] = (uint8_t)(version >> 8);
    p[6] = (uint8_t)type;
    p[7] = (uint8_t)(type >> 8);
    for (int i = 0; i < 4; i++) p[8 + i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 4; i++) p[12 + i] = (uint8_t)(reserved >> (8 * i));
}

/* Encode m and return its body length (the body at wire + FKP_HDR). */
static size_t body_of(const fkp_msg *m)
{
    int len = fkp_encode(m, wire, sizeof wire);
    CHECK(len >= FKP_HDR);
    return len >= FKP_HDR ? (size_t)len - FKP_HDR : 0;
}

static int decode_as(uint16_t type, size_t len)
{
    fkp_msg *b = malloc(sizeof *b);
    int rc = fkp_body_decode(type, wire + FKP_HDR, len, b);
    free(b);
    return rc;
}

/* A PUT_BEGIN body by hand at wire + FKP_HDR: a path of plen bytes ("/aaa..."),
 * a tensor name of tlen bytes, nbytes 1. Its length. */
static size_t raw_put_begin(size_t plen, size_t tlen)
{
    uint8_t *p = wire + FKP_HDR;
    size_t o = 0;
    p[o++] = (uint8_t)plen;
    p[o++] = (uint8_t)(plen >> 8);
    memset(p + o, 'a', plen);
    if (plen) p[o] = '/';
    o += plen;
    p[o++] = (uint8_t)tlen;
    p[o++] = (uint8_t)(tlen >> 8);
    memset(p + o, 'n', tlen);
    o += tlen;
    memset(p + o, 0, 4 + 8 * 3 + 8);
    o += 4 + 8 * 3;
    p[o] = 1; /* nbytes */
    return o + 8;
}

static void test_codec_reject(void)
{
    fkp_hdr h;
    put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, 4, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), 0);
    put_hdr(FKP_MAGIC ^ 1, FKP_VERSION, FKP_HELLO, 4, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EPROTO);
    put_hdr(FKP_MAGIC, FKP_VERSION + 1, FKP_HELLO, 4, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EPROTO);
    put_hdr(FKP_MAGIC, 0, FKP_HELLO, 4, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EPROTO);
    uint16_t bad_types[] = {0x00, 0x08, 0x80, 0x88, 0xfe, 0x100, 0x1ff, 0xffff};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        put_hdr(FKP_MAGIC, FKP_VERSION, bad_types[i], 0, 0);
        CHECK_EQ(fkp_hdr_decode(wire, &h), -EPROTO);
    }
    put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, FKP_MAX_BODY + 1, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EMSGSIZE);
    put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, 0xffffffffu, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EMSGSIZE);
    put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, FKP_MAX_BODY, 0);
    CHECK_EQ(fkp_hdr_decode(wire, &h), 0);
    put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, 4, 1);
    CHECK_EQ(fkp_hdr_decode(wire, &h), -EPROTO);

    /* every strict prefix of a valid PUT_BEGIN body, and one byte more */
    fkp_msg *m = msg_new(FKP_PUT_BEGIN);
    m->nbytes = 4096;
    size_t n = body_of(m);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), 0);
    int prefixes_refused = 0;
    for (size_t i = 0; i < n; i++) prefixes_refused += decode_as(FKP_PUT_BEGIN, i) == -EPROTO;
    CHECK_EQ(prefixes_refused, (long long)n);
    wire[FKP_HDR + n] = 0;
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n + 1), -EPROTO);
    /* a body too long for any message */
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, FKP_MAX_BODY + 1), -EPROTO);
    /* a NUL inside the path, inside the tensor name */
    n = body_of(m);
    wire[FKP_HDR + 2 + 3] = 0;
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), -EPROTO);
    n = body_of(m);
    size_t plen = strlen(m->id.path);
    wire[FKP_HDR + 2 + plen + 2 + 1] = 0;
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), -EPROTO);
    /* a string length past the body */
    n = body_of(m);
    wire[FKP_HDR] = 0xff;
    wire[FKP_HDR + 1] = 0x0f;
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), -EPROTO);
    /* nbytes 0 */
    n = body_of(m);
    memset(wire + FKP_HDR + n - 8, 0, 8);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), -EPROTO);
    /* a path of FKP_MAX_PATH bytes is fine, one more is refused; a name likewise */
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, raw_put_begin(FKP_MAX_PATH, 0)), 0);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, raw_put_begin(FKP_MAX_PATH + 1, 0)), -EPROTO);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, raw_put_begin(1, FKP_MAX_NAME)), 0);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, raw_put_begin(1, FKP_MAX_NAME + 1)), -EPROTO);
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, raw_put_begin(0, 1)), -EPROTO); /* an empty path */
    /* the encoder refuses what the decoder would (a relative or empty path, a long name) */
    snprintf(m->id.path, sizeof m->id.path, "relative/x.safetensors");
    CHECK_EQ(fkp_encode(m, wire, sizeof wire), -EINVAL);
    m->id.path[0] = '\0';
    CHECK_EQ(fkp_encode(m, wire, sizeof wire), -EINVAL);
    snprintf(m->id.path, sizeof m->id.path, "/x");
    memset(m->id.tensor, 'n', FKP_MAX_NAME);
    m->id.tensor[FKP_MAX_NAME] = '\0';
    CHECK(fkp_encode(m, wire, sizeof wire) > 0);
    /* a relative path and an empty one on the wire */
    snprintf(m->id.path, sizeof m->id.path, "/x");
    m->id.tensor[0] = '\0';
    n = body_of(m);
    wire[FKP_HDR + 2] = 'x';
    CHECK_EQ(decode_as(FKP_PUT_BEGIN, n), -EPROTO);
    CHECK_EQ(decode_as(FKP_GET, n - 8), -EPROTO);

    /* DROP: a scope past ALL, ALL with a path, FILE without one */
    fkp_msg *d = msg_new(FKP_DROP);
    d->scope = FKP_DROP_FILE;
    n = body_of(d);
    CHECK_EQ(decode_as(FKP_DROP, n), 0);
    wire[FKP_HDR] = 3;
    CHECK_EQ(decode_as(FKP_DROP, n), -EPROTO);
    wire[FKP_HDR] = FKP_DROP_ALL;
    CHECK_EQ(decode_as(FKP_DROP, n), -EPROTO);
    d->scope = FKP_DROP_ALL;
    n = body_of(d);
    CHECK_EQ(decode_as(FKP_DROP, n), 0);
    wire[FKP_HDR] = FKP_DROP_FILE;
    CHECK_EQ(decode_as(FKP_DROP, n), -EPROTO);
    d->scope = 3;
    CHECK_EQ(fkp_encode(d, wire, sizeof wire), -EINVAL);

    /* MISS reason, ERROR code and message */
    fkp_msg *r = msg_new(FKP_MISS);
    n = body_of(r);
    wire[FKP_HDR] = 2;
    CHECK_EQ(decode_as(FKP_MISS, n), -EPROTO);
    r->type = FKP_ERROR;
    r->code = EIO;
    n = body_of(r);
    CHECK_EQ(decode_as(FKP_ERROR, n), 0);
    memset(wire + FKP_HDR, 0, 4);
    CHECK_EQ(decode_as(FKP_ERROR, n), -EPROTO);
    memset(wire + FKP_HDR, 0xff, 4);
    CHECK_EQ(decode_as(FKP_ERROR, n), -EPROTO);
    r->code = 0;
    CHECK_EQ(fkp_encode(r, wire, sizeof wire), -EINVAL);
    r->code = EIO;
    memset(r->text, 'e', FKP_MAX_ERRMSG);
    r->text[FKP_MAX_ERRMSG] = '\0';
    n = body_of(r);
    CHECK_EQ(decode_as(FKP_ERROR, n), 0);
    wire[FKP_HDR + 4] = (uint8_t)((FKP_MAX_ERRMSG + 1) & 0xff);
    wire[FKP_HDR + 5] = (uint8_t)((FKP_MAX_ERRMSG + 1) >> 8);
    wire[FKP_HDR + n] = 'e';
    CHECK_EQ(decode_as(FKP_ERROR, n + 1), -EPROTO);
    /* HELLO_OK's device string is short */
    r->type = FKP_HELLO_OK;
    memset(r->text, 'd', FKP_MAX_DEVICE + 1);
    r->text[FKP_MAX_DEVICE + 1] = '\0';
    CHECK_EQ(fkp_encode(r, wire, sizeof wire), -EINVAL);
    /* fixed-size bodies: one byte short, one over */
    uint16_t fixed[] = {FKP_HELLO, FKP_PUT_COMMIT, FKP_RELEASE, FKP_PUT_READY,
                        FKP_HIT,   FKP_MISS,       FKP_DROPPED};
    size_t fixed_len[] = {4, 8, 8, 16, 24, 1, 4};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        memset(wire + FKP_HDR, 0, 32);
        CHECK_EQ(decode_as(fixed[i], fixed_len[i]), 0);
        CHECK_EQ(decode_as(fixed[i], fixed_len[i] - 1), -EPROTO);
        CHECK_EQ(decode_as(fixed[i], fixed_len[i] + 1), -EPROTO);
    }
    CHECK_EQ(decode_as(FKP_STATUS, 1), -EPROTO);
    CHECK_EQ(decode_as(FKP_OK, 1), -EPROTO);
    CHECK_EQ(decode_as(FKP_STATUS_REPLY, 0), -EPROTO); /* not through fkp_body_decode */
    CHECK_EQ(decode_as(0x42, 0), -EPROTO);

    /* STATUS_REPLY: counts past the limit or the body, truncation, trailing bytes */
    ferry_keep_entry_info e[1] = {{1, "/a", "w", 0, 10, 0, 1, 2, 3, 4}};
    ferry_keep_client_info c[1] = {{1, 2, 3, 4}};
    ferry_keep_status s = {"sim", 1, 1, 0, 1, 0, 1, 1, 1, e, c};
    int len = fkp_status_encode(&s, wire, sizeof wire);
    n = (size_t)len - FKP_HDR;
    ferry_keep_status *o = NULL;
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, n, &o), 0);
    free(o);
    int refused = 0;
    for (size_t i = 0; i < n; i++) {
        o = NULL;
        refused += fkp_status_decode(wire + FKP_HDR, i, &o) == -EPROTO && o == NULL;
    }
    CHECK_EQ(refused, (long long)n);
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, n + 1, &o), -EPROTO);
    size_t ne_at = FKP_HDR + 8 * 3 + 4 * 3 + 2 + 3; /* the entries' count */
    uint8_t save[4];
    memcpy(save, wire + ne_at, 4);
    uint32_t huge = FKP_MAX_LIST + 1;
    memcpy(wire + ne_at, &huge, 4);
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, n, &o), -EPROTO);
    huge = 2;
    memcpy(wire + ne_at, &huge, 4);
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, n, &o), -EPROTO);
    memcpy(wire + ne_at, save, 4);
    wire[FKP_HDR + n - 16 - 4] = 2; /* the clients' count */
    CHECK_EQ(fkp_status_decode(wire + FKP_HDR, n, &o), -EPROTO);
    ferry_keep_entry_info rel[1] = {{1, "rel", "w", 0, 10, 0, 1, 2, 3, 4}};
    s.entries = rel;
    CHECK_EQ(fkp_status_encode(&s, wire, sizeof wire), -EINVAL);
    s.listed_entries = FKP_MAX_LIST + 1;
    CHECK_EQ(fkp_status_encode(&s, wire, sizeof wire), -EINVAL);
    /* a buffer too small */
    CHECK_EQ(fkp_encode(m, wire, 20), -EMSGSIZE);
    free(m);
    free(d);
    free(r);
}

/* ---- a keeper in a child ------------------------------------------------ */

static pid_t start_keeper(uint64_t budget, bool check_fds)
{
    return kc_start(sock, logpath, budget, check_fds);
}

static bool log_has(const char *s)
{
    FILE *f = fopen(logpath, "r");
    if (!f) return false;
    char line[2048];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, s)) found = true;
    fclose(f);
    return found;
}

static ferry_keep *conn(void)
{
    ferry_keep *k = NULL;
    char err[1400];
    int rc = ferry_keep_connect(sock, 3000, &k, err, sizeof err);
    if (rc < 0) fprintf(stderr, "connect: %s\n", err);
    CHECK_EQ(rc, 0);
    return k;
}

static ferry_keep_id ident(const char *tensor)
{
    ferry_keep_id id = {"/ckpt/model.safetensors", tensor, 0, 1000000, 1700000000123456789ll, 0xabcdefull};
    return id;
}

/* put nbytes of byte value v under id and commit: 0 or the failing code */
static int put_fill(ferry_keep *k, const ferry_keep_id *id, uint64_t nbytes, uint8_t v)
{
    int fd;
    uint64_t entry;
    int rc = ferry_keep_put_begin(k, id, nbytes, &fd, &entry);
    if (rc < 0) return rc;
    uint8_t *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    if (p != MAP_FAILED) {
        memset(p, v, nbytes);
        munmap(p, nbytes);
    }
    close(fd);
    return ferry_keep_put_commit(k, entry);
}

/* 1 when id is a hit of nbytes all equal to v (released after), 0 a miss,
 * -1 a hit with other bytes, or the error. */
static int get_check(ferry_keep *k, const ferry_keep_id *id, uint64_t nbytes, int v, int *stale)
{
    int fd;
    uint64_t off, n, entry;
    int rc = ferry_keep_get(k, id, &fd, &off, &n, &entry, stale);
    if (rc <= 0) return rc;
    int ok = 1;
    if (n != nbytes) ok = -1;
    uint8_t *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)off);
    if (p == MAP_FAILED) ok = -1;
    else {
        for (uint64_t i = 0; i < n && ok == 1; i++)
            if (p[i] != (uint8_t)v) ok = -1;
        munmap(p, n);
    }
    close(fd);
    CHECK_EQ(ferry_keep_release(k, entry), 0);
    return ok;
}

/* sock's address for a raw bind or connect, as the keeper and its client
 * make it (through its directory when the path is longer than sun_path
 * holds: *dirfd, closed by the caller after). */
static bool raw_addr(struct sockaddr_un *a, int *dirfd)
{
    char err[1400];
    int rc = fk_sock_addr(sock, a, dirfd, err, sizeof err);
    if (rc < 0) fprintf(stderr, "%s\n", err);
    return rc == 0;
}

static void setup_case(const char *name)
{
    CHECK_EQ(check_tmpdir(dir, sizeof dir, name), 0);
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    snprintf(logpath, sizeof logpath, "%s/keeper.log", dir);
}

static void test_put_get_two_processes(void)
{
    setup_case("keep2p");
    pid_t kp = start_keeper(64 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    ferry_keep_id id = ident("w");
    /* a writer process puts and exits */
    pid_t w = fork();
    if (w == 0) {
        ferry_keep *k;
        char err[1400];
        if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) < 0) _exit(10);
        int fd;
        uint64_t entry;
        if (ferry_keep_put_begin(k, &id, 1 << 20, &fd, &entry) < 0) _exit(11);
        uint8_t *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) _exit(12);
        for (int i = 0; i < 1 << 20; i++) p[i] = (uint8_t)(i * 7 + 3);
        if (ferry_keep_put_commit(k, entry) < 0) _exit(13);
        _exit(0);
    }
    int st = kc_wait(w, 10);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* a reader process finds the bytes, after the writer is gone */
    pid_t r = fork();
    if (r == 0) {
        ferry_keep *k;
        char err[1400];
        if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) < 0) _exit(10);
        int fd;
        uint64_t off, n, entry;
        if (ferry_keep_get(k, &id, &fd, &off, &n, &entry, NULL) != 1) _exit(11);
        if (n != 1 << 20) _exit(12);
        uint8_t *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)off);
        if (p == MAP_FAILED) _exit(13);
        for (int i = 0; i < 1 << 20; i++)
            if (p[i] != (uint8_t)(i * 7 + 3)) _exit(14);
        /* committed memory takes no new writes */
        if (pwrite(fd, "x", 1, 0) == 1) _exit(15);
        _exit(0);
    }
    st = kc_wait(r, 10);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st)) fprintf(stderr, "reader exited %d\n", WEXITSTATUS(st));
    /* the reader's attachment ended with it */
    ferry_keep *k = conn();
    ferry_keep_status *s = NULL;
    CHECK_EQ(ferry_keep_status_get(k, &s), 0);
    if (s) {
        CHECK_EQ(s->nentries, 1);
        CHECK_EQ(s->npending, 0);
        CHECK_EQ(s->nclients, 1);
        CHECK(s->used == 1 << 20);
        CHECK(s->listed_entries == 1 && s->entries[0].attached == 0 &&
              strcmp(s->entries[0].tensor, "w") == 0);
        ferry_keep_status_free(s);
    }
    /* DROP of the file, then a miss */
    CHECK_EQ(ferry_keep_drop(k, FERRY_KEEP_DROP_FILE, &id), 1);
    CHECK_EQ(get_check(k, &id, 1 << 20, 0, NULL), 0);
    ferry_keep_close(k);
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

static void test_stale(void)
{
    setup_case("keepstale");
    pid_t kp = start_keeper(64 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    ferry_keep *k = conn();
    ferry_keep_id a = ident("a"), b = ident("b");
    int stale = -1;
    for (int which = 0; which < 3; which++) {
        CHECK_EQ(put_fill(k, &a, 4096, 1), 0);
        CHECK_EQ(put_fill(k, &b, 4096, 2), 0);
        CHECK_EQ(get_check(k, &a, 4096, 1, &stale), 1);
        ferry_keep_id changed = a;
        if (which == 0) changed.mtime_ns++;
        else if (which == 1) changed.file_size--;
        else changed.header_digest ^= 1;
        CHECK_EQ(get_check(k, &changed, 4096, 1, &stale), 0);
        CHECK_EQ(stale, 1);
        /* the old version's entries are gone, b's too */
        CHECK_EQ(get_check(k, &a, 4096, 1, &stale), 0);
        CHECK_EQ(stale, 0);
        CHECK_EQ(get_check(k, &b, 4096, 2, &stale), 0);
    }
    /* a put of a new version of the file drops the old version's entries */
    CHECK_EQ(put_fill(k, &a, 4096, 1), 0);
    CHECK_EQ(put_fill(k, &b, 4096, 2), 0);
    ferry_keep_id b2 = b;
    b2.mtime_ns += 1000;
    CHECK_EQ(put_fill(k, &b2, 4096, 3), 0);
    ferry_keep_id a2 = a;
    a2.mtime_ns += 1000;
    CHECK_EQ(get_check(k, &a2, 4096, 1, &stale), 0);
    CHECK_EQ(stale, 0); /* already dropped at b2's commit */
    CHECK_EQ(get_check(k, &b2, 4096, 3, &stale), 1);
    /* a put of the same key replaces the entry */
    CHECK_EQ(put_fill(k, &b2, 4096, 4), 0);
    CHECK_EQ(get_check(k, &b2, 4096, 4, &stale), 1);
    ferry_keep_status *s = NULL;
    CHECK_EQ(ferry_keep_status_get(k, &s), 0);
    if (s) {
        CHECK_EQ(s->nentries, 1);
        CHECK(s->used == 4096);
        ferry_keep_status_free(s);
    }
    /* by index, no name */
    ferry_keep_id byi = ident(NULL);
    byi.index = 5;
    CHECK_EQ(put_fill(k, &byi, 100, 9), 0);
    CHECK_EQ(get_check(k, &byi, 100, 9, NULL), 1);
    byi.index = 6;
    CHECK_EQ(get_check(k, &byi, 100, 9, NULL), 0);
    ferry_keep_close(k);
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

static void test_lru(void)
{
    setup_case("keeplru");
    pid_t kp = start_keeper(3 * 4096, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    ferry_keep *k = conn();
    ferry_keep_id A = ident("A"), B = ident("B"), C = ident("C"), D = ident("D"), E = ident("E");
    CHECK_EQ(put_fill(k, &A, 4096, 'A'), 0);
    CHECK_EQ(put_fill(k, &B, 4096, 'B'), 0);
    CHECK_EQ(put_fill(k, &C, 4096, 'C'), 0);
    CHECK_EQ(get_check(k, &A, 4096, 'A', NULL), 1); /* A is now more recent than B */
    CHECK_EQ(put_fill(k, &D, 4096, 'D'), 0);        /* B goes */
    CHECK_EQ(get_check(k, &B, 4096, 'B', NULL), 0);
    CHECK_EQ(get_check(k, &C, 4096, 'C', NULL), 1);
    CHECK_EQ(get_check(k, &A, 4096, 'A', NULL), 1);
    CHECK_EQ(get_check(k, &D, 4096, 'D', NULL), 1);
    CHECK(log_has("least recently used"));
    /* an attached entry is never dropped for room, even as the least recent */
    int fdA;
    uint64_t off, n, eA;
    CHECK_EQ(ferry_keep_get(k, &C, &fdA, &off, &n, &eA, NULL),
             1); /* C: attached, and now the oldest use... */
    CHECK_EQ(get_check(k, &A, 4096, 'A', NULL), 1);
    CHECK_EQ(get_check(k, &D, 4096, 'D', NULL), 1);
    CHECK_EQ(put_fill(k, &E, 4096, 'E'), 0); /* ...so A goes, the least recent unattached */
    CHECK_EQ(get_check(k, &A, 4096, 'A', NULL), 0);
    CHECK_EQ(get_check(k, &C, 4096, 'C', NULL), 1);
    /* everything attached: no room, a clear error */
    int fdD, fdE;
    uint64_t eD, eE;
    CHECK_EQ(ferry_keep_get(k, &D, &fdD, &off, &n, &eD, NULL), 1);
    CHECK_EQ(ferry_keep_get(k, &E, &fdE, &off, &n, &eE, NULL), 1);
    CHECK_EQ(put_fill(k, &A, 4096, 'A'), -ENOSPC);
    CHECK_STR_HAS(ferry_keep_errmsg(k), "no room");
    CHECK_STR_HAS(ferry_keep_errmsg(k), sock);
    /* the connection goes on after an error reply */
    CHECK_EQ(ferry_keep_release(k, eD), 0);
    CHECK_EQ(ferry_keep_release(k, eD), -ENOENT);
    CHECK_EQ(put_fill(k, &A, 4096, 'A'), 0); /* D went */
    CHECK_EQ(get_check(k, &D, 4096, 'D', NULL), 0);
    /* larger than the whole budget */
    CHECK_EQ(put_fill(k, &B, 4 * 4096, 'B'), -ENOSPC);
    CHECK_STR_HAS(ferry_keep_errmsg(k), "budget");
    close(fdA);
    close(fdD);
    close(fdE);
    ferry_keep_close(k);
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

static void test_same_user(void)
{
    CHECK(fk_peer_allowed(0, 0));
    CHECK(fk_peer_allowed(1000, 1000));
    CHECK(!fk_peer_allowed(65534, 0));
    CHECK(!fk_peer_allowed(0, 1000));
    if (geteuid() != 0) {
        check_skip("a connection from another uid needs root to make (the check itself passed)");
        return;
    }
    /* under /tmp: the build tree's folders may not be searchable by nobody */
    snprintf(dir, sizeof dir, "/tmp/ferry-keepuid-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    snprintf(logpath, sizeof logpath, "%s/keeper.log", dir);
    pid_t kp = start_keeper(1 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    /* open the file-system gate on purpose: the uid check must hold alone */
    CHECK_EQ(chmod(dir, 0711), 0);
    CHECK_EQ(chmod(sock, 0666), 0);
    pid_t c = fork();
    if (c == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(20);
        /* a raw connection (the client library would refuse a keeper of
         * another uid itself): HELLO, and the keeper hangs up without a word */
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        memcpy(a.sun_path, sock, strlen(sock) + 1);
        if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) _exit(21);
        struct timeval tv = {5, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        fkp_msg *h = calloc(1, sizeof *h);
        h->type = FKP_HELLO;
        h->version = FKP_VERSION;
        int len = fkp_encode(h, wire, sizeof wire);
        free(h);
        ssize_t w = send(s, wire, (size_t)len, MSG_NOSIGNAL);
        (void)w; /* may already fail: closed */
        uint8_t b[64];
        ssize_t r = recv(s, b, sizeof b, 0);
        if (r > 0) _exit(22); /* answered: wrong */
        if (r < 0 && errno != ECONNRESET) _exit(23);
        _exit(0);
    }
    int st = kc_wait(c, 10);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(log_has("uid 65534: the keeper serves only its own user"));
    /* and the keeper's own user is still served */
    ferry_keep *k = conn();
    ferry_keep_close(k);
    CHECK_EQ(kc_stop(kp), 0);

    /* the other way: a client refuses a listener of another uid */
    char other[700], osock[800];
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(osock, sizeof osock, "%s/k.sock", other);
    CHECK_EQ(mkdir(other, 0700), 0);
    CHECK_EQ(chown(other, 65534, 65534), 0);
    int ready[2];
    CHECK_EQ(pipe(ready), 0);
    pid_t l = fork();
    if (l == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(20);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(osock) >= sizeof a.sun_path) _exit(21);
        memcpy(a.sun_path, osock, strlen(osock) + 1);
        if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) _exit(22);
        if (write(ready[1], "r", 1) != 1) _exit(23);
        pause();
        _exit(0);
    }
    char r;
    CHECK_EQ(read(ready[0], &r, 1), 1);
    close(ready[0]);
    close(ready[1]);
    char err[1400];
    CHECK_EQ(ferry_keep_connect(osock, 1000, &k, err, sizeof err), -EPERM);
    CHECK_STR_HAS(err, osock);
    CHECK_STR_HAS(err, "runs as uid 65534, not as this user");
    kill(l, SIGKILL);
    waitpid(l, NULL, 0);
    check_rmtree(dir);
}

static void test_private_dir(void)
{
    setup_case("keepdir");
    char err[1400], sub[700], p[900];
    uid_t me = geteuid();
    /* made 0700 where missing */
    snprintf(sub, sizeof sub, "%s/new", dir);
    snprintf(p, sizeof p, "%s/k.sock", sub);
    CHECK_EQ(fk_private_dir(p, true, me, err, sizeof err), 0);
    struct stat st;
    CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK_EQ(fk_private_dir(p, false, me, err, sizeof err), 0);
    /* a wider mode is refused, by the check and by the keeper */
    CHECK_EQ(chmod(sub, 0755), 0);
    CHECK_EQ(fk_private_dir(p, true, me, err, sizeof err), -EPERM);
    CHECK_STR_HAS(err, "mode 0755");
    ferry_keep_opts o = {.socket = p, .device = "sim", .budget = 1 << 20, .stop_fd = -1};
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -EPERM);
    CHECK_STR_HAS(err, sub);
    CHECK_EQ(chmod(sub, 0700), 0);
    /* another owner is refused */
    CHECK_EQ(fk_private_dir(p, true, me + 1, err, sizeof err), -EPERM);
    CHECK_STR_HAS(err, "belongs to uid");
    /* a symlink to a private directory is refused */
    char link[800];
    snprintf(link, sizeof link, "%s/link", dir);
    CHECK_EQ(symlink(sub, link), 0);
    snprintf(p, sizeof p, "%s/k.sock", link);
    CHECK_EQ(fk_private_dir(p, true, me, err, sizeof err), -ENOTDIR);
    /* a socket path that is a file */
    snprintf(p, sizeof p, "%s/file", sub);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    close(fd);
    o.socket = p;
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -EEXIST);
    CHECK_STR_HAS(err, "not a socket");
    /* devices */
    o.socket = sock;
    o.device = "cuda:0";
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -ENOTSUP);
    CHECK(strcmp(err, "device cuda:0: the CUDA backend is not built yet; use sim:SIZE") == 0);
    o.device = "sim:0";
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -EINVAL);
    o.device = "tpu";
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -EINVAL);
    /* the default socket */
    char *old = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
    setenv("XDG_RUNTIME_DIR", "/run/user/5", 1);
    CHECK_EQ(ferry_keep_default_socket(p, sizeof p), 0);
    CHECK(strcmp(p, "/run/user/5/ferry/keep.sock") == 0);
    unsetenv("XDG_RUNTIME_DIR");
    CHECK_EQ(ferry_keep_default_socket(p, sizeof p), 0);
    char want[64];
    snprintf(want, sizeof want, "/tmp/ferry-keep-%u/keep.sock", (unsigned)getuid());
    CHECK(strcmp(p, want) == 0);
    CHECK_EQ(ferry_keep_default_socket(p, 10), -ENAMETOOLONG);
    if (old) setenv("XDG_RUNTIME_DIR", old, 1);
    free(old);
    check_rmtree(dir);
}

/* A client that puts 256 KiB entries "t0", "t1", ... of byte value i+1 and
 * commits each, forever, writing in small steps (so that SIGKILL lands in
 * every phase). */
static void endless_putter(int stall_fd)
{
    ferry_keep *k;
    char err[1400];
    if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) < 0) _exit(10);
    for (unsigned i = 0;; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%u", i % 24);
        ferry_keep_id id = ident(name);
        int fd;
        uint64_t entry;
        const size_t nb = 256 << 10;
        if (ferry_keep_put_begin(k, &id, nb, &fd, &entry) < 0) _exit(11);
        uint8_t *p = mmap(NULL, nb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) _exit(12);
        for (size_t o = 0; o < nb; o += 16384) {
            memset(p + o, (int)((i % 24) + 1), 16384);
            if (stall_fd >= 0 && o == nb / 2) { /* killed here, mid-put */
                if (write(stall_fd, "s", 1) != 1) _exit(14);
                pause();
            }
        }
        munmap(p, nb);
        close(fd);
        if (ferry_keep_put_commit(k, entry) < 0) _exit(13);
    }
}

static void test_kill_client(void)
{
    setup_case("keepkillc");
    pid_t kp = start_keeper(4 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    unsigned seed = (unsigned)getpid();
    int bad_entries = 0, left_pending = 0;
    for (int round = 0; round < 24; round++) {
        /* round 0 is killed for sure mid-put (the child says when it is
         * there); the others at a random moment */
        int sp[2] = {-1, -1};
        if (round == 0) CHECK_EQ(pipe(sp), 0);
        pid_t c = fork();
        if (c == 0) endless_putter(sp[1]);
        if (round == 0) {
            struct pollfd pf = {sp[0], POLLIN, 0};
            CHECK_EQ(poll(&pf, 1, 10000), 1);
            close(sp[0]);
            close(sp[1]);
        } else usleep((useconds_t)(rand_r(&seed) % 30000));
        kill(c, SIGKILL);
        waitpid(c, NULL, 0);
        ferry_keep *k = conn();
        if (!k) break;
        /* the keeper notices the close on its next poll: wait for it */
        ferry_keep_status *s = NULL;
        double t0 = kc_now();
        for (;;) {
            CHECK_EQ(ferry_keep_status_get(k, &s), 0);
            if (!s || (s->npending == 0 && s->nclients == 1) || kc_now() - t0 > 5) break;
            ferry_keep_status_free(s);
            s = NULL;
            usleep(2000);
        }
        if (!s) {
            ferry_keep_close(k);
            break;
        }
        left_pending += s->npending != 0 || s->pending_bytes != 0;
        CHECK(s->used == (uint64_t)s->nentries * (256 << 10));
        /* every committed entry holds its whole bytes */
        for (uint32_t i = 0; i < s->listed_entries; i++) {
            ferry_keep_id id = ident(s->entries[i].tensor);
            int v = atoi(s->entries[i].tensor + 1) + 1;
            bad_entries += get_check(k, &id, 256 << 10, v, NULL) != 1;
        }
        ferry_keep_status_free(s);
        ferry_keep_close(k);
    }
    CHECK_EQ(bad_entries, 0);
    CHECK_EQ(left_pending, 0);
    /* and it goes on working */
    ferry_keep *k = conn();
    ferry_keep_id id = ident("after");
    CHECK_EQ(put_fill(k, &id, 4096, 0x77), 0);
    CHECK_EQ(get_check(k, &id, 4096, 0x77, NULL), 1);
    ferry_keep_close(k);
    CHECK(log_has("unfinished puts discarded"));
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

static void test_kill_keeper(void)
{
    setup_case("keepkillk");
    pid_t kp = start_keeper(1 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    ferry_keep *k = conn();
    ferry_keep_id id = ident("w");
    CHECK_EQ(put_fill(k, &id, 4096, 5), 0);
    int fd;
    uint64_t off, n, entry;
    CHECK_EQ(ferry_keep_get(k, &id, &fd, &off, &n, &entry, NULL), 1);
    kill(kp, SIGKILL);
    waitpid(kp, NULL, 0);
    /* what the client had mapped stays readable */
    uint8_t *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)off);
    CHECK(p != MAP_FAILED && p[0] == 5 && p[n - 1] == 5);
    if (p != MAP_FAILED) munmap(p, n);
    close(fd);
    /* the next call is an error naming the socket, at once */
    double t0 = kc_now();
    CHECK(ferry_keep_get(k, &id, &fd, &off, &n, &entry, NULL) < 0);
    CHECK(kc_now() - t0 < 2);
    CHECK_STR_HAS(ferry_keep_errmsg(k), sock);
    CHECK_STR_HAS(ferry_keep_errmsg(k), "closed the connection");
    CHECK(ferry_keep_status_get(k, &(ferry_keep_status *){NULL}) < 0); /* and stays one */
    ferry_keep_close(k);
    char err[1400];
    CHECK(ferry_keep_connect(sock, 1000, &k, err, sizeof err) < 0);
    CHECK_STR_HAS(err, sock);
    CHECK_STR_HAS(err, "no keeper is running there");
    /* a new keeper replaces the dead one's socket; the cache is gone */
    kp = start_keeper(1 << 20, false);
    CHECK(kp > 0);
    if (kp > 0) {
        k = conn();
        CHECK_EQ(get_check(k, &id, 4096, 5, NULL), 0);
        ferry_keep_close(k);
        CHECK_EQ(kc_stop(kp), 0);
    }
    /* a socket whose listener never answers: a timeout, not a hang */
    int l = socket(AF_UNIX, SOCK_STREAM, 0), ldir = -1;
    struct sockaddr_un a;
    CHECK(raw_addr(&a, &ldir));
    CHECK_EQ(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(listen(l, 4), 0);
    if (ldir >= 0) close(ldir);
    t0 = kc_now();
    CHECK_EQ(ferry_keep_connect(sock, 300, &k, err, sizeof err), -ETIMEDOUT);
    CHECK(kc_now() - t0 < 2);
    CHECK_STR_HAS(err, "no answer from the keeper in 300 ms");
    close(l);
    check_rmtree(dir);
}

static int count_memfds(pid_t pid)
{
    char d[64], path[320], target[256];
    snprintf(d, sizeof d, "/proc/%d/fd", (int)pid);
    DIR *dd = opendir(d);
    if (!dd) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd))) {
        snprintf(path, sizeof path, "%s/%s", d, e->d_name);
        ssize_t r = readlink(path, target, sizeof target - 1);
        if (r > 0) {
            target[r] = '\0';
            n += strstr(target, "memfd:ferry-keep") != NULL;
        }
    }
    closedir(dd);
    return n;
}

static void test_clean_exit(void)
{
    setup_case("keepexit");
    int fds0 = count_fds();
    pid_t kp = start_keeper(1 << 20, true);
    CHECK(kp > 0);
    if (kp <= 0) return;
    CHECK_EQ(count_memfds(kp), 0);
    ferry_keep *k = conn();
    ferry_keep_id a = ident("a"), b = ident("b"), c = ident("c"), d = ident("d");
    CHECK_EQ(put_fill(k, &a, 4096, 1), 0);
    CHECK_EQ(put_fill(k, &b, 8192, 2), 0);
    CHECK_EQ(put_fill(k, &c, 100, 3), 0);
    int pfd, gfd;
    uint64_t pentry, off, n, gentry;
    CHECK_EQ(ferry_keep_put_begin(k, &d, 4096, &pfd, &pentry), 0); /* left unfinished */
    struct stat pst;
    CHECK_EQ(fstat(pfd, &pst), 0); /* its memory is the keeper's already: allocated, not left to the writer */
    CHECK((uint64_t)pst.st_blocks * 512 >= 4096);
    CHECK_EQ(ferry_keep_get(k, &a, &gfd, &off, &n, &gentry, NULL), 1); /* left attached */
    CHECK_EQ(count_memfds(kp), 4);
    ferry_keep_status *s = NULL;
    CHECK_EQ(ferry_keep_status_get(k, &s), 0);
    if (s) {
        CHECK_EQ(s->nentries, 3);
        CHECK_EQ(s->npending, 1);
        CHECK_EQ(s->used, 4096 + 8192 + 100 + 4096);
        CHECK_EQ(s->pending_bytes, 4096);
        CHECK_EQ(s->listed_clients, 1);
        CHECK(s->listed_clients == 1 && s->clients[0].pid == getpid() && s->clients[0].attached == 1 &&
              s->clients[0].pending == 1);
        ferry_keep_status_free(s);
    }
    /* a dropped entry's memory leaves the keeper */
    CHECK_EQ(ferry_keep_drop(k, FERRY_KEEP_DROP_ENTRY, &c), 1);
    CHECK_EQ(count_memfds(kp), 3);
    /* SIGTERM while a client is connected: exit 0, the child saw its
     * descriptors back where they were (exit 3 otherwise), socket gone */
    CHECK_EQ(kc_stop(kp), 0);
    CHECK(access(sock, F_OK) != 0 && errno == ENOENT);
    CHECK(log_has("stopping: 2 entries"));
    close(pfd);
    close(gfd);
    ferry_keep_close(k);
    CHECK_EQ(count_fds(), fds0);
    /* DROP ALL on a fresh keeper */
    kp = start_keeper(1 << 20, true);
    CHECK(kp > 0);
    if (kp > 0) {
        k = conn();
        CHECK_EQ(put_fill(k, &a, 4096, 1), 0);
        CHECK_EQ(put_fill(k, &b, 4096, 1), 0);
        CHECK_EQ(ferry_keep_drop(k, FERRY_KEEP_DROP_ALL, NULL), 2);
        CHECK_EQ(count_memfds(kp), 0);
        ferry_keep_close(k);
        CHECK_EQ(kc_stop(kp), 0);
    }
    CHECK_EQ(count_fds(), fds0);
    check_rmtree(dir);
}

/* Eight clients at once, each putting and reading back its own entries
 * while the others do: one poll loop serves them all. */
static void test_many_clients(void)
{
    setup_case("keepmany");
    pid_t kp = start_keeper(8 * 20 * 8192, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    pid_t kids[8];
    for (int c = 0; c < 8; c++) {
        kids[c] = fork();
        if (kids[c] == 0) {
            ferry_keep *k;
            char err[1400];
            if (ferry_keep_connect(sock, 5000, &k, err, sizeof err) < 0) _exit(10);
            for (int i = 0; i < 20; i++) {
                char name[32];
                snprintf(name, sizeof name, "c%d.t%d", c, i);
                ferry_keep_id id = ident(name);
                if (put_fill(k, &id, 8192, (uint8_t)(c * 20 + i)) != 0) _exit(11);
            }
            for (int i = 0; i < 20; i++) {
                char name[32];
                snprintf(name, sizeof name, "c%d.t%d", c, i);
                ferry_keep_id id = ident(name);
                if (get_check(k, &id, 8192, (uint8_t)(c * 20 + i), NULL) != 1) _exit(12);
            }
            ferry_keep_close(k);
            _exit(0);
        }
    }
    int ok = 0;
    for (int c = 0; c < 8; c++) {
        int st = kc_wait(kids[c], 20);
        ok += st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    CHECK_EQ(ok, 8);
    ferry_keep *k = conn();
    ferry_keep_status *s = NULL;
    CHECK_EQ(ferry_keep_status_get(k, &s), 0);
    if (s) {
        CHECK_EQ(s->nentries, 160);
        CHECK_EQ(s->listed_entries, 160);
        CHECK_EQ(s->used, 160 * 8192);
        ferry_keep_status_free(s);
    }
    ferry_keep_close(k);
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

/* Raw bytes at the keeper: a bad header or body closes that connection only. */
static void test_bad_client(void)
{
    setup_case("keepbad");
    pid_t kp = start_keeper(1 << 20, false);
    CHECK(kp > 0);
    if (kp <= 0) return;
    for (int variant = 0; variant < 3; variant++) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), sdir = -1;
        struct sockaddr_un a;
        CHECK(raw_addr(&a, &sdir));
        CHECK_EQ(connect(s, (struct sockaddr *)&a, sizeof a), 0);
        if (sdir >= 0) close(sdir);
        struct timeval tv = {2, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (variant == 0) put_hdr(FKP_MAGIC ^ 0xff, FKP_VERSION, FKP_HELLO, 4, 0);
        else if (variant == 1) put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HELLO, 5, 0); /* a HELLO body of 5 bytes */
        else put_hdr(FKP_MAGIC, FKP_VERSION, FKP_HIT, 24, 0); /* a reply sent as a request */
        memset(wire + FKP_HDR, 0, 24);
        size_t len = FKP_HDR + (variant == 1 ? 5 : variant == 2 ? 24 : 4);
        CHECK_EQ(send(s, wire, len, MSG_NOSIGNAL), (long long)len);
        /* an ERROR reply, then the close */
        uint8_t got[FKP_HDR + FKP_MAX_BODY];
        size_t have = 0;
        ssize_t r;
        while ((r = recv(s, got + have, sizeof got - have, 0)) > 0) have += (size_t)r;
        /* closed: an end of file, or a reset where the keeper left bytes unread */
        CHECK(r == 0 || (r < 0 && errno == ECONNRESET));
        fkp_hdr h;
        CHECK(have >= FKP_HDR && fkp_hdr_decode(got, &h) == 0 && h.type == FKP_ERROR);
        close(s);
    }
    ferry_keep *k = conn();
    ferry_keep_id id = ident("w");
    CHECK_EQ(put_fill(k, &id, 4096, 1), 0);
    /* a commit of an entry that is not this connection's */
    CHECK_EQ(ferry_keep_put_commit(k, 999), -ENOENT);
    ferry_keep_id rel = {"relative.safetensors", "w", 0, 1, 1, 1};
    int fd;
    uint64_t e;
    CHECK_EQ(ferry_keep_put_begin(k, &rel, 4096, &fd, &e), -EINVAL);
    CHECK_STR_HAS(ferry_keep_errmsg(k), "absolute");
    char longname[FKP_MAX_NAME + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ferry_keep_id lid = ident(longname);
    CHECK_EQ(ferry_keep_put_begin(k, &lid, 4096, &fd, &e), -EINVAL);
    CHECK_STR_HAS(ferry_keep_errmsg(k), "tensor name");
    CHECK_EQ(get_check(k, &id, 4096, 1, NULL), 1);
    ferry_keep_close(k);
    CHECK(log_has("malformed message"));
    CHECK(log_has("bad message header"));
    CHECK_EQ(kc_stop(kp), 0);
    check_rmtree(dir);
}

/* A socket path longer than sun_path holds: the keeper binds it and clients
 * connect through a descriptor of its directory, the working directory left
 * alone and no descriptor left open; a name too long even that way is
 * refused by both, naming the path and the limit. */
static void test_long_socket(void)
{
    setup_case("keeplong");
    char cwd0[4096], cwd1[4096];
    CHECK(getcwd(cwd0, sizeof cwd0) != NULL);
    int w = snprintf(sock, sizeof sock, "%s/%s/k.sock", dir,
                     "a-folder-whose-name-alone-takes-most-of-what-a-unix-socket-address-holds-"
                     "so-that-the-whole-path-is-longer");
    CHECK(w > 108 && (size_t)w < sizeof sock);
    int fds0 = count_fds();
    pid_t kp = start_keeper(1 << 20, true);
    CHECK(kp > 0);
    if (kp <= 0) return;
    ferry_keep *k = conn();
    ferry_keep_id a = ident("a");
    CHECK_EQ(put_fill(k, &a, 4096, 7), 0);
    ferry_keep_close(k);
    pid_t c = fork(); /* another process finds it */
    if (c == 0) {
        ferry_keep *k2;
        char err[1400];
        if (ferry_keep_connect(sock, 3000, &k2, err, sizeof err) < 0) _exit(10);
        _exit(get_check(k2, &a, 4096, 7, NULL) == 1 ? 0 : 11);
    }
    int st = kc_wait(c, 10);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* a second keeper there sees the live one through the same address */
    char err[1400];
    ferry_keep_opts o = {.socket = sock, .device = "sim", .budget = 1 << 20, .stop_fd = -1};
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -EADDRINUSE);
    CHECK_STR_HAS(err, "a keeper is already running there");
    CHECK_EQ(kc_stop(kp), 0); /* (exit 3 had the keeper's descriptors not come back) */
    CHECK(access(sock, F_OK) != 0 && errno == ENOENT);
    CHECK_EQ(count_fds(), fds0);
    CHECK(getcwd(cwd1, sizeof cwd1) != NULL && strcmp(cwd0, cwd1) == 0);
    /* a name that does not fit even after /proc/self/fd/N/ */
    char p[900];
    w = snprintf(p, sizeof p, "%s/%0100d.sock", dir, 0);
    CHECK((size_t)w < sizeof p);
    o.socket = p;
    CHECK_EQ(ferry_keep_serve(&o, err, sizeof err), -ENAMETOOLONG);
    CHECK_STR_HAS(err, p);
    CHECK_STR_HAS(err, "at most 107 bytes");
    CHECK_EQ(ferry_keep_connect(p, 1000, &k, err, sizeof err), -ENAMETOOLONG);
    CHECK_STR_HAS(err, p);
    CHECK_STR_HAS(err, "at most 107 bytes");
    CHECK(access(p, F_OK) != 0);
    CHECK_EQ(count_fds(), fds0);
    check_rmtree(dir);
}

static void test_file_identity(void)
{
    setup_case("keepident");
    char p[700];
    snprintf(p, sizeof p, "%s/f.bin", dir);
    FILE *f = fopen(p, "wb");
    for (int i = 0; i < 3000; i++) fputc(i & 0xff, f);
    fclose(f);
    uint64_t size, digest, digest2;
    int64_t mtime, mtime2;
    CHECK_EQ(ferry_keep_file_identity(p, &size, &mtime, &digest), 0);
    CHECK_EQ(size, 3000);
    struct stat st;
    stat(p, &st);
    CHECK(mtime == (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
    uint8_t buf[3000];
    for (int i = 0; i < 3000; i++) buf[i] = (uint8_t)i;
    CHECK(digest == ferry_xxh3(buf, 3000));
    f = fopen(p, "r+b");
    fputc(0xee, f);
    fclose(f);
    CHECK_EQ(ferry_keep_file_identity(p, &size, &mtime2, &digest2), 0);
    CHECK(digest2 != digest);
    /* every system call it makes through io/ failing in turn: an error, never a wrong identity */
    int failed = 0, n;
    for (n = 1; n < 100; n++) {
        uint64_t s2 = 0, d3 = 0;
        int64_t m3 = 0;
        fy_fault_arm(n, EIO);
        int rc = ferry_keep_file_identity(p, &s2, &m3, &d3);
        bool fired = fy_fault_fired();
        fy_fault_arm(0, 0);
        if (!fired) {
            CHECK_EQ(rc, 0);
            CHECK(s2 == size && m3 == mtime2 && d3 == digest2);
            break;
        }
        CHECK_EQ(rc, -EIO);
        failed++;
    }
    CHECK(failed >= 2 && n < 100); /* the open and the read at least */
    /* a FIFO is refused at once, not waited on for a writer */
    snprintf(p, sizeof p, "%s/fifo", dir);
    CHECK_EQ(mkfifo(p, 0600), 0);
    CHECK_EQ(ferry_keep_file_identity(p, &size, &mtime, &digest), -EINVAL);
    snprintf(p, sizeof p, "%s/missing", dir);
    CHECK_EQ(ferry_keep_file_identity(p, &size, &mtime, &digest), -ENOENT);
    check_rmtree(dir);
}

#define CASES(CASE)                                           \
    CASE(codec_roundtrip, test_codec_roundtrip())             \
    CASE(codec_reject, test_codec_reject())                   \
    CASE(put_get_two_processes, test_put_get_two_processes()) \
    CASE(stale, test_stale())                                 \
    CASE(lru, test_lru())                                     \
    CASE(same_user, test_same_user())                         \
    CASE(private_dir, test_private_dir())                     \
    CASE(kill_client, test_kill_client())                     \
    CASE(kill_keeper, test_kill_keeper())                     \
    CASE(clean_exit, test_clean_exit())                       \
    CASE(many_clients, test_many_clients())                   \
    CASE(bad_client, test_bad_client())                       \
    CASE(long_socket, test_long_socket())                     \
    CASE(file_identity, test_file_identity())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    alarm(120); /* a hung case fails instead of hanging ctest */
    check_run();
    return check_summary();
}
