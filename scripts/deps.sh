#!/usr/bin/env bash
# Install everything ferry needs to build and test on a fresh Debian machine,
# and fetch the source of the libraries it links statically.
#
# jansson: Debian's libjansson.a is not position-independent, so it cannot go
# into libferry.so. We take jansson's source from Debian's own source package
# (signature and checksums verified by apt) and build it with -fPIC as part of
# ferry's build. xxhash is used header-only from libxxhash-dev.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

need=""
for p in build-essential cmake ninja-build clang llvm libclang-rt-dev libxxhash-dev xxhash python3-pytest \
         python3 ca-certificates dpkg-dev; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || need="$need $p"
done
if [ -n "$need" ]; then
    echo "deps: installing$need"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

JANSSON_DIR=.deps/jansson
if [ ! -f "$JANSSON_DIR/CMakeLists.txt" ]; then
    echo "deps: fetching jansson source from Debian"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/lists/partial"
    # A private source list: the machine's own apt configuration is left alone.
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    echo "deb-src http://deb.debian.org/debian $codename main" > "$tmp/src.list"
    O=(-o "Dir::Etc::SourceList=$tmp/src.list" -o "Dir::Etc::SourceParts=$tmp/none"
       -o "Dir::State::Lists=$tmp/lists")
    $SUDO apt-get "${O[@]}" update -qq
    (cd "$tmp" && $SUDO apt-get "${O[@]}" source --download-only jansson >/dev/null 2>&1)
    # unpack beside, then move into place: an interrupted run leaves no half tree
    mkdir -p "$tmp/src" .deps
    tar -xf "$tmp"/jansson_*.orig.tar.* -C "$tmp/src" --strip-components=1
    rm -rf "$JANSSON_DIR"
    mv "$tmp/src" "$JANSSON_DIR"
fi
# The reference safetensors package (and numpy), for the convert cross-check;
# small wheels from PyPI. Tests that need it say so and check less without it.
if ! python3 -c "import safetensors, numpy" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check safetensors numpy 2>/dev/null ||
        echo "deps: could not install safetensors/numpy from PyPI; the convert test will check less"
fi
# The reference gguf package (llama.cpp's gguf-py, pure Python, needs numpy), for
# the GGUF cross-check (ctest gguf_crosscheck skips itself without it).
if ! python3 -c "import gguf, numpy" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check gguf numpy 2>/dev/null ||
        echo "deps: could not install gguf/numpy from PyPI; the GGUF cross-check will be skipped"
fi
# Real torch, for the PyTorch cross-check (ctest pytorch_crosscheck re-runs itself
# under /usr/bin/python3 and skips itself without it). Debian's python3-torch
# (1.13, CPU only): about 35 s on this machine, from Debian's mirror like the
# rest. PyPI's torch wheel is not used: on Linux it pulls ~2.5 GB of CUDA
# libraries. Optional: a failure here only skips that test.
if [ "$(dpkg-query -W -f='${Status}' python3-torch 2>/dev/null)" != "install ok installed" ]; then
    echo "deps: installing python3-torch (for the PyTorch cross-check)"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends python3-torch >/dev/null; } ||
        echo "deps: could not install python3-torch; the PyTorch cross-check will be skipped"
fi
echo "deps: ready"
