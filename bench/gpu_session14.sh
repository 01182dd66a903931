#!/usr/bin/env bash
# The fourteenth session's GPU measurements (bench/RESULTS.md, "Fourteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session14.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried, with the peers' wheels in .whl and .whl-st09 (installed into
# /tmp/site and /tmp/st09 by every part). Files are compare_load.py's, made in
# /tmp/cmp. Parts:
#   p1  bench/reg_probe.py on the 10 GB file hot and on a fresh /dev/shm copy
#       (where a first registered load's time goes); every peer on the 25 MB,
#       LoRA-like and GGUF files, hot (small also tmpfs), 2 rounds
# p2 and p3 ran on commit 6e92403, whose ferry.torch split a large load in two
# and whose bench/profile_py_load.py had the "nosplit" variant; the split was
# measured to gain nothing and reverted (RESULTS.md), so on later trees the
# "py split" and "py nosplit" rows both run the unsplit binding (and "nosplit"
# is refused by profile_py_load.py).
#   p2  the 10 GB file hot: the CLI, ferry.torch (its load split in two) and
#       ferry.torch unsplit, alternated, 5 rounds; reg_probe's concurrent and
#       pipelined steps; the 25 MB file through the CLI and ferry.torch, 2
#       rounds; tests/gpu/test_torch_gpu.py; every peer on the 10 GB file cold
#   next  written at the end of the session and NOT run in it (no device time
#       left): what the session's changes and leads need measured first. The
#       register path's first load (pieces registered on the loading thread)
#       beside reg_probe's plain/pipe/threaded steps; the cold direct path with
#       more bytes in flight beside fastsafetensors; the GPU tests
#   p3  p2's ferry.torch runs again (p2 ran them without python/ on the path);
#       registration on 2 and 4 threads; the peers p2's cold round left out;
#       every peer on the sharded 30 GB checkpoint, hot
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out14}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/st09 .whl-st09/*.whl 2>&1 | tail -2
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=$PWD/python
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --st09-path /tmp/st09 --dir $D"
ALL=ferry_auto,ferry_py,st_cuda,st09,it,it_buffered,it_mmap,fsafe,fsafe_gds,runai
limit() { build-gpu/bench_pinrate 4 64 2 2>&1 | grep hostalloc | head -1; }
cli() { # FILE [args]: one fresh ferry load --json: each load's GB/s, ms, set-up ms
  local f=$1; shift
  build-gpu/ferry load --json "$@" "$f" | python3 -c '
import json,sys
d=json.load(sys.stdin)
L=d["files"]
r=lambda k: [round(l[k]*1e3, 2) for l in L]
print(json.dumps({"gbps": [round(l["gbps"], 2) for l in L], "ms": r("seconds"), "setup_ms": r("setup_seconds"),
                  "path": L[0]["path_used"], "rss_mib": d["peak_rss_bytes"] >> 20, "verified": [l.get("verified") for l in L]}))'
}
py() { # VARIANT FILE: profile_py_load in a fresh process
  python3 bench/profile_py_load.py "$2" --variant "$1" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(json.dumps({"gbps": round(d["gbps"], 2), "ms": round(d["seconds"]*1e3, 2), "route": d["route"],
                "phases_ms": {k: round(v*1e3, 2) for k, v in d["phases"].items()}}))'
}
ab_hot() { # the 10 GB file hot: CLI, ferry.torch split and not (commit 6e92403), alternated, 5 rounds
  for r in 1 2 3 4 5; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py split r$r: $(py reserve "$F")"
    echo "hot py nosplit r$r: $(py nosplit "$F")"
  done 2>&1 | tee "$OUT/ab-hot.txt"
}
small_py() { # the 25 MB file: CLI and ferry.torch, 2 rounds
  local S=$D/small.safetensors
  for r in 1 2; do
    echo "small cli r$r: $(cli "$S" --device cuda:0)"
    echo "small py r$r: $(py reserve "$S")"
  done 2>&1 | tee "$OUT/small-py.txt"
}
case "$PART" in
p1)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small,lora,gguf --make --make-only --out "$OUT/make.json" 2>&1 | tail -2
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  { echo "== hot"; python3 bench/reg_probe.py "$F"
    cp "$F" /dev/shm/w10g.safetensors
    echo "== tmpfs (fresh copy)"; python3 bench/reg_probe.py /dev/shm/w10g.safetensors --steps plain,popN,pipe_pop
    rm -f /dev/shm/w10g.safetensors; } 2>&1 | tee "$OUT/reg.txt"
  PYTHONPATH=/tmp/site timeout 330 $CMP --workloads small,lora,gguf --plan 'small:hot,tmpfs;lora:hot;gguf:hot' \
    --methods $ALL,gguf_py --rounds 2 --budget-seconds 300 --out "$OUT/cmp-small.json" 2>&1 | tail -45
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
p2)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -2
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  ab_hot
  python3 bench/reg_probe.py "$F" --steps halves,overlap,pipe,pipe_pop,plain 2>&1 | tee "$OUT/reg2.txt"
  small_py
  python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -18 | tee "$OUT/tests.txt"
  PYTHONPATH=/tmp/site timeout 170 $CMP --workloads w10g --plan 'w10g:cold' --methods $ALL \
    --rounds 1 --budget-seconds 140 --out "$OUT/cmp-cold.json" 2>&1 | tail -16
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
p3)  # p2's ferry.torch runs again (p2 ran them without python/ on the path), registration on
     # several threads, the peers p2's cold round skipped, the sharded checkpoint
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -2
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  ab_hot
  python3 bench/reg_probe.py "$F" --steps halves,pipeT2,pipeT4,pipe,plain 2>&1 | tee "$OUT/reg3.txt"
  small_py
  PYTHONPATH=/tmp/site timeout 100 $CMP --workloads w10g --plan 'w10g:cold' --methods fsafe,fsafe_gds,runai,ferry_auto \
    --rounds 1 --budget-seconds 90 --out "$OUT/cmp-cold2.json" 2>&1 | tail -9
  PYTHONPATH=/tmp/site $CMP --workloads sharded --make --make-only --out "$OUT/make2.json" 2>&1 | tail -2
  PYTHONPATH=/tmp/site timeout 190 $CMP --workloads sharded --plan 'sharded:hot' --methods $ALL \
    --rounds 1 --budget-seconds 170 --out "$OUT/cmp-sharded.json" 2>&1 | tail -16
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
next)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -2
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register,direct | tail -2
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -2; } 2>&1 | tee "$OUT/tests.txt"
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  for r in 1 2 3; do  # a fresh mapping each process: registration included in the first load
    echo "register r$r: $(cli "$F" --device cuda:0 --path register --repeat 2)"
    echo "ring r$r: $(cli "$F" --device cuda:0)"
  done 2>&1 | tee "$OUT/register.txt"
  python3 bench/reg_probe.py "$F" --steps plain,pipe,halves,pipeT2,pipeT4 2>&1 | tee "$OUT/reg.txt"
  for r in 1 2; do  # cold: the page cache dropped before each (direct reads bypass it anyway)
    for cfg in "" "--threads 16" "--threads 16 --buffer-size 16MiB" "--threads 12 --buffer-size 16MiB --buffers 24"; do
      sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
      echo "cold direct [$cfg] r$r: $(cli "$F" --device cuda:0 --path direct $cfg)"
    done
  done 2>&1 | tee "$OUT/cold.txt"
  PYTHONPATH=/tmp/site timeout 120 $CMP --workloads w10g --plan 'w10g:cold' --methods ferry_auto,fsafe \
    --rounds 2 --budget-seconds 110 --out "$OUT/cmp-cold.json" 2>&1 | tail -6
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
