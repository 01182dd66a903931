#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install everything ferry needs to build and test on a fresh Debian machine,
# and fetch the source of the libraries it links statically.
#
# jansson: Debian's libjansson.a is not position-independent, so it cannot go
# into libferry.so. We take jansson's source from Debian's own source package
# (signature and checksums verified by apt) and build it with -fPIC as part of
# ferry's build. xxhash is used header-only from libxxhash-dev.
#
# The test tools' Python packages from PyPI go into a virtual environment,
# .deps/venv (Debian's python3 refuses pip installs, PEP 668); it sees the
# system's packages too (python3-torch, pytest). scripts/test.sh configures the
# tests with its interpreter.
#
# Sourced (`. scripts/deps.sh`), it only defines its functions (for
# tests/scripts/test_deps_sources.sh).

# deb_src_line SOURCE_LIST SOURCE_PARTS CODENAME: print the deb-src line for the
# source of the machine's main archive, taken from the first `deb` entry whose
# suite is CODENAME (not CODENAME-updates or -security) in apt's one-line
# SOURCE_LIST and the *.list / *.sources (deb822) files of SOURCE_PARTS, in the
# order apt reads them. Its signed-by / trusted options are kept, so a local
# mirror with its own key works too. deb.debian.org when none is configured.
deb_src_line() {
    local list=$1 parts=$2 codename=$3 f line
    local files=()
    [ -f "$list" ] && files+=("$list")
    # apt reads the parts in C-locale order and ignores other extensions
    # (a .list.disabled file is off)
    while IFS= read -r f; do
        files+=("$f")
    done < <(LC_ALL=C find "$parts" -maxdepth 1 -type f \( -name '*.list' -o -name '*.sources' \) 2>/dev/null | LC_ALL=C sort)
    for f in "${files[@]}"; do
        case $f in
            *.sources) line=$(deb822_main_src "$codename" <"$f") ;;
            *) line=$(oneline_main_src "$codename" <"$f") ;;
        esac
        if [ -n "$line" ]; then
            echo "$line"
            return 0
        fi
    done
    echo "deb-src http://deb.debian.org/debian $codename main"
}

