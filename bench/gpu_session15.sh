#!/usr/bin/env bash
# The fifteenth session's GPU measurements (bench/RESULTS.md, "Fifteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session15.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried, with the peers' wheels in .whl and .whl-st09 (installed into
# /tmp/site and /tmp/st09). Files are compare_load.py's, made in /tmp/cmp.
# (The session's first call ran bench/gpu_session14.sh next: s15a-*.) Parts:
#   a   the 26 MB file: bench/pageable_probe.py (one thread copying pageable
#       from the mapping, as ferry's pageable path does, against 2 / 4 threads
#       and a small pinned ring), the CLI, and ferry.torch with its allocation
#       reserved (now for loads over 10 MiB) and not, alternated, 3 rounds; the
#       10 GB file hot, CLI and ferry.torch alternated, 5 rounds; the 10 GB
#       file cold, ferry / fastsafetensors / Run:ai, 3 rounds, the O_DIRECT
#       limit now the faster of 4 and 16 threads
#   b   the 10 GB file from fresh /dev/shm copies, CLI / ferry.torch /
#       InstantTensor MMAP, 3 rounds; bench_swap (model swaps through the store)
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out15}
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
a)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  cat "$F" "$S" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
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
  PYTHONPATH=/tmp/site timeout 300 $CMP --workloads w10g --plan 'w10g:cold' --methods ferry_auto,fsafe,runai \
    --direct-threads 4,16 --limit-gb 4 --rounds 3 --budget-seconds 280 --out "$OUT/cmp-cold.json" 2>&1 | tail -8
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
b)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  PYTHONPATH=/tmp/site timeout 200 $CMP --workloads w10g --plan 'w10g:tmpfs' --methods ferry_auto,ferry_py,it_mmap \
    --rounds 3 --budget-seconds 180 --out "$OUT/cmp-tmpfs.json" 2>&1 | tail -8
  build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl" | cut -c1-160
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "usage: $0 a|b OUT" >&2; exit 2 ;;
esac
