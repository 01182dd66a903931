# SPDX-License-Identifier: MIT
"""comfy_env - ComfyUI in this process, headless, for the pack's scripts: what
main.py does at start-up (flags, folders, the pack loaded as a custom node)
and what its prompt worker does per prompt, without the server; and tiny
models with the real key names that ComfyUI recognises.

ComfyUI is found at $COMFYUI_DIR, else ../shared/comfyui beside the
repository root. Import this module before anything of ComfyUI's."""
import asyncio
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACK = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PACK))


def comfyui_dir():
    d = os.environ.get("COMFYUI_DIR") or os.path.join(REPO, "..", "shared", "comfyui")
    d = os.path.abspath(d)
    if not os.path.isfile(os.path.join(d, "comfy", "sd.py")):
        raise SystemExit(f"no ComfyUI at {d}: set COMFYUI_DIR")
    return d


MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "checkpoints", "embeddings", "loras")


def start(base=None, flags=("--cpu",), load_pack=True):
    """ComfyUI set up in this process with base as its --base-directory (a
    new temporary folder by default), the pack linked into its custom_nodes
    and loaded as ComfyUI loads one. Returns (base, the pack's module)."""
    base = base or tempfile.mkdtemp(prefix="ferry-comfyui-")
    for sub in MODEL_FOLDERS:
        os.makedirs(os.path.join(base, "models", sub), exist_ok=True)
    os.makedirs(os.path.join(base, "custom_nodes"), exist_ok=True)
    link = os.path.join(base, "custom_nodes", "comfyui-ferry")
    if not os.path.lexists(link):
        os.symlink(PACK, link)
    root = comfyui_dir()
    if root not in sys.path:
        sys.path.insert(0, root)
    sys.argv = ["main.py", "--base-directory", base, *flags]
    import comfy.options
    comfy.options.enable_args_parsing()
    import logging
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    import nodes
    pack = None
    if load_pack:
        ok = asyncio.run(nodes.load_custom_node(link))
        if not ok:
            raise SystemExit("ComfyUI could not load the pack (see the log above)")
        pack = sys.modules[link.replace(".", "_x_")]
    return base, pack


class _Server:
    """What PromptExecutor asks of ComfyUI's server: nowhere to send to."""
    client_id = None
    last_node_id = None
    sockets_metadata = {}

    def send_sync(self, *a, **k):
        pass

    def queue_updated(self, *a, **k):
        pass


_executor = None


def run_prompt(prompt, prompt_id):
    """Validate and execute one API-format prompt as ComfyUI's prompt worker
    does; raises with ComfyUI's messages when it fails."""
    global _executor
    import execution
    if _executor is None:
        _executor = execution.PromptExecutor(_Server(), cache_type=execution.CacheType.CLASSIC,
                                             cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
    valid = asyncio.run(execution.validate_prompt(prompt_id, prompt, None))
    if not valid[0]:
        raise RuntimeError(f"invalid prompt: {valid[1]} {valid[3]}")
    _executor.execute(prompt, prompt_id, {}, valid[2])
    if not _executor.success:
        msgs = [m for m in _executor.status_messages if m[0] == "execution_error"]
        raise RuntimeError(f"prompt {prompt_id} failed: {msgs}")


# --- tiny models with real key names ------------------------------------------------

def _random_like(sd, dtype, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in sd.items():
        dt = dtype if t.dtype.is_floating_point else t.dtype
        out[k] = (torch.randn(t.shape, generator=g) * 0.02).to(dt)
    return out


def wan21_dit(dim=256, ffn_dim=1024, num_layers=2, dtype=None, seed=0):
    """A Wan 2.1 T2V diffusion model state dict of ComfyUI's key names, with
    dim/ffn_dim/num_layers of choice (ComfyUI reads them from the shapes)."""
    import torch
    import comfy.ops
    from comfy.ldm.wan.model import WanModel
    with torch.device("meta"):
        m = WanModel(model_type="t2v", dim=dim, ffn_dim=ffn_dim, num_heads=dim // 128, num_layers=num_layers,
                     operations=comfy.ops.disable_weight_init)
    return _random_like(m.state_dict(), dtype or torch.float32, seed)


def wan21_vae(dim=16, dtype=None, seed=1):
    """A Wan 2.1 VAE state dict (ComfyUI reads dim from decoder.head.0.gamma)."""
    import torch
    from comfy.ldm.wan.vae import WanVAE
    with torch.device("meta"):
        m = WanVAE(dim=dim, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                   temperal_downsample=[False, True, True])
    return _random_like(m.state_dict(), dtype or torch.float32, seed)


def clip_l(dtype=None, seed=2):
    """An SD1 CLIP-L text encoder state dict (its config is ComfyUI's fixed
    one: 123 M parameters)."""
    import json
    import torch
    import comfy.ops
    from comfy.clip_model import CLIPTextModel
    with open(os.path.join(comfyui_dir(), "comfy", "sd1_clip_config.json")) as f:
        config = json.load(f)
    with torch.device("meta"):
        m = CLIPTextModel(config, torch.float16, None, comfy.ops.disable_weight_init)
    sd = _random_like(m.state_dict(), dtype or torch.float16, seed)
    sd["text_model.embeddings.position_ids"] = torch.arange(77).unsqueeze(0)
    return sd


def save(sd, path, metadata=None):
    import safetensors.torch
    safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, path, metadata=metadata)
    return path
