# SPDX-License-Identifier: MIT
"""smoke - the pack's loader nodes against ComfyUI's own, in one process on the
CPU: tiny models with real key names (Wan 2.1 DiT and VAE, SD1 CLIP-L) in
every format ferry reads, each loaded by the stock node and by the ferry node;
the two models' state dicts must be equal bit for bit, and so must a forward
pass of each. Also: what falls back (GGUF block-quantized tensors, ferry
missing, the pack disabled) and the per-prompt memory line of a prompt run
through ComfyUI's executor.

    FERRY_LIBRARY=build/libferry.so PYTHONPATH=python \\
        python integrations/comfyui/tests/smoke.py [--keep]

ComfyUI: $COMFYUI_DIR, else ../shared/comfyui beside the repository. Needs
torch >= 2.1 and ComfyUI's Python requirements. Ends with "N passed, M failed"."""
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import comfy_env  # noqa: E402  (sets ComfyUI's flags before ComfyUI is imported)

ARGS = sys.argv[1:]  # before comfy_env.start gives ComfyUI its own
KEEP = "--keep" in ARGS
STATS = os.path.join(tempfile.mkdtemp(prefix="ferry-smoke-stats-"), "stats.jsonl")
os.environ["FERRY_COMFYUI_STATS"] = STATS  # read when the pack is imported

BASE, PACK = comfy_env.start()

import torch  # noqa: E402
import nodes  # noqa: E402

M = os.path.join(BASE, "models")
LOADERS = PACK.loaders
results = []


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def grab(self):
        out, self.lines = self.lines, []
        return out


LOG = LogCapture()
logging.getLogger().addHandler(LOG)


def check(name, fn):
    LOG.grab()
    try:
        fn()
        results.append((name, True, ""))
        print(f"PASS {name}", flush=True)
    except Exception as e:
        results.append((name, False, f"{type(e).__name__}: {e}"))
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()


def same_bits(a, b, what):
    ka, kb = set(a), set(b)
    assert ka == kb, f"{what}: keys differ: {sorted(ka ^ kb)[:5]}"
    for k in sorted(ka):
        x, y = a[k], b[k]
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: {k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        bx = x.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        by = y.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(bx, by), f"{what}: {k}: values differ"


def last_load():
    return LOADERS.memstats.tracker._loads[-1]


# --- the models -------------------------------------------------------------------

DIT = comfy_env.wan21_dit(dim=256, ffn_dim=1024, num_layers=2)
DIT_PATH = comfy_env.save(DIT, os.path.join(M, "diffusion_models", "wan_tiny.safetensors"))
VAE = comfy_env.wan21_vae(dim=16)
comfy_env.save(VAE, os.path.join(M, "vae", "wan_vae_tiny.safetensors"))
CLIP = comfy_env.clip_l()
comfy_env.save(CLIP, os.path.join(M, "text_encoders", "clip_l_random.safetensors"))


def dit_forward(patcher):
    dm = patcher.model.diffusion_model
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, 1, 8, 8, generator=g)
    ctx = torch.randn(1, 8, 4096, generator=g)
    with torch.inference_mode():
        return dm(x, torch.tensor([500.0]), ctx)


def unet_pair(name, weight_dtype="default"):
    stock = nodes.UNETLoader().load_unet(name, weight_dtype)[0]
    ferry = LOADERS.FerryUNETLoader().load_unet(name, weight_dtype)[0]
    return stock, ferry


def expect_ferry(min_kept=1):
    ev = last_load()
    assert ev["via"] == "ferry", f"loaded via {ev['via']}: {ev.get('reason')}"
    assert ev["kept_tensors"] >= min_kept, f"kept {ev['kept_tensors']} tensors as views, wanted >= {min_kept}"
    return ev


def t_unet_fp32():
    stock, ferry = unet_pair("wan_tiny.safetensors")
    ev = expect_ferry(min_kept=len(DIT))
    assert ev["copied_tensors"] == 0, ev
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")
    assert torch.equal(dit_forward(stock), dit_forward(ferry)), "forward differs"


