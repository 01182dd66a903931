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
#   s2     the host's topology (NUMA nodes, the GPU's node); bench_store once
#          (the pinner yielding to transfers); the CLI's --repeat 3 (into the
#          first load's memory) and ferry.torch's, hot, alternated, 3 rounds;
#          the ring's page-cache reads alone (--device cpu, 12 and 16 threads)
#   s3     the GPU tests (tests/gpu/run_loads.py, test_torch_gpu.py,
#          gpu_async_cuda) on this tree; hot loads alternated: the CLI with
#          the default ring and with 16 threads x 32 buffers, and ferry.torch,
#          --repeat 3, 3 rounds; --verify --repeat 2; bench_store's RAM stores
#   s4     see the part below: merged ring copies and ferry.torch's table, A/B
#   s5     the final tree: GPU tests in full, CLI and ferry.torch hot, bench_store twice
#   s6     the final tree beside InstantTensor's MMAP backend, hot and tmpfs, 3 rounds; register
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
cli() { # FILE [args]: one fresh ferry load --json; each load's GB/s, ms, set-up ms, device memory
  local f=$1; shift
  build-gpu/ferry load --json "$@" "$f" | python3 -c '
import json,sys
d=json.load(sys.stdin)
L=d["files"]
r=lambda k: [round(l[k]*1e3, 2) for l in L]
print(json.dumps({"gbps": [round(l["gbps"], 2) for l in L], "ms": r("seconds"), "setup_ms": r("setup_seconds"),
                  "path": L[0]["path_used"], "mem": [l["device_memory"][0] for l in L], "rss_mib": d["peak_rss_bytes"] >> 20,
                  "verified": [l.get("verified") for l in L]}))'
}
py() { # FILE [args]: bench/profile_py_load.py in a fresh process
  python3 bench/profile_py_load.py "$@" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(json.dumps({"gbps": round(d["gbps"], 2), "repeats": d["repeats"], "ms": round(d["seconds"]*1e3, 2),
                  "ferry_ms": round(d["ferry_seconds"]*1e3, 2), "route": d["route"]}))'
}
case "$PART" in
s2)  # the host's topology; bench_store with the yielding pinner; the CLI's --repeat into kept memory
     # beside ferry.torch, hot, alternated; the ring's reads alone (--device cpu)
  mk w10g
  cat "$F" >/dev/null
  { lscpu | grep -E "Model name|Socket|NUMA|^CPU\(s\)|Thread|L3|On-line"
    ls -d /sys/devices/system/node/node* 2>/dev/null
    for n in /sys/devices/system/node/node*; do echo "$n: cpus $(cat $n/cpulist) $(grep MemTotal $n/meminfo)"; done
    for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && echo "nvidia $d numa_node $(cat $d/numa_node) class $(cat $d/class)"; done
    grep -E "Cpus_allowed_list|Mems_allowed_list" /proc/self/status
    nvidia-smi topo -m 2>&1 | head -6; } 2>&1 | tee "$OUT/topo.txt"
  echo "limit start: $(limit)" | tee "$OUT/limits2.txt"
  mkdir -p /var/tmp/spill13
  build-gpu/bench_store "$F" /var/tmp/spill13 cuda:0 2>&1 | head -18 | tee "$OUT/store2.jsonl" | cut -c1-150
  for r in 1 2 3; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0 --repeat 3)"
    echo "hot py r$r: $(py "$F" --repeat 3)"
  done 2>&1 | tee "$OUT/hot2.txt"
  for t in 12 16; do echo "cpu ring reads alone t$t: $(cli "$F" --device cpu --path ring --threads $t --repeat 2)"; done 2>&1 | tee "$OUT/cpu2.txt"
  echo "limit end: $(limit)" | tee -a "$OUT/limits2.txt"
  ;;
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
s3)  # the GPU tests on this tree; the CLI (default ring, and 16 threads x 32 buffers) and
     # ferry.torch alternated, hot, --repeat 3, 3 rounds; bench_store's RAM stores once more
  { echo "== every valid golden file through auto, ring and register, verified, cuda:0"
    python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,register | tail -3
    echo "== tests/gpu/test_torch_gpu.py"
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -4
    echo "== gpu_async_cuda"
    build-gpu/tests/gpu_async_cuda tests/fuzz/corpus/safetensors/all_dtypes.safetensors 2>&1 | tail -2; } 2>&1 | tee "$OUT/tests3.txt"
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits3.txt"
  for r in 1 2 3; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0 --repeat 3)"
    echo "hot cli t16 r$r: $(cli "$F" --device cuda:0 --repeat 3 --threads 16 --buffers 32)"
    echo "hot py r$r: $(py "$F" --repeat 3)"
  done 2>&1 | tee "$OUT/hot3.txt"
  echo "verify --repeat 2: $(cli "$F" --device cuda:0 --repeat 2 --verify)" | tee -a "$OUT/hot3.txt"
  mkdir -p /var/tmp/spill13
  build-gpu/bench_store "$F" /var/tmp/spill13 cuda:0 2>&1 | head -18 | tee "$OUT/store3.jsonl" | cut -c1-150
  echo "limit end: $(limit)" | tee -a "$OUT/limits3.txt"
  ;;
