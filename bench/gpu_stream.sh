#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpu_stream.sh OUT [PART] - block streaming of a Wan2.1-T2V-14B-sized transformer
# (diffusers' WanTransformer3DModel, 28.6 GB BF16) on one H100, from a fresh checkout on the
# GPU machine, in one call of at most 10 minutes: builds libferry into build-gpu, installs the
# carried wheels into /tmp/site, runs bench/stream.py --model wan (resident, diffusers' group
# offloading, ferry at 50 % and 25 % with pinned copies kept and through the ring, each reading
# the checkpoint from the disk's page cache and from /dev/shm; its docstring tells what each is
# and how host memory is planned), and leaves in OUT:
#   stream-wan[-PART].json / .md   bench/stream.py's result and its table (rewritten after
#                                  every child, so a call cut short keeps what ran)
#   gpu_stream[-PART].log          everything printed, with the machine's facts first
#
# Run from the repository root with `.whl` and `.deps/jansson` carried:
#   .whl           diffusers-0.42.1 and importlib_metadata-8.7.1 wheels (the only requirements
#                  missing from the machine's image), and include/xxhash.h (the build uses
#                  xxhash header-only; the image has no libxxhash-dev)
#   .deps/jansson  jansson's source, compiled into libferry (scripts/deps.sh fetches it here)
# Without .deps/jansson, a carried build-gpu/libferry.so is used instead of building.
#
# PART: all (default); a: resident, group offloading, ferry at 50 %; b: resident, ferry at 25 %
# - for a machine where one call cannot hold everything (the checkpoints stay on the machine
# while it is warm, so b reuses a's; resident runs in both for the ratios and the bit-identity).
# Environment: FERRY_BENCH_DISK (default $HOME/ferry-bench), FERRY_BENCH_SHM (default
# /dev/shm/ferry-bench), CALL_SECONDS (the call's limit, default 590), SITE (where the wheels
# go, default /tmp/site), STREAM_ARGS (more arguments for stream.py, e.g. "--no-buffer-fix";
# a smoke test off the GPU: STREAM_ARGS="--device sim:4GiB --tiny --tokens 60,120 --steps 2").
set -uo pipefail
OUT=${1:?usage: bench/gpu_stream.sh OUT [all|a|b]}
PART=${2:-all}
T0=$SECONDS
LIMIT=${CALL_SECONDS:-590}
DISK=${FERRY_BENCH_DISK:-${HOME:-/root}/ferry-bench}
SHM=${FERRY_BENCH_SHM:-/dev/shm/ferry-bench}
SITE=${SITE:-/tmp/site}
case "$PART" in
all) ONLY=resident,ferry,group_offload; SUF= ;;
a) ONLY=resident,ferry:50,group_offload; SUF=-a ;;
b) ONLY=resident,ferry:25; SUF=-b ;;
*) echo "usage: $0 OUT [all|a|b]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"

main() {
echo "== $(date -u +%FT%TZ) bench/gpu_stream.sh $PART, tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
echo "cpus $(nproc); $(grep -E '^(MemTotal|MemAvailable)' /proc/meminfo | tr -s ' ' | paste -sd ';')"
mkdir -p "$DISK" "$SHM"
df -hT / "$DISK" "$SHM" /tmp | awk '!seen[$0]++'

echo "== libferry ($((SECONDS - T0)) s)"
if [ -f .deps/jansson/CMakeLists.txt ]; then
  XX=
  for d in /usr/include /usr/local/include .deps/xxhash .whl/include; do
    if [ -f "$d/xxhash.h" ]; then XX=$(cd "$d" && pwd); break; fi
  done
  [ -n "$XX" ] || { echo "no xxhash.h (carry .whl/include/xxhash.h)"; exit 1; }
  GEN=Ninja
  command -v ninja >/dev/null || GEN="Unix Makefiles"
  rm -f build-gpu/CMakeCache.txt  # a cache carried from another tree would refuse this source dir
  # CMAKE_POLICY_VERSION_MINIMUM: the image's CMake 4 refuses jansson's cmake_minimum_required(3.1)
  # without it (CMake 3 ignores it)
  cmake -S . -B build-gpu -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF -DFERRY_WERROR=OFF -DXXHASH_INCLUDE_DIR="$XX" \
    >"$OUT/cmake$SUF.log" 2>&1 &&
    cmake --build build-gpu -j16 --target ferry_shared >>"$OUT/cmake$SUF.log" 2>&1 ||
    { tail -30 "$OUT/cmake$SUF.log"; echo "the build failed"; exit 1; }
  echo "built build-gpu/libferry.so with $(cmake --version | head -1), $GEN ($((SECONDS - T0)) s)"
elif [ -e build-gpu/libferry.so ]; then
  echo "no .deps/jansson: using the carried build-gpu/libferry.so"
else
  echo "neither .deps/jansson (to build) nor build-gpu/libferry.so (built) was carried"; exit 1
fi

echo "== wheels ($((SECONDS - T0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl ||
  { echo "the wheels did not install"; exit 1; }
export PYTHONPATH=$SITE
python3 -c 'import torch, diffusers, accelerate, safetensors; from diffusers import WanTransformer3DModel
print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "diffusers", diffusers.__version__,
      "accelerate", accelerate.__version__, "safetensors", safetensors.__version__)' || exit 1

LEFT=$((LIMIT - (SECONDS - T0)))
echo "== stream.py ($((SECONDS - T0)) s; ${LEFT} s left)"
# no child starts in the last 70 s (a ferry child takes ~30 s, the end's copy-rate probe ~15 s)
# and none runs in the last 15
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 python3 bench/stream.py --model wan --ferry-lib build-gpu/libferry.so \
  --file-locations "disk:$DISK,shm:$SHM" --tokens 1170,14040 --steps 3 --budgets 0.5,0.25 \
  --ferry-modes pinned,ring --only "$ONLY" --skip group_offload_rs \
  --budget-seconds $((LEFT - 70)) --deadline-seconds $((LEFT - 15)) --out "$OUT/stream-wan$SUF.json" ${STREAM_ARGS:-}
RC=$?
echo "== done: stream.py rc $RC, $((SECONDS - T0)) s"
grep -E '^(MemAvailable|Cached|Shmem):' /proc/meminfo | tr -s ' ' | paste -sd ';'
df -h "$DISK" "$SHM" | awk '!seen[$0]++'
return $RC
}

main 2>&1 | tee -a "$OUT/gpu_stream$SUF.log"
exit "${PIPESTATUS[0]}"
