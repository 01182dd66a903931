# SPDX-License-Identifier: MIT
"""keep_views - keep a state dict's tensors as the model's weights instead of
copies of them, while one of ComfyUI's builders runs.

Outside dynamic VRAM (on the CPU, with --highvram, --disable-dynamic-vram,
...) ComfyUI's builders create the model's modules with their own memory and
then call load_state_dict(sd, assign=False), which copies every tensor into
it: a private copy of the whole model, although the state dict handed in is
already a set of views of ferry's mapping. PyTorch lets each module decide for
itself: a load_state_dict pre-hook may set "assign_to_params_buffers" in the
module's local metadata (nn.Module._load_from_state_dict reads it after the
hooks ran). So, for the builder call only and on this thread only, every
module that registers a parameter or buffer gets such a hook (through
PyTorch's global registration hooks, torch >= 2.0), which keeps a tensor
where it has exactly what the copy would have produced: the module tensor's
dtype, shape and strides, on the CPU. Tensors that differ (a dtype ComfyUI
casts to, a GPU it loads straight onto) are copied exactly as
load_state_dict would copy them. No ComfyUI function is replaced; where the
hooks find nothing to do (another ComfyUI, a module with its own loading)
the builder copies as it always did."""
import threading
import weakref

import torch
import torch.nn.modules.module as _module

_NN_LOAD = torch.nn.Module._load_from_state_dict


def _plain_loading(module):
    """True where the module loads through nn.Module._load_from_state_dict
    with nothing of its own around it: PyTorch's modules, and comfy.ops'
    plain layers (whose override only changes things under dynamic VRAM,
    where ComfyUI assigns anyway), and the pack's own that defer to those for
    what they do not take themselves (marked ferry_plain). Modules with other
    loading code (ComfyUI's quantized layers, ...) are left to copy as they
    always did."""
    fn = type(module)._load_from_state_dict
    if fn is _NN_LOAD or getattr(fn, "ferry_plain", False):
        return True
    mod = getattr(fn, "__module__", "") or ""
    if mod.startswith("torch.nn."):
        return True
    return mod == "comfy.ops" and fn.__qualname__.split(".", 1)[0] == "disable_weight_init"


def _hook_api():
    """(parameter hook registrar, buffer hook registrar), or None where this
    torch lacks them."""
    p = getattr(_module, "register_module_parameter_registration_hook", None)
    b = getattr(_module, "register_module_buffer_registration_hook", None)
    if p is None or b is None:
        return None
    return p, b


def available():
    return _hook_api() is not None


def _count(acc, tensors):
    for t in tensors:
        acc[0] += 1
        acc[1] += t.numel() * t.element_size()


