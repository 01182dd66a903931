#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/comfyui_seed.py off the GPU and without ComfyUI or torch:

- settings [MODEL-][vG-]HOST: their parts, the old names, names refused;
- the run order: settings grouped by GPU size, the method order reversed
  from one setting to the next;
- a process's status from the harness's result: ok only when every prompt
  passed and the process exited 0; "exit" (with the returncode and the fault
  handler's stack) when every prompt passed and the process did not;
- outputs compared with stock's (another setting's stock only with the same
  DiT) and with fast_disk's; the table;
- prepare at real-size shapes made small (a stand-in value pool): a later
  prepare with another DiT writes only that file and keeps the manifest's
  roles; the same prepare again writes nothing; --tiny as well.

    test_comfyui_seed.py      (exit 0 passed, 1 failed, 77 without numpy)
"""
import contextlib
import io
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import numpy  # noqa: F401 (tests/data/comfy_models.py needs it)
except ImportError:
    print("test_comfyui_seed: no numpy (bench/comfyui_seed.py's tests/data/comfy_models.py needs it): skipped")
    sys.exit(77)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import comfyui_seed as cs  # noqa: E402

failures = []


def check(name, cond, detail=""):
    if not cond:
        failures.append(name)
        print(f"FAIL: {name}: {detail}")


# ---- settings
want = {
    "none": ("14B", None, "none"),
    "cg8": ("14B", None, "cg8"),
    "avail32": ("14B", None, "avail32"),
    "1.3b-v6-none": ("1.3B", 6.0, "none"),
    "1.3b-v12-none": ("1.3B", 12.0, "none"),
    "14b-v24-none": ("14B", 24.0, "none"),
    "14b-v24-cg8": ("14B", 24.0, "cg8"),
    "14b-v12-cg16": ("14B", 12.0, "cg16"),
    "14b-full-none": ("14B", None, "none"),
    "v16-avail32.5": ("14B", 16.0, "avail32.5"),
    "1.3B-V6-CG8": ("1.3B", 6.0, "cg8"),
    "v7.5-none": ("14B", 7.5, "none"),
}
for name, (model, gib, host) in want.items():
    try:
        p = cs.parse_setting(name)
        got = (p["model"], p["vram_gib"], p["host"])
    except ValueError as e:
        got = e
    check(f"setting {name}", got == (model, gib, host), f"{got} != {(model, gib, host)}")
for name, gib in (("none", 24.0), ("14b-full-none", 24.0), ("1.3b-v6-none", 6.0), ("cg8", 24.0)):
    got = cs.parse_setting(name, 24.0)["vram_gib"]
    check(f"setting {name} with --vram-gib 24", got == gib, f"{got} != {gib}")
for bad in ("", "2b-none", "1.3b-v0-none", "14b-none-v6", "14b-", "v6", "full", "1.3b-v6", "cg", "14b-v6-v12-none",
            "none,cg8", "14b-vfull-none"):
    try:
        cs.parse_setting(bad)
        check(f"setting {bad!r} refused", False, "parsed")
    except ValueError:
        pass

# ---- run order
steps = cs.plan(["14b-v24-none", "1.3b-v6-none", "14b-v24-cg8", "none", "14b-full-none"], ["a", "b"], 24.0)
got = [(s, m) for s, _, m in steps]
order = [("14b-v24-none", "a"), ("14b-v24-none", "b"), ("14b-v24-cg8", "b"), ("14b-v24-cg8", "a"),
         ("none", "a"), ("none", "b"), ("14b-full-none", "b"), ("14b-full-none", "a"),
         ("1.3b-v6-none", "a"), ("1.3b-v6-none", "b")]
check("plan groups by GPU size, alternating the methods", got == order, got)
steps = cs.plan(cs.SETTINGS, ["stock", "fast_disk", "ferry"])
check("plan keeps the old settings' order", [s for s, _, _ in steps[::3]] == list(cs.SETTINGS), steps)
quick = [s for s, _, _ in cs.plan("1.3b-v6-none,1.3b-v12-none,14b-v24-none".split(","), ["fast_disk", "ferry"])]
check("quick settings in order", quick[::2] == ["1.3b-v6-none", "1.3b-v12-none", "14b-v24-none"], quick)
m = {"tiny": True, "files": {"unet": "tiny.safetensors"}}
check("tiny: one DiT for every size", cs.dit_file(m, "1.3B") == cs.dit_file(m, "14B") == "tiny.safetensors")
m = {"tiny": False, "files": {"unet": "a14.safetensors", "unet_1.3B": "a13.safetensors"}}
check("real: the DiT of the size", (cs.dit_file(m, "14B"), cs.dit_file(m, "1.3B")) == ("a14.safetensors",
                                                                                        "a13.safetensors"))
check("real: a size not prepared", cs.dit_file({"tiny": False, "files": {"unet": "x"}}, "1.3B") is None)

# ---- statuses
with tempfile.TemporaryDirectory() as d:
    log = os.path.join(d, "comfyui.log")
    with open(log, "w") as f:
        f.write("INFO prompt done\nFatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n"
                '  File "x.py", line 3 in f\n')
    ok3 = {"ok": True, "runs": [{"ok": True}] * 3, "log_file": log}
    st, err = cs.outcome(dict(ok3, returncode=0), 3, 100)
    check("ok: prompts passed, exit 0", (st, err) == ("ok", None), (st, err))
    st, err = cs.outcome(dict(ok3, returncode=-11), 3, 100)
    check("exit: prompts passed, SIGSEGV", st == "exit" and "returncode -11 (SIGSEGV)" in err
          and "Fatal Python error: Segmentation fault" in err and 'x.py", line 3' in err, (st, err))
    st, err = cs.outcome(dict(ok3, returncode=1), 3, 100)
    check("exit: prompts passed, exit 1", st == "exit" and "returncode 1" in err, (st, err))
    st, err = cs.outcome(dict(ok3, returncode=0, runs=[{"ok": True}] * 2), 3, 100)
    check("not every prompt ran", st == "error", (st, err))
    failed = {"ok": False, "runs": [{"ok": True}, {"ok": False, "error": {"message": "boom"}}], "returncode": 1,
              "log_file": log}
    st, err = cs.outcome(failed, 3, 100)
    check("error: a prompt failed", st == "error" and "boom" in err and "returncode 1" in err, (st, err))
    st, err = cs.outcome(dict(ok3, returncode=None), 3, 100)
    check("timeout", st == "timeout" and "100 s" in err, (st, err))
    st, err = cs.outcome(dict(failed, returncode=-9), 3, 100, lambda: ["Killed process 7"])
    check("oom", st == "oom", (st, err))
    st, err = cs.outcome(dict(failed, returncode=-9), 3, 100, lambda: None)
    check("killed", st == "killed", (st, err))

# ---- comparisons and the table


def proc(setting, method, digests, status="ok", uss=1.0):
    return dict(cs.record(setting, cs.parse_setting(setting, 24.0), method), status=status, digests=digests,
                first_s=2.0, later_s=[1.0, 1.0], returncode=0 if status == "ok" else -11,
                error=None if status == "ok" else "every prompt passed, then the process exited with returncode -11",
                memory={"peak_rss_gib": uss + 0.1, "peak_uss_gib": uss})


A, B, C = ["a1", "a2", "a3"], ["b1", "b2", "b3"], ["c1", "c2", "c3"]
procs = [proc("1.3b-v6-none", "fast_disk", A), proc("1.3b-v6-none", "ferry", A),
         proc("1.3b-v12-none", "ferry", B), proc("1.3b-v12-none", "fast_disk", A),
         proc("14b-v24-none", "stock", C), proc("14b-v24-none", "fast_disk", C),
         proc("14b-v24-none", "ferry", C, status="exit"),
         proc("14b-v24-cg8", "stock", None, status="oom"), proc("14b-v24-cg8", "ferry", C)]
cs.compare(procs)
same = [(p["setting"], p["method"], p["same_as_stock"], p["same_as_fast_disk"]) for p in procs]
check("compare", same == [
    ("1.3b-v6-none", "fast_disk", None, None), ("1.3b-v6-none", "ferry", None, "yes"),
    ("1.3b-v12-none", "ferry", None, "no"), ("1.3b-v12-none", "fast_disk", None, None),
    ("14b-v24-none", "stock", None, None), ("14b-v24-none", "fast_disk", "yes", None),
    ("14b-v24-none", "ferry", None, None), ("14b-v24-cg8", "stock", None, None),
    ("14b-v24-cg8", "ferry", "yes*", None)], same)
r = cs.ratios(procs)
check("ratios per setting", r["1.3b-v6-none"] == {"ferry_first_over_fast_disk_first": 1.0,
                                                  "ferry_later_over_fast_disk_later": 1.0}
      and r["14b-v24-none"] == {}, r)
t = cs.table({"processes": procs, "ratios": r})
check("table: DiT and GPU size", "| 1.3b-v6-none | 1.3B | 6 | ferry | 2.0 | 1.0, 1.0 | 1.1 | 1.0 | fast_disk yes | ok |"
      in t, t)
check("table: exit", "| 14b-v24-none | 14B | 24 | ferry |" in t and "| exit: every prompt passed, then the process "
      "exited with returncode -11 |" in t, t)
check("table: stock of another setting", "| stock yes* | ok |" in t, t)
check("table: an old result", "| none | 14B |  | stock |" in cs.table({"processes": [
    {"setting": "none", "method": "stock", "status": "ok", "first_s": 1.0, "later_s": [], "memory": {}}]}), "")


# ---- prepare: what is there is kept
class SmallPool:
    """comfyui_seed.Pool's interface without torch: bytes of a pattern."""
    N = 4099
    device = "cpu"

    def __init__(self, seed):
        self.buf = bytes(range(256)) * 40

    def window(self, name, shape, dtype):
        return self.buf, len(name) % 100


