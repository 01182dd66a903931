#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make_corpus.py - writes the fuzzers' seed corpus (standard library only).

    python3 tests/fuzz/make_corpus.py [OUTDIR]     (default: tests/fuzz/corpus)

OUTDIR/safetensors/  whole .safetensors files: valid ones (every dtype, scalars,
                     empty tensors, metadata, padding, unicode names, headers
                     listed out of order) and edge cases ferry must reject.
OUTDIR/index/        *.safetensors.index.json texts, valid and invalid.

Every file is under 4 KiB. The output is deterministic; the directories are
cleared first. Written from the safetensors spec, independently of ferry.
"""
import json
import os
import shutil
import struct
import sys

BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32,
    "U64": 64, "I64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}
MAX = 4096


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * BITS[dtype] // 8


def pattern(n, seed=0):
    return bytes((seed + 37 * i) & 0xFF for i in range(n))


def st_raw(header, data=b""):
    """header: bytes (the JSON text, used as is)."""
    return struct.pack("<Q", len(header)) + header + data


def st(tensors, metadata=None, align=8, order=None, pad=b" "):
    """tensors: list of (name, dtype, shape) laid out in list order.
    order: permutation for the order entries appear in the header."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    entries, off, data = [], 0, b""
    for i, (name, dtype, shape) in enumerate(tensors):
        size = nbytes(dtype, shape)
        entries.append((name, {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + size]}))
        data += pattern(size, i)
        off += size
    if order:
        entries = [entries[i] for i in order]
    for name, e in entries:
        hdr[name] = e
    raw = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if align:
        raw += pad * ((-(8 + len(raw))) % align)
    return st_raw(raw, data)


def st_json(obj, data=b""):
    return st_raw(json.dumps(obj, separators=(",", ":")).encode(), data)