def t_unet_bf16():
    comfy_env.save({k: v.to(torch.bfloat16) for k, v in DIT.items()},
                   os.path.join(M, "diffusion_models", "wan_tiny_bf16.safetensors"))
    stock, ferry = unet_pair("wan_tiny_bf16.safetensors")
    ev = last_load()
    assert ev["via"] == "ferry", ev
    dt = stock.model.diffusion_model.blocks[0].ffn[0].weight.dtype
    print(f"  bf16 file: ComfyUI's CPU model dtype {dt}; kept {ev['kept_tensors']}, copied {ev['copied_tensors']}")
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")
    assert torch.equal(dit_forward(stock), dit_forward(ferry)), "forward differs"


def t_unet_fp8_option():
    stock, ferry = unet_pair("wan_tiny.safetensors", "fp8_e4m3fn")
    ev = last_load()
    assert ev["via"] == "ferry", ev
    assert ev["copied_tensors"] > 0, ev  # cast to fp8 by ComfyUI: copies, as ComfyUI makes them
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def t_unet_index():
    d = os.path.join(M, "diffusion_models", "wan_sharded")
    os.makedirs(d, exist_ok=True)
    keys = sorted(DIT)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        comfy_env.save({k: DIT[k] for k in part}, os.path.join(d, shard))
        weight_map.update({k: shard for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.nbytes for v in DIT.values())}, "weight_map": weight_map}, f)
    name = "wan_sharded/model.safetensors.index.json"
    spec = LOADERS.FerryUNETLoader.INPUT_TYPES()["required"]["unet_name"][0]
    assert name in spec, "the index is not in the node's file list"
    assert name not in nodes.UNETLoader.INPUT_TYPES()["required"]["unet_name"][0]
    stock = nodes.UNETLoader().load_unet("wan_tiny.safetensors", "default")[0]
    ferry = LOADERS.FerryUNETLoader().load_unet(name, "default")[0]
    expect_ferry(min_kept=len(DIT))
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def t_unet_ckpt():
    torch.save({"state_dict": DIT, "epoch": 3}, os.path.join(M, "diffusion_models", "wan_tiny.ckpt"))
    stock, ferry = unet_pair("wan_tiny.ckpt")
    expect_ferry(min_kept=len(DIT))
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")
    # a flat dict whose keys share one first component is not a container to unwrap
    torch.save({"model.diffusion_model." + k: v for k, v in DIT.items()},
               os.path.join(M, "diffusion_models", "wan_tiny_prefixed.pt"))
    stock, ferry = unet_pair("wan_tiny_prefixed.pt")
    expect_ferry(min_kept=len(DIT))
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def _gguf_writer():
    sys.path.insert(0, os.path.join(comfy_env.REPO, "tests", "data"))
    import gguf_writer
    return gguf_writer


def _gguf_tensors(sd, quantize=()):
    """GGUF tensors and metadata as diffusion-model converters write them: a
    tensor of more than 4 dimensions flattened, its shape under
    comfy.gguf.orig_shape.<name>; the names in quantize as Q8_0 blocks."""
    gw = _gguf_writer()
    tensors, kvs = [], []
    for k, v in sorted(sd.items()):
        if k in quantize:
            n = v.numel() // 32  # Q8_0: a float16 scale and 32 int8 per block
            tensors.append((k, "Q8_0", list(v.shape), b"".join(struct.pack("<e", 0.01) + bytes(32) for _ in range(n))))
            continue
        shape = list(v.shape)
        if len(shape) > 4:
            kvs.append(("comfy.gguf.orig_shape." + k, gw.ARRAY, (gw.INT32, shape)))
            shape = [v.numel()]
        tensors.append((k, "F32", shape, v.contiguous().numpy().tobytes()))
    return tensors, kvs


