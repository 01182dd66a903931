#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ferry hash --sha256 against sha256sum: the same lines, byte for byte, on sizes
around the read buffer and SHA-256's 64-byte block; a sharded checkpoint's shards;
--json; standard input; names sha256sum escapes; and the errors (a missing file, a
directory, usage) with their exit statuses.
   test_hash_sha256.py FERRY      (exit 0 passed, 1 failed)
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

ferry = os.path.abspath(sys.argv[1])
CHUNK = 4 << 20  # SHA_CHUNK in tools/ferry/cmd_hash.c
failures = []


def check(name, cond, detail=""):
    if not cond:
        failures.append(name)
        print(f"FAIL: {name}: {detail}")


def run(args, **kw):
    return subprocess.run([ferry, "hash"] + args, capture_output=True, **kw)


def sha256sum(paths, cwd):
    return subprocess.run(["sha256sum", "--"] + paths, capture_output=True, cwd=cwd, check=True).stdout


def safetensors(path, tensors):
    """a minimal safetensors file: {name: bytes} as U8 vectors"""
    hdr, off = {}, 0
    for name, data in tensors.items():
        hdr[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(tensors.values()))


with tempfile.TemporaryDirectory() as d:
    # sizes: empty, 1 byte, SHA-256's padding and block edges, one read buffer and one more
    sizes = [0, 1, 55, 56, 63, 64, 65, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345]
    names = []
    for n in sizes:
        name = f"f{n}.bin"
        with open(os.path.join(d, name), "wb") as f:
            f.write(os.urandom(n))
        names.append(name)
    r = run(["--sha256"] + names, cwd=d)
    want = sha256sum(names, d)
    check("sizes: exit 0", r.returncode == 0, r.stderr.decode())
    check("sizes: sha256sum's lines", r.stdout == want, f"\n{r.stdout.decode()}!=\n{want.decode()}")
    check("sizes: nothing on stderr (not a terminal: no progress bar)", r.stderr == b"", r.stderr.decode())
    c = subprocess.run(["sha256sum", "-c", "--quiet"], input=r.stdout, cwd=d, capture_output=True)
    check("sizes: sha256sum -c accepts them", c.returncode == 0, c.stdout.decode() + c.stderr.decode())

    # names sha256sum writes escaped (a backslash, a newline)
    odd = ["back\\slash", "new\nline"]
    for name in odd:
        with open(os.path.join(d, name), "wb") as f:
            f.write(name.encode())
    r = run(["--sha256"] + odd, cwd=d)
    check("escaped names: sha256sum's lines", r.returncode == 0 and r.stdout == sha256sum(odd, d),
          repr(r.stdout) + repr(r.stderr))

    # standard input
    with open(os.path.join(d, names[-1]), "rb") as f:
        r = run(["--sha256", "-"], stdin=f)
    check("stdin", r.returncode == 0 and r.stdout == want.splitlines(True)[-1].replace(names[-1].encode(), b"-"),
          repr(r.stdout) + repr(r.stderr))

    # a sharded checkpoint: each shard, as sha256sum prints it, not the index
    sh = os.path.join(d, "sharded")
    os.mkdir(sh)
    safetensors(os.path.join(sh, "model-00001-of-00002.safetensors"), {"a": os.urandom(1000)})
    safetensors(os.path.join(sh, "model-00002-of-00002.safetensors"), {"b": os.urandom(3000), "c": b"xyz"})
    with open(os.path.join(sh, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                  "b": "model-00002-of-00002.safetensors",
                                                  "c": "model-00002-of-00002.safetensors"}}, f)
    r = run(["--sha256", "sharded/model.safetensors.index.json", names[1]], cwd=d)
    shards = ["sharded/model-00001-of-00002.safetensors", "sharded/model-00002-of-00002.safetensors"]
    lines = r.stdout.splitlines(True)
    check("sharded: exit 0", r.returncode == 0, r.stderr.decode())
    check("sharded: one line per shard, then the next PATH", len(lines) == 3, r.stdout.decode())
    check("sharded: the shards' sha256sum lines", sorted(lines[:2]) == sorted(sha256sum(shards, d).splitlines(True)),
          r.stdout.decode())
    check("sharded: then the next PATH", lines[2:] == sha256sum([names[1]], d).splitlines(True), r.stdout.decode())
    r = run(["--sha256", "sharded/missing.safetensors.index.json"], cwd=d)
    check("sharded: a missing index: exit 1, named", r.returncode == 1 and b"missing.safetensors.index.json" in r.stderr,
          f"exit {r.returncode}: {r.stderr.decode()}")

    # --json: an object per file
    r = run(["--sha256", "--json", names[0], names[2], "sharded/model.safetensors.index.json"], cwd=d)
    check("json: exit 0", r.returncode == 0, r.stderr.decode())
    try:
        got = json.loads(r.stdout)
    except ValueError as e:
        got = None
        check("json: parses", False, f"{e}: {r.stdout.decode()}")
    if got is not None:
        want_j = []
        for p in [names[0], names[2]] + shards:
            with open(os.path.join(d, p), "rb") as f:
                data = f.read()
            want_j.append({"path": p, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        check("json: path, bytes, sha256 of each", got == want_j, f"{got} != {want_j}")

    # errors: the others are still hashed, the bad one is named, exit 1
    r = run(["--sha256", "nonexistent.bin", names[1]], cwd=d)
    check("missing: exit 1", r.returncode == 1, str(r.returncode))
    check("missing: named", b"nonexistent.bin: No such file or directory" in r.stderr, r.stderr.decode())
    check("missing: the other file still hashed", r.stdout == sha256sum([names[1]], d), r.stdout.decode())
    r = run(["--sha256", "sharded"], cwd=d)
    check("directory: exit 1, named", r.returncode == 1 and b"sharded: Is a directory" in r.stderr,
          f"exit {r.returncode}: {r.stderr.decode()}")
    check("directory: nothing on stdout", r.stdout == b"", r.stdout.decode())
    if os.geteuid() != 0:  # root reads any file
        os.chmod(os.path.join(d, names[2]), 0)
        r = run(["--sha256", names[2]], cwd=d)
        check("unreadable: exit 1, named", r.returncode == 1 and b"Permission denied" in r.stderr
              and names[2].encode() in r.stderr, f"exit {r.returncode}: {r.stderr.decode()}")

    # usage errors: exit 2
    for args in (["--sha256"], ["--sha256", "--threads", "2", names[1]], [names[1], names[2]]):
        r = run(args, cwd=d)
        check(f"usage {args}: exit 2", r.returncode == 2, f"exit {r.returncode}: {r.stderr.decode()}")

    r = run(["--help"])
    check("help: explains --sha256", r.returncode == 0 and b"--sha256" in r.stdout and b"sha256sum -c" in r.stdout
          and b"index.json" in r.stdout, r.stdout.decode())

print(f"hash_sha256: {'FAILED ' + str(len(failures)) if failures else 'all passed'}")
sys.exit(1 if failures else 0)
