#!/usr/bin/env bash
# The eleventh session's GPU measurements (bench/RESULTS.md, "Eleventh
# session"), run on the GPU machine from the repository root:
#   bench/gpu_session11.sh PART OUT
# build-gpu is this tree's Release build, made on the development machine and
# carried. Files are made in /tmp/cmp by bench/compare_load.py --make-only
# (w10g: 10.43 GB, 540 BF16 tensors; small: 26 MB). Parts:
#   sweep   the ring's geometry in fresh processes, hot: threads x buffers x
#           buffer size, each process loading twice (--repeat 2: a first load
#           and a steady one); the same for a fresh /dev/shm copy; the 26 MB
#           file with the default ring and fewer threads
#   ceiling bench_ring (the copy engine alone, the reads alone, both per
#           thread, copying from a mapping) hot and on a fresh /dev/shm copy
#   ceiling2 the same with streaming stores (from a mapping; pread into a small
#           cached buffer, then streamed into the pinned one), and ferry's
#           ring at 12 and 16 threads
set -uo pipefail
PART=$1
OUT=${2:-/tmp/out11}
mkdir -p "$OUT"
D=/tmp/cmp
F=$D/w10g.safetensors
S=$D/small.safetensors
SHM=/dev/shm/ferry-s11
CMP="python3 bench/compare_load.py --ferry build-gpu/ferry --ferry-library $PWD/build-gpu/libferry.so --ferry-python $PWD/python --dir $D"
mk() { # WORKLOADS
  $CMP --workloads "$1" --make --make-only --out "$OUT/make-$1.json" 2>&1 | tail -2
}
cli() { # FILE [args]: one fresh ferry load --json; prints each load's gbps and seconds
  local f=$1; shift
  build-gpu/ferry load --device cuda:0 --json "$@" "$f" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(json.dumps({"gbps": [round(l["gbps"], 2) for l in d["files"]], "ms": [round(l["seconds"]*1e3, 2) for l in d["files"]], "path": d["files"][0]["path_used"], "rss_mib": d["peak_rss_bytes"] >> 20}))'
}
limit() { build-gpu/bench_pinrate 4 64 2 2>&1 | grep hostalloc | head -1; }
tmpfs_ring() { # OUTFILE REPS MODE...: bench_ring on a fresh /dev/shm copy per mode, two rounds
  local out=$1 reps=$2; shift 2
  mkdir -p $SHM
  for r in 1 2; do
    for m in "$@"; do
      rm -f $SHM/x.safetensors; cp "$F" $SHM/x.safetensors
      echo "tmpfs fresh: $(build-gpu/bench_ring $SHM/x.safetensors $m 12 2 4096 $reps)"
    done
  done 2>&1 | tee "$out"
  rm -rf $SHM
}
case "$PART" in
sweep)
  mk w10g,small
  cat "$F" "$S" >/dev/null
  echo "limit start: $(limit)"
  G="12:24:4MiB 12:24:1MiB 12:24:2MiB 12:48:1MiB 16:32:1MiB 12:24:512KiB 8:16:2MiB 12:12:2MiB 16:48:2MiB"
  for r in 1 2; do
    for g in $G; do
      IFS=: read t n b <<<"$g"
      echo "hot r$r threads $t buffers $n size $b: $(cli "$F" --path ring --threads $t --buffers $n --buffer-size $b --repeat 2)"
    done
  done 2>&1 | tee "$OUT/sweep-hot.txt"
  echo "limit mid: $(limit)"
  mkdir -p $SHM
  for r in 1 2; do
    for g in 12:24:4MiB 12:24:1MiB 16:32:1MiB; do
      IFS=: read t n b <<<"$g"
      rm -f $SHM/x.safetensors; cp "$F" $SHM/x.safetensors
      echo "tmpfs r$r threads $t buffers $n size $b: $(cli $SHM/x.safetensors --threads $t --buffers $n --buffer-size $b --repeat 2)"
    done
  done 2>&1 | tee "$OUT/sweep-tmpfs.txt"
  rm -rf $SHM
  for r in 1 2 3; do
    for a in "" "--threads 2" "--threads 4 --buffer-size 1MiB"; do
      echo "small r$r [$a]: $(cli "$S" $a --repeat 3)"
    done
  done 2>&1 | tee "$OUT/sweep-small.txt"
  echo "limit end: $(limit)"
  ;;
ceiling)  # bench_ring: the copy engine alone, the reads alone, both per thread
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)"
  R() { echo "$(build-gpu/bench_ring "$@")"; }
  for r in 1 2; do
    R "$F" dma 1 24 4096; R "$F" dma 12 2 4096; R "$F" dma 12 2 1024; R "$F" dma 12 2 16384; R "$F" dma 4 2 65536
    R "$F" read 12 2 4096; R "$F" read 16 2 4096; R "$F" read 12 2 16384
    R "$F" ring 12 2 4096; R "$F" ring 12 4 4096; R "$F" ring 16 2 4096; R "$F" ring 12 2 8192
    R "$F" ring 12 2 2048; R "$F" ring 8 3 4096; R "$F" mapcopy 12 2 4096
    echo "ferry default: $(cli "$F" --path ring --repeat 2)"
  done 2>&1 | tee "$OUT/ceiling.txt"
  tmpfs_ring "$OUT/ceiling-tmpfs.txt" 3 ring mapcopy read
  echo "limit end: $(limit)"
  ;;
ceiling2)  # streaming stores: from a mapping, or pread into a small cached buffer first
  mk w10g
  cat "$F" >/dev/null
  echo "limit start: $(limit)"
  R() { echo "$(build-gpu/bench_ring "$@")"; }
  for r in 1 2; do
    for t in 12 16; do
      R "$F" ring $t 2 4096; R "$F" mapcopy $t 2 4096; R "$F" mapnt $t 2 4096
      R "$F" bounce $t 2 4096; BOUNCE_KIB=1024 R "$F" bounce $t 2 4096
    done
    echo "ferry 12x24x4MiB: $(cli "$F" --path ring)"
    echo "ferry 16x32x4MiB: $(cli "$F" --path ring --threads 16 --buffers 32)"
    echo "ferry 12x24x4MiB: $(cli "$F" --path ring)"
    echo "ferry 16x32x4MiB: $(cli "$F" --path ring --threads 16 --buffers 32)"
  done 2>&1 | tee "$OUT/ceiling2.txt"
  tmpfs_ring "$OUT/ceiling2-tmpfs.txt" 2 mapnt bounce mapcopy
  echo "limit end: $(limit)"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
