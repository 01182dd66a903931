/* SPDX-License-Identifier: Apache-2.0 */
/* cast.c - floating-point dtype casts for `ferry convert --dtype`: F16, BF16,
 * F32 and F64 elements to F16, BF16 or F32, bit by bit (no dependence on the
 * FPU's rounding mode or on the compiler's float conversions). Rounding is
 * IEEE 754's round-to-nearest, ties-to-even; too large a magnitude becomes
 * Inf, too small a signed zero, subnormals are produced and read exactly;
 * Inf stays Inf; a NaN stays a NaN of the same sign, keeping the top bits of
 * its payload that fit and made quiet (what x86's cvtsd2ss and vcvtps2ph do). */
#include "format.h"

#include <string.h>

typedef struct fmt {
    int ebits, mbits; /* exponent and stored mantissa bits */
} fmt;

static bool float_fmt(ferry_dtype dt, fmt *f)
{
    switch (dt) {
    case FERRY_DTYPE_F16: *f = (fmt){5, 10}; return true;
    case FERRY_DTYPE_BF16: *f = (fmt){8, 7}; return true;
    case FERRY_DTYPE_F32: *f = (fmt){8, 23}; return true;
    case FERRY_DTYPE_F64: *f = (fmt){11, 52}; return true;
    default: return false;
    }
}

bool fy_cast_is_float(ferry_dtype dt)
{
    fmt f;
    return float_fmt(dt, &f);
}

bool fy_cast_target_ok(ferry_dtype dt)
{
    return dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 || dt == FERRY_DTYPE_F32;
}

ferry_dtype fy_cast_out_dtype(ferry_dtype src, ferry_dtype to)
{
    return to != FERRY_DTYPE_INVALID && fy_cast_is_float(src) ? to : src;
}

/* Bits of one element in format f into an F64 (exact: every F16, BF16 and F32
 * value is a double). */
static uint64_t widen(uint64_t v, fmt f)
{
    int sh = 52 - f.mbits;
    uint64_t sign = (v >> (f.ebits + f.mbits)) & 1, e = (v >> f.mbits) & ((1u << f.ebits) - 1);
    uint64_t m = v & ((UINT64_C(1) << f.mbits) - 1), emax = (1u << f.ebits) - 1;
    int bias = (1 << (f.ebits - 1)) - 1;
    uint64_t out;
    if (e == emax) out = (UINT64_C(0x7FF) << 52) | (m << sh); /* Inf, NaN (payload kept) */
    else if (e == 0 && m == 0) out = 0;
    else if (e == 0) { /* subnormal: normalise; top is the leading one's position */
        int top = 63 - __builtin_clzll(m);
        out = ((uint64_t)(top - f.mbits + 1 - bias + 1023) << 52) |
              ((m << (52 - top)) & ((UINT64_C(1) << 52) - 1));
    } else out = ((e - (uint64_t)bias + 1023) << 52) | (m << sh);
    return out | sign << 63;
}

/* q = x / 2^sh rounded to nearest, ties to even (1 <= sh <= 63). */
static uint64_t rne_shift(uint64_t x, int sh)
{
    uint64_t q = x >> sh, rem = x & ((UINT64_C(1) << sh) - 1), half = UINT64_C(1) << (sh - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

/* An F64's bits to format f (narrower), rounded to nearest even. */
static uint64_t narrow(uint64_t d, fmt f)
{
    uint64_t sign = d >> 63, e = (d >> 52) & 0x7FF, m = d & ((UINT64_C(1) << 52) - 1);
    uint64_t emax = (1u << f.ebits) - 1, out;
    int bias = (1 << (f.ebits - 1)) - 1, drop = 52 - f.mbits;
    if (e == 0x7FF) {
        out = emax << f.mbits;
        if (m) out |= (m >> drop) | (UINT64_C(1) << (f.mbits - 1)); /* quiet, top payload bits */
    } else if (e == 0) {
        out = 0; /* zero, or an F64 subnormal: far below half of f's smallest subnormal */
    } else {
        int64_t te = (int64_t)e - 1023 + bias; /* f's biased exponent */
        uint64_t sig = m | (UINT64_C(1) << 52);
        if (te >= 1) {
            /* rounded keeps the implicit one; a carry out of the mantissa
             * lands in the exponent, and past the largest one gives Inf */
            out = ((uint64_t)(te - 1) << f.mbits) + rne_shift(sig, drop);
            if (out >= emax << f.mbits) out = emax << f.mbits;
        } else {
            int sh = drop + (int)(1 - te);
            /* below 2^-1 of the smallest subnormal: sig < 2^53 <= 2^(sh-1) */
            out = sh > 53 ? 0 : rne_shift(sig, sh); /* may round up to the smallest normal */
        }
    }
    return out | sign << (f.ebits + f.mbits);
}

static uint64_t load(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i); /* little-endian, as the files are */
    return v;
}

static void store(uint8_t *p, int bytes, uint64_t v)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int fy_cast(ferry_dtype src, ferry_dtype dst, const void *in, void *out, size_t n)
{
    fmt fs, fd;
    if (!float_fmt(src, &fs) || !fy_cast_target_ok(dst) || !float_fmt(dst, &fd)) return FERRY_E_INVAL;
    int sb = (1 + fs.ebits + fs.mbits) / 8, db = (1 + fd.ebits + fd.mbits) / 8;
    const uint8_t *p = in;
    uint8_t *q = out;
    if (src == dst) {
        memmove(q, p, n * (size_t)sb);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = load(p + i * (size_t)sb, sb);
        uint64_t d = src == FERRY_DTYPE_F64 ? v : widen(v, fs);
        store(q + i * (size_t)db, db, fd.mbits == 52 ? d : narrow(d, fd));
    }
    return 0;
}
