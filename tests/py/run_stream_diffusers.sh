#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run tests/py/test_stream_diffusers.py with the interpreter of scripts/deps.sh's
# second environment (PyPI's torch 2 and a diffusers with WanTransformer3DModel).
#
#   run_stream_diffusers.sh PYTHON LIBFERRY_SO
#
# Exit: pytest's (0 passed, 1 a failure), 77 (skipped) when PYTHON is missing or
# lacks what the test needs (deps.sh could not install it: no network, say).
py=${1:?usage: run_stream_diffusers.sh PYTHON LIBFERRY_SO}
lib=${2:?usage: run_stream_diffusers.sh PYTHON LIBFERRY_SO}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
case $lib in /*) ;; *) lib=$(pwd)/$lib ;; esac

if [ ! -x "$py" ]; then
    echo "stream_diffusers: no $py (scripts/deps.sh makes it; it could not, or was not run): skipped"
    exit 77
fi
if ! got=$("$py" -c '
import pytest, safetensors, torch, diffusers
from diffusers import FluxTransformer2DModel, UNet2DConditionModel, WanTransformer3DModel
print("torch", torch.__version__, "diffusers", diffusers.__version__)' 2>&1); then
    echo "stream_diffusers: $py cannot run the test: $(printf '%s\n' "$got" | tail -1): skipped"
    exit 77
fi
echo "stream_diffusers: $py ($got)"
# no bytecode or pytest cache in the source tree; the library under test comes
# from $FERRY_LIBRARY, the package from python/ of this checkout
exec env PYTHONDONTWRITEBYTECODE=1 FERRY_LIBRARY="$lib" PYTHONPATH="$root/python" \
    "$py" -m pytest -q -p no:cacheprovider -rs "$here/test_stream_diffusers.py"
