#!/usr/bin/env bash
# Third GPU session (bench/RESULTS.md): (A) why hot loads inside
# bench/compare_load.py ran at half their standalone rate, (B) the Python
# binding's GPU tests incl. the Store part, (C) issue 3/4 figures re-taken after
# the last refactors.
#   bench/archive/gpu_session3.sh BUILD OUTDIR [A|B|C]...
set -uo pipefail
B=$1 OUT=$2; shift 2
PARTS=${*:-B A C}
F=/tmp/cmp10g.safetensors
uname -r; cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null || echo "lru_gen: none"
[ -f $F ] || python3 scripts/make_sample.py $F --blocks 44 --hidden 2560 --bf16-only >/dev/null
drop() { sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" $F; }
lru() { grep -E '^(Active|Inactive)\(file\)' /proc/meminfo | tr -s ' ' | tr '\n' ' '; echo; }
fload() { "$B"/ferry load --json "$@" $F | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["files"][0]; print("ferry load: %.2f GB/s, %.3f s, %s" % (f["gbps"], f["seconds"], f["path_used"]))'; }
for part in $PARTS; do case $part in
A)
  echo "=== A: hot reads right after the cache was refilled"
  echo "== A1 drop, cat, bench_pread normal x3 (12 threads, 4 MiB)"; drop; cat $F >/dev/null; lru
  "$B"/bench_pread $F 12 4 normal 3; lru
  echo "== A2 drop, cat, bench_pread noreuse x2"; drop; cat $F >/dev/null
  "$B"/bench_pread $F 12 4 noreuse 2
  echo "== A3 drop, cat, bench_pread mmap x2"; drop; cat $F >/dev/null
  "$B"/bench_pread $F 12 4 mmap 2
  echo "== A4 drop, cat, ferry load --path ring x3 (fresh processes)"; drop; cat $F >/dev/null
  for i in 1 2 3; do fload --path ring; done
  echo "== A5 drop, compare_load.warm_cache (the harness's warm-up), ferry load --path ring x3"; drop
  python3 -c "import sys; sys.path.insert(0,'bench'); import compare_load as c; print('warm_cache %.2f s' % c.warm_cache('$F'))"
  for i in 1 2 3; do fload --path ring; done
  echo "== A6 drop, cat twice, ferry load --path ring x2"; drop; cat $F >/dev/null; cat $F >/dev/null
  for i in 1 2; do fload --path ring; done
  echo "== A7 drop, cat, ferry load --path register x2"; drop; cat $F >/dev/null
  for i in 1 2; do fload --path register; done
  ;;
B)
  echo "=== B: tests/gpu/test_torch_gpu.py"
  [ -f /tmp/big.safetensors ] || python3 scripts/make_sample.py /tmp/big.safetensors --blocks 24 --hidden 2560 --bf16-only >/dev/null
  FERRY_LIBRARY=$PWD/$B/libferry.so timeout 300 python3 tests/gpu/test_torch_gpu.py --big /tmp/big.safetensors --ferry "$B"/ferry 2>&1 | tee "$OUT"/torch-gpu.log | grep -v "^PASS"
  ;;
D)
  echo "=== D: the same after the harness's warm-up (8 Python threads, 8 MiB preadv each)"
  pywarm() { drop; python3 -c "import sys; sys.path.insert(0,'bench'); import compare_load as c; c.warm_cache('$F')"; }
  for m in normal mmap mmapdrop populate; do
    echo "== D $m x2 (12 threads)"; pywarm; "$B"/bench_pread $F 12 4 $m 2
  done
  for t in 4 24; do echo "== D normal, $t threads x1"; pywarm; "$B"/bench_pread $F $t 4 normal 1; done
  echo "== D cat-warm, then normal x1, for comparison"; drop; cat $F >/dev/null; "$B"/bench_pread $F 12 4 normal 1
  ;;
F)
  echo "=== F: what a cold ring load leaves in the page cache, before (build-old) and after per-reader descriptors and runs"
  for bb in build-old "$B"; do
    echo "== F $bb: drop, ferry load --path ring (cold), then x2 hot, then the folios"
    drop; "$bb"/ferry load --json --path ring $F | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["files"][0]; print("cold fill: %.2f GB/s" % f["gbps"])'
    for i in 1 2; do "$bb"/ferry load --json --path ring $F | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["files"][0]; print("hot: %.2f GB/s" % f["gbps"])'; done
    python3 bench/archive/folio_sizes.py $F
  done
  for t in 1 8; do
    echo "== F drop, compare_load.warm_cache(threads=$t), ferry load --path ring x2, folios"; drop
    python3 -c "import sys; sys.path.insert(0,'bench'); import compare_load as c; print('warm %.2f s' % c.warm_cache('$F', threads=$t))"
    for i in 1 2; do fload --path ring; done
    python3 bench/archive/folio_sizes.py $F
  done
  ;;
G)
  echo "=== G: the final build: correctness on cuda:0, the Python GPU tests, a cold ring fill"
  "$B"/tests/unit/test_cuda_nodev | tail -1
  python3 tests/data/gen_golden.py /tmp/golden >/dev/null
  python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 | tail -1
  drop; "$B"/ferry load --path ring --verify $F | head -1
  for i in 1 2; do fload --path ring; done
  python3 bench/archive/folio_sizes.py $F
  [ -f /tmp/big.safetensors ] || python3 scripts/make_sample.py /tmp/big.safetensors --blocks 24 --hidden 2560 --bf16-only >/dev/null
  FERRY_LIBRARY=$PWD/$B/libferry.so timeout 300 python3 tests/gpu/test_torch_gpu.py --big /tmp/big.safetensors --ferry "$B"/ferry 2>&1 | tee "$OUT"/torch-gpu-final.log | grep -v "^PASS"
  ;;
E)
  echo "=== E: bench/compare_load.py"
  timeout 460 python3 bench/compare_load.py --ferry "$B"/ferry --file $F --rounds 2 --make --budget-seconds 420 --out "$OUT"/compare.json 2>&1 | tail -25
  ;;
C)
  echo "=== C: bench/archive/gpu_issue4.sh"
  timeout 300 bash bench/archive/gpu_issue4.sh "$B" "$OUT"
  ;;
esac; done
