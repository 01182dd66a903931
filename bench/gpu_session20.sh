#!/usr/bin/env bash
# The twentieth session's GPU measurements (bench/RESULTS.md, "Twentieth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session20.sh PART OUT
# build-gpu is this tree's Release build, carried (no peer wheels: only
# ferry runs here, and setup's pip finds no .whl and says so); files are
# compare_load.py's, made in /tmp/cmp. Parts:
#   pipe    ferry.torch's pipelined allocation (files of many small tensors
#           allocated and loaded in runs, each loaded while the next is
#           allocated) against the binding without it (profile_py_load.py
#           --variant nopipe) and the CLI, in one call:
#           - the binding's GPU tests (tests/gpu/test_torch_gpu.py);
#           - the 25 MB file (40 tensors), 6 rounds alternated, hot: the CLI,
#             the binding (5 runs), in 2 and 3 runs (--pieces), not pipelined;
#           - the LoRA-like file (3000 tensors, 0.33 GB), 4 rounds, hot: the
#             CLI, the binding (8 runs), in 3 runs, not pipelined;
#           - what a fresh process's first allocations cost (alloc_probe.py:
#             cuMemAlloc, one torch.empty, the 25 MB file's 40, LoRA's 3000),
#             3 rounds;
#           - compare_load's verified runs of ferry's CLI and ferry.torch on
#             both files, 2 rounds;
#           - the 10 GB file (not pipelined: 19 MB a tensor on average), the
#             CLI against ferry.torch, 10 rounds alternated;
#           pinned copy limit at the start and the end. It ran on the tree of
#           commit 41b0f34 (the pipelined binding, reverted after it; its
#           --variant nopipe and --pieces are gone from profile_py_load.py with
#           it). Its 10 GB rounds were not hot: compare_load's limits had
#           emptied the page cache, and auto read the file with O_DIRECT; its
#           small.txt and tests.txt did not come back (the device tool returns
#           at most 8 files), hence final's single log.
#   final   the final tree: the binding's GPU tests (the library is the
#           nineteenth session's, whose GPU load tests passed then);
#           the 25 MB file, the CLI against ferry.torch, 6 rounds alternated;
#           the 10 GB file hot (read into the page cache right before), the CLI
#           against ferry.torch, 8 rounds alternated; everything in one log
#           (final.txt) and the limits at the start and the end
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out20}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
. bench/gpu_common.sh  # setup, limit, drop, cli, py, fsafe
setup
case "$PART" in
pipe)
  PYTHONPATH=/tmp/site $CMP --workloads small,lora,w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  timeout 150 env PYTHONPATH=/tmp/site:$PWD/python python3 tests/gpu/test_torch_gpu.py 2>&1 | tail -25 | tee "$OUT/tests.txt"
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  S=$D/small.safetensors L=$D/lora.safetensors
  cat "$S" "$L" "$F" >/dev/null
  for r in 1 2 3 4 5 6; do
    echo "small cli r$r: $(cli "$S" --device cuda:0)"
    echo "small py r$r: $(py reserve "$S")"
    echo "small py nopipe r$r: $(py nopipe "$S")"
    echo "small py pieces2 r$r: $(py reserve "$S" --pieces 2)"
    echo "small py pieces3 r$r: $(py reserve "$S" --pieces 3)"
  done 2>&1 | tee "$OUT/small.txt"
  for r in 1 2 3 4; do
    echo "lora cli r$r: $(cli "$L" --device cuda:0)"
    echo "lora py r$r: $(py reserve "$L")"
    echo "lora py nopipe r$r: $(py nopipe "$L")"
    echo "lora py pieces3 r$r: $(py reserve "$L" --pieces 3)"
  done 2>&1 | tee "$OUT/lora.txt"
  for r in 1 2 3; do
    for m in driver torch1 small40 lora3000; do
      echo "alloc r$r: $(python3 bench/alloc_probe.py $m)"
    done
  done 2>&1 | tee "$OUT/alloc.txt"
  PYTHONPATH=/tmp/site timeout 150 $CMP --workloads small,lora --plan 'small:hot;lora:hot' --methods ferry_auto,ferry_py \
    --rounds 2 --budget-seconds 140 --out "$OUT/cmp.json" 2>&1 | tail -12 | tee "$OUT/cmp.txt"
  for r in 1 2 3 4 5 6 7 8 9 10; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py r$r: $(py reserve "$F")"
  done 2>&1 | tee "$OUT/ab.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
final)
  PYTHONPATH=/tmp/site $CMP --workloads small,w10g --make --make-only --out "$OUT/make.json" >/dev/null 2>&1
  S=$D/small.safetensors
  {
    echo "limit start: $(limit)"
    timeout 150 env PYTHONPATH=/tmp/site:$PWD/python python3 tests/gpu/test_torch_gpu.py 2>&1 | grep -E "FAIL|passed"
    cat "$S" "$F" >/dev/null
    for r in 1 2 3 4 5 6; do
      echo "small cli r$r: $(cli "$S" --device cuda:0)"
      echo "small py r$r: $(py reserve "$S")"
    done
    cat "$F" >/dev/null
    for r in 1 2 3 4 5 6 7 8; do
      echo "hot cli r$r: $(cli "$F" --device cuda:0)"
      echo "hot py r$r: $(py reserve "$F")"
    done
    echo "limit end: $(limit)"
  } 2>&1 | tee "$OUT/final.txt"
  ;;
*) echo "usage: $0 pipe|final OUT" >&2; exit 2 ;;
esac
