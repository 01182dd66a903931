#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/comfyui_carry.sh - what bench/gpu_comfyui.sh needs on the GPU machine, in ignored
# folders of this checkout, for the device call's carry (64 MiB in all):
#   .carry/comfyui   a copy of ComfyUI ($COMFYUI_DIR, else ../shared/comfyui beside the repository)
#                    without what the Wan text-to-video prompt never imports or reads: the
#                    tokenizers of other text encoders (Wan's UMT5 tokenizer is inside its model
#                    file), docs, tests, the frontend's and server's assets, git metadata
#   .whl/comfyui     wheels the GPU image lacks: comfy-aimdo 0.4.13 (manylinux x86_64, for PYVER),
#                    comfy-kitchen 0.2.31 (the pure-Python wheel), torchsde, trampoline. PyAV
#                    (~36 MB) is left out: bench/stubs/av stands in for it at import time.
#   build-gpu/libferry.so   a copy of $FERRY_SO ($FERRY_LIBRARY, else build/libferry.so), linked
#                    against libc only, so a Debian 12 build runs on the GPU image
# and prints each part's size and the total with the tracked tree and build-gpu/.
#
#   scripts/comfyui_carry.sh            # PYVER=3.12 (the GPU image's Ubuntu 24.04 python3)
#   PYVER=3.11 scripts/comfyui_carry.sh
# Needs tar, bc and pip (any python3 with it: $PIP_PYTHON, else .deps/venv-torch2/bin/python or python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
SRC=${COMFYUI_DIR:-$(cd .. && pwd)/shared/comfyui}
[ -f "$SRC/execution.py" ] || { echo "no ComfyUI at $SRC (set COMFYUI_DIR)"; exit 1; }
PIP_PY=${PIP_PYTHON:-}
for p in .deps/venv-torch2/bin/python python3; do
  [ -n "$PIP_PY" ] && break
  "$p" -m pip --version >/dev/null 2>&1 && PIP_PY=$p
done
[ -n "$PIP_PY" ] || { echo "no python with pip (set PIP_PYTHON)"; exit 1; }

echo "== ComfyUI: $SRC -> .carry/comfyui"
rm -rf .carry/comfyui
mkdir -p .carry
# text encoders' tokenizer folders: every one but t5_tokenizer is for a model Wan does not use
# (Wan's UMT5 tokenizer is inside its model file; t5_tokenizer is small)
DROP=(./.git ./tests ./tests-unit ./.github ./.ci ./docs ./blueprints ./script_examples ./notebooks
      ./web ./models ./output ./input ./user ./temp)
for d in "$SRC"/comfy/text_encoders/*/; do
  n=$(basename "$d")
  [ "$n" = t5_tokenizer ] || DROP+=("./comfy/text_encoders/$n")
done
EX=()
for d in "${DROP[@]}"; do EX+=("--exclude=$d"); done
mkdir -p .carry/comfyui
tar -C "$SRC" "${EX[@]}" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.md' --exclude='*.png' \
  --exclude='*.jpg' --exclude='*.webp' --exclude='*.gif' -cf - . | tar -C .carry/comfyui -xf -
du -sh "$SRC" .carry/comfyui | sed 's/^/  /'
echo "  largest left:"; (cd .carry/comfyui && du -a . | sort -n | tail -6 | sed 's/^/    /')

echo "== wheels for python $PYVER -> .whl/comfyui"
rm -rf .whl/comfyui
mkdir -p .whl/comfyui
ABI=cp${PYVER/./}
"$PIP_PY" -m pip download -q --no-deps -d .whl/comfyui --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform linux_x86_64 --python-version "$PYVER" --implementation cp --abi "$ABI" --abi abi3 --abi none \
  comfy-aimdo==0.4.13
# the kitchen's pure-Python wheel (py3-none-any), not its 58 MB compiled one
"$PIP_PY" -m pip download -q --no-deps -d .whl/comfyui --only-binary=:all: --platform any \
  --python-version "$PYVER" --implementation py --abi none comfy-kitchen==0.2.31
"$PIP_PY" -m pip download -q --no-deps -d .whl/comfyui --only-binary=:all: --python-version "$PYVER" \
  --platform any torchsde trampoline
ls -la .whl/comfyui | tail -n +2 | awk '{print "  " $5 "\t" $9}'

echo "== libferry -> build-gpu/libferry.so"
SO=${FERRY_SO:-${FERRY_LIBRARY:-build/libferry.so}}
if [ -e "$SO" ]; then
  mkdir -p build-gpu && cp -L "$SO" build-gpu/libferry.so
  echo "  $SO ($(ldd build-gpu/libferry.so | awk '{print $1}' | paste -sd ' '))"
else
  echo "  none at $SO (set FERRY_SO): the GPU call then builds it from a carried .deps/jansson"
fi

echo "== carry total"
# what the device tool sends of the tree: tracked files and untracked ones git does not ignore
TRACKED=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
          awk '{s += $1} END {print s + 0}')
PARTS=$(du -scb .carry .whl/comfyui $( [ -e build-gpu/libferry.so ] && echo build-gpu/libferry.so ) | tail -1 | cut -f1)
TOTAL=$((TRACKED + PARTS))
printf '  tracked tree %.1f MiB; .carry + .whl/comfyui%s %.1f MiB; total %.1f MiB (limit 64)\n' \
  "$(echo "$TRACKED/1048576" | bc -l)" "$( [ -e build-gpu/libferry.so ] && echo ' + build-gpu/libferry.so')" \
  "$(echo "$PARTS/1048576" | bc -l)" "$(echo "$TOTAL/1048576" | bc -l)"
[ "$TOTAL" -lt $((64 << 20)) ] || { echo "  over the 64 MiB carry limit"; exit 1; }
