#!/usr/bin/env bash
# The nineteenth session's GPU measurements (bench/RESULTS.md, "Nineteenth
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session19.sh PART OUT
# build-gpu is this tree's Release build, carried with the peers' wheels in
# .whl; files are compare_load.py's, made in /tmp/cmp. Parts:
#   gather  ferry's ring with gathered copies (--gather-copies: four 4 MiB
#           buffers' reads in one copy) against one copy per buffer (the
#           default), everything in one call:
#           - the GPU load tests (run_loads.py) and a verified gathered load;
#           - 10 GB hot first loads in fresh processes, CLI and ferry.torch both
#             ways, and ferry.torch's probe with every tensor a view of one
#             block laid out as the file (profile_py_load.py --variant
#             oneblock: the CLI's copies), 5 rounds alternated;
#           - fresh /dev/shm copies, CLI both ways, 3 rounds;
#           - --repeat 3 (the steady rate in one process), 2 rounds;
#           - compare_load's fresh /dev/shm copies: ferry auto, ferry gathered,
#             InstantTensor MMAP, every tensor verified, 2 rounds;
#           - the register path's first and kept loads (--repeat 2), 2 rounds;
#           pinned copy limit at the start and the end
#   ab      the Python call against the CLI, 10 GB hot, 8 rounds alternated:
#           the CLI, ferry.torch (reserve), the oneblock probe, and the probe
#           with gathered copies (does gathering's loss in the binding come
#           from its separate allocations?); the 26 MB file, 3 rounds;
#           pinned copy limit at the start and the end
#   store   the final tree's store cycles (bench_store: RAM cycles with the
#           pool pinned on demand and pinned ahead) and model swaps (bench_swap,
#           6 swaps, from the page cache and from pinned RAM)
#   why     where gathered copies lose: the oneblock probe gathered against
#           oneblock_small (tensors under 1 MiB from PyTorch's small pool)
#           gathered and not, 4 rounds; fresh /dev/shm copies through the
#           oneblock probe, per buffer / gathered, out of the mapping / with
#           pread, 2 rounds
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out19}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
. bench/gpu_common.sh  # setup, limit, drop, cli, py, fsafe
setup
case "$PART" in
gather)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    timeout 100 python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,direct | tail -2; } 2>&1 | tee "$OUT/tests.txt"
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" >/dev/null
  echo "verify gathered: $(build-gpu/ferry load --gather-copies --verify "$F" 2>&1 | tail -2 | tr '\n' ' ')" | tee "$OUT/hot.txt"
  for r in 1 2 3 4 5; do
    echo "hot cli gathered r$r: $(cli "$F" --device cuda:0 --gather-copies)"
    echo "hot cli each r$r: $(cli "$F" --device cuda:0)"
    echo "hot py gathered r$r: $(py reserve "$F" --gather)"
    echo "hot py each r$r: $(py reserve "$F")"
    echo "hot py oneblock r$r: $(py oneblock "$F")"
  done 2>&1 | tee -a "$OUT/hot.txt"
  mkdir -p /dev/shm/f19
  for r in 1 2 3; do
    for v in "gathered:--gather-copies" "each:"; do
      cp "$F" /dev/shm/f19/x.safetensors
      echo "tmpfs cli ${v%%:*} r$r: $(cli /dev/shm/f19/x.safetensors --device cuda:0 ${v#*:})"
      rm -f /dev/shm/f19/x.safetensors
    done
  done 2>&1 | tee "$OUT/tmpfs.txt"
  for r in 1 2; do
    echo "repeat3 gathered r$r: $(cli "$F" --device cuda:0 --path ring --repeat 3 --gather-copies)"
    echo "repeat3 each r$r: $(cli "$F" --device cuda:0 --path ring --repeat 3)"
  done 2>&1 | tee -a "$OUT/hot.txt"
  PYTHONPATH=/tmp/site timeout 170 $CMP --workloads w10g --plan 'w10g:tmpfs' --methods ferry_auto,ferry_gather,it_mmap \
    --limit-gb 4 --rounds 2 --budget-seconds 160 --out "$OUT/cmp-tmpfs.json" 2>&1 | tail -10 | tee "$OUT/cmp-tmpfs.txt"
  for r in 1 2; do
    echo "register r$r: $(cli "$F" --device cuda:0 --path register --repeat 2)"
  done 2>&1 | tee "$OUT/register.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
ab)
  PYTHONPATH=/tmp/site $CMP --workloads w10g,small --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" $D/small.safetensors >/dev/null
  for r in 1 2 3 4 5 6 7 8; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0)"
    echo "hot py reserve r$r: $(py reserve "$F")"
    echo "hot py oneblock r$r: $(py oneblock "$F")"
    echo "hot py oneblock gathered r$r: $(py oneblock "$F" --gather)"
  done 2>&1 | tee "$OUT/ab.txt"
  for r in 1 2 3; do
    echo "small cli r$r: $(cli $D/small.safetensors --device cuda:0)"
    echo "small py r$r: $(py reserve $D/small.safetensors)"
    echo "small py oneblock r$r: $(py oneblock $D/small.safetensors)"
  done 2>&1 | tee "$OUT/small.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
store)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  mkdir -p /var/tmp/spill19
  timeout 200 build-gpu/bench_store "$F" /var/tmp/spill19 cuda:0 2>&1 | tee "$OUT/store.jsonl" | cut -c1-220
  timeout 120 build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl" | cut -c1-220
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
why)
  PYTHONPATH=/tmp/site $CMP --workloads w10g --make --make-only --out "$OUT/make.json" 2>&1 | tail -1
  echo "limit start: $(limit)" | tee "$OUT/limits.txt"
  cat "$F" >/dev/null
  for r in 1 2 3 4; do
    echo "hot oneblock gathered r$r: $(py oneblock "$F" --gather)"
    echo "hot oneblock_small gathered r$r: $(py oneblock_small "$F" --gather)"
    echo "hot oneblock_small r$r: $(py oneblock_small "$F")"
  done 2>&1 | tee "$OUT/why-hot.txt"
  mkdir -p /dev/shm/f19
  for r in 1 2; do
    for v in "each:" "gathered:--gather" "each_pread:--pread" "gathered_pread:--gather --pread"; do
      cp "$F" /dev/shm/f19/x.safetensors
      echo "tmpfs oneblock ${v%%:*} r$r: $(py oneblock /dev/shm/f19/x.safetensors ${v#*:})"
      rm -f /dev/shm/f19/x.safetensors
    done
  done 2>&1 | tee "$OUT/why-tmpfs.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits.txt"
  ;;
*) echo "usage: $0 gather|ab|store|why OUT" >&2; exit 2 ;;
esac
