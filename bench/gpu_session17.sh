#!/usr/bin/env bash
# The seventeenth session's GPU measurements (bench/RESULTS.md, "Seventeenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session17.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried, with fastsafetensors' and InstantTensor's wheels in .whl (installed
# into /tmp/site). Files are compare_load.py's, made in /tmp/cmp. Parts:
#   probe  bench_ring's hybrid mode beside its ring (can copies straight from
#          page-locked page-cache pages, registered piece by piece on a helper
#          thread, take the tail of the file while the CPU ring takes the head,
#          past the ring's ceiling?): hot, 2 rounds alternated, fresh processes;
#          registration pieces of 16-256 MiB (the driver serialises its calls:
#          a long registration holds up the ring's copy calls); then the first pass over a fresh /dev/shm copy, 2 rounds; then the 10
#          GB file cold, ferry's direct path with its default shape and two
#          smaller-read shapes beside fastsafetensors 0.5, 3 rounds alternated.
#          The 'ferry cli tail' lines ran ferry load --register-tail (commit
#          ec552dd: the same registered tail inside ferry's ring path), which
#          was reverted after this run (slower everywhere, bench/RESULTS.md);
#          on later trees those lines fail with an unknown option
#   cold   the new direct default (8 readers of 1 MiB reads, through auto, which
#          reads into its ring pinned ahead) against the old shape asked for
#          explicitly and fastsafetensors 0.5, 4 rounds alternated; compare_load's
#          cold run (every tensor verified) for ferry CLI / ferry.torch /
#          fastsafetensors; the GPU tests (run_loads.py, every path)
#   pyprof where ferry.torch.load_file's time goes beside the CLI's (open, the
#          tensor table, the ring's pinning thread and the wait for it): 10 GB
#          hot, 5 rounds alternated; the 26 MB file, 3 rounds
#   final  tests/gpu/test_torch_gpu.py, then pyprof's hot rounds (4) on the
#          binding that reserved its block on a thread beside the table (commit
#          c9c3119; not run: no device time was left to start a machine, so
#          that binding change was taken back out, bench/RESULTS.md)
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out17}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
SHM=/dev/shm/ferry17
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so PYTHONPATH=$PWD/python
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --dir $D"
. bench/gpu_common.sh  # limit, drop, cli, py, fsafe
R() { build-gpu/bench_ring "$@" 2>&1 | tail -1; }
case "$PART" in
probe)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" >/dev/null
  for r in 1 2; do
    echo "r$r ring 12x2x4M: $(R "$F" ring 12 2 4096 3)"
    echo "r$r hybrid 0.30/16M: $(HYBRID_FRAC=0.30 REG_MIB=16 R "$F" hybrid 12 2 4096 3)"
    echo "r$r hybrid 0.30/64M: $(HYBRID_FRAC=0.30 REG_MIB=64 R "$F" hybrid 12 2 4096 3)"
    echo "r$r hybrid 0.30/256M: $(HYBRID_FRAC=0.30 R "$F" hybrid 12 2 4096 3)"
    echo "r$r hybrid 0.15/64M: $(HYBRID_FRAC=0.15 REG_MIB=64 R "$F" hybrid 12 2 4096 3)"
    echo "r$r hybrid 0.45/64M: $(HYBRID_FRAC=0.45 REG_MIB=64 R "$F" hybrid 12 2 4096 3)"
    echo "r$r ring 12x4x4M: $(R "$F" ring 12 4 4096 3)"
    echo "r$r hybrid 0.30/64M 12x4: $(HYBRID_FRAC=0.30 REG_MIB=64 R "$F" hybrid 12 4 4096 3)"
    echo "r$r ferry cli: $(cli "$F" --device cuda:0 --path ring)"
    echo "r$r ferry cli tail 30: $(cli "$F" --device cuda:0 --path ring --register-tail 30)"
    echo "r$r ferry cli tail 50: $(cli "$F" --device cuda:0 --path ring --register-tail 50)"
    echo "r$r ferry cli tail 30/16M: $(cli "$F" --device cuda:0 --path ring --register-tail 30 --register-tail-piece 16MiB)"
  done 2>&1 | tee "$OUT/hybrid-hot.txt"
  mkdir -p $SHM
  for r in 1 2; do
    for m in "ring:0" "hybrid:0.30" "hybrid:0.45"; do
      cp "$F" $SHM/x.safetensors
      echo "r$r tmpfs ${m}: $(HYBRID_FRAC=${m#*:} REG_MIB=64 R $SHM/x.safetensors ${m%%:*} 12 2 4096 1)"
      rm -f $SHM/x.safetensors
    done
    cp "$F" $SHM/x.safetensors
    echo "r$r tmpfs ferry cli: $(cli $SHM/x.safetensors --device cuda:0)"
    rm -f $SHM/x.safetensors
    cp "$F" $SHM/x.safetensors
    echo "r$r tmpfs ferry cli tail 30: $(cli $SHM/x.safetensors --device cuda:0 --register-tail 30)"
    rm -f $SHM/x.safetensors
  done 2>&1 | tee "$OUT/hybrid-tmpfs.txt"
  for r in 1 2 3; do
    for cfg in "" "--threads 16 --buffer-size 512KiB --buffers 32" "--threads 8 --buffer-size 1MiB --buffers 16"; do
      drop; echo "cold direct [$cfg] r$r: $(cli "$F" --device cuda:0 --path direct $cfg)"
    done
    drop; echo "cold fsafe r$r: $(fsafe "$F")"
  done 2>&1 | tee "$OUT/cold.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
cold)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  for r in 1 2 3 4; do
    drop; echo "cold auto (new default) r$r: $(cli "$F" --device cuda:0)"
    drop; echo "cold direct [12x4MiBx24, the old default] r$r: $(cli "$F" --device cuda:0 --path direct --threads 12 --buffer-size 4MiB --buffers 24)"
    drop; echo "cold fsafe r$r: $(fsafe "$F")"
  done 2>&1 | tee "$OUT/cold2.txt"
  PYTHONPATH=/tmp/site timeout 170 $CMP --workloads w10g --plan 'w10g:cold' --methods ferry_auto,ferry_py,fsafe \
    --limit-gb 4 --rounds 2 --budget-seconds 160 --out "$OUT/cmp-cold.json" 2>&1 | tail -8
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    timeout 120 python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register,direct | tail -2; } 2>&1 | tee "$OUT/tests.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
pyprof)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" $D/small.safetensors >/dev/null
  for r in 1 2 3 4 5; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py r$r: $(py reserve "$F")"
  done 2>&1 | tee "$OUT/pyprof-hot.txt"
  for r in 1 2 3; do
    echo "small cli r$r: $(cli $D/small.safetensors --device cuda:0)"
    echo "small py r$r: $(py reserve $D/small.safetensors)"
  done 2>&1 | tee "$OUT/pyprof-small.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
final)
  timeout 100 python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -4 | tee "$OUT/tests.txt"
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" >/dev/null
  for r in 1 2 3 4; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py r$r: $(py reserve "$F")"
  done 2>&1 | tee "$OUT/pyprof-hot.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "usage: $0 probe|cold|pyprof|final OUT" >&2; exit 2 ;;
esac
