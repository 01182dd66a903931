/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_keep.c - libFuzzer target for the keeper's message codec
 * (src/keep/keep_proto.c), the code that reads every byte a client or the
 * keeper sends.
 *
 * The input is read twice:
 *  1. as a stream of messages, as the keeper and its client read it: a
 *     16-byte header, then the body it announces, again until the input ends
 *     or a header or body is refused;
 *  2. whole, as the body of every message type (so that each decoder sees
 *     every length, not only the ones a header announced).
 * Invariants, on every decode that succeeds:
 *  - the header's body length is at most FKP_MAX_BODY and its type known;
 *  - decoded strings end within their arrays, hold no more than their limits,
 *    and a checkpoint path is absolute (DROP of everything: empty);
 *  - encoding the decoded message gives back the very bytes decoded (the
 *    encoding is canonical), except DROP of everything, whose unused fields
 *    are not kept: that one decodes again to the same scope and no path;
 *  - a STATUS_REPLY's lists are within FKP_MAX_LIST and its strings bounded,
 *    and it re-encodes to the same bytes.
 * A violated invariant calls __builtin_trap(); LeakSanitizer checks the one
 * allocation (the status block). */
#include "keep/keep_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                    \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

static uint8_t out[FKP_HDR + FKP_MAX_BODY];

static void check_str(const char *s, size_t max)
{
    CHECK(memchr(s, 0, max + 1) != NULL);
}

static void check_status(const uint8_t *body, size_t len)
{
    ferry_keep_status *s = NULL;
    int rc = fkp_status_decode(body, len, &s);
    CHECK(rc == 0 || rc == -EPROTO || rc == -ENOMEM);
    CHECK((rc == 0) == (s != NULL));
    if (!s) return;
    CHECK(s->listed_entries <= FKP_MAX_LIST && s->listed_clients <= FKP_MAX_LIST);
    CHECK(strlen(s->device) <= FKP_MAX_DEVICE);
    for (uint32_t i = 0; i < s->listed_entries; i++) {
        CHECK(strlen(s->entries[i].path) <= FKP_MAX_PATH && s->entries[i].path[0] == '/');
        CHECK(strlen(s->entries[i].tensor) <= FKP_MAX_NAME);
    }
    int n = fkp_status_encode(s, out, sizeof out);
    CHECK(n == (int)(FKP_HDR + len));
    CHECK(memcmp(out + FKP_HDR, body, len) == 0);
    free(s);
}

static void check_body(uint16_t type, const uint8_t *body, size_t len)
{
    if (type == FKP_STATUS_REPLY) {
        check_status(body, len);
        return;
    }
    static fkp_msg m, again;
    int rc = fkp_body_decode(type, body, len, &m);
    CHECK(rc == 0 || rc == -EPROTO);
    if (rc) return;
    CHECK(m.type == type);
    check_str(m.id.path, FKP_MAX_PATH);
    check_str(m.id.tensor, FKP_MAX_NAME);
    check_str(m.text, FKP_MAX_ERRMSG);
    if (type == FKP_PUT_BEGIN || type == FKP_GET || (type == FKP_DROP && m.scope != FKP_DROP_ALL))
        CHECK(m.id.path[0] == '/');
    if (type == FKP_PUT_BEGIN) CHECK(m.nbytes > 0);
    if (type == FKP_HELLO_OK) CHECK(strlen(m.text) <= FKP_MAX_DEVICE);
    int n = fkp_encode(&m, out, sizeof out);
    CHECK(n >= FKP_HDR);
    fkp_hdr h;
    CHECK(fkp_hdr_decode(out, &h) == 0 && h.type == type && h.len == (uint32_t)n - FKP_HDR);
    if (type == FKP_DROP && m.scope == FKP_DROP_ALL) {
        CHECK(fkp_body_decode(type, out + FKP_HDR, h.len, &again) == 0);
        CHECK(again.scope == FKP_DROP_ALL && again.id.path[0] == '\0');
        return;
    }
    CHECK(h.len == len && memcmp(out + FKP_HDR, body, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* 1: a stream of messages */
    size_t off = 0;
    while (size - off >= FKP_HDR) {
        fkp_hdr h;
        int rc = fkp_hdr_decode(data + off, &h);
        CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
        if (rc) break;
        CHECK(h.len <= FKP_MAX_BODY);
        if (h.len > size - off - FKP_HDR) break;
        check_body(h.type, data + off + FKP_HDR, h.len);
        off += FKP_HDR + h.len;
    }
    /* 2: the whole input as every type's body */
    if (size <= FKP_MAX_BODY) {
        static const uint16_t types[] = {FKP_HELLO,     FKP_PUT_BEGIN,    FKP_PUT_COMMIT, FKP_GET,
                                         FKP_RELEASE,   FKP_DROP,         FKP_STATUS,     FKP_HELLO_OK,
                                         FKP_PUT_READY, FKP_OK,           FKP_HIT,        FKP_MISS,
                                         FKP_DROPPED,   FKP_STATUS_REPLY, FKP_ERROR};
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_body(types[i], data, size);
    }
    return 0;
}
