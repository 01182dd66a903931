# SPDX-License-Identifier: Apache-2.0
"""API-format prompts for the tiny models of tests/data/comfy_models.py: the
smallest stock workflow of each architecture, text to image on the CPU.

Node ids name their role, so that a test can swap a loader for another
(the node pack's) and compare: "unet", "clip", "vae" (Wan, Flux), "ckpt"
(SDXL), "pos", "neg" (CLIPTextEncode, or ConditioningZeroOut of "pos"),
"latent", "sampler", "decode", "save" (SaveImage), "tensors"
(FerryHarnessSaveTensor: the sampled latent and the decoded image, bit for
bit), "guidance" (Flux), "lora" (LoraLoader, with_lora). Loader outputs are
referenced as [id, index]."""
import ast
import copy
import os

SIZE = 64       # pixels: an 8x8 latent
STEPS = 2
SEED = 42


def _tail(model, clip, vae, latent, positive="a tiny fox jumping over a fence",
          negative="blurry", cfg=2.0, sampler="euler", scheduler="simple", name="out"):
    """CLIPTextEncode -> KSampler -> VAEDecode -> SaveImage, and the raw
    tensors. negative=None: the positive conditioning zeroed (as Flux and Wan
    workflows often do; it saves the second pass of a T5, the slowest node
    on the CPU: UMT5 pads to 512 tokens)."""
    if negative is None:
        neg = {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["pos", 0]}}
    else:
        neg = {"class_type": "CLIPTextEncode", "inputs": {"text": negative, "clip": clip}}
    return {
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"text": positive, "clip": clip}},
        "neg": neg,
        "latent": latent,
        "sampler": {"class_type": "KSampler", "inputs": {
            "model": model, "seed": SEED, "steps": STEPS, "cfg": cfg, "sampler_name": sampler,
            "scheduler": scheduler, "positive": ["pos", 0], "negative": ["neg", 0],
            "latent_image": ["latent", 0], "denoise": 1.0}},
        "decode": {"class_type": "VAEDecode", "inputs": {"samples": ["sampler", 0], "vae": vae}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["decode", 0], "filename_prefix": name}},
        "tensors": {"class_type": "FerryHarnessSaveTensor", "inputs": {
            "name": name, "image": ["decode", 0], "latent": ["sampler", 0]}},
    }


def wan21_t2v(files):
    """UNETLoader + CLIPLoader(wan) + VAELoader, one frame of Wan 2.1 T2V."""
    p = {
        "unet": {"class_type": "UNETLoader", "inputs": {"unet_name": files["unet"], "weight_dtype": "default"}},
        "clip": {"class_type": "CLIPLoader", "inputs": {"clip_name": files["clip"], "type": "wan"}},
        "vae": {"class_type": "VAELoader", "inputs": {"vae_name": files["vae"]}},
    }
    p.update(_tail(["unet", 0], ["clip", 0], ["vae", 0],
                   {"class_type": "EmptyHunyuanLatentVideo",
                    "inputs": {"width": SIZE, "height": SIZE, "length": 1, "batch_size": 1}},
                   negative=None, name="wan"))
    return p


def flux_dev(files):
    """UNETLoader + DualCLIPLoader(flux) + VAELoader, FluxGuidance, cfg 1."""
    p = {
        "unet": {"class_type": "UNETLoader", "inputs": {"unet_name": files["unet"], "weight_dtype": "default"}},
        "clip": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": files["clip_l"], "clip_name2": files["t5"], "type": "flux"}},
        "vae": {"class_type": "VAELoader", "inputs": {"vae_name": files["vae"]}},
    }
    p.update(_tail(["unet", 0], ["clip", 0], ["vae", 0],
                   {"class_type": "EmptySD3LatentImage", "inputs": {"width": SIZE, "height": SIZE, "batch_size": 1}},
                   negative=None, cfg=1.0, name="flux"))
    p["guidance"] = {"class_type": "FluxGuidance", "inputs": {"conditioning": ["pos", 0], "guidance": 3.5}}
    p["sampler"]["inputs"]["positive"] = ["guidance", 0]
    return p


def sdxl(files):
    """CheckpointLoaderSimple: the UNet, CLIP-L/G and VAE of one file."""
    p = {"ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": files["ckpt"]}}}
    p.update(_tail(["ckpt", 0], ["ckpt", 1], ["ckpt", 2],
                   {"class_type": "EmptyLatentImage", "inputs": {"width": SIZE, "height": SIZE, "batch_size": 1}},
                   name="sdxl"))
    return p


def with_lora(prompt, lora_name, strength_model=1.0, strength_clip=1.0):
    """A copy of a prompt with a LoraLoader (id "lora") between its loaders
    and their users: the sampler takes the patched model, the text encoders
    the patched CLIP."""
    p = {k: {"class_type": v["class_type"], "inputs": dict(v["inputs"])} for k, v in prompt.items()}
    model, clip = p["sampler"]["inputs"]["model"], p["pos"]["inputs"]["clip"]
    p["lora"] = {"class_type": "LoraLoader", "inputs": {
        "model": model, "clip": clip, "lora_name": lora_name,
        "strength_model": strength_model, "strength_clip": strength_clip}}
    p["sampler"]["inputs"]["model"] = ["lora", 0]
    for k, node in p.items():
        if k != "lora" and node["inputs"].get("clip") == clip:
            node["inputs"]["clip"] = ["lora", 1]
    return p


def pack_nodes(pack_dir):
    """{stock class: the node pack's class standing for it}, from the pack's
    NODE_CLASS_MAPPINGS in loaders.py and each class's one stock base (read
    as source: importing it needs ComfyUI)."""
    with open(os.path.join(pack_dir, "loaders.py")) as f:
        tree = ast.parse(f.read())
    bases, mapping = {}, None
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases[node.name] = [b.attr for b in node.bases
                                if isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name)
                                and b.value.id == "nodes"]
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NODE_CLASS_MAPPINGS"
                                                  for t in node.targets):
            mapping = {k.value: v.id for k, v in zip(node.value.keys, node.value.values)}
    if not mapping:
        raise ValueError(f"no NODE_CLASS_MAPPINGS in {pack_dir}/loaders.py")
    out = {}
    for name, cls in mapping.items():
        if len(bases.get(cls, [])) != 1:
            raise ValueError(f"{name}: not a subclass of one stock node")
        out[bases[cls][0]] = name
    return out


def with_pack(prompt, mapping):
    """A copy of a prompt with every stock loader replaced by the pack's node
    (same id, same inputs); mapping: pack_nodes()'s."""
    p = copy.deepcopy(prompt)
    for node in p.values():
        node["class_type"] = mapping.get(node["class_type"], node["class_type"])
    return p


BUILDERS = {"wan": wan21_t2v, "flux": flux_dev, "sdxl": sdxl}