def safetensors_corpus():
    c = {}
    # Every dtype in one file; a few alone.
    c["all_dtypes"] = st([(f"t.{dt.lower()}", dt, {4: [2, 3], 6: [4]}.get(BITS[dt], [2])) for dt in BITS])
    for dt in ("BOOL", "U16", "F32", "BF16", "C64", "F8_E4M3", "F6_E2M3", "F4"):
        shape = {4: [2, 3], 6: [4]}.get(BITS[dt], [2, 3])
        c[f"dtype_{dt.lower()}"] = st([("w", dt, shape)])
    # Shapes.
    c["scalar"] = st([("s", "F32", [])])
    c["empty_dim0"] = st([("e", "F32", [0])])
    c["empty_3x0"] = st([("e", "BF16", [3, 0])])
    c["empty_between"] = st([("a", "U8", [3]), ("z1", "F32", [0]), ("z2", "I64", [0, 5]), ("b", "U8", [2])])
    c["empty_at_end"] = st([("a", "I16", [4]), ("z", "F16", [0])], align=0)
    c["ndim8"] = st([("t", "U8", [1, 2, 1, 2, 1, 2, 1, 1])])
    c["ndim64"] = st([("t", "I8", [1] * 64)])
    c["f4_odd_rows"] = st([("q", "F4", [3, 2])])
    # Several tensors, header order differs from data order.
    three = [("layer.0.weight", "F32", [4, 4]), ("layer.0.bias", "F32", [4]), ("layer.1.weight", "BF16", [4, 2])]
    c["three_in_order"] = st(three)
    c["three_reversed_header"] = st(three, order=[2, 1, 0])
    c["three_shuffled_header"] = st(three, order=[1, 2, 0])
    c["many_tensors"] = st([(f"model.layers.{i}.w", "U8", [i % 3 + 1]) for i in range(48)])
    c["mixed_dtypes"] = st([("a", "F64", [2]), ("b", "F4", [2]), ("c", "F6_E2M3", [4]), ("d", "C64", [1]), ("e", "BOOL", [3])])
    # Metadata.
    c["metadata"] = st([("w", "F16", [2, 2])], metadata={"format": "pt", "source": "ferry"})
    c["metadata_empty"] = st([("w", "F16", [2])], metadata={})
    c["metadata_only"] = st([], metadata={"format": "pt"})
    c["metadata_last"] = st_raw(b'{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"__metadata__":{"k":"v"}}', b"ab")
    c["metadata_unicode"] = st([("w", "U8", [1])], metadata={"caf\u00e9": "\u65e5\u672c\u8a9e \U0001f600", "esc": "a\"b\\c\n"})
    c["empty_object"] = st_raw(b"{}")
    # Names and JSON spelling.
    c["unicode_names"] = st([("\u00e9\u00e8", "U8", [1]), ("\u4e2d\u6587", "U8", [1]), ("\U0001f600", "U8", [1])])
    c["escaped_names"] = st_raw(b'{"a\\"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                b'"\\u00e9\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy")
    c["empty_name"] = st([("", "U8", [1])])
    c["whitespace_json"] = st_raw(b'{ "w" : { "dtype" : "I32" ,\n "shape" : [ 2 ] ,\t"data_offsets" : [ 0 , 8 ] } }', pattern(8))
    c["no_padding"] = st([("w", "U8", [3])], align=0)
    c["align_64"] = st([("w", "U8", [5])], align=64)
    c["extra_fields"] = st_raw(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":null}}', b"z")
    # Rejected: the 8-byte prefix.
    c["bad_short_file"] = b"\x02\x00\x00"
    c["bad_hlen_zero"] = st_raw(b"", b"{}")
    c["bad_hlen_past_end"] = struct.pack("<Q", 64) + b"{}"
    c["bad_hlen_over_limit"] = struct.pack("<Q", 100000001) + b"{}"
    c["bad_hlen_huge"] = b"\xff" * 8 + b"{}"
    # Rejected: the header text.
    c["bad_not_brace"] = st_raw(b"[]")
    c["bad_top_array"] = st_raw(b"[{}]")
    c["bad_utf8"] = st_raw(b'{"\xff":{}}')
    c["bad_utf8_overlong"] = st_raw(b'{"\xc0\xaf":{}}')
    c["bad_utf8_surrogate"] = st_raw(b'{"\xed\xa0\x80":{}}')
    c["bad_trailing_garbage"] = st_raw(b"{}x")
    c["bad_padding_tab"] = st_raw(b"{}\t")
    c["bad_padding_nul"] = st_raw(b"{} \x00")
    c["bad_truncated_json"] = st_raw(b'{"w":{"dtype":"U8"')
    c["bad_duplicate_name"] = st_raw(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                     b'"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"ab")
    c["bad_nul_in_key"] = st_raw(b'{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"a")
    c["bad_lone_surrogate"] = st_raw(b'{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"a")
    c["bad_deep_nesting"] = st_raw(b'{"a":' + b"[" * 2050)
    # Rejected: tensor entries.
    w = lambda **kw: st_json({"w": dict({"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, **kw)}, b"ab")
    c["bad_unknown_dtype"] = w(dtype="F12")
    c["bad_dtype_not_string"] = w(dtype=8)
    c["bad_shape_negative"] = w(shape=[-2])
    c["bad_shape_float"] = w(shape=[2.0])
    c["bad_shape_not_array"] = w(shape=2)
    c["bad_offsets_three"] = w(data_offsets=[0, 1, 2])
    c["bad_offsets_reversed"] = w(data_offsets=[2, 0])
    c["bad_offsets_past_end"] = w(data_offsets=[0, 3])
    c["bad_offsets_huge"] = w(data_offsets=[0, 18446744073709551615])
    c["bad_nbytes_mismatch"] = w(shape=[3], data_offsets=[0, 2])
    c["bad_entry_not_object"] = st_json({"w": [1, 2]})
    c["bad_missing_dtype"] = st_json({"w": {"shape": [1], "data_offsets": [0, 1]}}, b"a")
    c["bad_missing_offsets"] = st_json({"w": {"dtype": "U8", "shape": [1]}}, b"a")
    c["bad_shape_overflow"] = w(shape=[4294967296, 4294967296, 2])
    c["bad_bytes_overflow"] = w(dtype="F64", shape=[4611686018427387904])
    c["bad_f4_odd"] = w(dtype="F4", shape=[3], data_offsets=[0, 2])
    c["bad_f6_partial"] = w(dtype="F6_E2M3", shape=[3], data_offsets=[0, 2])
    c["bad_too_many_dims"] = w(shape=[1] * 1025, data_offsets=[0, 1])
    # Rejected: layout.
    c["bad_gap"] = st_json({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                            "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]}}, b"abc")
    c["bad_overlap"] = st_json({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"abc")
    c["bad_same_range"] = st_json({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"ab")
    c["bad_unused_tail"] = st([("w", "U8", [2])], align=0) + b"xx"
    c["bad_data_without_tensors"] = st_raw(b"{}", b"data")
    c["bad_metadata_not_object"] = st_json({"__metadata__": "x"})
    c["bad_metadata_number"] = st_json({"__metadata__": {"n": 1}})
    c["bad_metadata_nested"] = st_json({"__metadata__": {"n": {"a": "b"}}})
    return c


def index_corpus():
    c = {}
    j = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8")
    two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    c["hf_two_shards"] = j({"metadata": {"total_size": 123456}, "weight_map": {
        "lm_head.weight": two[1], "model.embed_tokens.weight": two[0],
        "model.layers.0.mlp.down_proj.weight": two[0], "model.layers.0.self_attn.q_proj.weight": two[0],
        "model.layers.1.mlp.down_proj.weight": two[1], "model.norm.weight": two[1]}})
    c["one_shard"] = j({"weight_map": {"a": "model.safetensors"}})
    c["many_shards"] = j({"metadata": {"total_size": 1 << 40}, "weight_map": {
        f"model.layers.{i}.weight": f"model-{i % 7 + 1:05d}-of-00007.safetensors" for i in range(40)}})
    c["metadata_null"] = j({"metadata": None, "weight_map": {"a": "x.safetensors"}})
    c["metadata_strings"] = j({"metadata": {"format": "pt", "note": "caf\u00e9"}, "weight_map": {"a": "x.safetensors"}})
    c["metadata_mixed"] = j({"metadata": {"i": -5, "f": 1.5, "t": True, "f2": False, "n": None,
                                          "arr": [1, "two", [3]], "obj": {"k": {"k2": []}}},
                             "weight_map": {"a": "x.safetensors"}})
    c["metadata_empty"] = j({"metadata": {}, "weight_map": {"a": "x.safetensors"}})
    c["weight_map_first"] = b'{"weight_map":{"w":"a.safetensors"},"metadata":{"total_size":2}}'
    c["subdir_shards"] = j({"weight_map": {"a": "sub/dir/a.safetensors", "b": "./b.safetensors",
                                           "c": "sub//c.safetensors", "d": "..x/d.safetensors", "e": "x../e"}})
    c["unicode"] = j({"weight_map": {"\u6743\u91cd": "\u6587\u4ef6.safetensors", "\U0001f600": "e\u0301.st"}})
    c["escaped"] = b'{"weight_map":{"a\\"b":"f\\u00e9.safetensors","\\ud83d\\ude00":"f\\/g.safetensors"}}'
    c["empty_tensor_name"] = j({"weight_map": {"": "x.safetensors"}})
    c["extra_keys"] = j({"format": "x", "weight_map": {"a": "x.safetensors"}, "other": [1, 2]})
    c["compact"] = b'{"weight_map":{"a":"1","b":"2","c":"1","d":"3","e":"2"}}'
    # Rejected.
    c["bad_empty_file"] = b""
    c["bad_not_json"] = b"model.safetensors"
    c["bad_truncated"] = b'{"weight_map":{"a":"x.safe'
    c["bad_top_array"] = b'[{"weight_map":{}}]'
    c["bad_no_weight_map"] = j({"metadata": {}})
    c["bad_weight_map_empty"] = j({"weight_map": {}})
    c["bad_weight_map_array"] = j({"weight_map": [["a", "x.safetensors"]]})
    c["bad_weight_map_string"] = j({"weight_map": "x.safetensors"})
    c["bad_value_number"] = j({"weight_map": {"a": 1}})
    c["bad_value_null"] = j({"weight_map": {"a": None}})
    c["bad_absolute_path"] = j({"weight_map": {"a": "/etc/passwd"}})
    c["bad_dotdot"] = j({"weight_map": {"a": "../x.safetensors"}})
    c["bad_dotdot_middle"] = j({"weight_map": {"a": "sub/../../x.safetensors"}})
    c["bad_dotdot_only"] = j({"weight_map": {"a": ".."}})
    c["bad_dotdot_end"] = j({"weight_map": {"a": "sub/.."}})
    c["bad_empty_file_name"] = j({"weight_map": {"a": ""}})
    c["bad_later_value_bad"] = j({"weight_map": {"a": "x.safetensors", "b": "y.safetensors", "c": "../z"}})
    c["bad_metadata_string"] = j({"metadata": "x", "weight_map": {"a": "x.safetensors"}})
    c["bad_metadata_array"] = j({"metadata": [], "weight_map": {"a": "x.safetensors"}})
    c["bad_duplicate_tensor"] = b'{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}'
    c["bad_duplicate_weight_map"] = b'{"weight_map":{"a":"x"},"weight_map":{"b":"y"}}'
    c["bad_trailing"] = b'{"weight_map":{"a":"x"}} {}'
    c["bad_nul_in_value"] = b'{"weight_map":{"a":"x\\u0000.safetensors"}}'
    c["bad_nul_in_key"] = b'{"weight_map":{"a\\u0000":"x"}}'
    c["bad_invalid_utf8"] = b'{"weight_map":{"\xff":"x"}}'
    c["bad_lone_surrogate"] = b'{"weight_map":{"a":"\\udc00"}}'
    c["bad_deep_metadata"] = b'{"metadata":{"a":' + b"[" * 2050
    return c


def write(outdir, name, files, ext):
    d = os.path.join(outdir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    for fname, data in sorted(files.items()):
        assert len(data) < MAX, f"{fname}: {len(data)} bytes"
        with open(os.path.join(d, fname + ext), "wb") as f:
            f.write(data)
    print(f"{d}: {len(files)} files")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    write(outdir, "safetensors", safetensors_corpus(), ".safetensors")
    write(outdir, "index", index_corpus(), ".json")


if __name__ == "__main__":
    main()
