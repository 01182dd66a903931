#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ferry hash --sha256 against Python's hashlib: random files of random odd sizes
(up to a few read buffers), and the same bytes through standard input written
in random pieces, so that the hash is updated with pieces of any length.
   test_sha256_hashlib.py FERRY      (exit 0 passed, 1 failed)
"""
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import threading

ferry = os.path.abspath(sys.argv[1])
CHUNK = 4 << 20  # SHA_CHUNK in tools/ferry/cmd_hash.c
rnd = random.Random(180_4)  # the same files on every run
failures = []


def check(name, cond, detail=""):
    if not cond:
        failures.append(name)
        print(f"FAIL: {name}: {detail}")


with tempfile.TemporaryDirectory() as d:
    sizes = [rnd.randrange(1, 1 << 12) | 1 for _ in range(12)]
    sizes += [rnd.randrange(1 << 12, 1 << 20) | 1 for _ in range(6)]
    sizes += [rnd.randrange(CHUNK, 3 * CHUNK) | 1 for _ in range(2)]
    paths, want = [], {}
    for i, n in enumerate(sizes):
        data = rnd.randbytes(n)
        p = os.path.join(d, f"f{i}.bin")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
        want[p] = hashlib.sha256(data).hexdigest()
    r = subprocess.run([ferry, "hash", "--sha256"] + paths, capture_output=True, text=True)
    check("files: exit 0", r.returncode == 0, r.stderr)
    got = {}
    for line in r.stdout.splitlines():
        digest, _, path = line.partition("  ")
        got[path] = digest
    for p, n in zip(paths, sizes):
        check(f"file of {n} bytes", got.get(p) == want[p], f"ferry {got.get(p)}, hashlib {want[p]}")

    # standard input, written in random pieces: ferry's reads return what the pipe holds
    data = rnd.randbytes(3 * CHUNK + 4097)
    p = subprocess.Popen([ferry, "hash", "--sha256", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)

    def feed():
        off = 0
        while off < len(data):
            n = rnd.choice([1, 3, 63, 65, 127, 4095, 65537, 1 << 20])
            p.stdin.write(data[off:off + n])
            p.stdin.flush()
            off += n
        p.stdin.close()

    t = threading.Thread(target=feed)
    t.start()
    out, err = p.stdout.read(), p.stderr.read()
    t.join()
    p.wait()
    check("stdin: exit 0", p.returncode == 0, err.decode())
    check("stdin in pieces", out.decode() == f"{hashlib.sha256(data).hexdigest()}  -\n", out.decode())

print(f"{len(failures)} failed" if failures else "sha256 vs hashlib: all passed")
sys.exit(1 if failures else 0)
