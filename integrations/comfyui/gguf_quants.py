# SPDX-License-Identifier: MIT
"""gguf_quants - ggml's block-quantized tensor types, dequantized with torch
(on whichever device the bytes are: a layer dequantizes its weight on the GPU
as it runs).

Each type stores a row of values in blocks of BLOCK values and SIZE bytes,
little-endian, as ggml lays them out:

  Q8_0  d:f16, q:int8[32]                       x = d*q
  Q4_0  d:f16, q:u8[16] (low nibbles: values 0-15, high: 16-31)   x = d*(q-8)
  Q4_1  d:f16, m:f16, q:u8[16]                  x = d*q + m
  Q5_0  d:f16, qh:u32 (the fifth bits), q:u8[16] x = d*(q|h<<4 - 16)
  Q5_1  d:f16, m:f16, qh:u32, q:u8[16]          x = d*(q|h<<4) + m
  Q2_K  scales:u8[16] (4-bit scale, 4-bit min), q:u8[64] (2 bits), d, dmin:f16
  Q3_K  hmask:u8[32], q:u8[64] (2 bits), scales:u8[12] (16 6-bit), d:f16
  Q4_K  d, dmin:f16, scales:u8[12] (8 6-bit scales and mins), q:u8[128]
  Q5_K  d, dmin:f16, scales:u8[12], qh:u8[32], q:u8[128]
  Q6_K  ql:u8[128], qh:u8[64], scales:int8[16], d:f16

The K types hold 256 values a block in sub-blocks of 16 or 32, each with its
own scale (and min). Other ggml types (the IQ and TQ families, ...) are not
here: SIZES says which are."""
import torch

QK = 32
QK_K = 256

# name: (values per block, bytes per block)
SIZES = {
    "Q8_0": (QK, 34), "Q4_0": (QK, 18), "Q4_1": (QK, 20), "Q5_0": (QK, 22), "Q5_1": (QK, 24),
    "Q2_K": (QK_K, 84), "Q3_K": (QK_K, 110), "Q4_K": (QK_K, 144), "Q5_K": (QK_K, 176), "Q6_K": (QK_K, 210),
}


def _f16(b):
    """[n, 2k] uint8 -> [n, k] float32 (little-endian f16)."""
    return b.contiguous().view(torch.float16).float()


def _split(blocks, *sizes):
    out, at = [], 0
    for s in sizes:
        out.append(blocks[:, at:at + s])
        at += s
    return out


def _nibbles(q):
    """[n, k] uint8 -> [n, 2k]: the low nibbles, then the high ones."""
    return torch.cat([q & 0x0F, q >> 4], dim=1)


def _bits(x, width, count):
    """[n, k] uint8 -> [n, count, k]: field i (width bits) of each byte."""
    shifts = torch.arange(0, width * count, width, device=x.device, dtype=torch.uint8).view(1, count, 1)
    return (x.unsqueeze(1) >> shifts) & ((1 << width) - 1)


def _q8_0(b):
    d, q = _split(b, 2, 32)
    return _f16(d) * q.contiguous().view(torch.int8).float()


def _q4_0(b):
    d, q = _split(b, 2, 16)
    return _f16(d) * (_nibbles(q).float() - 8)


def _q4_1(b):
    d, m, q = _split(b, 2, 2, 16)
    return _f16(d) * _nibbles(q).float() + _f16(m)


def _high_bits(qh):
    """[n, 4] uint8 (a little-endian u32) -> [n, 32]: bit j of it, as 0 or 16."""
    return (_bits(qh, 1, 8).permute(0, 2, 1).reshape(qh.shape[0], 32) << 4)


def _q5_0(b):
    d, qh, q = _split(b, 2, 4, 16)
    return _f16(d) * ((_nibbles(q) | _high_bits(qh)).float() - 16)


def _q5_1(b):
    d, m, qh, q = _split(b, 2, 2, 4, 16)
    return _f16(d) * (_nibbles(q) | _high_bits(qh)).float() + _f16(m)


def _scale_min_k4(s):
    """Q4_K/Q5_K: [n, 12] uint8 -> ([n, 8], [n, 8]) 6-bit scales and mins:
    j < 4: s[j] & 63, s[j+4] & 63; j >= 4: the low nibble of s[j+4] and the
    top two bits of s[j-4] (scale), the high nibble of s[j+4] and the top two
    bits of s[j] (min)."""
    lo, hi = s[:, 0:4], s[:, 4:8]
    tail = s[:, 8:12]
    sc = torch.cat([lo & 63, (tail & 0x0F) | ((lo >> 6) << 4)], dim=1)
    mn = torch.cat([hi & 63, (tail >> 4) | ((hi >> 6) << 4)], dim=1)
    return sc.float(), mn.float()


