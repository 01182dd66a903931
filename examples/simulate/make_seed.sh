#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Write the checkpoints of the seed workflow (a 28 GiB DiT of 40
# blocks and an 11 GiB text encoder on a 24 GiB GPU with 32 GiB of host RAM)
# with ferry's deterministic sample writer. --bf16-only makes every block the
# same size, as in a real DiT.
#
#   make_seed.sh              seed/dit.safetensors (1.75 GiB, hidden 1140) and
#                             seed/te.safetensors (704 MiB, hidden 920) for seed.json:
#                             16x smaller in bytes (hidden / 4), about 10 s
#   make_seed.sh --full [DIR] the full-size pair (28.0 GiB, hidden 4560; 11.0 GiB,
#                             hidden 3680) for seed-full.json, into DIR (default
#                             seed-full/ here; another DIR gets seed-full linked to
#                             it): 39 GiB of disk, minutes
#
# Then: ferry simulate examples/simulate/seed.json
#       ferry simulate examples/simulate/seed-full.json      (on the GPU machine)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
make_sample="$here/../../scripts/make_sample.py"
if [ "${1:-}" = "--full" ]; then
    dir=${2:-$here/seed-full}
    dit=4560 te=3680
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$dir" != "$here/seed-full" ] && [ ! -e "$here/seed-full" ]; then ln -s "$dir" "$here/seed-full"; fi
else
    dir=$here/seed
    dit=1140 te=920
    mkdir -p "$dir"
fi
python3 "$make_sample" "$dir/dit.safetensors" --blocks 40 --hidden "$dit" --bf16-only --seed 3
python3 "$make_sample" "$dir/te.safetensors" --blocks 24 --hidden "$te" --bf16-only --seed 4
