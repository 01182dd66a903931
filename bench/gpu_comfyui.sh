#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpu_comfyui.sh OUT [PART] - the seed workload in ComfyUI on one GPU (bench/comfyui_seed.py:
# Wan 2.1 T2V 14B and/or 1.3B + UMT5-XXL + Wan VAE, random weights of the real shapes; stock loaders,
# --fast-disk, ferry's node pack; a fresh ComfyUI per setting and method, 3 prompts each), in one
# device call of at most 10 minutes, from the repository root. Leaves in OUT:
#   comfyui-PART.json / .md   comfyui_seed.py's result and table (rewritten after every process)
#   gpu_comfyui-PART.log      everything printed, machine facts first
#   comfyui-PART-work/        each process's ComfyUI base folder, prompts, pack stats
#   comfyui-PART-logs/        each process's ComfyUI log, as SETTING-METHOD.log
#
# PART (a setting is [MODEL-][vG-]HOST: the DiT, 14b or 1.3b, the GPU's free GiB, the host memory):
#   quick   1.3b-v6-none, 1.3b-v12-none, 14b-v24-none with fast_disk and ferry,
#           then tests/gpu/test_comfyui_gpu.py's checks on that result (per setting: ferry ok and
#           exit 0, outputs as fast_disk's, peak USS at most fast_disk's + 0.1 GiB): the exit status
#   squeeze 14b-v24-none, 1.3b-v6-none with fast_disk and ferry while another process takes 4 GiB
#           of the GPU 15 s into each ComfyUI process (in the middle of a prompt) and holds it
#           (comfyui_seed.py --squeeze-gib), then the quick part's checks
#   matrix  14b-v24-none, 14b-v24-cg8, 14b-v12-cg16, 14b-full-none, 1.3b-v6-none with stock,
#           fast_disk and ferry (more than one call's worth: what the deadline leaves is "skipped";
#           SETTINGS= runs the rest in the next call)
#   a       none, avail32; b: cg32, cg16, cg8; all: the five (two calls' worth): the 14B DiT at
#           --vram-gib 24, every method
# prepare writes the DiTs the settings name (the models stay on the machine while it is warm, so a
# later part reuses what an earlier one wrote, and writes only a DiT it lacks).
# Carry (scripts/comfyui_carry.sh makes them): .carry/comfyui (ComfyUI), .whl/comfyui (wheels),
# build-gpu/libferry.so (else .deps/jansson to build it as bench/gpu_stream.sh does).
# PyAV is not carried: bench/stubs/av goes first on PYTHONPATH.
# Environment: FERRY_BENCH_MODELS (default $HOME/ferry-comfyui-models), CALL_SECONDS (default 570),
# SITE (default /tmp/site-comfyui), SETTINGS and METHODS (comma-separated: replace the part's),
# EXPERTS (1, or 2 for a Wan 2.2 A14B-style pair in fp8; 14B settings only), SEED_ARGS (more
# arguments for `comfyui_seed.py run`), DRY_RUN=1 (print facts and the commands, check the wheels
# and imports, run nothing; for trying the script off the GPU machine).
set -uo pipefail
OUT=${1:?usage: bench/gpu_comfyui.sh OUT [quick|squeeze|matrix|a|b|all]}
PART=${2:-a}
T0=$SECONDS
LIMIT=${CALL_SECONDS:-570}
MODELS=${FERRY_BENCH_MODELS:-${HOME:-/root}/ferry-comfyui-models}
SITE=${SITE:-/tmp/site-comfyui}
EXPERTS=${EXPERTS:-1}
VRAM=()   # the old settings' emulated GPU; the new ones carry theirs
XRUN=()   # the part's own run arguments
case "$PART" in
quick) S=1.3b-v6-none,1.3b-v12-none,14b-v24-none M=fast_disk,ferry ;;
squeeze) S=14b-v24-none,1.3b-v6-none M=fast_disk,ferry XRUN=(--squeeze-gib 4 --squeeze-after 15) ;;
matrix) S=14b-v24-none,14b-v24-cg8,14b-v12-cg16,14b-full-none,1.3b-v6-none M=stock,fast_disk,ferry ;;
a) S=none,avail32 M=stock,fast_disk,ferry VRAM=(--vram-gib 24) ;;
b) S=cg32,cg16,cg8 M=stock,fast_disk,ferry VRAM=(--vram-gib 24) ;;
all) S=none,avail32,cg32,cg16,cg8 M=stock,fast_disk,ferry VRAM=(--vram-gib 24) ;;
*) echo "usage: $0 OUT [quick|squeeze|matrix|a|b|all]" >&2; exit 2 ;;
esac
SETTINGS=${SETTINGS:-$S}
METHODS=${METHODS:-$M}
# the DiTs the settings name: 1.3B for 1.3b-..., 14B for every other
DITS=
tr ',' '\n' <<<"$SETTINGS" | grep -qvi '^1\.3b-' && DITS=14B
tr ',' '\n' <<<"$SETTINGS" | grep -qi '^1\.3b-' && DITS=${DITS:+$DITS,}1.3B
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DO=
[ "${DRY_RUN:-0}" = 1 ] && DO=echo

