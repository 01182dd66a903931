#!/usr/bin/env bash
# The twelfth session's GPU measurements (bench/RESULTS.md, "Twelfth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session12.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried. Files are made in /tmp/cmp by bench/compare_load.py --make-only
# (w10g: 10.43 GB, 540 BF16 tensors; small: 26 MB). Parts:
#   diag   where a load's time goes: the CLI's --json set-up fields (device
#          allocation, ring pinning) for the 26 MB file and the 10 GB file in
#          fresh processes; a fresh /dev/shm copy loaded three times in one
#          process (CLI) and twice (ferry.torch, pread and mapping); the CLI
#          and ferry.torch alternated, hot; register --repeat 3. (Run on the tree
#          of 4ddecf2, where ferry.torch read tmpfs with pread and
#          profile_py_load.py's --map asked for the mapping; since then the
#          mapping is the default and --pread asks for pread.)
#   ab     after the changes diag led to (pageable small loads, mincore in
#          runs, ferry.torch's mapped tmpfs reads): the 26 MB file with auto
#          (pageable) and --path ring alternated in fresh processes, and through
#          ferry.torch; the 10 GB file hot (CLI and ferry.torch alternated),
#          from fresh tmpfs copies, with --path pageable, and registered; then
#          every peer on the 26 MB file (bench/compare_load.py, hot and tmpfs;
#          run `peers` of bench/gpu_session10.sh first)
#   cmp    the 10 GB file hot and from fresh tmpfs copies, ferry beside
#          InstantTensor (MMAP and buffered) and safetensors (after `peers`)
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out12}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
S=$D/small.safetensors
SHM=/dev/shm/ferry-s12
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --dir $D"
mk() { # WORKLOADS
  $CMP --workloads "$1" --make --make-only --out "$OUT/make-$1.json" 2>&1 | tail -2
}
cli() { # FILE [args]: one fresh ferry load --json; each load's GB/s, ms and set-up ms
  local f=$1; shift
  build-gpu/ferry load --device cuda:0 --json "$@" "$f" | python3 -c '
import json,sys
d=json.load(sys.stdin)
L=d["files"]
r=lambda k: [round(l[k]*1e3, 2) for l in L]
print(json.dumps({"gbps": [round(l["gbps"], 2) for l in L], "ms": r("seconds"), "setup_ms": r("setup_seconds"),
                  "alloc_ms": r("alloc_seconds"), "pin_ms": r("pin_seconds"), "path": L[0]["path_used"],
                  "reg": [l.get("registration", "") for l in L], "rss_mib": d["peak_rss_bytes"] >> 20}))'
}
py() { # FILE [args]: bench/profile_py_load.py in a fresh process, the fields that matter
  python3 bench/profile_py_load.py "$@" | python3 -c '
import json,sys
d=json.load(sys.stdin)
s=d["ferry_stats"]
print(json.dumps({"gbps": round(d["gbps"], 2), "repeats": d["repeats"], "ms": round(d["seconds"]*1e3, 2),
                  "ferry_ms": round(d["ferry_seconds"]*1e3, 2), "setup_ms": round(s["setup_seconds"]*1e3, 2),
                  "pin_ms": round(s["pin_seconds"]*1e3, 2), "phases_ms": {k: round(v*1e3, 2) for k, v in d["phases"].items()},
                  "route": d["route"], "pread": d["pread"]}))'
}
limit() { build-gpu/bench_pinrate 4 64 2 2>&1 | grep hostalloc | head -1; }
fresh() { rm -rf $SHM; mkdir -p $SHM; cp "$F" $SHM/x.safetensors; }
case "$PART" in
diag)
  mk w10g,small
  cat "$F" "$S" >/dev/null
  echo "limit start: $(limit)"
  for r in 1 2 3 4 5; do echo "small r$r: $(cli "$S" --repeat 3)"; done 2>&1 | tee "$OUT/diag-small.txt"
  for r in 1 2 3; do
    echo "hot cli r$r: $(cli "$F" --repeat 2)"
    echo "hot py r$r: $(py "$F" --repeat 2)"
  done 2>&1 | tee "$OUT/diag-hot.txt"
  echo "limit mid: $(limit)"
  for r in 1 2; do
    fresh; echo "tmpfs cli r$r: $(cli $SHM/x.safetensors --repeat 3)"
    fresh; echo "tmpfs py pread r$r: $(py $SHM/x.safetensors --repeat 2 --pread)"
    fresh; echo "tmpfs py map r$r: $(py $SHM/x.safetensors --repeat 2)"
  done 2>&1 | tee "$OUT/diag-tmpfs.txt"
  rm -rf $SHM
  echo "register: $(cli "$F" --path register --repeat 3)" 2>&1 | tee "$OUT/diag-reg.txt"
  echo "limit end: $(limit)"
  ;;
