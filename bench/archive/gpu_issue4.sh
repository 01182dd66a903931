#!/usr/bin/env bash
# Issue 3's re-check and issue 4's targets on the GPU machine (bench/RESULTS.md):
#   bench/archive/gpu_issue4.sh BUILD OUTDIR
set -uo pipefail
B=$1 OUT=$2
F=/tmp/cmp10g.safetensors
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 2560 --bf16-only
cat $F > /dev/null
echo "== driver tests and every path on every valid golden file, verified, cuda:0"
"$B"/tests/unit/test_cuda_nodev | tail -1
python3 tests/data/gen_golden.py /tmp/golden >/dev/null
python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 | tail -1
echo "== fresh processes, hot: ferry load (auto) x3, bench_first fresh x2"
for r in 1 2 3; do "$B"/ferry load $F | head -1; done
for r in 1 2; do "$B"/bench_first $F fresh | grep '"load"'; done
echo "== ferry bench (hot)"
"$B"/ferry bench $F | tee "$OUT"/bench-hot.txt
echo "== store"
mkdir -p /var/tmp/ferry-spill
"$B"/bench_store $F /var/tmp/ferry-spill | tee "$OUT"/store.json
