#!/usr/bin/env bash
# The thirteenth session's GPU measurements (bench/RESULTS.md, "Thirteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session13.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried. The file is compare_load.py's w10g (10.43 GB, 540 BF16 tensors),
# made in /tmp/cmp. Parts:
#   store  bench_store twice in fresh processes (its RAM cycles on demand and
#          with the pool pinned ahead, opts.pinned_reserve), then bench_swap
#          (6 swaps), with the pinned copy limit before and after
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out13}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --dir $D"
mk() { # WORKLOADS
  $CMP --workloads "$1" --make --make-only --out "$OUT/make-$1.json" 2>&1 | tail -2
}
limit() { build-gpu/bench_pinrate 4 64 2 2>&1 | grep hostalloc | head -1; }
case "$PART" in
store)
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  mkdir -p /var/tmp/spill13
  for r in 1 2; do
    build-gpu/bench_store "$F" /var/tmp/spill13 cuda:0 2>&1 | tee "$OUT/store-r$r.jsonl" | cut -c1-160
  done
  build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl" | cut -c1-160
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*)
  echo "gpu_session13.sh: unknown part $PART" >&2
  exit 2
  ;;
esac
