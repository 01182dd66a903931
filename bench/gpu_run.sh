#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpu_run.sh - ferry's GPU checks and benchmarks on the GPU machine, run from the
# repository root, each part writing its raw output into OUT and every part's figures into
# one table, OUT/table.md (medians and ranges over the rounds, per measurement):
#
#   bench/gpu_run.sh OUT PART[,PART...]
#
# B is a Release build carried to the machine (default build-gpu:
# cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release; the binaries are
# self-contained, so a build made on Debian runs there). The peers and torch-side wheels go
# in .whl (safetensors 0.9 in .whl-st09); compare_load.py's files are made in D (/tmp/cmp)
# when missing. ROUNDS sets the rounds of the alternated parts. Parts:
#   tests     the driver checks, every valid golden checkpoint through every path on cuda:0
#             (verified), tests/gpu/test_torch_gpu.py, test_stream_gpu.py, gpu_async_cuda
#   bench     `ferry bench --cold` on the 10 GB file: the disk and copy limits, every path
#   load      first loads in fresh processes, the CLI against ferry.torch.load_file
#             alternated: the 10 GB file hot (ROUNDS, default 5), the CLI's --repeat 3
#             (later loads into the first load's memory), the 26 MB and the LoRA-like file
#             hot (3 rounds), fresh /dev/shm copies of the 10 GB file (2 rounds)
#   register  `ferry load --route register --repeat 2` (a first load that registers, then
#             one that reuses the registration), 2 rounds; bench/reg_probe.py's steps
#   cold      the 10 GB file with the page cache dropped before each process: ferry (auto)
#             against fastsafetensors nogds, ROUNDS (default 4) alternated
#   peers     bench/compare_load.py: every loader, every tensor verified; PLAN (default
#             'w10g:hot,tmpfs,cold;gguf:hot;lora:hot;small:hot,tmpfs'), METHODS (default
#             every method), ROUNDS (default 1); PLAN='sharded:hot' for the 30 GB index
#   store     bench_store (clean and dirty evictions, pinned RAM with the pool pinned on
#             demand and ahead, the spill file) and bench_swap (6 model swaps)
#   ring      bench_ring: copies alone, reads alone, both (one copy per 4 MiB buffer, and
#             gathered into 16 MiB copies), copies out of a mapping, 2 rounds
#   flux      bench/stream.py: a FLUX.1-dev-sized transformer larger than its budget,
#             every method (ferry at 100/50/25 %, group offloading, accelerate, aimdo)
#   stream    bench/gpu_stream.sh OUT/stream: a Wan2.1-14B-sized transformer through the
#             C streaming engine (STREAM_PART: all, a, b)
#   comfyui   bench/gpu_comfyui.sh OUT/comfyui: the seed workflow in ComfyUI, stock against
#             the node pack (COMFYUI_PART: a, b, all; see that script for what it carries)
#   keeper    bench/keeper_restart.py on the 10 GB file: fresh processes whose store brings
#             it to cuda:0 reading the checkpoint alone, against using a running `ferry keep`
#             (sim backend: memfd host memory), ROUNDS (default 3) alternated
#   table     nothing run: OUT/table.md made again from the logs already in OUT
# Each part records the pinned copy limit (bench_pinrate) at its start and end.
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ $# -eq 2 ] || { usage >&2; exit 2; }
OUT=$1
PARTS=$2
PARTS_OK=" tests bench load register cold peers store ring flux stream comfyui keeper table "
for p in ${PARTS//,/ }; do
  case "$PARTS_OK" in *" $p "*) ;; *) echo "gpu_run.sh: unknown part '$p' (one of:$PARTS_OK)" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
. bench/gpu_common.sh  # B, D, setup, mk, limit, drop, cli, py, fsafe
F=$D/w10g.safetensors
S=$D/small.safetensors
L=$D/lora.safetensors
SHM=/dev/shm/ferry-gpu-run
R() { "$B"/bench_ring "$@" 2>&1 | tail -1; }
fresh() { rm -rf $SHM; mkdir -p $SHM; cp "$F" $SHM/x.safetensors; }