class KeepViews:
    """Context manager around one builder call. sources: the state dict's
    tensors (ferry's views): kept bytes are counted for these. After exit,
    stats() says what was kept and what was copied."""

    def __init__(self, sources, cast_at_use=False):
        self._thread = threading.get_ident()
        self._sources = {t.untyped_storage().data_ptr() for t in sources if t.numel()}
        self._hooked = weakref.WeakSet()
        self._handles = []
        self._kept_ptrs = set()
        self.kept = [0, 0]      # tensors, bytes: the module now holds ferry's view
        self.copied = [0, 0]    # tensors, bytes: copied (ComfyUI's dtype, device or layout differs)
        self.other = [0, 0]     # in modules with loading code of their own: left to it
        # cast_at_use: a ComfyUI layer (comfy.ops) keeps the file's tensor in
        # the file's dtype where ComfyUI wants another, and casts it as it runs
        # (comfy_cast_weights), as ComfyUI's dynamic VRAM assigns the file's
        # tensors and casts them at use; for models ferry's store holds
        self.cast_at_use = cast_at_use
        self.casting = []       # the layers that now cast at use
        self._wrapped = []      # layers whose loading runs with assign for the builder call

    def __enter__(self):
        api = _hook_api()
        if api is not None:
            reg_param, reg_buf = api
            self._handles.append(reg_param(self._on_register))
            self._handles.append(reg_buf(self._on_register))
            reg_mod = getattr(_module, "register_module_module_registration_hook", None)
            if self.cast_at_use and reg_mod is not None:
                self._handles.append(reg_mod(self._on_child))
        return self

    def _on_child(self, parent, name, sub):
        """A layer ComfyUI makes without weights (comfy.ops while dynamic VRAM
        is on) registers none, and its own loading puts a clone of the file's
        tensor there, in the file's dtype, without running load_state_dict's
        pre-hooks: for the builder call, its loading runs with
        assign_to_params_buffers set instead (the view kept, cast as the layer
        runs), where every tensor it takes is one to keep."""
        if (threading.get_ident() != self._thread or "_load_from_state_dict" in sub.__dict__
                or not any(hasattr(sub, n + "_comfy_model_dtype") for n in ("weight", "bias"))
                or not _plain_loading(sub)):
            return None
        own = type(sub)._load_from_state_dict

        def load(state_dict, prefix, local_metadata, *rest):
            picks = []
            for n in ("weight", "bias"):
                v = state_dict.get(prefix + n)
                if v is None or not hasattr(sub, n + "_comfy_model_dtype"):
                    continue
                if (type(v) is not torch.Tensor or v.device.type != "cpu" or not v.is_floating_point()
                        or (v.numel() and v.data_ptr() in self._kept_ptrs)):
                    picks = None
                    break
                picks.append((n, v, getattr(sub, n + "_comfy_model_dtype") or v.dtype))
            if picks and threading.get_ident() == self._thread:
                local_metadata = dict(local_metadata, assign_to_params_buffers=True)
            else:
                picks = []
            own(sub, state_dict, prefix, local_metadata, *rest)
            cast = {}
            for n, v, built in picks:
                if getattr(sub, n, None) is None or sub._parameters.get(n) is None:
                    continue
                self._note_kept(v)
                if v.dtype != built:
                    cast[n] = built
            if cast:
                sub.comfy_cast_weights = True
                sub.ferry_built_dtypes = cast
                self.casting.append(sub)

        sub._load_from_state_dict = load
        self._wrapped.append(sub)
        return None

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for m in self._wrapped:
            m.__dict__.pop("_load_from_state_dict", None)
        self._wrapped.clear()
        return False

    def stats(self):
        return {"kept_tensors": self.kept[0], "kept_bytes": self.kept[1],
                "copied_tensors": self.copied[0], "copied_bytes": self.copied[1],
                "own_loading_tensors": self.other[0], "own_loading_bytes": self.other[1]}

    def _on_register(self, module, name, value):
        if threading.get_ident() != self._thread or module in self._hooked:
            return None
        self._hooked.add(module)
        add = getattr(module, "register_load_state_dict_pre_hook", None)
        if add is not None:
            self._handles.append(add(self._pre_hook))
        else:  # torch before 2.5: the same hook, under its older name
            self._handles.append(module._register_load_state_dict_pre_hook(self._pre_hook, with_module=True))
        return None

    def _note_kept(self, v):
        """v is now a module's tensor: no other takes it, and a view of the
        sources counts as kept."""
        if v.numel():
            self._kept_ptrs.add(v.data_ptr())
            if v.untyped_storage().data_ptr() in self._sources:
                self.kept[0] += 1
                self.kept[1] += v.numel() * v.element_size()

    def _pre_hook(self, module, state_dict, prefix, local_metadata, *rest):
        if threading.get_ident() != self._thread or local_metadata.get("assign_to_params_buffers"):
            return
        persistent = [(n, t) for n, t in module._buffers.items() if n not in module._non_persistent_buffers_set]
        keep, copy = [], []
        for name, cur in list(module._parameters.items()) + persistent:
            if cur is None:
                continue
            key = prefix + name
            v = state_dict.get(key)
            if not isinstance(v, torch.Tensor) or v.shape != cur.shape:
                continue  # missing, or a mismatch load_state_dict reports itself
            dtype_ok = v.dtype == cur.dtype or (self.cast_at_use and hasattr(module, "comfy_cast_weights")
                                                 and v.is_floating_point() and cur.is_floating_point())
            same = (dtype_ok and v.device.type == "cpu" and cur.device.type == "cpu"
                    and v.stride() == cur.stride() and type(v) is torch.Tensor)
            if same and v.numel() and v.data_ptr() in self._kept_ptrs:
                same = False  # already another weight's: a copy, so that they stay apart
            (keep if same else copy).append((key, v, cur))
        if not _plain_loading(module):
            _count(self.other, [c for _, _, c in keep + copy])
            return
        _count(self.copied, [c for _, _, c in copy])
        if not keep:
            return  # nothing to gain: the module copies as it always did
        for key, v, cur in copy:
            out = torch.empty_strided(cur.size(), cur.stride(), dtype=cur.dtype, device=cur.device)
            out.copy_(v)  # what load_state_dict's param.copy_(v) would have made
            state_dict[key] = out
        for key, v, _ in keep:
            self._note_kept(v)
        local_metadata["assign_to_params_buffers"] = True
        cast = {key[len(prefix):]: cur.dtype for key, v, cur in keep if v.dtype != cur.dtype}
        if cast:
            module.comfy_cast_weights = True
            module.ferry_built_dtypes = cast  # what ComfyUI made them: a patch is merged in that dtype
            self.casting.append(module)