def t_unet_gguf_float():
    gw = _gguf_writer()
    tensors, kvs = _gguf_tensors(DIT)
    gw.write(os.path.join(M, "diffusion_models", "wan_tiny_f32.gguf"), tensors, kvs)
    stock = nodes.UNETLoader().load_unet("wan_tiny.safetensors", "default")[0]
    ferry = LOADERS.FerryUNETLoader().load_unet("wan_tiny_f32.gguf", "default")[0]
    expect_ferry(min_kept=len(DIT))
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def t_unet_gguf_quantized_falls_back():
    gw = _gguf_writer()
    tensors, kvs = _gguf_tensors(DIT, quantize={"blocks.0.ffn.0.weight"})  # [1024, 256]: rows of 8 blocks
    gw.write(os.path.join(M, "diffusion_models", "wan_tiny_q8.gguf"), tensors, kvs)
    try:
        LOADERS.FerryUNETLoader().load_unet("wan_tiny_q8.gguf", "default")
    except RuntimeError as e:
        assert "GGUF" in str(e), e
    else:
        raise AssertionError("a block-quantized GGUF loaded without the ComfyUI-GGUF pack")
    lines = [l for l in LOG.grab() if l.startswith("ferry: ") and "wan_tiny_q8.gguf" in l]
    assert any("block-quantized (Q8_0)" in l and "ComfyUI's loader" in l for l in lines), lines
    ev = last_load()
    assert ev["via"] == "comfyui" and "Q8_0" in ev["reason"], ev


def t_unet_unreadable_falls_back():
    # a .pt that is no zip (the legacy format): ferry cannot read it, torch.load can
    torch.save(DIT, os.path.join(M, "diffusion_models", "wan_tiny_legacy.pt"), _use_new_zipfile_serialization=False)
    stock, ferry = unet_pair("wan_tiny_legacy.pt")
    ev = last_load()
    assert ev["via"] == "comfyui", ev
    print(f"  reason logged: {ev['reason']}")
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def t_ferry_missing_falls_back():
    saved = LOADERS._reading, LOADERS._import_error
    LOADERS._reading, LOADERS._import_error = None, "ImportError: No module named 'ferry' (simulated)"
    try:
        stock, ferry = unet_pair("wan_tiny.safetensors")
    finally:
        LOADERS._reading, LOADERS._import_error = saved
    ev = last_load()
    assert ev["via"] == "comfyui" and "not importable" in ev["reason"], ev
    same_bits(stock.model.state_dict(), ferry.model.state_dict(), "state dict")


def t_disabled_falls_back():
    s = LOADERS.settings
    s.disabled = True
    try:
        LOADERS.FerryUNETLoader().load_unet("wan_tiny.safetensors", "default")
    finally:
        s.disabled = False
    ev = last_load()
    assert ev["via"] == "comfyui" and s.DISABLE_ENV in ev["reason"], ev


def t_vae():
    stock = nodes.VAELoader().load_vae("wan_vae_tiny.safetensors")[0]
    ferry = LOADERS.FerryVAELoader().load_vae("wan_vae_tiny.safetensors")[0]
    expect_ferry(min_kept=len(VAE) // 2)
    same_bits(stock.first_stage_model.state_dict(), ferry.first_stage_model.state_dict(), "VAE state dict")
    lat = torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(stock.decode(lat), ferry.decode(lat)), "decode differs"


def t_clip():
    stock = nodes.CLIPLoader().load_clip("clip_l_random.safetensors", "stable_diffusion")[0]
    ferry = LOADERS.FerryCLIPLoader().load_clip("clip_l_random.safetensors", "stable_diffusion")[0]
    ev = expect_ferry(min_kept=100)
    print(f"  CLIP-L: kept {ev['kept_tensors']} ({ev['kept_bytes'] >> 20} MiB), copied {ev['copied_tensors']}")
    same_bits(stock.cond_stage_model.state_dict(), ferry.cond_stage_model.state_dict(), "CLIP state dict")
    a = stock.encode_from_tokens(stock.tokenize("a red fox"))
    b = ferry.encode_from_tokens(ferry.tokenize("a red fox"))
    assert torch.equal(a, b), "encoding differs"


def t_dual_clip():
    def both(node):
        try:
            out = node.load_clip("clip_l_random.safetensors", "clip_l_random.safetensors", "sd3")[0]
            return out, None
        except Exception as e:
            return None, f"{type(e).__name__}: {e}"
    stock, serr = both(nodes.DualCLIPLoader())
    ferry, ferr = both(LOADERS.FerryDualCLIPLoader())
    assert (serr is None) == (ferr is None), (serr, ferr)
    if serr is None:
        expect_ferry()
        same_bits(stock.cond_stage_model.state_dict(), ferry.cond_stage_model.state_dict(), "CLIP state dict")
    else:
        print(f"  both raise: {serr[:120]}")


def t_checkpoint():
    sd = {"model.diffusion_model." + k: v for k, v in DIT.items()}
    sd.update({"vae." + k: v for k, v in VAE.items()})
    comfy_env.save(sd, os.path.join(M, "checkpoints", "wan_tiny_all.safetensors"))
    s_model, s_clip, s_vae = nodes.CheckpointLoaderSimple().load_checkpoint("wan_tiny_all.safetensors")
    f_model, f_clip, f_vae = LOADERS.FerryCheckpointLoaderSimple().load_checkpoint("wan_tiny_all.safetensors")
    expect_ferry(min_kept=len(DIT))
    assert (s_clip is None) == (f_clip is None)
    same_bits(s_model.model.state_dict(), f_model.model.state_dict(), "model state dict")
    same_bits(s_vae.first_stage_model.state_dict(), f_vae.first_stage_model.state_dict(), "VAE state dict")
    assert torch.equal(dit_forward(s_model), dit_forward(f_model)), "forward differs"


class FerrySmokeSink:
    """An output node that keeps what it is given (the test's prompt ends here)."""
    got = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "clip": ("CLIP",), "vae": ("VAE",)}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, model, clip, vae):
        FerrySmokeSink.got = {"model": model, "clip": clip, "vae": vae}
        return {}


