# SPDX-License-Identifier: Apache-2.0
"""ferry.torch - checkpoints to PyTorch tensors through libferry.

load_file(path, device="cpu", ...)   like safetensors.torch.load_file, for every format ferry reads
load_into(module, path, ...)         fill an nn.Module's parameters and buffers in place
Store(device, ...)                   the residency store, with nn.Modules that follow their weights

Written against torch APIs present from 1.13 to 2.x (torch.frombuffer,
Tensor.as_strided, torch.utils.dlpack.from_dlpack, nn.Module.named_modules).

The code lives in private modules, one per part: _torch_load (load_file,
dtypes, views of ferry memory, device arguments), _torch_dist
(load_file with a torch.distributed process_group), _torch_load_into
(load_into), _torch_match (pairing a module's tensors with a checkpoint's),
_torch_store (Store, Job).
"""
import torch  # noqa: F401  (ferry.torch needs torch; the ImportError comes from here)

from ._store import TensorState
from ._torch_load import DTYPES, dtype_for, load_file  # noqa: F401  (DTYPES: public, not in __all__)
from ._torch_load_into import IncompatibleKeys, load_into
from ._torch_store import Job, Store

__all__ = ["load_file", "load_into", "IncompatibleKeys", "dtype_for", "Store", "Job", "TensorState"]
