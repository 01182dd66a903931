# SPDX-License-Identifier: Apache-2.0
"""Build hook of the ferry binding: bundle libferry.so and tag the wheel for it.

setuptools reads the project's metadata from pyproject.toml; this file adds:

- the version, read from project(ferry VERSION x.y.z) in ../CMakeLists.txt
  (the one place it is set; an sdist carries it in PKG-INFO; a copy of python/
  alone takes the bundled library's ferry_version_string);
- one step to build_py: copy the shared library into the built package as
  ferry/libferry.so (with the repository's LICENSE and THIRD_PARTY_NOTICES
  beside it, where this is a checkout). Which library, in this order:
    $FERRY_LIBRARY          a prebuilt one (the file, or a folder holding libferry.so);
    ../build/libferry.so    the repository's default build folder, if built
                            (unless FERRY_CMAKE=1);
    a CMake build           of the source tree next to this folder, into
                            $FERRY_CMAKE_BUILD_DIR (default python/build/cmake),
                            target ferry_shared only, with $FERRY_CMAKE_ARGS added
                            (e.g. -DFERRY_JANSSON_SOURCE=...).
  A library whose ferry_version_string is not the package's version is refused
  (a stale build folder would otherwise ship under the wrong version);
- the wheel's tag. The package holds no extension module, only a library that
  ctypes opens, so the tag names no interpreter: py3-none-PLATFORM. PLATFORM
  is manylinux_X_Y_ARCH (PEP 600) when the library needs only the glibc
  libraries manylinux allows, X.Y being the newest GLIBC_ symbol version it
  needs (read from its ELF .gnu.version_r here, no tool needed); otherwise,
  or for a library not for this machine's architecture, linux_ARCH, which
  installs only where it was built. $FERRY_WHEEL_PLAT overrides it.
"""
import ctypes
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))


def _cmake_text():
    cmake = os.path.join(ROOT, "CMakeLists.txt")
    if not os.path.isfile(cmake):
        return None
    with open(cmake, encoding="utf-8") as f:
        text = f.read()
    # the library's, not some other project's that python/ was copied into
    return text if re.search(r"^\s*project\(\s*ferry\b", text, re.M) else None


