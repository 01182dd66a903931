/* SPDX-License-Identifier: Apache-2.0 */
/* test_sha256.c - the CLI's SHA-256 (tools/ferry/sha256.c): the FIPS 180-4
 * example messages, the same digest whatever the pieces update is given, and
 * the SHA-extension block function equal to the portable one where the CPU
 * has it. tests/scripts/test_sha256_hashlib.py compares `ferry hash --sha256`
 * with Python's hashlib on files of odd sizes. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sha256.h"

static void hex(const uint8_t d[SHA256_DIGEST_SIZE], char out[65])
{
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void digest(const void *p, size_t n, char out[65])
{
    sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, p, n);
    sha256_final(&c, d);
    hex(d, out);
}

/* the example messages of FIPS 180-4's SHA-256 (NIST's "SHA256.pdf",
 * "SHA256ShortMsg") and their digests */
static void check_vectors(void)
{
    static const struct {
        const char *msg, *want;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", /* 448 bits */
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
         "mnopqrstnopqrstu", /* 896 bits */
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char got[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        digest(v[i].msg, strlen(v[i].msg), got);
        if (strcmp(got, v[i].want) != 0)
            fprintf(stderr, "%s: \"%s\": %s, want %s\n", sha256_backend(), v[i].msg, got, v[i].want);
        CHECK(strcmp(got, v[i].want) == 0);
    }
    /* one million 'a': in one piece, and as 1000 updates of 1000 */
    size_t n = 1000000;
    char *a = malloc(n);
    CHECK(a != NULL);
    if (!a) return;
    memset(a, 'a', n);
    const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    digest(a, n, got);
    CHECK(strcmp(got, want) == 0);
    sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    for (int i = 0; i < 1000; i++) sha256_update(&c, a, 1000);
    sha256_final(&c, d);
    hex(d, got);
    CHECK(strcmp(got, want) == 0);
    free(a);
}

static void test_vectors(void)
{
    printf("block function: %s\n", sha256_backend());
    check_vectors();
    sha256_force_portable(true);
    CHECK(strcmp(sha256_backend(), "portable") == 0);
    check_vectors();
    sha256_force_portable(false);
}

/* xorshift64: the same bytes on every run */
static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Every length from 0 to 300 (each padding case: a final block with room
 * for the length or not) and some longer ones, in one update and in random
 * pieces, with either block function: one digest per message. */
static void test_pieces(void)
{
    size_t max = 70000;
    uint8_t *buf = malloc(max);
    CHECK(buf != NULL);
    if (!buf) return;
    for (size_t i = 0; i < max; i++) buf[i] = (uint8_t)next();
    static const size_t longer[] = {1000, 4095, 4096, 4097, 65535, 65536, 65537, 69999};
    size_t nlen = 301 + sizeof longer / sizeof longer[0];
    int bad = 0;
    for (size_t k = 0; k < nlen; k++) {
        size_t len = k < 301 ? k : longer[k - 301];
        char whole[65], other[65], pieces[65];
        digest(buf, len, whole);
        sha256_force_portable(true);
        digest(buf, len, other);
        sha256_force_portable(k % 2 == 0);
        sha256_ctx c;
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_init(&c);
        for (size_t off = 0; off < len;) {
            size_t take = (size_t)(next() % 150);
            if (take > len - off) take = len - off;
            sha256_update(&c, buf + off, take);
            off += take;
        }
        sha256_final(&c, d);
        hex(d, pieces);
        sha256_force_portable(false);
        if (strcmp(whole, other) != 0 || strcmp(whole, pieces) != 0) {
            if (bad++ < 5)
                fprintf(stderr, "length %zu: %s, portable %s, in pieces %s\n", len, whole, other, pieces);
        }
    }
    CHECK_EQ(bad, 0);
    free(buf);
}

#define CASES(CASE)               \
    CASE(vectors, test_vectors()) \
    CASE(pieces, test_pieces())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    int rc = check_args(argc, argv);
    if (rc >= 0) return rc;
    check_run();
    return check_summary();
}