small = dict(text_dim=8, in_ch=16, out_ch=16, patch=(1, 2, 2))
cs.DITS = {"14B": dict(small, dim=16, ffn=32, blocks=2, heads=1), "1.3B": dict(small, dim=8, ffn=24, blocks=1, heads=1)}
cs.UMT5 = dict(dim=8, vocab=cs.comfy_models.UMT5_VOCAB, umt5=True, blocks=1, ff=16, heads=2, kv=4)
cs.WAN_VAE = dict(dim=8)
cs.Pool = SmallPool


def prepare(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = cs.main(["prepare"] + list(args))
        except SystemExit as e:   # a usage error: its message
            rc, out = 2, io.StringIO(str(e.code))
    return rc, out.getvalue()


with tempfile.TemporaryDirectory() as d:
    rc, out = prepare("--models", d)
    man = json.load(open(os.path.join(d, cs.MANIFEST)))
    check("prepare 14B", rc == 0 and sorted(man["files"]) == ["clip", "unet", "vae"]
          and man["files"]["unet"] == "wan2.1_t2v_14B_bf16.safetensors", (rc, out, man))
    mt = {r: os.stat(os.path.join(d, p)).st_mtime_ns for r, p in man["paths"].items()}
    rc, out = prepare("--models", d, "--dits", "14B,1.3B")
    man = json.load(open(os.path.join(d, cs.MANIFEST)))
    check("prepare 14B,1.3B writes the 1.3B only", rc == 0 and "writing unet_1.3B" in out
          and man["files"].get("unet_1.3B") == "wan2.1_t2v_1.3B_bf16.safetensors"
          and all(os.stat(os.path.join(d, man["paths"][r])).st_mtime_ns == t for r, t in mt.items()), (out, man))
    rc, out = prepare("--models", d, "--dits", "1.3B,14B")
    check("prepare again: there already", rc == 0 and "there already" in out, out)
    rc, out = prepare("--models", d)
    man2 = json.load(open(os.path.join(d, cs.MANIFEST)))
    check("prepare 14B after both: there already, the 1.3B kept", "there already" in out
          and "unet_1.3B" in man2["files"], (out, man2))
    os.remove(os.path.join(d, man["paths"]["unet_1.3B"]))
    rc, out = prepare("--models", d, "--dits", "14B,1.3B")
    check("a missing file is written again", rc == 0 and "writing unet_1.3B" in out, out)
    rc, out = prepare("--models", d, "--dits", "14B,2B")
    check("an unknown DiT size is refused", rc == 2 and "unknown DiT size '2B'" in out, (rc, out))
with tempfile.TemporaryDirectory() as d:
    rc, out = prepare("--models", d, "--tiny", "--dits", "14B,1.3B")
    man = json.load(open(os.path.join(d, cs.MANIFEST)))
    check("prepare --tiny: one DiT", rc == 0 and man["tiny"] and sorted(man["files"]) == ["clip", "unet", "vae"], man)
    rc, out = prepare("--models", d, "--tiny")
    check("prepare --tiny again: there already", "there already" in out, out)

print(f"comfyui_seed: {len(failures)} failed" if failures else "comfyui_seed: all checks passed")
sys.exit(1 if failures else 0)
