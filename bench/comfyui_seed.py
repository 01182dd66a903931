#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""comfyui_seed - the seed workload in ComfyUI: Wan 2.1 T2V (14B, or 1.3B)
text to video with stock ComfyUI's loaders, with --fast-disk, and with
ferry's node pack, each in a fresh ComfyUI process per setting (the DiT, the
GPU's free memory, the host memory).

    # models with random weights of the real shapes (40 GB with the 14B DiT,
    # 2.8 GB more with the 1.3B one; --tiny: test size)
    python bench/comfyui_seed.py prepare --models DIR [--tiny] [--dits 14B,1.3B]
        [--experts 2 [--expert-dtype fp8_e4m3fn|fp8_scaled|bf16]]
    # ComfyUI's model detection on those shapes (no files written; needs ComfyUI)
    python bench/comfyui_seed.py check [--tiny] [--dits 14B,1.3B] [--experts 2] [--comfyui DIR]
    # the benchmark: one ComfyUI process per setting x method, 3 prompts each
    python bench/comfyui_seed.py run --models DIR --out RESULT.json [--table]
        [--settings none,avail32,cg32,cg16,cg8] [--methods stock,fast_disk,ferry]
        [--vram-gib 24] [--python PY] [--comfyui DIR] [--ferry-lib SO]
        [--deadline S] [--process-timeout S] [--cgroups auto|off|DIR]
        [--squeeze-gib N [--squeeze-after S]]
    # e.g. --settings 1.3b-v6-none,1.3b-v12-none,14b-v24-none --methods fast_disk,ferry
    # the table again from a result
    python bench/comfyui_seed.py table RESULT.json

