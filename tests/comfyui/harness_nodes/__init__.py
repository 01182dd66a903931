# SPDX-License-Identifier: Apache-2.0
"""Nodes the ComfyUI test harness adds to every run (tests/comfyui/harness.py
links this directory into the run's custom_nodes/ as ferry_harness_nodes).

FerryHarnessSaveTensor saves an IMAGE and/or a LATENT exactly as they are
(safetensors under output/ferry_harness/) and reports a digest of each, so
that two runs can be compared bit for bit: SaveImage's PNGs round to 8 bits
and carry the prompt in their metadata."""
import hashlib
import os


def tensor_digest(t):
    """sha256 over dtype, shape and the bytes of a CPU tensor."""
    import torch
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class FerryHarnessSaveTensor:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "out"})},
                "optional": {"image": ("IMAGE",), "latent": ("LATENT",)}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"
    CATEGORY = "testing/ferry"

    def save(self, name, image=None, latent=None):
        import folder_paths
        import safetensors.torch
        found = []
        if image is not None:
            found.append(("image", image))
        if latent is not None:
            found.append(("latent", latent["samples"]))
        out_dir = os.path.join(folder_paths.get_output_directory(), "ferry_harness")
        os.makedirs(out_dir, exist_ok=True)
        saved = []
        for kind, t in found:
            t = t.detach().to("cpu").contiguous()
            path = os.path.join(out_dir, f"{name}_{kind}.safetensors")
            safetensors.torch.save_file({kind: t}, path)
            saved.append({"name": name, "kind": kind, "file": path, "sha256": tensor_digest(t),
                          "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                          "finite": bool(t.float().isfinite().all()) if t.is_floating_point() else True})
        return {"ui": {"ferry_tensors": saved}}


NODE_CLASS_MAPPINGS = {"FerryHarnessSaveTensor": FerryHarnessSaveTensor}
NODE_DISPLAY_NAME_MAPPINGS = {"FerryHarnessSaveTensor": "Save tensor (ferry test harness)"}