part_tests() {
  echo "== driver checks"; "$B"/tests/unit/test_cuda_nodev 2>&1 | tail -1
  python3 tests/data/gen_golden.py /tmp/golden >/dev/null
  echo "== every valid golden checkpoint through every path, verified, cuda:0"
  timeout 200 python3 tests/gpu/run_loads.py "$B"/ferry /tmp/golden cuda:0 --paths auto,ring,pageable,register,direct | tail -2
  echo "== tests/gpu/test_torch_gpu.py"; timeout 150 python3 tests/gpu/test_torch_gpu.py --ferry "$B"/ferry 2>&1 | tail -4
  echo "== tests/gpu/test_stream_gpu.py"; timeout 150 python3 tests/gpu/test_stream_gpu.py 2>&1 | tail -4
  echo "== gpu_async_cuda"; "$B"/tests/gpu_async_cuda tests/fuzz/corpus/safetensors/all_dtypes.safetensors 2>&1 | tail -1
}
part_bench() {
  mk w10g
  "$B"/ferry bench --cold "$F"
}
part_load() {
  mk w10g,small,lora
  cat "$F" "$S" "$L" >/dev/null
  for r in $(seq "${ROUNDS:-5}"); do
    echo "10 GB hot, CLI r$r: $(cli "$F" --device cuda:0)"
    echo "10 GB hot, ferry.torch r$r: $(py reserve "$F")"
  done
  for r in 1 2; do echo "10 GB hot, CLI --repeat 3 r$r: $(cli "$F" --device cuda:0 --repeat 3)"; done
  for r in 1 2 3; do
    echo "26 MB hot, CLI r$r: $(cli "$S" --device cuda:0)"
    echo "26 MB hot, ferry.torch r$r: $(py reserve "$S")"
    echo "LoRA hot, CLI r$r: $(cli "$L" --device cuda:0)"
    echo "LoRA hot, ferry.torch r$r: $(py reserve "$L")"
  done
  for r in 1 2; do
    fresh; echo "10 GB fresh /dev/shm copy, CLI r$r: $(cli $SHM/x.safetensors --device cuda:0)"
    fresh; echo "10 GB fresh /dev/shm copy, ferry.torch r$r: $(py reserve $SHM/x.safetensors)"
  done
  rm -rf $SHM
}
part_register() {
  mk w10g
  cat "$F" >/dev/null
  for r in 1 2; do echo "10 GB hot, register --repeat 2 r$r: $(cli "$F" --device cuda:0 --route register --repeat 2)"; done
  python3 bench/reg_probe.py "$F" --steps plain,popN,pipe,pipe_pop
}
part_cold() {
  mk w10g
  for r in $(seq "${ROUNDS:-4}"); do
    drop; echo "10 GB cold, CLI r$r: $(cli "$F" --device cuda:0)"
    drop; echo "10 GB cold, fastsafetensors nogds r$r: $(fsafe "$F")"
  done
}
part_peers() {
  local plan=${PLAN:-'w10g:hot,tmpfs,cold;gguf:hot;lora:hot;small:hot,tmpfs'} w
  w=$(tr ';' '\n' <<<"$plan" | cut -d: -f1 | paste -sd,)
  mk "$w"
  PYTHONPATH=/tmp/site:$PYTHONPATH $CMP --workloads "$w" --plan "$plan" ${METHODS:+--methods $METHODS} \
    --rounds "${ROUNDS:-1}" --budget-seconds "${BUDGET:-480}" --out "$OUT/peers.json" 2>&1 | tail -40
}
part_store() {
  mk w10g
  cat "$F" >/dev/null
  mkdir -p /var/tmp/ferry-gpu-run
  timeout 200 "$B"/bench_store "$F" /var/tmp/ferry-gpu-run cuda:0 2>&1 | tee "$OUT/store.jsonl" | cut -c1-200
  timeout 120 "$B"/bench_swap "$F" "$F" cuda:0 6 2>&1 | tee "$OUT/swap.jsonl" | cut -c1-200
}
part_keeper() {
  mk w10g
  cat "$F" >/dev/null
  python3 bench/keeper_restart.py --device cuda:0 --rounds "${ROUNDS:-3}" "$F" | tee "$OUT/keeper.txt"
  local rc=${PIPESTATUS[0]}
  grep '^|' "$OUT/keeper.txt" >"$OUT/keeper.md"
  return "$rc"
}
part_ring() {
  mk w10g
  cat "$F" >/dev/null
  for r in 1 2; do
    echo "copies alone, 4 MiB r$r: $(R "$F" dma 12 2 4096)"
    echo "copies alone, 16 MiB r$r: $(R "$F" dma 12 2 16384)"
    echo "reads alone, 12 threads, 4 MiB r$r: $(R "$F" read 12 2 4096)"
    echo "ring 12 x 2 x 4 MiB r$r: $(R "$F" ring 12 2 4096)"
    echo "gathered, 4 x 4 MiB reads a copy r$r: $(GANG=4 R "$F" gang 12 2 4096)"
    echo "copies out of a mapping, 12 threads r$r: $(R "$F" mapcopy 12 2 4096)"
    echo "ferry CLI, ring r$r: $(cli "$F" --device cuda:0 --route ring)"
  done
}
part_flux() {
  PYTHONPATH=/tmp/site:$PYTHONPATH python3 bench/stream.py --ferry-lib "$B"/libferry.so --budgets 1.0,0.5,0.25 --image-tokens 4096,1024 \
    --steps 5 --reps "${ROUNDS:-1}" --out "$OUT/flux.json"
}
part_stream() { bash bench/gpu_stream.sh "$OUT/stream" "${STREAM_PART:-all}"; }
part_comfyui() { bash bench/gpu_comfyui.sh "$OUT/comfyui" "${COMFYUI_PART:-a}"; }

