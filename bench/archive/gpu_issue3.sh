#!/usr/bin/env bash
# Issue 3's measurements after the one-block ring (bench/RESULTS.md):
#   bench/archive/gpu_issue3.sh BUILD OUTDIR
set -uo pipefail
B=$1 OUT=$2
F=/tmp/cmp10g.safetensors
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 2560 --bf16-only
echo "== every path on every valid golden file, verified, cuda:0"
python3 tests/data/gen_golden.py /tmp/golden >/dev/null
python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 | tail -2
echo "== fresh processes, hot: bench_first fresh / ferry load (auto), alternated"
cat $F > /dev/null
for r in 1 2 3; do
  "$B"/bench_first $F fresh | grep '"load"'
  "$B"/ferry load --json $F | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["files"][0]; print("ferry load: %.2f GB/s, %.3f s, %s, peak RSS %.0f MiB" % (f["gbps"], f["seconds"], f["path_used"], d["peak_rss_bytes"]/2**20))'
done
echo "== ferry load --verify"
"$B"/ferry load --verify $F | head -2
echo "== ferry bench --cold"
"$B"/ferry bench --cold $F | tee "$OUT"/bench.txt