prepare: the Wan 2.1 T2V DiTs of --dits (default 14B): 14B (dim 5120, ffn
13824, 40 blocks, 40 heads; 28.6 GB BF16), 1.3B (dim 1536, ffn 8960, 30
blocks, 12 heads; 2.8 GB BF16), both text dim 4096, 16 channels in and out,
patch (1, 2, 2); UMT5-XXL (d_model 4096, vocab 256384, 24 blocks, d_ff 10240,
64 heads of 64; 11.4 GB BF16, with a small SentencePiece model inside as
"spiece_model", where ComfyUI's Wan text encoder takes its tokenizer from)
and the Wan 2.1 VAE (width 96), shared by both DiTs, in ComfyUI's models/
layout, key names and value scales from tests/data/comfy_models.py. The
manifest (seed_manifest.json) names each file by role: "unet" the 14B DiT,
"unet_1.3B" the 1.3B one, "clip", "vae" (and "unet_high"). A file an earlier
prepare recorded (same --tiny, --experts, --expert-dtype) at its recorded
size is kept, so a later prepare with more DiTs writes only those. Values
are a 32 Mi-element random pool (torch, on CUDA where there is one) scaled
once per value rule and written as windows at a per-tensor offset, so
writing is file I/O only. At real size ComfyUI detects the files with its
default configs (`check`: the 1.3B file as WAN21_T2V with dim 1536, 30
layers, 12 heads); --tiny writes comfy_models.py's tiny files, one tiny DiT
that stands for every size, which need its overrides (passed through).
--experts 2 adds a high-noise 14B expert (Wan 2.2 A14B style: same
architecture) and samples with two KSamplerAdvanced halves; --expert-dtype
(default fp8_e4m3fn with two experts: two BF16 experts and UMT5 exceed the
GPU machine's 64 GB disk) stores the 14B blocks' matrices as plain
float8_e4m3fn, which ComfyUI runs with weights cast at use ("manual cast");
fp8_scaled adds ComfyUI's scaled-fp8 markers ("scaled_fp8" and a
".scale_weight" of 1.0 per matrix), which ComfyUI turns into its quantized
layers (comfy_kitchen). The 1.3B DiT is always BF16.

run: per setting and method a fresh ComfyUI (tests/comfyui/harness.py) runs 3
prompts that differ by seed: UNETLoader -> CLIPLoader(wan) -> CLIPTextEncode
-> KSampler (4 steps, 480x272, 9 frames, cfg 2 against the zeroed text) ->
VAEDecode -> SaveImage and the harness's exact tensor digests. Methods:
stock; fast_disk (stock with --fast-disk); ferry (the pack's loader nodes,
ferry from this checkout's python/ and --ferry-lib). A setting is
[MODEL-][vG-]HOST. MODEL: 14b (default) or 1.3b, the DiT the prompts load.
vG: a helper holds GPU memory until cudaMemGetInfo reports G GiB free;
`full` or no vG: --vram-gib's G, or no helper when that is unset. The
settings run grouped by G (in the order each G first appears), one helper
per G, started before its group and stopped after it (none with --cpu); its
`ready` facts go into each process record ("vram"), and a helper that cannot
hold its G makes its processes "unavailable". HOST: none; availN
(MemAvailable N GiB: a helper process mlocks the rest); cgN (a hard N GiB
memory cgroup, v1 memory.limit_in_bytes or v2 memory.max, that ComfyUI's
process enters before it execs Python). The old names (none, avail32, cg8,
...) are 14B settings at --vram-gib. The method order reverses from one
setting to the next. Each ComfyUI process runs with PYTHONFAULTHANDLER=1, so
a crash, at exit too, leaves the Python stacks in its log. Measured per
process: status (ok: every prompt passed and the process exited 0; exit:
every prompt passed, then a non-zero returncode, e.g. a crash at exit;
error, oom, killed, timeout, unavailable, skipped) and returncode, the first
prompt's seconds and the later ones' (execute only: start-up apart), output
digests (compared with stock's and with fast_disk's in the same setting),
peak RSS (/proc/PID/statm every 50 ms) and peak USS (Private_Clean +
Private_Dirty of /proc/PID/smaps_rollup, read in a loop 100 ms apart: a
read costs 10-30 ms per resident GiB, so this is done here, not in
ComfyUI's process), the cgroup's counters, and the pack's per-prompt JSON
($FERRY_COMFYUI_STATS, set for every method; stock writes none; its
in-process USS reads are off unless --pack-uss). The table has a row per
process (setting, DiT, GPU GiB free, method) and the ratios per setting.
The result JSON is rewritten after every process. --squeeze-gib N: another
process takes N GiB of GPU memory --squeeze-after seconds into each ComfyUI
process (in the middle of a prompt) and holds it to the end; what it took is
the record's "squeeze".
"""
import argparse
import concurrent.futures
import ctypes
import json
import mmap
import os
import re
import signal
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "comfyui"))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))

import comfy_models  # noqa: E402
import harness  # noqa: E402
import prompts  # noqa: E402
import stwriter  # noqa: E402

GIB = 1 << 30
PACK = os.path.join(ROOT, "integrations", "comfyui")
METHODS = ("stock", "fast_disk", "ferry")
SETTINGS = ("none", "avail32", "cg32", "cg16", "cg8")
SEEDS = (42, 43, 44)

# real dims of the seed workload's models: the Wan 2.1 T2V DiTs by size (heads:
# what ComfyUI derives from dim, dim // 128; checked by `check`), UMT5-XXL, the VAE
DITS = {"14B": dict(dim=5120, ffn=13824, blocks=40, heads=40, text_dim=4096, in_ch=16, out_ch=16, patch=(1, 2, 2)),
        "1.3B": dict(dim=1536, ffn=8960, blocks=30, heads=12, text_dim=4096, in_ch=16, out_ch=16, patch=(1, 2, 2))}
UMT5 = dict(dim=4096, vocab=256384, umt5=True, blocks=24, ff=10240, heads=64, kv=64)
WAN_VAE = dict(dim=96)
# the files by manifest role: "unet" is the 14B DiT, "unet_<size>" another size's
REAL_FILES = {"unet": "diffusion_models/wan2.1_t2v_14B_{dtype}.safetensors",
              "unet_high": "diffusion_models/wan2.2_t2v_high_noise_14B_{dtype}.safetensors",
              "unet_1.3B": "diffusion_models/wan2.1_t2v_1.3B_bf16.safetensors",
              "clip": "text_encoders/umt5_xxl_bf16.safetensors",
              "vae": "vae/wan_2.1_vae.safetensors"}
REAL_SIZE = dict(width=480, height=272, length=9, steps=4)
TINY_SIZE = dict(width=prompts.SIZE, height=prompts.SIZE, length=5, steps=2)
MANIFEST = "seed_manifest.json"


# ------------------------------------------------------------------ prepare

def dit_role(size):
    """The manifest role of a DiT size: "unet" for 14B, "unet_<size>" else."""
    return "unet" if size == "14B" else f"unet_{size}"


def dit_entries(size):
    """[(name, shape)] of the real-size Wan 2.1 T2V DiT of `size`."""
    return comfy_models.wan21_t2v_entries(**{k: v for k, v in DITS[size].items() if k != "heads"})


def real_entries(experts=1, dits=("14B",)):
    """{role: [(name, shape)]} of the real-size models: the DiTs of `dits`
    (with two experts, the 14B pair), UMT5-XXL and the VAE."""
    out = {dit_role(d): dit_entries(d) for d in dits}
    if experts == 2:
        out["unet_high"] = out["unet"]
    out.update(clip=comfy_models.t5_entries(**UMT5), vae=comfy_models.wan21_vae_entries(**WAN_VAE))
    return out


class Pool:
    """A pool of standard-normal values, made once (on CUDA if available),
    and per (value rule, dtype) its scaled bytes, which tensors are cut from
    as windows starting at an offset from their name (wrapping)."""
    N = 33554393    # elements: a prime near 32 Mi, so rows do not line up with the period

    def __init__(self, seed):
        import torch
        self.torch = torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        g = torch.Generator(dev).manual_seed(seed)
        self.x = torch.randn(self.N, generator=g, device=dev, dtype=torch.float32)
        self.device = dev
        self.cache = {}

    def scaled(self, rule, dtype):
        key = (rule, dtype)
        if key not in self.cache:
            t, x = self.torch, self.x
            kind = rule[0]
            v = (t.full_like(x, rule[1]) if kind == "const" else 1.0 + 0.02 * x if kind == "norm"
                 else 0.02 * x if kind == "bias" else 0.5 * x if kind == "embed" else x / rule[1] ** 0.5)
            tdt = {"BF16": t.bfloat16, "F16": t.float16, "F32": t.float32, "F8_E4M3": t.float8_e4m3fn}[dtype]
            v = v.to(tdt)
            self.cache[key] = v.view(t.uint8).cpu().numpy().tobytes()
        return self.cache[key]

    def window(self, name, shape, dtype):
        """(scaled bytes, where this tensor starts in them)."""
        buf = self.scaled(comfy_models.value_rule(name, shape), dtype)
        return buf, zlib.crc32(name.encode()) % self.N * (stwriter.DTYPE_BITS[dtype] // 8)


def _cut(buf, start, n):
    """n bytes of buf from start, wrapping at its end (n <= len(buf))."""
    if start + n <= len(buf):
        return memoryview(buf)[start:start + n]
    return buf[start:] + buf[:start + n - len(buf)]


def _expert_dtype(name, shape, expert_dtype):
    if expert_dtype == "bf16" or not (name.startswith("blocks.") and name.endswith(".weight") and len(shape) == 2):
        return "BF16"
    return "F8_E4M3"


def write_real(path, entries, pool, dtype="BF16", expert_dtype=None, extra=(), threads=8, chunk=16 << 20):
    """Write one real-size safetensors file: the header (stwriter's), then
    each tensor as pool windows, 16 MiB pwrites from `threads` threads."""
    tensors = []
    for name, shape in entries:
        dt = _expert_dtype(name, shape, expert_dtype) if expert_dtype else dtype
        tensors.append((name, dt, list(shape), pool.window(name, shape, dt)))
        if expert_dtype == "fp8_scaled" and dt == "F8_E4M3":
            tensors.append((name[:-len(".weight")] + ".scale_weight", "F32", [], b"\x00\x00\x80\x3f"))
    if expert_dtype == "fp8_scaled":
        tensors.append(("scaled_fp8", "F8_E4M3", [0], b""))
    tensors += list(extra)
    sized = [(n, d, s, stwriter.nbytes(d, s)) for n, d, s, _ in tensors]
    hdr = stwriter.header_bytes(sized)
    jobs, off = [(0, struct.pack("<Q", len(hdr)) + hdr)], 8 + len(hdr)
    for (_, _, _, data), (_, _, _, size) in zip(tensors, sized):
        if isinstance(data, bytes):
            jobs.append((off, data))
        else:
            buf, start = data
            jobs += [(off + k, (buf, (start + k) % len(buf), min(chunk, size - k))) for k in range(0, size, chunk)]
        off += size
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, off)

        def put(job):
            at, data = job
            view = memoryview(data if isinstance(data, bytes) else _cut(*data))
            while len(view):
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            list(ex.map(put, jobs))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def cmd_prepare(opts):
    """Write the models and their manifest: {tiny, experts, expert_dtype,
    paths {role: path under the models folder}, files {role: name}, sizes, s}.
    A file an earlier prepare with the same tiny, experts and expert_dtype
    recorded, at its recorded size, is kept (so a later prepare with more
    DiTs writes only the new ones), and so is its role in the manifest."""
    t0 = time.perf_counter()
    want = {"tiny": opts.tiny, "experts": opts.experts, "expert_dtype": opts.expert_dtype}
    dits = list(dict.fromkeys(d.strip() for d in opts.dits.split(",") if d.strip()))
    for d in dits:
        if d not in DITS:
            sys.exit(f"prepare: unknown DiT size {d!r} (one of {', '.join(DITS)})")
    if opts.experts == 2 and "14B" not in dits:
        sys.exit("prepare: --experts 2 is a pair of 14B DiTs: --dits must name 14B")
    if opts.tiny:
        # one tiny DiT, which `run` takes for every size
        paths = dict(comfy_models.FILES["wan"])
        if opts.experts == 2:
            paths["unet_high"] = "diffusion_models/tiny_wan2.2_t2v_high_noise.safetensors"
    else:
        entries = real_entries(opts.experts, dits)
        udt = opts.expert_dtype if opts.experts == 2 else "bf16"
        paths = {r: p.format(dtype=udt) for r, p in REAL_FILES.items() if r in entries}
    mpath = os.path.join(opts.models, MANIFEST)
    kept = {}
    try:
        with open(mpath) as f:
            old = json.load(f)
        if all(old.get(k) == v for k, v in want.items()):
            for r, p in old["paths"].items():
                try:
                    if os.path.getsize(os.path.join(opts.models, p)) == old["sizes"][r]:
                        kept[r] = p
                except OSError:
                    pass
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    todo = {r: p for r, p in paths.items() if kept.get(r) != p}
    if not todo:
        size = sum(os.path.getsize(os.path.join(opts.models, p)) for p in paths.values())
        print(f"prepare: the models in {opts.models} are there already ({size / 1e9:.1f} GB)")
        return 0
    os.makedirs(opts.models, exist_ok=True)
    if opts.tiny:
        comfy_models.write_models(opts.models, archs=("wan",))
        if opts.experts == 2:
            meta = {"config": json.dumps({"transformer": {"text_dim": comfy_models.UMT5_DIM}})}
            comfy_models.write(os.path.join(opts.models, paths["unet_high"]), comfy_models.wan21_t2v_entries(),
                               "BF16", 11, metadata=meta)
    else:
        if kept:
            print(f"prepare: kept {', '.join(sorted(kept))}; writing {', '.join(todo)}")
        pool = Pool(opts.seed)
        print(f"prepare: value pool on {pool.device}")
        sp = comfy_models.spiece_model()
        for role, rel in todo.items():
            t = time.perf_counter()
            path = os.path.join(opts.models, rel)
            if role.startswith("unet"):
                fp8 = role in ("unet", "unet_high") and udt != "bf16"
                write_real(path, entries[role], pool, expert_dtype=udt if fp8 else None)
            else:
                extra = [("spiece_model", "U8", [len(sp)], sp)] if role == "clip" else ()
                write_real(path, entries[role], pool, extra=extra)
            size = os.path.getsize(path)
            dt = time.perf_counter() - t
            print(f"prepare: {rel} {size / 1e9:.2f} GB in {dt:.1f} s ({size / 1e9 / max(dt, 1e-9):.2f} GB/s)", flush=True)
    paths = dict(kept, **paths)
    sizes = {r: os.path.getsize(os.path.join(opts.models, p)) for r, p in paths.items()}
    manifest = dict(want, paths=paths, files={r: p.split("/", 1)[1] for r, p in paths.items()},
                    sizes=sizes, s=round(time.perf_counter() - t0, 1))
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
    wrote = sum(sizes[r] for r in todo)
    print(f"prepare: {wrote / 1e9:.2f} GB written in {manifest['s']} s; "
          f"{sum(sizes.values()) / 1e9:.2f} GB in {opts.models}")
    return 0


def cmd_check(opts):
    """ComfyUI's detection on the models' shapes, as meta tensors (nothing is
    written): the diffusion model's config and supported-model class, the
    text encoder's kind and the Wan text encoder it would build, the VAE's
    kind. Exits 1 where the real-size files would not be taken for Wan 2.1
    T2V of each --dits size (its dim, blocks, heads and ffn) / UMT5-XXL."""
    import torch
    comfyui = opts.comfyui or harness.find_comfyui()[0]
    sys.path.insert(0, comfyui)
    import comfy.options
    comfy.options.enable_args_parsing()
    sys.argv = ["main.py"] + ([] if torch.cuda.is_available() else ["--cpu"])
    import comfy.model_detection as md
    import comfy.sd
    import comfy.text_encoders.sd3_clip as sd3
    dits = [d.strip() for d in opts.dits.split(",") if d.strip()]
    if any(d not in DITS for d in dits):
        sys.exit(f"check: --dits takes {', '.join(DITS)}")
    ents = real_entries(opts.experts, dits) if not opts.tiny else {
        "unet": comfy_models.wan21_t2v_entries(), "vae": comfy_models.wan21_vae_entries(),
        "clip": comfy_models.t5_entries(comfy_models.UMT5_DIM, comfy_models.UMT5_VOCAB, umt5=True)}

    def meta(entries, dtype=torch.bfloat16):
        return {n: torch.empty(s, dtype=dtype, device="meta") for n, s in entries}
    ok = True
    for size in ["tiny"] if opts.tiny else dits:
        unet = meta(ents["unet" if opts.tiny else dit_role(size)])
        cfg = md.detect_unet_config(unet, "")
        mc = md.model_config_from_unet(unet, "")
        print(f"unet {size} config:", cfg)
        print(f"unet {size} supported model:", type(mc).__name__ if mc else None)
        d = DITS.get(size)
        ok &= mc is not None and type(mc).__name__ == "WAN21_T2V" and (opts.tiny or (
            cfg["dim"], cfg["num_layers"], cfg["num_heads"], cfg["ffn_dim"], cfg["in_dim"], cfg["out_dim"]) == (
            d["dim"], d["blocks"], d["heads"], d["ffn"], d["in_ch"], d["out_ch"]))
    clip = meta(ents["clip"])
    te = comfy.sd.detect_te_model(clip)
    det = sd3.t5_xxl_detect(clip)
    print("text encoder:", te, det)
    ok &= te == comfy.sd.TEModel.T5_XXL
    with open(os.path.join(comfyui, "comfy", "text_encoders", "umt5_config_xxl.json")) as f:
        tcfg = json.load(f)
    if not opts.tiny:
        real = (tcfg["d_model"], tcfg["vocab_size"], tcfg["num_layers"], tcfg["d_ff"], tcfg["num_heads"], tcfg["d_kv"])
        mine = (UMT5["dim"], UMT5["vocab"], UMT5["blocks"], UMT5["ff"], UMT5["heads"], UMT5["kv"])
        print("umt5_config_xxl.json:", real, "written:", mine)
        ok &= real == mine
    vae = meta(ents["vae"])
    print("vae: wan 2.1" if "decoder.middle.0.residual.0.gamma" in vae else "vae: not wan",
          "dim", vae["decoder.conv1.weight"].shape[0] // 4)
    n = {r: sum(int(torch.Size(s).numel()) for _, s in e) for r, e in ents.items()}
    print("parameters:", {r: f"{v / 1e9:.3f} G ({2 * v / 1e9:.1f} GB BF16)" for r, v in n.items()})
    print("detection", "OK" if ok else "FAILED")
    return 0 if ok else 1


# ------------------------------------------------------------------ prompts

def workflow(files, seed, size, experts=1):
    """The seed prompt: prompts.wan21_t2v's graph at `size`, sampled with
    `seed`; with two experts, KSamplerAdvanced on the high-noise expert for
    the first half of the steps, then on the low-noise one ("sampler")."""
    p = prompts.wan21_t2v(files)
    p["latent"]["inputs"].update(width=size["width"], height=size["height"], length=size["length"])
    s = p["sampler"]["inputs"]
    s.update(seed=seed, steps=size["steps"])
    if experts == 2:
        half = size["steps"] // 2
        p["unet_high"] = {"class_type": "UNETLoader",
                          "inputs": {"unet_name": files["unet_high"], "weight_dtype": "default"}}
        common = {k: s[k] for k in ("steps", "cfg", "sampler_name", "scheduler", "positive", "negative")}
        p["sampler_high"] = {"class_type": "KSamplerAdvanced", "inputs": dict(
            common, model=["unet_high", 0], add_noise="enable", noise_seed=seed, latent_image=["latent", 0],
            start_at_step=0, end_at_step=half, return_with_leftover_noise="enable")}
        p["sampler"] = {"class_type": "KSamplerAdvanced", "inputs": dict(
            common, model=s["model"], add_noise="disable", noise_seed=seed, latent_image=["sampler_high", 0],
            start_at_step=half, end_at_step=10000, return_with_leftover_noise="disable")}
    return p


# ----------------------------------------------------------------- settings

# [MODEL-][vG-]HOST: the DiT (14b, 1.3b; default 14b), the GPU's free memory
# (vG: G GiB; full or absent: --vram-gib's, none when that is unset), the host
SETTING = re.compile(r"(?:(?P<model>14b|1\.3b)-)?(?:v(?P<vram>\d+(?:\.\d+)?)-|(?P<full>full)-)?"
                     r"(?P<host>none|avail\d+(?:\.\d+)?|cg\d+(?:\.\d+)?)", re.I)


def parse_setting(name, vram_gib=None):
    """A setting's parts: {"model": "14B" or "1.3B", "vram_gib": G or None
    (no VRAM helper), "host": "none", "availN" or "cgN"}; ValueError when
    `name` is not [MODEL-][vG-]HOST. vram_gib: --vram-gib's value, for a
    setting without vG or with `full`."""
    m = SETTING.fullmatch(name)
    if not m or (m.group("vram") and float(m.group("vram")) <= 0):
        raise ValueError(f"unknown setting {name!r}: [14b-|1.3b-][vG-|full-](none|availN|cgN)")
    model = (m.group("model") or "14b").upper()
    return {"model": model, "vram_gib": float(m.group("vram")) if m.group("vram") else vram_gib,
            "host": m.group("host").lower()}


def plan(settings, methods, vram_gib=None):
    """[(setting, its parts, method)] in run order: the settings grouped by
    their GPU size (in the order each size first appears; one VRAM helper per
    group), the method order reversed from one setting to the next."""
    parsed = [(s, parse_setting(s, vram_gib)) for s in settings]
    sizes = list(dict.fromkeys(p["vram_gib"] for _, p in parsed))
    parsed.sort(key=lambda sp: sizes.index(sp[1]["vram_gib"]))
    return [(s, p, m) for i, (s, p) in enumerate(parsed) for m in (methods if i % 2 == 0 else methods[::-1])]


def dit_file(manifest, model):
    """The DiT file (as UNETLoader lists it) of `model` in the prepared
    models: the tiny DiT for every size; None where it was not prepared."""
    files = manifest["files"]
    return files["unet"] if manifest["tiny"] else files.get(dit_role(model))


# ------------------------------------------------------------ host settings

class Unavailable(Exception):
    """A setting this machine cannot make (the reason is the message)."""


def meminfo(key="MemAvailable"):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


class Helper:
    """A helper process (this file's _lock or _vram) that prints one line
    when its memory is held and holds it until stopped."""

    def __init__(self, args, what, timeout=180):
        self.what = what
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        box = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        line = box[0].strip() if box else ""
        if not line.startswith("ready"):
            self.stop()
            raise Unavailable(f"{what}: {line or 'no answer in %d s' % timeout}")
        self.info = json.loads(line[len("ready"):])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def helper_lock(nbytes):
    """_lock: mlock nbytes of anonymous memory, 256 MiB at a time; print
    'ready {...}' (or the error) and hold it until SIGTERM."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    held, step = [], 256 << 20
    left = nbytes
    while left > 0:
        n = min(step, left)
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) != 0:
            print(f"mlock failed after {(nbytes - left) / GIB:.1f} GiB: {os.strerror(ctypes.get_errno())}", flush=True)
            return 1
        held.append(m)
        left -= n
    print("ready " + json.dumps({"locked": nbytes, "mem_available_after": meminfo()}), flush=True)
    signal.sigwait([signal.SIGTERM])
    return 0


def helper_vram(gib, take=None):
    """_vram: allocate GPU memory until cudaMemGetInfo reports `gib` GiB
    free (or, with take, up to `take` GiB, as much as the device gives);
    print 'ready {...}' and hold it until SIGTERM."""
    try:
        import torch
        if not torch.cuda.is_available():
            print("no CUDA device", flush=True)
            return 1
        held = []
        while take is not None and sum(t.numel() for t in held) < int(take * GIB):
            try:
                held.append(torch.empty(min(256 << 20, int(take * GIB) - sum(t.numel() for t in held)),
                                        dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                break
        target, chunk = int((gib or 0) * GIB), 1 << 30
        while take is None:
            free, total = torch.cuda.mem_get_info()
            over = free - target
            if over <= 0:
                break
            n = min(chunk, over)
            if n < (1 << 20) and over < (2 << 20):
                break
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        free, total = torch.cuda.mem_get_info()
        print("ready " + json.dumps({"free": free, "total": total, "held": sum(t.numel() for t in held)}), flush=True)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", flush=True)
        return 1
    signal.sigwait([signal.SIGTERM])
    return 0


def helper_take(gib):
    """_take: take up to `gib` GiB of GPU memory (256 MiB at a time, as much
    as the device gives), as another process that starts in the middle of a
    prompt would; print 'ready {...}' and hold it until SIGTERM."""
    return helper_vram(None, take=gib)


class Squeeze:
    """--squeeze-gib: a helper that takes that much GPU memory `after`
    seconds into a ComfyUI process (in the middle of a prompt) and holds it
    until the process ends. info: what it took, or why it could not."""

    def __init__(self, gib, after):
        self.helper, self.info = None, {"gib": gib, "after_s": after, "started": False}
        self.timer = threading.Timer(after, self._start, args=(gib,))
        self.timer.daemon = True
        self.timer.start()

    def _start(self, gib):
        try:
            self.helper = Helper(["_take", str(gib)], "VRAM squeeze", timeout=60)
            self.info.update(self.helper.info, started=True)
        except Unavailable as e:
            self.info["error"] = str(e)

    def stop(self):
        self.timer.cancel()
        self.timer.join()
        if self.helper:
            self.helper.stop()
        return self.info


def cgroup_parent(mode):
    """(dir, version) where a memory cgroup can be made, or raise Unavailable."""
    if mode == "off":
        raise Unavailable("memory cgroups off (--cgroups off)")
    if os.geteuid() != 0 and mode == "auto":
        raise Unavailable("not root: cannot make a memory cgroup")
    cands = [mode] if mode != "auto" else ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
    for d in cands:
        if os.path.isfile(os.path.join(d, "memory.limit_in_bytes")):
            return d, 1
        ctl = os.path.join(d, "cgroup.subtree_control")
        if os.path.isfile(ctl):
            with open(ctl) as f:
                if "memory" in f.read().split():
                    return d, 2
            try:
                with open(ctl, "w") as f:
                    f.write("+memory")
                return d, 2
            except OSError as e:
                raise Unavailable(f"cgroup v2 at {d} without the memory controller ({e})")
    raise Unavailable(f"no writable memory cgroup (v1 memory.limit_in_bytes or v2 memory.max) in {cands}")


class Cgroup:
    """A memory cgroup with a hard limit, made for one process and removed
    after; `wrapper` is a shell script that enters it and execs Python."""

    def __init__(self, gib, name, mode, python, workdir):
        parent, self.version = cgroup_parent(mode)
        self.dir = os.path.join(parent, f"ferry-bench-{name}-{os.getpid()}")
        try:
            os.makedirs(self.dir, exist_ok=True)
            limit = str(int(gib * GIB))
            self._write("memory.limit_in_bytes" if self.version == 1 else "memory.max", limit)
            if self.version == 2 and os.path.exists(os.path.join(self.dir, "memory.swap.max")):
                self._write("memory.swap.max", "0")
        except OSError as e:
            self.remove()
            raise Unavailable(f"cannot set a memory limit in {self.dir}: {e}")
        self.wrapper = os.path.join(workdir, "enter_cgroup.sh")
        with open(self.wrapper, "w") as f:
            f.write(f"#!/bin/sh\n# enter {self.dir}, then run Python\n"
                    f"echo $$ > '{self.dir}/cgroup.procs' || exit 97\nexec '{python}' \"$@\"\n")
        os.chmod(self.wrapper, 0o755)

    def _write(self, name, value):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(value)

    def _read(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    def counters(self):
        """The cgroup's peak, failure and OOM-kill counts."""
        out = {"dir": self.dir, "version": self.version}
        if self.version == 1:
            out.update(limit=self._read("memory.limit_in_bytes"), peak=self._read("memory.max_usage_in_bytes"),
                       failcnt=self._read("memory.failcnt"))
            ctl = self._read("memory.oom_control") or ""
        else:
            out.update(limit=self._read("memory.max"), peak=self._read("memory.peak"))
            ctl = self._read("memory.events") or ""
        m = re.search(r"oom_kill (\d+)", ctl)
        out["oom_kill"] = int(m.group(1)) if m else None
        return out

    def remove(self):
        for _ in range(20):
            try:
                os.rmdir(self.dir)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.25)


# ------------------------------------------------------------------ sampler

class MemSampler:
    """Peak memory of the ComfyUI process (the child of this process whose
    command line runs harness.py), from two threads of this process: RSS
    from /proc/PID/statm every 50 ms, USS (Private_Clean + Private_Dirty) and
    anonymous memory from /proc/PID/smaps_rollup, 100 ms after each read;
    and, at a new USS peak (at most every 5 s), where the private memory is:
    /proc/PID/smaps summed by mapping name ([anon], a library, a checkpoint),
    the largest 12 ("uss_by_mapping")."""

    def __init__(self):
        self.stop_ev = threading.Event()
        self.pid = None
        self.by_mapping, self.by_mapping_t = [], 0.0
        self.peak = {"rss": 0, "uss": 0, "anon": 0}
        self.reads = {"statm": 0, "smaps": 0, "smaps_s": 0.0}
        self.threads = [threading.Thread(target=self._fast, daemon=True),
                        threading.Thread(target=self._slow, daemon=True)]
        for t in self.threads:
            t.start()

    def _find(self):
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != me:
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if b"harness.py" in f.read():
                        return int(d)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def _fast(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stop_ev.wait(0.05):
            if self.pid is None:
                self.pid = self._find()
                continue
            try:
                with open(f"/proc/{self.pid}/statm") as f:
                    rss = int(f.read().split()[1]) * page
                self.peak["rss"] = max(self.peak["rss"], rss)
                self.reads["statm"] += 1
            except (OSError, ValueError, IndexError):
                pass

    def _slow(self):
        while not self.stop_ev.wait(0.1):
            if self.pid is None:
                continue
            t = time.perf_counter()
            try:
                with open(f"/proc/{self.pid}/smaps_rollup") as f:
                    kv = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f if ln.rstrip().endswith("kB")}
            except (OSError, ValueError, IndexError):
                continue
            self.reads["smaps"] += 1
            self.reads["smaps_s"] += time.perf_counter() - t
            uss = kv.get("Private_Clean", 0) + kv.get("Private_Dirty", 0)
            if uss > self.peak["uss"] and time.perf_counter() - self.by_mapping_t > 5:
                self.by_mapping_t = time.perf_counter()
                self._by_mapping()
            self.peak["uss"] = max(self.peak["uss"], uss)
            self.peak["anon"] = max(self.peak["anon"], kv.get("Anonymous", 0))
            self.peak["rss"] = max(self.peak["rss"], kv.get("Rss", 0))

    def _by_mapping(self):
        sums, name = {}, "[anon]"
        try:
            with open(f"/proc/{self.pid}/smaps") as f:
                for ln in f:
                    head = ln.split()
                    if not head:
                        continue
                    if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                        name = head[5] if len(head) > 5 else "[anon]"
                    elif head[0] in ("Private_Clean:", "Private_Dirty:"):
                        sums[name] = sums.get(name, 0) + int(head[1]) * 1024
        except (OSError, ValueError, IndexError):
            return
        top = sorted(sums.items(), key=lambda kv: -kv[1])[:12]
        self.by_mapping = [[n, round(b / (1 << 20), 1)] for n, b in top if b]

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join()
        return {"pid": self.pid, **{f"peak_{k}_gib": round(v / GIB, 3) for k, v in self.peak.items()},
                "uss_by_mapping_mib": self.by_mapping,
                "statm_reads": self.reads["statm"], "smaps_reads": self.reads["smaps"],
                "smaps_read_ms": round(1000 * self.reads["smaps_s"] / max(1, self.reads["smaps"]), 1)}


def dmesg_oom(pid):
    """dmesg lines about an OOM kill of `pid` (empty if unreadable)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln for ln in out.splitlines()[-400:] if pid and re.search(rf"[Kk]illed process {pid}\b", ln)]


# ---------------------------------------------------------------------- run

def fault_text(log_file, n=2500):
    """What Python's fault handler wrote into a log (from its "Fatal Python
    error" line, at most n characters), or ""."""
    try:
        with open(log_file, errors="replace") as f:
            text = f.read()
    except (OSError, TypeError):
        return ""
    at = text.rfind("Fatal Python error")
    return text[at:at + n].rstrip() if at >= 0 else ""


def outcome(res, n_prompts, timeout, oom=lambda: None):
    """(status, error) of one harness result: "ok" only when every prompt
    passed and the process exited 0; "timeout" (killed at the limit), "oom"
    or "killed" (SIGKILL: `oom()` says whether the OOM killer did it),
    "exit" (every prompt passed, then a non-zero exit, e.g. a crash at exit:
    the returncode, and the fault handler's stack where the log has one),
    else "error" (harness.describe_failure's text)."""
    rc = res.get("returncode")
    passed = bool(res.get("ok")) and len(res.get("runs", [])) == n_prompts
    after = " (every prompt had passed)" if passed else ""
    if passed and rc == 0:
        return "ok", None
    if rc is None:
        return "timeout", f"killed after the {timeout:.0f} s process limit{after}"
    if rc in (-9, 137):
        o = oom()
        return ("oom" if o else "killed"), ("OOM-killed" if o else "SIGKILL") + f" (returncode {rc}; {o}){after}"
    sig = ""
    if rc < 0:
        try:
            sig = f" ({signal.Signals(-rc).name})"
        except ValueError:
            pass
    if passed:
        fault = fault_text(res.get("log_file"))
        return "exit", f"every prompt passed, then the process exited with returncode {rc}{sig}" + (
            "\n" + fault if fault else "")
    return "error", (harness.describe_failure(res) + f"\nreturncode {rc}{sig}")[:3000]


def run_one(opts, manifest, setting, parts, method, workdir, timeout):
    """One fresh ComfyUI process: `method` under `setting` (its `parts`:
    the DiT and the host setting; the VRAM helper is the caller's), 3
    prompts. Returns its record."""
    tiny = manifest["tiny"]
    size = TINY_SIZE if tiny else REAL_SIZE
    files = dict(manifest["files"], unet=dit_file(manifest, parts["model"]))
    ps = [workflow(files, s, size, manifest["experts"]) for s in SEEDS]
    extra, packs = [], ()
    stats = os.path.join(workdir, "pack_stats.jsonl")
    # PYTHONFAULTHANDLER: a crash (at exit too) prints the Python stacks into the log
    env = {"FERRY_COMFYUI_STATS": stats, "FERRY_COMFYUI_USS": "1" if opts.pack_uss else "0",
           "FERRY_COMFYUI_DISABLE": None, "FERRY_HOST_LIMIT_GB": None, "PYTHONFAULTHANDLER": "1"}
    if method == "fast_disk":
        extra.append("--fast-disk")
    elif method == "ferry":
        ps = [prompts.with_pack(p, prompts.pack_nodes(PACK)) for p in ps]
        packs = (PACK,)
        env["FERRY_LIBRARY"] = opts.ferry_lib
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")]))
    rec = dict(record(setting, parts, method), dit_file=files["unet"], workdir=workdir, status="error")
    python = opts.python
    host, cg = None, None
    hs = parts["host"]
    try:
        if hs.startswith("avail"):
            gib = float(hs[5:])
            avail = meminfo()
            lock = avail - int(gib * GIB)
            if lock <= 0:
                raise Unavailable(f"MemAvailable is {avail / GIB:.1f} GiB, not above {gib:g} GiB: nothing to lock")
            host = Helper(["_lock", str(lock)], "mlock helper")
            rec["host"] = dict(host.info, mem_available_before=avail)
        elif hs.startswith("cg"):
            cg = Cgroup(float(hs[2:]), re.sub(r"[^\w-]", "_", setting), opts.cgroups, python, workdir)
            python = cg.wrapper
            rec["cgroup"] = cg.counters()
    except Unavailable as e:
        rec.update(status="unavailable", error=str(e))
        return rec
    sampler = MemSampler()
    squeeze = Squeeze(opts.squeeze_gib, opts.squeeze_after) if opts.squeeze_gib else None
    t0 = time.perf_counter()
    try:
        res = harness.run(ps, opts.models, custom_nodes=packs, extra_args=extra,
                          overrides=comfy_models.comfy_overrides() if tiny else None, python=python,
                          comfyui=opts.comfyui, workdir=workdir, timeout=timeout, cpu=opts.cpu, env=env)
    finally:
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        rec["memory"] = sampler.stop()
        if squeeze:
            rec["squeeze"] = squeeze.stop()
        if host:
            host.stop()
        if cg:
            rec["cgroup"] = cg.counters()
            cg.remove()
    runs = res.get("runs", [])
    rc = res.get("returncode")
    rec.update(returncode=rc, startup_s=res.get("startup_s"), log_file=res.get("log_file"),
               execute_s=[r.get("execute_s") for r in runs], digests=[r.get("digest") if r.get("ok") else None
                                                                     for r in runs],
               loaded_models=runs[0].get("loaded_models") if runs else None)
    ex = [s for s, r in zip(rec["execute_s"], runs) if r.get("ok")]
    rec["first_s"] = ex[0] if ex else None
    rec["later_s"] = ex[1:]
    rec["status"], rec["error"] = outcome(res, len(ps), timeout, lambda: (
        (rec.get("cgroup") or {}).get("oom_kill") or dmesg_oom(rec["memory"].get("pid"))))
    if os.path.exists(stats):
        with open(stats) as f:
            rec["pack_stats"] = [json.loads(ln) for ln in f if ln.strip()]
    # each process's ComfyUI log, flat beside the result (the work folders nest
    # ComfyUI's own tree: too deep for a copy that keeps only shallow files)
    logs = os.path.splitext(opts.out)[0] + "-logs"
    if rec.get("log_file") and os.path.exists(rec["log_file"]):
        os.makedirs(logs, exist_ok=True)
        shutil.copyfile(rec["log_file"], os.path.join(logs, f"{setting}-{method}.log"))
        rec["log_copy"] = os.path.join(logs, f"{setting}-{method}.log")
    return rec


def record(setting, parts, method):
    """A process record's first fields: the setting, its parts, the method."""
    return {"setting": setting, "model": parts["model"], "vram_gib": parts["vram_gib"],
            "host_setting": parts["host"], "method": method}


def _model(p):
    """A record's DiT size (older results: from the setting's name)."""
    if p.get("model"):
        return p["model"]
    try:
        return parse_setting(p["setting"])["model"]
    except ValueError:
        return None


def compare(procs):
    """Each record's 'same_as_stock': its digests against stock's in the same
    setting ('yes'/'no'), or against an ok stock of another setting with the
    same DiT ('yes*'), or None when there is nothing to compare; and for
    ferry 'same_as_fast_disk': against fast_disk's in the same setting, or None."""
    stock = {p["setting"]: (_model(p), p["digests"])
             for p in procs if p["method"] == "stock" and p["status"] == "ok"}
    fast = {p["setting"]: p["digests"] for p in procs if p["method"] == "fast_disk" and p["status"] == "ok"}
    for p in procs:
        d = p.get("digests")
        p["same_as_stock"] = p["same_as_fast_disk"] = None
        if p["status"] != "ok" or not d:
            continue
        if p["method"] != "stock":
            ref, mark = stock.get(p["setting"], (None, None))[1], ""
            if ref is None:
                ref = next((dg for m, dg in stock.values() if m == _model(p)), None)
                mark = "*"
            p["same_as_stock"] = None if ref is None else ("yes" if ref == d else "no") + mark
        if p["method"] not in ("stock", "fast_disk") and p["setting"] in fast:
            p["same_as_fast_disk"] = "yes" if fast[p["setting"]] == d else "no"


def ratios(procs):
    """Per setting: ferry first / stock first, ferry first / fast_disk first,
    ferry later / fast_disk later (means)."""
    by = {(p["setting"], p["method"]): p for p in procs if p["status"] == "ok"}
    out = {}
    for s in dict.fromkeys(p["setting"] for p in procs):
        f, st, fd = by.get((s, "ferry")), by.get((s, "stock")), by.get((s, "fast_disk"))
        r = {}
        if f and st and st["first_s"]:
            r["ferry_first_over_stock_first"] = round(f["first_s"] / st["first_s"], 3)
        if f and fd and fd["first_s"]:
            r["ferry_first_over_fast_disk_first"] = round(f["first_s"] / fd["first_s"], 3)
        if f and fd and f["later_s"] and fd["later_s"]:
            r["ferry_later_over_fast_disk_later"] = round(
                (sum(f["later_s"]) / len(f["later_s"])) / (sum(fd["later_s"]) / len(fd["later_s"])), 3)
        out[s] = r
    return out


def _gib(v):
    return "" if v == "" else "full" if v is None else f"{v:g}"


def table(result):
    """The markdown table of a result: setting (its DiT and GPU size) x
    method, and the ratios per setting."""
    rows = ["| setting | DiT | GPU GiB free | method | first prompt s | later prompts s | peak RSS GiB "
            "| peak USS GiB | outputs same as | status |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    tiny = ((result.get("meta") or {}).get("manifest") or {}).get("tiny")
    for p in result["processes"]:
        m = p.get("memory") or {}
        dit = f"tiny ({_model(p)})" if tiny else _model(p) or ""
        status = p["status"] if p["status"] == "ok" else f"{p['status']}: {(p.get('error') or '').splitlines()[0][:90]}"
        same = ", ".join(f"{ref} {p[k]}" for ref, k in (("stock", "same_as_stock"),
                                                          ("fast_disk", "same_as_fast_disk")) if p.get(k))
        same = same or ("(reference)" if p["method"] == "stock" and p["status"] == "ok" else "")
        rows.append(f"| {p['setting']} | {dit} | {_gib(p.get('vram_gib', ''))} | {p['method']} | "
                    f"{p.get('first_s') or ''} | {', '.join(str(x) for x in p.get('later_s') or [])} | "
                    f"{m.get('peak_rss_gib', '')} | {m.get('peak_uss_gib', '')} | {same} | {status} |")
    rows += ["", "| setting | ferry first / stock first | ferry first / fast_disk first "
             "| ferry later / fast_disk later |", "| --- | --- | --- | --- |"]
    for s, r in result.get("ratios", {}).items():
        rows.append(f"| {s} | {r.get('ferry_first_over_stock_first', '')} | "
                    f"{r.get('ferry_first_over_fast_disk_first', '')} | "
                    f"{r.get('ferry_later_over_fast_disk_later', '')} |")
    rows.append("")
    rows.append("GPU GiB free: what a helper left free of the GPU's memory (full: no helper; see each record's "
                "vram). "
                "stock yes*: compared with stock of another setting with the same DiT "
                "(stock did not finish in this one).")
    return "\n".join(rows) + "\n"


def machine_facts():
    facts = {"mem_total": meminfo("MemTotal"), "mem_available": meminfo(), "cpus": os.cpu_count(),
             "euid": os.geteuid()}
    try:
        facts["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used",
                                       "--format=csv,noheader"], capture_output=True, text=True,
                                      timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        facts["gpu"] = None
    return facts


def cmd_run(opts):
    """Run every setting x method (settings grouped by GPU size, the method
    order alternating from one setting to the next) until done or the
    deadline, writing the result after each process. One VRAM helper per
    GPU size, started before its first process and stopped after its last."""
    t_start = time.time()
    with open(os.path.join(opts.models, MANIFEST)) as f:
        manifest = json.load(f)
    opts.cpu = manifest["tiny"] if opts.cpu is None else opts.cpu
    opts.comfyui = os.path.abspath(opts.comfyui or harness.find_comfyui()[0] or "")
    opts.ferry_lib = os.path.abspath(opts.ferry_lib or os.environ.get("FERRY_LIBRARY")
                                     or os.path.join(ROOT, "build", "libferry.so"))
    opts.python = opts.python or sys.executable
    work = opts.work or os.path.splitext(opts.out)[0] + "-work"
    methods = opts.methods.split(",")
    for m in methods:
        if m not in METHODS:
            sys.exit(f"unknown method {m!r} (one of {', '.join(METHODS)})")
    try:
        steps = plan(opts.settings.split(","), methods, opts.vram_gib)
    except ValueError as e:
        sys.exit(str(e))
    for setting, parts, _ in steps:
        if dit_file(manifest, parts["model"]) is None:
            sys.exit(f"{setting}: the models in {opts.models} have no Wan 2.1 T2V {parts['model']} DiT "
                     f"(comfyui_seed.py prepare --dits {parts['model']})")
        if manifest["experts"] == 2 and parts["model"] != "14B" and not manifest["tiny"]:
            sys.exit(f"{setting}: two experts are 14B DiTs")
    result = {"meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv,
                       "manifest": manifest, "comfyui": opts.comfyui, "python": opts.python,
                       "ferry_lib": opts.ferry_lib, "machine": machine_facts(), "seeds": SEEDS,
                       "size": TINY_SIZE if manifest["tiny"] else REAL_SIZE, "cpu": opts.cpu,
                       "vram_helpers": []},
              "processes": []}

    def save():
        compare(result["processes"])
        result["ratios"] = ratios(result["processes"])
        tmp = opts.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, opts.out)
        if opts.table:
            with open(os.path.splitext(opts.out)[0] + ".md", "w") as f:
                f.write(table(result))

    vram, vram_for, vram_info = None, "none yet", None
    try:
        for setting, parts, method in steps:
            left = opts.deadline - (time.time() - t_start) if opts.deadline else None
            rec = record(setting, parts, method)
            if left is not None and left < opts.min_process:
                rec.update(status="skipped", error=f"deadline: {left:.0f} s left")
            else:
                if parts["vram_gib"] != vram_for:
                    if vram:
                        vram.stop()
                        vram = None
                    vram_for, gib = parts["vram_gib"], parts["vram_gib"]
                    if gib is None:
                        vram_info = None
                    elif opts.cpu:
                        vram_info = {"gib": gib, "skipped": "ComfyUI runs on the CPU"}
                    else:
                        try:
                            vram = Helper(["_vram", str(gib)], "VRAM helper")
                            vram_info = dict(vram.info, gib=gib)
                        except Unavailable as e:
                            vram_info = {"gib": gib, "unavailable": str(e)}
                    if vram_info:
                        result["meta"]["vram_helpers"].append(dict(vram_info, at_s=round(time.time() - t_start, 1)))
                    print("vram:", vram_info or "the whole GPU (no helper)", flush=True)
                if vram_info and "unavailable" in vram_info:
                    rec.update(status="unavailable", error=vram_info["unavailable"])
                else:
                    timeout = opts.process_timeout if left is None else min(opts.process_timeout, left - 5)
                    wd = os.path.join(work, f"{setting}-{method}")
                    os.makedirs(wd, exist_ok=True)
                    rec = run_one(opts, manifest, setting, parts, method, wd, timeout)
                rec["vram"] = vram_info
            result["processes"].append(rec)
            save()
            m = rec.get("memory") or {}
            print(f"{setting:14} {method:9} {rec['status']:11} first {rec.get('first_s')} "
                  f"later {rec.get('later_s')} rss {m.get('peak_rss_gib')} uss {m.get('peak_uss_gib')} wall {rec.get('wall_s')} s"
                  + (f"  [{(rec.get('error') or '').splitlines()[0][:160]}]" if rec["status"] != "ok" else ""),
                  flush=True)
    finally:
        if vram:
            vram.stop()
        result["meta"]["total_s"] = round(time.time() - t_start, 1)
        save()
    if opts.table:
        print(table(result))
    return 0 if all(p["status"] in ("ok", "unavailable", "skipped") for p in result["processes"]) else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_lock":
        return helper_lock(int(argv[1]))
    if argv and argv[0] == "_vram":
        return helper_vram(float(argv[1]))
    if argv and argv[0] == "_take":
        return helper_take(float(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the models")
    p.add_argument("--models", required=True)
    p.add_argument("--tiny", action="store_true", help="the test-size models of tests/data/comfy_models.py")
    p.add_argument("--experts", type=int, choices=(1, 2), default=1)
    p.add_argument("--expert-dtype", choices=("fp8_e4m3fn", "fp8_scaled", "bf16"), default="fp8_e4m3fn",
                   help="with --experts 2: the experts' matrices")
    p.add_argument("--dits", default="14B", help="the Wan 2.1 T2V DiT sizes to write: 14B, 1.3B (comma-separated)")
    p.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check", help="ComfyUI's detection on the models' shapes")
    c.add_argument("--tiny", action="store_true")
    c.add_argument("--experts", type=int, choices=(1, 2), default=1)
    c.add_argument("--dits", default="14B", help="the DiT sizes to check: 14B, 1.3B")
    c.add_argument("--comfyui")
    r = sub.add_parser("run", help="the benchmark")
    r.add_argument("--models", required=True)
    r.add_argument("--out", required=True, help="the result JSON (and, with --table, a .md beside it)")
    r.add_argument("--table", action="store_true", help="write and print the markdown table")
    r.add_argument("--settings", default=",".join(SETTINGS),
                   help="[14b-|1.3b-][vG-|full-](none|availN|cgN), comma-separated")
    r.add_argument("--methods", default=",".join(METHODS))
    r.add_argument("--vram-gib", type=float, default=None,
                   help="emulate a GPU with this much free memory in the settings without vG (or with full)")
    r.add_argument("--python", help="the interpreter ComfyUI runs in (default: this one)")
    r.add_argument("--comfyui", help="ComfyUI's directory (default: where tests/comfyui/harness.py finds it, $COMFYUI_DIR first)")
    r.add_argument("--ferry-lib", help="libferry.so for the ferry method ($FERRY_LIBRARY, build/libferry.so)")
    r.add_argument("--work", help="where each process's folder goes (default: beside --out)")
    r.add_argument("--deadline", type=float, default=None, help="seconds from now after which no process starts")
    r.add_argument("--min-process", type=float, default=45.0, help="seconds a process needs at least to start it")
    r.add_argument("--process-timeout", type=float, default=300.0, help="seconds one process may run")
    r.add_argument("--cgroups", default="auto", help="auto, off, or the cgroup directory to make them under")
    r.add_argument("--pack-uss", action="store_true", help="let the pack read its own USS per prompt")
    r.add_argument("--squeeze-gib", type=float, default=None,
                   help="another process takes this much GPU memory --squeeze-after seconds into each ComfyUI "
                        "process and holds it to the end (memory taken in the middle of a prompt)")
    r.add_argument("--squeeze-after", type=float, default=20.0, help="see --squeeze-gib (default 20 s)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--cpu", dest="cpu", action="store_true", default=None, help="ComfyUI on the CPU (tiny default)")
    g.add_argument("--gpu", dest="cpu", action="store_false", help="ComfyUI on the GPU (real-size default)")
    t = sub.add_parser("table", help="print the table of a result")
    t.add_argument("result")
    opts = ap.parse_args(argv)
    if opts.cmd == "prepare":
        return cmd_prepare(opts)
    if opts.cmd == "check":
        return cmd_check(opts)
    if opts.cmd == "table":
        with open(opts.result) as f:
            print(table(json.load(f)))
        return 0
    return cmd_run(opts)


if __name__ == "__main__":
    sys.exit(main())
