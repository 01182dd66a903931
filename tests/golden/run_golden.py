#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""run_golden - check the ferry CLI against the golden corpus of gen_golden.py.

    python3 run_golden.py [--generate] FERRY GOLDEN_DIR

--generate first runs tests/data/gen_golden.py GOLDEN_DIR (replacing a previous
corpus there). Then, for each case of GOLDEN_DIR/manifest.json:

  valid:   `ferry inspect --json` exits 0 with nothing on stderr and reports the
           format, path, files, metadata, tensor_count, total_bytes and every
           tensor's name, dtype, shape, nbytes, offset and file exactly (and,
           where the manifest gives them, a strided view's "strides" and its
           "flags"); `ferry inspect` (text) exits 0; `ferry cat FILE NAME` of
           every tensor (or the case's cat_sample) exits 0 and writes the bytes
           whose sha256 the manifest gives; `ferry hash --json` exits 0 with one entry per
           tensor, consistent with the data (equal bytes, equal checksums; empty
           tensors have XXH3's empty-input value) and, where the manifest says
           so, the same model hash as another layout of the same tensors.
  invalid: `ferry inspect --json` and `ferry hash --json` exit with status 1
           exactly (not 0, not 2, not a signal, not a hang), print nothing on
           stdout and exactly one line on stderr, starting "ferry: " and
           containing the path and the expected substring.

Plus usage errors (exit 2) and --help (exit 0). Every command has a 20 s
timeout. Prints one line per failure, then "N passed, N failed"; exits 1 if
anything failed.
"""
import hashlib
import json
import os
import subprocess
import sys

TIMEOUT = 20
XXH3_EMPTY = "2d06800538d394c2"  # XXH3-64 of no bytes, seed 0



def elem_sha(e):
    """sha256 of what cat writes and hash hashes: a strided view's elements in
    row-major order (gathered_sha256), else the tensor's bytes."""
    return e.get("gathered_sha256", e["sha256"])


def elem_nbytes(e):
    return e.get("gathered_nbytes", e["nbytes"])

class Runner:
    def __init__(self, ferry, golden):
        self.ferry = ferry
        self.golden = golden
        self.passed = 0
        self.failed = 0

    def fail(self, what, why):
        self.failed += 1
        print(f"FAIL {what}: {why}", flush=True)

    def ok(self):
        self.passed += 1

    def check(self, cond, what, why):
        if cond:
            self.ok()
        else:
            self.fail(what, why)
        return cond

    def run(self, args, cwd=None):
        """(returncode, stdout, stderr) or None on a timeout."""
        try:
            p = subprocess.run([self.ferry] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=TIMEOUT, cwd=cwd)
        except subprocess.TimeoutExpired:
            return None
        return p.returncode, p.stdout, p.stderr

    def run_checked(self, what, args, want_rc, cwd=None):
        """Run; fail on a timeout, a signal or another exit status. Returns the
        result (or None) and whether the status was right."""
        r = self.run(args, cwd)
        if r is None:
            self.fail(what, f"timed out after {TIMEOUT} s (hang)")
            return None, False
        if r[0] < 0:
            self.fail(what, f"killed by signal {-r[0]}; stderr: {short(r[2])}")
            return r, False
        if r[0] != want_rc:
            self.fail(what, f"exit status {r[0]}, expected {want_rc}; stderr: {short(r[2])}")
            return r, False
        self.ok()
        return r, True

    # ---- valid checkpoints -------------------------------------------------

    def valid_case(self, c, path, hashes):
        what = f"{c['file']} [{c['class']}]"
        r, good = self.run_checked(what + ": inspect --json", ["inspect", "--json", path], 0)
        if not good:
            return
        self.check(r[2] == b"", what, f"inspect --json wrote to stderr: {short(r[2])}")
        try:
            out = json.loads(r[1].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            self.fail(what, f"inspect --json output is not JSON: {e}")
            return
        if c["format"] == "safetensors-index":
            prefix = path[:path.rfind("/") + 1]
            files = [prefix + f for f in c["files"]]
        else:
            files = [path]

        def tfile(t):
            return prefix + t["file"] if c["format"] == "safetensors-index" else path

        for key, want in (("format", c["format"]), ("path", path), ("files", files),
                          ("metadata", c["metadata"]), ("tensor_count", c["tensor_count"]),
                          ("total_bytes", c["total_bytes"])):
            self.check(out.get(key) == want, what, f"{key} is {short(out.get(key))}, expected {short(want)}")
        got = out.get("tensors")
        if not isinstance(got, list) or len(got) != len(c["tensors"]):
            self.fail(what, f"{len(got) if isinstance(got, list) else got!r} tensors listed, "
                            f"expected {len(c['tensors'])}")
            return
        bad = 0
        for i, (g, e) in enumerate(zip(got, c["tensors"])):
            want = {"name": e["name"], "dtype": e["dtype"], "shape": e["shape"], "nbytes": e["nbytes"],
                    "offset": e["offset"], "file": tfile(e)}
            have = {k: g.get(k) for k in want}
            # strided views (pytorch): "strides" only when not row-major, "flags" only when any
            if "strides" in e or "strides" in g:
                want["strides"], have["strides"] = e.get("strides"), g.get("strides")
            if "flags" in e or "flags" in g:
                want["flags"], have["flags"] = e.get("flags") or [], g.get("flags") or []
            if have != want:
                bad += 1
                if bad <= 5:
                    self.fail(what, f"tensor #{i}: got {short(have)}, expected {short(want)}")
        if bad > 5:
            self.fail(what, f"... {bad} tensors differ in all")
        if bad == 0:
            self.ok()

        # text mode
        r, good = self.run_checked(what + ": inspect", ["inspect", path], 0)
        if good:
            self.check(f"tensors:     {c['tensor_count']}\n".encode() in r[1], what + ": inspect",
                       "text output lacks the tensor count line")

        # cat
        by_name = {e["name"]: e for e in c["tensors"]}
        names = c.get("cat_sample") or [e["name"] for e in c["tensors"]]
        for name in names:
            e = by_name[name]
            args = ["cat", "--", path, name] if name.startswith("-") else ["cat", path, name]
            r, good = self.run_checked(f"{what}: cat {name!r}", args, 0)
            if not good:
                continue
            # a strided view (PyTorch) is written as its elements in row-major order
            self.check(hashlib.sha256(r[1]).hexdigest() == elem_sha(e) and r[2] == b"",
                       f"{what}: cat {name!r}",
                       f"wrote {len(r[1])} bytes (sha256 {hashlib.sha256(r[1]).hexdigest()[:16]}...), "
                       f"expected {elem_nbytes(e)} (sha256 {elem_sha(e)[:16]}...); stderr: {short(r[2])}")

        # hash
        r, good = self.run_checked(what + ": hash --json", ["hash", "--json", path], 0)
        if not good:
            return
        try:
            h = json.loads(r[1].decode("utf-8"))
            ts = h["tensors"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as ex:
            self.fail(what + ": hash --json", f"output is not the documented JSON: {ex}")
            return
        if not self.check(len(ts) == len(c["tensors"]), what + ": hash --json",
                          f"{len(ts)} entries, expected {len(c['tensors'])}"):
            return
        self.check([t.get("name") for t in ts] == [e["name"] for e in c["tensors"]] and
                   [t.get("nbytes") for t in ts] == [elem_nbytes(e) for e in c["tensors"]],
                   what + ": hash --json", "names/nbytes differ from the tensors (in file order)")
        self.check(h.get("total_bytes") == sum(elem_nbytes(e) for e in c["tensors"]) and
                   h.get("algorithm") == "xxh3-64",
                   what + ": hash --json", f"total_bytes {h.get('total_bytes')} / algorithm {h.get('algorithm')}")
        sha_to_x, x_to_sha, incons = {}, {}, []
        for t, e in zip(ts, c["tensors"]):
            x = t.get("xxh3")
            if not (isinstance(x, str) and len(x) == 16 and all(ch in "0123456789abcdef" for ch in x)):
                incons.append(f"{e['name']!r}: xxh3 {x!r} is not 16 hex digits")
                continue
            if elem_nbytes(e) == 0 and x != XXH3_EMPTY:
                incons.append(f"{e['name']!r}: empty tensor hashes to {x}, not {XXH3_EMPTY}")
            if sha_to_x.setdefault(elem_sha(e), x) != x:
                incons.append(f"{e['name']!r}: same bytes as another tensor, different xxh3")
            if x_to_sha.setdefault(x, elem_sha(e)) != elem_sha(e):
                incons.append(f"{e['name']!r}: different bytes from another tensor, same xxh3 {x}")
        self.check(not incons, what + ": hash --json", "; ".join(incons[:5]))
        hashes[c["file"]] = h.get("model")
        if c["file"] == "many.safetensors":
            r, good = self.run_checked(what + ": hash --threads 1", ["hash", "--json", "--threads", "1", path], 0)
            if good:
                try:
                    m1 = json.loads(r[1])["model"]
                except (ValueError, KeyError, TypeError):
                    m1 = None
                self.check(m1 == h.get("model"), what, f"model hash {m1} with 1 thread, {h.get('model')} with many")

    # ---- invalid checkpoints ---------------------------------------------

    def invalid_case(self, c, path):
        what = f"{c['file']} [{c['class']}]"
        mpath = os.path.join(self.golden, c["msg_path"]) if "msg_path" in c else path
        first = None
        for cmd in (["inspect", "--json"], ["hash", "--json"]):
            if cmd[0] not in c.get("commands", ("inspect", "hash")):
                continue
            w = f"{what}: {cmd[0]}"
            r, good = self.run_checked(w, cmd + [path], c["exit"])
            if r is None:
                return  # a hang: do not wait again
            if not good:
                continue
            rc, out, err = r
            problems = []
            if out:
                problems.append(f"wrote {len(out)} bytes to stdout")
            if err.count(b"\n") != 1 or not err.endswith(b"\n"):
                problems.append(f"stderr is not exactly one line: {short(err)}")
            if not err.startswith(b"ferry: "):
                problems.append(f"stderr does not start with 'ferry: ': {short(err)}")
            if os.fsencode(mpath) not in err:
                problems.append(f"message lacks the path {mpath!r}: {short(err)}")
            if os.fsencode(c["expect"]) not in err:
                problems.append(f"message lacks {c['expect']!r}: {short(err)}")
            if first is not None and err != first:
                problems.append(f"message differs from inspect's: {short(err)}")
            first = err if first is None else first
            self.check(not problems, w, "; ".join(problems))

    # ---- usage -------------------------------------------------------------

    def usage(self, any_file):
        for args in ([], ["inspect"], ["inspect", "--bogus", "x"], ["inspect", "a", "b"], ["cat", "onlyone"],
                     ["cat"], ["cat", "--bogus", "a", "b"], ["cat", "a", "b", "c"], ["hash"],
                     ["hash", "--threads", "0", "x"], ["hash", "--threads"], ["hash", "--bogus", "x"],
                     ["nosuchcommand"], ["help", "nosuchcommand"]):
            r, good = self.run_checked(f"usage error: ferry {' '.join(args)}", args, 2)
            if good:
                self.check(r[2].strip() != b"" and r[1] == b"", f"usage error: ferry {' '.join(args)}",
                           "no message on stderr, or output on stdout")
        for args in (["--help"], ["-h"], ["help"], ["--version"], ["inspect", "--help"], ["cat", "--help"],
                     ["hash", "--help"], ["inspect", "-h"], ["help", "inspect"], ["help", "cat"], ["help", "hash"]):
            r, good = self.run_checked(f"help: ferry {' '.join(args)}", args, 0)
            if good:
                self.check(r[1].strip() != b"", f"help: ferry {' '.join(args)}", "nothing on stdout")
        # An empty path: a failure, not a usage error.
        r, good = self.run_checked("inspect ''", ["inspect", ""], 1)
        if good:
            self.check(r[2].startswith(b"ferry: ") and r[2].count(b"\n") == 1, "inspect ''", f"stderr: {short(r[2])}")
        # Device specs that name no device, and a device with a route it
        # cannot take, are usage errors like a bad --route, whatever the PATH; no
        # load starts. Several PATHs: all must open before the first is loaded.
        for args in (["load", "--device", "gpu", any_file], ["load", "--device", "sim:banana", any_file],
                     ["load", "--device", "cpu", "--route", "direct", any_file],
                     ["load", "--device", "cpu", "--route", "register", any_file],
                     ["load", "--device", "cpu", "--route", "cufile", "/no/such/file"], ["load", "--route", "cufile", any_file],
                     ["load", "--device", "sim:banana", "/no/such/file"],
                     ["load", "--route", "foo", any_file], ["bench", "--device", "gpu", any_file]):
            w = f"usage error: ferry {' '.join(args)}"
            r, good = self.run_checked(w, args, 2)
            if good:
                self.check(r[1] == b"" and r[2].startswith(b"ferry ") and b"--help" in r[2] and
                           r[2].count(b"\n") == 1, w, f"stdout {short(r[1])}, stderr {short(r[2])}")
        missing = os.path.join(self.golden, "no-such-checkpoint.safetensors")
        for paths in ([any_file, missing], [any_file, any_file, missing]):
            w = f"load: PATH {len(paths)} is missing"
            r, good = self.run_checked(w, ["load", "--device", "sim:1GiB", *paths], 1)
            if good:
                self.check(r[1] == b"" and os.fsencode(missing) in r[2] and r[2].count(b"\n") == 1, w,
                           f"something was loaded, or the message lacks the path: stdout {short(r[1])}, "
                           f"stderr {short(r[2])}")
        r, good = self.run_checked("load: two PATHs", ["load", "--device", "sim:1GiB", any_file, any_file], 0)
        if good:
            self.check(r[1].count(os.fsencode(any_file)) == 2, "load: two PATHs", f"stdout {short(r[1])}")
        # A valid file but no such tensor: a failure, not a usage error.
        r, good = self.run_checked("cat: no such tensor", ["cat", any_file, "no.such.tensor"], 1)
        if good:
            self.check(r[2].startswith(b"ferry: ") and b"no tensor named" in r[2] and r[2].count(b"\n") == 1,
                       "cat: no such tensor", f"stderr: {short(r[2])}")

    def main(self):
        with open(os.path.join(self.golden, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        hashes = {}
        cases = manifest["cases"]
        for c in cases:
            path = os.path.join(self.golden, c["file"])
            if c["valid"]:
                self.valid_case(c, path, hashes)
            else:
                self.invalid_case(c, path)
        for c in cases:
            other = c.get("same_model_as")
            if other and c["file"] in hashes and other in hashes:
                self.check(hashes[c["file"]] == hashes[other], f"{c['file']}: model hash",
                           f"{hashes[c['file']]} differs from {other}'s {hashes[other]}")
        # An index opened by a bare file name (no folder in the path).
        for c in cases:
            if c["valid"] and c["format"] == "safetensors-index":
                folder, base = os.path.split(os.path.join(self.golden, c["file"]))
                what = f"{c['file']} opened as {base!r} from its folder"
                r, good = self.run_checked(what, ["inspect", "--json", base], 0, cwd=folder)
                if good:
                    try:
                        out = json.loads(r[1])
                    except ValueError:
                        out = {}
                    self.check(out.get("files") == c["files"] and out.get("tensor_count") == c["tensor_count"],
                               what, f"files {short(out.get('files'))}, tensor_count {out.get('tensor_count')}")
                break
        first_valid = next(c for c in cases if c["valid"] and c["tensors"])
        self.usage(os.path.join(self.golden, first_valid["file"]))
        nv = sum(c["valid"] for c in cases)
        print(f"{len(cases)} cases ({nv} valid, {len(cases) - nv} invalid)")
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def short(x, n=300):
    if isinstance(x, bytes):
        x = x.decode("utf-8", "backslashreplace")
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[:n] + "..."


def main(argv):
    args = argv[1:]
    generate = False
    if args and args[0] == "--generate":
        generate = True
        args = args[1:]
    if len(args) != 2:
        print("usage: run_golden.py [--generate] FERRY GOLDEN_DIR", file=sys.stderr)
        return 2
    ferry, golden = args
    if generate:
        gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gen_golden.py")
        rc = subprocess.call([sys.executable, gen, golden])
        if rc != 0:
            print(f"gen_golden.py failed with status {rc}", file=sys.stderr)
            print("0 passed, 1 failed")
            return 1
    return Runner(os.path.abspath(ferry), golden).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