# oneline_main_src CODENAME < FILE: `deb [options] URI SUITE COMPONENTS...` lines
oneline_main_src() {
    awk -v cn="$1" '
        { sub(/#.*/, "") }
        $1 != "deb" { next }
        {
            i = 2; opts = ""
            if ($2 ~ /^\[/) {   # [ opt=v opt=v ], with or without inner spaces
                o = ""
                for (; i <= NF; i++) { o = o " " $i; if ($i ~ /\]$/) { i++; break } }
                gsub(/\[|\]/, " ", o)
                n = split(o, w, " ")
                for (k = 1; k <= n; k++)
                    if (w[k] ~ /^(signed-by|trusted)=/) opts = opts (opts == "" ? "" : " ") w[k]
            }
            if ($(i + 1) == cn && $i !~ /^cdrom:/) {
                print "deb-src " (opts == "" ? "" : "[" opts "] ") $i " " cn " main"
                exit
            }
        }'
}

# deb822_main_src CODENAME < FILE: stanzas of `Field: value` lines (deb822),
# separated by blank lines; a line starting with a space continues a field
deb822_main_src() {
    awk -v cn="$1" '
        function flush(   n, k, t, s, u, opts, isdeb, hit) {
            if (!("types" in f)) { delete f; return }
            n = split(f["types"], t, " ")
            for (k = 1; k <= n; k++) if (t[k] == "deb") isdeb = 1
            n = split(f["suites"], s, " ")
            for (k = 1; k <= n; k++) if (s[k] == cn) hit = 1
            split(f["uris"], u, " ")
            if (isdeb && hit && tolower(f["enabled"]) != "no" && u[1] != "" && u[1] !~ /^cdrom:/) {
                opts = ""
                # a key file (not a key pasted into the stanza, which one line cannot hold)
                if (f["signed-by"] ~ /^\// && f["signed-by"] !~ / /) opts = "signed-by=" f["signed-by"]
                if (tolower(f["trusted"]) == "yes") opts = opts (opts == "" ? "" : " ") "trusted=yes"
                print "deb-src " (opts == "" ? "" : "[" opts "] ") u[1] " " cn " main"
                found = 1
                exit
            }
            delete f
        }
        /^#/ { next }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]/ {   # continuation: one more word list, or a line of a pasted key
            v = $0
            gsub(/^[ \t]+|[ \t]+$/, "", v)
            if (key != "") f[key] = (f[key] == "" ? v : f[key] " " v)
            next
        }
        {
            key = tolower(substr($0, 1, index($0, ":") - 1))
            v = substr($0, index($0, ":") + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", v)
            gsub(/[ \t]+/, " ", v)
            f[key] = v
        }
        END { if (!found) flush() }'
}

# apt_get ARGS...: apt-get that waits up to 10 minutes for another apt or dpkg
# (unattended-upgrades on a first boot) instead of failing. DPkg::Lock::Timeout
# covers the dpkg locks only: `apt-get update` (apt 2.6, Debian 12) fails at
# once on the lists lock, so an update is retried while that lock is held.
apt_get() {
    local a prev="" update="" err rc waited=0 LISTS=""
    local conf=()
    for a in "$@"; do
        [ "$a" = update ] && update=1
        [ "$prev" = -o ] && conf+=(-o "$a")
        prev=$a
    done
    if [ -z "$update" ]; then
        ${SUDO:-} apt-get -o DPkg::Lock::Timeout=600 "$@"
        return
    fi
    # the lists directory of this call (the caller may name a private one)
    eval "$(apt-config "${conf[@]}" shell LISTS Dir::State::Lists/d)"
    err=$(mktemp)
    while :; do
        rc=0
        ${SUDO:-} apt-get -o DPkg::Lock::Timeout=600 "$@" 2>"$err" || rc=$?
        if [ "$rc" -ne 0 ] && [ "$waited" -lt 600 ] && grep -qF "${LISTS:-/var/lib/apt/lists/}lock" "$err"; then
            [ "$waited" -gt 0 ] || echo "deps: waiting for another apt to release ${LISTS}lock"
            sleep 5
            waited=$((waited + 5))
            continue
        fi
        cat "$err" >&2
        rm -f "$err"
        return "$rc"
    done
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    return 0
fi

set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

need=""
for p in build-essential cmake ninja-build clang clang-format llvm libclang-rt-dev libxxhash-dev xxhash python3-pytest \
         python3 python3-venv pkgconf ca-certificates dpkg-dev; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || need="$need $p"
done
if [ -n "$need" ]; then
    echo "deps: installing$need"
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends $need >/dev/null
fi

JANSSON_DIR=.deps/jansson
if [ ! -f "$JANSSON_DIR/CMakeLists.txt" ]; then
    echo "deps: fetching jansson source from Debian"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/lists/partial"
    # A private source list: the machine's own apt configuration is left alone,
    # but its mirror (and, through apt-get, its proxy) is used.
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    eval "$(apt-config shell SOURCE_LIST Dir::Etc::SourceList/f SOURCE_PARTS Dir::Etc::SourceParts/d)"
    deb_src_line "${SOURCE_LIST:-/etc/apt/sources.list}" "${SOURCE_PARTS:-/etc/apt/sources.list.d}" "$codename" \
        > "$tmp/src.list"
    echo "deps: $(cat "$tmp/src.list")"
    O=(-o "Dir::Etc::SourceList=$tmp/src.list" -o "Dir::Etc::SourceParts=$tmp/none"
       -o "Dir::State::Lists=$tmp/lists")
    apt_get "${O[@]}" update -qq
    (cd "$tmp" && apt_get "${O[@]}" source --download-only jansson >/dev/null 2>&1)
    # unpack beside, then move into place: an interrupted run leaves no half tree
    mkdir -p "$tmp/src" .deps
    tar -xf "$tmp"/jansson_*.orig.tar.* -C "$tmp/src" --strip-components=1
    rm -rf "$JANSSON_DIR"
    mv "$tmp/src" "$JANSSON_DIR"
fi

# The virtual environment, on Debian's interpreter where there is one (a fresh
# Debian machine has it; python3 on PATH may be another) so that python3-torch
# is visible in it. Made again when it no longer runs (its python was removed).
VENV=.deps/venv
base=/usr/bin/python3
[ -x "$base" ] || base=$(command -v python3)
if ! "$VENV/bin/python3" -c '' 2>/dev/null; then
    echo "deps: creating $VENV (from $base)"
    rm -rf "$VENV"
    "$base" -m venv --system-site-packages "$VENV"
fi
PY=$VENV/bin/python3
# Real torch, for the PyTorch cross-check (ctest pytorch_crosscheck re-runs itself
# under /usr/bin/python3 and skips itself without it). Debian's python3-torch
# (1.13, CPU only): about 35 s on this machine, from Debian's mirror like the
# rest. PyPI's torch wheel is not used: on Linux it pulls ~2.5 GB of CUDA
# libraries. Optional: a failure here only skips that test. Before the pip
# installs below: Debian's torch is built against Debian's numpy (1.x), which
# pip then sees and keeps; installed after them, it met PyPI's numpy 2 in the
# venv and every test that hands torch a numpy array failed ("Numpy is not
# available").
if [ "$(dpkg-query -W -f='${Status}' python3-torch 2>/dev/null)" != "install ok installed" ]; then
    echo "deps: installing python3-torch (for the PyTorch cross-check)"
    { apt_get update -qq && apt_get install -y -qq --no-install-recommends python3-torch >/dev/null; } ||
        echo "deps: could not install python3-torch; the PyTorch cross-check will be skipped"
fi
# The reference safetensors package (and numpy), for the convert cross-check;
# small wheels from PyPI. Tests that need it say so and check less without it.
if ! "$PY" -c "import safetensors, numpy" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check safetensors numpy ||
        echo "deps: could not install safetensors/numpy from PyPI; the convert test will check less"
fi
# The reference gguf package (llama.cpp's gguf-py, pure Python, needs numpy), for
# the GGUF cross-check (ctest gguf_crosscheck skips itself without it).
if ! "$PY" -c "import gguf, numpy" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check gguf numpy ||
        echo "deps: could not install gguf/numpy from PyPI; the GGUF cross-check will be skipped"
fi
# diffusers, for ferry.diffusers.from_pretrained against diffusers' own
# (tests/py/test_binding_diffusers.py skips without it): 0.31.0 is the newest
# that imports with Debian's torch 1.13 (0.32 on need torch.float8_e4m3fn).
if ! "$PY" -c "import diffusers" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check "diffusers==0.31.0" ||
        echo "deps: could not install diffusers from PyPI; the diffusers test will be skipped"
fi
# A second environment with PyPI's torch 2 and a diffusers that has
# WanTransformer3DModel, for tests/py/test_stream_diffusers.py (ctest
# stream_diffusers skips itself without it): Debian's torch 1.13 cannot build
# that model, and diffusers past 0.31 does not import with it. Its own packages
# only, so Debian's torch cannot shadow PyPI's. PyPI's torch for Linux is the
# CUDA build and brings the nvidia-* libraries: torch 2.15.0 for Python 3.11
# measured 3.0 GB to download (torch 539 MB, nvidia-cudnn 519 MB, nvidia-cublas
# 405 MB, triton 286 MB, nvidia-cusolver, -cufft, -nccl, -cusparse, -cusparselt,
# ...) and 5.5 GB installed (3.0 GB of it nvidia/), in 65 s with an empty pip
# cache on a 2-core machine. PyTorch's CPU-only wheels are on
# PyTorch's own index, which these machines cannot reach; without them the
# CUDA wheel runs on the cpu. Versions pinned so that the test's models, and so
# its results, stay the same. Optional: a failure leaves no environment and
# only skips that test.
VENV2=.deps/venv-torch2
if ! "$VENV2/bin/python3" -c "import pytest, safetensors, accelerate, torch
from diffusers import FluxTransformer2DModel, UNet2DConditionModel, WanTransformer3DModel" 2>/dev/null; then
    echo "deps: creating $VENV2 (PyPI's torch and diffusers: about 3 GB to download)"
    rm -rf "$VENV2"
    if ! { "$base" -m venv "$VENV2" &&
           "$VENV2/bin/python3" -m pip install --quiet --disable-pip-version-check \
               "torch==2.15.0" "diffusers==0.42.1" accelerate safetensors numpy pytest; }; then
        rm -rf "$VENV2"
        echo "deps: could not install torch 2 and diffusers from PyPI; the diffusers streaming test will be skipped"
    fi
fi
# ComfyUI's packages in that environment, for running ComfyUI headless on the
# CPU (tests/comfyui, ctest comfyui_stock; ComfyUI itself is not installed:
# tests find it at $COMFYUI_DIR or ../shared/comfyui). What its start-up, its
# built-in nodes and the tests' prompts import: torchvision and torchaudio
# (imported by comfy.model_base and comfy.sd), torchsde (samplers), einops,
# av (comfy_api), transformers and tokenizers (CLIP and T5 tokenizers),
# sentencepiece (UMT5's), scipy, and ComfyUI's pins comfy-aimdo and
# comfy-kitchen; Pillow, psutil, PyYAML and tqdm came with diffusers and
# accelerate (listed, so a change there cannot drop them). Not the
# HTTP server, frontend or database (aiohttp, comfyui-frontend-package,
# SQLAlchemy, alembic), nor kornia, spandrel, simpleeval or comfy-angle: ten
# comfy_extras node files that import them (image filters, upscalers, math,
# GLSL, ...) fail to load and are reported, the rest run.
# comfy-kitchen's pure-Python wheel (181 kB) rather than the compiled one pip
# prefers (58.5 MB of CUDA kernels). torch stays as installed above (a
# constraint); torchvision 0.29.2 and torchaudio 2.11.1 are the newest that
# accept torch 2.15. Measured: 24 packages, 456 MB installed, 21 s with an
# empty pip cache on a busy 2-core machine. Versions pinned, as above, so that the
# tokenizers, and so the tests' results, stay the same. Optional: a failure
# only skips those tests (their runner checks these imports).
if [ -x "$VENV2/bin/python3" ] &&
   ! "$VENV2/bin/python3" -c "import comfy_aimdo, comfy_kitchen, torchvision, torchaudio, torchsde, einops, av
import transformers, tokenizers, sentencepiece, scipy, PIL, psutil, yaml, tqdm" 2>/dev/null; then
    echo "deps: adding ComfyUI's packages to $VENV2 (about 0.5 GB)"
    start=$(date +%s)
    ck=$(mktemp -d)
    py2=$VENV2/bin/python3
    if torch_pin=$("$py2" -c "import importlib.metadata as m; print(m.version('torch'))") &&
       echo "torch==$torch_pin" > "$ck/constraints.txt" &&
       pyver=$("$py2" -c "import sys; print('%d.%d' % sys.version_info[:2])") &&
       "$py2" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
           --platform any --implementation py --python-version "$pyver" -d "$ck" "comfy-kitchen==0.2.31" &&
       "$py2" -m pip install --quiet --disable-pip-version-check -c "$ck/constraints.txt" \
           "$ck"/comfy_kitchen-0.2.31-py3-none-any.whl "comfy-aimdo==0.4.13" \
           "torchvision==0.29.2" "torchaudio==2.11.1" "torchsde==0.2.6" "einops==0.8.2" "av==18.1.0" \
           "transformers==5.25.0" "tokenizers==0.23.3" "sentencepiece==0.2.3" "scipy==1.17.1" \
           pillow psutil pyyaml tqdm; then
        echo "deps: ComfyUI's packages added in $(( $(date +%s) - start )) s"
    else
        echo "deps: could not add ComfyUI's packages to $VENV2; the ComfyUI tests will be skipped"
    fi
    rm -rf "$ck"
fi
echo "deps: ready"
