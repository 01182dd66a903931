# SPDX-License-Identifier: Apache-2.0
"""ferry - move model weights between disk, host RAM and GPU memory.

A thin ctypes binding of libferry (include/ferry.h): no logic the C API lacks.

    import ferry.torch
    sd = ferry.torch.load_file("model.safetensors")             # zero-copy, copy-on-write views
    sd = ferry.torch.load_file("model.safetensors", "cuda:0")   # pinned ring, many threads
    ferry.torch.load_model(module, "model.safetensors")         # fill an existing nn.Module

    import ferry.numpy
    arrays = ferry.numpy.load_file("model.safetensors")

    with ferry.File("model.gguf") as f:                         # tensor table and metadata
        print(f.format, f.metadata, f.tensors[0])

ferry.torch and ferry.numpy are imported on demand, so `import ferry` needs
neither torch nor numpy. See python/README.md.
"""
from . import _lib
from ._core import Device, File, TensorInfo, device, host_available, parse_size
from .errors import (BudgetError, BusyError, DeviceError, FerryError, FormatError, InternalError,
                     InvalidArgumentError, LimitError, NoDeviceError, NotFoundError, UnsupportedError)

__version__ = _lib.version_string
"""The version of the loaded libferry (ferry_version_string): the package is built with it."""

library_path = _lib.path
"""The libferry.so this binding loaded."""
library_version = _lib.version_string
"""Its version (ferry_version_string)."""

__all__ = [
    "File", "TensorInfo", "Device", "device", "host_available", "parse_size", "library_path", "library_version",
    "FerryError", "FormatError", "UnsupportedError", "LimitError", "InvalidArgumentError",
    "NotFoundError", "BudgetError", "NoDeviceError", "DeviceError", "InternalError", "BusyError",
]