# OUT/table.md: every "LABEL rN: {json}" line of the parts' logs, grouped by LABEL: the
# first load's GB/s and ms (median, range), later loads in the process apart; then the
# tables compare_load.py, stream.py and comfyui_seed.py wrote
table() {
  python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows, order = {}, []
for log in sorted(glob.glob(os.path.join(out, "*.log"))):
    part = os.path.basename(log)[:-4]
    for line in open(log, errors="replace"):
        m = re.match(r"^(.*?) r(\d+): (\{.*\})\s*$", line)
        if not m:
            continue
        try:
            d = json.loads(m.group(3))
        except ValueError:
            continue
        g, ms = d.get("gbps"), d.get("ms", d.get("s"))
        gl = g if isinstance(g, list) else [g]
        ml = ms if isinstance(ms, list) else [ms]
        for k, (gv, mv) in enumerate(zip(gl, ml + [None] * len(gl))):
            key = (part, m.group(1) + ("" if k == 0 else ", later loads"))
            if key not in rows:
                rows[key] = []
                order.append(key)
            rows[key].append((gv, mv if "ms" in d else (mv * 1e3 if mv is not None else None)))
def cell(vals):
    v = [x for x in vals if isinstance(x, (int, float))]
    if not v:
        return ""
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else f"{v[0]:.2f}"
with open(os.path.join(out, "table.md"), "w") as f:
    f.write("| part | measurement | runs | GB/s, median (range) | ms, median (range) |\n| --- | --- | --- | --- | --- |\n")
    for key in order:
        v = rows[key]
        f.write(f"| {key[0]} | {key[1]} | {len(v)} | {cell([a for a, _ in v])} | {cell([b for _, b in v])} |\n")
    for md in sorted(glob.glob(os.path.join(out, "*.md")) + glob.glob(os.path.join(out, "*", "*.md"))):
        if os.path.basename(md) != "table.md":
            f.write(f"\n{os.path.relpath(md, out)}:\n\n" + open(md, errors="replace").read())
print(open(os.path.join(out, "table.md")).read())
PY
}

setup
if [ "$PARTS" = table ]; then table; exit 0; fi
echo "== $(date -u +%FT%TZ) bench/gpu_run.sh $PARTS, tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$OUT/machine.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2 | tee -a "$OUT/machine.txt"
RC=0
for p in ${PARTS//,/ }; do
  { echo "limit start: $(limit)"; "part_$p"; rc=$?; echo "limit end: $(limit)"; exit $rc; } 2>&1 | tee "$OUT/$p.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || RC=1
done
table
exit $RC
