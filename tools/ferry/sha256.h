/* SPDX-License-Identifier: Apache-2.0 */
/* sha256.h - SHA-256 (FIPS 180-4) for `ferry hash --sha256`: a portable
 * implementation, and on x86-64 CPUs with the SHA extensions one that uses
 * them, picked at run time. */
#ifndef FERRY_CLI_SHA256_H
#define FERRY_CLI_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_SIZE 32
#define SHA256_BLOCK_SIZE 64

typedef struct sha256_ctx {
    uint32_t h[8];                  /* the chaining state H0..H7 */
    uint64_t bytes;                 /* message bytes taken so far */
    uint8_t buf[SHA256_BLOCK_SIZE]; /* a partial block: bytes % 64 of them */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
/* Pads, writes the digest to out and leaves c to be initialised again. */
void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_SIZE]);

/* The block function in use: "sha-ni" or "portable". */
const char *sha256_backend(void);
/* Use the portable block function even where the SHA extensions are present
 * (on) or go back to the choice made at run time (off); for the tests, which
 * check that both give the same digests. */
void sha256_force_portable(bool on);

#endif
