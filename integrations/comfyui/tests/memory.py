# SPDX-License-Identifier: MIT
"""memory - the private memory a loader node adds, stock against ferry, each
load in a fresh process (ComfyUI on the CPU, the pack loaded as a custom node).

    python memory.py make DIR            # models of 100-300 MB with real key names
    python memory.py all DIR [FLAGS...]  # every node, stock and ferry: a table
    python memory.py one DIR NODE VIA [FLAGS...]   # one load, one JSON line

NODE: unet, unet-bf16, clip, vae, ckpt; VIA: stock, ferry; FLAGS go to ComfyUI
(default --cpu). Figures, in MiB, from /proc/self: anon = resident anonymous
memory (statm: resident less file-backed), the private memory a load really
adds; USS = Private_Clean + Private_Dirty of smaps_rollup, which also counts the
page-cache pages of a file mapped by this process alone (reclaimable, shared
with any other reader of the file). "load" is right after the node returned
(and a gc), "used" after every weight was read once (what inference does),
"peak" the anon high-water mark sampled every 2 ms during the load.
Files are in the page cache (written just before), for stock and ferry alike."""
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MIB = 1 << 20
FILES = {
    "unet": ("diffusion_models", "wan_dit_fp32.safetensors"),
    "unet-bf16": ("diffusion_models", "wan_dit_bf16.safetensors"),
    "clip": ("text_encoders", "clip_l_fp16.safetensors"),
    "vae": ("vae", "wan_vae_fp32.safetensors"),
    "ckpt": ("checkpoints", "wan_dit_vae_fp32.safetensors"),
}


def _statm():
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    page = os.sysconf("SC_PAGE_SIZE")
    return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page


def _uss():
    total = 0
    with open("/proc/self/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def snap():
    rss, anon = _statm()
    return {"rss": rss, "anon": anon, "uss": _uss()}


def make(d):
    import comfy_env
    comfy_env.start(base=d, load_pack=False)
    import torch
    m = os.path.join(d, "models")
    dit = comfy_env.wan21_dit(dim=1024, ffn_dim=4096, num_layers=3)
    comfy_env.save(dit, os.path.join(m, *FILES["unet"]))
    comfy_env.save({k: v.to(torch.bfloat16) for k, v in dit.items()}, os.path.join(m, *FILES["unet-bf16"]))
    vae = comfy_env.wan21_vae(dim=64)
    comfy_env.save(vae, os.path.join(m, *FILES["vae"]))
    both = {"model.diffusion_model." + k: v for k, v in dit.items()}
    both.update({"vae." + k: v for k, v in vae.items()})
    comfy_env.save(both, os.path.join(m, *FILES["ckpt"]))
    del dit, vae, both
    comfy_env.save(comfy_env.clip_l(), os.path.join(m, *FILES["clip"]))
    for node, (sub, name) in FILES.items():
        print(f"{node}: {os.path.getsize(os.path.join(m, sub, name)) / MIB:.1f} MiB {sub}/{name}")


def _weights(node, out):
    """The state dicts of what a node returned."""
    if node.startswith("unet"):
        return [out[0].model.state_dict()]
    if node == "clip":
        return [out[0].cond_stage_model.state_dict()]
    if node == "vae":
        return [out[0].first_stage_model.state_dict()]
    model, clip, vae = out
    return [model.model.state_dict(), vae.first_stage_model.state_dict()]


def one(d, node, via, flags):
    import comfy_env
    _, pack = comfy_env.start(base=d, flags=tuple(flags) or ("--cpu",))
    import gc
    import nodes
    import torch
    L = pack.loaders
    name = FILES[node][1]
    calls = {
        "unet": (nodes.UNETLoader, L.FerryUNETLoader, "load_unet", (name, "default")),
        "unet-bf16": (nodes.UNETLoader, L.FerryUNETLoader, "load_unet", (name, "default")),
        "clip": (nodes.CLIPLoader, L.FerryCLIPLoader, "load_clip", (name, "stable_diffusion")),
        "vae": (nodes.VAELoader, L.FerryVAELoader, "load_vae", (name,)),
        "ckpt": (nodes.CheckpointLoaderSimple, L.FerryCheckpointLoaderSimple, "load_checkpoint", (name,)),
    }
    stock_cls, ferry_cls, method, args = calls[node]
    cls = stock_cls if via == "stock" else ferry_cls
    gc.collect()
    before = snap()
    peak = [before["anon"]]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _statm()[1])

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = getattr(cls(), method)(*args)
    seconds = time.perf_counter() - t0
    stop.set()
    th.join()
    gc.collect()
    loaded = snap()
    peak[0] = max(peak[0], loaded["anon"])
    with torch.inference_mode():
        for sd in _weights(node, out):
            for t in sd.values():
                t.sum()
    used = snap()
    ev = L.memstats.tracker._loads[-1] if via == "ferry" else {}
    rec = {"node": node, "via": via, "flags": flags, "seconds": round(seconds, 3),
           "before": before, "load": loaded, "used": used, "anon_peak": peak[0],
           "kept_bytes": ev.get("kept_bytes"), "copied_bytes": ev.get("copied_bytes"), "via_taken": ev.get("via")}
    print("RESULT " + json.dumps(rec))


def run_all(d, flags):
    env = dict(os.environ)
    rows = []
    for node in FILES:
        for via in ("stock", "ferry"):
            p = subprocess.run([sys.executable, __file__, "one", d, node, via, *flags], env=env,
                               capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode or not line:
                print(p.stdout[-2000:], p.stderr[-4000:])
                raise SystemExit(f"{node} {via} failed")
            rows.append(json.loads(line[0][7:]))
    m = lambda n: f"{n / MIB:8.1f}"
    size = {node: os.path.getsize(os.path.join(d, "models", *FILES[node])) for node in FILES}
    print(f"ComfyUI flags: {' '.join(flags) or '--cpu'}; MiB added to the process by the load")
    print(f"{'node':10} {'via':6} {'file':>8} {'anon load':>10} {'anon peak':>10} {'anon used':>10}"
          f" {'USS load':>9} {'USS used':>9} {'kept':>8} {'s':>6}")
    for r in rows:
        b = r["before"]
        kept = m(r["kept_bytes"]) if r["kept_bytes"] is not None else "       -"
        print(f"{r['node']:10} {r['via']:6} {m(size[r['node']])} {m(r['load']['anon'] - b['anon']):>10}"
              f" {m(r['anon_peak'] - b['anon']):>10} {m(r['used']['anon'] - b['anon']):>10}"
              f" {m(r['load']['uss'] - b['uss']):>9} {m(r['used']['uss'] - b['uss']):>9} {kept} {r['seconds']:6.2f}")
    return rows


if __name__ == "__main__":
    cmd, d, *rest = sys.argv[1:]
    d = os.path.abspath(d)
    if cmd == "make":
        make(d)
    elif cmd == "one":
        one(d, rest[0], rest[1], rest[2:])
    elif cmd == "all":
        run_all(d, rest)
    else:
        raise SystemExit(__doc__)
