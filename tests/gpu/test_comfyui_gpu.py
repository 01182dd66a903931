#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The node pack in ComfyUI on a real GPU, against stock ComfyUI with
--fast-disk: bench/comfyui_seed.py's quick part (not run by ctest or by
bench/gpu_run.sh's tests part: it takes minutes; bench/gpu_comfyui.sh OUT
quick runs the same steps and these checks).

    python3 tests/gpu/test_comfyui_gpu.py [--out DIR] [--models DIR]
        [--settings 1.3b-v6-none,1.3b-v12-none,14b-v24-none] [--methods fast_disk,ferry]
    python3 tests/gpu/test_comfyui_gpu.py --result RESULT.json [--no-table]   # the checks alone

1. `comfyui_seed.py prepare --dits` the DiTs the settings name (the 14B and
   1.3B Wan 2.1 T2V DiTs, UMT5-XXL, the VAE: 43 GB, random weights of the
   real shapes) into --models ($FERRY_BENCH_MODELS, else
   $HOME/ferry-comfyui-models); what is there already is kept.
2. `comfyui_seed.py run` with those settings and methods (a fresh ComfyUI per
   setting and method, 3 prompts each, on the GPU; a setting
   [MODEL-][vG-]HOST carries its DiT and the GPU's free GiB), the result, its
   table and each process's ComfyUI log in --out (default a new temporary
   folder): comfyui-quick.json / .md, comfyui-quick-logs/.
3. Per setting: the ferry process has status ok (every prompt passed and the
   process exited 0: a crash at exit is status "exit"); its output digests
   equal fast_disk's (every prompt; fast_disk must be ok too); its peak USS is
   at most fast_disk's + USS_TOLERANCE_GIB (0.1 GiB: the two sampled peaks of
   processes that map the same files).

Runs ComfyUI with this interpreter, which needs ComfyUI's packages (as
bench/gpu_comfyui.sh installs them); ComfyUI from $COMFYUI_DIR, else
../shared/comfyui; libferry.so from $FERRY_LIBRARY, else build/libferry.so.
Prints PASS/FAIL per check, the table and a final "N passed, N failed" line;
exits 1 on a failure and 77 (skipped, with the reason) when there is no CUDA
device, no ComfyUI or no models folder it can write. --result checks a
finished run's result only (no GPU needed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEED = os.path.join(ROOT, "bench", "comfyui_seed.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "comfyui"))

from gpucheck import check, results  # noqa: E402 (tests/gpu/gpucheck.py, beside this script)

QUICK_SETTINGS = "1.3b-v6-none,1.3b-v12-none,14b-v24-none"
QUICK_METHODS = "fast_disk,ferry"
USS_TOLERANCE_GIB = 0.1


def skip(why):
    print(f"test_comfyui_gpu: {why}: skipped")
    sys.exit(77)


def _first_line(p):
    return (p.get("error") or "").splitlines()[0][:300] if p.get("error") else ""


def ferry_ok(f):
    assert f is not None, "no ferry process in this setting"
    assert f["status"] == "ok" and f.get("returncode") == 0, \
        f"ferry: status {f['status']}, returncode {f.get('returncode')}: {_first_line(f)} (log: {f.get('log_copy')})"


def same_outputs(f, fd):
    assert fd is not None, "no fast_disk process in this setting"
    assert fd["status"] == "ok", f"fast_disk: status {fd['status']}: {_first_line(fd)}"
    assert f is not None and f["status"] == "ok", "ferry did not finish every prompt"
    df, dd = f.get("digests") or [], fd.get("digests") or []
    assert df and None not in df and len(df) == len(dd), f"digests: ferry {df}, fast_disk {dd}"
    diff = [i for i, (a, b) in enumerate(zip(df, dd)) if a != b]
    assert not diff, f"prompts {diff}: ferry's outputs differ from fast_disk's"


def uss_not_above(f, fd):
    assert f is not None and fd is not None, "ferry or fast_disk did not run in this setting"
    uf = (f.get("memory") or {}).get("peak_uss_gib")
    ud = (fd.get("memory") or {}).get("peak_uss_gib")
    assert uf and ud, f"no peak USS sampled (ferry {uf}, fast_disk {ud})"
    assert uf <= ud + USS_TOLERANCE_GIB, \
        f"ferry's peak USS {uf} GiB > fast_disk's {ud} GiB + {USS_TOLERANCE_GIB} (by {uf - ud:.3f} GiB)"


