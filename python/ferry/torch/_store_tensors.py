# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._store_tensors - a Store's tensors one by one: a tensor named
by its name, its index or the tensor itself, and the calls on single tensors
(mark_dirty, tensor_state, tensor_states, read, write), in _StoreTensors, a
base of Store.
"""
import ctypes

import torch

from .. import _lib, errors
from ._tensors import _empty, _shape_view, dtype_for


class _StoreTensors:
    """Store's calls on single tensors (a base of Store; self is the Store)."""

    def _tensor_index(self, m, key):
        """Model index of a tensor given by name, index, or (for an attached
        module) the tensor itself or a view of its device memory."""
        if isinstance(key, bool):
            raise TypeError("a tensor is named by its name, its index or the tensor itself")
        if isinstance(key, int):
            if not 0 <= key < len(m):
                raise IndexError(f"model \"{m.name}\": tensor index {key} out of range (0..{len(m) - 1})")
            return key
        if isinstance(key, str):
            i = m.find(key)
            if i is None:
                raise errors.NotFoundError(_lib.E_NOTFOUND, f"model \"{m.name}\": no tensor called '{key}'",
                                           m.filename())
            return i
        if isinstance(key, torch.Tensor):
            a = self._attached.get(m.name)
            if a is not None:
                for idx, info, dt, entries in a.plan:
                    if any(key is getattr(mod, attr, None) for _, mod, attr, _, _ in entries):
                        return idx
            if not key.is_meta and key.device.type == self._tdev.type:
                p = key.data_ptr()
                for idx, (tier, dptr) in enumerate(self._states.get(m.name, ())):
                    if tier == _lib.TIER_DEVICE and dptr and dptr <= p < dptr + m.infos[idx].nbytes:
                        return idx
            raise errors.NotFoundError(_lib.E_NOTFOUND, f"model \"{m.name}\": the {tuple(key.shape)} "
                                       f"{key.dtype} tensor given is none of its tensors on the device",
                                       m.filename())
        raise TypeError(f"a tensor is named by its name, its index or the tensor itself, not "
                        f"{type(key).__name__}")

    def _indices(self, m, tensors):
        if tensors is None:
            return None
        if isinstance(tensors, (str, int, torch.Tensor)):
            tensors = [tensors]
        return [self._tensor_index(m, t) for t in tensors]

    def mark_dirty(self, name, tensor):
        """The caller changed tensors of a model in place on the device (names,
        indices or the tensors themselves, e.g. module.blk.weight): they are
        saved, not dropped, when they leave, and come back with the change."""
        with self._lock:
            m = self._model(name)
            for i in self._indices(m, tensor):
                self._core.mark_dirty(m, i)

    def tensor_state(self, name, tensor):
        """TensorState(name, nbytes, tier, dirty, holds, group, dptr) of one
        tensor (by name, index or the tensor itself)."""
        with self._lock:
            m = self._model(name)
            return self._core.state(m, self._tensor_index(m, tensor))

    def tensor_states(self, name):
        """{tensor name: TensorState} of every tensor of a model."""
        with self._lock:
            m = self._model(name)
            out = {}
            for i in range(len(m)):
                s = self._core.state(m, i)
                out.setdefault(s.name, s)
            return out

    def read(self, name, tensor):
        """A cpu copy of a tensor's current bytes, from whichever tier holds
        them (ferry_model_read)."""
        with self._lock:
            m = self._model(name)
            i = self._tensor_index(m, tensor)
            info = m.infos[i]
            dt = dtype_for(info, m.filename())
            raw = torch.empty(info.nbytes, dtype=torch.uint8)
            if info.nbytes:
                self._sync()
                self._core.read(m, i, raw.data_ptr())
            base = raw if dt is None or not info.nbytes else raw.view(dt)
            return _shape_view(base, info, dt, 0) if info.nbytes else _empty(info, dt, "cpu")

    def write(self, name, tensor, value):
        """Overwrite a tensor on the device with value's bytes (same dtype and
        number of bytes) and mark it dirty (ferry_model_write)."""
        with self._lock:
            m = self._model(name)
            i = self._tensor_index(m, tensor)
            info = m.infos[i]
            src = value.detach().to("cpu").contiguous()
            if src.numel() * src.element_size() != info.nbytes:
                raise ValueError(f"model \"{name}\": {info.name} has {info.nbytes} bytes, the value "
                                 f"{src.numel() * src.element_size()}")
            self._sync()
            dummy = ctypes.c_char()  # ferry_model_write wants a buffer even for 0 bytes
            self._core.write(m, i, src.data_ptr() if info.nbytes else ctypes.addressof(dummy))
