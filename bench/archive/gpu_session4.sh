#!/usr/bin/env bash
# Fourth GPU session (bench/RESULTS.md, "after the house reshape"): the figures
# of the earlier sessions re-taken on the reshaped tree (issue 11), same
# commands, so a regression from the split files, the layer libraries, the
# fault table or the new ABI would show.
#   bench/archive/gpu_session4.sh BUILD OUTDIR [A|B|C|D|E]...
#   A correctness on cuda:0 (driver checks, golden files x routes, 10 GB --verify)
#   B ferry bench (copy limits, every route, hot) and fresh-process hot loads
#   C bench_store (the residency store's moves)
#   D tests/gpu/test_torch_gpu.py (the binding on cuda, Store cycles, 5.7 GB load vs the CLI)
#   E bench/compare_load.py (ferry against safetensors and torch, cold and hot)
#   F queued moves on cuda:0 (tests/gpu/async_cuda.c on the 10 GB checkpoint)
set -uo pipefail
B=$1 OUT=$2; shift 2
PARTS=${*:-A B C D}
mkdir -p "$OUT"
F=/tmp/cmp10g.safetensors
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; uname -r
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 2560 --bf16-only >/dev/null
drop() { sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" $F; }
fload() { "$B"/ferry load --json "$@" $F | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["files"][0]; print("ferry load: %.2f GB/s, %.3f s, %s, peak RSS %.0f MiB" % (f["gbps"], f["seconds"], f["path_used"], d.get("peak_rss_bytes", 0) / 2**20))'; }
for part in $PARTS; do case $part in
A)
  echo "=== A: correctness on cuda:0"
  "$B"/tests/unit/test_cuda_nodev | tail -1
  python3 tests/data/gen_golden.py /tmp/golden >/dev/null
  python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 | tail -1
  drop; "$B"/ferry load --path ring --verify $F | head -1
  ;;
B)
  echo "=== B: ferry bench (hot) and fresh-process hot loads"
  cat $F >/dev/null
  "$B"/ferry bench $F | tee "$OUT"/bench.txt
  for i in 1 2 3; do fload; done
  ;;
C)
  echo "=== C: bench_store"
  cat $F >/dev/null
  mkdir -p /var/tmp/ferry-spill  # bench_store does not make its spill directory
  "$B"/bench_store $F /var/tmp/ferry-spill | tee "$OUT"/store.json
  ;;
D)
  echo "=== D: tests/gpu/test_torch_gpu.py"
  [ -f /tmp/big.safetensors ] || python3 scripts/make_sample.py /tmp/big.safetensors --blocks 24 --hidden 2560 --bf16-only >/dev/null
  FERRY_LIBRARY=$PWD/$B/libferry.so timeout 300 python3 tests/gpu/test_torch_gpu.py --big /tmp/big.safetensors --ferry "$B"/ferry 2>&1 | tee "$OUT"/torch-gpu.log | grep -v "^PASS"
  ;;
E)
  echo "=== E: bench/compare_load.py"
  timeout 420 python3 bench/compare_load.py --ferry "$B"/ferry --file $F --rounds 2 --make --budget-seconds 360 --out "$OUT"/compare.json 2>&1 | tail -25
  ;;
F)
  echo "=== F: queued moves on cuda:0"
  cat $F >/dev/null
  "$B"/tests/gpu_async_cuda $F cuda:0
  ;;
esac; done
