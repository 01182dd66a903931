# SPDX-License-Identifier: Apache-2.0
"""gguf_writer - ferry's own GGUF test-data writer (standard library only).

Written from the GGUF specification (ggml's docs/gguf.md), independently of
ferry's C reader, so that the reader is checked against a second
implementation. All numbers are little-endian:

    "GGUF"  u32 version (3; 2 has the same layout)  u64 tensor_count  u64 metadata_kv_count
    metadata_kv_count x (string key, u32 value type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 ne (ne[0] innermost),
                    u32 ggml type, u64 offset relative to the data section)
    zero padding up to a multiple of the alignment (general.alignment, default 32)
    the data section: each tensor at its offset, a multiple of the alignment

A string is a u64 byte count and the bytes. A value of type ARRAY is a u32
element type, a u64 count and the items (arrays may nest).

Also here: the text ferry gives each metadata value (value_text), from ferry's
documented rules: strings as they are, integers in decimal, booleans as
true/false, floats with the fewest digits that read back as the same float32 /
double (plain notation for decimal exponents in [-4, 16), else exponent form;
NaN, Infinity, -Infinity), arrays of up to 16 items as compact JSON (strings
quoted and escaped as json.dumps(ensure_ascii=False) does), longer ones as
"[TYPE x N]".
"""
import json
import math
import struct

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VT_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
            "UINT64", "INT64", "FLOAT64"]
VT_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
          BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml tensor types: name -> (number, block elements, block bytes), from
# ggml.h's enum ggml_type and ggml-common.h's block structs
GGML_TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q8_1": (9, 32, 36),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292), "IQ2_XXS": (16, 256, 66), "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98), "IQ1_S": (19, 256, 50), "IQ4_NL": (20, 32, 18), "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82), "IQ4_XS": (23, 256, 136), "I8": (24, 1, 1), "I16": (25, 1, 2),
    "I32": (26, 1, 4), "I64": (27, 1, 8), "F64": (28, 1, 8), "IQ1_M": (29, 256, 56),
    "BF16": (30, 1, 2), "TQ1_0": (34, 256, 54), "TQ2_0": (35, 256, 66), "MXFP4": (39, 32, 17),
    "NVFP4": (40, 64, 36), "Q1_0": (41, 128, 18), "Q2_0": (42, 64, 18),
}
DEFAULT_ALIGNMENT = 32


def nbytes(type_name, shape):
    """Byte size of a tensor; shape is outermost-first (ne reversed)."""
    _, block, size = GGML_TYPES[type_name]
    row = shape[-1] if shape else 1
    assert row % block == 0, f"{type_name}: innermost dimension {row} is not a multiple of {block}"
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def pack_string(s):
    if isinstance(s, str):
        s = s.encode("utf-8")
    return struct.pack("<Q", len(s)) + s


def pack_value(vtype, value):
    """value: a Python value of vtype; for ARRAY, (element type, [items])."""
    if vtype == STRING:
        return pack_string(value)
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(pack_value(etype, x) for x in items)
    if vtype == BOOL:
        return struct.pack("<B", int(value))
    return struct.pack(VT_FMT[vtype], value)


def pack_kv(key, vtype, value):
    return pack_string(key) + struct.pack("<I", vtype) + pack_value(vtype, value)


def pack_tensor_info(name, ne, type_num, offset):
    """ne: dimensions innermost-first, as GGUF stores them."""
    return (pack_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) +
            struct.pack("<IQ", type_num, offset))


def pack_header(version, ntensors, nkv):
    return b"GGUF" + struct.pack("<IQQ", version, ntensors, nkv)


def align_up(n, a):
    return n + (a - n % a) % a


