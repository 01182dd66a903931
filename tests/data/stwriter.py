# SPDX-License-Identifier: Apache-2.0
"""stwriter - ferry's own safetensors test-data writer (standard library only).

Written from the format specification, independently of ferry's C reader, so
that the reader is checked against a second implementation:

    8 bytes   little-endian u64 N: length of the header
    N bytes   UTF-8 JSON object {"__metadata__": {str: str}, name: {"dtype", "shape",
              "data_offsets": [begin, end]}}, padded at the end with spaces
    ...       the data section: tensors' bytes, tiling it exactly

Tensor data is given as bytes or as a callable(n) -> bytes-like (streamed in
chunks, so multi-GB files need no RAM).
"""
import json
import os
import struct

DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32,
    "U64": 64, "I64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    bits = n * DTYPE_BITS[dtype]
    assert bits % 8 == 0, f"{dtype}{shape} is not a whole number of bytes"
    return bits // 8


def header_bytes(tensors, metadata=None, align=8):
    """tensors: list of (name, dtype, shape, size). Returns the padded header."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, size in tensors:
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    pad = (-(8 + len(raw))) % align if align else 0
    return raw + b" " * pad


def write(path, tensors, metadata=None, align=8, chunk=16 << 20):
    """tensors: list of (name, dtype, shape, data) in file order; data is bytes
    or a callable(n) returning n bytes. Returns the header length."""
    sized = []
    for name, dtype, shape, data in tensors:
        sized.append((name, dtype, shape, nbytes(dtype, shape)))
    hdr = header_bytes(sized, metadata, align)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for (name, dtype, shape, data), (_, _, _, size) in zip(tensors, sized):
            if callable(data):
                left = size
                while left:
                    n = min(left, chunk)
                    f.write(data(n))
                    left -= n
            else:
                assert len(data) == size, f"{name}: {len(data)} bytes given, {size} needed"
                f.write(data)
    os.replace(tmp, path)
    return len(hdr)


def write_raw(path, header: bytes, data: bytes, length=None):
    """Write a possibly invalid file: the given header bytes and data, with the
    length prefix set to `length` (default: len(header))."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if length is None else length))
        f.write(header)
        f.write(data)
