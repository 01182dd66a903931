#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run one of the ComfyUI tests (ComfyUI headless on the CPU, on tiny models)
# with the interpreter of scripts/deps.sh's torch-2 environment:
#
#   run_comfyui.sh stock PYTHON               tests/comfyui/test_stock.py: stock ComfyUI
#   run_comfyui.sh pack PYTHON LIBFERRY_SO    tests/comfyui/test_pack.py: the node pack's
#                                             loaders against stock, with this checkout's ferry
#
# Exit: pytest's (0 passed, 1 a failure), 77 (skipped) when PYTHON is missing,
# lacks ComfyUI's packages (deps.sh could not install them), there is no
# ComfyUI ($COMFYUI_DIR, or ../shared/comfyui beside the repository) or (pack)
# no LIBFERRY_SO.
usage="usage: run_comfyui.sh stock PYTHON | run_comfyui.sh pack PYTHON LIBFERRY_SO"
what=${1:?$usage}
py=${2:?$usage}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=comfyui_$what
case $what in
stock) lib= ;;
pack)
    lib=${3:?$usage}
    case $lib in /*) ;; *) lib=$(pwd)/$lib ;; esac ;;
*) echo "$usage" >&2; exit 2 ;;
esac

if [ ! -x "$py" ]; then
    echo "$name: no $py (scripts/deps.sh makes it; it could not, or was not run): skipped"
    exit 77
fi
if [ -n "$lib" ] && [ ! -f "$lib" ]; then
    echo "$name: no ferry library at $lib: skipped"
    exit 77
fi
if ! where=$("$py" "$here/harness.py" find); then
    echo "$name: $where: skipped"
    exit 77
fi
if ! got=$("$py" -c '
import pytest, numpy, safetensors, torch, torchvision, torchaudio, torchsde, einops, av, transformers
import sentencepiece, scipy, PIL, yaml, comfy_aimdo, comfy_kitchen
print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1); then
    echo "$name: $py cannot run ComfyUI: $(printf '%s\n' "$got" | tail -1): skipped"
    exit 77
fi
echo "$name: ComfyUI at $where, $py ($got)${lib:+, $lib}"
# no bytecode or pytest cache in the source tree or in ComfyUI's; the pack
# imports ferry from python/ of this checkout with the library under test
# (test_pack.py hands both to each ComfyUI process it starts)
if [ -n "$lib" ]; then
    export FERRY_LIBRARY="$lib" PYTHONPATH="$root/python"
fi
exec env PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider -rs -s "$here/test_$what.py"
