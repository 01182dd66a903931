#!/usr/bin/env python3
"""How large are the page-cache folios holding FILE? (root: reads /proc/kpageflags)

    bench/archive/folio_sizes.py FILE [--sample N]

Maps FILE read-only, faults it in with MADV_POPULATE_READ (this marks the pages
accessed: run it after the measurement it explains), reads each sampled page's
frame from /proc/self/pagemap and its flags from /proc/kpageflags, and prints
how many of the sampled pages sit in folios of one page, and how many in larger
(compound) folios. bench/RESULTS.md uses it to show why a file read into the
page cache by several interleaved threads costs twice as much to read again
the first time as one read in by `cat`."""
import argparse
import ctypes
import os
import struct
import sys

KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL = 1 << 15, 1 << 16
PG = os.sysconf("SC_PAGESIZE")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--sample", type=int, default=64, help="look at every Nth page (default 64)")
    a = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fd = os.open(a.file, os.O_RDONLY)
    size = os.fstat(fd).st_size
    base = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    if base in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"{a.file}: mmap failed: {os.strerror(ctypes.get_errno())}")
    if libc.madvise(base, size, 22) != 0:  # MADV_POPULATE_READ
        sys.exit(f"{a.file}: MADV_POPULATE_READ failed: {os.strerror(ctypes.get_errno())}")
    pm = os.open("/proc/self/pagemap", os.O_RDONLY)
    kf = os.open("/proc/kpageflags", os.O_RDONLY)
    single = compound = unknown = 0
    for i in range(0, size // PG, a.sample):
        (ent,) = struct.unpack("<Q", os.pread(pm, 8, (base // PG + i) * 8))
        pfn = ent & ((1 << 55) - 1)
        if not (ent >> 63) or pfn == 0:
            unknown += 1
            continue
        (fl,) = struct.unpack("<Q", os.pread(kf, 8, pfn * 8))
        if fl & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL):
            compound += 1
        else:
            single += 1
    n = single + compound
    print(f"{a.file}: {n} pages sampled: {single} in single-page folios, {compound} in larger folios "
          f"({100.0 * compound / max(n, 1):.1f} %); {unknown} without a frame (not root?)")


if __name__ == "__main__":
    main()
