#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run every command and snippet of README.md (and of the docs it leads to) as
a new user would, and fail naming the file and line of each block that fails.

    run_readme.py SOURCE BUILD [--readme FILE]... [--keep]

Several --readme files run in the order given, in one scratch tree, so a
block sees what an earlier file's blocks made (README.md's .venv, say).

Every fenced block is either run or marked with a comment on the line before
its fence, and every mark says why:

  <!-- readme-test: skip REASON -->      not run; listed with REASON
  <!-- readme-test: in-tree REASON -->   sh run in SOURCE itself, only when BUILD
                                         is SOURCE/build (else skipped, saying so)
  <!-- readme-test: file PATH -->        json that must equal the JSON of PATH
  <!-- readme-test: c-uses DECLS -->     c compiled with DECLS (names an earlier
                                         block set) declared before it

Unmarked `sh` blocks run with bash -eu (every command must succeed) and unmarked `python` blocks
with the scratch tree's .venv/bin/python (which a README block makes) or else
this interpreter, each in one scratch copy of the source tree (git's tracked
and untracked files) whose build/ is a link to BUILD, in README order, so one
block sees the files an earlier one wrote. Before the first block the scratch
tree gets what scripts/demo.sh leaves behind (the sample checkpoint), since the
demo itself is not re-run (it installs packages and rebuilds everything).
`c` blocks are compiled and linked against BUILD's libferry.so, each in its own
function: not run, as they open model.safetensors on cuda:0. A block of any
other language, or none, must carry a mark.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MARK = re.compile(r"^<!--\s*readme-test:\s*(skip|in-tree|file|c-uses)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def blocks(readme):
    """(line of the opening fence, language, text, mark, mark argument) per block."""
    out = []
    lines = open(readme, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"{readme}:{start + 1}: a ``` block that is never closed")
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mk = MARK.match(lines[prev].strip()) if prev >= 0 else None
        if prev >= 0 and "readme-test" in lines[prev] and not mk:
            sys.exit(f"{readme}:{prev + 1}: a readme-test mark this script does not know: {lines[prev].strip()}")
        out.append((start + 1, lang, "\n".join(body) + "\n", mk.group(1) if mk else None, mk.group(2) if mk else ""))
        i += 1
    return out


def scratch_copy(src, dst):
    """SOURCE's tracked and untracked (not ignored) files, as a fresh clone has them."""
    try:
        names = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               check=True, capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        names = None
    if names is None:  # not a git checkout: everything but build folders and .deps
        shutil.copytree(src, dst, symlinks=True,
                        ignore=lambda d, ns: [n for n in ns if n.startswith("build") or n in (".deps", ".git")])
        return
    for n in names:
        if not n or not os.path.lexists(os.path.join(src, n)):
            continue  # deleted in the work tree but not yet in git's index
        os.makedirs(os.path.dirname(os.path.join(dst, n)), exist_ok=True)
        s = os.path.join(src, n)
        if os.path.islink(s):
            os.symlink(os.readlink(s), os.path.join(dst, n))
        elif os.path.isfile(s):
            shutil.copy2(s, os.path.join(dst, n))


def run(cmd, cwd, log, timeout=300):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") + f"\n(timed out after {timeout} s)"
    log.write(out)
    return rc, out, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("build")
    ap.add_argument("--readme", action="append", help="default SOURCE/README.md; several run in order")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree and say where it is")
    a = ap.parse_args()
    src, build = os.path.realpath(a.source), os.path.realpath(a.build)
    readmes = [r if os.path.isabs(r) else os.path.join(src, r) for r in (a.readme or ["README.md"])]
    for need in ("ferry", "libferry.so"):
        if not os.path.isfile(os.path.join(build, need)):
            sys.exit(f"run_readme: {build}/{need} is missing: build the tree first")
    todo = []
    for readme in readmes:
        rel = os.path.relpath(readme, src) if readme.startswith(src + os.sep) else readme
        todo += [(rel,) + b for b in blocks(readme)]
    work = tempfile.mkdtemp(prefix="ferry-readme-")
    tree = os.path.join(work, "tree")
    scratch_copy(src, tree)
    os.symlink(build, os.path.join(tree, "build"))
    logf = open(os.path.join(work, "log.txt"), "w", encoding="utf-8")
    # what scripts/demo.sh leaves behind besides the build: its sample checkpoint
    os.makedirs(os.path.join(tree, "sample"), exist_ok=True)
    rc, out, _ = run([sys.executable, "scripts/make_sample.py", "sample/dit-sample.safetensors"], tree, logf)
    if rc:
        sys.exit(f"run_readme: scripts/make_sample.py failed (the sample scripts/demo.sh writes):\n{out}")
    ran, skipped, failed = [], [], []
    cblocks = []
    for rel, line, lang, text, mark, arg in todo:
        where = f"{rel}:{line}"
        if mark == "skip":
            skipped.append((where, lang or "-", arg or "(no reason given)"))
            continue
        if mark == "file":
            want = os.path.join(src, arg)
            try:
                same = json.loads(text) == json.load(open(want, encoding="utf-8"))
            except (OSError, ValueError) as e:
                failed.append((where, f"json block against {arg}: {e}", text, ""))
                continue
            if not same:
                failed.append((where, f"this json block is not {arg} (the file the README says it shows)", text, ""))
            else:
                ran.append((where, f"json, equal to {arg}", 0.0))
            continue
        if lang == "c":
            cblocks.append((where, text, arg if mark == "c-uses" else ""))
            continue
        if lang not in ("sh", "python"):
            failed.append((where, f"a ```{lang} block with no readme-test mark: run it, or mark it skip and say why", text, ""))
            continue
        if mark not in (None, "in-tree"):
            failed.append((where, f"readme-test: {mark} does not apply to a {lang} block", text, ""))
            continue
        cwd = tree
        if mark == "in-tree":
            if os.path.realpath(os.path.join(src, "build")) != build:
                skipped.append((where, lang, f"in-tree, and the build under test is not {src}/build"))
                continue
            cwd = src
        f = os.path.join(work, f"block-{line}.{'sh' if lang == 'sh' else 'py'}")
        with open(f, "w", encoding="utf-8") as fh:
            fh.write(text)
        if lang == "sh":
            cmd = ["bash", "-eu", f]  # no pipefail: a reader's shell has none (`ferry ... | head`)
        else:
            venv = os.path.join(tree, ".venv", "bin", "python")
            cmd = [venv if os.path.exists(venv) else sys.executable, f]
        logf.write(f"\n===== {where} ({lang}, in {cwd}): {' '.join(cmd)}\n")
        rc, out, secs = run(cmd, cwd, logf)
        if rc:
            failed.append((where, f"{lang} block exited {rc}", text, out))
        else:
            ran.append((where, lang + (" (in the source tree)" if mark == "in-tree" else ""), secs))
    if cblocks:
        # each block its own function: the blocks declare the same names (st) for
        # different things; names one takes from an earlier block come from its mark
        cc = os.environ.get("CC", "cc")
        unit = ["#include <inttypes.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <ferry.h>", ""]
        for k, (where, text, uses) in enumerate(cblocks):
            decls = [d.strip() for d in uses.split(";") if d.strip()]
            unit.append(f"/* {where} */\nvoid readme_block_{k}(void);\nvoid readme_block_{k}(void)\n{{")
            unit += [f"    {d} = 0;" for d in decls]
            unit += ['#line %s "%s"' % (int(where.rsplit(":", 1)[1]) + 1, where.rsplit(":", 1)[0])] + [text, "}"]
        unit.append("int main(void) { return 0; }")
        cfile = os.path.join(work, "blocks.c")
        with open(cfile, "w", encoding="utf-8") as fh:
            fh.write("\n".join(unit) + "\n")
        cmd = [cc, "-std=c11", "-Wall", "-Werror=implicit-function-declaration", "-Werror=incompatible-pointer-types",
               "-Werror=int-conversion", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
               "-I", os.path.join(src, "include"), "-I", os.path.join(build, "include"), cfile,
               "-L", build, "-lferry", "-o", os.path.join(work, "blocks")]
        logf.write(f"\n===== c blocks: {' '.join(cmd)}\n")
        rc, out, secs = run(cmd, work, logf)
        names = ", ".join(w for w, _, _ in cblocks)
        if rc:
            errs = re.findall(r"^([^\s:]+\.md):(\d+):\d+: error", out, re.M)
            failed.append((f"{errs[0][0]}:{errs[0][1]}" if errs else cblocks[0][0],
                           f"the c blocks ({names}) do not compile and link", "", out))
        else:
            ran.append((names, "c, compiled and linked against libferry.so (not run: they open "
                        "model.safetensors on cuda:0)", secs))
    logf.close()
    for where, what, secs in ran:
        print(f"ran      {where}: {what} ({secs:.1f} s)")
    for where, lang, why in skipped:
        print(f"skipped  {where} ({lang}): {why}")
    for where, why, text, out in failed:
        print(f"\nFAILED   {where}: {why}")
        if text:
            print("  block:\n" + "".join("    " + ln + "\n" for ln in text.rstrip("\n").split("\n")))
        if out:
            print("  output (last 40 lines):\n" + "".join("    " + ln + "\n" for ln in out.rstrip("\n").split("\n")[-40:]))
    label = todo[0][0] if len(readmes) == 1 and todo else f"{len(readmes)} files"
    print(f"\n{label}: {len(ran)} run, {len(skipped)} skipped, {len(failed)} failed")
    if a.keep or failed:
        print(f"scratch tree and full log: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
