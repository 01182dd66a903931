#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run a diffusion transformer larger than its device budget: ferry's block
streaming (ferry.torch.Store(..., device_budget=B).add(..., stream="auto")) beside
the whole model resident on the GPU, diffusers' group offloading, accelerate's
cpu_offload and comfy-aimdo, each in a fresh process, alternated, in one run.

The Wan2.1-14B run on an H100 machine, everything in one call (bench/gpu_stream.sh
does it from a fresh checkout: builds libferry, installs the carried wheels, runs this):

    python3 bench/stream.py --model wan --ferry-lib build-gpu/libferry.so \\
        --file-locations disk:/root/ferry-bench,shm:/dev/shm/ferry-bench \\
        --only resident,ferry,group_offload --skip group_offload_rs --out $OUT/stream-wan.json

The FLUX run on the H200 machine (diffusers and comfy-aimdo are not installed
there; carry `.whl` and `build-gpu`, install the wheels first):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
    PYTHONUNBUFFERED=1 python3 bench/stream.py --ferry-lib build-gpu/libferry.so \\
        --image-tokens 4096,1024 --ferry-modes default --out $OUT/stream.json

    .whl holds diffusers-0.42.1 and importlib_metadata-8.7.1 (diffusers' one
    Requires-Dist missing there; 8.7.1 because later ones need lazy-importer,
    missing too), for FLUX also comfy_aimdo-0.6.0; every other requirement
    (huggingface-hub, safetensors, filelock, regex, requests, Pillow, numpy,
    zipp, accelerate, psutil) is in that machine's image.

Split over two calls (the checkpoints survive while the machine stays warm;
otherwise the second call makes them again):
    ... --only resident,ferry,group_offload --out $OUT/stream-a.json
    ... --only cpu_offload,comfy_aimdo --out $OUT/stream-b.json
(resident always runs too: every ratio and the bit-identity check need it.)

Smoke test without a GPU (ferry's simulated device; plumbing only, no figures):
    python3 bench/stream.py --device sim:4GiB --model blocks --tiny --workdir /tmp/st --steps 2
    python3 bench/stream.py --device sim:4GiB --model wan --tiny --steps 2 --tokens 60,120 \\
        --file-locations disk:/tmp/st-disk,shm:/dev/shm/st      (needs diffusers and accelerate)
(torch 2.1 or later: CI's torch 1.13 lacks the meta-device context and
load_state_dict(assign=True), so this is not a CI test.) ferry is imported from
this checkout's python/ unless installed; --ferry-lib picks the libferry.so.

Models (--model), each built on `meta` with seeded random BF16 weights generated
on the GPU and written once to a safetensors file (a later run with the same
model, seed and init reuses it, checked by its metadata and size):
  flux (default)  diffusers' FluxTransformer2DModel from FLUX.1-dev's published
                  config (FLUX_CONFIG: 19 double + 38 single blocks, 11.9 B
                  parameters, 23.8 GB)
  wan             diffusers' WanTransformer3DModel from Wan2.1-T2V-14B's published
                  config (WAN_CONFIG: 40 blocks of dim 5120, 40 heads of 128, ffn
                  13824, text_dim 4096, freq_dim 256, patch (1, 2, 2), cross-attention
                  norm, RMS q/k norm across heads, eps 1e-6, rope_max_seq_len 1024;
                  14.29 B parameters, 28.58 GB in 1095 tensors, 0.70 GB a block).
                  Built as diffusers' from_pretrained builds it: parameters on meta
                  under accelerate.init_empty_weights, BF16 as the default dtype.
                  Every weight is BF16 (diffusers would keep time_embedder,
                  scale_shift_table and norm1-3 in FP32 when loading the published
                  files: 0.2 % of the bytes here). Its rotary tables
                  (rope.freqs_cos/_sin, 1024 x 128 FP32 each) are non-persistent
                  buffers made in __init__: not in the checkpoint, real on the CPU
                  after the build (see "buffers" below)
  blocks          a plain-torch stand-in (96 identical attention + MLP blocks, d
                  3072, 21.7 GB) for machines without diffusers
--tiny: a few-MB version of each, for smoke tests (Wan's: dim 32, 16 blocks).

Inputs: seeded random, made on the CPU (every process gets the same bytes);
--text-tokens text tokens (default 512). Flux: latents (image tokens x 64), text
x 4096, pooled 768, guidance 3.5, image/text position ids as the Flux pipeline
makes them. Wan: latents (1, 16, F, H, W), text embeddings (1, 512, 4096), a
float32 timestep in [0, 1000]; --tokens N (the patched sequence, F x H/2 x W/2)
picks the latents: the 480x832 grid (30 x 52 patches a frame) with N / 1560
frames when that is whole, else the factorisation of N with the grid aspect
nearest 52:30 (or the nearest N that has one; wan_latent_shape says how); an
entry FxHxW gives latents directly. The count and shape used are printed and
recorded: the default 1170,14040 gives 3 x 30 x 52 (3 frames of 240x416) and
9 x 60 x 104 (33 frames of 480x832). --steps steps (default: wan 3, others 4)
of an Euler-like loop (t from 1 down, x += -1/steps * out), so every step's
output depends on the ones before: the first step is reported apart from the
mean of the rest ("steady"). Each token count runs in the same child after one
load.

Configurations (--only / --skip take names, methods, modes, prefixes or @LOCATION:
"ferry" is every ferry config, "ferry:50" every mode and location of that budget,
"ring" every ring config, "@disk" every config reading the disk copy,
"group_offload" both group_offload configs):
  resident           the whole model on the GPU: ferry.torch.load_file(path, device="cuda:0")
                     (safetensors.torch.load_file if ferry is missing) + load_state_dict(assign=True)
                     on the meta-built model; the buffers the checkpoint lacks moved to the
                     device as model.to(device) would
  ferry:P            P = --budgets (fractions of the weights' bytes; default wan 50, 25,
                     others 100, 50, 25): store = ferry.torch.Store(dev, device_budget=P%);
                     store.add("dit", path, module=model, stream="auto", pinned_cache=True
                     [, prefetch=, reserve=]): a pinned copy of every tensor kept as it is first
                     read, so steps after the first copy streamed blocks from pinned RAM
  ferry:P:ring       the same with pinned_cache=False: nothing kept, the streamed blocks come
                     from the checkpoint through ferry's pinned ring every step
  ferry:P:default    pinned_cache not passed (the library's default: streamed blocks' copies
                     kept), named ferry:P in results made without --ferry-modes.
                     --ferry-modes picks the modes (default pinned,ring)
  ...@LOC            with --file-locations, every ferry config once per location (below)
                     (the ferry-specific lines are all in class FerryRun)
  group_offload      diffusers apply_group_offloading(block_level, num_blocks_per_group=1,
                     use_stream=True), weights loaded to CPU first (safetensors)
  group_offload_rs   the same with record_stream=True
  cpu_offload        accelerate.cpu_offload(model, execution_device=dev), weights on CPU
  comfy_aimdo:P      comfy-aimdo 0.6.0's VBAR (the wheel's own API: ModelVBAR, vbar_fault,
                     vbar_unpin, set_watermark) for residency, with P% of the weights allowed
                     resident (the watermark); the rest copied per layer from page-locked RAM
                     into a temporary as aimdo's examples/example.py does. The wheel is an
                     allocator, not a module streamer: ComfyUI's casting and prefetching
                     (comfy/ops.py, model_management) are not in it, so the per-layer glue
                     here (class AimdoRun) is ours, following the wheel's example; no
                     prefetch, copies on the compute stream. Reported under that name.

Buffers (Wan): the rotary tables are not checkpoint tensors, so Store.add does not
place them; a ferry that does not move a module's non-checkpoint buffers itself
leaves them on the CPU and the first forward fails on a device mismatch. After
Store.add, each ferry child looks: if any such buffer is off the device, it moves
them there by hand (the "hand fix"); a ferry that moves them itself gets no hand
fix. --no-buffer-fix never applies it. Each ferry result records buffer_fix:
enabled, off_device_after_add, applied (and what was moved), and the buffers'
devices after the first step; the table notes "buffers moved by hand".
(group_offload and cpu_offload move buffers themselves; resident and the
comfy_aimdo glue move them as model.to(device) would.)

The checkpoint's locations. --workdir DIR (default /dev/shm/ferry-stream: tmpfs,
fast to write and always "hot"; /tmp/ferry-stream when /dev/shm lacks room) holds
the one file. --file-locations NAME:DIR,... compares where ferry reads it from:
the file is made once in the first tmpfs location with room (else the first with
room; a valid file already in any location is reused instead) and copied with cp
into each other location right before the first config that reads it, then
fsync'd (a disk copy is on the disk before anything is measured: no writeback
during the runs); cp and fsync times are recorded. A location without room for
the file (tmpfs: also without the file's size + 8 GB of MemAvailable) is
reported, its configs unavailable. The disk copy is measured "in the page cache":
before each config reading a non-tmpfs file, mincore tells the share of its pages
cached, and a file not whole there is read in first (both recorded, page_cache).
resident, group offloading, cpu_offload and comfy_aimdo read the made file.

Host memory with --file-locations disk:...,shm:... and Wan (128 GiB = 137 GB on the
H100 machine): the tmpfs copy holds 28.6 GB of RAM for as long as it exists; the
disk copy 28.6 GB of page cache (reclaimable: under pressure the kernel drops it,
and the disk configs would then read the disk - hence the check above). Group
offloading is the largest child: safetensors' CPU tensors are a private mapping
of the file (on tmpfs they are the file's own pages: no new RAM), and
use_stream=True pins a copy of each through torch's caching host allocator, which
rounds every allocation up to a power of two: 43.7 GB for Wan's tensors (FLUX:
37.2 GB, which with its 23.8 GB mapping is the 57.6 GiB VmHWM measured). So ~45 GB
new beside the 28.6 GB tmpfs file = 74 GB, 103 GB with the disk copy cached too:
it fits with ~35 GB to spare, but to keep the disk copy's cache out of its way
the configs reading the made file (resident, group offloading, ...) run first
and the copy is made after them, before ferry's configs (a ferry pinned child
holds up to the model's 28.6 GB pinned: 86 GB with both files). ferry's
pinned budget is by default a quarter of the host's available RAM when the
store is made, ~25 GB here with the tmpfs copy in place: less than the 28.6 GB
that pinned_cache=True would keep, so the pinned rows may read blocks from the
file again each step (their "read GB/step" and "pinned cache of budget" notes
show it); --ferry-pinned-budget 40GiB lifts it. Later rounds
(--reps) run in reverse order, where the page-cache check re-reads what may have
been dropped. The GPU machine's disk is 64 GiB: the copy is checked for room.

Per configuration and token count: first step and steady mean (s), ratio to
resident's steady step of the same run; host->device bytes per step (ferry:
the delta of store.stats()["bytes_htod"]; group offloading: the bytes of every
tensor ModuleGroup._transfer_tensor_to_device copies from the CPU - with
block_level every block each step, and the tensors outside the blocks twice
per step in diffusers 0.42.1, as counted on the CPU; cpu_offload: the bytes of
every CPU value accelerate's hooks give set_module_tensor_to_device for the
execution device, i.e. every weight each step; comfy_aimdo: the bytes the glue
copies); ferry's bytes read from the checkpoint per step (the delta of
stats()["bytes_read"]: the ring mode re-reads every streamed block each step,
the pinned mode nothing after the first); the physical bound
max(resident steady step, bytes per step / pinned host->device rate measured in
the same run, 1 GiB, torch, the best of its start and end) and the ratio to
it, and "x own bound": the same with the rate each process measures right after
its own steps (the host's DMA rate drifts by several percent within minutes,
whatever the memory's page size: bench_pinrate); peak host memory (VmHWM of the
child; psutil USS sampled after loading and after each token count; the
RssAnon/RssFile/RssShmem split); GPU memory: torch.cuda.max_memory_allocated
and _reserved, and device memory in use (torch.cuda.mem_get_info, total - free)
minus its value before loading, sampled after loading and after every step
(ferry allocates with the driver, so torch's counters miss its weights; a
sample after each step misses peaks inside a step: --mem-poll-ms N also
samples from a thread every N ms); ferry's store.stream_stats("dit") and
store.stats(); a SHA-256 of every step's output, compared in the parent with
resident's (identical yes/no); the host's /proc/meminfo before each child.

