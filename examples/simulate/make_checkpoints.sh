#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Write the two checkpoints scenario.json names, next to it, with ferry's
# deterministic sample writer: unet.safetensors (8 blocks, hidden 768: 116
# tensors, 153.5 MiB) and te.safetensors (4 blocks, hidden 512: 64 tensors,
# 35.4 MiB). Then: ferry simulate examples/simulate/scenario.json
set -eu
here=$(cd "$(dirname "$0")" && pwd)
make_sample="$here/../../scripts/make_sample.py"
python3 "$make_sample" "$here/unet.safetensors" --blocks 8 --hidden 768 --seed 1
python3 "$make_sample" "$here/te.safetensors" --blocks 4 --hidden 512 --seed 2
