# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._store_views - what a Store shows in the modules attached to
it: the record of an attached module (_Attached), its tensors outside the
checkpoint moving with the model, and the Store methods (_StoreViews) that
make zero-copy views of the store's memory and re-point the modules' tensors
at them as the store moves them.
"""
import ctypes

import torch

from .. import _dlpack, _lib
from ._match import _repoint, _same_param
from ._tensors import _empty, _shape_view

_HOME = torch.device("cpu")  # where a module's tensors outside the checkpoint wait off the device


def _moved(t, device):
    """t on device, as Module.to moves it: t itself where it is there already
    or is a meta tensor (no contents to copy); else _rehomed."""
    if t.is_meta or t.device == device:
        return t
    return _rehomed(t, t.detach().to(device))


def _rehomed(t, data):
    """data in t's place: a Parameter keeps its object (its data and gradient
    replaced) where torch allows, so that references to it stay valid. An
    inference tensor (made under torch.inference_mode, as ComfyUI builds
    its models) is swapped whole, never given new .data: set_data keeps the
    old version counter, which an inference tensor lacks, and the first view
    of the result fails ("Inference tensors do not track version counter")."""
    if not isinstance(t, torch.nn.Parameter):
        return data
    grad = t.grad
    compatible = getattr(torch, "_has_compatible_shallow_copy_type", None)
    if compatible is not None and not t.is_inference() and compatible(t, data):
        t.data = data
        p = t
    else:
        p = _same_param(t, data, t.requires_grad)
    if grad is not None:
        p.grad = grad.to(data.device)
    return p


@torch.inference_mode(False)
def _move_extras(extras, device):
    """Move every tensor of extras (_module_extras' lists) to device and put
    it back under each of its names. Out of inference mode even inside a
    forward under it: the copies outlive that forward, and an inference
    tensor could not take part in autograd later."""
    for owners in extras:
        done = {}  # id(tensor) -> its moved self (names the caller re-assigned may differ)
        for m, attr, is_param in owners:
            table = m._parameters if is_param else m._buffers
            t = table.get(attr)
            if t is None:
                continue
            new = done.get(id(t))
            if new is None:
                new = done[id(t)] = _moved(t, device)
            if new is not t:
                table[attr] = new


class _Attached:
    """A module attached to a model of a Store: which tensor of the model each
    of its parameters and buffers shows, and what it shows now; and the
    module's tensors that the checkpoint lacks, which move with the model
    instead of being placed by the store."""

    def __init__(self, module, plan, extras):
        self.module = module
        self.plan = plan  # [(model index, TensorInfo, torch dtype, module entries)]
        self.extras = extras  # _module_extras(module, plan)
        self.extras_dev = None  # the torch device extras are on (None: as the caller left them)
        self.shown = {}   # model index -> (tier, dptr) the module's tensor is a view of
        self.hooks = []
        self.hook_holds = 0  # holds the forward hooks keep now
        self.streamer = None  # a _stream.Streamer when added with stream=
        self.own = False  # Store._own's answer, once asked


class _StoreViews:
    """Store's views of its memory and the re-pointing of attached modules
    (a base of Store; self is the Store)."""

    def _sync(self):
        """Wait for every kernel queued on the store's GPU: tensors about to
        move (or device blocks about to be reused) may still be in use."""
        if self._tdev.type == "cuda":
            torch.cuda.synchronize(self._tdev)

    def _view(self, core, dptr, info, dt):
        """A zero-copy tensor over device memory the store owns (its blocks
        are freed by the store, never by the view; the view keeps the store)."""
        if not info.nbytes:
            return _empty(info, dt, self._tdev)
        raw = self._raw(core, dptr, info.nbytes)
        return _shape_view(raw if dt is None else raw.view(dt), info, dt, 0)

    def _raw(self, core, dptr, n):
        """n bytes the store owns at dptr as a 1-D uint8 tensor that keeps core."""
        if self._dl is None:  # sim / cpu: host memory
            buf = (ctypes.c_ubyte * n).from_address(dptr)
            buf._ferry_owner = core
            return torch.frombuffer(buf, dtype=torch.uint8)
        return torch.utils.dlpack.from_dlpack(_dlpack.capsule(dptr, n, self._dl[0], self._dl[1], core))

    def _seg_view(self, core, base, size, dptr, info, dt):
        """_view's tensor as a view of a 1-D view of the whole device block
        [base, base + size) that holds it, made once per block and dtype:
        one as_strided instead of a DLPack capsule per tensor (a streamed
        block's tensors land at new addresses every pass)."""
        if not info.nbytes:
            return _empty(info, dt, self._tdev)
        seg = self._segs.get((base, size))
        if seg is None:
            if len(self._segs) > 1024:
                self._segs.clear()  # blocks the store gave back long ago
            seg = self._segs[(base, size)] = {None: self._raw(core, base, size)}
        typed = seg.get(dt)
        if typed is None:
            typed = seg[dt] = seg[None].view(dt)
        return _shape_view(typed, info, dt, dptr - base)

    @staticmethod
    def _placeholder(info, dt):
        return torch.empty(info.shape if dt is not None else (info.nbytes,), dtype=dt or torch.uint8,
                           device="meta")

    def _all_on_device(self, m, idx=None):
        st = self._states.get(m.name)
        if st is None:
            return False
        ids = range(len(st)) if idx is None else idx
        return all(st[i][0] == _lib.TIER_DEVICE for i in ids)

    @torch.inference_mode(False)
    def _refresh(self, names=None, idxs=None):
        """Read every tensor's tier and address (idxs: of those tensors only)
        and re-point what changed in the attached modules. Out of inference
        mode even when called inside it (a forward pre-hook under
        torch.inference_mode): the views and Parameters made here outlive
        that block, and an inference tensor cannot be swapped or wrapped
        again later."""
        core = self._core
        raw = _lib.TensorState()
        for name, m in list(core.models.items()):
            if names is not None and name not in names:
                continue
            st = self._states.get(name)
            if idxs is None or st is None:
                st = [(s.tier, s.dptr) for s in (core.raw_state(m, i, raw) for i in range(len(m)))]
            else:
                for i in idxs:
                    s = core.raw_state(m, i, raw)
                    st[i] = (s.tier, s.dptr)
            self._states[name] = st
            a = self._attached.get(name)
            if a is None:
                continue
            want = None if idxs is None else set(idxs)
            for idx, info, dt, entries in a.plan:
                if want is not None and idx not in want:
                    continue
                now = st[idx] if st[idx][0] == _lib.TIER_DEVICE else (st[idx][0], 0)
                if a.streamer is not None and st[idx][1]:
                    # a queued move's block (its block's forward may be running:
                    # the stream that reads it was ordered after the move)
                    now = (_lib.TIER_DEVICE, st[idx][1])
                if a.shown.get(idx) == now:
                    continue
                if now[0] == _lib.TIER_DEVICE:
                    new = self._view(core, now[1], info, dt)
                else:
                    new = self._placeholder(info, dt)
                _repoint(entries, new, keep=a.streamer is None)
                a.shown[idx] = now
            if (a.extras_dev not in (None, _HOME) and st and a.hook_holds == 0
                    and not getattr(a.streamer, "in_step", False)
                    and not any(tier == _lib.TIER_DEVICE or dptr for tier, dptr in st)):
                self._extras_to(name, _HOME)  # the model left the device: they go with it

    def _extras_to(self, name, device=None):
        """Move the tensors of model name's attached module that are not in
        its checkpoint (non-persistent buffers such as rotary tables, and
        parameters and buffers that strict=False left out) to device: None
        for the store's own (where the model's views are), "cpu" to send them
        back. The store calls it as the model comes to the device (forward
        pre-hook, use(), to_device(name); a streamed model's step start) and
        once it has left (offload, eviction, remove, close: _refresh sees no
        tensor of the model on the device, outside a forward). A no-op when
        they are there already (one comparison), without a module or such
        tensors; meta tensors stay as they are. The store does not budget
        these bytes."""
        dev = self._extras_dev if device is None else torch.device(device)
        with self._lock:
            a = self._attached.get(name)
            if a is None or not a.extras or a.extras_dev == dev:
                return
            a.extras_dev = None  # (until every one has moved)
            _move_extras(a.extras, dev)
            a.extras_dev = dev