Time: before the runs the script prints an estimate of every part (the make,
each copy, each child) from the rates in EST - assumptions, not readings (the
disk's write rate least of all) - and records it. The Wan run above, on an
H100: probes 30 s, make 48 s, copy to disk 57 s at 0.5 GB/s, resident 24 s,
group offloading 55 s, each ferry pinned child 28-32 s and ring child 25-29 s:
443 s (a child's start, imports and model build, ~18 s, is most of each; a
resident step at 14040 tokens ~1.3 s). A child starts only while
--budget-seconds are not used up, and none (nor a copy) runs past
--deadline-seconds (default budget + 60 s); the JSON and the .md table are
rewritten after every child. Where it does not fit one call, split it by
budget (the files stay while the machine is warm):
    ... --skip ferry:25 --out $OUT/stream-wan-a.json    (group offloading, ferry 50 %)
    ... --only ferry:25 --out $OUT/stream-wan-b.json    (ferry 25 %)
(bench/gpu_stream.sh OUT a|b).

Robust like compare_load.py: a configuration that fails, crashes or hangs
records its error and the run goes on; one that cannot run at all (a package
missing, an API absent, no room for its file) is reported with the reason. A
markdown table for bench/RESULTS.md is printed at the end (and written beside
the JSON as .md).
"""
import argparse
import hashlib
import json
import math
import os
import queue
import statistics
import struct
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from compare_load import (T_PROC_START, fs_type, last_line, rc_text, run_process,  # noqa: E402
                          proc_field, tail, vm_status)

RESULT_TAG = "STREAM_RESULT "
GB = 1e9
GIB = float(1 << 30)

# FLUX.1-dev's transformer/config.json (black-forest-labs/FLUX.1-dev)
FLUX_CONFIG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                   pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
FLUX_TINY = dict(patch_size=1, in_channels=16, out_channels=None, num_layers=1, num_single_layers=2,
                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                 pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
BLOCKS_CONFIG = dict(dim=3072, heads=24, blocks=96, in_dim=64, ctx_dim=4096, mlp=4)   # 21.7 GB BF16
BLOCKS_TINY = dict(dim=128, heads=4, blocks=8, in_dim=16, ctx_dim=32, mlp=4)
# Wan2.1-T2V-14B's transformer/config.json (Wan-AI/Wan2.1-T2V-14B-Diffusers) in the argument names of
# diffusers' WanTransformer3DModel: 40 blocks of dim 5120, 14.29 B parameters, 28.58 GB in BF16
WAN_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
# the same layout at dim 32 (1.7 MB): 16 blocks holding 97 % of the bytes, as the real one's 40 hold 98 %,
# so that a 25 % budget still fits what lies outside the blocks plus the streaming window; the rotary
# tables are still non-persistent buffers
WAN_TINY = dict(WAN_CONFIG, num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=16, ffn_dim=256,
                num_layers=16, rope_max_seq_len=64)
# the patch grid of a 480x832 video (Wan's 480p size: 8x spatial VAE, 2x2 patches): 30 x 52 per latent frame
WAN_GRID = (30, 52)
WAN_MAX_FRAMES = 21  # latent frames of an 81-frame video (4x temporal VAE), Wan's longest clip
INIT_VERSION = "1"  # bump when the random init changes (the checkpoint is then made again)
DEFAULT_WORKDIR = "/dev/shm/ferry-stream"
FALLBACK_WORKDIR = "/tmp/ferry-stream"
METHODS = ["resident", "ferry", "group_offload", "group_offload_rs", "cpu_offload", "comfy_aimdo"]
# ferry's modes: mode -> (Store.add's pinned_cache, the suffix of the config's name)
FERRY_MODES = {"pinned": (True, ""), "ring": (False, ":ring"), "default": (None, ":default")}
MODELS = ("flux", "wan", "blocks")


def model_config(kind, tiny):
    if kind == "flux":
        return dict(FLUX_TINY if tiny else FLUX_CONFIG)
    if kind == "wan":
        return dict(WAN_TINY if tiny else WAN_CONFIG)
    return dict(BLOCKS_TINY if tiny else BLOCKS_CONFIG)


def wan_latent_shape(tokens, cfg):
    """Latents (F, H, W) for a token count F/pt * H/ph * W/pw (the patched sequence): `tokens` itself
    when it factors so, else the nearest count that does. Preferred, in order: the 480x832 patch
    grid (30 x 52) with tokens / 1560 frames when that is a whole number up to 21; else the
    factorisation whose grid aspect is nearest 52:30 (within 1..3, each side within the rotary
    table), with the frame count nearest what a clip of that many tokens at Wan's full size would
    have (21 frames at 32760 tokens, scaled by the cube root). A string "FxHxW" gives the latents
    as they are. Returns (tokens used, (F, H, W))."""
    pt, ph, pw = cfg["patch_size"]
    lim = cfg["rope_max_seq_len"]
    if isinstance(tokens, str) and "x" in tokens.lower():
        f, h, w = (int(v) for v in tokens.lower().split("x"))
        if f % pt or h % ph or w % pw or min(f, h, w) < 1:
            raise ValueError(f"latents {tokens}: not positive multiples of the patch size {tuple(cfg['patch_size'])}")
        if max(f // pt, h // ph, w // pw) > lim:
            raise ValueError(f"latents {tokens}: a side past the rotary table ({lim} positions)")
        return (f // pt) * (h // ph) * (w // pw), (f, h, w)
    n = int(tokens)
    if n < 1:
        raise ValueError(f"token count {tokens!r}")
    gh, gw = WAN_GRID
    if n % (gh * gw) == 0 and n // (gh * gw) <= min(WAN_MAX_FRAMES, lim) and gw <= lim:
        return n, (n // (gh * gw) * pt, gh * ph, gw * pw)
    target = gw / gh
    fref = min(max(WAN_MAX_FRAMES * (n / (WAN_MAX_FRAMES * gh * gw)) ** (1 / 3), 1.0), float(WAN_MAX_FRAMES))
    for d in range(0, max(2, n // 10)):
        best = None
        for m in ([n] if d == 0 else [n + d, n - d]):
            if m < 1:
                continue
            for f in range(1, min(WAN_MAX_FRAMES, lim) + 1):
                if m % f:
                    continue
                area = m // f
                for h in range(1, math.isqrt(area) + 1):
                    if area % h:
                        continue
                    w = area // h
                    if w > lim or not 1.0 <= w / h <= 3.0:
                        continue
                    score = abs(math.log(w / h / target)) + 0.05 * abs(math.log(f / fref))
                    if best is None or score < best[0]:
                        best = (score, m, (f * pt, h * ph, w * pw))
        if best:
            return best[1], best[2]
    raise ValueError(f"no latent shape near {n} tokens")


# ----------------------------------------------------------------------------- models (torch inside)

def build_model(kind, cfg):
    """The model on the meta device, in BF16, eval mode. Wan: its parameters only (as diffusers'
    from_pretrained builds it: accelerate.init_empty_weights with BF16 as the default dtype), because
    its rotary tables are non-persistent buffers computed in __init__ - not in the checkpoint, so
    they must be built with their values (on the CPU, in the dtype diffusers gives them)."""
    import torch
    if kind == "flux":
        from diffusers import FluxTransformer2DModel
        with torch.device("meta"):
            m = FluxTransformer2DModel(**cfg)
    elif kind == "wan":
        from accelerate import init_empty_weights
        from diffusers import WanTransformer3DModel
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with init_empty_weights():
                m = WanTransformer3DModel(**dict(cfg, patch_size=tuple(cfg["patch_size"])))
        finally:
            torch.set_default_dtype(prev)
        return m.eval()  # no .to(bfloat16): it would cast the rotary tables too
    else:
        with torch.device("meta"):
            m = _blocks_model(**cfg)
    return m.to(torch.bfloat16).eval()


def _blocks_model(dim, heads, blocks, in_dim, ctx_dim, mlp):
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, mlp * dim)
            self.fc2 = nn.Linear(mlp * dim, dim)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, dim)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))

    class Blocks(nn.Module):
        """x_embedder / context_embedder -> blocks -> norm_out -> proj_out, over the
        image and text tokens together (a DiT's single-stream blocks)."""

        def __init__(self):
            super().__init__()
            self.x_embedder = nn.Linear(in_dim, dim)
            self.context_embedder = nn.Linear(ctx_dim, dim)
            self.time_embedder = nn.Linear(1, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.norm_out = nn.LayerNorm(dim)
            self.proj_out = nn.Linear(dim, in_dim)

        def forward(self, hidden_states, encoder_hidden_states, timestep):
            n = hidden_states.shape[1]
            x = torch.cat([self.x_embedder(hidden_states), self.context_embedder(encoder_hidden_states)], 1)
            x = x + self.time_embedder(timestep.view(-1, 1, 1))
            for blk in self.blocks:
                x = blk(x)
            return self.proj_out(self.norm_out(x[:, :n]))

    return Blocks()


def make_inputs(kind, cfg, image_tokens, text_tokens, device, seed, latent_shape=None):
    """Seeded inputs (made on the CPU, so every process gets the same bytes). Wan: latents
    (1, in_channels, F, H, W) of latent_shape, text embeddings (1, text_tokens, text_dim)."""
    import torch
    g = torch.Generator().manual_seed(seed + 7919 * image_tokens)
    bf = torch.bfloat16
    if kind == "wan":
        inp = {"x0": torch.randn(1, cfg["in_channels"], *latent_shape, generator=g).to(bf),
               "encoder_hidden_states": torch.randn(1, text_tokens, cfg["text_dim"], generator=g).to(bf)}
        return {k: v.to(device) for k, v in inp.items()}
    if kind == "flux":
        in_ch, ctx, pooled = cfg["in_channels"], cfg["joint_attention_dim"], cfg["pooled_projection_dim"]
    else:
        in_ch, ctx, pooled = cfg["in_dim"], cfg["ctx_dim"], None
    inp = {"x0": torch.randn(1, image_tokens, in_ch, generator=g).to(bf),
           "encoder_hidden_states": torch.randn(1, text_tokens, ctx, generator=g).to(bf)}
    if pooled:
        inp["pooled_projections"] = torch.randn(1, pooled, generator=g).to(bf)
        h = int(math.isqrt(image_tokens))
        h, w = (h, image_tokens // h) if h * (image_tokens // h) == image_tokens else (1, image_tokens)
        ids = torch.zeros(h, w, 3)
        ids[..., 1] += torch.arange(h)[:, None]
        ids[..., 2] += torch.arange(w)[None, :]
        inp["img_ids"] = ids.reshape(h * w, 3).to(bf)
        inp["txt_ids"] = torch.zeros(text_tokens, 3).to(bf)
        inp["guidance"] = torch.full((1,), 3.5).to(bf)
    return {k: v.to(device) for k, v in inp.items()}


def forward(kind, model, inp, x, t):
    """One call of the model at time t in [0, 1]: Flux takes t as it is (it scales by 1000 inside),
    Wan a float32 timestep in [0, 1000] as its pipeline passes the scheduler's."""
    import torch
    if kind == "wan":
        ts = torch.full((1,), 1000.0 * t, dtype=torch.float32, device=x.device)
        return model(hidden_states=x, timestep=ts, encoder_hidden_states=inp["encoder_hidden_states"],
                     return_dict=False)[0]
    ts = torch.full((1,), t, dtype=torch.bfloat16, device=x.device)
    if kind == "flux":
        return model(hidden_states=x, encoder_hidden_states=inp["encoder_hidden_states"],
                     pooled_projections=inp["pooled_projections"], timestep=ts, img_ids=inp["img_ids"],
                     txt_ids=inp["txt_ids"], guidance=inp["guidance"], return_dict=False)[0]
    return model(x, inp["encoder_hidden_states"], ts)


def tensor_init(name, shape, gen, device):
    """The random init of one tensor (float32 math, BF16 result): 2-D and larger
    weights N(0, 1/fan_in) so activations stay near unit scale; 1-D norm weights
    1; other 1-D tensors (biases) N(0, 0.02^2)."""
    import torch
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(1.0 / math.sqrt(fan_in))
    elif "norm" in name:
        t = torch.ones(shape, device=device, dtype=torch.float32)
    else:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(0.02)
    return t.to(torch.bfloat16)


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", {}) or {}
    return hdr, meta, 8 + n


# ----------------------------------------------------------------------------- child: making the checkpoint

def make_main(spec):
    """--make SPEC: write the random checkpoint (tmp file, then rename)."""
    import torch
    rep = {"ok": False}
    t0 = time.perf_counter()
    try:
        dev = torch.device("cpu" if spec["device"].startswith("sim") else spec["device"])
        model = build_model(spec["model"], spec["cfg"])
        items = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
        header, off = {}, 0
        for k, shape in items:
            n = math.prod(shape) * 2
            header[k] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        header["__metadata__"] = spec["meta"]
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((-len(hb)) % 8)
        base = 8 + len(hb)
        path = spec["path"]
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        errs = []
        q = queue.Queue(maxsize=8)

        def writer():
            while True:
                job = q.get()
                if job is None:
                    return
                buf, pos = job
                try:
                    mv = memoryview(buf)
                    while len(mv):
                        w = os.pwrite(fd, mv, pos)
                        mv, pos = mv[w:], pos + w
                except OSError as e:
                    errs.append(e)

        try:
            os.pwrite(fd, struct.pack("<Q", len(hb)) + hb, 0)
            ws = [threading.Thread(target=writer) for _ in range(4)]
            for w in ws:
                w.start()
            gen = torch.Generator(device=dev)
            for i, (k, shape) in enumerate(items):
                gen.manual_seed(spec["seed"] * 1_000_003 + i)
                t = tensor_init(k, shape, gen, dev).cpu().contiguous()
                q.put((t.view(torch.uint8).numpy(), base + header[k]["data_offsets"][0]))
                if errs:
                    break
            for _ in ws:
                q.put(None)
            for w in ws:
                w.join()
            if errs:
                raise errs[0]
            t1 = time.perf_counter()
            if spec.get("fsync"):
                os.fsync(fd)
            rep["fsync_seconds"] = time.perf_counter() - t1
        finally:
            os.close(fd)
        os.replace(tmp, path)
        rep.update(ok=True, seconds=time.perf_counter() - t0, bytes=os.path.getsize(path), tensors=len(items))
    except BaseException as e:  # noqa: BLE001
        import traceback
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
        rep["traceback"] = tail(traceback.format_exc(), 3000)
    sys.stdout.write(RESULT_TAG + json.dumps(rep) + "\n")
    sys.stdout.flush()
    os._exit(0 if rep["ok"] else 1)


# ----------------------------------------------------------------------------- child: probe + copy limit

def probe_main(spec):
    """--probe SPEC: what is importable (versions, the APIs each method needs)
    and, on CUDA, the pinned host->device copy rate (torch, --limit-gib GiB)."""
    rep = {"ok": True, "packages": {}, "why_not": {}}
    P = rep["packages"]
    try:
        import torch
        P["torch"] = torch.__version__
        rep["cuda"] = torch.cuda.is_available()
        if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 1):
            rep.update(ok=False, error=f"torch {torch.__version__}: this benchmark needs torch 2.1 or later "
                       "(torch.device as a context, load_state_dict(assign=True), scaled_dot_product_attention)")
            _emit(rep)
    except Exception as e:  # noqa: BLE001
        rep.update(ok=False, error=f"torch: {type(e).__name__}: {e}")
        _emit(rep)
    W = rep["why_not"]
    try:
        import diffusers
        P["diffusers"] = diffusers.__version__
        if spec["model"] == "wan":
            from diffusers import WanTransformer3DModel  # noqa: F401
            from accelerate import init_empty_weights  # noqa: F401  (how build_model makes it)
        else:
            from diffusers import FluxTransformer2DModel  # noqa: F401
        import inspect
        from diffusers.hooks import apply_group_offloading
        params = inspect.signature(apply_group_offloading).parameters
        miss = [p for p in ("use_stream", "record_stream") if p not in params]
        if miss:
            W["group_offload"] = f"diffusers {diffusers.__version__}: apply_group_offloading has no {miss}"
        from diffusers.hooks.group_offloading import ModuleGroup
        if not hasattr(ModuleGroup, "_transfer_tensor_to_device"):
            W["group_offload_count"] = "ModuleGroup._transfer_tensor_to_device absent: bytes not counted"
    except Exception as e:  # noqa: BLE001
        why = f"diffusers: {type(e).__name__}: {e}"[:300]
        W["group_offload"] = why
        if spec["model"] in ("flux", "wan"):
            W["model"] = why
    try:
        import accelerate
        from accelerate import cpu_offload  # noqa: F401
        import accelerate.hooks as ah
        P["accelerate"] = accelerate.__version__
        if not hasattr(ah, "set_module_tensor_to_device"):
            W["cpu_offload_count"] = "accelerate.hooks.set_module_tensor_to_device absent: bytes not counted"
    except Exception as e:  # noqa: BLE001
        W["cpu_offload"] = f"accelerate: {type(e).__name__}: {e}"[:300]
    try:
        import importlib.metadata as md
        P["comfy_aimdo"] = md.version("comfy-aimdo")
        import comfy_aimdo.control as ac
        for fn in ("init", "init_device"):
            if not hasattr(ac, fn):
                W["comfy_aimdo"] = f"comfy_aimdo.control has no {fn}()"
    except Exception as e:  # noqa: BLE001
        W["comfy_aimdo"] = f"comfy-aimdo not importable: {type(e).__name__}: {e}"[:300]
    try:
        import safetensors
        P["safetensors"] = getattr(safetensors, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        W["safetensors"] = f"{type(e).__name__}: {e}"
    try:
        import psutil
        P["psutil"] = psutil.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        _ferry_path()
        import inspect
        import ferry
        import ferry.torch as ft
        P["ferry"] = getattr(ferry, "__version__", None) or "?"
        P["ferry_module"] = os.path.dirname(ferry.__file__)
        add = inspect.signature(ft.Store.add).parameters
        rep["ferry_add_stream"] = "stream" in add
        rep["ferry_add_pinned_cache"] = "pinned_cache" in add
        rep["ferry_stream_stats"] = hasattr(ft.Store, "stream_stats")
        if not rep["ferry_add_stream"]:
            W["ferry_stream"] = ("ferry.torch.Store.add has no stream= argument (this ferry predates the "
                                 "streaming API)")
    except Exception as e:  # noqa: BLE001
        W["ferry"] = f"ferry.torch not importable: {type(e).__name__}: {e}"[:300]
    if "model" not in W and spec.get("cfg"):
        try:  # what the checkpoint will hold, before it is made (room checks, the time estimate)
            rep["model_info"] = model_info(spec["model"], spec["cfg"])
        except Exception as e:  # noqa: BLE001
            W["model"] = f"building {spec['model']} on meta: {type(e).__name__}: {e}"[:300]
    if spec["device"].startswith("cuda") and rep.get("cuda"):
        try:
            rep["limit"] = pinned_copy_rate(spec["device"], spec["limit_gib"])
            rep["gpu"] = torch.cuda.get_device_name(0)
        except Exception as e:  # noqa: BLE001
            rep["limit"] = {"error": f"{type(e).__name__}: {e}"}
    _emit(rep)


def model_info(kind, cfg):
    """The meta-built model's checkpoint: tensors, bytes (BF16), the largest same-class block list
    (count, bytes of one), and the buffers the checkpoint lacks (non-persistent: name, shape, dtype)."""
    import torch
    m = build_model(kind, cfg)
    sd = m.state_dict()
    nbytes = sum(t.numel() * 2 for t in sd.values())
    blocks = None
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1:
            b = sum(p.numel() * 2 for p in mod[0].parameters())
            if blocks is None or b * len(mod) > blocks["count"] * blocks["bytes_each"]:
                blocks = {"name": name, "count": len(mod), "bytes_each": b}
    extra = [{"name": n, "shape": list(b.shape), "dtype": str(b.dtype).replace("torch.", ""), "device": str(b.device)}
             for n, b in m.named_buffers() if n not in sd]
    params = sum(t.numel() for t in sd.values())
    return {"tensors": len(sd), "parameters": params, "weight_bytes": nbytes, "blocks": blocks,
            "non_checkpoint_buffers": extra}


def pinned_copy_rate(device, gib, reps=5):
    import torch
    dev = torch.device(device)
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(dev)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        rates.append(n / (time.perf_counter() - t0) / GB)
    return {"bytes": n, "gbps_runs": rates, "gbps_best": max(rates), "gbps_median": statistics.median(rates)}


def _emit(rep, code=None):
    sys.stdout.write(RESULT_TAG + json.dumps(rep, default=str) + "\n")
    sys.stdout.flush()
    os._exit((0 if rep.get("ok") else 1) if code is None else code)


def _ferry_path():
    """Make `import ferry` find this checkout's python/ferry when it is not installed."""
    if os.environ.get("FERRY_BENCH_PYTHON"):
        sys.path.insert(0, os.environ["FERRY_BENCH_PYTHON"])
    try:
        import ferry  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(_HERE, "..", "python"))


# ----------------------------------------------------------------------------- child: measurements

class Meter:
    """Host and device memory of this process: VmHWM / the Rss split / USS, and
    device memory in use (mem_get_info) above the baseline taken at creation."""

    def __init__(self, torch, dev, poll_ms=0):
        self.torch, self.dev = torch, dev
        self.cuda = dev.type == "cuda"
        self.base = self.used() if self.cuda else None
        self.dev_peak = 0
        self.run_peak = 0
        self.rss = {"RssAnon": 0, "RssFile": 0, "RssShmem": 0}
        self.uss_peak = None
        self.huge_peak = None  # AnonHugePages (smaps_rollup): how much of the pinned memory got 2 MiB pages
        self._stop = None
        if self.cuda and poll_ms > 0:
            self._stop = threading.Event()
            threading.Thread(target=self._poll, args=(poll_ms / 1000.0,), daemon=True).start()

    def used(self):
        free, total = self.torch.cuda.mem_get_info(self.dev)
        return total - free

    def _poll(self, period):
        while not self._stop.wait(period):
            try:
                u = self.used() - self.base
                self.dev_peak, self.run_peak = max(self.dev_peak, u), max(self.run_peak, u)
            except Exception:  # noqa: BLE001
                return

    def sample(self, uss=False):
        if self.cuda:
            u = self.used() - self.base
            self.dev_peak, self.run_peak = max(self.dev_peak, u), max(self.run_peak, u)
        for k in self.rss:
            v = vm_status(k)
            if v is not None:
                self.rss[k] = max(self.rss[k], v)
        if uss:
            h = proc_field("/proc/self/smaps_rollup", "AnonHugePages")
            if h is not None:
                self.huge_peak = h if self.huge_peak is None else max(self.huge_peak, h)
            try:
                import psutil
                u = psutil.Process().memory_full_info().uss
                self.uss_peak = u if self.uss_peak is None else max(self.uss_peak, u)
            except Exception:  # noqa: BLE001
                pass

    def report(self):
        if self._stop is not None:
            self._stop.set()
        r = {"peak_rss_bytes": vm_status("VmHWM"), "rss_split_peak_bytes": self.rss, "uss_peak_bytes": self.uss_peak,
             "anon_huge_peak_bytes": self.huge_peak}
        if self.cuda:
            t = self.torch.cuda
            r.update(device_used_baseline_bytes=self.base, device_used_peak_delta_bytes=self.dev_peak,
                     torch_max_allocated_bytes=t.max_memory_allocated(self.dev),
                     torch_max_reserved_bytes=t.max_memory_reserved(self.dev))
        return r


def extra_buffers(model, names):
    """The module's buffers that are not checkpoint tensors (non-persistent ones: Wan's rotary
    tables), as (owner module, attribute, full name, tensor)."""
    found = []
    for mname, mod in model.named_modules():
        for attr, b in mod._buffers.items():
            full = f"{mname}.{attr}" if mname else attr
            if b is not None and full not in names:
                found.append((mod, attr, full, b))
    return found


def buffers_to(model, names, dev):
    """Move the buffers the checkpoint lacks to dev, where they are elsewhere (what model.to(dev)
    would do for them): {name: "from -> to"} of those moved, and their bytes."""
    moved, nbytes = {}, 0
    for mod, attr, full, b in extra_buffers(model, names):
        if b.device != dev:
            mod._buffers[attr] = b.to(dev)
            moved[full] = f"{b.device} -> {dev}"
            nbytes += b.numel() * b.element_size()
    return {"moved": moved, "bytes": nbytes}


def out_hash(out):
    import torch
    b = out.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(b).hexdigest()[:32]


class FerryRun:
    """Everything ferry-specific in one place (adjust here when the API moves):
    the store, how the model is attached, the counter of host->device bytes,
    the streaming statistics."""

    def __init__(self, model, path, device, budget_bytes, spec, rep):
        import ferry.torch as ft
        import inspect
        skw = {}
        if spec.get("ferry_pinned_budget"):  # else the library's default: a quarter of the host's available RAM
            skw["pinned_budget"] = spec["ferry_pinned_budget"]
        self.store = ft.Store(device, device_budget=budget_bytes, **skw)
        rep["ferry_store_kwargs"] = skw
        kw = {"module": model}
        params = inspect.signature(self.store.add).parameters
        if "stream" in params:
            kw["stream"] = "auto"
            if spec.get("ferry_prefetch") is not None:
                kw["prefetch"] = spec["ferry_prefetch"]
            if spec.get("ferry_reserve") is not None:
                kw["reserve"] = spec["ferry_reserve"]
            pc = FERRY_MODES[spec.get("ferry_mode") or "default"][0]
            if pc is not None:
                if "pinned_cache" not in params:
                    raise RuntimeError("ferry.torch.Store.add has no pinned_cache= argument "
                                       f"(mode {spec['ferry_mode']} needs it)")
                kw["pinned_cache"] = pc
        elif spec["budget_fraction"] >= 1.0:
            rep.setdefault("notes", []).append("Store.add has no stream=: added without streaming (fits)")
        else:
            raise RuntimeError("ferry.torch.Store.add has no stream= argument (ferry predates the streaming API)")
        rep["ferry_add_kwargs"] = {k: v for k, v in kw.items() if k != "module"}
        self.store.add("dit", path, **kw)

    def htod(self):
        return int(self.store.stats()["bytes_htod"])

    def htod_seconds(self):
        return float(self.store.stats().get("seconds_htod") or 0.0)

    def stream_stats(self):
        f = getattr(self.store, "stream_stats", None)
        if f is None:
            return {"error": "ferry.torch.Store has no stream_stats()"}
        try:
            return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                    for k, v in dict(f("dit")).items()}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"[:500]}

    def stats(self):
        s = dict(self.store.stats())
        return {k: v for k, v in s.items() if isinstance(v, (int, float, str, bool, dict, type(None)))}


class AimdoRun:
    """comfy-aimdo 0.6.0 as a plain module's residency manager: one VBAR
    (virtual range) for all the weights, laid out in the checkpoint's order
    (lower addresses are kept first), a watermark at the budget, and on every
    leaf module a forward pre-hook per parameter: vbar_fault() -> resident: a
    view of the VBAR page (filled from the page-locked CPU copy when its
    signature changed) / above the watermark: a temporary GPU copy; a forward
    hook unpins and drops the references. This glue follows aimdo's
    examples/example.py; ComfyUI's own casting (prefetch on an offload stream)
    is not part of the wheel."""

    def __init__(self, model, cpu_sd, dev, budget_bytes, rep, fake=None):
        import torch
        self.torch, self.dev, self.bytes = torch, dev, 0
        if fake is None:
            import comfy_aimdo.torch as at
            from comfy_aimdo.model_vbar import ModelVBAR, vbar_fault, vbar_signature_compare, vbar_unpin
            total = sum(((t.numel() * t.element_size() + 511) // 512) * 512 for t in cpu_sd.values())
            raw = sum(t.numel() * t.element_size() for t in cpu_sd.values())
            self.vbar = ModelVBAR(total + (64 << 20), device=dev.index or 0)
            # the VBAR packs tensors at 512-byte alignment: a budget of all the
            # weights' bytes is the whole packed range
            self.watermark = total if budget_bytes >= raw else int(budget_bytes)
            self.vbar.set_watermark(self.watermark)
            rep["aimdo_watermark_bytes"] = self.watermark
            self._fault, self._unpin, self._same = vbar_fault, vbar_unpin, vbar_signature_compare
            self._view = lambda alloc: at.aimdo_to_tensor(alloc, dev)
        else:  # a CPU stand-in for tests of the glue
            self.vbar, self._fault, self._unpin, self._same, self._view = fake(cpu_sd, budget_bytes)
        self.cpu, self.allocs, self.views, self.sigs = cpu_sd, {}, {}, {}
        for name, t in cpu_sd.items():
            self.allocs[name] = self.vbar.alloc(t.numel() * t.element_size())
        self.pins = []
        self.hooks = []
        for mname, mod in model.named_modules():
            own = [(p, f"{mname}.{p}" if mname else p) for p in mod._parameters]
            own = [(p, n) for p, n in own if n in cpu_sd]
            if own:
                self.hooks.append(mod.register_forward_pre_hook(self._pre_hook(own)))
                self.hooks.append(mod.register_forward_hook(self._post_hook(own)))
        rep["aimdo_hooked_modules"] = len(self.hooks) // 2

    def _pre_hook(self, own):
        def pre(mod, args):
            for pname, name in own:
                src = self.cpu[name]
                alloc = self.allocs[name]
                sig = self._fault(alloc)
                if sig is not None:
                    v = self.views.get(name)
                    if v is None:
                        v = self.views[name] = self._view(alloc).view(src.dtype).view(src.shape)
                    if not self._same(sig, self.sigs.get(name)):
                        v.copy_(src, non_blocking=True)
                        self.bytes += src.numel() * src.element_size()
                    self.sigs[name] = sig
                    self.pins.append(alloc)
                    mod._parameters[pname] = v
                else:
                    mod._parameters[pname] = src.to(self.dev, non_blocking=True)
                    self.bytes += src.numel() * src.element_size()
        return pre

    def _post_hook(self, own):
        def post(mod, args, out):
            for pname, name in own:
                mod._parameters[pname] = None
            while self.pins:
                self._unpin(self.pins.pop())
        return post

    def htod(self):
        return self.bytes


ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def pread_striped(path, base, size, threads, chunk, into):
    """Read bytes [base, base + size) of path with `threads` threads, thread k
    taking chunks k, k + threads, ... of `chunk` bytes, each into the writable
    memoryview into(k, off, n) returns (off from base). Seconds it took."""
    fd = os.open(path, os.O_RDONLY)
    errs = []

    def work(k):
        try:
            for off in range(k * chunk, size, threads * chunk):
                want = min(chunk, size - off)
                dst = into(k, off, want)
                got = 0
                while got < want:
                    n = os.preadv(fd, [dst[got:want]], base + off + got)
                    if n <= 0:
                        raise OSError(f"{path}: short read at {base + off + got}")
                    got += n
        except OSError as e:
            errs.append(e)

    t0 = time.perf_counter()
    try:
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        os.close(fd)
    if errs:
        raise errs[0]
    return time.perf_counter() - t0


def load_flat_cpu(torch, path, threads=8, chunk=64 << 20):
    """The checkpoint's data region read (pread, several threads) into one
    anonymous CPU buffer, and a dict of views of it. Anonymous on purpose: the
    buffer is page-locked next (cudaHostRegister), and registering a MAP_PRIVATE
    file mapping - what safetensors' CPU tensors are views of - can hang."""
    hdr, _meta, base = read_header(path)
    size = os.path.getsize(path) - base
    flat = torch.empty(size, dtype=torch.uint8)
    mv = memoryview(flat.numpy())
    pread_striped(path, base, size, threads, chunk, lambda k, off, n: mv[off:off + n])
    sd = {}
    for name, v in hdr.items():
        b, e = v["data_offsets"]
        dt = getattr(torch, ST_DTYPES[v["dtype"]])
        sd[name] = flat[b:e].view(dt).view(v["shape"])
    return flat, sd


def pin_in_place(torch, t):
    """Page-lock an anonymous CPU tensor in place (cudaHostRegister, as ComfyUI
    pins its offloaded weights; far faster than pin_memory()'s cudaHostAlloc +
    copy)."""
    nb = t.numel() * t.element_size()
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nb, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nb} bytes failed ({err})")
    return nb


def _union(iv):
    """Total length of the union of intervals [(start, end)], and the merged list."""
    merged = []
    for a, b in sorted(iv):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return sum(b - a for a, b in merged), merged


def timeline_summary(prof):
    """What the GPU did in one profiled step (torch.profiler's CUDA activity:
    every kernel and copy of the process, ferry's own copies included): the
    host-to-device copies' busy time, count, bytes and rate while busy, the
    kernels' busy time, how much of the copies overlapped kernels, and the
    copy engine's idle gaps (the largest, with how long kernels ran in them)."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        tp = f.name
    try:
        prof.export_chrome_trace(tp)
        with open(tp) as f:
            ev = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(tp)
    cp, kn, nbytes = [], [], 0
    for e in ev:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cat == "gpu_memcpy" and "HtoD" in name:
            cp.append(iv)
            nbytes += int((e.get("args") or {}).get("bytes", 0) or 0)
        elif cat == "kernel":
            kn.append(iv)
    if not cp and not kn:
        return {"error": "the profiler recorded no GPU activity"}
    t0 = min(a for a, _ in cp + kn)
    t1 = max(b for _, b in cp + kn)
    cbusy, cm = _union(cp)
    kbusy, km = _union(kn)
    def kernel_in(a, b):  # time in [a, b) with a kernel running
        return sum(min(b, y) - max(a, x) for x, y in km if x < b and y > a)

    both = sum(kernel_in(a, b) for a, b in cm)  # copy time with a kernel running
    gaps = [(cm[i][1], cm[i + 1][0]) for i in range(len(cm) - 1)]
    if cm:
        gaps = [(t0, cm[0][0])] + gaps + [(cm[-1][1], t1)]
    gaps = [(a, b) for a, b in gaps if b - a > 20]  # > 20 us

    big = sorted(gaps, key=lambda g: g[0] - g[1])[:8]
    return {"span_s": (t1 - t0) / 1e6, "copies": len(cp), "copy_bytes": nbytes,
            "copy_busy_s": cbusy / 1e6, "copy_gbps_busy": nbytes / cbusy / 1e3 if cbusy else None,
            "kernels": len(kn), "kernel_busy_s": kbusy / 1e6, "copy_with_kernel_s": both / 1e6,
            "copy_idle_s": (t1 - t0 - cbusy) / 1e6, "copy_gaps_over_20us": len(gaps),
            "copy_gap_s": sum(b - a for a, b in gaps) / 1e6,
            "largest_gaps": [{"at_s": (a - t0) / 1e6, "s": (b - a) / 1e6, "kernel_s": kernel_in(a, b) / 1e6}
                             for a, b in big]}


def child_main(spec):
    """--child SPEC: load the model one way, run the steps, print one RESULT line."""
    rep = {"config": spec["config"], "method": spec["method"], "ok": False, "runs": []}
    if spec["method"] == "comfy_aimdo":
        try:  # "comfy_aimdo.control.init() must be called before torch is imported"
            import comfy_aimdo.control as ac
            if not ac.init():
                raise RuntimeError("comfy_aimdo.control.init() returned False")
        except Exception as e:  # noqa: BLE001
            rep["error"] = f"comfy_aimdo init: {type(e).__name__}: {e}"[:1000]
            _emit(rep)
    try:
        _child_run(spec, rep)
        rep["ok"] = True
    except BaseException as e:  # noqa: BLE001
        import traceback
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
        rep["traceback"] = tail(traceback.format_exc(), 4000)
    if rep["ok"] and str(spec["device"]).startswith("cuda") and spec.get("limit_gib"):
        # the host's DMA rate drifts over minutes (bench_pinrate: 50.7 to 55.4 GB/s on one
        # machine, whatever the memory's page size), so each process also measures it
        # right after its own steps: the bound of "x own bound"
        try:
            rep["copy_limit"] = pinned_copy_rate(spec["device"], spec["limit_gib"], reps=3)
        except Exception as e:  # noqa: BLE001
            rep["copy_limit"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    if "meter" in rep:
        rep.update(rep.pop("meter").report())
    _emit(rep)


def _child_run(spec, rep):
    import torch
    rep["torch"] = torch.__version__
    sim = spec["device"].startswith("sim")
    dev = torch.device("cpu" if sim else spec["device"])
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        if spec["method"] == "comfy_aimdo":  # as its example: the device before any allocation
            import comfy_aimdo.control as ac
            if not ac.init_device(dev.index or 0):
                raise RuntimeError("comfy_aimdo.control.init_device() returned False")
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    rep["init_seconds"] = time.perf_counter() - T_PROC_START
    meter = Meter(torch, dev, spec.get("mem_poll_ms", 0))
    rep["meter"] = meter
    kind, cfg, path, method = spec["model"], spec["cfg"], spec["path"], spec["method"]
    t0 = time.perf_counter()
    model = build_model(kind, cfg)
    rep["build_seconds"] = time.perf_counter() - t0
    ckpt_names = set(read_header(path)[0])
    extra = extra_buffers(model, ckpt_names)
    if extra:
        rep["non_checkpoint_buffers"] = {full: str(b.device) for _m, _a, full, b in extra}
    htod = lambda: 0  # noqa: E731
    extras = {}
    t0 = time.perf_counter()
    if method == "resident":
        try:
            _ferry_path()
            import ferry.torch as ft
            sd = ft.load_file(path, device="cpu" if sim else str(dev))
            rep["loader"] = "ferry.torch.load_file"
        except ImportError:
            from safetensors.torch import load_file
            sd = load_file(path, device=str(dev))
            rep["loader"] = "safetensors.torch.load_file"
        model.load_state_dict(sd, assign=True, strict=True)
        del sd
        # what the checkpoint lacks goes to the device as model.to(device) would take it
        rep["buffers_moved"] = buffers_to(model, ckpt_names, dev)
    elif method == "ferry":
        _ferry_path()
        fr = FerryRun(model, path, spec["device"], spec["budget_bytes"], spec, rep)
        htod = fr.htod
        extras["ferry"] = fr
        # ferry moves the module's non-checkpoint buffers itself once it has that fix; a ferry
        # without it leaves them where the model was built (the CPU) and the first forward fails
        # on a device mismatch. The hand fix moves them here, only when some are left off the
        # device after Store.add; --no-buffer-fix leaves them (to see what ferry does alone).
        off = {full: str(b.device) for _m, _a, full, b in extra_buffers(model, ckpt_names) if b.device != dev}
        bf = {"enabled": bool(spec.get("buffer_fix", True)), "off_device_after_add": off, "applied": False}
        if off and bf["enabled"]:
            bf.update(applied=True, **buffers_to(model, ckpt_names, dev))
        rep["buffer_fix"] = bf
    elif method == "comfy_aimdo":
        flat, sd = load_flat_cpu(torch, path)
        rep["cpu_load_seconds"] = time.perf_counter() - t0
        rep["pinned_bytes"] = pin_in_place(torch, flat)
        ar = AimdoRun(model, sd, dev, spec["budget_bytes"], rep)
        htod = ar.htod
        extras["aimdo"] = ar
        rep["buffers_moved"] = buffers_to(model, ckpt_names, dev)  # the glue hooks parameters only
    else:
        from safetensors.torch import load_file
        sd = load_file(path)  # CPU
        rep["cpu_load_seconds"] = time.perf_counter() - t0
        if method in ("group_offload", "group_offload_rs"):
            from diffusers.hooks import apply_group_offloading
            from diffusers.hooks.group_offloading import ModuleGroup
            model.load_state_dict(sd, assign=True, strict=True)
            del sd
            counter = [0]
            orig = getattr(ModuleGroup, "_transfer_tensor_to_device", None)
            if orig is not None:
                def counting(self, tensor, source_tensor, default_stream, _o=orig):
                    if source_tensor.device.type != torch.device(self.onload_device).type:
                        counter[0] += source_tensor.numel() * source_tensor.element_size()
                    return _o(self, tensor, source_tensor, default_stream)
                ModuleGroup._transfer_tensor_to_device = counting
                htod = lambda: counter[0]  # noqa: E731
            else:
                rep.setdefault("notes", []).append("bytes not counted (diffusers internals changed)")
                htod = lambda: None  # noqa: E731
            kw = dict(onload_device=dev, offload_device=torch.device("cpu"), offload_type="block_level",
                      num_blocks_per_group=1, use_stream=True, record_stream=(method == "group_offload_rs"))
            rep["group_offload_kwargs"] = {k: str(v) for k, v in kw.items()}
            apply_group_offloading(model, **kw)
        elif method == "cpu_offload":
            import accelerate.hooks as ah
            from accelerate import cpu_offload
            model.load_state_dict(sd, assign=True, strict=True)
            del sd
            counter = [0]
            orig = ah.set_module_tensor_to_device

            def counting(module, name, device, value=None, *a, **k):
                if value is not None and str(device) not in ("meta", "cpu") and value.device.type == "cpu":
                    counter[0] += value.numel() * value.element_size()
                return orig(module, name, device, value, *a, **k)
            ah.set_module_tensor_to_device = counting
            htod = lambda: counter[0]  # noqa: E731
            cpu_offload(model, execution_device=dev)
        else:
            raise ValueError(f"unknown method {method}")
    sync()
    rep["load_seconds"] = time.perf_counter() - t0
    meter.sample(uss=True)
    rep["rss_after_load_bytes"] = vm_status("VmRSS")
    if cuda:
        rep["device_used_after_load_delta_bytes"] = meter.used() - meter.base
        rep["torch_max_allocated_load_bytes"] = torch.cuda.max_memory_allocated(dev)
    steps, nsched = spec["steps"], spec["schedule_steps"]
    with torch.inference_mode():
        for ntok in spec["image_tokens"]:
            run = {"image_tokens": ntok, "step_seconds": [], "htod_bytes": [], "hashes": [], "finite": True}
            shape = (spec.get("latent_shapes") or {}).get(str(ntok))
            if shape:
                run["latent_shape"] = shape
            inp = make_inputs(kind, cfg, ntok, spec["text_tokens"], dev, spec["seed"], shape)
            x = inp["x0"].clone()
            fr = extras.get("ferry")
            hs0 = fr.htod_seconds() if fr else None
            if fr:
                run["device_allocs"] = []
                run["read_bytes"] = []  # read from the checkpoint per step (the ring mode: every streamed block)
                run["fence_waits"], run["fence_orders"] = [], []
                st0 = fr.stats()
                da0 = st0.get("device_allocs")  # None before the library counted them
                rd0 = st0.get("bytes_read")
                fw0, fo0 = st0.get("fence_waits"), st0.get("fence_orders")
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
                meter.run_peak = meter.used() - meter.base
            for k in range(steps):
                t = 1.0 - k / nsched
                sync()
                b0 = htod()
                prof = None
                if cuda and spec.get("profile_step") == k:  # a diagnostic step: its timing is perturbed
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                    prof.__enter__()
                s0 = time.perf_counter()
                out = forward(kind, model, inp, x, t)
                sync()
                run["step_seconds"].append(time.perf_counter() - s0)
                if prof is not None:
                    prof.__exit__(None, None, None)
                    run["timeline"] = timeline_summary(prof)
                b1 = htod()
                run["htod_bytes"].append(None if b0 is None or b1 is None else b1 - b0)
                if fr:  # the store's driver calls for device memory this step (0 when steady)
                    st1 = fr.stats()
                    da = st1.get("device_allocs")
                    run["device_allocs"].append(None if da is None or da0 is None else da - da0)
                    fw, fo = st1.get("fence_waits"), st1.get("fence_orders")
                    run["fence_waits"].append(None if fw is None or fw0 is None else fw - fw0)
                    run["fence_orders"].append(None if fo is None or fo0 is None else fo - fo0)
                    rd = st1.get("bytes_read")
                    run["read_bytes"].append(None if rd is None or rd0 is None else rd - rd0)
                    rd0 = rd
                    fw0, fo0 = fw, fo
                    da0 = da
                meter.sample()
                run["hashes"].append(out_hash(out))
                if run["finite"] and not bool(torch.isfinite(out).all()):
                    run["finite"] = False
                x = x + (-1.0 / nsched) * out
                if fr and k == 0:
                    run["ferry_stream_stats_after_first"] = fr.stream_stats()
                if k == 0 and "buffer_fix" in rep and "devices_after_first_step" not in rep["buffer_fix"]:
                    rep["buffer_fix"]["devices_after_first_step"] = {
                        full: str(b.device) for _m, _a, full, b in extra_buffers(model, ckpt_names)}
            if cuda:
                run["torch_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
                run["torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
                run["device_used_peak_delta_bytes"] = meter.run_peak
            if fr:
                run["ferry_stream_stats"] = fr.stream_stats()
                run["ferry_htod_seconds"] = fr.htod_seconds() - hs0
            meter.sample(uss=True)
            run["first_seconds"] = run["step_seconds"][0]
            rest = [s for k, s in enumerate(run["step_seconds"]) if k > 0 and k != spec.get("profile_step")]
            run["steady_seconds"] = statistics.mean(rest) if rest else None
            hb = [b for b in run["htod_bytes"][1:] if b is not None]
            run["htod_bytes_steady"] = statistics.mean(hb) if hb else None
            rb = [b for b in run.get("read_bytes", [])[1:] if b is not None]
            if rb:
                run["read_bytes_steady"] = statistics.mean(rb)
            rep["runs"].append(run)
            del inp, x, out
    if "ferry" in extras:
        rep["ferry_stats"] = extras["ferry"].stats()


# ----------------------------------------------------------------------------- parent

def parse_budget(s):
    s = s.strip()
    f = float(s.rstrip("%")) / (100.0 if s.endswith("%") or float(s.rstrip("%")) > 1.0 else 1.0)
    if f <= 0:
        raise ValueError(f"budget {s!r}")
    return f


def size_txt(n):
    """Bytes as GB, or MB below 0.1 GB (the tiny models' notes)."""
    return f"{n / GB:.2f} GB" if n >= 1e8 or n == 0 else f"{n / 1e6:.3f} MB"


def parse_locations(s):
    """--file-locations "name:dir,name:dir" -> [(name, dir)]."""
    locs = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, d = part.partition(":")
        if not sep or not d or not name or not all(ch.isalnum() or ch in "_-" for ch in name):
            raise ValueError(f"--file-locations: {part!r} is not NAME:DIR (NAME of letters, digits, _ or -)")
        if name in (n for n, _ in locs):
            raise ValueError(f"--file-locations: {name} named twice")
        locs.append((name, d))
    if not locs:
        raise ValueError("--file-locations: no location")
    return locs


def meminfo():
    """The host's memory as the parent sees it between children (bytes): what is available, the
    page cache, tmpfs (Shmem), dirty and under-writeback pages."""
    want = ("MemTotal", "MemAvailable", "Cached", "Shmem", "Dirty", "Writeback")
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in want:
                    out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def page_cache_fraction(path, window=1 << 30):
    """The share of path's pages in the page cache (mincore over read-only shared mappings of it,
    1 GiB at a time), or None where that cannot be asked."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = os.sysconf("SC_PAGE_SIZE")
        size = os.path.getsize(path)
        if size == 0:
            return 1.0
        fd = os.open(path, os.O_RDONLY)
    except (OSError, AttributeError, ValueError):
        return None
    resident = 0
    try:
        for off in range(0, size, window):
            n = min(window, size - off)
            addr = libc.mmap(None, n, 1, 1, fd, off)  # PROT_READ, MAP_SHARED
            if addr is None or addr == ctypes.c_void_p(-1).value:
                return None
            try:
                pages = (n + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(ctypes.c_void_p(addr), n, vec) != 0:
                    return None
                resident += pages - bytes(vec).count(0)  # bit 0 set: resident (the other bits are 0)
            finally:
                libc.munmap(ctypes.c_void_p(addr), n)
        return resident / ((size + page - 1) // page)
    finally:
        os.close(fd)


def warm_page_cache(path, threads=8, chunk=16 << 20):
    """Read path whole (threads x pread into small buffers), so that its pages are in the page cache."""
    bufs = [memoryview(bytearray(chunk)) for _ in range(threads)]
    return pread_striped(path, 0, os.path.getsize(path), threads, chunk, lambda k, off, n: bufs[k])


def step_flops(kind, cfg, info, tokens, text_tokens):
    """Rough FLOPs of one forward (the time estimate only): 2 x parameters x tokens for the
    linear layers, plus 4 x sequence^2 x dim per attention block (and Wan's cross attention)."""
    params = (info or {}).get("parameters") or 0
    if kind == "wan":
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        n = cfg["num_layers"]
        return 2 * params * tokens + n * (4 * tokens * tokens * dim + 4 * tokens * text_tokens * dim)
    if kind == "flux":
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        n, seq = cfg["num_layers"] + cfg["num_single_layers"], tokens + text_tokens
    else:
        dim, n, seq = cfg["dim"], cfg["blocks"], tokens + text_tokens
    return 2 * params * seq + n * 4 * seq * seq * dim


# What the time estimate assumes (GPU-machine rates; none is measured by the estimate itself).
EST = {
    "child_start_s": 18.0,      # interpreter, torch + diffusers imports, CUDA context, model on meta
                                # (FLUX runs: 17-20 s)
    "probe_s": 15.0,            # the probe child: imports and the 1 GiB pinned copy
    "make_gbps": 0.75,          # random weights on the GPU + the writer, to tmpfs (FLUX: 23.8 GB in 32 s)
    "copy_disk_gbps": 0.5,      # cp to a disk + fsync: a guess, not a reading
    "copy_tmpfs_gbps": 2.0,     # cp to tmpfs
    "resident_load_gbps": 12.0, # ferry.torch.load_file from the page cache to the device
    "group_pin_gbps": 0.9,      # group offloading's CPU load + pinning (FLUX: 22-30 s for 23.8 GB)
    "first_read_gbps": 2.5,     # ferry's first step reading the streamed blocks into pinned RAM (FLUX: 7.7-8.3 s
                                # for 14-20 GB)
    "ring_gbps": 12.0,          # a step through the pinned ring from the page cache: a guess
    "htod_gbps": 50.0,          # pinned host -> device
    "pageable_gbps": 6.0,       # cpu_offload's pageable copies
    "tflops": 450.0,            # BF16 forward, sustained
}


class Bench:
    def __init__(self, a):
        self.a = a
        self.t_start = T_PROC_START
        self.results = []
        self.out = {"tool": "bench/stream.py", "args": vars(a), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "units": {"seconds": "s", "bytes": "bytes", "gbps": "1e9 bytes/s"},
                    "meta": {}, "probe": None, "limits": [], "results": self.results}
        self.unavailable = {}
        self.model_info = None
        self.weight_bytes = None
        # the checkpoint's locations: name ("" when --file-locations is not given), dir, path, fs,
        # state ("source": made or found here; "pending": to be copied before its first config;
        # "ready"; "unavailable" with why)
        self.locs = [{"name": n, "dir": d} for n, d in (parse_locations(a.file_locations) if a.file_locations
                                                         else [("", a.workdir)])]
        self.src = None  # the location holding the made checkpoint

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def remaining(self):
        return self.a.budget_seconds - self.elapsed()

    def until_deadline(self):
        return self.a.deadline_seconds - self.elapsed()

    def log(self, msg):
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def save(self):
        if not self.a.out:
            return
        try:
            self.out["elapsed_seconds"] = self.elapsed()
            self.out["summary"] = self.summary()
            self.out["table_markdown"] = self.table()
            os.makedirs(os.path.dirname(os.path.abspath(self.a.out)), exist_ok=True)
            tmp = self.a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.out, f, indent=1, default=str)
                f.write("\n")
            os.replace(tmp, self.a.out)
            # the table beside it after every child too: a run cut short still leaves one
            with open(os.path.splitext(self.a.out)[0] + ".md", "w") as fh:
                fh.write(self.table() + "\n")
        except Exception as e:  # noqa: BLE001
            print(f"warning: cannot write {self.a.out}: {e}", file=sys.stderr, flush=True)

    def child(self, flag, spec, timeout):
        cmd = [self.a.python, os.path.abspath(__file__), flag, json.dumps(spec)]
        env = dict(os.environ)
        lib = spec.get("lib") or self.a.ferry_lib
        if lib:
            env["FERRY_LIBRARY"] = os.path.abspath(lib)
        if spec.get("pydir"):  # the B build's own python/ (ferry_b:P)
            env["FERRY_BENCH_PYTHON"] = os.path.abspath(spec["pydir"])
        rc, out, err, wall, to = run_process(cmd, timeout, env=env)
        rep = None
        for line in reversed((out or "").splitlines()):
            if line.startswith(RESULT_TAG):
                try:
                    rep = json.loads(line[len(RESULT_TAG):])
                except ValueError:
                    pass
                break
        return rep, {"rc": rc, "wall_seconds": wall, "timed_out": to, "stderr_tail": tail(err, 1500)}

    # -- configs
    def configs(self):
        """Every configuration as a dict: name, method, frac (device budget), mode (ferry's), loc
        (the location of the file it reads; None: the made file). With several locations the
        configs that read the made file run first (see the docstring), ferry's after them with
        each budget and mode's locations side by side."""
        a = self.a
        fr = [parse_budget(b) for b in a.budgets.split(",") if b.strip()]
        modes = [m.strip() for m in a.ferry_modes.split(",") if m.strip()]
        for m in modes:
            if m not in FERRY_MODES:
                raise ValueError(f"--ferry-modes: {m!r} is not one of {', '.join(FERRY_MODES)}")
        locs = [lc["name"] for lc in self.locs]

        def one(name, method, frac=None, mode=None, loc=None):
            return {"name": name, "method": method, "frac": frac, "mode": mode, "loc": loc}

        def ferry_set(prefix):
            return [one(f"{prefix}:{round(f * 100)}{FERRY_MODES[m][1]}" + (f"@{lc}" if lc else ""), "ferry", f, m, lc)
                    for f in fr for m in modes for lc in locs]

        base = [one("resident", "resident")]
        others = [one("group_offload", "group_offload"), one("group_offload_rs", "group_offload_rs"),
                  one("cpu_offload", "cpu_offload")]
        others += [one(f"comfy_aimdo:{round(f * 100)}", "comfy_aimdo", f) for f in fr]
        fer = ferry_set("ferry") + (ferry_set("ferry_b") if a.ferry_lib_b else [])
        cs = base + (others + fer if len(locs) > 1 else fer + others)

        def picked(c, sel):
            name, bare = c["name"], c["name"].split("@")[0]
            for s in sel:
                if s.startswith("@"):
                    if c["loc"] == s[1:]:
                        return True
                elif s in (name, bare, c["method"], c["mode"]) or name.startswith((s + ":", s + "_", s + "@")):
                    return True
            return False

        if a.only:
            sel = [s.strip() for s in a.only.split(",") if s.strip()]
            cs = [c for c in cs if c["name"] == "resident" or picked(c, sel)]
        if a.skip:
            sel = [s.strip() for s in a.skip.split(",") if s.strip()]
            cs = [c for c in cs if c["name"] == "resident" or not picked(c, sel)]
        return cs

    # -- setup
    def ckpt_name(self):
        a = self.a
        return f"stream-{a.model}{'-tiny' if a.tiny else ''}-seed{a.seed}.safetensors"

    def setup(self):
        a = self.a
        m = self.out["meta"]
        m["python"] = sys.version.split()[0]
        m["host_cpus"] = os.cpu_count()
        try:
            m["kernel"] = os.uname().release
        except OSError:
            pass
        m["meminfo_start"] = meminfo()
        m["mem_total_bytes"] = m["meminfo_start"].get("MemTotal")
        if a.device.startswith("cuda"):
            rc, out, err, _, _ = run_process(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                              "--format=csv,noheader"], 20)
            m["nvidia_smi"] = out.strip() if rc == 0 else f"unavailable: {last_line(err) or rc}"
        self.cfg = model_config(a.model, a.tiny)
        # probe: imports, APIs, the model's size, the pinned copy limit
        self.log("probe: packages, APIs, the model on meta" +
                 (", pinned host->device copy rate" if a.device.startswith("cuda") else ""))
        rep, info = self.child("--probe", {"device": a.device, "model": a.model, "cfg": self.cfg,
                                           "limit_gib": a.limit_gib}, 180)
        if rep is None:
            sys.exit(f"stream.py: the probe child failed ({rc_text(info['rc'])}): {info['stderr_tail']}")
        self.out["probe"] = rep
        if not rep.get("ok"):
            sys.exit(f"stream.py: {rep.get('error')}")
        if rep.get("limit"):
            self.out["limits"].append(dict(rep["limit"], when="start"))
        W = rep.get("why_not", {})
        self.log(f"packages: {rep.get('packages')}; ferry stream API: add(stream=) {rep.get('ferry_add_stream')}, "
                 f"add(pinned_cache=) {rep.get('ferry_add_pinned_cache')}, "
                 f"stream_stats {rep.get('ferry_stream_stats')}")
        for k, v in W.items():
            self.log(f"  {k}: {v}")
        if "model" in W:
            sys.exit(f"stream.py: cannot build --model {a.model}: {W['model']}")
        self.model_info = rep.get("model_info")
        mi = self.model_info or {}
        if mi:
            b = mi.get("blocks") or {}
            self.log(f"model {a.model}{' tiny' if a.tiny else ''}: {mi['parameters'] / 1e9:.3f} B parameters, "
                     f"{mi['weight_bytes'] / GB:.2f} GB BF16 in {mi['tensors']} tensors; {b.get('count')} x "
                     f"{(b.get('bytes_each') or 0) / GB:.3f} GB in {b.get('name')}; buffers not in the checkpoint: "
                     f"{[x['name'] for x in mi.get('non_checkpoint_buffers', [])] or 'none'}")
        sim = a.device.startswith("sim")
        for c in self.configs():
            meth, why = c["method"], None
            if sim and meth not in ("resident", "ferry"):
                why = f"not applicable on {a.device} (needs CUDA)"
            elif meth in ("group_offload", "group_offload_rs"):
                why = W.get("group_offload")
            elif meth == "cpu_offload":
                why = W.get("cpu_offload")
            elif meth == "comfy_aimdo":
                why = W.get("comfy_aimdo")
            elif meth == "ferry":
                why = W.get("ferry") or (W.get("ferry_stream") if c["frac"] < 1.0 else None)
                if not why and FERRY_MODES[c["mode"]][0] is not None and not rep.get("ferry_add_pinned_cache"):
                    why = "ferry.torch.Store.add has no pinned_cache= argument"
            if why:
                self.unavailable[c["name"]] = why
        self.setup_locations()
        self.ensure_checkpoint()
        hdr, meta, base = read_header(self.path)
        self.weight_bytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in hdr.values())
        self.file_bytes = os.path.getsize(self.path)
        m["checkpoint"].update(path=self.path, bytes=self.file_bytes, weight_bytes=self.weight_bytes,
                               tensors=len(hdr), metadata=meta)
        self.log(f"checkpoint {self.path}: {self.weight_bytes / GB:.2f} GB of weights, {len(hdr)} tensors "
                 f"({self.src['fs']})")
        for lc in self.locs:
            if lc is not self.src and lc["state"] == "pending":
                self.check_room(lc, self.file_bytes)
        est = self.estimate()
        self.out["estimate"] = est
        self.log("time estimate (rates assumed, not measured: EST in the script): "
                 + ", ".join(f"{k} {v:.0f} s" for k, v in est["parts"].items()) + f"; total {est['total']:.0f} s")
        if est["total"] + 15 > a.budget_seconds:
            self.log(f"  the estimate exceeds --budget-seconds {a.budget_seconds:.0f}: configs past it will be "
                     "skipped (split the run with --only/--skip: see the docstring)")
        self.save()

    def setup_locations(self):
        """Each location's directory, filesystem and the checkpoint's path in it; which one the
        checkpoint is made in (a valid one already there is reused; else the first tmpfs location
        with room, fast to write, else the first with room)."""
        a = self.a
        m = self.out["meta"]
        if not a.file_locations and a.workdir == DEFAULT_WORKDIR and not a.tiny:
            try:  # the single default location: the disk when /dev/shm lacks room
                os.makedirs(a.workdir, exist_ok=True)
                st = os.statvfs(a.workdir)
                need = self.expected_bytes() + 1e9
                if (st.f_bavail * st.f_frsize < need
                        and not os.path.exists(os.path.join(a.workdir, self.ckpt_name()))):
                    self.log(f"{a.workdir}: {st.f_bavail * st.f_frsize / GB:.1f} GB free, too little: "
                             f"using {FALLBACK_WORKDIR} (the disk) instead")
                    self.locs[0]["dir"] = a.workdir = FALLBACK_WORKDIR
            except OSError:
                pass
        for lc in self.locs:
            lc["path"] = os.path.join(lc["dir"], self.ckpt_name())
            try:
                os.makedirs(lc["dir"], exist_ok=True)
                lc["fs"] = fs_type(lc["dir"]) or "?"
                lc["state"] = "pending"
            except OSError as e:
                lc.update(fs="?", state="unavailable", why=f"{lc['dir']}: {e}")
        self.want = {"tool": "bench/stream.py", "model": a.model, "tiny": str(a.tiny), "seed": str(a.seed),
                     "init": INIT_VERSION, "config": json.dumps(self.cfg, sort_keys=True)}
        live = [lc for lc in self.locs if lc["state"] == "pending"]
        if not live:
            sys.exit("stream.py: no usable checkpoint location: "
                     + "; ".join(lc.get("why", "") for lc in self.locs))
        for lc in live:
            if self.valid(lc["path"]):
                lc["state"] = "ready"
        ready = [lc for lc in live if lc["state"] == "ready"]
        need = self.expected_bytes() + 1e9
        roomy = [lc for lc in live if self.free_bytes(lc["dir"]) >= need]
        ram = [lc for lc in roomy if lc["fs"] in ("tmpfs", "ramfs")]
        pick = (sorted(ready, key=lambda lc: lc["fs"] not in ("tmpfs", "ramfs")) or ram or roomy or live)[0]
        self.src = pick
        self.path = pick["path"]
        m["checkpoint"] = {"path": self.path, "fs_type": pick["fs"], "location": pick["name"]}
        m["locations"] = self.locs
        if len(self.locs) > 1:
            self.log("locations: " + "; ".join(f"{lc['name']} {lc['dir']} ({lc['fs']}, {lc['state']}"
                                                  f"{', made here' if lc is pick and lc['state'] != 'ready' else ''})"
                                                  for lc in self.locs))

    def expected_bytes(self):
        mi = self.model_info or {}
        return float(mi.get("weight_bytes") or (1e8 if self.a.tiny else 30e9))

    @staticmethod
    def free_bytes(d):
        try:
            st = os.statvfs(d)
            return st.f_bavail * st.f_frsize
        except OSError:
            return 0

    def valid(self, path):
        """A checkpoint of this model, seed and init (its metadata), whole (its size as its header says)."""
        if not os.path.exists(path):
            return False
        try:
            hdr, meta, base = read_header(path)
            end = max((v["data_offsets"][1] for v in hdr.values()), default=0)
            return all(meta.get(k) == v for k, v in self.want.items()) and os.path.getsize(path) == base + end
        except (OSError, ValueError, struct.error, KeyError, TypeError):
            return False

    def check_room(self, lc, nbytes):
        """A copy location needs the file's bytes free (and, on tmpfs, as much RAM available beside
        8 GB for the runs); without them its configs are reported unavailable."""
        free = self.free_bytes(lc["dir"])
        why = None
        if free < nbytes + 1e9:
            why = f"{lc['dir']}: {free / GB:.1f} GB free, {(nbytes + 1e9) / GB:.1f} GB needed for the copy"
        elif lc["fs"] in ("tmpfs", "ramfs"):
            avail = meminfo().get("MemAvailable") or 0
            if avail < nbytes + 8e9:
                why = (f"{lc['dir']} is {lc['fs']}: {avail / GB:.1f} GB of RAM available, "
                       f"{(nbytes + 8e9) / GB:.1f} needed")
        if why:
            lc.update(state="unavailable", why=why)
            self.log(f"location {lc['name']}: {why}")

    def ensure_checkpoint(self):
        a = self.a
        lc = self.src
        if lc["state"] == "ready":
            self.log(f"reusing {self.path}")
            self.out["meta"]["checkpoint_made"] = False
            lc["state"] = "source"
            return
        if os.path.exists(self.path):
            self.log(f"{self.path} is from another model/seed/init or incomplete: making it again")
        free, need = self.free_bytes(lc["dir"]), self.expected_bytes() + 0.5e9
        if free < need:
            sys.exit(f"stream.py: {free / GB:.1f} GB free in {lc['dir']}, about {need / GB:.1f} GB needed")
        fsync = lc["fs"] not in ("tmpfs", "ramfs")
        self.log(f"making {self.path} (random BF16 weights on {a.device}{', fsync' if fsync else ''})")
        spec = {"device": a.device, "model": a.model, "cfg": self.cfg, "seed": a.seed, "path": self.path,
                "meta": self.want, "fsync": fsync}
        rep, info = self.child("--make", spec, max(60.0, min(400.0, self.until_deadline())))
        self.out["meta"]["make"] = {"report": rep, **info}
        if not rep or not rep.get("ok"):
            why = (rep or {}).get("error") or info["stderr_tail"] or rc_text(info["rc"])
            sys.exit(f"stream.py: making the checkpoint failed: {why}")
        self.out["meta"]["checkpoint_made"] = True
        lc["state"] = "source"
        self.log(f"made it: {rep['bytes'] / GB:.2f} GB in {rep['seconds']:.1f} s ({info['wall_seconds']:.1f} s process)")

    def ensure_copy(self, lc):
        """The checkpoint copied (cp) into a further location, synced to its disk, before the first
        config that reads it; a valid copy already there is used as it is."""
        if lc["state"] in ("ready", "source"):
            return True
        if lc["state"] == "unavailable":
            return False
        rec = self.out["meta"].setdefault("copies", {})
        if self.valid(lc["path"]):
            lc["state"] = "ready"
            rec[lc["name"]] = {"reused": True}
            return True
        self.check_room(lc, self.file_bytes)
        if lc["state"] == "unavailable":
            return False
        tmp = lc["path"] + ".tmp"
        self.log(f"copying the checkpoint to {lc['name']}: {lc['path']} ({lc['fs']})")
        t0 = time.perf_counter()
        rc, _out, err, wall, to = run_process(["cp", "--sparse=never", self.path, tmp],
                                              max(30.0, self.until_deadline() - 30))
        r = {"from": self.path, "to": lc["path"], "fs_type": lc["fs"], "cp_seconds": wall}
        try:
            if rc != 0:
                raise OSError(f"cp: {'timed out' if to else rc_text(rc)}: {last_line(err)}")
            t1 = time.perf_counter()
            if lc["fs"] not in ("tmpfs", "ramfs"):  # on the disk before any measurement: no writeback during runs
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            r["fsync_seconds"] = time.perf_counter() - t1
            os.replace(tmp, lc["path"])
            r.update(seconds=time.perf_counter() - t0, bytes=os.path.getsize(lc["path"]))
            r["gbps"] = r["bytes"] / r["seconds"] / GB
            r["meminfo_after"] = meminfo()
            lc["state"] = "ready"
            self.log(f"copied: {r['bytes'] / GB:.2f} GB in {r['seconds']:.1f} s (cp {wall:.1f} s, fsync "
                     f"{r['fsync_seconds']:.1f} s): {r['gbps']:.2f} GB/s")
        except OSError as e:
            r["error"] = str(e)[:500]
            lc.update(state="unavailable", why=f"copy failed: {e}"[:300])
            self.log(f"location {lc['name']}: copy failed: {e}")
            try:
                os.unlink(tmp)
            except OSError:
                pass
        rec[lc["name"]] = r
        self.save()
        return lc["state"] == "ready"

    def loc_of(self, c):
        if c["loc"] is None:
            return self.src
        return next(lc for lc in self.locs if lc["name"] == c["loc"])

    # -- the estimate
    def estimate(self):
        """Seconds each part of the run should take at the rates in EST (a plan, not a result)."""
        a, e = self.a, EST
        W = float(self.weight_bytes or self.expected_bytes())
        parts = {"probes": e["probe_s"] * (2 if a.device.startswith("cuda") else 1)}
        if self.out["meta"].get("checkpoint_made") is not False:
            parts["make"] = W / GB / e["make_gbps"] + 10
        for lc in self.locs:
            if lc is not self.src and lc["state"] == "pending" and any(
                    c["loc"] == lc["name"] and c["name"] not in self.unavailable for c in self.configs()):
                rate = e["copy_tmpfs_gbps"] if lc["fs"] in ("tmpfs", "ramfs") else e["copy_disk_gbps"]
                parts[f"copy {lc['name']}"] = W / GB / rate
        comp = {n: step_flops(a.model, self.cfg, self.model_info, n, a.text_tokens) / (e["tflops"] * 1e12)
                for n in self.image_tokens}

        def steps(per_byte_gbps, nbytes):
            return sum(a.steps * max(comp[n], nbytes / GB / per_byte_gbps if nbytes else 0.0) for n in comp)

        for c in self.configs():
            if c["name"] in self.unavailable:
                continue
            m, t = c["method"], e["child_start_s"]
            if m == "resident":
                t += W / GB / e["resident_load_gbps"] + steps(1, 0)
            elif m in ("group_offload", "group_offload_rs"):
                t += W / GB / e["group_pin_gbps"] + steps(e["htod_gbps"], W)
            elif m == "cpu_offload":
                t += steps(e["pageable_gbps"], W) * min(a.steps, a.cpu_offload_steps) / a.steps
            elif m == "comfy_aimdo":
                t += W / GB / e["resident_load_gbps"] + steps(e["htod_gbps"], (1 - c["frac"]) * W)
            else:  # ferry
                s = max(0.0, 1 - c["frac"]) * W
                if c["mode"] == "ring":
                    t += steps(e["ring_gbps"], s)
                else:
                    t += s / GB / e["first_read_gbps"] + steps(e["htod_gbps"], s)
            parts[c["name"]] = t * a.reps
        return {"parts": parts, "total": sum(parts.values()), "assumed": EST,
                "step_compute_seconds": {str(n): v for n, v in comp.items()}}

    # -- runs
    def run_config(self, c, rnd):
        a = self.a
        name, method, frac = c["name"], c["method"], c["frac"]
        r = {"config": name, "method": method, "round": rnd, "status": "error", "ok": False,
             "mode": c["mode"], "location": c["loc"] if c["loc"] is not None else self.src["name"]}
        self.results.append(r)
        if name in self.unavailable:
            r.update(status="unavailable", error=self.unavailable[name])
            return r
        if self.remaining() <= 0:
            r.update(status="skipped", error=f"skipped: budget of {a.budget_seconds:.0f} s used up")
            return r
        lc = self.loc_of(c)
        if not self.ensure_copy(lc):
            r.update(status="unavailable", error=f"location {lc['name']}: {lc.get('why')}")
            return r
        if self.remaining() <= 0:  # the copy may have used it
            r.update(status="skipped", error=f"skipped: budget of {a.budget_seconds:.0f} s used up")
            return r
        r.update(file=lc["path"], fs_type=lc["fs"])
        if lc["fs"] not in ("tmpfs", "ramfs"):
            # "in the page cache" is what the disk configs measure: checked (mincore) before each,
            # and read in first where pages are missing (a child before may have pushed them out)
            pc = {"before": page_cache_fraction(lc["path"])}
            if pc["before"] is not None and pc["before"] < 0.999:
                try:
                    pc["warm_seconds"] = warm_page_cache(lc["path"])
                except OSError as e:
                    pc["warm_error"] = str(e)[:300]
                pc["after_warm"] = page_cache_fraction(lc["path"])
            r["page_cache"] = pc
        r["meminfo_before"] = meminfo()
        steps = a.steps if method != "cpu_offload" else max(2, min(a.steps, a.cpu_offload_steps))
        spec = {"config": name, "method": method, "device": a.device, "model": a.model, "cfg": self.cfg,
                "path": lc["path"], "seed": a.seed, "steps": steps, "schedule_steps": a.steps,
                "text_tokens": a.text_tokens, "image_tokens": self.image_tokens,
                "latent_shapes": {str(n): list(s) for n, s in self.latent_shapes.items()},
                "mem_poll_ms": a.mem_poll_ms, "ferry_prefetch": a.ferry_prefetch, "ferry_reserve": a.ferry_reserve,
                "ferry_pinned_budget": a.ferry_pinned_budget,
                "ferry_mode": c["mode"], "buffer_fix": not a.no_buffer_fix,
                "profile_step": a.profile_step, "limit_gib": a.limit_gib}
        if name.startswith("ferry_b:"):
            spec["lib"] = a.ferry_lib_b
            spec["pydir"] = a.ferry_python_b
        if frac is not None:
            spec.update(budget_fraction=frac, budget_bytes=int(math.ceil(frac * self.weight_bytes)))
            r["budget_bytes"] = spec["budget_bytes"]
        timeout = max(10.0, min(a.run_timeout, self.until_deadline()))
        rep, info = self.child("--child", spec, timeout)
        r.update(info)
        if "page_cache" in r:
            r["page_cache"]["after_run"] = page_cache_fraction(lc["path"])
        if rep is None:
            r["error"] = (f"timed out after {timeout:.0f} s" if info["timed_out"] else
                          f"child died ({rc_text(info['rc'])}) without a report: "
                          f"{last_line(info['stderr_tail']) or 'no message'}")
            return r
        r.update({k: v for k, v in rep.items() if k not in ("ok", "config", "method")})
        if rep.get("ok"):
            r.update(status="ok", ok=True)
            r.pop("stderr_tail", None)
        else:
            r["error"] = rep.get("error") or "child failed"
        return r

    def describe(self, r):
        if not r["ok"]:
            return f"{r['status'].upper()}: {r.get('error')}"
        parts = []
        for run in r.get("runs", []):
            st = run.get("steady_seconds")
            hb = run.get("htod_bytes_steady")
            parts.append(f"{run['image_tokens']} tok: first {run['first_seconds']:.3f} s, steady "
                         f"{'%.3f s' % st if st is not None else '-'}, H2D/step "
                         f"{'%.2f GB' % (hb / GB) if hb is not None else '-'}")
        gpu = r.get("device_used_peak_delta_bytes")
        bf = r.get("buffer_fix") or {}
        pc = r.get("page_cache") or {}
        return (f"load {r.get('load_seconds', 0):.1f} s, {'; '.join(parts)}; peak RSS "
                f"{(r.get('peak_rss_bytes') or 0) / GIB:.1f} GiB"
                + (f", GPU used +{gpu / GIB:.1f} GiB" if gpu is not None else "")
                + (", buffers moved by hand" if bf.get("applied") else "")
                + (f", page cache {pc['before'] * 100:.1f} % before" if pc.get("before") is not None else "")
                + (f" (warmed in {pc['warm_seconds']:.1f} s)" if pc.get("warm_seconds") is not None else "")
                + f" ({r['wall_seconds']:.0f} s process)")

    def run_all(self):
        cs = self.configs()
        total = self.a.reps * len(cs)
        i = 0
        for rnd in range(1, self.a.reps + 1):
            order = cs if rnd % 2 == 1 else list(reversed(cs))
            for c in order:
                i += 1
                r = self.run_config(c, rnd)
                self.log(f"[{i}/{total}] round {rnd} {c['name']}: {self.describe(r)}")
                self.save()
        if self.a.device.startswith("cuda") and self.until_deadline() > 40:
            rep, _ = self.child("--probe", {"device": self.a.device, "model": self.a.model,
                                            "limit_gib": self.a.limit_gib}, min(120, self.until_deadline() - 10))
            if rep and rep.get("limit") and "gbps_best" in rep["limit"]:
                self.out["limits"].append(dict(rep["limit"], when="end"))
                self.log(f"pinned copy at the end: {rep['limit']['gbps_best']:.1f} GB/s")

    # -- report
    def pinned_rate(self):
        r = [lim["gbps_best"] for lim in self.out["limits"] if "gbps_best" in lim]
        return max(r) if r else None

    def summary(self):
        rate = self.pinned_rate()
        rows = []
        names = []
        for r in self.results:
            if r["config"] not in names:
                names.append(r["config"])
        ref = {}  # image_tokens -> (steady seconds [median over rounds], hashes of round 1)
        for r in self.results:
            if r["config"] == "resident" and r["ok"]:
                for run in r["runs"]:
                    e = ref.setdefault(run["image_tokens"], {"steady": [], "hashes": run["hashes"]})
                    if run.get("steady_seconds") is not None:
                        e["steady"].append(run["steady_seconds"])
        for name in names:
            rs = [r for r in self.results if r["config"] == name]
            ok = [r for r in rs if r["ok"]]
            base = {"config": name, "method": rs[0]["method"], "mode": rs[0].get("mode"),
                    "location": rs[0].get("location"), "runs": len(rs), "ok": len(ok),
                    "budget_bytes": rs[0].get("budget_bytes")}
            if not ok:
                errs = [r.get("error") for r in rs if r.get("error")]
                rows.append(dict(base, status=rs[0]["status"], error=errs[0] if errs else None))
                continue
            bfs = [r["buffer_fix"] for r in ok if r.get("buffer_fix")]
            if bfs:
                base["buffer_fix_applied"] = any(b.get("applied") for b in bfs)
            fst = [r["ferry_stats"] for r in ok if r.get("ferry_stats")]
            if fst:  # the pinned budget bounds what pinned_cache can keep
                base["ferry_pinned_budget"] = fst[-1].get("pinned_budget")
                base["ferry_pinned_cache_bytes"] = fst[-1].get("pinned_cache_bytes")
            pcs = [r["page_cache"] for r in ok if r.get("page_cache")]
            if pcs:
                base["page_cache_before"] = min((p.get("before") for p in pcs if p.get("before") is not None),
                                                default=None)
                base["page_cache_warmed"] = any(p.get("warm_seconds") is not None for p in pcs)
            toks = sorted({run["image_tokens"] for r in ok for run in r["runs"]}, reverse=True)
            for ntok in toks:
                runs = [run for r in ok for run in r["runs"] if run["image_tokens"] == ntok]
                steady = [x["steady_seconds"] for x in runs if x.get("steady_seconds") is not None]
                hb = [x["htod_bytes_steady"] for x in runs if x.get("htod_bytes_steady") is not None]
                rb = [x["read_bytes_steady"] for x in runs if x.get("read_bytes_steady") is not None]
                row = dict(base, status="ok", image_tokens=ntok, latent_shape=runs[0].get("latent_shape"),
                           first_seconds=statistics.median(x["first_seconds"] for x in runs),
                           steady_seconds=statistics.median(steady) if steady else None,
                           htod_bytes_per_step=statistics.median(hb) if hb else None,
                           read_bytes_per_step=statistics.median(rb) if rb else None,
                           peak_rss_bytes=max((r.get("peak_rss_bytes") or 0) for r in ok) or None,
                           uss_peak_bytes=max((r.get("uss_peak_bytes") or 0) for r in ok) or None,
                           device_used_peak_delta_bytes=max(max(x.get("device_used_peak_delta_bytes") or 0
                                                                for x in runs),
                                                            max(r.get("device_used_after_load_delta_bytes") or 0
                                                                for r in ok)) or None,
                           torch_max_allocated_bytes=max(max(x.get("torch_max_allocated_bytes") or 0
                                                             for x in runs),
                                                         max(r.get("torch_max_allocated_load_bytes") or 0
                                                             for r in ok)) or None,
                           load_seconds=statistics.median(r.get("load_seconds") or 0 for r in ok),
                           finite=all(x.get("finite", True) for x in runs))
                e = ref.get(ntok)
                if e and e["steady"]:
                    res = statistics.median(e["steady"])
                    row["resident_steady_seconds"] = res
                    if row["steady_seconds"]:
                        row["x_resident"] = row["steady_seconds"] / res
                    if rate and row["htod_bytes_per_step"] is not None:
                        bound = max(res, row["htod_bytes_per_step"] / (rate * GB))
                        row["bound_seconds"] = bound
                        if row["steady_seconds"]:
                            row["x_bound"] = row["steady_seconds"] / bound
                    own = []  # each process's steady step over the bound from its own copy rate
                    for r in ok:
                        g = (r.get("copy_limit") or {}).get("gbps_best")
                        for x in r["runs"]:
                            if g and x["image_tokens"] == ntok and x.get("steady_seconds") is not None \
                                    and x.get("htod_bytes_steady") is not None:
                                own.append(x["steady_seconds"] / max(res, x["htod_bytes_steady"] / (g * GB)))
                    if own and row["htod_bytes_per_step"]:
                        row["x_own_bound_runs"] = own
                        row["x_own_bound"] = statistics.median(own)
                if e:
                    n = min(len(e["hashes"]), *(len(x["hashes"]) for x in runs))
                    row["identical"] = all(x["hashes"][:n] == e["hashes"][:n] for x in runs) if n else None
                    row["identical_steps_compared"] = n
                fs = [x.get("ferry_stream_stats") for x in runs if x.get("ferry_stream_stats")]
                if fs:
                    row["ferry_stream_stats"] = fs[-1]
                rows.append(row)
        return {"pinned_htod_gbps": rate, "rows": rows}

    def table(self):
        s = self.summary()
        rate = s["pinned_htod_gbps"]

        def f(v, fmt, scale=1.0):
            return fmt % (v / scale) if isinstance(v, (int, float)) else "—"

        def own_txt(row):
            v = row.get("x_own_bound_runs")
            if not v:
                return "—"
            return f"{min(v):.2f}" if len(v) == 1 else f"{min(v):.2f}-{max(v):.2f}"

        lines = [f"pinned host→device copy limit (same run): {f(rate, '%.1f')} GB/s (× own bound: each "
                 f"process's bound from the copy rate it measured right after its steps; its range over runs)", "",
                 "| config | tokens | first step s | steady step s | × resident | H2D GB/step | "
                 "bound s | × bound | × own bound | GPU used Δ / torch max alloc GiB | peak RSS / USS GiB | "
                 "load s | identical | notes |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in s["rows"]:
            if row["status"] != "ok":
                why = (row.get("error") or row["status"])[:200].replace("|", "\\|")
                lines.append(f"| {row['config']} | — | — | — | — | — | — | — | — | — | — | — | — | "
                             f"{row['status']}: {why} |")
                continue
            notes = []
            if row.get("budget_bytes"):
                bb = row["budget_bytes"]
                notes.append(f"budget {bb / GB:.2f} GB" if bb >= 1e8 else f"budget {bb / 1e6:.2f} MB")
            fs = row.get("ferry_stream_stats") or {}
            if "resident_blocks" in fs and "streamed_blocks" in fs:
                notes.append(f"{fs['resident_blocks']} resident / {fs['streamed_blocks']} streamed blocks")
            if fs.get("error"):
                notes.append("stream_stats: " + str(fs["error"])[:80])
            if row.get("ferry_pinned_budget") is not None and row.get("ferry_pinned_cache_bytes") is not None:
                notes.append(f"pinned cache {size_txt(row['ferry_pinned_cache_bytes'])} of budget "
                             f"{size_txt(row['ferry_pinned_budget'])}")
            if row.get("read_bytes_per_step") is not None:
                notes.append(f"read {size_txt(row['read_bytes_per_step'])}/step from the file")
            if row.get("buffer_fix_applied"):
                notes.append("buffers moved by hand")
            if row.get("page_cache_before") is not None:
                notes.append(f"page cache {row['page_cache_before'] * 100:.0f} % before"
                             + (", read in first" if row.get("page_cache_warmed") else ""))
            if not row.get("finite"):
                notes.append("output not finite")
            if row["ok"] < row["runs"]:
                notes.append(f"{row['runs'] - row['ok']} of {row['runs']} runs failed")
            ident = row.get("identical")
            ls = row.get("latent_shape")
            tok = f"{row['image_tokens']}" + (f" ({'×'.join(str(v) for v in ls)})" if ls else "")
            lines.append(
                f"| {row['config']} | {tok} | {f(row['first_seconds'], '%.3f')} | "
                f"{f(row['steady_seconds'], '%.3f')} | {f(row.get('x_resident'), '%.2f')} | "
                f"{f(row['htod_bytes_per_step'], '%.2f', GB)} | {f(row.get('bound_seconds'), '%.3f')} | "
                f"{f(row.get('x_bound'), '%.2f')} | {own_txt(row)} | "
                f"{f(row['device_used_peak_delta_bytes'], '%.1f', GIB)} / "
                f"{f(row['torch_max_allocated_bytes'], '%.1f', GIB)} | {f(row['peak_rss_bytes'], '%.1f', GIB)} / "
                f"{f(row['uss_peak_bytes'], '%.1f', GIB)} | {f(row['load_seconds'], '%.1f')} | "
                f"{'—' if ident is None else ('yes' if ident else 'NO')} | {'; '.join(notes)} |")
        return "\n".join(lines)

    def report(self):
        self.out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()
        ck = self.out["meta"].get("checkpoint", {})
        print(flush=True)
        print(f"## Streaming {self.a.model}{' (tiny)' if self.a.tiny else ''}: {(ck.get('weight_bytes') or 0) / GB:.2f} "
              f"GB BF16, {self.a.steps} steps, {self.a.text_tokens} text tokens, {self.a.reps} round(s), "
              f"{self.elapsed():.0f} s, device {self.a.device}"
              + (" (SMOKE TEST: not a measurement)" if not self.a.device.startswith("cuda") else ""), flush=True)
        if self.out["meta"].get("nvidia_smi"):
            print(f"GPU: {self.out['meta']['nvidia_smi']}", flush=True)
        if len(self.locs) > 1:
            def one(lc):
                why = f", unavailable: {lc.get('why')}" if lc.get("state") == "unavailable" else ""
                return f"{lc['name']} = {lc.get('path')} ({lc.get('fs')}{why})"
            print("files: " + "; ".join(one(lc) for lc in self.locs), flush=True)
        if self.a.model == "wan":
            how = "off (--no-buffer-fix)" if self.a.no_buffer_fix else "on where Store.add left them off the device"
            print(f"the hand fix for the non-checkpoint buffers in ferry runs: {how}", flush=True)
        print(flush=True)
        print(self.table(), flush=True)
        if self.a.out:
            print(f"\nJSON: {self.a.out}", flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] in ("--child", "--make", "--probe"):
        spec = json.loads(sys.argv[2])
        {"--child": child_main, "--make": make_main, "--probe": probe_main}[sys.argv[1]](spec)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="flux")
    ap.add_argument("--tiny", action="store_true", help="a few-MB model (smoke tests)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or sim:SIZE (ferry's simulated GPU: smoke test)")
    ap.add_argument("--workdir", default=DEFAULT_WORKDIR,
                    help=f"where the checkpoint is made and kept (default {DEFAULT_WORKDIR}; "
                    f"{FALLBACK_WORKDIR} if that has too little room); not used with --file-locations")
    ap.add_argument("--file-locations", help="NAME:DIR,NAME:DIR: the checkpoint in each (made in one, copied "
                    "with cp to the others); every ferry config runs once per location (NAME@loc)")
    ap.add_argument("--remove-checkpoint", action="store_true", help="delete the checkpoint(s) at the end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-tokens", "--tokens", dest="image_tokens",
                    help="comma-separated token counts (default: flux/blocks 4096, wan 1170,14040); wan also "
                    "takes latents FxHxW")
    ap.add_argument("--text-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, help="steps per token count (default: wan 3, others 4)")
    ap.add_argument("--cpu-offload-steps", type=int, default=3,
                    help="cpu_offload runs min(--steps, this) steps (each is seconds long; default 3)")
    ap.add_argument("--reps", type=int, default=1, help="rounds; even rounds run the configs in reverse order")
    ap.add_argument("--budgets", help="ferry / comfy_aimdo device budgets, fractions of the weights' bytes (or "
                    "percentages; default: wan 0.5,0.25, others 1.0,0.5,0.25)")
    ap.add_argument("--ferry-modes", default="pinned,ring",
                    help="ferry's modes, comma-separated: pinned (Store.add(pinned_cache=True), ferry:P), ring "
                    "(pinned_cache=False, ferry:P:ring), default (pinned_cache not passed, ferry:P:default); "
                    "default pinned,ring")
    ap.add_argument("--no-buffer-fix", action="store_true",
                    help="never move the module's non-checkpoint buffers to the device by hand in ferry runs")
    ap.add_argument("--only", help="comma-separated configs, methods, modes, prefixes or @LOCATION "
                    "(resident always runs)")
    ap.add_argument("--skip", help="the same, to leave out")
    ap.add_argument("--ferry-lib", help="libferry.so to use (sets FERRY_LIBRARY for the children)")
    ap.add_argument("--profile-step", type=int, help="profile step K (0-based) of each run with torch.profiler "
                    "and report the GPU's copy/compute timeline (that step's time is perturbed)")
    ap.add_argument("--ferry-lib-b", help="a second libferry.so: its runs are the configs ferry_b:P, beside ferry:P")
    ap.add_argument("--ferry-python-b", help="the python/ folder (holding ferry/) the ferry_b:P runs import, when "
                    "the second build's binding differs too")
    ap.add_argument("--ferry-prefetch", type=int, help="Store.add(prefetch=N)")
    ap.add_argument("--ferry-reserve", help="Store.add(reserve=...)")
    ap.add_argument("--ferry-pinned-budget", help="Store(pinned_budget=...), e.g. 40GiB (default: the library's, a "
                    "quarter of the host's available RAM)")
    ap.add_argument("--mem-poll-ms", type=float, default=0,
                    help="also sample device memory from a thread every N ms (default 0: after each step only)")
    ap.add_argument("--limit-gib", type=float, default=1.0, help="size of the pinned copy (default 1 GiB)")
    ap.add_argument("--out", default="stream.json", help="JSON output (a .md table is written beside it)")
    ap.add_argument("--budget-seconds", type=float, default=470,
                    help="no child starts after this many seconds from the start (default 470)")
    ap.add_argument("--deadline-seconds", type=float,
                    help="no child (nor the copies) runs past this many seconds from the start: each one's "
                    "timeout is cut to it (default --budget-seconds + 60)")
    ap.add_argument("--run-timeout", type=float, default=200, help="seconds one child may take (default 200)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the children")
    a = ap.parse_args()
    wan = a.model == "wan"
    if a.steps is None:
        a.steps = 3 if wan else 4
    if a.budgets is None:
        a.budgets = "0.5,0.25" if wan else "1.0,0.5,0.25"
    if a.image_tokens is None:
        a.image_tokens = "1170,14040" if wan else "4096"
    if a.deadline_seconds is None:
        a.deadline_seconds = a.budget_seconds + 60
    if a.reps < 1 or a.steps < 1:
        ap.error("--reps and --steps must be at least 1")
    try:
        b = Bench(a)
        b.configs()
        cfg = model_config(a.model, a.tiny)
        b.image_tokens, b.latent_shapes = [], {}
        for v in (x.strip() for x in a.image_tokens.split(",") if x.strip()):
            if wan:
                n, shape = wan_latent_shape(v, cfg)
                if n in b.latent_shapes:
                    continue
                b.latent_shapes[n] = shape
            else:
                n = int(v)
            b.image_tokens.append(n)
    except ValueError as e:
        ap.error(str(e))
    b.log(f"stream.py: {a.model}{' tiny' if a.tiny else ''} on {a.device}, configs "
          f"{', '.join(c['name'] for c in b.configs())}, {a.steps} steps, {a.reps} round(s)")
    if wan:
        pt, ph, pw = cfg["patch_size"]
        b.log("tokens: " + "; ".join(f"{n} = latents F {f} x H {h} x W {w} -> {f // pt} x {h // ph} x {w // pw} "
                                     f"patches" for n, (f, h, w) in b.latent_shapes.items())
              + f"; {a.text_tokens} text tokens x {cfg['text_dim']}")
    else:
        b.log(f"image tokens {b.image_tokens}")
    b.out["tokens"] = {str(n): {"latents": list(s) if s else None}
                       for n, s in ((n, b.latent_shapes.get(n)) for n in b.image_tokens)}
    try:
        b.setup()
        b.run_all()
    except KeyboardInterrupt:
        b.out["interrupted"] = True
        b.log("interrupted: writing what was measured")
    except SystemExit as e:
        b.out["fatal"] = str(e.code)
        b.save()
        raise
    b.report()
    if a.remove_checkpoint:
        for lc in b.locs:
            try:
                os.unlink(lc["path"])
            except (OSError, KeyError):
                pass


if __name__ == "__main__":
    main()
