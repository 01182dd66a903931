#!/usr/bin/env bash
# The sixteenth session's GPU measurements (bench/RESULTS.md, "Sixteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session16.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried, with the peers' wheels in .whl and .whl-st09 (installed into
# /tmp/site and /tmp/st09). Files are compare_load.py's, made in /tmp/cmp. Parts:
#   sweep  the 10 GB file cold (page cache dropped before each process): ferry's
#          direct path with its default 12 readers of 4 MiB against smaller
#          and more reads (fastsafetensors 0.5's nogds reader keeps 16 threads
#          of 512 KiB O_DIRECT reads), fastsafetensors beside them, 2 rounds
#          alternated; the O_DIRECT read rate of the same shapes (4 GB each);
#          then the 26 MB file (pageable_probe.py, the CLI, ferry.torch with its
#          allocation reserved and not, 3 rounds) and the 10 GB file hot (CLI
#          and ferry.torch alternated, 5 rounds)
#   final  the GPU tests; the 10 GB file cold through compare_load (ferry /
#          fastsafetensors / Run:ai, 3 rounds); from fresh /dev/shm copies (CLI /
#          ferry.torch / InstantTensor MMAP, 3 rounds); bench_swap
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out16}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
S=$D/small.safetensors
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/st09 .whl-st09/*.whl 2>&1 | tail -2
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=$PWD/python
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --st09-path /tmp/st09 --dir $D"
. bench/gpu_common.sh  # limit, drop, cli, py, fsafe
case "$PART" in
sweep)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  for r in 1 2; do
    for cfg in "" "--threads 16 --buffer-size 512KiB --buffers 32" "--threads 16 --buffer-size 1MiB --buffers 32" \
               "--threads 32 --buffer-size 512KiB --buffers 64" "--threads 16 --buffer-size 2MiB --buffers 32" \
               "--threads 8 --buffer-size 1MiB --buffers 16"; do
      drop; echo "cold direct [$cfg] r$r: $(cli "$F" --device cuda:0 --path direct $cfg)"
    done
    drop; echo "cold fsafe r$r: $(fsafe "$F")"
  done 2>&1 | tee "$OUT/cold.txt"
  for shape in 4 16 16x512K 16x1M 32x512K 8x1M 16x2M; do
    drop; python3 -c "
import sys; sys.path.insert(0, 'bench'); import compare_load as c
(k, ch), = c.parse_direct_shapes('$shape')
g, n, e = c.read_rate(['$F'], 4 << 30, True, k, ch)
print('O_DIRECT $shape:', round(g, 3) if g else e, 'GB/s over', n >> 20, 'MiB')"
  done 2>&1 | tee "$OUT/odirect.txt"
  cat "$F" "$S" >/dev/null
  python3 bench/pageable_probe.py "$S" --rounds 3 2>&1 | tee "$OUT/pageable.txt"
  for r in 1 2 3; do
    echo "small cli r$r: $(cli "$S" --device cuda:0)"
    echo "small py reserve r$r: $(py reserve "$S")"
    echo "small py noreserve r$r: $(py noreserve "$S")"
  done 2>&1 | tee "$OUT/small.txt"
  for r in 1 2 3 4 5; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py r$r: $(py reserve "$F")"
  done 2>&1 | tee "$OUT/hot.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
final)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register,direct | tail -2
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -2; } 2>&1 | tee "$OUT/tests.txt"
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  PYTHONPATH=/tmp/site timeout 200 $CMP --workloads w10g --plan 'w10g:cold' --methods ferry_auto,fsafe,runai \
    --limit-gb 4 --rounds 3 --budget-seconds 190 --out "$OUT/cmp-cold.json" 2>&1 | tail -8
  PYTHONPATH=/tmp/site timeout 150 $CMP --workloads w10g --plan 'w10g:tmpfs' --methods ferry_auto,ferry_py,it_mmap \
    --rounds 3 --budget-seconds 140 --out "$OUT/cmp-tmpfs.json" 2>&1 | tail -8
  cat "$F" >/dev/null
  timeout 90 build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl" | cut -c1-160
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "usage: $0 sweep|final OUT" >&2; exit 2 ;;
esac
