# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._tensors - the tensor plumbing every part of ferry.torch
shares: ferry dtypes as torch dtypes, zero-copy views of ferry memory (a
file's mapping, a load's blocks), empty tensors for ferry to fill, waiting
for a device's current stream, and reading a device argument. Imports no
other module of ferry.torch, so the modules that use it (_load, _dist,
_store, ...) never import each other for it.
"""
import torch

from .. import _core

# ferry dtype name -> torch dtype attribute, taken where this torch has it
_DTYPE_ATTRS = [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("I32", "int32"),
    ("I64", "int64"), ("F16", "float16"), ("BF16", "bfloat16"), ("F32", "float32"),
    ("F64", "float64"), ("C64", "complex64"), ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("F8_E8M0", "float8_e8m0fnu"),
]
DTYPES = {name: getattr(torch, attr) for name, attr in _DTYPE_ATTRS if hasattr(torch, attr)}
"""ferry dtype name -> torch.dtype, for the dtypes this torch has."""


def dtype_for(info, path=None):
    """The torch dtype of a ferry TensorInfo; None for ggml's block-quantized
    types (GGUF Q4_K, ...), which load as raw uint8 tensors of shape [nbytes].
    Raises UnsupportedError naming the tensor for dtypes this torch lacks
    (F4, F6_*, and FP8 / U16-U64 before the torch versions that added them)."""
    return _core.framework_dtype(DTYPES, info, path, f"torch dtype in torch {torch.__version__}")


_ELEMENT_SIZE = {}


def _element_size(dt):
    n = _ELEMENT_SIZE.get(dt)
    if n is None:
        n = _ELEMENT_SIZE[dt] = torch.empty((), dtype=dt).element_size()
    return n


def _frombuffer(buf, dt):
    try:
        return torch.frombuffer(buf, dtype=dt)
    except (TypeError, RuntimeError, ValueError):
        return torch.frombuffer(buf, dtype=torch.uint8).view(dt)


def _shape_view(base, info, dt, byte_offset):
    """info's tensor as a view of the 1-D base that starts byte_offset before it."""
    if dt is None:  # raw bytes of a block-quantized tensor
        return base[byte_offset:byte_offset + info.nbytes]
    es = _element_size(dt)
    if info.strides is None and byte_offset == 0 and base.numel() * es == info.nbytes:
        return base.view(info.shape)
    strides = info.strides if info.strides is not None else _core.contiguous_strides(info.shape)
    return base.as_strided(info.shape, strides, byte_offset // es)


def _empty(info, dt, device):
    return torch.empty(info.shape if dt is not None else (0,), dtype=dt or torch.uint8, device=device)


def _cuda_index(dev):
    if dev.index is not None:
        return dev.index
    if torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0  # ferry's device open then says why there is no GPU


def _sync(dev):
    """Wait for work queued on dev's current stream: memory the caching
    allocator just handed out (or parameters about to be overwritten) may
    still be used by kernels queued there, and ferry copies on its own streams."""
    if torch.cuda.is_available():
        torch.cuda.current_stream(dev).synchronize()


def _by_name(tensors):
    return {k: tensors[k] for k in sorted(tensors)}


def _torch_device(device, who):
    """device (an int N: cuda:N; a str; a torch.device) as a torch.device;
    ValueError naming who for a bad string, TypeError for anything else."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{who}: bad device {device!r}: {e}") from None
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a str, int or torch.device, not {type(device).__name__}")
    return device
