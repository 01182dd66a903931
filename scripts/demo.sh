#!/usr/bin/env bash
# ferry's main job on a fresh Debian machine: install what is needed, build,
# then inspect and hash a checkpoint. With no argument it first writes a sample
# diffusion-transformer-like checkpoint (324 tensors, BF16/F32/FP8, ~450 MiB).
#
#   scripts/demo.sh                  # sample checkpoint in ./sample/
#   scripts/demo.sh model.safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ferry
if [ $# -ge 1 ]; then
    ckpt=$1
else
    ckpt=sample/dit-sample.safetensors
    mkdir -p sample
    [ -f "$ckpt" ] || python3 scripts/make_sample.py "$ckpt"
fi
echo
echo "== ferry inspect $ckpt"
./build/ferry inspect "$ckpt" | head -40
n=$(./build/ferry inspect --json "$ckpt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tensor_count"])')
[ "$n" -gt 27 ] && echo "... ($n tensors in all; 'ferry inspect --json' prints everything)"
echo
echo "== ferry hash $ckpt"
./build/ferry hash "$ckpt" | tail -5