def _q4_k(b):
    d, dmin, s, q = _split(b, 2, 2, 12, 128)
    sc, mn = _scale_min_k4(s)
    n = b.shape[0]
    # each 32 bytes of q: 32 values (low nibbles) then 32 (high nibbles)
    vals = torch.stack([q.reshape(n, 4, 32) & 0x0F, q.reshape(n, 4, 32) >> 4], dim=2).reshape(n, 8, 32).float()
    return (_f16(d) * sc).unsqueeze(2) * vals - (_f16(dmin) * mn).unsqueeze(2)


def _q5_k(b):
    d, dmin, s, qh, q = _split(b, 2, 2, 12, 32, 128)
    sc, mn = _scale_min_k4(s)
    n = b.shape[0]
    low = torch.stack([q.reshape(n, 4, 32) & 0x0F, q.reshape(n, 4, 32) >> 4], dim=2).reshape(n, 8, 32)
    high = _bits(qh, 1, 8) << 4  # [n, 8, 32]: sub-block i takes bit i of each qh byte
    vals = (low | high).float()
    return (_f16(d) * sc).unsqueeze(2) * vals - (_f16(dmin) * mn).unsqueeze(2)


def _q6_k(b):
    ql, qh, s, d = _split(b, 128, 64, 16, 2)
    n = b.shape[0]
    ql = ql.reshape(n, 2, 64)
    qh = qh.reshape(n, 2, 32)
    # per half of 128: values l, l+32, l+64, l+96 (l < 32) take ql[l] low,
    # ql[l+32] low, ql[l] high, ql[l+32] high, with bits 0-1, 2-3, 4-5, 6-7 of qh[l]
    low = torch.stack([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], dim=2)
    high = torch.stack([(qh >> k) & 3 for k in (0, 2, 4, 6)], dim=2)
    vals = ((low | (high << 4)).to(torch.int16) - 32).float().reshape(n, 16, 16)  # 16 sub-blocks of 16
    sc = s.contiguous().view(torch.int8).float()
    return (_f16(d).unsqueeze(2) * sc.unsqueeze(2) * vals).reshape(n, 256)


def _two_bits(q):
    """Q2_K/Q3_K: [n, 64] uint8 -> [n, 2, 4, 2, 16]: per half of 128 values
    (32 bytes), bits 2k..2k+1 (k = 0..3) of its first and second 16 bytes:
    sub-blocks of 16 values in that order."""
    q = q.reshape(q.shape[0], 2, 1, 2, 16)
    shifts = torch.tensor([0, 2, 4, 6], device=q.device, dtype=torch.uint8).view(1, 1, 4, 1, 1)
    return (q >> shifts) & 3


def _q2_k(b):
    s, q, d, dmin = _split(b, 16, 64, 2, 2)
    n = b.shape[0]
    vals = _two_bits(q).reshape(n, 16, 16).float()
    sc = (s & 0x0F).float()
    mn = (s >> 4).float()
    return (_f16(d).unsqueeze(2) * sc.unsqueeze(2) * vals - _f16(dmin).unsqueeze(2) * mn.unsqueeze(2)).reshape(n, 256)


def _q3_k_scales(s):
    """[n, 12] uint8 -> [n, 16] scales (6 bits, minus 32): scale i has its low
    nibble in s[i] (i < 8) or the high nibble of s[i - 8], and its top two
    bits in s[8 + i mod 4] at bit 2 * (i div 4)."""
    lo = torch.cat([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], dim=1)          # [n, 16]
    top = s[:, 8:12]                                                    # [n, 4]
    idx = torch.arange(16, device=s.device)
    hi = (top[:, idx % 4] >> (2 * (idx // 4)).to(torch.uint8)) & 3
    return (lo | (hi << 4)).to(torch.int16).float() - 32


def _q3_k(b):
    hm, q, s, d = _split(b, 32, 64, 12, 2)
    n = b.shape[0]
    sc = _q3_k_scales(s)
    low = _two_bits(q)
    # the high bit of value l of sub-group j (of 8: half h, shift k) is bit h*4+k of hmask[l]
    hbits = _bits(hm, 1, 8).reshape(n, 2, 4, 2, 16)   # [n, bit 0..7 -> (half, shift), 32 -> (group, l)]
    vals = (low.to(torch.int16) - torch.where(hbits.bool(), 0, 4)).float().reshape(n, 16, 16)
    return (_f16(d).unsqueeze(2) * sc.unsqueeze(2) * vals).reshape(n, 256)


_DEQUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
            "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def supported(qtype):
    return qtype in _DEQUANT


def dequantize(raw, qtype, shape, dtype=torch.float32):
    """The values of a tensor of `shape` stored as `qtype` blocks in raw (a
    uint8 tensor of its bytes, on any device), as a `dtype` tensor there."""
    block, size = SIZES[qtype]
    n = 1
    for s in shape:
        n *= s
    if n % block or raw.numel() != n // block * size:
        raise ValueError(f"{qtype}: {raw.numel()} bytes do not hold {tuple(shape)} ({n} values in blocks "
                         f"of {block} in {size} bytes)")
    out = _DEQUANT[qtype](raw.reshape(-1, size))
    return out.reshape(tuple(shape)).to(dtype)
