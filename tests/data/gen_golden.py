#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gen_golden - write ferry's golden test corpus (standard library only).

    python3 gen_golden.py OUTDIR

writes into OUTDIR:

  * valid safetensors checkpoints (every dtype, scalars, zero-size tensors, an
    empty header, metadata, unicode and odd tensor names, padded / unpadded /
    pretty-printed headers, JSON order != data order, thousands of tensors, the
    1024-dimension limit, a tensor bigger than ferry's I/O chunks) and sharded
    checkpoints (*.safetensors.index.json + shards);
  * valid GGUF files (v3 and v2, every ggml tensor type including the
    block-quantized ones, metadata of every value type including nested and
    huge arrays, custom alignments, padding gaps, tensor infos out of data
    order, no tensors at all), written with gguf_writer.py;
  * PyTorch zip checkpoints built by hand with ptwriter.py (no torch): valid
    ones and one invalid file per class of damage (golden_pt.py);
  * invalid files, one per corruption class, each with a substring that ferry's
    one-line error message must contain;
  * manifest.json describing every case:

    {"version": 1, "cases": [
      {"file": path relative to OUTDIR (or absolute), "class": short name,
       "valid": bool, "exit": 0 or 1, "expect": substring or null,
       "msg_path": path (relative to OUTDIR) the message must contain; defaults to file,
       "commands": optional list of the commands to run on it ("inspect", "hash"; default both),
       -- valid cases only --
       "format": "safetensors" | "safetensors-index" | "gguf" | "pytorch",
       "metadata": {key: value as inspect --json gives it}, "tensor_count": n, "total_bytes": n,
       "files": [shard paths relative to the checkpoint's folder, in shard order],
       "tensors": [{"name", "dtype", "shape", "nbytes", "offset", "file", "sha256"}]
                  (pytorch adds "strides": null or element strides, and
                  "flags": ["noncontiguous", "shared_storage"] or fewer)
                  (in ferry's order: by data position, shard by shard; "file" is
                  the shard path relative to the checkpoint's folder, "" for a
                  single-file checkpoint),
       "cat_sample": optional list of tensor names to `ferry cat` (default: all),
       "same_model_as": optional file whose `ferry hash` model hash must match}]}

The expectations are computed here from what was written, independently of
ferry's C reader. OUTDIR is replaced if it holds a previous corpus (a
manifest.json); a non-empty folder without one is refused.
"""
import hashlib
import json
import os
import random
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwriter  # noqa: E402
import gguf_writer as gw  # noqa: E402
import golden_pt  # noqa: E402

ALL_DTYPES = list(stwriter.DTYPE_BITS)
BYTE_DTYPES = [d for d in ALL_DTYPES if stwriter.DTYPE_BITS[d] % 8 == 0]


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def escaped(obj):
    """Everything non-ASCII as \\uXXXX escapes (surrogate pairs for astral)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True)


def pretty(obj):
    """Inner whitespace of every kind JSON allows: spaces, tabs, CR LF."""
    s = json.dumps(obj, indent="\t", separators=(" ,  ", " :\t"), ensure_ascii=False)
    # json.dumps escapes newlines inside strings, so every raw \n is formatting.
    return s.replace("\n", " \r\n  ")


