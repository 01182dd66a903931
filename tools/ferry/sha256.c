/* SPDX-License-Identifier: Apache-2.0 */
/* sha256.c - SHA-256 as FIPS 180-4 specifies it (sections 4.1.2, 4.2.2, 5.1.1,
 * 5.3.3, 6.2). The block function is portable C, or on x86-64 the SHA
 * extensions' sha256rnds2/sha256msg1/sha256msg2 where CPUID reports them: on a
 * CPU that has them that is several times faster, close to the read rate of a
 * page-cached file. tests/unit/test_sha256.c checks both against the FIPS
 * examples and each other, tests/scripts/test_sha256_hashlib.py against
 * Python's hashlib. */
#include "sha256.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define SHA256_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* the first 32 bits of the fractional parts of the cube roots of the first 64 primes */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static inline uint32_t load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* nblocks 64-byte blocks of data into the state h (FIPS 180-4 6.2.2) */
static void blocks_portable(uint32_t h[8], const uint8_t *data, size_t nblocks)
{
    for (; nblocks; nblocks--, data += SHA256_BLOCK_SIZE) {
        uint32_t w[64];
        for (int t = 0; t < 16; t++) w[t] = load_be32(data + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = s1 + w[t - 7] + s0 + w[t - 16];
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int t = 0; t < 64; t++) {
            uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = hh + S1 + ch + K[t] + w[t];
            uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
            uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = S0 + maj;
            hh = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a;
        h[1] += b;
        h[2] += c;
        h[3] += d;
        h[4] += e;
        h[5] += f;
        h[6] += g;
        h[7] += hh;
    }
}

#ifdef SHA256_X86
/* The same with the SHA extensions. sha256rnds2 does two rounds on the state
 * held as {A,B,E,F} and {C,D,G,H} (highest lane first), taking W[t]+K[t] for
 * the two rounds from the low 64 bits of its third operand. The message
 * schedule goes four words at a time: for the words t..t+3 (t >= 16),
 * sha256msg1 gives W[t-16] + s0(W[t-15]), W[t-7] is added, and sha256msg2
 * adds s1(W[t-2]) (its last two words of the previous four feeding the first
 * two it makes). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t h[8], const uint8_t *data,
                                                                     size_t nblocks)
{
    /* big-endian words of the block into lanes 0..3 */
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&h[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&h[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xb1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1b);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xf0);
    for (; nblocks; nblocks--, data += SHA256_BLOCK_SIZE) {
        __m128i abef0 = abef, cdgh0 = cdgh, m[4];
        for (int i = 0; i < 4; i++)
            m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)), bswap);
        for (int g = 0; g < 16; g++) {
            /* m[g & 3]: W[4g..4g+3], made from the four before it from g = 4 on */
            if (g >= 4) {
                __m128i w7 = _mm_alignr_epi8(m[(g - 1) & 3], m[(g - 2) & 3], 4);
                __m128i x = _mm_add_epi32(_mm_sha256msg1_epu32(m[g & 3], m[(g - 3) & 3]), w7);
                m[g & 3] = _mm_sha256msg2_epu32(x, m[(g - 1) & 3]);
            }
            __m128i wk = _mm_add_epi32(m[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0e));
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1b);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xf0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* CPUID: SHA (leaf 7 EBX bit 29), SSE4.1 (leaf 1 ECX bit 19), SSSE3 (leaf 1 ECX bit 9) */
static bool cpu_has_sha(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if (!(c & (1u << 19)) || !(c & (1u << 9))) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 29)) != 0;
}
#endif

typedef void blocks_fn(uint32_t h[8], const uint8_t *data, size_t nblocks);
static bool force_portable;

static blocks_fn *pick(void)
{
#ifdef SHA256_X86
    /* CPUID once; the answer does not change in a process */
    static int has = -1;
    if (has < 0) has = cpu_has_sha();
    if (has && !force_portable) return blocks_shani;
#endif
    return blocks_portable;
}

const char *sha256_backend(void)
{
    return pick() == blocks_portable ? "portable" : "sha-ni";
}

void sha256_force_portable(bool on)
{
    force_portable = on;
}

void sha256_init(sha256_ctx *c)
{
    /* the first 32 bits of the fractional parts of the square roots of the first 8 primes */
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    blocks_fn *blocks = pick();
    size_t have = (size_t)(c->bytes % SHA256_BLOCK_SIZE);
    c->bytes += n;
    if (have) {
        size_t take = SHA256_BLOCK_SIZE - have < n ? SHA256_BLOCK_SIZE - have : n;
        memcpy(c->buf + have, p, take);
        p += take;
        n -= take;
        if (have + take < SHA256_BLOCK_SIZE) return;
        blocks(c->h, c->buf, 1);
    }
    if (n >= SHA256_BLOCK_SIZE) {
        blocks(c->h, p, n / SHA256_BLOCK_SIZE);
        p += n / SHA256_BLOCK_SIZE * SHA256_BLOCK_SIZE;
        n %= SHA256_BLOCK_SIZE;
    }
    if (n) memcpy(c->buf, p, n);
}

void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_SIZE])
{
    /* a 1 bit, zeros up to 56 bytes into a block, then the length in bits, big-endian (5.1.1) */
    uint64_t bits = c->bytes * 8;
    size_t have = (size_t)(c->bytes % SHA256_BLOCK_SIZE);
    uint8_t pad[2 * SHA256_BLOCK_SIZE] = {0x80};
    size_t padlen = (have < 56 ? 56 : 120) - have;
    for (int i = 0; i < 8; i++) pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, pad, padlen + 8);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, c->h[i]);
    memset(c, 0, sizeof *c);
}
