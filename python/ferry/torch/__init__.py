# SPDX-License-Identifier: Apache-2.0
"""ferry.torch - checkpoints to PyTorch tensors through libferry.

load_file(path, device="cpu", ...)   like safetensors.torch.load_file, for every format ferry reads
load_model(model, filename, ...)     like safetensors.torch.load_model: fill an nn.Module in place
Store(device, ...)                   the residency store, with nn.Modules that follow their weights
module_tensors(module)               a module's (key, owner, attribute, is parameter, tensor), as state_dict keys them
swap_parameter_data(old, new)        a Parameter holding new: old, its contents swapped, where torch can

Written against torch APIs present from 1.13 to 2.x (torch.frombuffer,
Tensor.as_strided, torch.utils.dlpack.from_dlpack, nn.Module.named_modules).

The code lives in private submodules, one per part: _tensors (the plumbing
they share: dtypes, views of ferry memory, empty tensors, stream syncs,
device arguments), _load (load_file), _dist (load_file with a
torch.distributed process_group), _load_into (load_model, and load_into, its
deprecated name), _match (pairing a module's tensors with a checkpoint's),
_store (Store with its forward hooks and holds, Job) with the bases of Store
in _store_views (views, re-pointing) and _store_tensors (calls on single
tensors), and _stream (Store.add(stream=...)).
"""
import torch  # noqa: F401  (ferry.torch needs torch; the ImportError comes from here)

from .._store import TensorState
from ._load import load_file
from ._load_into import IncompatibleKeys, load_into, load_model
from ._match import module_tensors, swap_parameter_data
from ._store import Job, Store
from ._tensors import DTYPES, dtype_for  # noqa: F401  (DTYPES: public, not in __all__)

__all__ = ["load_file", "load_model", "load_into", "IncompatibleKeys", "dtype_for", "Store", "Job",
           "TensorState", "module_tensors", "swap_parameter_data"]