def check_result(path, table=True):
    """The per-setting checks on a comfyui_seed.py result."""
    with open(path) as f:
        res = json.load(f)
    procs = res["processes"]
    for s in dict.fromkeys(p["setting"] for p in procs):
        by = {p["method"]: p for p in procs if p["setting"] == s}
        f, fd = by.get("ferry"), by.get("fast_disk")
        check(f"{s}: ferry ok (every prompt passed, exit 0)", ferry_ok, f)
        check(f"{s}: ferry's outputs are fast_disk's", same_outputs, f, fd)
        check(f"{s}: ferry's peak USS <= fast_disk's + {USS_TOLERANCE_GIB} GiB", uss_not_above, f, fd)
    if table:
        subprocess.run([sys.executable, SEED, "table", path])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="where the result, its table and the logs go (default: a new temporary folder)")
    ap.add_argument("--models", default=os.environ.get("FERRY_BENCH_MODELS") or os.path.join(
        os.path.expanduser("~"), "ferry-comfyui-models"))
    ap.add_argument("--settings", default=QUICK_SETTINGS)
    ap.add_argument("--methods", default=QUICK_METHODS)
    ap.add_argument("--process-timeout", type=float, default=240.0)
    ap.add_argument("--result", help="check this finished result only")
    ap.add_argument("--no-table", action="store_true", help="do not print the result's table")
    opts = ap.parse_args()
    if opts.result:
        check_result(opts.result, table=not opts.no_table)
        print(f"{results['passed']} passed, {results['failed']} failed")
        return 0 if results["failed"] == 0 and results["passed"] else 1

    try:
        import torch
        if not torch.cuda.is_available():
            skip("no CUDA device")
    except ImportError:
        skip("no torch")
    import harness
    comfyui, why = harness.find_comfyui()
    if comfyui is None:
        skip(why)
    try:
        os.makedirs(opts.models, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=opts.models)
        probe.close()
    except OSError as e:
        skip(f"no models folder: {opts.models}: {e}")
    lib = os.path.abspath(os.environ.get("FERRY_LIBRARY") or os.path.join(ROOT, "build", "libferry.so"))
    if not os.path.isfile(lib):
        print(f"FAIL no libferry.so at {lib} (set FERRY_LIBRARY)")
        return 1
    out = opts.out or tempfile.mkdtemp(prefix="ferry-comfyui-gpu-")
    os.makedirs(out, exist_ok=True)
    settings = opts.settings.split(",")
    dits = ",".join(d for d, want in (("14B", any(not s.lower().startswith("1.3b-") for s in settings)),
                                      ("1.3B", any(s.lower().startswith("1.3b-") for s in settings))) if want)
    print(f"test_comfyui_gpu: ComfyUI at {comfyui}, {torch.cuda.get_device_name(0)}, models in {opts.models}, "
          f"libferry {lib}, out {out}", flush=True)

    def prepare():
        r = subprocess.run([sys.executable, SEED, "prepare", "--models", opts.models, "--dits", dits])
        assert r.returncode == 0, f"comfyui_seed.py prepare exited {r.returncode}"
    check(f"prepare --dits {dits}", prepare)
    if results["failed"]:
        print(f"{results['passed']} passed, {results['failed']} failed")
        return 1
    result = os.path.join(out, "comfyui-quick.json")
    r = subprocess.run([sys.executable, SEED, "run", "--models", opts.models, "--out", result, "--table",
                        "--settings", opts.settings, "--methods", opts.methods, "--gpu", "--python", sys.executable,
                        "--comfyui", comfyui, "--ferry-lib", lib, "--process-timeout", str(opts.process_timeout)])
    print(f"comfyui_seed.py run exited {r.returncode}", flush=True)
    if not os.path.exists(result):
        print(f"FAIL comfyui_seed.py run wrote no result at {result}")
        return 1
    check_result(result, table=False)   # run --table printed it
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 0 if results["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
