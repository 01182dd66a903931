#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""header_mem.py - a hostile header: what opening a
safetensors file whose header is nothing but zero-size tensors costs.

    bench/header_mem.py FERRY OUT.safetensors [N]

Writes OUT.safetensors with N (default 1,500,000) tensors of shape [0] (about
60 bytes of header each: 1.5 M make a ~90 MB header, inside safetensors'
100 MB cap, and no data section), then runs, each in a fresh process under
/usr/bin/time -v: `FERRY inspect OUT` and `FERRY inspect --json OUT` (their
output to /dev/null), and the reference package's
`safetensors.safe_open(OUT, "numpy").keys()` when Python has it. Prints wall
time and peak RSS of each."""
import os
import re
import subprocess
import sys


def write(path, n):
    parts = ['{"__metadata__":{"format":"pt"}']
    for i in range(n):
        parts.append(',"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i)
    parts.append("}")
    hdr = "".join(parts).encode()
    with open(path, "wb") as f:
        f.write(len(hdr).to_bytes(8, "little"))
        f.write(hdr)
    return len(hdr)


def timed(argv):
    r = subprocess.run(["/usr/bin/time", "-v"] + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", r.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    secs = float(wall.group(2)) * 60 + float(wall.group(3)) + (float(wall.group(1) or 0) * 3600)
    tail = r.stderr.strip().splitlines()[0] if r.returncode else ""
    return r.returncode, secs, int(rss.group(1)) / 1024, tail


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ferry, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1_500_000
    hlen = write(out, n)
    print(f"{out}: {n} zero-size tensors, header {hlen} bytes ({hlen / 1e6:.1f} MB)")
    runs = [("ferry inspect", [ferry, "inspect", out]), ("ferry inspect --json", [ferry, "inspect", "--json", out])]
    try:
        import safetensors  # noqa: F401

        runs.append(("safetensors " + safetensors.__version__,
                     [sys.executable, "-c",
                      "import sys, safetensors\n"
                      "with safetensors.safe_open(sys.argv[1], 'numpy') as f: print(len(f.keys()))", out]))
    except ImportError:
        print("the reference package safetensors is not installed: its figure is left out")
    for name, argv in runs:
        rc, secs, mib, err = timed(argv)
        status = "ok" if rc == 0 else f"exit {rc}: {err}"
        print(f"{name:28s} {secs:7.2f} s  peak RSS {mib:8.1f} MiB  ({mib / (hlen / 2**20):.1f} x the header)  {status}")
    os.unlink(out)


if __name__ == "__main__":
    main()