class Gen:
    def __init__(self, out):
        self.out = out
        self.cases = []
        self.rng = random.Random(20240229)

    # ---- helpers -------------------------------------------------------

    def path(self, rel):
        p = os.path.join(self.out, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def data(self, n):
        return self.rng.randbytes(n)

    def st_file(self, rel, tensors, metadata=None, json_order=None, meta_pos=0, dumps=compact,
                align=8, extra_pad=0, key_order=("dtype", "shape", "data_offsets")):
        """Write a valid safetensors file. tensors: (name, dtype, shape, data)
        in data order. Returns the expected tensor list in ferry's order."""
        names = [t[0] for t in tensors]
        assert len(set(names)) == len(names), "duplicate names in a valid case"
        offs, off = [], 0
        for name, dt, shape, data in tensors:
            n = stwriter.nbytes(dt, shape)
            assert len(data) == n, (name, len(data), n)
            offs.append((off, off + n))
            off += n
        order = list(range(len(tensors))) if json_order is None else list(json_order)
        assert sorted(order) == list(range(len(tensors)))
        items = []
        for k in order:
            name, dt, shape, _ = tensors[k]
            full = {"dtype": dt, "shape": list(shape), "data_offsets": list(offs[k])}
            items.append((name, {f: full[f] for f in key_order}))
        if metadata is not None:
            items.insert(meta_pos, ("__metadata__", metadata))
        raw = dumps(dict(items)).encode("utf-8")
        pad = ((-(8 + len(raw))) % align if align else 0) + extra_pad
        header = raw + b" " * pad
        stwriter.write_raw(self.path(rel), header, b"".join(t[3] for t in tensors))
        start = 8 + len(header)
        jpos = {k: i for i, k in enumerate(order)}
        idx = sorted(range(len(tensors)), key=lambda k: (offs[k][0], offs[k][1], jpos[k]))
        return [{
            "name": tensors[k][0], "dtype": tensors[k][1], "shape": list(tensors[k][2]),
            "nbytes": offs[k][1] - offs[k][0], "offset": start + offs[k][0], "file": "",
            "sha256": hashlib.sha256(tensors[k][3]).hexdigest(),
        } for k in idx]

    def valid(self, rel, cls, tensors, metadata=None, fmt="safetensors", files=None, **extra):
        c = {"file": rel, "class": cls, "valid": True, "exit": 0, "expect": None, "format": fmt,
             "metadata": metadata or {}, "tensor_count": len(tensors),
             "total_bytes": sum(t["nbytes"] for t in tensors),
             "files": files if files is not None else [""], "tensors": tensors}
        c.update(extra)
        self.cases.append(c)

    def invalid(self, rel, cls, expect, msg_path=None):
        c = {"file": rel, "class": cls, "valid": False, "exit": 1, "expect": expect}
        if msg_path is not None:
            c["msg_path"] = msg_path
        self.cases.append(c)

    def raw(self, rel, cls, expect, header, data=b"", length=None, msg_path=None):
        """An invalid safetensors file: header (bytes, str, or an object to dump compactly)."""
        if not isinstance(header, (bytes, str)):
            header = compact(header)
        if isinstance(header, str):
            header = header.encode("utf-8")
        stwriter.write_raw(self.path(rel), header, data, length)
        self.invalid(rel, cls, expect, msg_path)

    def blob(self, rel, cls, expect, content, msg_path=None):
        with open(self.path(rel), "wb") as f:
            f.write(content)
        self.invalid(rel, cls, expect, msg_path)

    def t(self, name, dtype, shape):
        return (name, dtype, list(shape), self.data(stwriter.nbytes(dtype, shape)))

    # ---- valid cases ---------------------------------------------------

    def gen_valid(self):
        # Every dtype, through stwriter.write (the plain writer).
        ts = []
        for dt in ALL_DTYPES:
            bits = stwriter.DTYPE_BITS[dt]
            if bits == 8 or bits % 8 == 0:
                ts.append(self.t(f"t.{dt.lower()}", dt, [2, 3]))
            elif bits == 6:
                ts.append(self.t(f"t.{dt.lower()}", dt, [4]))
                ts.append(self.t(f"t.{dt.lower()}.2d", dt, [2, 4]))
            else:  # 4 bits
                ts.append(self.t(f"t.{dt.lower()}", dt, [2]))
                ts.append(self.t(f"t.{dt.lower()}.2d", dt, [3, 2]))
        hlen = stwriter.write(self.path("dtypes.safetensors"), ts, metadata={"format": "pt"})
        exp, off = [], 8 + hlen
        for name, dt, shape, data in ts:
            exp.append({"name": name, "dtype": dt, "shape": shape, "nbytes": len(data), "offset": off,
                        "file": "", "sha256": hashlib.sha256(data).hexdigest()})
            off += len(data)
        self.valid("dtypes.safetensors", "every dtype", exp, {"format": "pt"})

        # A symlink to it reads the same.
        try:
            os.symlink("dtypes.safetensors", self.path("link.safetensors"))
            self.valid("link.safetensors", "symlink to a checkpoint", exp, {"format": "pt"})
        except OSError:
            pass

        # Scalars of every byte-sized dtype.
        ts = [self.t(f"scalar.{dt}", dt, []) for dt in BYTE_DTYPES]
        self.valid("scalars.safetensors", "scalars (shape [])", self.st_file("scalars.safetensors", ts))

        # Zero-size tensors: first, in the middle, two at one offset, last.
        ts = [
            self.t("z.first", "F32", [0]),
            self.t("a", "F32", [3]),
            self.t("z.mid", "BF16", [3, 0, 2]),
            self.t("z.mid2", "F4", [0]),
            self.t("b", "U8", [5]),
            self.t("z.f6", "F6_E3M2", [0, 7]),
            self.t("c", "I64", [1]),
            self.t("z.last", "C64", [4, 0]),
        ]
        # JSON order puts z.mid2 before z.mid: equal offsets go by JSON order.
        self.valid("zero_size.safetensors", "zero-size tensors",
                   self.st_file("zero_size.safetensors", ts, json_order=[7, 6, 3, 2, 5, 4, 1, 0]))
        ts = [self.t("only.empty", "F16", [0])]
        self.valid("only_zero_size.safetensors", "only a zero-size tensor, no data",
                   self.st_file("only_zero_size.safetensors", ts, align=0))
        ts = [self.t("huge.but.empty", "F64", [0, 1 << 62, 1 << 62]), self.t("x", "I8", [2])]
        self.valid("zero_dim_huge.safetensors", "zero dimension first, huge others",
                   self.st_file("zero_dim_huge.safetensors", ts))

        # Empty headers.
        stwriter.write_raw(self.path("empty.safetensors"), b"{}", b"")
        self.valid("empty.safetensors", "empty header {} and no data", [])
        stwriter.write_raw(self.path("empty_padded.safetensors"), b"{}" + b" " * 14, b"")
        self.valid("empty_padded.safetensors", "empty header padded with spaces", [])
        stwriter.write_raw(self.path("empty_inner_ws.safetensors"), b"{ \r\n\t}  ", b"")
        self.valid("empty_inner_ws.safetensors", "empty header with inner whitespace", [])
        md = {"format": "pt", "note": "no tensors"}
        self.valid("metadata_only.safetensors", "metadata and no tensors",
                   self.st_file("metadata_only.safetensors", [], metadata=md), md)

        # Metadata: unicode, empty key and value, escapes, a long value,
        # __metadata__ in the middle of the tensors.
        md = {"format": "pt", "": "empty key", "empty": "", "名前": "モデル 🙂",
              "esc": "tab\tnl\nquote\"backslash\\slash/", "long": "x" * 10000,
              "__metadata__": "nested name is just a key"}
        ts = [self.t("w0", "F32", [2, 2]), self.t("w1", "F16", [3]), self.t("w2", "U8", [1])]
        self.valid("metadata.safetensors", "metadata (unicode, escapes, empty, long)",
                   self.st_file("metadata.safetensors", ts, metadata=md, meta_pos=2), md)

        # Unicode and odd tensor names, raw UTF-8 and as \u escapes.
        names = ["模型.层.0.权重", "emoji.🙂.bias", "ñandú", "Ωmega", "combining e\u0301",
                 "name with spaces", 'quote"back\\slash', "tab\tnew\nline", "", "-starts-with-dash",
                 "/slash/", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u00a0nbsp", "a" * 300, "\u007f.del"]
        for rel, dumps, cls in (("unicode.safetensors", compact, "unicode names (raw UTF-8)"),
                                ("unicode_escaped.safetensors", escaped, "unicode names (\\u escapes)")):
            ts = [self.t(n, "F32", [i % 3 + 1]) for i, n in enumerate(names)]
            self.valid(rel, cls, self.st_file(rel, ts, dumps=dumps))

        # Header padding: lots of spaces; none at all (odd header length).
        ts = [self.t("p0", "F32", [4]), self.t("p1", "I16", [3])]
        self.valid("padded.safetensors", "header padded with 4096 spaces",
                   self.st_file("padded.safetensors", ts, extra_pad=4096))
        ts = [self.t("u0", "U8", [3]), self.t("u1", "F64", [2]), self.t("u2", "BOOL", [1])]
        exp = self.st_file("unpadded.safetensors", ts, align=0)
        assert (exp[0]["offset"]) % 8 != 0
        self.valid("unpadded.safetensors", "no padding, unaligned data", exp)

        # Pretty-printed JSON: spaces, tabs, CR LF between tokens.
        ts = [self.t("pretty.a", "BF16", [2, 2]), self.t("pretty.b", "F8_E5M2", [7])]
        md = {"k": "v"}
        self.valid("pretty.safetensors", "JSON with inner whitespace and newlines",
                   self.st_file("pretty.safetensors", ts, metadata=md, dumps=pretty, extra_pad=3), md)

        # JSON order differs from data order; entry keys in unusual order.
        ts = [self.t(f"r{i}", dt, [i + 1]) for i, dt in enumerate(["F32", "U8", "I16", "F64", "BF16", "I8"])]
        self.valid("reordered.safetensors", "JSON order != data order",
                   self.st_file("reordered.safetensors", ts, json_order=[3, 5, 0, 4, 2, 1],
                                key_order=("data_offsets", "shape", "dtype")))

        # Thousands of tiny tensors, shuffled in the JSON, some zero-size.
        ts = []
        for i in range(5000):
            dt = self.rng.choice(BYTE_DTYPES)
            shape = [self.rng.choice([0, 1, 1, 2, 3])] if i % 7 else []
            ts.append(self.t(f"model.layers.{i // 10}.p{i % 10}", dt, shape))
        order = list(range(len(ts)))
        self.rng.shuffle(order)
        exp = self.st_file("many.safetensors", ts, json_order=order)
        sample = list(dict.fromkeys([exp[0]["name"], exp[-1]["name"]] + [e["name"] for e in self.rng.sample(exp, 48)]))
        self.valid("many.safetensors", "5000 tiny tensors", exp, cat_sample=sample)

        # The dimension limit (1024) itself.
        ts = [self.t("dims.1024", "U8", [1] * 1024), self.t("dims.1024b", "I16", [2] + [1] * 1023)]
        self.valid("max_dims.safetensors", "1024 dimensions", self.st_file("max_dims.safetensors", ts))

        # One tensor bigger than ferry's 4 MiB hash and 8 MiB cat chunks.
        ts = [self.t("small", "U8", [3]), self.t("big", "U8", [9 * 1024 * 1024 + 5]), self.t("tail", "F32", [1])]
        self.valid("big.safetensors", "a 9 MiB tensor", self.st_file("big.safetensors", ts))

        self.gen_sharded()

    def gen_sharded(self):
        # model.safetensors.index.json + 3 shards; weight_map sorted by name (as
        # transformers writes it), shards interleaved in it, first seen in order 1, 2, 3.
        layout = {
            "model-00001-of-00003.safetensors": [("embed.weight", "F32", [4, 3]),
                                                  ("layers.0.attn", "BF16", [2, 2]),
                                                  ("layers.1.attn", "BF16", [2, 2])],
            "model-00002-of-00003.safetensors": [("layers.0.mlp", "F16", [5]),
                                                  ("lm_head", "F32", [3, 4]),
                                                  ("layers.1.mlp", "F16", [5]),
                                                  ("layers.1.norm", "F32", [0])],
            "model-00003-of-00003.safetensors": [("layers.2.attn", "BF16", [2, 2]),
                                                  ("norm.weight", "F32", [4]),
                                                  ("layers.2.mlp", "I8", [6])],
        }
        single = []
        exp_all = []
        total = 0
        weight_map = {}
        for shard, specs in layout.items():
            ts = [self.t(*s) for s in specs]
            single += ts
            exp = self.st_file("sharded/" + shard, ts, metadata={"format": "pt"}, json_order=list(range(len(ts)))[::-1])
            for e in exp:
                e["file"] = shard
                weight_map[e["name"]] = shard
                total += e["nbytes"]
            exp_all += exp
        wm = dict(sorted(weight_map.items()))
        firsts = list(dict.fromkeys(wm.values()))
        assert firsts == list(layout), firsts
        md = {"total_size": total}
        with open(self.path("sharded/model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump({"metadata": md, "weight_map": wm}, f, indent=2)
        self.valid("sharded/model.safetensors.index.json", "sharded checkpoint (3 shards)", exp_all,
                   {"total_size": total}, fmt="safetensors-index", files=list(layout),
                   same_model_as="sharded_single.safetensors")
        # The same tensors in one file: the model hash must not depend on sharding.
        self.rng.shuffle(single)
        self.valid("sharded_single.safetensors", "the sharded checkpoint in one file",
                   self.st_file("sharded_single.safetensors", single),
                   same_model_as="sharded/model.safetensors.index.json")

        # Shards in a subfolder, metadata values of every JSON type (inspect --json keeps their types).
        ts1 = [self.t("a.w", "F32", [2]), self.t("a.b", "U8", [3])]
        ts2 = [self.t("b.w", "I32", [2, 1])]
        e1 = self.st_file("sharded_sub/sub/part-1.safetensors", ts1)
        e2 = self.st_file("sharded_sub/sub/dir/part-2.safetensors", ts2)
        for e in e1:
            e["file"] = "sub/part-1.safetensors"
        for e in e2:
            e["file"] = "sub/dir/part-2.safetensors"
        mdv = {"total_size": 1234, "nested": {"x": [1, 2], "y": "z"}, "flag": True, "nothing": None,
               "text": "hello", "neg": -5}
        with open(self.path("sharded_sub/model.safetensors.index.json"), "w", encoding="utf-8") as f:
            f.write(compact({"weight_map": {"a.w": "sub/part-1.safetensors", "b.w": "sub/dir/part-2.safetensors",
                                            "a.b": "sub/part-1.safetensors"},
                             "metadata": mdv}))
        self.valid("sharded_sub/model.safetensors.index.json", "sharded, shards in subfolders, typed metadata",
                   e1 + e2, mdv, fmt="safetensors-index", files=["sub/part-1.safetensors", "sub/dir/part-2.safetensors"])

        # One shard, no "metadata" at all; another with "metadata": null.
        ts = [self.t("only", "F32", [2]), self.t("other", "F32", [1])]
        e = self.st_file("sharded_nometa/only.safetensors", ts)
        for x in e:
            x["file"] = "only.safetensors"
        with open(self.path("sharded_nometa/model.safetensors.index.json"), "w") as f:
            f.write(compact({"weight_map": {"only": "only.safetensors", "other": "only.safetensors"}}))
        self.valid("sharded_nometa/model.safetensors.index.json", "index without metadata, one shard",
                   e, {}, fmt="safetensors-index", files=["only.safetensors"])
        with open(self.path("sharded_nometa/null.safetensors.index.json"), "w") as f:
            f.write(compact({"metadata": None, "weight_map": {"other": "only.safetensors", "only": "only.safetensors"}}))
        self.valid("sharded_nometa/null.safetensors.index.json", "index with \"metadata\": null",
                   e, {}, fmt="safetensors-index", files=["only.safetensors"])

    # ---- invalid cases: safetensors files --------------------------------

    def gen_invalid(self):
        R = self.raw
        ok_entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        d8 = bytes(range(8))

        def one(entry, data=d8):
            return {"t": entry}, data

        def ent(**kw):
            e = dict(ok_entry)
            for k, v in kw.items():
                if v is ...:
                    del e[k]
                else:
                    e[k] = v
            return e

        # The 8-byte length prefix.
        self.blob("bad/zero_length.safetensors", "zero-length file", "too short", b"")
        self.blob("bad/seven_bytes.safetensors", "7-byte file", "too short", b"\x02\0\0\0\0\0\0")
        R("bad/len_zero.safetensors", "length prefix 0, no header", "header length is 0", b"")
        R("bad/len_zero_data.safetensors", "length prefix 0, then {}", "header length is 0", b"{}", length=0)
        R("bad/len_past_end.safetensors", "length prefix past the end", "runs past the end of the file", b"{}",
          length=1000)
        R("bad/len_max.safetensors", "length prefix 2^64-1", "exceeds the 100 MB limit", b"{}",
          length=(1 << 64) - 1)
        R("bad/len_limit.safetensors", "length prefix 100 MB + 1", "exceeds the 100 MB limit", b"{}",
          length=100_000_001)
        hdr = compact({"t": ok_entry}).encode()
        R("bad/len_cuts_json.safetensors", "length prefix cuts the JSON", "is not valid JSON", hdr, d8,
          length=len(hdr) - 5)
        # A valid file cut short: in the header, in the data.
        full = struct.pack("<Q", len(hdr)) + hdr + d8
        self.blob("bad/truncated_header.safetensors", "truncated in the header", "runs past the end of the file",
                  full[:8 + len(hdr) // 2])
        self.blob("bad/truncated_data.safetensors", "truncated in the data", "run past the end of the data",
                  full[:-3])
        # A GGUF file is read as GGUF whatever its name says (routing by magic).
        with open(self.path("bad/gguf.safetensors"), "wb") as f:
            f.write(gw.pack_header(3, 0, 0))
        self.valid("bad/gguf.safetensors", "a GGUF file named .safetensors (read as GGUF)", [], fmt="gguf")
        self.blob("bad/zip.safetensors", "zip magic then zeros (read as a PyTorch zip)",
                  "no zip end of central directory record", b"PK\x03\x04" + b"\0" * 60)

        # First byte, encoding, JSON syntax.
        R("bad/array_header.safetensors", "header is a JSON array", "does not start with '{'", b"[]")
        R("bad/leading_space.safetensors", "space before {", "does not start with '{'", b" {}")
        R("bad/bom.safetensors", "UTF-8 BOM before {", "does not start with '{'", b"\xef\xbb\xbf{}")
        R("bad/string_header.safetensors", "header is a JSON string", "does not start with '{'", b'"{}"')
        R("bad/utf8_ff.safetensors", "byte 0xff in a name", "not valid UTF-8",
          b'{"a\xffb":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/utf8_overlong.safetensors", "overlong UTF-8", "not valid UTF-8",
          b'{"a\xc0\xafb":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/utf8_surrogate.safetensors", "UTF-8-encoded surrogate", "not valid UTF-8",
          b'{"a\xed\xa0\x80b":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/utf8_above_max.safetensors", "UTF-8 above U+10FFFF", "not valid UTF-8",
          b'{"a\xf4\x90\x80\x80b":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/utf8_cut.safetensors", "UTF-8 sequence cut short", "not valid UTF-8",
          b'{"a\xe6\x97":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/utf8_in_padding.safetensors", "invalid UTF-8 in the padding", "not valid UTF-8", b"{} \xfe ")
        R("bad/utf8_in_metadata.safetensors", "invalid UTF-8 in a metadata value", "not valid UTF-8",
          b'{"__metadata__":{"k":"v\x80"}}')
        R("bad/json_syntax.safetensors", "JSON syntax error", "is not valid JSON", b'{"a":}')
        R("bad/json_unterminated.safetensors", "unterminated JSON", "is not valid JSON",
          b'{"a": {"dtype": "F32"' + b" " * 4)
        R("bad/json_trailing_comma.safetensors", "trailing comma", "is not valid JSON",
          '{"t":%s,}' % compact(ok_entry), d8)
        R("bad/json_single_quotes.safetensors", "single-quoted keys", "is not valid JSON", b"{'a': 1}")
        R("bad/nul_escape.safetensors", "NUL in a name via \\u0000", "is not valid JSON",
          '{"a\\u0000b":%s}' % compact(ok_entry), d8)
        R("bad/nul_escape_metadata.safetensors", "NUL in metadata via \\u0000", "is not valid JSON",
          b'{"__metadata__":{"k":"a\\u0000"}}')
        R("bad/nul_raw.safetensors", "raw NUL byte inside a name", "is not valid JSON",
          b'{"a\x00b":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/newline_raw.safetensors", "raw newline inside a name", "is not valid JSON",
          b'{"a\nb":' + compact(ok_entry).encode() + b"}", d8)
        R("bad/lone_surrogate.safetensors", "lone surrogate \\ud800", "is not valid JSON",
          '{"a\\ud800":%s}' % compact(ok_entry), d8)
        R("bad/deep_array.safetensors", "100000-deep nested arrays", "is not valid JSON",
          '{"a":' + "[" * 100000 + "]" * 100000 + "}")
        R("bad/deep_object.safetensors", "5000-deep nested objects in metadata", "is not valid JSON",
          '{"__metadata__":' + '{"a":' * 5000 + "1" + "}" * 5000 + "}")
        R("bad/dim_too_big_int.safetensors", "dimension 2^64 (beyond int64)", "is not valid JSON",
          '{"t":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,8]}}', d8)
        R("bad/offset_too_big_int.safetensors", "data_offsets beyond int64", "is not valid JSON",
          '{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,99999999999999999999]}}', d8)

        # After the JSON object: only spaces may pad it.
        R("bad/trailing_garbage.safetensors", "garbage after the JSON", "after the JSON object", b"{}xyz")
        R("bad/trailing_object.safetensors", "a second object after the JSON", "after the JSON object", b"{}{}")
        R("bad/trailing_newline.safetensors", "newline padding", "after the JSON object", b"{}\n")
        R("bad/trailing_nul.safetensors", "NUL padding", "after the JSON object", b"{}" + b"\0" * 6)
        R("bad/trailing_tab.safetensors", "tab padding", "after the JSON object", b"{}  \t")

        # Keys named twice.
        e = compact(ok_entry)
        R("bad/dup_tensor.safetensors", "a tensor named twice", "names a key twice",
          '{"t":%s,"t":%s}' % (e, e.replace("[0,8]", "[8,16]")), d8 * 2)
        R("bad/dup_metadata.safetensors", "__metadata__ twice", "names a key twice",
          b'{"__metadata__":{},"__metadata__":{}}')
        R("bad/dup_metadata_key.safetensors", "a metadata key twice", "names a key twice",
          b'{"__metadata__":{"k":"a","k":"b"}}')
        R("bad/dup_field.safetensors", "dtype twice in an entry", "names a key twice",
          '{"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', d8)

        # Tensor entries.
        R("bad/entry_number.safetensors", "entry is a number", "entry is not an object", *one(5, b""))
        R("bad/entry_array.safetensors", "entry is an array", "entry is not an object", *one([], b""))
        R("bad/entry_null.safetensors", "entry is null", "entry is not an object", *one(None, b""))
        R("bad/missing_dtype.safetensors", "no dtype", 'missing "dtype"', *one(ent(dtype=...)))
        R("bad/missing_shape.safetensors", "no shape", 'missing "shape"', *one(ent(shape=...)))
        R("bad/missing_offsets.safetensors", "no data_offsets", 'missing "data_offsets"',
          *one(ent(data_offsets=...)))
        R("bad/dtype_number.safetensors", "dtype is a number", "dtype is not a string", *one(ent(dtype=5)))
        R("bad/dtype_null.safetensors", "dtype is null", "dtype is not a string", *one(ent(dtype=None)))
        R("bad/dtype_unknown.safetensors", "unknown dtype F128", "unknown dtype", *one(ent(dtype="F128")))
        R("bad/dtype_lowercase.safetensors", "lowercase dtype f32", "unknown dtype", *one(ent(dtype="f32")))
        R("bad/dtype_empty.safetensors", "empty dtype", "unknown dtype", *one(ent(dtype="")))
        R("bad/dtype_padded.safetensors", "dtype with a space", "unknown dtype", *one(ent(dtype="F32 ")))
        R("bad/shape_number.safetensors", "shape is a number", "shape is not an array", *one(ent(shape=2)))
        R("bad/shape_null.safetensors", "shape is null", "shape is not an array", *one(ent(shape=None)))
        R("bad/shape_object.safetensors", "shape is an object", "shape is not an array", *one(ent(shape={"0": 2})))
        R("bad/dim_negative.safetensors", "negative dimension", "shape[0] is not a non-negative integer",
          *one(ent(shape=[-2])))
        R("bad/dim_negative_2nd.safetensors", "negative second dimension", "shape[1] is not a non-negative integer",
          *one(ent(shape=[1, -2])))
        R("bad/dim_float.safetensors", "float dimension", "shape[1] is not a non-negative integer",
          *one(ent(shape=[1, 2.0])))
        R("bad/dim_string.safetensors", "string dimension", "shape[0] is not a non-negative integer",
          *one(ent(shape=["2"])))
        R("bad/dim_bool.safetensors", "boolean dimension", "shape[0] is not a non-negative integer",
          *one(ent(shape=[True])))
        R("bad/dim_null.safetensors", "null dimension", "shape[0] is not a non-negative integer",
          *one(ent(shape=[None])))
        R("bad/too_many_dims.safetensors", "1025 dimensions", "shape has 1025 dimensions (limit 1024)",
          *one(ent(dtype="U8", shape=[1] * 1025, data_offsets=[0, 1]), b"\1"))
        R("bad/offsets_len3.safetensors", "data_offsets of length 3", "is not a [begin, end] pair",
          *one(ent(data_offsets=[0, 4, 8])))
        R("bad/offsets_len1.safetensors", "data_offsets of length 1", "is not a [begin, end] pair",
          *one(ent(data_offsets=[8])))
        R("bad/offsets_empty.safetensors", "data_offsets empty", "is not a [begin, end] pair",
          *one(ent(data_offsets=[])))
        R("bad/offsets_string.safetensors", "data_offsets a string", "is not a [begin, end] pair",
          *one(ent(data_offsets="0-8")))
        R("bad/offsets_negative.safetensors", "negative data_offsets", "data_offsets must be non-negative integers",
          *one(ent(data_offsets=[-8, 0])))
        R("bad/offsets_float.safetensors", "float data_offsets", "data_offsets must be non-negative integers",
          *one(ent(data_offsets=[0, 8.0])))
        R("bad/offsets_null.safetensors", "null in data_offsets", "data_offsets must be non-negative integers",
          *one(ent(data_offsets=[0, None])))

        # Sizes.
        R("bad/elements_overflow.safetensors", "2^32 x 2^32 x 2 elements", "has more than 2^64 elements",
          *one(ent(dtype="U8", shape=[1 << 32, 1 << 32, 2])))
        R("bad/elements_overflow_huge.safetensors", "huge dims (2^63-1)^2", "has more than 2^64 elements",
          *one(ent(dtype="U8", shape=[(1 << 63) - 1, (1 << 63) - 1])))
        R("bad/bytes_overflow.safetensors", "2^62 F64 elements", "overflows 64-bit byte size",
          *one(ent(dtype="F64", shape=[1 << 62])))
        R("bad/f4_odd.safetensors", "3 F4 elements", "not a whole number of bytes", *one(ent(dtype="F4", shape=[3])))
        R("bad/f6_odd.safetensors", "1 F6_E2M3 element", "not a whole number of bytes",
          *one(ent(dtype="F6_E2M3", shape=[1])))
        R("bad/f6_odd2.safetensors", "2x3 F6_E3M2 elements", "is 36 bits, not a whole number of bytes",
          *one(ent(dtype="F6_E3M2", shape=[2, 3])))
        R("bad/f4_scalar.safetensors", "an F4 scalar", "is 4 bits, not a whole number of bytes",
          *one(ent(dtype="F4", shape=[])))
        R("bad/size_mismatch.safetensors", "shape needs more bytes than the offsets hold",
          "needs 16 bytes but data_offsets [0, 12] hold 12",
          *one(ent(shape=[4], data_offsets=[0, 12]), bytes(12)))
        R("bad/size_mismatch_small.safetensors", "shape needs fewer bytes than the offsets hold",
          "needs 4 bytes but data_offsets [0, 8] hold 8", *one(ent(shape=[1])))
        R("bad/scalar_mismatch.safetensors", "a scalar with no bytes", "needs 4 bytes but data_offsets [0, 0] hold 0",
          *one(ent(shape=[], data_offsets=[0, 0]), b""))
        R("bad/end_before_begin.safetensors", "data_offsets end < begin", "end before they begin",
          *one(ent(data_offsets=[8, 0])))
        R("bad/past_end.safetensors", "data_offsets past the data", "run past the end of the data",
          *one(ent(data_offsets=[0, 8]), d8[:4]))
        R("bad/past_end_huge.safetensors", "data_offsets 2^63-1", "run past the end of the data",
          *one(ent(dtype="U8", shape=[(1 << 63) - 1], data_offsets=[0, (1 << 63) - 1])))
        R("bad/past_end_empty.safetensors", "zero-size tensor beyond the data", "run past the end of the data",
          *one(ent(shape=[0], data_offsets=[100, 100]), b""))

        # Tiling of the data section.
        def two(o1, o2, data):
            return {"a": ent(shape=[2], data_offsets=o1), "b": ent(shape=[2], data_offsets=o2)}, data
        R("bad/overlap.safetensors", "overlapping tensors", "overlap tensor", *two([0, 8], [4, 12], bytes(12)))
        R("bad/overlap_same.safetensors", "two tensors on the same bytes", "overlap tensor",
          *two([0, 8], [0, 8], bytes(8)))
        R("bad/overlap_zero_inside.safetensors", "zero-size tensor inside another", "overlap tensor",
          {"a": ent(), "z": ent(shape=[0], data_offsets=[4, 4])}, d8)
        R("bad/gap.safetensors", "gap between tensors", "leave a gap of 4 bytes", *two([0, 8], [12, 20], bytes(20)))
        R("bad/gap_at_start.safetensors", "gap before the first tensor", "leave a gap of 2 bytes",
          *one(ent(data_offsets=[2, 10]), bytes(10)))
        R("bad/trailing_data.safetensors", "bytes after the last tensor", "holds 3 bytes after the last tensor",
          *one(ok_entry, d8 + b"xyz"))
        R("bad/empty_with_data.safetensors", "{} and data", "holds 16 bytes after the last tensor", b"{}", bytes(16))

        # Hostile names must not break the one-line message (they are quoted).
        R("bad/newline_name_error.safetensors", "error on a name holding \\n, \\r, ESC", "not a whole number of bytes",
          {"evil\n\rname\u001b[2J": ent(dtype="F4", shape=[3])}, d8)
        R("bad/long_name_error.safetensors", "error on a 5000-character name", "unknown dtype",
          {"n" * 5000: ent(dtype="X" * 3000)}, d8)

        # __metadata__.
        R("bad/metadata_array.safetensors", "__metadata__ is an array", "__metadata__ is not an object",
          {"__metadata__": []})
        R("bad/metadata_null.safetensors", "__metadata__ is null", "__metadata__ is not an object",
          {"__metadata__": None})
        R("bad/metadata_string.safetensors", "__metadata__ is a string", "__metadata__ is not an object",
          {"__metadata__": "pt"})
        R("bad/metadata_number.safetensors", "a metadata value is a number", "value is not a string",
          {"__metadata__": {"format": "pt", "n": 1}})
        R("bad/metadata_nested.safetensors", "a metadata value is an object", "value is not a string",
          {"__metadata__": {"o": {"k": "v"}}})
        R("bad/metadata_null_value.safetensors", "a metadata value is null", "value is not a string",
          {"__metadata__": {"k": None}})
        R("bad/metadata_as_tensor.safetensors", "__metadata__ shaped like a tensor", "value is not a string",
          {"__metadata__": ok_entry}, d8)

        # Not a file ferry can map.
        # (inspect reads a folder as a model folder: an empty one is a usage
        # error, which tests/golden/run_inspect_folder.py checks)
        os.makedirs(self.path("bad/dir.safetensors"))
        self.invalid("bad/dir.safetensors", "a directory", "is a directory")
        self.cases[-1]["commands"] = ["hash"]
        self.invalid("bad/no_such_file.safetensors", "a missing file", "No such file")
        self.invalid("/dev/null", "a character device", "not a regular file")
        try:
            os.mkfifo(self.path("bad/fifo.safetensors"))
            self.invalid("bad/fifo.safetensors", "a FIFO (must not hang)", "not a regular file")
        except (OSError, AttributeError):
            pass
        # A safetensors file whose name ends in .json is read as an index.
        with open(self.path("bad/weights.json"), "wb") as f:
            f.write(full)
        self.invalid("bad/weights.json", "a safetensors file named *.json", "not valid JSON")

    # ---- invalid cases: sharded checkpoints ------------------------------

    def gen_invalid_index(self):
        d = "idx/"
        good = {}
        for shard, names in (("a.safetensors", ["w0", "w1"]), ("b.safetensors", ["w2"]),
                             ("c.safetensors", ["x"]), ("d.safetensors", ["x", "y"])):
            self.st_file(d + shard, [self.t(n, "F32", [2]) for n in names])
            good[shard] = names
        # A corrupt shard: a gap in its data.
        stwriter.write_raw(self.path(d + "e.safetensors"),
                           compact({"g": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}).encode(), bytes(3))
        os.makedirs(self.path(d + "subdir"))
        wm_ok = {"w0": "a.safetensors", "w1": "a.safetensors", "w2": "b.safetensors"}

        def ix(name, cls, expect, content, msg_path=None):
            if not isinstance(content, (bytes, str)):
                content = compact(content)
            if isinstance(content, str):
                content = content.encode("utf-8")
            self.blob(d + name + ".safetensors.index.json", cls, expect, content,
                      None if msg_path is None else d + msg_path)

        ix("not_json", "index: not JSON", "not valid JSON", b"{")
        ix("empty", "index: empty file", "not valid JSON", b"")
        ix("garbage_after", "index: garbage after the JSON", "not valid JSON", compact({"weight_map": wm_ok}) + " x")
        ix("bad_utf8", "index: invalid UTF-8", "not valid JSON", b'{"weight_map":{"w\xff":"a.safetensors"}}')
        ix("nul_escape", "index: \\u0000 in a name", "not valid JSON", '{"weight_map":{"w\\u0000":"a.safetensors"}}')
        ix("deep", "index: 5000-deep nesting", "not valid JSON",
           '{"metadata":' + '{"a":' * 5000 + "1" + "}" * 5000 + ',"weight_map":{}}')
        ix("dup_key", "index: a weight_map key twice", "not valid JSON",
           '{"weight_map":{"w0":"a.safetensors","w0":"a.safetensors"}}')
        ix("no_weight_map", "index: no weight_map", 'no "weight_map" object', {"metadata": {}})
        ix("array", "index: a JSON array", 'no "weight_map" object', [{"weight_map": wm_ok}])
        ix("weight_map_array", "index: weight_map is an array", 'no "weight_map" object', {"weight_map": []})
        ix("weight_map_null", "index: weight_map is null", 'no "weight_map" object', {"weight_map": None})
        ix("metadata_array", "index: metadata is an array", '"metadata" is not an object',
           {"metadata": [], "weight_map": wm_ok})
        ix("metadata_string", "index: metadata is a string", '"metadata" is not an object',
           {"metadata": "x", "weight_map": wm_ok})
        ix("empty_map", "index: empty weight_map", "weight_map is empty", {"weight_map": {}})
        ix("value_number", "index: a shard name is a number", "is not a file name", {"weight_map": {"w0": 1}})
        ix("value_null", "index: a shard name is null", "is not a file name", {"weight_map": {"w0": None}})
        ix("abs_path", "index: absolute shard path", "must be relative paths", {"weight_map": {"w0": "/etc/passwd"}})
        ix("dotdot", "index: ../ shard path", "must be relative paths",
           {"weight_map": {"w0": "../idx/a.safetensors"}})
        ix("dotdot_inner", "index: sub/../../ shard path", "must be relative paths",
           {"weight_map": {"w0": "subdir/../../idx/a.safetensors"}})
        ix("dotdot_only", "index: shard path ..", "must be relative paths", {"weight_map": {"w0": ".."}})
        ix("empty_path", "index: empty shard path", "must be relative paths", {"weight_map": {"w0": ""}})
        ix("missing_shard", "index: shard file missing", "No such file",
           {"weight_map": {"w0": "nope.safetensors"}}, msg_path="nope.safetensors")
        ix("shard_dir", "index: shard is a directory", "is a directory",
           {"weight_map": {"w0": "subdir"}}, msg_path="subdir")
        ix("shard_is_index", "index: shard is the index itself", "exceeds the 100 MB limit",
           {"weight_map": {"w0": "shard_is_index.safetensors.index.json"}},
           msg_path="shard_is_index.safetensors.index.json")
        ix("corrupt_shard", "index: a corrupt shard", "leave a gap",
           {"weight_map": {"g": "e.safetensors"}}, msg_path="e.safetensors")
        ix("ghost", "index: lists a tensor no shard holds", "which does not hold it",
           dict(weight_map=dict(wm_ok, ghost="a.safetensors")))
        ix("ghost_last", "index: lists a tensor after all others that no shard holds", "which does not hold it",
           dict(weight_map=dict(wm_ok, zzz="b.safetensors")))
        ix("unlisted", "index: a shard tensor not listed", "which weight_map does not list",
           {"weight_map": {"w0": "a.safetensors", "w2": "b.safetensors"}})
        ix("wrong_shard", "index: tensor listed under the wrong shard", "but it is in",
           {"weight_map": {"w0": "a.safetensors", "w1": "b.safetensors", "w2": "b.safetensors"}})
        # Both shards hold "x": the message names the shards (inside idx/).
        ix("dup_across_shards", "index: one tensor in two shards", "tensor names must be unique",
           {"weight_map": {"x": "c.safetensors", "y": "d.safetensors"}}, msg_path="")
        ix("two_spellings", "index: one shard under two spellings", "tensor names must be unique",
           {"weight_map": {"w0": "a.safetensors", "w1": "./a.safetensors", "w2": "b.safetensors"}}, msg_path="")
        ix("ghost_newline", "index: missing tensor whose name holds a newline", "which does not hold it",
           dict(weight_map=dict(wm_ok, **{"gh\nost": "a.safetensors"})))
        ix("shard_newline", "index: shard whose name holds a newline", "without control characters",
           {"weight_map": {"w0": "no\nsuch.safetensors"}})
        ix("bad_path_newline", "index: absolute shard path holding a newline", "must be relative paths",
           {"weight_map": {"w0": "/no\nsuch"}})
        self.invalid(d + "no_such.safetensors.index.json", "index: missing index file", "No such file")

    # ---- GGUF --------------------------------------------------------------

    def gguf_t(self, name, tname, shape):
        return (name, tname, list(shape), self.data(gw.nbytes(tname, shape)))

    def gguf_file(self, rel, cls, tensors, kvs=(), **kw):
        """Write a valid GGUF file and its case; kw goes to gguf_writer.write
        (version, alignment, info_order, gaps) or to the case (cat_sample, same_model_as)."""
        wkw = {k: kw.pop(k) for k in ("version", "alignment", "info_order", "gaps") if k in kw}
        exp = gw.write(self.path(rel), tensors, kvs, **wkw)
        # ferry's order: by offset, then size, then the tensor infos' order
        pos = {k: i for i, k in enumerate(wkw.get("info_order") or range(len(tensors)))}
        idx = sorted(range(len(exp)), key=lambda k: (exp[k]["offset"], exp[k]["nbytes"], pos[k]))
        out = []
        for k in idx:
            e = dict(exp[k])
            e["sha256"] = hashlib.sha256(e.pop("data")).hexdigest()
            e["file"] = ""
            out.append(e)
        md = {key: gw.value_json(vt, v) for key, vt, v in kvs}
        if "alignment" in wkw:
            md["general.alignment"] = wkw["alignment"]
        self.valid(rel, cls, out, md, fmt="gguf", **kw)

    def gen_gguf(self):
        S, A = gw.STRING, gw.ARRAY
        arch = [("general.architecture", S, "llama"), ("general.quantization_version", gw.UINT32, 2)]

        # Every ggml type ferry knows, 2-D, plus 1-D, 3-D and 4-D shapes.
        ts = []
        for tname, (_, block, _) in gw.GGML_TYPES.items():
            ts.append(self.gguf_t(f"t.{tname.lower()}", tname, [2, 2 * block] if block > 1 else [3, 2]))
        ts += [self.gguf_t("v.q4_k.1d", "Q4_K", [512]), self.gguf_t("v.q8_0.3d", "Q8_0", [2, 3, 64]),
               self.gguf_t("v.f16.4d", "F16", [2, 1, 3, 4]), self.gguf_t("v.mxfp4.4d", "MXFP4", [1, 2, 2, 32])]
        self.gguf_file("gguf/types.gguf", "GGUF: every ggml type (random block bytes)", ts, arch)
        ts = [self.gguf_t("a", "F32", [4, 4]), self.gguf_t("b", "Q6_K", [256]), self.gguf_t("c", "I32", [7])]
        self.gguf_file("gguf/v2.gguf", "GGUF version 2", ts, arch, version=2)

        # Metadata of every value type: limits, floats that print shortest,
        # strings with escapes, arrays short (shown) and long (summarised), nested.
        tokens = [f"tok{i}" if i % 5 else f"<0x{i & 0xFF:02X}>" for i in range(30000)]
        kvs = [
            ("u8", gw.UINT8, 255), ("i8", gw.INT8, -128), ("u16", gw.UINT16, 65535), ("i16", gw.INT16, -32768),
            ("u32", gw.UINT32, 4294967295), ("i32", gw.INT32, -2147483648),
            ("u64", gw.UINT64, (1 << 64) - 1), ("i64", gw.INT64, -(1 << 63)), ("u64.zero", gw.UINT64, 0),
            ("f32.tenth", gw.FLOAT32, 0.1), ("f32.eps", gw.FLOAT32, 1e-5), ("f32.neg0", gw.FLOAT32, -0.0),
            ("f32.max", gw.FLOAT32, 3.4028234663852886e38), ("f32.tiny", gw.FLOAT32, 1.401298464324817e-45),
            ("f32.int", gw.FLOAT32, 10000.0), ("f32.big", gw.FLOAT32, 1e10), ("f32.rope", gw.FLOAT32, 500000.0),
            ("f32.nan", gw.FLOAT32, float("nan")), ("f32.inf", gw.FLOAT32, float("inf")),
            ("f32.ninf", gw.FLOAT32, float("-inf")),
            ("f64.third", gw.FLOAT64, 1 / 3), ("f64.big", gw.FLOAT64, 1e300), ("f64.min", gw.FLOAT64, 5e-324),
            ("f64.neg", gw.FLOAT64, -2.5), ("f64.nan", gw.FLOAT64, float("nan")),
            ("bool.t", gw.BOOL, True), ("bool.f", gw.BOOL, False),
            ("str.empty", S, ""), ("str.unicode", S, "名前 🙂 ñ"),
            ("tokenizer.chat_template", S, "{% for m in messages %}\n\t{{ m['content'] }}\"\\{% endfor %}"),
            ("arr.empty", A, (gw.UINT8, [])), ("arr.u8", A, (gw.UINT8, [1, 2, 3])),
            ("arr.i32.16", A, (gw.INT32, list(range(-8, 8)))), ("arr.i32.17", A, (gw.INT32, list(range(17)))),
            ("arr.f32", A, (gw.FLOAT32, [0.5, -1.25, 1e-6, float("inf")])),
            ("arr.f64", A, (gw.FLOAT64, [0.1, 2.0])),
            ("arr.bool", A, (gw.BOOL, [True, False, True])),
            ("arr.u64", A, (gw.UINT64, [0, (1 << 64) - 1])), ("arr.i8", A, (gw.INT8, [-1, 127])),
            ("arr.str", A, (S, ["a", "", 'q"b\\s', "nl\ntab\t", "\x01\x1f\x7f", "名前", "🙂"])),
            ("arr.nested", A, (A, [(gw.INT32, [1, 2]), (gw.INT32, [3]), (S, ["x"]), (gw.UINT8, [])])),
            ("arr.nested.big", A, (A, [(gw.INT16, [1]), (gw.INT16, list(range(100)))])),
            ("arr.arrays", A, (A, [(gw.UINT8, [i]) for i in range(20)])),
            ("arr.deep", A, (A, [(A, [(A, [(A, [(A, [(gw.BOOL, [True])])])])])])),
            ("tokenizer.ggml.tokens", A, (S, tokens)),
            ("tokenizer.ggml.scores", A, (gw.FLOAT32, [float(-i) for i in range(30000)])),
            ("tokenizer.ggml.token_type", A, (gw.INT32, [1] * 30000)),
            ("tokenizer.ggml.bools", A, (gw.BOOL, [False, True] * 100)),
        ]
        # Random bit patterns: the shortest round-trip text must agree digit for digit.
        for i in range(64):
            f32 = struct.unpack("<f", self.rng.randbytes(4))[0]
            f64 = struct.unpack("<d", self.rng.randbytes(8))[0]
            if i % 4 == 0:  # typical magnitudes too
                f32 = struct.unpack("<f", struct.pack("<f", self.rng.uniform(-10, 10)))[0]
                f64 = self.rng.uniform(-1e6, 1e6) * 10 ** self.rng.randint(-20, 20)
            kvs += [(f"rand.f32.{i}", gw.FLOAT32, f32), (f"rand.f64.{i}", gw.FLOAT64, f64)]
        ts = [self.gguf_t("token_embd.weight", "Q4_K", [4, 256]), self.gguf_t("output_norm.weight", "F32", [256])]
        self.gguf_file("gguf/metadata.gguf", "GGUF: metadata of every value type, nested and huge arrays", ts,
                       arch + kvs)

        # Alignment: custom, 1 (no padding at all), large.
        for a in (64, 1, 4096):
            ts = [self.gguf_t("x", "F32", [3]), self.gguf_t("y", "Q8_0", [32]), self.gguf_t("z", "I8", [5])]
            self.gguf_file(f"gguf/align_{a}.gguf", f"GGUF: general.alignment = {a}", ts, arch, alignment=a)

        # No tensors: metadata only; nothing at all.
        self.gguf_file("gguf/no_tensors.gguf", "GGUF: metadata, no tensors", [], arch)
        self.gguf_file("gguf/empty.gguf", "GGUF: no metadata, no tensors (24 bytes)", [])

        # Tensor infos listed out of data order, extra padding gaps, empty
        # tensors (sharing an offset with the next one), a scalar (n_dims 0).
        ts = [self.gguf_t("e.first", "F32", [0]), self.gguf_t("a", "F32", [3, 5]), self.gguf_t("e.mid", "Q4_0", [0, 32]),
              self.gguf_t("s.scalar", "F32", []), self.gguf_t("b", "Q2_K", [1, 256]), self.gguf_t("e.zero0", "Q4_K", [3, 0]),
              self.gguf_t("c", "BF16", [9]), self.gguf_t("e.last", "I64", [0])]
        self.gguf_file("gguf/order.gguf", "GGUF: infos out of data order, gaps, empty tensors, a scalar", ts, arch,
                       info_order=[6, 2, 7, 0, 4, 1, 5, 3], gaps=[0, 2, 0, 1, 0, 0, 3, 0])

        # Odd tensor names: unicode, exactly 64 bytes, empty, a leading dash.
        names = ["模型.层.0.权重", "emoji.🙂", "n" * 64, "", "-dash", "tab\tnl\n", "quote'\"\\"]
        ts = [self.gguf_t(n, "F16", [i + 1]) for i, n in enumerate(names)]
        self.gguf_file("gguf/names.gguf", "GGUF: odd tensor names", ts, arch, info_order=[3, 1, 0, 6, 5, 2, 4])

        # Many tiny tensors, listed shuffled.
        ts = [self.gguf_t(f"blk.{i // 10}.p{i % 10}", self.rng.choice(["F32", "F16", "Q8_0", "I8"]),
                          [self.rng.choice([0, 1, 2]), 32]) for i in range(2000)]
        order = list(range(len(ts)))
        self.rng.shuffle(order)
        sample = [ts[0][0], ts[-1][0]] + [t[0] for t in self.rng.sample(ts, 30)]
        self.gguf_file("gguf/many.gguf", "GGUF: 2000 tiny tensors", ts, arch, info_order=order,
                       cat_sample=list(dict.fromkeys(sample)))

        # The same tensors as a safetensors file: the model hash must agree.
        ts = [self.gguf_t(f"w.{d.lower()}", d, [3, 4]) for d in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")]
        self.gguf_file("gguf/same.gguf", "GGUF: the same tensors as a safetensors file", ts, arch,
                       same_model_as="gguf/same.safetensors")
        self.valid("gguf/same.safetensors", "safetensors: the same tensors as a GGUF file",
                   self.st_file("gguf/same.safetensors", list(reversed(ts))), same_model_as="gguf/same.gguf")

    def gen_invalid_gguf(self):
        H, KV, TI, S = gw.pack_header, gw.pack_kv, gw.pack_tensor_info, gw.pack_string
        T = gw.GGML_TYPES
        d = "gguf_bad/"

        def bad(name, cls, expect, content):
            self.blob(d + name + ".gguf", cls, expect, content)

        def pad(head, align=32):
            return head + bytes(gw.align_up(len(head), align) - len(head))

        def one(ne, tname="F32", offset=0, name="t", data=None, kvs=(), align=32):
            """one tensor info (ne innermost-first) and its data (zeros by default)"""
            head = H(3, 1, len(kvs)) + b"".join(KV(*kv) for kv in kvs) + TI(name, ne, T[tname][0], offset)
            return pad(head, align) + (data if data is not None else bytes(64))

        kv_ok = KV("general.architecture", gw.STRING, "llama")
        # The header.
        bad("v1", "GGUF version 1", "GGUF version 1 is not supported", b"GGUF" + struct.pack("<II", 1, 0) + bytes(8))
        bad("v4", "GGUF version 4", "GGUF version 4 is not supported", H(4, 0, 0))
        bad("v0", "GGUF version 0", "GGUF version 0 is not supported", H(0, 0, 0))
        bad("v_huge", "GGUF version 0xdeadbeef", "GGUF version 3735928559 is not supported", H(0xDEADBEEF, 0, 0))
        bad("big_endian", "a big-endian GGUF v3 file", "big-endian",
            b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + struct.pack(">Q", 1) + b"k" + struct.pack(">II", 4, 7))
        bad("big_endian_v2", "a big-endian GGUF v2 file", "big-endian", b"GGUF" + struct.pack(">IQQ", 2, 0, 0))
        bad("short", "12-byte file", "too short for the 24-byte GGUF header", H(3, 0, 0)[:12])
        bad("short23", "23-byte file", "too short for the 24-byte GGUF header", H(3, 0, 0)[:23])
        bad("kv_count_huge", "metadata_kv_count 2^40", "metadata_kv_count 1099511627776 is impossible",
            H(3, 0, 1 << 40) + kv_ok)
        bad("kv_count_max", "metadata_kv_count 2^64-1", "is impossible", H(3, 0, (1 << 64) - 1))
        bad("tensor_count_huge", "tensor_count 10^6", "tensor_count 1000000 is impossible",
            H(3, 10 ** 6, 0) + bytes(100))
        bad("tensor_count_max", "tensor_count 2^64-1", "tensor_count 18446744073709551615 is impossible",
            H(3, (1 << 64) - 1, 1) + kv_ok)
        bad("kv_count_lie", "2 key/values announced, 1 there", "metadata key 'x': the value type at offset",
            H(3, 0, 2) + kv_ok + S("x") + b"\0\0")
        # Key/values.
        bad("key_past_end", "key length past the end", "the key of 1000 bytes at offset 32 runs past the end",
            H(3, 0, 1) + struct.pack("<Q", 1000) + b"abcdefgh")
        bad("value_past_end", "a UINT64 value cut short", "metadata key 'k': a UINT64 value at offset 37 runs past",
            H(3, 0, 1) + S("k") + struct.pack("<I", gw.UINT64) + bytes(4))
        bad("string_past_end", "a STRING value past the end", "a STRING value of 4096 bytes",
            H(3, 0, 1) + S("k") + struct.pack("<IQ", gw.STRING, 4096) + b"abc")
        bad("vtype_unknown", "value type 13", "metadata key 'k': unknown value type 13",
            H(3, 0, 1) + S("k") + struct.pack("<I", 13) + bytes(8))
        bad("vtype_huge", "value type 2^32-1", "unknown value type 4294967295",
            H(3, 0, 1) + S("k") + struct.pack("<I", 0xFFFFFFFF) + bytes(8))
        bad("array_etype_unknown", "array of element type 99", "has unknown element type 99",
            H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, 99, 1) + bytes(8))
        bad("array_count_huge", "array of 2^40 strings", "needs at least 8 bytes per item",
            H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, gw.STRING, 1 << 40) + S("x"))
        bad("array_count_max_u32", "array of 2^64-1 UINT32", "needs at least 4 bytes per item",
            H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, gw.UINT32, (1 << 64) - 1) + bytes(8))
        bad("array_string_past_end", "a string in an array runs past the end", "a STRING value of 999 bytes",
            H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, gw.STRING, 2) + S("a") + struct.pack("<Q", 999) + b"x")
        bad("bool_2", "BOOL value 2", "BOOL value 2 at offset 37 is neither 0 nor 1",
            H(3, 0, 1) + S("k") + struct.pack("<IB", gw.BOOL, 2) + bytes(8))
        bad("bool_in_array", "BOOL 255 in an array of 1000", "BOOL value 255",
            H(3, 0, 1) + S("k") + struct.pack("<IIQ", gw.ARRAY, gw.BOOL, 1000) + bytes(500) + b"\xff" + bytes(499))
        deep = struct.pack("<IQ", gw.ARRAY, 1) * 40 + struct.pack("<IQ", gw.UINT8, 0)
        bad("array_deep", "arrays nested 40 deep", "nested deeper than 32 levels",
            H(3, 0, 1) + S("k") + struct.pack("<I", gw.ARRAY) + deep)
        bad("key_utf8", "key with byte 0xff", "the key is not valid UTF-8 (byte 0xff",
            H(3, 0, 1) + S(b"a\xffb") + struct.pack("<IB", gw.UINT8, 1))
        bad("key_surrogate", "key with an encoded surrogate", "the key is not valid UTF-8",
            H(3, 0, 1) + S(b"a\xed\xa0\x80") + struct.pack("<IB", gw.UINT8, 1))
        bad("key_nul", "key with a NUL byte", "the key holds a NUL byte",
            H(3, 0, 1) + S(b"a\0b") + struct.pack("<IB", gw.UINT8, 1))
        bad("key_empty", "empty key", "metadata key/value 1 of 1: the key is empty",
            H(3, 0, 1) + S("") + struct.pack("<IB", gw.UINT8, 1) + bytes(4))
        bad("key_too_long", "key of 65536 bytes", "the key is 65536 bytes long (GGUF allows at most 65535)",
            H(3, 0, 1) + S("k" * 65536) + struct.pack("<IB", gw.UINT8, 1))
        bad("value_utf8", "STRING value with byte 0xc0", "metadata key 'k': the STRING value is not valid UTF-8",
            H(3, 0, 1) + KV("k", gw.STRING, b"ab\xc0\xafc"))
        bad("value_nul", "STRING value with a NUL byte", "the STRING value holds a NUL byte",
            H(3, 0, 1) + KV("k", gw.STRING, b"ab\0c"))
        bad("dup_key", "a key twice", "metadata key 'general.architecture' appears twice (key/values 1 and 3)",
            H(3, 0, 3) + kv_ok + KV("x", gw.UINT8, 1) + kv_ok)
        bad("align_zero", "general.alignment 0", "the alignment 0 is not a power of two",
            H(3, 0, 1) + KV("general.alignment", gw.UINT32, 0))
        bad("align_48", "general.alignment 48", "the alignment 48 is not a power of two",
            H(3, 0, 1) + KV("general.alignment", gw.UINT32, 48))
        bad("align_u64", "general.alignment as UINT64", "the alignment must be a UINT32, not UINT64",
            H(3, 0, 1) + KV("general.alignment", gw.UINT64, 64))
        bad("align_string", "general.alignment as STRING", "the alignment must be a UINT32, not STRING",
            H(3, 0, 1) + KV("general.alignment", gw.STRING, "32"))
        bad("key_newline_error", "error on a key holding a newline", "metadata key 'a\\x0ab\\x1b[2J': unknown value type",
            H(3, 0, 1) + S("a\nb\x1b[2J") + struct.pack("<I", 77) + bytes(8))
        # Tensor infos.
        bad("name_65", "a 65-byte tensor name", "tensor info 1 of 1: the name is 65 bytes long (GGUF allows at most 64)",
            H(3, 1, 0) + TI("n" * 65, [4], 0, 0) + bytes(64))
        bad("name_utf8", "tensor name with byte 0x80", "the name is not valid UTF-8",
            H(3, 1, 0) + TI(b"w\x80", [4], 0, 0) + bytes(64))
        bad("name_nul", "tensor name with a NUL byte", "the name holds a NUL byte",
            H(3, 1, 0) + TI(b"w\0x", [4], 0, 0) + bytes(64))
        bad("dup_name", "a tensor name twice", "tensor 'w' is listed twice (tensor infos 1 and 2)",
            pad(H(3, 2, 0) + TI("w", [4], 0, 0) + TI("w", [4], 0, 32)) + bytes(64))
        bad("n_dims_5", "n_dims 5", "tensor 'w': n_dims is 5 (GGUF allows at most 4)",
            H(3, 1, 0) + TI("w", [1, 1, 1, 1, 1], 0, 0) + bytes(64))
        bad("n_dims_huge", "n_dims 2^32-1", "n_dims is 4294967295",
            H(3, 1, 0) + S("w") + struct.pack("<I", 0xFFFFFFFF) + bytes(64))
        bad("dim_negative", "ne[1] = 2^63", "ne[1] = 9223372036854775808 is negative",
            H(3, 1, 0) + TI("w", [4, 1 << 63], 0, 0) + bytes(64))
        bad("type_unknown", "ggml type 99", "tensor 'w': ggml type 99 is not one ferry knows",
            H(3, 1, 0) + S("w") + struct.pack("<IQIQ", 1, 4, 99, 0) + bytes(64))
        bad("type_43", "ggml type 43 (past Q2_0)", "ggml type 43 is not one ferry knows",
            H(3, 1, 0) + S("w") + struct.pack("<IQIQ", 1, 4, 43, 0) + bytes(64))
        bad("type_q4_2", "ggml type 4 (Q4_2, removed)", "ggml type 4 (Q4_2) was removed from GGUF files",
            H(3, 1, 0) + S("w") + struct.pack("<IQIQ", 1, 32, 4, 0) + bytes(64))
        bad("type_q4_0_4_4", "ggml type 31 (Q4_0_4_4, removed)", "(Q4_0_4_4) was removed",
            H(3, 1, 0) + S("w") + struct.pack("<IQIQ", 1, 32, 31, 0) + bytes(64))
        bad("block_q4_0", "Q4_0 with ne[0] = 33", "ne[0] = 33 is not a multiple of the Q4_0 block (32 elements)",
            one([33, 2], "Q4_0"))
        bad("block_q4_k", "Q4_K with ne[0] = 32", "ne[0] = 32 is not a multiple of the Q4_K block (256 elements)",
            one([32, 8], "Q4_K", data=bytes(200)))
        bad("block_scalar", "a Q8_0 scalar (n_dims 0)", "ne [] of Q8_0: ne[0] = 1 is not a multiple", one([], "Q8_0"))
        bad("block_inner_only", "Q4_0 with ne = [2, 32] (rows of 2)", "ne[0] = 2 is not a multiple",
            one([2, 32], "Q4_0"))
        bad("elements_overflow", "2^32 x 2^32 x 2 I8 elements", "has more than 2^64 elements",
            one([1 << 32, 1 << 32, 2], "I8"))
        bad("bytes_overflow", "2^62 F64 elements", "of F64 overflows 64-bit byte size", one([1 << 62], "F64"))
        bad("bytes_overflow_q", "31 x 2^59 Q8_0 elements", "of Q8_0 overflows 64-bit byte size",
            one([1 << 59, 31], "Q8_0"))
        bad("offset_unaligned", "offset 8 with alignment 32", "tensor 't': offset 8 is not a multiple of the alignment (32)",
            one([4], offset=8))
        bad("offset_unaligned_64", "offset 32 with alignment 64", "offset 32 is not a multiple of the alignment (64)",
            one([4], offset=32, kvs=[("general.alignment", gw.UINT32, 64)], align=64))
        bad("past_end", "data past the end of the file", "run past the end of the file", one([32], data=bytes(100)))
        bad("past_end_offset", "offset past the end of the file", "run past the end of the file",
            one([4], offset=1 << 20))
        bad("offset_overflow", "offset 2^64-32", "run past the end of the file", one([4], offset=(1 << 64) - 32))
        bad("past_end_empty", "an empty tensor beyond the end", "run past the end of the file",
            one([0], offset=4096))
        bad("no_padding", "data section missing (file ends at the header)", "run past the end of the file",
            (H(3, 1, 0) + TI("w", [1], 0, 0)))
        two = H(3, 2, 0) + TI("a", [16], 0, 0) + TI("b", [16], 0, 32)
        bad("overlap", "two tensors overlapping", "tensor 'b': bytes [32, 96) of the data section overlap tensor 'a' [0, 64)",
            pad(two) + bytes(128))
        same = H(3, 2, 0) + TI("a", [8], 0, 0) + TI("b", [8], 0, 0)
        bad("overlap_same", "two tensors at one offset", "overlap tensor", pad(same) + bytes(64))
        inside = H(3, 3, 0) + TI("big", [64], 0, 0) + TI("e", [0], 0, 64) + TI("in", [8], 0, 128)
        bad("overlap_inside", "a tensor inside another (an empty one between is fine)", "tensor 'in': bytes [128, 160) "
            "of the data section overlap tensor 'big' [0, 256)", pad(inside) + bytes(256))
        bad("name_newline_error", "error on a tensor name holding a newline", "tensor 'evil\\x0aname': offset 1",
            one([4], offset=1, name="evil\nname"))
        # A valid file cut short.
        full = gw.pack_header(3, 1, 1) + kv_ok + TI("w", [64], T["Q8_0"][0], 0)
        full = pad(full) + bytes(34 * 2)
        bad("truncated_data", "cut in the data", "run past the end of the file", full[:-1])
        cut = len(gw.pack_header(3, 1, 1) + kv_ok) + 5
        bad("truncated_infos", "cut at the start of the tensor infos",
            "tensor info 1 of 1: the length of the name at offset 69 runs past the end of the file", full[:cut])
        bad("truncated_infos2", "cut in a tensor info", "tensor 'w': the type and offset at offset",
            full[:cut + 25])
        bad("truncated_kv", "cut in a key/value", "runs past the end of the file",
            (gw.pack_header(3, 0, 1) + kv_ok)[:-2])


def main(argv):
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: gen_golden.py OUTDIR", file=sys.stderr)
        return 2
    out = argv[1]
    if os.path.lexists(out):
        if os.path.isdir(out) and not os.path.islink(out) and (
                not os.listdir(out) or os.path.exists(os.path.join(out, "manifest.json"))):
            shutil.rmtree(out)
        else:
            print(f"gen_golden.py: {out} exists and holds no previous corpus (manifest.json); "
                  "refusing to replace it", file=sys.stderr)
            return 1
    os.makedirs(out)
    g = Gen(out)
    g.gen_valid()
    g.gen_invalid()
    g.gen_invalid_index()
    g.gen_gguf()
    g.gen_invalid_gguf()
    golden_pt.gen(g)
    files = [c["file"] for c in g.cases]
    assert len(set(files)) == len(files), "two cases share a file"
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"version": 1, "cases": g.cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    nv = sum(c["valid"] for c in g.cases)
    print(f"gen_golden.py: {len(g.cases)} cases ({nv} valid, {len(g.cases) - nv} invalid) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