s4)  # A = build-gpu (this tree: the ring's copies merged where pieces continue one another on
     # the device; ferry.torch's tensor table read in one pass), B = build-gpu-b (commit
     # 245bac9, before both; its python/ in build-gpu-b/python). One copy across two adjacent
     # allocations (bench/span_copy.py); the GPU tests on A; hot loads A/B alternated (CLI
     # --repeat 3, ferry.torch --repeat 3 with its phases), 3 rounds; fresh tmpfs copies, CLI
     # A/B and ferry.torch A, 2 rounds; bench_swap and bench_store's RAM stores on A
  python3 bench/span_copy.py 2>&1 | tee "$OUT/span4.txt"
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register | tail -2
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1 | tail -2; } 2>&1 | tee "$OUT/tests4.txt"
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits4.txt"
  pyab() { # PYDIR LIB FILE: profile_py_load with phases
    PYTHONPATH=$1 FERRY_LIBRARY=$2 python3 bench/profile_py_load.py "$3" --repeat 3 | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(json.dumps({"gbps": round(d["gbps"], 2), "repeats": d["repeats"], "ms": round(d["seconds"]*1e3, 2),
                  "ferry_ms": round(d["ferry_seconds"]*1e3, 2), "phases_ms": {k: round(v*1e3, 2) for k, v in d["phases"].items()}}))'
  }
  for r in 1 2 3; do
    echo "hot cli A r$r: $(cli "$F" --device cuda:0 --repeat 3)"
    echo "hot cli B r$r: $(build-gpu-b/ferry load --json --device cuda:0 --repeat 3 "$F" | python3 -c 'import json,sys; d=json.load(sys.stdin); print([round(l["gbps"],2) for l in d["files"]])')"
    echo "hot py A r$r: $(pyab $PWD/python $PWD/build-gpu/libferry.so "$F")"
    echo "hot py B r$r: $(pyab $PWD/build-gpu-b/python $PWD/build-gpu-b/libferry.so "$F")"
  done 2>&1 | tee "$OUT/hot4.txt"
  SHM=/dev/shm/ferry-s13
  fresh() { rm -rf $SHM; mkdir -p $SHM; cp "$F" $SHM/x.safetensors; }
  for r in 1 2; do
    fresh; echo "tmpfs cli A r$r: $(cli $SHM/x.safetensors --device cuda:0)"
    fresh; echo "tmpfs cli B r$r: $(build-gpu-b/ferry load --json --device cuda:0 $SHM/x.safetensors | python3 -c 'import json,sys; d=json.load(sys.stdin); print([round(l["gbps"],2) for l in d["files"]])')"
    fresh; echo "tmpfs py A r$r: $(pyab $PWD/python $PWD/build-gpu/libferry.so $SHM/x.safetensors)"
  done 2>&1 | tee "$OUT/tmpfs4.txt"
  rm -rf $SHM
  echo "limit mid: $(limit)" | tee -a "$OUT/limits4.txt"
  build-gpu/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap4.jsonl" | cut -c1-120
  mkdir -p /var/tmp/spill13
  build-gpu/bench_store "$F" /var/tmp/spill13 cuda:0 2>&1 | head -18 | tee "$OUT/store4.jsonl" | cut -c1-150
  echo "limit end: $(limit)" | tee -a "$OUT/limits4.txt"
  ;;
s5)  # the final tree: the GPU tests in full; CLI and ferry.torch alternated, hot, 3 rounds;
     # bench_store's RAM stores (the pinner held off from a move's allocations too)
  { python3 tests/data/gen_golden.py /tmp/golden >/dev/null
    python3 tests/gpu/run_loads.py build-gpu/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register,direct | tail -2
    python3 tests/gpu/test_torch_gpu.py --ferry build-gpu/ferry 2>&1
    build-gpu/tests/gpu_async_cuda tests/fuzz/corpus/safetensors/all_dtypes.safetensors 2>&1 | tail -1; } 2>&1 | tee "$OUT/tests5.txt"
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)" | tee "$OUT/limits5.txt"
  for r in 1 2 3; do
    echo "hot cli r$r: $(cli "$F" --device cuda:0 --repeat 3)"
    echo "hot py r$r: $(py "$F" --repeat 3)"
  done 2>&1 | tee "$OUT/hot5.txt"
  mkdir -p /var/tmp/spill13
  for r in 1 2; do build-gpu/bench_store "$F" /var/tmp/spill13 cuda:0 2>&1 | head -18 | tee "$OUT/store5-r$r.jsonl" | cut -c1-150; done
  echo "limit end: $(limit)" | tee -a "$OUT/limits5.txt"
  ;;
s6)  # the final tree beside InstantTensor's MMAP backend (the peer that led from tmpfs), hot and
     # from fresh /dev/shm copies, 3 rounds (bench/compare_load.py; InstantTensor 0.2.2's wheel
     # carried in .whl); then ferry load --path register --repeat 3 (registration kept)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  mk w10g
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} $CMP --workloads w10g --plan 'w10g:hot,tmpfs' \
    --methods ferry_auto,ferry_py,it_mmap --rounds 3 --budget-seconds 330 --out "$OUT/cmp6-w10g.json" 2>&1 | tail -14
  echo "register --repeat 3: $(cli "$F" --device cuda:0 --path register --repeat 3)" | tee "$OUT/reg6.txt"
  ;;
*)
  echo "gpu_session13.sh: unknown part $PART" >&2
  exit 2
  ;;
esac
