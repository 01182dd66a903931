#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make_keep_corpus.py - writes fuzz_keep's seed corpus (standard library only).

    python3 tests/fuzz/make_keep_corpus.py [OUTDIR]   (default: tests/fuzz/corpus/keep)

One file per message type of the keeper's protocol (docs/KEEPER.md), each a
whole message (16-byte header + body), a few streams of several messages, and
edge cases the decoder must refuse. Written from docs/KEEPER.md's tables.
"""
import os
import shutil
import struct
import sys

MAGIC = b"FKEP"


def msg(t, body, version=1, reserved=0):
    return MAGIC + struct.pack("<HHII", version, t, len(body), reserved) + body


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<H", len(b)) + b


def ident(path="/models/flux.safetensors", tensor="blocks.0.weight", index=0, size=23800000000,
          mtime=1700000000123456789, digest=0x0123456789ABCDEF):
    return s(path) + s(tensor) + struct.pack("<IQqQ", index, size, mtime, digest)


def status(entries, clients, device="sim:24GiB"):
    b = struct.pack("<QQQIII", 1 << 34, 4096 * len(entries), 0, len(entries), 0, len(clients)) + s(device)
    b += struct.pack("<I", len(entries))
    for i, (p, t) in enumerate(entries):
        b += struct.pack("<Q", i + 1) + s(p) + s(t) + struct.pack("<IQIQqQQ", i, 4096, 1, 1000, 5, 6, 7)
    b += struct.pack("<I", len(clients))
    for pid, uid in clients:
        b += struct.pack("<iIII", pid, uid, 1, 0)
    return b


def seeds():
    yield "hello", msg(0x01, struct.pack("<I", 1))
    yield "put_begin", msg(0x02, ident() + struct.pack("<Q", 1 << 20))
    yield "put_begin_index", msg(0x02, ident(tensor="", index=17) + struct.pack("<Q", 4096))
    yield "put_commit", msg(0x03, struct.pack("<Q", 1))
    yield "get", msg(0x04, ident())
    yield "release", msg(0x05, struct.pack("<Q", 1))
    yield "drop_entry", msg(0x06, b"\x00" + ident())
    yield "drop_file", msg(0x06, b"\x01" + ident())
    yield "drop_all", msg(0x06, b"\x02" + ident(path="", tensor="", size=0, mtime=0, digest=0))
    yield "status", msg(0x07, b"")
    yield "hello_ok", msg(0x81, struct.pack("<IIQ", 1, 4242, 1 << 34) + s("sim:16GiB"))
    yield "put_ready", msg(0x82, struct.pack("<QQ", 1, 1 << 20))
    yield "ok", msg(0x83, b"")
    yield "hit", msg(0x84, struct.pack("<QQQ", 1, 0, 1 << 20))
    yield "miss", msg(0x85, b"\x00")
    yield "miss_stale", msg(0x85, b"\x01")
    yield "dropped", msg(0x86, struct.pack("<I", 3))
    yield "status_reply", msg(0x87, status([("/m/a.safetensors", "w"), ("/m/b.gguf", "")], [(100, 0), (200, 0)]))
    yield "status_empty", msg(0x87, status([], []))
    yield "error", msg(0xFF, struct.pack("<I", 28) + s("no room for 1.00 GiB"))
    # streams, as a connection carries them
    yield "stream_put", (msg(0x01, struct.pack("<I", 1)) + msg(0x02, ident() + struct.pack("<Q", 64))
                         + msg(0x03, struct.pack("<Q", 1)) + msg(0x04, ident()) + msg(0x07, b""))
    yield "stream_replies", (msg(0x81, struct.pack("<IIQ", 1, 1, 1) + s("sim")) + msg(0x82, struct.pack("<QQ", 1, 64))
                             + msg(0x83, b"") + msg(0x84, struct.pack("<QQQ", 1, 0, 64)))
    # refused
    yield "bad_magic", b"FKEQ" + msg(0x01, struct.pack("<I", 1))[4:]
    yield "bad_version", msg(0x01, struct.pack("<I", 1), version=2)
    yield "bad_reserved", msg(0x01, struct.pack("<I", 1), reserved=1)
    yield "bad_type", msg(0x08, b"")
    yield "too_long", MAGIC + struct.pack("<HHII", 1, 0x01, 65537, 0)
    yield "nul_in_path", msg(0x04, ident(path="/m/a\0b"))
    yield "relative_path", msg(0x04, ident(path="m/a"))
    yield "trailing", msg(0x05, struct.pack("<Q", 1) + b"x")
    yield "truncated", msg(0x04, ident())[:-3]
    yield "status_count", msg(0x87, status([("/a", "w")], [])[:-4] + struct.pack("<I", 4097))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "keep")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name, data in seeds():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
