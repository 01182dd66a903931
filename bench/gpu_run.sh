#!/usr/bin/env bash
# The GPU measurements of the transfer issue, in one run on the GPU machine
# (bench/RESULTS.md quotes its output). BUILD is a Release build
# (cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release; binaries are
# self-contained, so a build made on Debian runs there).
#   bench/gpu_run.sh BUILD OUTDIR
set -uo pipefail
B=${1:-build-gpu}
OUT=${2:-/tmp/ferry-gpu-out}
mkdir -p "$OUT"
F=/tmp/bench10g.safetensors
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== driver test"; "$B"/tests/unit/test_cuda_nodev | tail -1
echo "== every path on every valid golden file, verified, cuda:0"
python3 tests/data/gen_golden.py /tmp/golden >/dev/null
python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 | tail -3
echo "== 10 GB BF16 checkpoint"
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 3072 --bf16-only
"$B"/ferry load --device cuda:0 --verify $F
echo "== bench (cold and hot)"
"$B"/ferry bench --cold $F | tee "$OUT"/bench.txt
echo "== ring tuning, hot"
for t in 8 12 16; do for b in 8MiB 16MiB 32MiB; do
  echo -n "threads $t buffer $b: "; "$B"/ferry load --path ring --threads $t --buffer-size $b $F | head -1 | sed 's/.*in //'
done; done
