#!/bin/sh
# Run tests/comfyui/test_pack.py (the node pack's loaders against stock
# ComfyUI, headless on the CPU, on tiny models) with the interpreter of
# scripts/deps.sh's torch-2 environment and this checkout's ferry.
#
#   run_comfyui_pack.sh PYTHON LIBFERRY_SO
#
# Exit: pytest's (0 passed, 1 a failure), 77 (skipped) when PYTHON is missing,
# lacks ComfyUI's packages (deps.sh could not install them), there is no
# ComfyUI ($COMFYUI_DIR, or ../shared/comfyui beside the repository) or no
# LIBFERRY_SO.
py=${1:?usage: run_comfyui_pack.sh PYTHON LIBFERRY_SO}
lib=${2:?usage: run_comfyui_pack.sh PYTHON LIBFERRY_SO}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
case $lib in /*) ;; *) lib=$(pwd)/$lib ;; esac

if [ ! -x "$py" ]; then
    echo "comfyui_pack: no $py (scripts/deps.sh makes it; it could not, or was not run): skipped"
    exit 77
fi
if [ ! -f "$lib" ]; then
    echo "comfyui_pack: no ferry library at $lib: skipped"
    exit 77
fi
if ! where=$("$py" "$here/harness.py" find); then
    echo "comfyui_pack: $where: skipped"
    exit 77
fi
if ! got=$("$py" -c '
import pytest, numpy, safetensors, torch, torchvision, torchaudio, torchsde, einops, av, transformers
import sentencepiece, scipy, PIL, yaml, comfy_aimdo, comfy_kitchen
print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1); then
    echo "comfyui_pack: $py cannot run ComfyUI: $(printf '%s\n' "$got" | tail -1): skipped"
    exit 77
fi
echo "comfyui_pack: ComfyUI at $where, $py ($got), $lib"
# no bytecode or pytest cache in the source tree or in ComfyUI's; the pack
# imports ferry from python/ of this checkout with the library under test
# (test_pack.py hands both to each ComfyUI process it starts)
exec env PYTHONDONTWRITEBYTECODE=1 FERRY_LIBRARY="$lib" PYTHONPATH="$root/python" \
    "$py" -m pytest -q -p no:cacheprovider -rs -s "$here/test_pack.py"
