#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make_pt_corpus.py - writes the seed corpora of fuzz_zip and fuzz_pickle
(standard library only).

    python3 tests/fuzz/make_pt_corpus.py [OUTDIR]     (default: tests/fuzz/corpus)

OUTDIR/zip/pw-*     whole PyTorch zip checkpoints: the PyTorch cases of the
                    golden corpus (tests/data/golden_pt.py, built by hand with
                    ptwriter.py: valid ones and one per class of damage), those
                    under 16 KiB;
OUTDIR/pickle/pw-*  the data.pkl of every one of them that Python's zipfile can
                    open (valid trees, hostile opcodes, refused globals).

Files written by real torch (torch113-*: torch 1.13 from Debian, written by
`tests/py/test_pytorch_crosscheck.py --seeds DIR`) are left alone; pw-* files
are replaced. The output is deterministic.
"""
import glob
import os
import sys
import tempfile
import zipfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "data"))
import gen_golden  # noqa: E402
import golden_pt  # noqa: E402

MAX = 16 * 1024


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(here, "corpus")
    zdir, pdir = os.path.join(out, "zip"), os.path.join(out, "pickle")
    for d in (zdir, pdir):
        os.makedirs(d, exist_ok=True)
        for f in glob.glob(os.path.join(d, "pw-*")):
            os.remove(f)
    nz = npk = 0
    with tempfile.TemporaryDirectory() as tmp:
        g = gen_golden.Gen(tmp)
        golden_pt.gen(g)
        for c in g.cases:
            if not c["file"].endswith((".pt", ".ckpt")):
                continue
            path = os.path.join(tmp, c["file"])
            with open(path, "rb") as f:
                blob = f.read()
            if len(blob) > MAX:
                continue
            base = "pw-" + c["file"].replace("/", "-")
            with open(os.path.join(zdir, base), "wb") as f:
                f.write(blob)
            nz += 1
            try:
                with zipfile.ZipFile(path) as z:
                    names = [n for n in z.namelist() if n.endswith("/data.pkl")]
                    pkl = z.read(names[0]) if names else None
            except Exception:  # a damaged archive: only a zip seed
                pkl = None
            if pkl is not None:
                with open(os.path.join(pdir, base[:-3] + ".pkl"), "wb") as f:
                    f.write(pkl)
                npk += 1
    print(f"make_pt_corpus: {nz} zip seeds, {npk} pickle seeds in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