def t_prompt_memory_line():
    nodes.NODE_CLASS_MAPPINGS["FerrySmokeSink"] = FerrySmokeSink
    prompt = {
        "1": {"class_type": "FerryUNETLoader", "inputs": {"unet_name": "wan_tiny.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "FerryCLIPLoader", "inputs": {"clip_name": "clip_l_random.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "FerryVAELoader", "inputs": {"vae_name": "wan_vae_tiny.safetensors"}},
        "4": {"class_type": "FerrySmokeSink", "inputs": {"model": ["1", 0], "clip": ["2", 0], "vae": ["3", 0]}},
    }
    comfy_env.run_prompt(prompt, "smoke-1")
    lines = [l for l in LOG.grab() if l.startswith("ferry: prompt smoke-1:")]
    assert len(lines) == 1, lines
    print("  " + lines[0])
    with open(STATS) as f:
        recs = [json.loads(l) for l in f]
    rec = recs[-1]
    assert rec["prompt_id"] == "smoke-1" and rec["rss"]["peak"] >= rec["rss"]["end"] > 0, rec
    vias = sorted((e["node"], e["via"]) for e in rec["loads"])
    assert vias == [("CLIPLoader", "ferry"), ("UNETLoader", "ferry"), ("VAELoader", "ferry")], vias
    assert rec["ferry"]["mapped"] > 0, rec["ferry"]
    assert FerrySmokeSink.got["model"] is not None


class FerrySmokeCond:
    """Wan-shaped conditioning (text_dim 4096) without a 11 GB text encoder."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self):
        return ([[torch.randn(1, 8, 4096, generator=torch.Generator().manual_seed(11)), {}]],)


class FerrySmokeLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self):
        return ({"samples": torch.zeros(1, 16, 1, 8, 8)},)


class FerrySmokeLatentSink:
    got = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "tag": ("STRING", {"default": ""})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, samples, tag):
        FerrySmokeLatentSink.got[tag] = samples["samples"].clone()
        return {}


def _file_digest(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def t_sampling_with_lora():
    nodes.NODE_CLASS_MAPPINGS.update({"FerrySmokeCond": FerrySmokeCond, "FerrySmokeLatent": FerrySmokeLatent,
                                      "FerrySmokeLatentSink": FerrySmokeLatentSink})
    g = torch.Generator().manual_seed(3)
    lora = {}
    for k in ("blocks.0.self_attn.q", "blocks.1.ffn.0", "blocks.1.cross_attn.o"):
        w = DIT[k + ".weight"]
        lora[f"diffusion_model.{k}.lora_up.weight"] = torch.randn(w.shape[0], 4, generator=g) * 0.1
        lora[f"diffusion_model.{k}.lora_down.weight"] = torch.randn(4, w.shape[1], generator=g) * 0.1
    comfy_env.save(lora, os.path.join(M, "loras", "wan_tiny_lora.safetensors"))
    before = _file_digest(DIT_PATH)
    for tag, loader in (("stock", "UNETLoader"), ("ferry", "FerryUNETLoader")):
        prompt = {
            "1": {"class_type": loader, "inputs": {"unet_name": "wan_tiny.safetensors", "weight_dtype": "default"}},
            "2": {"class_type": "LoraLoaderModelOnly",
                  "inputs": {"model": ["1", 0], "lora_name": "wan_tiny_lora.safetensors", "strength_model": 0.8}},
            "3": {"class_type": "FerrySmokeCond", "inputs": {}},
            "4": {"class_type": "FerrySmokeLatent", "inputs": {}},
            "5": {"class_type": "KSampler", "inputs": {
                "model": ["2", 0], "seed": 1, "steps": 2, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
                "positive": ["3", 0], "negative": ["3", 0], "latent_image": ["4", 0], "denoise": 1.0}},
            "6": {"class_type": "FerrySmokeLatentSink", "inputs": {"samples": ["5", 0], "tag": tag}},
        }
        comfy_env.run_prompt(prompt, f"lora-{tag}")
    got = FerrySmokeLatentSink.got
    assert torch.isfinite(got["ferry"]).all()
    assert torch.equal(got["stock"], got["ferry"]), "sampled latents differ"
    assert _file_digest(DIT_PATH) == before, "the checkpoint file changed"
    # patched while loaded, the file's views again once unloaded
    import comfy.model_management as mm
    import comfy.sd
    base = LOADERS.FerryUNETLoader().load_unet("wan_tiny.safetensors", "default")[0]
    ptrs = {k: v.data_ptr() for k, v in base.model.diffusion_model.state_dict().items()}
    patched, _ = comfy.sd.load_lora_for_models(base, None, lora, 0.8, 0)
    mm.load_models_gpu([patched])
    q = "blocks.0.self_attn.q.weight"
    assert not torch.equal(base.model.diffusion_model.state_dict()[q], DIT[q]), "the LoRA was not applied"
    mm.unload_all_models()
    sd = base.model.diffusion_model.state_dict()
    same_bits(sd, DIT, "weights after the LoRA")
    assert all(sd[k].data_ptr() == ptrs[k] for k in sd), "weights are no longer the file's views"


CASES = [
    ("unet fp32 safetensors: views kept, same bits, same forward", t_unet_fp32),
    ("unet bf16 safetensors: same bits, same forward", t_unet_bf16),
    ("unet weight_dtype fp8_e4m3fn: ComfyUI's cast copies, same bits", t_unet_fp8_option),
    ("unet sharded .safetensors.index.json", t_unet_index),
    ("unet .ckpt / .pt (PyTorch zip)", t_unet_ckpt),
    ("unet GGUF F32", t_unet_gguf_float),
    ("unet GGUF Q8_0 falls back with its reason", t_unet_gguf_quantized_falls_back),
    ("unet legacy .pt falls back to ComfyUI's reader", t_unet_unreadable_falls_back),
    ("ferry missing: ComfyUI's loader", t_ferry_missing_falls_back),
    ("FERRY_COMFYUI_DISABLE: ComfyUI's loader", t_disabled_falls_back),
    ("vae Wan 2.1: same bits, same decode", t_vae),
    ("clip SD1 CLIP-L: same bits, same encoding", t_clip),
    ("dual clip: as the stock node", t_dual_clip),
    ("checkpoint (model + vae): same bits", t_checkpoint),
    ("a prompt through ComfyUI's executor: memory line and JSON", t_prompt_memory_line),
    ("KSampler with a LoRA: stock and ferry latents equal, the file untouched", t_sampling_with_lora),
]

if __name__ == "__main__":
    only = [a for a in ARGS if not a.startswith("--")]
    for name, fn in CASES:
        if not only or any(o in name for o in only):
            check(name, fn)
    if KEEP:
        print(f"kept: {BASE}, {STATS}")
    else:
        shutil.rmtree(BASE, ignore_errors=True)
        shutil.rmtree(os.path.dirname(STATS), ignore_errors=True)
    failed = [r for r in results if not r[1]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)
