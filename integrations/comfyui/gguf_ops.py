# SPDX-License-Identifier: MIT
"""gguf_ops - ComfyUI operations for a diffusion model whose GGUF file holds
block-quantized weights (Q8_0, Q4_K, ...: gguf_quants.SIZES).

ComfyUI detects a model from its state dict's shapes and dtypes, builds it
with the operations its model options name, and loads the state dict into
it. For a GGUF file the loader hands ComfyUI a state dict in which each
block-quantized tensor is a stand-in of its real shape on the meta device
(nothing to read), and builds the model with Ops (ComfyUI's manual_cast
operations, which cast each weight to the input's dtype as a layer runs)
while `pending(quantized)` says which stand-in stands for which bytes. Ops'
Linear takes such a weight as the file's bytes (a uint8 view of the file, so
the model's size is the quantized size) and dequantizes it as it runs, on
the device it runs on. A weight patch (a LoRA) goes through ComfyUI's own
hooks for quantized layers: convert_weight dequantizes, set_weight keeps the
patched values beside the bytes for as long as those bytes are the weight."""
import contextlib
import threading

import torch

import comfy.ops

from . import gguf_quants

_tls = threading.local()


@contextlib.contextmanager
def pending(quantized):
    """quantized: {id(stand-in): (uint8 bytes, ggml type, shape)} for the
    builder call on this thread; afterwards, what no layer took is in
    quantized (the caller's error: a type of layer Ops does not cover)."""
    _tls.pending = quantized
    try:
        yield
    finally:
        _tls.pending = None


class Ops(comfy.ops.manual_cast):
    class Linear(comfy.ops.manual_cast.Linear):
        ferry_qtype = None

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                  unexpected_keys, error_msgs):
            table = getattr(_tls, "pending", None) or {}
            w = state_dict.get(prefix + "weight")
            q = table.pop(id(w), None) if w is not None else None
            if q is None:
                return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                     unexpected_keys, error_msgs)
            raw, qtype, shape = q
            self.weight = torch.nn.Parameter(raw, requires_grad=False)
            self.ferry_qtype, self.ferry_qshape = qtype, tuple(shape)
            self.ferry_patched = None
            b = state_dict.get(prefix + "bias")
            if b is not None:
                if id(b) in table:
                    error_msgs.append(f"{prefix}bias: a block-quantized bias")
                else:
                    self.bias = torch.nn.Parameter(b, requires_grad=False)
            elif getattr(self, "bias", None) is not None:
                missing_keys.append(prefix + "bias")  # (as load_state_dict reports it)
            for k in state_dict:
                if k.startswith(prefix) and k[len(prefix):] not in ("weight", "bias") and "." not in k[len(prefix):]:
                    unexpected_keys.append(k)

        # (keep_views: what it does not take itself, ComfyUI's manual_cast loading does)
        _load_from_state_dict.ferry_plain = True

        def ferry_weight(self, device, dtype):
            """The weight's values on device in dtype: the patched ones while a
            patch is set on these bytes, else the bytes dequantized."""
            p = self.ferry_patched
            if p is not None and p[0] is self.weight:
                return p[1].to(device=device, dtype=dtype)
            raw = self.weight.to(device, non_blocking=True)
            return gguf_quants.dequantize(raw, self.ferry_qtype, self.ferry_qshape, dtype)

        def forward(self, input, *args, **kwargs):
            if self.ferry_qtype is None:
                return super().forward(input, *args, **kwargs)
            w = self.ferry_weight(input.device, input.dtype)
            for f in self.weight_function:
                w = f(w)
            b = self.bias
            if b is not None:
                b = b.to(device=input.device, dtype=input.dtype)
                for f in self.bias_function:
                    b = f(b)
            return torch.nn.functional.linear(input, w, b)

        # ComfyUI's hooks for quantized weights (comfy.model_patcher.get_key_weight)

        def convert_weight(self, weight, inplace=False, **kwargs):
            """The values of weight, a float copy of this layer's bytes that
            ComfyUI made to patch (values 0-255, exactly)."""
            if self.ferry_qtype is None:
                return weight
            raw = weight.to(torch.uint8)
            return gguf_quants.dequantize(raw, self.ferry_qtype, self.ferry_qshape, weight.dtype)

        def set_weight(self, weight, inplace_update=False, seed=None, return_weight=False, **kwargs):
            """The patched values: kept beside the bytes (which stay the
            file's), or returned."""
            if return_weight:
                return weight
            self.ferry_patched = (self.weight, weight)
