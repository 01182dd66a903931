#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ctest python_wheel: build the binding's wheel around a built libferry.so,
install it into a fresh venv (offline: --no-index --no-deps, the system's
setuptools and wheel, --system-site-packages) and, with FERRY_LIBRARY unset
and outside the source tree, import ferry and read a small safetensors file
through the bundled library. Also checks the wheel's tag against the glibc
symbol versions objdump finds in the library (where objdump exists).

    test_wheel.py LIBFERRY_SO
Exit 0 passed, 1 failed, 77 skipped (no venv module or no setuptools/wheel).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def main():
    lib = os.path.abspath(sys.argv[1])
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
        import venv  # noqa: F401
    except ImportError as e:
        print(f"python_wheel: {e}: skipped")
        return 77
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-") as tmp:
        # a copy of python/ beside the CMakeLists.txt it takes the version from,
        # so the build leaves nothing in the source tree
        src = os.path.join(tmp, "src")
        shutil.copytree(os.path.join(ROOT, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
        shutil.copy(os.path.join(ROOT, "CMakeLists.txt"), src)
        env = dict(os.environ, FERRY_LIBRARY=lib, PYTHONDONTWRITEBYTECODE="1")
        env.pop("FERRY_WHEEL_PLAT", None)
        dist = os.path.join(tmp, "dist")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", dist, os.path.join(src, "python")], check=True, env=env)
        wheels = os.listdir(dist)
        assert len(wheels) == 1, wheels
        whl = os.path.join(dist, wheels[0])
        m = re.fullmatch(r"ferry-([0-9.]+)-py3-none-(manylinux_(\d+)_(\d+)_\w+|linux_\w+)\.whl", wheels[0])
        assert m, wheels[0]
        with zipfile.ZipFile(whl) as z:
            names = z.namelist()
            assert "ferry/libferry.so" in names, names
            assert "ferry/_lib.py" in names
            pkg = os.path.join(ROOT, "python")
            for d, _, files in os.walk(os.path.join(pkg, "ferry")):  # every module, subpackages too
                for f in files:
                    if f.endswith(".py"):
                        rel = os.path.relpath(os.path.join(d, f), pkg).replace(os.sep, "/")
                        assert rel in names, (rel, names)
        objdump = shutil.which("objdump")
        if objdump:
            out = subprocess.run([objdump, "-T", lib], capture_output=True, text=True, check=True).stdout
            vers = {tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([0-9]+\.[0-9]+)", out)}
            want = max(vers)
            assert m.group(3) and (int(m.group(3)), int(m.group(4))) == want, (wheels[0], want)
        venv_dir = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv_dir],
                       check=True)
        py = os.path.join(venv_dir, "bin", "python")
        # this interpreter's pip installs into the venv (same Python, so the
        # same site-packages layout under its prefix)
        env = {k: v for k, v in os.environ.items() if k not in ("FERRY_LIBRARY", "PYTHONPATH")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "--prefix", venv_dir, whl], check=True, env=env)
        st = os.path.join(tmp, "small.safetensors")
        hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
        hdr += b" " * (-len(hdr) % 8)
        with open(st, "wb") as f:
            f.write(struct.pack("<Q", len(hdr)) + hdr + struct.pack("<4f", 1, 2, 3, 4))
        probe = ("import ferry, os, struct, sys\n"
                 "p = ferry.library_path\n"
                 "assert os.path.dirname(p) == os.path.dirname(ferry.__file__), p\n"
                 "assert p.startswith(sys.prefix), (p, sys.prefix)\n"
                 f"assert ferry.__version__ == {m.group(1)!r}, ferry.__version__\n"
                 "with ferry.File(sys.argv[1]) as f:\n"
                 "    assert f.keys() == ['w'], f.keys()\n"
                 "    assert struct.unpack('<4f', bytes(f.read('w'))) == (1, 2, 3, 4)\n"
                 "print('python_wheel: imported', ferry.__version__, 'from', p)\n")
        subprocess.run([py, "-c", probe, st], check=True, env=env, cwd=tmp)
    print("python_wheel: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
