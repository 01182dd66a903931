# SPDX-License-Identifier: Apache-2.0
# bench/gpu_common.sh - helpers bench/gpu_run.sh sources (from the repository
# root, on the GPU machine). B is the Release build (default build-gpu), D the
# folder of compare_load.py's files (default /tmp/cmp).
#   setup           install the carried wheels (.whl, .whl-st09) into /tmp/site
#                   and /tmp/st09, point ferry's Python at B's library, set CMP
#                   (bench/compare_load.py on D)
#   mk WORKLOADS    make compare_load.py's files that are missing (w10g: 10.43 GB,
#                   540 BF16 tensors; small: 26 MB, 40 tensors; lora: 0.33 GB,
#                   3000 tensors; gguf: 2.88 GB; sharded: 30.2 GB in 6 shards)
#   limit           the pinned host-to-device copy rate (bench_pinrate, one line)
#   drop            empty the page cache (root on the GPU machine)
#   cli FILE [ARGS] one fresh `ferry load --json`: each load's GB/s, ms, set-up
#                   and allocation ms, the path, peak RSS
#   py VARIANT FILE [ARGS]
#                   bench/profile_py_load.py in a fresh process: ferry.torch's
#                   load and its phases
#   fsafe FILE      fastsafetensors (from /tmp/site) with nogds=True and its
#                   defaults, timed from fastsafe_open to synchronised tensors
B=${B:-build-gpu}
D=${D:-/tmp/cmp}
setup() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
  fi
  if ls .whl-st09/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/st09 .whl-st09/*.whl 2>&1 | tail -2
  fi
  export FERRY_LIBRARY=$PWD/$B/libferry.so PYTHONPATH=$PWD/python
  CMP="python3 bench/compare_load.py --ferry $B/ferry --ferry-library $PWD/$B/libferry.so --ferry-python $PWD/python --st09-path /tmp/st09 --dir $D"
}
mk() { PYTHONPATH=/tmp/site:$PYTHONPATH $CMP --workloads "$1" --make --make-only --out "$OUT/make.json" 2>&1 | tail -1; }
limit() { "$B"/bench_pinrate 4 64 2 2>&1 | grep hostalloc | head -1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
cli() {
  local f=$1; shift
  "$B"/ferry load --json "$@" "$f" | python3 -c '
import json,sys
d=json.load(sys.stdin)
L=d["files"]
r=lambda k: [round(l.get(k, 0)*1e3, 2) for l in L]
print(json.dumps({"gbps": [round(l["gbps"], 2) for l in L], "ms": r("seconds"), "setup_ms": r("setup_seconds"),
                  "alloc_ms": r("alloc_seconds"), "route": L[0]["route"], "rss_mib": d["peak_rss_bytes"] >> 20}))'
}
py() {
  python3 bench/profile_py_load.py "$2" --variant "$1" "${@:3}" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(json.dumps({"gbps": round(d["gbps"], 2), "ms": round(d["seconds"]*1e3, 2), "route": d["route"],
                "phases_ms": {k: round(v*1e3, 2) for k, v in d["phases"].items()}}))'
}
fsafe() {
  PYTHONPATH=/tmp/site python3 - "$1" <<'PY'
import json, os, sys, time
import torch
from fastsafetensors import fastsafe_open
torch.cuda.init(); torch.empty(1, device="cuda:0")
t = time.perf_counter()
with fastsafe_open([sys.argv[1]], framework="pt", device="cuda:0", nogds=True) as f:
    n = sum(f.get_tensor(k).numel() * 0 + 1 for k in f.keys())
torch.cuda.synchronize()
s = time.perf_counter() - t
print(json.dumps({"gbps": round(os.path.getsize(sys.argv[1]) / s / 1e9, 2), "s": round(s, 3), "tensors": n}))
PY
}
