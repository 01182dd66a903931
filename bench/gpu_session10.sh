#!/usr/bin/env bash
# The tenth session's GPU measurements (bench/RESULTS.md, "Tenth session"),
# run on the GPU machine from the repository root:
#   bench/gpu_session10.sh PART OUT
# A = build-gpu (this tree, Release), B = build-gpu-b (the session's starting
# commit 85fc1c2, with its python/ copied into build-gpu-b/python), both built
# on the development machine and carried. Parts:
#   first   fresh-process first loads: CLI A/B, ferry.torch.load_file's phases
#           (bench/profile_py_load.py: reserve / noreserve / owner_ferry), A/B
#   tmpfs   a fresh /dev/shm copy before each load: CLI A (ring from the
#           mapping) against B (pread), alternated
#   swap    bench_swap (issue 13 item 4) and bench_store's pinned cycles
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out10}
mkdir -p "$OUT"
F=${F:-/tmp/w10g.safetensors}
SHM=/dev/shm/ferry-s10
mk() { [ -f "$F" ] || python3 scripts/make_sample.py "$F" --blocks 44 --hidden 3072 --bf16-only >/dev/null; }
warm() { cat "$F" >/dev/null; }
cli() { # LIB_DIR FILE [args]: one fresh ferry load, its JSON's gbps/seconds/route
  local b=$1 f=$2; shift 2
  "$b"/ferry load --device ${DEV:-cuda:0} --json "$@" "$f" | python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["files"][0]; print(json.dumps({"gbps": round(l["gbps"], 2), "seconds": round(l["seconds"], 4), "path": l["path_used"], "peak_rss_mib": d["peak_rss_bytes"] >> 20}))'
}
case "$PART" in
first)
  mk; warm
  for r in 1 2 3; do
    for b in build-gpu build-gpu-b; do echo -n "cli $b auto: "; cli $b "$F"; done
    for v in reserve noreserve owner_ferry; do
      echo -n "py A $v: "; FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=python python3 bench/profile_py_load.py "$F" --variant $v
    done
    echo -n "py B (start of session): "; FERRY_LIBRARY=$PWD/build-gpu-b/libferry.so PYTHONPATH=build-gpu-b/python python3 bench/profile_py_load.py "$F" --variant noreserve
  done 2>&1 | tee "$OUT/first.txt"
  ;;
tmpfs)
  mk
  mkdir -p $SHM
  for r in 1 2 3; do
    for b in build-gpu build-gpu-b; do
      rm -f $SHM/x.safetensors; cp "$F" $SHM/x.safetensors
      echo -n "tmpfs fresh copy, $b auto: "; cli $b $SHM/x.safetensors
      echo -n "  again (pages touched): "; cli $b $SHM/x.safetensors
    done
    rm -f $SHM/x.safetensors; cp "$F" $SHM/x.safetensors
    echo -n "tmpfs fresh copy, py A: "; FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=python python3 bench/profile_py_load.py $SHM/x.safetensors
  done 2>&1 | tee "$OUT/tmpfs.txt"
  rm -rf $SHM
  ;;
swap)
  mk; warm
  build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl"
  mkdir -p /tmp/spill10
  build-gpu/bench_store "$F" /tmp/spill10 cuda:0 2>&1 | head -9 | tee "$OUT/store.jsonl"
  ;;
peers)  # install the peers' wheels (carried in .whl, .whl-st09) into /tmp/site and /tmp/st09
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/st09 .whl-st09/*.whl
  ;;
cmp1)  # the 10 GB checkpoint cold, hot and tmpfs, and the GGUF file hot, every method
  C="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --st09-path /tmp/st09 --dir /tmp/cmp"
  PYTHONPATH=/tmp/site $C --workloads w10g,gguf,small,lora --make --make-only --out "$OUT/make.json" 2>&1 | tail -5
  PYTHONPATH=/tmp/site $C --workloads w10g,gguf --plan 'w10g:hot,tmpfs,cold;gguf:hot' --rounds 1 --budget-seconds ${BUDGET:-420} --out "$OUT/cmp-w10g.json" 2>&1 | tail -40
  ;;
cmp2)  # the sharded checkpoint, the LoRA-like and the 25 MB file
  C="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --st09-path /tmp/st09 --dir /tmp/cmp"
  PYTHONPATH=/tmp/site $C --workloads sharded --make --make-only --out "$OUT/make2.json" 2>&1 | tail -3
  PYTHONPATH=/tmp/site $C --workloads small,lora,sharded --plan 'small:hot,tmpfs;lora:hot;sharded:hot' --methods ${METHODS:-ferry_auto,ferry_py,st_cuda,st09,it,it_buffered,it_mmap,fsafe,runai} --rounds 1 --budget-seconds ${BUDGET:-400} --out "$OUT/cmp-2.json" 2>&1 | tail -40
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