main() {
echo "== $(date -u +%FT%TZ) bench/gpu_comfyui.sh $PART, tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -2
echo "cpus $(nproc); $(grep -E '^(MemTotal|MemAvailable)' /proc/meminfo | tr -s ' ' | paste -sd ';'); uid $(id -u)"
echo "cgroup: $(stat -fc %T /sys/fs/cgroup 2>/dev/null); v1 memory: $([ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ] && echo yes || echo no); self: $(grep -E 'memory|^0::' /proc/self/cgroup | paste -sd ' ')"
mkdir -p "$MODELS"
df -hT / "$MODELS" /tmp | awk '!seen[$0]++'
python3 --version

echo "== libferry ($((SECONDS - T0)) s)"
if [ -e build-gpu/libferry.so ]; then
  echo "using the carried build-gpu/libferry.so"
elif [ -f .deps/jansson/CMakeLists.txt ]; then
  XX=
  for d in /usr/include /usr/local/include .deps/xxhash .whl/include; do
    [ -f "$d/xxhash.h" ] && { XX=$(cd "$d" && pwd); break; }
  done
  [ -n "$XX" ] || { echo "no xxhash.h (carry .whl/include/xxhash.h)"; exit 1; }
  GEN=Ninja; command -v ninja >/dev/null || GEN="Unix Makefiles"
  rm -f build-gpu/CMakeCache.txt
  $DO cmake -S . -B build-gpu -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF -DFERRY_WERROR=OFF -DXXHASH_INCLUDE_DIR="$XX" \
    >"$OUT/cmake-$PART.log" 2>&1 && $DO cmake --build build-gpu -j16 --target ferry_shared >>"$OUT/cmake-$PART.log" 2>&1 ||
    { tail -30 "$OUT/cmake-$PART.log"; echo "the build failed"; exit 1; }
else
  echo "neither build-gpu/libferry.so nor .deps/jansson was carried"; exit 1
fi
export FERRY_LIBRARY=$PWD/build-gpu/libferry.so

echo "== wheels and ComfyUI ($((SECONDS - T0)) s)"
[ -f .carry/comfyui/execution.py ] || { echo "no .carry/comfyui (scripts/comfyui_carry.sh, then carry it)"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/comfyui/*.whl ||
  { echo "the wheels did not install"; exit 1; }
# the site's wheels, then the av stand-in; ferry's python/ only for the ferry method (comfyui_seed.py)
export PYTHONPATH=$SITE:$PWD/bench/stubs COMFYUI_DIR=$PWD/.carry/comfyui PYTHONDONTWRITEBYTECODE=1
python3 -c 'import sys, torch, av, comfy_aimdo, comfy_kitchen, torchsde, einops, sentencepiece, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "transformers", transformers.__version__, "av stub", getattr(av, "STUB", False))' || exit 1

echo "== models in $MODELS ($((SECONDS - T0)) s)"
XARGS=()
[ "$EXPERTS" = 2 ] && XARGS=(--experts 2 --expert-dtype "${EXPERT_DTYPE:-fp8_e4m3fn}")
PYTHONUNBUFFERED=1 $DO python3 bench/comfyui_seed.py prepare --models "$MODELS" --dits "$DITS" "${XARGS[@]}" || exit 1
sync
df -h "$MODELS" | tail -1

LEFT=$((LIMIT - (SECONDS - T0)))
echo "== comfyui_seed.py run $SETTINGS, $METHODS ($((SECONDS - T0)) s; ${LEFT} s left)"
# no process starts with under 60 s left; the driver's own end takes a few seconds
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 $DO python3 bench/comfyui_seed.py run --models "$MODELS" --out "$OUT/comfyui-$PART.json" --table \
  --settings "$SETTINGS" --methods "$METHODS" "${VRAM[@]}" "${XRUN[@]}" --python python3 --comfyui "$COMFYUI_DIR" \
  --ferry-lib "$FERRY_LIBRARY" --deadline $((LEFT - 10)) --min-process 60 --process-timeout 240 ${SEED_ARGS:-}
RC=$?
if [ "$PART" = quick ] || [ "$PART" = squeeze ]; then
  echo "== tests/gpu/test_comfyui_gpu.py's checks ($((SECONDS - T0)) s)"
  $DO python3 tests/gpu/test_comfyui_gpu.py --result "$OUT/comfyui-$PART.json" --no-table
  RC=$?
fi
echo "== done: rc $RC, $((SECONDS - T0)) s"
grep -E '^(MemAvailable|Cached|Dirty):' /proc/meminfo | tr -s ' ' | paste -sd ';'
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1 | head -1
return $RC
}

main 2>&1 | tee -a "$OUT/gpu_comfyui-$PART.log"
exit "${PIPESTATUS[0]}"