def write(path, tensors, kvs=(), version=3, alignment=None, info_order=None, gaps=None):
    """Write a valid GGUF file.

    tensors: (name, ggml type name, shape outermost-first, data bytes) in data
    order; kvs: (key, value type, value); alignment: written as
    general.alignment (UINT32) unless None; info_order: the order in which the
    tensor infos are listed (a permutation, default data order); gaps: extra
    padding (in units of the alignment) before each tensor's data.

    Returns the tensors as ferry must report them, in file order: dicts with
    name, dtype, shape, nbytes, offset (absolute), data."""
    kvs = list(kvs)
    if alignment is not None:
        kvs.append(("general.alignment", UINT32, alignment))
    align = alignment or DEFAULT_ALIGNMENT
    rel, off = [], 0
    for i, (name, tname, shape, data) in enumerate(tensors):
        n = nbytes(tname, shape)
        assert len(data) == n, (name, len(data), n)
        off = align_up(off, align) + (gaps[i] if gaps else 0) * align
        rel.append(off)
        off += n
    order = list(range(len(tensors))) if info_order is None else list(info_order)
    assert sorted(order) == list(range(len(tensors)))
    head = pack_header(version, len(tensors), len(kvs)) + b"".join(pack_kv(*kv) for kv in kvs)
    for k in order:
        name, tname, shape, _ = tensors[k]
        head += pack_tensor_info(name, list(reversed(shape)), GGML_TYPES[tname][0], rel[k])
    start = align_up(len(head), align)
    body = bytearray()
    for (name, tname, shape, data), r in zip(tensors, rel):
        body += bytes(r - len(body)) + data
    with open(path, "wb") as f:
        f.write(head + bytes(start - len(head)) + bytes(body))
    return [{"name": t[0], "dtype": t[1], "shape": list(t[2]), "nbytes": len(t[3]), "offset": start + r,
             "data": t[3]} for t, r in zip(tensors, rel)]


# ---- the text ferry gives metadata values ----------------------------------

def _float_text(v, f32):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "-Infinity" if v < 0 else "Infinity"
    if f32:
        v = struct.unpack("<f", struct.pack("<f", v))[0]
    p = 1
    while p < 17:
        back = float("%.*e" % (p - 1, v))
        if f32:
            try:
                back = struct.unpack("<f", struct.pack("<f", back))[0]
            except OverflowError:
                back = None
        if back == v:
            break
        p += 1
    s = "%.*e" % (p - 1, v)
    mant, ex = s.split("e")
    ex = int(ex)
    sign = "-" if mant.startswith("-") else ""
    dig = mant.lstrip("-").replace(".", "")
    if ex < -4 or ex >= 16:
        return f"{sign}{dig[0]}{'.' if len(dig) > 1 else ''}{dig[1:]}e{'-' if ex < 0 else '+'}{abs(ex):02d}"
    if ex < 0:
        return f"{sign}0.{'0' * (-ex - 1)}{dig}"
    if len(dig) <= ex + 1:
        return sign + dig + "0" * (ex + 1 - len(dig))
    return f"{sign}{dig[:ex + 1]}.{dig[ex + 1:]}"


def _json_string(s):
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif c < 0x20:
            out.append("\\u%04x" % c)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def value_text(vtype, value, top=True):
    if vtype == STRING:
        s = value.decode("utf-8") if isinstance(value, bytes) else value
        return s if top else _json_string(s)
    if vtype == BOOL:
        return "true" if value else "false"
    if vtype == FLOAT32:
        return _float_text(value, True)
    if vtype == FLOAT64:
        return _float_text(value, False)
    if vtype == ARRAY:
        etype, items = value
        if len(items) > 16:
            return f"[{VT_NAMES[etype]} x {len(items)}]"
        return "[" + ",".join(value_text(etype, x, False) for x in items) + "]"
    return str(int(value))


def _json_kind(vtype, value):
    """Whether ferry gives the value as JSON text (FERRY_META_JSON): numbers,
    finite floats, booleans and shown arrays of those (strings as items)."""
    if vtype == STRING:
        return False
    if vtype in (FLOAT32, FLOAT64):
        return math.isfinite(value)
    if vtype == ARRAY:
        etype, items = value
        return len(items) <= 16 and all(etype == STRING or _json_kind(etype, x) for x in items)
    return True


def _in_int64(v):
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return -(1 << 63) <= v < (1 << 63)
    if isinstance(v, list):
        return all(_in_int64(x) for x in v)
    return True


def value_json(vtype, value):
    """The value as `ferry inspect --json` gives it: JSON kinds as JSON values
    (an integer past int64, which the CLI's JSON library cannot hold, stays
    its text), the rest as value_text's string."""
    text = value_text(vtype, value)
    if not _json_kind(vtype, value):
        return text
    v = json.loads(text)
    return v if _in_int64(v) else text
