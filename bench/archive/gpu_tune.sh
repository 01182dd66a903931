#!/usr/bin/env bash
# Ring geometry sweep on the GPU machine: each configuration loads the hot
# 10 GB checkpoint 3 times in one process (--repeat 3); the first load pays for
# pinning the ring. Chooses the defaults of ferry_load_opts.
#   bench/archive/gpu_tune.sh BUILD
set -uo pipefail
B=${1:-build-gpu}
F=/tmp/bench10g.safetensors
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 3072 --bf16-only
sync
cat $F > /dev/null
for t in 8 12 16; do for b in 4MiB 8MiB 16MiB; do for s in 2 4 8; do
  r=$("$B"/ferry load --path ring --repeat 3 --threads $t --buffer-size $b --streams $s $F | grep -o '= [0-9.]* GB/s' | tr -d '=GB/s' | tr '\n' ' ')
  echo "threads $t buffer $b streams $s: $r"
done; done; done