def project_version():
    text = _cmake_text()
    if text is not None:
        m = re.search(r"^\s*project\(\s*ferry\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text, re.M)
        if not m:
            raise SystemExit(f"ferry: no project(ferry VERSION x.y.z) in {os.path.join(ROOT, 'CMakeLists.txt')}")
        return m.group(1)
    pkg_info = os.path.join(HERE, "PKG-INFO")  # building from an sdist
    if os.path.isfile(pkg_info):
        with open(pkg_info, encoding="utf-8") as f:
            m = re.search(r"^Version:\s*(\S+)", f.read(), re.M)
        if m:
            return m.group(1)
    # a copy of python/ alone: the version of the library it bundles
    return library_version(find_library())


def library_version(path):
    lib = ctypes.CDLL(os.path.realpath(path))
    lib.ferry_version_string.restype = ctypes.c_char_p
    return lib.ferry_version_string().decode()


def cmake_build():
    """Build libferry.so from the source tree with CMake; returns its path."""
    if _cmake_text() is None:
        raise SystemExit(f"ferry: no libferry.so to bundle: set FERRY_LIBRARY to a built one "
                         f"(no ferry source tree at {ROOT} to build it from)")
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("ferry: no libferry.so to bundle and no cmake on PATH to build one: "
                         "build the library (cmake -S . -B build && cmake --build build) "
                         "or set FERRY_LIBRARY")
    bdir = os.path.abspath(os.environ.get("FERRY_CMAKE_BUILD_DIR") or os.path.join(HERE, "build", "cmake"))
    cfg = [cmake, "-S", ROOT, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release",
           "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_BENCH=OFF"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(bdir, "CMakeCache.txt")):
        cfg += ["-G", "Ninja"]  # a configured folder keeps its generator
    cfg += shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
    print("ferry: " + " ".join(shlex.quote(a) for a in cfg), flush=True)
    subprocess.check_call(cfg)
    jobs = os.environ.get("FERRY_CMAKE_JOBS") or str(os.cpu_count() or 1)
    subprocess.check_call([cmake, "--build", bdir, "--target", "ferry_shared", "-j", jobs])
    return os.path.join(bdir, "libferry.so")


def find_library():
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        p = os.path.join(env, "libferry.so") if os.path.isdir(env) else env
        if not os.path.isfile(p):
            raise SystemExit(f"ferry: FERRY_LIBRARY={env}: no library there")
        return p
    p = os.path.join(ROOT, "build", "libferry.so")
    if os.path.isfile(p) and os.environ.get("FERRY_CMAKE", "") in ("", "0"):
        return p
    return cmake_build()


# ---- the wheel's platform tag, from the library's ELF dynamic section -------

# What PEP 600 lets a manylinux wheel's libraries need from the system
# (auditwheel's policy, less the X11/GL and C++ ones a C library has no use for).
MANYLINUX_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                  "libgcc_s.so.1", "libutil.so.1", "libresolv.so.2", "libnsl.so.1", "libcrypt.so.1",
                  "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
SHT_DYNAMIC, SHT_GNU_VERNEED, DT_NEEDED = 6, 0x6FFFFFFE, 1


def elf_needs(path):
    """(architecture, [NEEDED sonames], {soname: [symbol versions]}) of a
    64-bit ELF shared object: what decides its manylinux tag."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not a 64-bit ELF file")
    e = "<" if data[5] == 1 else ">"
    machine = struct.unpack_from(e + "H", data, 18)[0]
    shoff = struct.unpack_from(e + "Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from(e + "HH", data, 0x3A)
    secs = [struct.unpack_from(e + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(sec, off):
        start = secs[sec][4] + off
        return data[start:data.index(b"\0", start)].decode()

    needed, versions = [], {}
    for _name, typ, _fl, _addr, off, size, link, info, _al, entsize in secs:
        if typ == SHT_DYNAMIC:
            for k in range(size // (entsize or 16)):
                tag, val = struct.unpack_from(e + "qQ", data, off + k * (entsize or 16))
                if tag == DT_NEEDED:
                    needed.append(string(link, val))
        elif typ == SHT_GNU_VERNEED:
            vn = off
            for _ in range(info):
                _ver, cnt, file_, aux, nxt = struct.unpack_from(e + "HHIII", data, vn)
                names = versions.setdefault(string(link, file_), [])
                va = vn + aux
                for _ in range(cnt):
                    _hash, _flags, _other, name, vnext = struct.unpack_from(e + "IHHII", data, va)
                    names.append(string(link, name))
                    va += vnext
                if not nxt:
                    break
                vn += nxt
    return ELF_MACHINES.get(machine, f"machine{machine}"), needed, versions


def platform_tag(path):
    """The wheel platform a bundled library honestly allows, and why."""
    arch, needed, versions = elf_needs(path)
    here = platform.machine()
    if arch != here:
        raise SystemExit(f"ferry: {path} is built for {arch}, this machine is {here}: "
                         "the build could not check that it loads")
    others = sorted(set(needed) - MANYLINUX_LIBS)
    if others:
        return f"linux_{arch}", f"needs {', '.join(others)}, which manylinux does not allow"
    glibc = []
    for names in versions.values():
        for v in names:
            m = re.fullmatch(r"GLIBC_([0-9]+)\.([0-9]+)(?:\.[0-9]+)?", v)
            if m:
                glibc.append((int(m.group(1)), int(m.group(2))))
            elif v.startswith("GLIBC_"):  # GLIBC_PRIVATE: no glibc promises it
                return f"linux_{arch}", f"needs {v}"
    major, minor = max(glibc) if glibc else (2, 17)  # manylinux2014's floor
    return f"manylinux_{major}_{minor}_{arch}", f"newest symbol version needed: GLIBC_{major}.{minor}"


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    from setuptools import Distribution, setup
    from setuptools.command.build_py import build_py

    class BinaryDistribution(Distribution):
        # a platform package: its files go to the wheel's root (platlib), not
        # to .data/purelib, though it has no extension module to build
        def has_ext_modules(self):
            return True

    class BuildPyWithLibrary(build_py):
        def run(self):
            super().run()
            src = os.path.realpath(find_library())  # the real file, not the soname links
            want = self.distribution.get_version()
            try:
                have = library_version(src)
            except OSError as e:  # cannot load here (another libc): the tag check still reads it
                print(f"ferry: could not load {src} to check its version: {e}", file=sys.stderr)
            else:
                if have != want:
                    raise SystemExit(f"ferry: {src} is libferry {have}, the package is {want}: "
                                     "rebuild the library or point FERRY_LIBRARY at the right one")
            dst = os.path.join(self.build_lib, "ferry", "libferry.so")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755)
            print(f"ferry: bundled {src} as {dst}")
            # the licence, and the notices of what libferry.so carries (jansson, xxHash)
            for name in ("LICENSE", "THIRD_PARTY_NOTICES"):
                if os.path.isfile(os.path.join(ROOT, name)):
                    shutil.copyfile(os.path.join(ROOT, name), os.path.join(self.build_lib, "ferry", name))

    cmdclass = {"build_py": BuildPyWithLibrary}
    try:  # setuptools >= 70.1 has bdist_wheel; older ones take it from wheel
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        try:
            from wheel.bdist_wheel import bdist_wheel
        except ImportError:
            bdist_wheel = None
    if bdist_wheel is not None:
        class PlatformWheel(bdist_wheel):
            def get_tag(self):
                plat = os.environ.get("FERRY_WHEEL_PLAT")
                if not plat:
                    lib = os.path.join(self.bdist_dir, *"ferry/libferry.so".split("/"))
                    if not os.path.isfile(lib):  # not installed into bdist_dir yet
                        lib = os.path.join(self.distribution.get_command_obj("build_py").build_lib,
                                           "ferry", "libferry.so")
                    plat, why = platform_tag(lib)
                    print(f"ferry: wheel platform {plat} ({why})")
                return "py3", "none", plat

        cmdclass["bdist_wheel"] = PlatformWheel

    setup(version=project_version(), cmdclass=cmdclass, distclass=BinaryDistribution)
