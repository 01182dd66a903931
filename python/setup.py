"""Build hook of the ferry binding: bundle the built libferry.so.

setuptools reads the project's metadata from pyproject.toml; this file adds
the version, read from project(ferry VERSION x.y.z) in ../CMakeLists.txt (the
one place it is set; an sdist carries it in PKG-INFO; a copy of python/ alone
takes the bundled library's ferry_version_string), and one step to
build_py: copy the shared library into the built package as
ferry/libferry.so, from $FERRY_LIBRARY (a file, or a folder holding
libferry.so) or else from ../build/libferry.so next to this folder (the
repository's default build folder). The wheel is tagged for the platform but
not for an interpreter (py3-none-linux_*): the package holds no extension
module, only a library that ctypes opens. Without a built library the build
stops and says where it looked.
"""
import ctypes
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def project_version():
    cmake = os.path.join(HERE, "..", "CMakeLists.txt")
    text = ""
    if os.path.isfile(cmake):
        with open(cmake, encoding="utf-8") as f:
            text = f.read()
    if re.search(r"^\s*project\(\s*ferry\b", text, re.M):  # the library's, not some other project's
        m = re.search(r"^\s*project\(\s*ferry\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text, re.M)
        if not m:
            raise SystemExit(f"ferry: no project(ferry VERSION x.y.z) in {os.path.normpath(cmake)}")
        return m.group(1)
    pkg_info = os.path.join(HERE, "PKG-INFO")  # building from an sdist
    if os.path.isfile(pkg_info):
        with open(pkg_info, encoding="utf-8") as f:
            m = re.search(r"^Version:\s*(\S+)", f.read(), re.M)
        if m:
            return m.group(1)
    # a copy of python/ alone: the version of the library it bundles
    lib = ctypes.CDLL(os.path.realpath(find_library()))
    lib.ferry_version_string.restype = ctypes.c_char_p
    return lib.ferry_version_string().decode()


def find_library():
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        p = os.path.join(env, "libferry.so") if os.path.isdir(env) else env
        if not os.path.isfile(p):
            raise SystemExit(f"ferry: FERRY_LIBRARY={env}: no library there")
        return p
    p = os.path.join(HERE, "..", "build", "libferry.so")
    if not os.path.isfile(p):
        raise SystemExit(f"ferry: no {os.path.normpath(p)}: build the library first "
                         "(cmake -S . -B build && cmake --build build) or set FERRY_LIBRARY")
    return p


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        src = os.path.realpath(find_library())  # the real file, not the soname links
        dst = os.path.join(self.build_lib, "ferry", "libferry.so")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o755)
        print(f"ferry: bundled {src} as {dst}")


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
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(version=project_version(), cmdclass=cmdclass)
