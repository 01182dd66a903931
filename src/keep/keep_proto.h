/* SPDX-License-Identifier: Apache-2.0 */
/* keep_proto.h - the keeper's wire protocol: encoding and decoding of its
 * messages, pure (no I/O, no allocation except fkp_status_decode's one block).
 *
 * Every message is a 16-byte little-endian header followed by a body:
 *     u32 magic "FKEP"   u16 version   u16 type   u32 body length   u32 reserved (0)
 * The body length is at most FKP_MAX_BODY. Integers are little-endian;
 * strings are a u16 length then that many bytes, no NUL among them (not
 * NUL-terminated on the wire); lists are a u32 count then the items, the count
 * bounded. A body must be consumed exactly: trailing bytes are an error.
 *
 * A file descriptor travels beside PUT_READY and HIT (SCM_RIGHTS): the codec
 * does not see it. Decoders return 0 or -EPROTO/-EMSGSIZE/-EINVAL, never
 * read outside the bytes given, and leave their output usable only on 0. */
#ifndef FERRY_KEEP_PROTO_H
#define FERRY_KEEP_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ferry_experimental.h"

#define FKP_MAGIC 0x50454b46u /* "FKEP" read as a little-endian u32 */
#define FKP_VERSION 1
#define FKP_HDR 16
#define FKP_MAX_BODY 65536u
#define FKP_MAX_PATH 4096   /* bytes of a checkpoint path */
#define FKP_MAX_NAME 1024   /* bytes of a tensor name */
#define FKP_MAX_DEVICE 64   /* bytes of a device string */
#define FKP_MAX_ERRMSG 1024 /* bytes of an ERROR's message */
#define FKP_MAX_LIST 4096   /* items of a STATUS_REPLY list */

enum fkp_type {
    /* requests, client to keeper */
    FKP_HELLO = 0x01,      /* u32 version */
    FKP_PUT_BEGIN = 0x02,  /* identity, u64 nbytes */
    FKP_PUT_COMMIT = 0x03, /* u64 entry */
    FKP_GET = 0x04,        /* identity */
    FKP_RELEASE = 0x05,    /* u64 entry */
    FKP_DROP = 0x06,       /* u8 scope, str path, str tensor, u32 index */
    FKP_STATUS = 0x07,     /* (empty) */
    /* replies, keeper to client */
    FKP_HELLO_OK = 0x81,     /* u32 version, u32 pid, u64 budget, str device */
    FKP_PUT_READY = 0x82,    /* u64 entry, u64 nbytes; + fd */
    FKP_OK = 0x83,           /* (empty) */
    FKP_HIT = 0x84,          /* u64 entry, u64 offset, u64 nbytes; + fd */
    FKP_MISS = 0x85,         /* u8 reason (enum fkp_miss) */
    FKP_DROPPED = 0x86,      /* u32 count */
    FKP_STATUS_REPLY = 0x87, /* see fkp_status_encode */
    FKP_ERROR = 0xff,        /* i32 code (a positive errno), str message */
};

enum fkp_miss { FKP_MISS_ABSENT = 0, FKP_MISS_STALE = 1 };
/* DROP's scope: the entry of one identity's key, every entry of a file, all. */
enum fkp_scope { FKP_DROP_ENTRY = 0, FKP_DROP_FILE = 1, FKP_DROP_ALL = 2 };

typedef struct fkp_hdr {
    uint16_t type;
    uint32_t len;
} fkp_hdr;

/* An entry's identity, decoded: path and tensor NUL-terminated copies. The
 * path is absolute (starts with '/'), 1..FKP_MAX_PATH bytes; the tensor name
 * 0..FKP_MAX_NAME bytes (empty when the tensor is named by index only). */
typedef struct fkp_ident {
    char path[FKP_MAX_PATH + 1];
    char tensor[FKP_MAX_NAME + 1];
    uint32_t index;
    uint64_t file_size;
    int64_t mtime_ns;
    uint64_t digest;
} fkp_ident;

/* One decoded message of any type but STATUS_REPLY. */
typedef struct fkp_msg {
    uint16_t type;
    uint32_t version;              /* HELLO, HELLO_OK */
    uint32_t pid;                  /* HELLO_OK */
    uint64_t entry;                /* PUT_COMMIT, RELEASE, PUT_READY, HIT */
    uint64_t nbytes;               /* PUT_BEGIN, PUT_READY, HIT; HELLO_OK: the budget */
    uint64_t offset;               /* HIT */
    uint32_t count;                /* DROPPED */
    uint8_t scope;                 /* DROP */
    uint8_t reason;                /* MISS */
    int32_t code;                  /* ERROR */
    char text[FKP_MAX_ERRMSG + 1]; /* ERROR's message, HELLO_OK's device */
    fkp_ident id;                  /* PUT_BEGIN, GET, DROP (DROP: path empty for ALL) */
} fkp_msg;

/* The header at b[0..FKP_HDR-1]: 0, or -EPROTO (magic, version, an unknown
 * type, reserved bits) or -EMSGSIZE (body length over FKP_MAX_BODY). */
int fkp_hdr_decode(const uint8_t *b, fkp_hdr *h);
/* A body of type h.type and len bytes into m: 0 or -EPROTO. Not for
 * STATUS_REPLY (fkp_status_decode). */
int fkp_body_decode(uint16_t type, const uint8_t *body, size_t len, fkp_msg *m);

/* Encoding: the whole message (header and body) into out[0..cap-1]; returns
 * its length, or -EMSGSIZE when it does not fit cap or FKP_MAX_BODY, or
 * -EINVAL for a field the decoder would refuse (so that nothing encoded is
 * undecodable). m->type says which fields are used (as in fkp_msg). */
int fkp_encode(const fkp_msg *m, uint8_t *out, size_t cap);

/* STATUS_REPLY: u64 budget, u64 used, u64 pending_bytes, u32 nentries,
 * u32 npending, u32 nclients, str device, u32 n, n x {u64 id, str path,
 * str tensor, u32 index, u64 nbytes, u32 attached, u64 file_size,
 * i64 mtime_ns, u64 digest, u64 idle_ms}, u32 m, m x {i32 pid, u32 uid,
 * u32 attached, u32 pending}. The lists may hold fewer items than the totals
 * (what fits in one body). */
int fkp_status_encode(const ferry_keep_status *s, uint8_t *out, size_t cap);
/* Decodes into one allocated block (free with free(); strings inside it): 0,
 * -EPROTO or -ENOMEM. */
int fkp_status_decode(const uint8_t *body, size_t len, ferry_keep_status **out);

/* The wire size of one STATUS_REPLY entry item with these string lengths. */
size_t fkp_status_entry_size(size_t path_len, size_t tensor_len);

#endif
