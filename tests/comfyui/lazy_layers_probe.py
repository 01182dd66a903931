# SPDX-License-Identifier: Apache-2.0
"""Loading a BF16 file into a model ComfyUI builds in FP16, the way ComfyUI
does it when its dynamic VRAM is on in the process (comfy.ops layers made
without weights, "lazy init") but the model's patcher is not dynamic: what
the node pack does where ferry's store holds a model on a GPU. Runs on the
CPU with ComfyUI's aimdo switch turned on by hand.

    PYTHON lazy_layers_probe.py COMFYUI_DIR PACK_DIR OUT_DIR

Prints one JSON object: for ComfyUI's own loading ("stock") and for the
pack's keep_views with cast_at_use ("kept"), the weight's dtype, whether it
is the file's memory, whether the layer casts as it runs, and what a forward
on an FP16 input gave (the output's digest, or the error)."""
import hashlib
import importlib.util
import json
import os
import sys


def main():
    comfyui, pack, out = sys.argv[1:4]
    sys.path.insert(0, comfyui)
    import torch
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    import comfy.memory_management
    import comfy.ops
    import ferry.torch
    import safetensors.torch
    comfy.memory_management.aimdo_enabled = True  # as on a GPU with dynamic VRAM: layers made without weights
    spec = importlib.util.spec_from_file_location("keep_views", os.path.join(pack, "keep_views.py"))
    keep_views = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keep_views)

    g = torch.Generator().manual_seed(5)
    path = os.path.join(out, "lazy_bf16.safetensors")
    safetensors.torch.save_file({"lin.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
                                 "lin.bias": torch.randn(16, generator=g).to(torch.bfloat16)}, path)
    x = torch.randn(3, 8, generator=g).to(torch.float16)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = comfy.ops.disable_weight_init.Linear(8, 16, dtype=torch.float16)

        def forward(self, x):
            return self.lin(x)

    result = {}
    for name, cast in (("stock", None), ("kept", True)):
        sd = ferry.torch.load_file(path)
        base = {k: (v.data_ptr(), v.numel() * v.element_size()) for k, v in sd.items()}
        if cast is None:
            net = Net()
            net.load_state_dict(sd, strict=False)
        else:
            with keep_views.KeepViews(list(sd.values()), cast_at_use=True) as kv:
                net = Net()
                net.load_state_dict(sd, strict=False)
            result["kept_stats"] = kv.stats()
        w = net.lin.weight
        rec = {"dtype": str(w.dtype), "is_file_view": w.data_ptr() == base["lin.weight"][0],
               "casts_at_use": bool(getattr(net.lin, "comfy_cast_weights", False)),
               "built_dtypes": {k: str(v) for k, v in getattr(net.lin, "ferry_built_dtypes", {}).items()}}
        try:
            with torch.inference_mode():
                y = net(x)
            rec["out_dtype"] = str(y.dtype)
            rec["out"] = hashlib.sha256(y.float().numpy().tobytes()).hexdigest()
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        result[name] = rec
    # the reference: the layer as ComfyUI builds it without lazy init (FP16
    # weights converted from the file at load), on the same input
    sd = safetensors.torch.load_file(path)
    ref = torch.nn.functional.linear(x, sd["lin.weight"].to(torch.float16), sd["lin.bias"].to(torch.float16))
    result["converted_out"] = hashlib.sha256(ref.float().numpy().tobytes()).hexdigest()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
