# SPDX-License-Identifier: MIT
"""reading - a checkpoint read with ferry into what ComfyUI's builders take: a
state dict of zero-copy CPU views of the file (copy-on-write: a write changes
this process's pages, never the file) and the file's metadata; or Fallback
saying why ComfyUI's own reader should do it. Importing it imports ferry:
an ImportError here means ferry (or its library) is missing."""
import os

import torch

import ferry
import ferry.torch

from . import gguf_quants

class Fallback(Exception):
    """ferry cannot serve this file: str(exception) is the reason, for the log."""


def _metadata(f):
    """What comfy.utils.load_torch_file returns as metadata: the safetensors
    header's __metadata__ strings (a sharded model's: its shards', merged, so
    that e.g. _quantization_metadata is seen), None for other formats."""
    fmt = f.format
    if fmt == "safetensors":
        return dict(f.metadata) or None
    if fmt == "gguf":  # its string values, in the role of safetensors' (e.g. ComfyUI's "config")
        return {k: v for k, v in f.typed_metadata.items() if isinstance(v, str)} or None
    if fmt == "safetensors-index":
        merged = {}
        for shard in f.shards:
            with ferry.File(shard) as s:
                merged.update(s.metadata)
        return merged or None
    return None


def _unwrap_pickle(path, sd):
    """The tensors ComfyUI takes from a PyTorch checkpoint: the "state_dict"
    entry of the pickled dict, or the one dict it holds, else all of it.
    ferry names tensors by their path through the pickled containers
    ("state_dict.model.diffusion_model.x"), which cannot tell a container
    from a key with dots in it; the containers themselves come from unpickling
    onto the meta device (weights_only, as ComfyUI loads; no tensor data is
    read)."""
    import torch
    top = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    if not isinstance(top, dict):
        raise Fallback(f"its pickle holds a {type(top).__name__}, not a dict of tensors")
    if "state_dict" in top:
        prefix = "state_dict."
    elif len(top) == 1 and isinstance(next(iter(top.values())), dict):
        prefix = next(iter(top)) + "."
    else:
        return sd
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _stand_in(shape):
    """A block-quantized tensor in the state dict ComfyUI detects the model
    from: its shape, an F16 dtype, no data (gguf_ops takes the bytes)."""
    return torch.empty(tuple(shape), dtype=torch.float16, device="meta")


ORIG_SHAPE = "comfy.gguf.orig_shape."


def _gguf_shapes(path, sd, quantized):
    """GGUF holds at most 4 dimensions, so diffusion-model converters (the
    ComfyUI-GGUF pack's) store some tensors reshaped (a Conv3d's 5-D weight
    flattened) with the real shape under "comfy.gguf.orig_shape.<name>":
    the tensors here get that shape back (a view: the data is row-major);
    for a block-quantized one (quantized: {name: [ggml type, shape]}) the
    shape it is dequantized to changes."""
    with ferry.File(path) as f:
        shapes = {k[len(ORIG_SHAPE):]: v for k, v in f.typed_metadata.items() if k.startswith(ORIG_SHAPE)}
    for name, shape in shapes.items():
        t = sd.get(name)
        if t is None:
            continue
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise Fallback(f"{ORIG_SHAPE}{name} is {shape!r}, not a shape")
        n = 1
        for d in shape:
            n *= d
        have = t.numel()
        if name in quantized:
            have = 1
            for d in quantized[name][1]:
                have *= d
        if n != have:
            raise Fallback(f"tensor '{name}' has {have} elements, its {ORIG_SHAPE}{name} {shape} wants {n}")
        if name in quantized:
            quantized[name][1] = tuple(shape)
        else:
            sd[name] = t.reshape(shape)
    return sd


def read(path):
    """(state dict, metadata, info) for path; info: {"format", "tensors",
    "bytes", "files" (the path, or an index's shards), "path", "by_ptr"
    ({data_ptr: (the checkpoint's name, shape, dtype)} of every view, as ferry
    names the file's tensors: what the residency pairs a module's tensors
    with), "quantized" ({id(stand-in): (bytes, ggml type, shape)} of GGUF
    block-quantized tensors, each a stand-in in the state dict: gguf_ops),
    "qtypes"}. Raises Fallback
    for what ComfyUI's core cannot use; ferry's own errors (FormatError,
    OSError, ...) pass through for the caller to log."""
    with ferry.File(path) as f:
        fmt = f.format
        infos = f.tensors
        blocks = sorted({t.dtype for t in infos if ferry.torch.dtype_for(t, path) is None})
        odd = [b for b in blocks if not gguf_quants.supported(b)]
        if odd:
            n = sum(1 for t in infos if t.dtype in odd)
            raise Fallback(f"{n} of {len(infos)} tensors are GGUF block-quantized as {', '.join(odd)}, which the "
                           f"pack does not dequantize (it does {', '.join(gguf_quants.SIZES)})")
        qtypes = {t.name: [t.dtype, tuple(t.shape)] for t in infos if t.dtype in blocks}
        metadata = _metadata(f)
        files = list(f.shards) if fmt == "safetensors-index" else [os.path.abspath(path)]
        total = f.total_bytes
    sd = ferry.torch.load_file(path)
    by_ptr = {t.data_ptr(): (name, tuple(t.shape), t.dtype) for name, t in sd.items() if t.numel()}
    if fmt == "pytorch":
        sd = _unwrap_pickle(path, sd)
    elif fmt == "gguf":
        sd = _gguf_shapes(path, sd, qtypes)
    quantized = {}  # id(stand-in) -> (the bytes, ggml type, shape): see gguf_ops
    for name, (qtype, shape) in qtypes.items():
        raw = sd[name]
        sd[name] = _stand_in(shape)
        quantized[id(sd[name])] = (raw, qtype, tuple(shape))
    if not sd:
        raise Fallback("ferry found no tensors in it")
    info = {"format": fmt, "tensors": len(sd), "bytes": total, "files": files, "path": os.path.abspath(path),
            "by_ptr": by_ptr, "quantized": quantized,
            "qtypes": sorted({q for q, _ in qtypes.values()})}
    return sd, metadata, info
