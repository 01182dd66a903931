/* SPDX-License-Identifier: Apache-2.0 */
/* gpu.c - device specs ("cuda", "cuda:N", "sim:SIZE") to backends, and the
 * size parser that the CLI and the sim spec share. */
#include "gpu.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}
static char lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* Exact arithmetic for "1.5GB": at most 19 fraction digits are kept (10^19 <
 * 2^64); the product of a 64-bit fraction and a 2^60 multiplier fits in 128 bits. */
bool fy_parse_size(const char *s, uint64_t *out)
{
    if (!s || !out || !is_digit(*s)) return false;
    const char *p = s;
    uint64_t whole = 0;
    for (; is_digit(*p); p++)
        if (fy_mul_ovf(whole, 10, &whole) || fy_add_ovf(whole, (uint64_t)(*p - '0'), &whole)) return false;

    uint64_t frac = 0, scale = 1;
    bool has_frac = false;
    if (*p == '.') {
        p++;
        if (!is_digit(*p)) return false;
        has_frac = true;
        for (int kept = 0; is_digit(*p); p++) {
            if (kept == 19) continue; /* finer than a byte at any multiplier: ignored */
            frac = frac * 10 + (uint64_t)(*p - '0');
            scale *= 10;
            kept++;
        }
    }

    /* Units, case-insensitive: none or B = bytes; K M G T P E = binary (as in
     * "24G"); KiB ... EiB = binary; KB ... EB = decimal. */
    static const char prefixes[] = "kmgtpe";
    uint64_t mult = 1;
    char c = lower(*p);
    if (c == 'b') {
        p++;
    } else if (c != '\0') {
        const char *at = strchr(prefixes, c);
        if (!at) return false;
        int power = (int)(at - prefixes) + 1;
        p++;
        bool decimal = false;
        if (lower(p[0]) == 'i' && lower(p[1]) == 'b') p += 2;
        else if (lower(p[0]) == 'b') {
            p++;
            decimal = true;
        }
        for (int i = 0; i < power; i++) mult *= decimal ? 1000u : 1024u;
    }
    if (*p != '\0') return false;
    if (has_frac && mult == 1) return false; /* "1.5" bytes */

    unsigned __int128 v = (unsigned __int128)whole * mult + (unsigned __int128)frac * mult / scale;
    if (v > UINT64_MAX) return false;
    *out = (uint64_t)v;
    return true;
}

FERRY_API int ferry_parse_size(const char *s, uint64_t *out)
{
    return fy_parse_size(s, out) ? 0 : FERRY_E_INVAL;
}

int fy_gpu_open(const char *spec, const ferry_allocator *mem, fy_err *err, fy_gpu **out)
{
    static const char forms[] = "expected cuda, cuda:N (N = device number), sim:SIZE[,RATE/s] (e.g. "
                                "sim:24GiB or sim:24GiB,25GB/s) or cpu";
    char q[128];
    if (!out) return fy_seterr(err, FERRY_E_INVAL, "fy_gpu_open: no place for the device handle");
    *out = NULL;
    if (!spec) return fy_seterr(err, FERRY_E_INVAL, "no device given: %s", forms);
    if (!mem) mem = fy_default_allocator();

    if (strcmp(spec, "cuda") == 0) return fy_gpu_cuda_open(0, mem, err, out);
    if (strncmp(spec, "cuda:", 5) == 0) {
        const char *p = spec + 5;
        long n = 0;
        if (!is_digit(*p)) goto bad_ordinal;
        for (; is_digit(*p); p++) {
            n = n * 10 + (*p - '0');
            if (n > INT_MAX) goto bad_ordinal;
        }
        if (*p != '\0') goto bad_ordinal;
        return fy_gpu_cuda_open((int)n, mem, err, out);
    bad_ordinal:
        return fy_seterr(err, FERRY_E_INVAL,
                         "device %s: the device number must be a non-negative integer: %s",
                         fy_quote(q, sizeof q, spec), forms);
    }
    if (strncmp(spec, "sim:", 4) == 0) {
        uint64_t cap, rate = 0;
        char size[64];
        const char *comma = strchr(spec + 4, ',');
        size_t sl = comma ? (size_t)(comma - (spec + 4)) : strlen(spec + 4);
        if (comma) { /* the modelled copy rate: "25GB/s" */
            size_t rl = strlen(comma + 1);
            char r[64];
            if (rl < 3 || rl >= sizeof r || strcmp(comma + 1 + rl - 2, "/s") != 0 ||
                (memcpy(r, comma + 1, rl - 2), r[rl - 2] = '\0', !fy_parse_size(r, &rate)) || rate == 0)
                return fy_seterr(err, FERRY_E_INVAL,
                                 "device %s: bad copy rate after the comma (examples: 25GB/s, 12.5GiB/s): %s",
                                 fy_quote(q, sizeof q, spec), forms);
        }
        if (sl >= sizeof size) sl = sizeof size - 1; /* too long to be a size: refused below */
        memcpy(size, spec + 4, sl);
        size[sl] = '\0';
        if (!fy_parse_size(size, &cap))
            return fy_seterr(err, FERRY_E_INVAL,
                             "device %s: bad size (examples: 24GiB, 24G, 512MiB, 1.5GB, 1000000): %s",
                             fy_quote(q, sizeof q, spec), forms);
        if (cap == 0)
            return fy_seterr(err, FERRY_E_INVAL, "device %s: a sim device needs a capacity above 0 bytes",
                             fy_quote(q, sizeof q, spec));
        return fy_gpu_sim_open(cap, rate, mem, err, out);
    }
    if (strcmp(spec, "cpu") == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (1ull << 34);
        int rc = fy_gpu_sim_open(ram, 0, mem, err, out);
        if (rc < 0) return rc;
        (*out)->host_visible = true;
        snprintf((*out)->desc, sizeof(*out)->desc, "cpu (pageable host memory, %.1f GiB)",
                 (double)ram / (1u << 30));
        return 0;
    }
    if (strcmp(spec, "sim") == 0)
        return fy_seterr(err, FERRY_E_INVAL, "device 'sim' needs a capacity: %s", forms);
    return fy_seterr(err, FERRY_E_INVAL, "unknown device %s: %s", fy_quote(q, sizeof q, spec), forms);
}

void fy_gpu_close(fy_gpu *g)
{
    if (g && g->ops && g->ops->close) g->ops->close(g);
}
