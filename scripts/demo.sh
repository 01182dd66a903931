#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ferry's main job on a fresh Debian machine: install what is needed, build,
# then inspect, hash and load a checkpoint, and replay a multi-model workflow on
# the residency store (ferry simulate). With no argument it first writes a sample
# diffusion-transformer-like checkpoint (324 tensors, BF16/F32/FP8, ~450 MiB).
#
#   scripts/demo.sh                  # sample checkpoint in ./sample/
#   scripts/demo.sh model.safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
# The configuration of scripts/test.sh's plain stage (same folder, build type and
# Python), so that neither rebuilds the whole tree after the other. libferry.so
# too: README's `pip install ./python` bundles build/libferry.so.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$PWD/.deps/venv/bin/python3" >/dev/null
cmake --build build --target ferry ferry_shared
if [ $# -ge 1 ]; then
    ckpt=$1
else
    ckpt=sample/dit-sample.safetensors
    mkdir -p sample
    [ -f "$ckpt" ] || python3 scripts/make_sample.py "$ckpt"
fi
echo
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "== ferry inspect $ckpt"
./build/ferry inspect "$ckpt" > "$out"
head -40 "$out"
read -r n bytes < <(./build/ferry inspect --json "$ckpt" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["tensor_count"], j["total_bytes"])') ||
    { echo "demo: ferry inspect --json $ckpt failed" >&2; exit 1; }
if [ "$n" -gt 27 ]; then echo "... ($n tensors in all; 'ferry inspect --json' prints everything)"; fi
echo
echo "== ferry hash $ckpt"
./build/ferry hash "$ckpt" > "$out"
tail -5 "$out"
echo
echo "== ferry load $ckpt (on a GPU if there is one, else on a simulated one)"
# a GPU when the driver finds one; a simulated GPU when there is none; any
# other failure (a verify mismatch on a real GPU) is shown and fails the demo
if out_load=$(./build/ferry load --device cuda:0 --verify "$ckpt" 2>&1); then
    echo "$out_load"
elif grep -q "cannot load the NVIDIA driver\|cuInit failed\|no such device" <<<"$out_load"; then
    echo "(no GPU here: ${out_load#ferry: }; using a simulated GPU)"
    ./build/ferry load --device "sim:$((bytes + (1 << 30)))" --verify "$ckpt"
else
    echo "$out_load" >&2
    exit 1
fi
echo
echo "== ferry simulate examples/simulate/scenario.json (two models under one device budget, on a simulated GPU)"
[ -f examples/simulate/unet.safetensors ] && [ -f examples/simulate/te.safetensors ] ||
    sh examples/simulate/make_checkpoints.sh >/dev/null
./build/ferry simulate examples/simulate/scenario.json
