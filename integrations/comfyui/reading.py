"""reading - a checkpoint read with ferry into what ComfyUI's builders take: a
state dict of zero-copy CPU views of the file (copy-on-write: a write changes
this process's pages, never the file) and the file's metadata; or Fallback
saying why ComfyUI's own reader should do it. Importing it imports ferry:
an ImportError here means ferry (or its library) is missing."""
import os

import ferry
import ferry.torch

class Fallback(Exception):
    """ferry cannot serve this file: str(exception) is the reason, for the log."""


def _metadata(f):
    """What comfy.utils.load_torch_file returns as metadata: the safetensors
    header's __metadata__ strings (a sharded model's: its shards', merged, so
    that e.g. _quantization_metadata is seen), None for other formats."""
    fmt = f.format
    if fmt == "safetensors":
        return dict(f.metadata) or None
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


ORIG_SHAPE = "comfy.gguf.orig_shape."


def _gguf_shapes(path, sd):
    """GGUF holds at most 4 dimensions, so diffusion-model converters (the
    ComfyUI-GGUF pack's) store some tensors reshaped (a Conv3d's 5-D weight
    flattened) with the real shape under "comfy.gguf.orig_shape.<name>":
    the tensors here get that shape back (a view: the data is row-major)."""
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
        if n != t.numel():
            raise Fallback(f"tensor '{name}' has {t.numel()} elements, its {ORIG_SHAPE}{name} {shape} wants {n}")
        sd[name] = t.reshape(shape)
    return sd


def read(path):
    """(state dict, metadata, info) for path; info: {"format", "tensors",
    "bytes", "files" (the path, or an index's shards), "path", "by_ptr"
    ({data_ptr: (the checkpoint's name, shape, dtype)} of every view, as ferry
    names the file's tensors: what the residency pairs a module's tensors
    with)}. Raises Fallback
    for what ComfyUI's core cannot use; ferry's own errors (FormatError,
    OSError, ...) pass through for the caller to log."""
    with ferry.File(path) as f:
        fmt = f.format
        infos = f.tensors
        blocks = sorted({t.dtype for t in infos if ferry.torch.dtype_for(t, path) is None})
        if blocks:
            n = sum(1 for t in infos if t.dtype in blocks)
            raise Fallback(f"{n} of {len(infos)} tensors are GGUF block-quantized ({', '.join(blocks)}), "
                           "which ComfyUI's core cannot compute with (the ComfyUI-GGUF pack's loaders can)")
        metadata = _metadata(f)
        files = list(f.shards) if fmt == "safetensors-index" else [os.path.abspath(path)]
        total = f.total_bytes
    sd = ferry.torch.load_file(path)
    by_ptr = {t.data_ptr(): (name, tuple(t.shape), t.dtype) for name, t in sd.items() if t.numel()}
    if fmt == "pytorch":
        sd = _unwrap_pickle(path, sd)
    elif fmt == "gguf":
        sd = _gguf_shapes(path, sd)
    if not sd:
        raise Fallback("ferry found no tensors in it")
    info = {"format": fmt, "tensors": len(sd), "bytes": total, "files": files, "path": os.path.abspath(path),
            "by_ptr": by_ptr}
    return sd, metadata, info