ab)
  { echo "== pageable, auto and ring on every valid golden file, verified, cuda:0"
    python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths pageable,auto,ring | tail -3
    echo "== tests/gpu/test_torch_gpu.py"
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -4; } 2>&1 | tee "$OUT/ab-tests.txt"
  mk w10g,small
  cat "$F" "$S" >/dev/null
  echo "limit start: $(limit)"
  for r in 1 2 3 4 5; do
    echo "small auto r$r: $(cli "$S" --repeat 3)"
    echo "small ring r$r: $(cli "$S" --repeat 3 --path ring)"
  done 2>&1 | tee "$OUT/ab-small.txt"
  for r in 1 2 3; do echo "small py r$r: $(py "$S" --repeat 3)"; done 2>&1 | tee -a "$OUT/ab-small.txt"
  # is the first pinning's cost fixed or per byte? 8 MiB, 28 MiB (above), 192 MiB rings
  echo "pin 2 buffers: $(cli "$S" --path ring --buffers 2)" 2>&1 | tee -a "$OUT/ab-small.txt"
  echo "pin 48 buffers: $(cli "$S" --path ring --buffers 48)" 2>&1 | tee -a "$OUT/ab-small.txt"
  for r in 1 2 3; do
    echo "hot cli r$r: $(cli "$F" --repeat 2)"
    echo "hot py r$r: $(py "$F" --repeat 2)"
  done 2>&1 | tee "$OUT/ab-hot.txt"
  echo "hot pageable: $(cli "$F" --path pageable)" 2>&1 | tee -a "$OUT/ab-hot.txt"
  echo "limit mid: $(limit)"
  for r in 1 2; do
    fresh; echo "tmpfs cli r$r: $(cli $SHM/x.safetensors --repeat 2)"
    fresh; echo "tmpfs py r$r: $(py $SHM/x.safetensors --repeat 2)"
  done 2>&1 | tee "$OUT/ab-tmpfs.txt"
  rm -rf $SHM
  echo "register: $(cli "$F" --path register --repeat 3)" 2>&1 | tee "$OUT/ab-reg.txt"
  echo "limit end: $(limit)"
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} $CMP --st09-path /tmp/st09 --workloads small --plan 'small:hot,tmpfs' \
    --methods ferry_auto,ferry_py,st_cuda,st09,it,it_mmap,fsafe,runai --rounds ${ROUNDS:-2} \
    --budget-seconds ${BUDGET:-150} --out "$OUT/ab-cmp-small.json" 2>&1 | tail -30
  ;;
cmp)  # the 10 GB file hot and from fresh tmpfs copies: ferry beside InstantTensor (both backends) and safetensors
  mk w10g
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} $CMP --st09-path /tmp/st09 --workloads w10g --plan 'w10g:hot,tmpfs' \
    --methods ${METHODS:-ferry_auto,ferry_py,it_mmap,it_buffered,st_cuda} --rounds ${ROUNDS:-2} \
    --budget-seconds ${BUDGET:-360} --out "$OUT/cmp-w10g.json" 2>&1 | tail -25
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
