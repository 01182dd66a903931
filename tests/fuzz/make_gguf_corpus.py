#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make_gguf_corpus.py - writes fuzz_gguf's seed corpus (standard library only).

    python3 tests/fuzz/make_gguf_corpus.py [OUTDIR]     (default: tests/fuzz/corpus)

OUTDIR/gguf/  whole .gguf files, written with tests/data/gguf_writer.py (from the
              GGUF spec, independently of ferry): valid ones (every ggml type,
              metadata of every value type, nested arrays, alignments, versions
              2 and 3, gaps, empty tensors, a scalar, infos out of order) and
              edge cases ferry must reject (one or two per error class).

Every file is under 4 KiB. The output is deterministic; the folder is cleared
first.
"""
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data"))
import gguf_writer as gw  # noqa: E402

MAX = 4096
H, KV, TI, S = gw.pack_header, gw.pack_kv, gw.pack_tensor_info, gw.pack_string
T = gw.GGML_TYPES


def pattern(n, seed=0):
    return bytes((seed + 37 * i) & 0xFF for i in range(n))


def t(name, tname, shape, seed=0):
    return (name, tname, list(shape), pattern(gw.nbytes(tname, shape), seed))


def pad(b, a=32):
    return b + bytes(gw.align_up(len(b), a) - len(b))


def corpus(out):
    files = {}

    def add(name, data):
        files[name] = data

    tmp = os.path.join(out, ".tmp.gguf")

    def w(name, tensors, kvs=(), **kw):
        gw.write(tmp, tensors, kvs, **kw)
        with open(tmp, "rb") as f:
            add(name, f.read())
        os.remove(tmp)

    arch = [("general.architecture", gw.STRING, "llama")]
    # Every ggml type, in groups that fit 4 KiB; the block types one row each.
    types = list(T)
    for g in range(0, len(types), 6):
        w(f"types_{g // 6}", [t(f"t.{n.lower()}", n, [T[n][1]] if T[n][1] > 1 else [2, 3], i)
                              for i, n in enumerate(types[g:g + 6])], arch)
    for n in ("Q4_0", "Q8_0", "Q4_K", "IQ2_XXS", "MXFP4", "F16"):
        blk = T[n][1]
        w(f"type_{n.lower()}", [t("w", n, [2, blk] if blk > 1 else [3, 4])])
    # Shapes: 1-D..4-D, a scalar, empty tensors, a zero dimension.
    w("dims", [t("d1", "F32", [3]), t("d2", "F32", [2, 2]), t("d3", "I8", [2, 1, 3]), t("d4", "F16", [1, 2, 1, 2])])
    w("scalar", [t("s", "F32", [])])
    w("empty", [t("e0", "F32", [0]), t("e1", "Q4_0", [0, 32]), t("x", "I8", [4]), t("e2", "Q4_K", [3, 0])])
    # Metadata of every value type.
    kvs = [("u8", gw.UINT8, 1), ("i8", gw.INT8, -1), ("u16", gw.UINT16, 2), ("i16", gw.INT16, -2),
           ("u32", gw.UINT32, 3), ("i32", gw.INT32, -3), ("f32", gw.FLOAT32, 0.5), ("b", gw.BOOL, True),
           ("s", gw.STRING, "text"), ("u64", gw.UINT64, 4), ("i64", gw.INT64, -4), ("f64", gw.FLOAT64, 0.25)]
    w("kv_all", [t("w", "F32", [2])], kvs)
    w("kv_arrays", [], [
        ("a.u8", gw.ARRAY, (gw.UINT8, [1, 2, 3])), ("a.str", gw.ARRAY, (gw.STRING, ["x", "", 'q"\\\n'])),
        ("a.bool", gw.ARRAY, (gw.BOOL, [True, False])), ("a.f32", gw.ARRAY, (gw.FLOAT32, [1.5, float("nan")])),
        ("a.f64", gw.ARRAY, (gw.FLOAT64, [1e300])), ("a.empty", gw.ARRAY, (gw.INT64, [])),
        ("a.long", gw.ARRAY, (gw.INT32, list(range(40)))), ("a.strs", gw.ARRAY, (gw.STRING, ["t"] * 30)),
    ])
    w("kv_nested", [], [
        ("n", gw.ARRAY, (gw.ARRAY, [(gw.UINT8, [1]), (gw.STRING, ["a"]), (gw.ARRAY, [(gw.BOOL, [True])])])),
        ("n.big", gw.ARRAY, (gw.ARRAY, [(gw.UINT16, [i]) for i in range(20)])),
    ])
    w("kv_floats", [], [("f32." + str(i), gw.FLOAT32, v) for i, v in enumerate(
        [0.1, -0.0, 1e-45, 3.4028234663852886e38, float("inf"), 1e10, 4e15])] +
      [("f64." + str(i), gw.FLOAT64, v) for i, v in enumerate([1 / 3, 5e-324, -1e300, float("-inf")])])
    w("kv_unicode", [t("名前.🙂", "F32", [1])], [("general.name", gw.STRING, "模型 🙂"), ("k", gw.STRING, "")])
    # Alignments, versions, layouts.
    for a in (1, 8, 64):
        w(f"align_{a}", [t("a", "F32", [3]), t("b", "Q8_0", [32]), t("c", "I8", [5])], arch, alignment=a)
    w("v2", [t("a", "F32", [4]), t("b", "Q6_K", [256])], arch, version=2)
    w("no_tensors", [], arch)
    w("nothing", [])
    w("order_gaps", [t("a", "F32", [4]), t("b", "I16", [3]), t("c", "Q4_0", [32]), t("d", "F32", [1])], arch,
      info_order=[3, 1, 0, 2], gaps=[1, 0, 2, 0])
    w("names", [t(n, "I8", [1]) for n in ("", "n" * 64, "-x", "tab\t", "a.b.c")])

    # Edge cases ferry must reject.
    one = pad(H(3, 1, 0) + TI("w", [4], 0, 0))
    add("bad_version_1", b"GGUF" + struct.pack("<I", 1) + bytes(16))
    add("bad_version_4", H(4, 0, 0))
    add("bad_big_endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    add("bad_short", H(3, 0, 0)[:20])
    add("bad_kv_count", H(3, 0, 1 << 40) + bytes(16))
    add("bad_tensor_count", H(3, 1 << 40, 0) + bytes(32))
    add("bad_key_past_end", H(3, 0, 1) + struct.pack("<Q", 100) + b"key")
    add("bad_vtype", H(3, 0, 1) + S("k") + struct.pack("<I", 13) + bytes(8))
    add("bad_array_etype", H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, 20, 1) + bytes(8))
    add("bad_array_count", H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, gw.STRING, 1 << 50) + bytes(16))
    add("bad_bool", H(3, 0, 1) + S("k") + struct.pack("<IB", gw.BOOL, 2) + bytes(8))
    add("bad_deep", H(3, 0, 1) + S("k") + struct.pack("<I", gw.ARRAY) + struct.pack("<IQ", gw.ARRAY, 1) * 40 +
        struct.pack("<IQ", gw.UINT8, 0))
    add("bad_key_utf8", H(3, 0, 1) + S(b"\xff") + struct.pack("<IB", gw.UINT8, 0))
    add("bad_key_empty", H(3, 0, 1) + S("") + struct.pack("<IB", gw.UINT8, 0) + bytes(4))
    add("bad_value_nul", H(3, 0, 1) + KV("k", gw.STRING, b"a\0b"))
    add("bad_dup_key", H(3, 0, 2) + KV("k", gw.UINT8, 1) + KV("k", gw.UINT8, 2))
    add("bad_align_zero", H(3, 0, 1) + KV("general.alignment", gw.UINT32, 0))
    add("bad_align_type", H(3, 0, 1) + KV("general.alignment", gw.UINT64, 32))
    add("bad_name_long", H(3, 1, 0) + TI("n" * 65, [1], 0, 0) + bytes(32))
    add("bad_dup_name", pad(H(3, 2, 0) + TI("w", [4], 0, 0) + TI("w", [4], 0, 32)) + bytes(64))
    add("bad_n_dims", H(3, 1, 0) + TI("w", [1] * 5, 0, 0) + bytes(32))
    add("bad_dim_negative", H(3, 1, 0) + TI("w", [1 << 63], 0, 0) + bytes(32))
    add("bad_type", H(3, 1, 0) + TI("w", [4], 99, 0) + bytes(32))
    add("bad_type_removed", H(3, 1, 0) + TI("w", [32], 4, 0) + bytes(32))
    add("bad_block", pad(H(3, 1, 0) + TI("w", [33], T["Q4_0"][0], 0)) + bytes(64))
    add("bad_overflow", pad(H(3, 1, 0) + TI("w", [1 << 32, 1 << 32, 2], T["I8"][0], 0)) + bytes(32))
    add("bad_unaligned", pad(H(3, 1, 0) + TI("w", [4], 0, 8)) + bytes(32))
    add("bad_past_end", one + bytes(8))
    add("bad_overlap", pad(H(3, 2, 0) + TI("a", [16], 0, 0) + TI("b", [16], 0, 32)) + bytes(96))
    return files


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    d = os.path.join(outdir, "gguf")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    files = corpus(d)
    for name, data in sorted(files.items()):
        assert len(data) <= MAX, f"{name}: {len(data)} bytes"
        with open(os.path.join(d, name + ".gguf"), "wb") as f:
            f.write(data)
    print(f"make_gguf_corpus.py: {len(files)} files in {d}")


if __name__ == "__main__":
    main()
