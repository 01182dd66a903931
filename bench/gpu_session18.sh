#!/usr/bin/env bash
# The eighteenth session's GPU measurements (bench/RESULTS.md, "Eighteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session18.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried, with fastsafetensors' and InstantTensor's wheels in .whl. Files are
# compare_load.py's, made in /tmp/cmp. Parts:
#   main  tests/gpu/test_torch_gpu.py; then, hot, 10 GB:
#         - bench_ring's gang mode beside its ring, 2 rounds alternated (4 MiB
#           reads, one copy per slot of GANG pieces: does a larger copy lift the
#           ring's steady-state ceiling?);
#         - ferry CLI, ferry.torch with the block reserved on a thread beside the
#           tensor table (reserve) and after it (late), 6 rounds alternated;
#         the 26 MB file, CLI and ferry.torch, 3 rounds; the 10 GB file cold,
#         ferry (auto) against fastsafetensors 0.5 nogds, 4 rounds alternated;
#         pinned copy limit at the start and the end
#   second bench_ring again, 4 rounds alternated: the ring's default (12 x 2 x 4
#         MiB) and its 2 MiB pieces (the pool of gang8's size, 48 MiB) beside
#         gang8 (2 MiB reads, 16 MiB copies) and gang4 (4 MiB reads, 16 MiB
#         copies): which of copy size and pool size moves the ceiling; then the
#         CLI and ferry.torch hot, 4 rounds alternated; then compare_load's
#         fresh /dev/shm copies, ferry CLI / ferry.torch / InstantTensor MMAP
#         (every tensor verified), 2 rounds
#   (its gather part, written here but never run for want of device time, ran
#   in the nineteenth session as bench/gpu_session19.sh gather, with more
#   beside it)
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out18}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
. bench/gpu_common.sh  # setup, limit, drop, cli, py, fsafe
setup
R() { build-gpu/bench_ring "$@" 2>&1 | tail -1; }
case "$PART" in
main)
  timeout 120 python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -4 | tee "$OUT/tests.txt"
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" $D/small.safetensors >/dev/null
  for r in 1 2; do
    echo "r$r ring 12x2x4M: $(R "$F" ring 12 2 4096 3)"
    echo "r$r gang4 12x2x4M (6 slots of 16M): $(GANG=4 R "$F" gang 12 2 4096 3)"
    echo "r$r gang2 12x2x4M (12 slots of 8M): $(GANG=2 R "$F" gang 12 2 4096 3)"
    echo "r$r gang4 12x4x4M (12 slots of 16M): $(GANG=4 R "$F" gang 12 4 4096 3)"
    echo "r$r gang4 16x2x4M (8 slots of 16M): $(GANG=4 R "$F" gang 16 2 4096 3)"
    echo "r$r gang8 12x2x2M (3 slots of 16M): $(GANG=8 R "$F" gang 12 2 2048 3)"
    echo "r$r dma 12x2x16M (copies alone): $(R "$F" dma 12 2 16384 3)"
  done 2>&1 | tee "$OUT/gang.txt"
  for r in 1 2 3 4 5 6; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py reserve r$r: $(py reserve "$F")"
    echo "hot py late r$r: $(py late "$F")"
  done 2>&1 | tee "$OUT/pyhot.txt"
  for r in 1 2 3; do
    echo "small cli r$r: $(cli $D/small.safetensors --device cuda:0)"
    echo "small py r$r: $(py reserve $D/small.safetensors)"
  done 2>&1 | tee "$OUT/pysmall.txt"
  for r in 1 2 3 4; do
    drop; echo "cold auto r$r: $(cli "$F" --device cuda:0)"
    drop; echo "cold fsafe r$r: $(fsafe "$F")"
  done 2>&1 | tee "$OUT/cold.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
second)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" >/dev/null
  for r in 1 2 3 4; do
    echo "r$r ring 12x2x4M: $(R "$F" ring 12 2 4096 4)"
    echo "r$r gang8 12x2x2M (3 slots of 16M): $(GANG=8 R "$F" gang 12 2 2048 4)"
    echo "r$r ring 12x2x2M (48M pool): $(R "$F" ring 12 2 2048 4)"
    echo "r$r gang4 12x2x4M (6 slots of 16M): $(GANG=4 R "$F" gang 12 2 4096 4)"
  done 2>&1 | tee "$OUT/gang2.txt"
  for r in 1 2 3 4; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py reserve r$r: $(py reserve "$F")"
  done 2>&1 | tee "$OUT/pyhot2.txt"
  PYTHONPATH=/tmp/site timeout 200 $CMP --workloads w10g --plan 'w10g:tmpfs' --methods ferry_auto,ferry_py,it_mmap \
    --limit-gb 4 --rounds 2 --budget-seconds 190 --out "$OUT/cmp-tmpfs.json" 2>&1 | tail -12
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "usage: $0 main|second OUT" >&2; exit 2 ;;
esac
