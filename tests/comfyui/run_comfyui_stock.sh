#!/bin/sh
# Run tests/comfyui/test_stock.py (stock ComfyUI, headless on the CPU, on tiny
# models) with the interpreter of scripts/deps.sh's torch-2 environment.
#
#   run_comfyui_stock.sh PYTHON
#
# Exit: pytest's (0 passed, 1 a failure), 77 (skipped) when PYTHON is missing,
# lacks ComfyUI's packages (deps.sh could not install them), or there is no
# ComfyUI ($COMFYUI_DIR, or ../shared/comfyui beside the repository).
py=${1:?usage: run_comfyui_stock.sh PYTHON}
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -x "$py" ]; then
    echo "comfyui_stock: no $py (scripts/deps.sh makes it; it could not, or was not run): skipped"
    exit 77
fi
if ! where=$("$py" "$here/harness.py" find); then
    echo "comfyui_stock: $where: skipped"
    exit 77
fi
if ! got=$("$py" -c '
import pytest, numpy, safetensors, torch, torchvision, torchaudio, torchsde, einops, av, transformers
import sentencepiece, scipy, PIL, yaml, comfy_aimdo, comfy_kitchen
print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1); then
    echo "comfyui_stock: $py cannot run ComfyUI: $(printf '%s\n' "$got" | tail -1): skipped"
    exit 77
fi
echo "comfyui_stock: ComfyUI at $where, $py ($got)"
# no bytecode or pytest cache in the source tree or in ComfyUI's
exec env PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider -rs -s "$here/test_stock.py"
