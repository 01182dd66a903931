# SPDX-License-Identifier: MIT
"""residency - ferry's store holds the weights of the models the ferry nodes
load, while ComfyUI's model management decides when each model is needed.

A model the ferry nodes built gets FerryModelPatcher, a ModelPatcher subclass
that sits in comfy.model_management.current_loaded_models like any model:
ComfyUI still sizes it, frees memory for it, asks it to load with the VRAM it
grants and to unload (partly or wholly) when another model needs room, so
--reserve-vram and other models' needs are honoured as for its own models.
Only the moves are ferry's:

- At its first load, the model's module is attached to a ferry.torch.Store
  (one per device): its tensors that are still the file's bytes, as the
  ferry loader left them, are paired with the checkpoint's tensors and from
  then on live where the store puts them. Tensors ComfyUI made itself (a
  dtype it cast to, buffers it computed) stay the module's own and move with
  the model.
- A diffusion model or a text encoder streams block by block through
  ferry's streaming engine within the VRAM ComfyUI granted: all of it
  resident when it fits (nothing moves per step), a resident set plus a
  window of blocks when it does not. A model without repeated blocks comes
  to the device whole and stays held there while ComfyUI has it loaded.
- ComfyUI's grant is an estimate: a step (a diffusion model's forward, a
  text encoder's encode_token_weights) that runs the device out of memory,
  in PyTorch's allocations or ferry's, gives back resident blocks and runs
  again (ferry.torch.Store.run_step), so the prompt goes on.
- Unloading drops the weights (they are clean: the checkpoint has them);
  nothing is copied back to host memory. Where a keeper (`ferry keep`) is
  running, the store asks it for those weights before reading a checkpoint
  and feeds it what it reads (FERRY_COMFYUI_KEEPER), so a restarted ComfyUI
  finds them in memory; a keeper that dies costs only its cache. Streamed blocks come from the
  checkpoint through ferry's pinned ring (FERRY_COMFYUI_STREAM_COPIES says
  otherwise), so host memory stays at the ring's size.
- LoRAs and other weight patches are applied as each patched layer runs
  (ComfyUI's LowVramPatch, as its own partial loading does): the weights
  themselves are never written.

Anything this cannot serve (a patch on a tensor that is not a ComfyUI layer's
weight or bias, a model without repeated blocks larger than the VRAM
granted, a store error)
sends the model back to ComfyUI's own residency: the module gets its views of
the file back and ModelPatcher's own code runs from then on, with the reason
in the log. On the CPU nothing moves, unless FERRY_COMFYUI_DEVICE names a
simulated device (sim:SIZE, for tests and experiments)."""
import atexit
import itertools
import logging
import threading
import weakref

import torch

import comfy.float
import comfy.lora
import comfy.model_management
import comfy.model_patcher
import comfy.utils
from comfy.patcher_extension import CallbacksMP

from . import memstats, settings

_MIN_HELD = 0.5            # below this share of its bytes as the file's, a model is left to ComfyUI

_lock = threading.Lock()
_gone = []                 # models whose last patcher was collected: handled at the next store call
# (a finalizer may run inside any allocation, _lock held or not: it only appends here)
_stores = {}               # store device spec -> ferry.torch.Store
_held = {}                 # store device spec -> {model name: _Held}
_names = itertools.count(1)


class Unsupported(Exception):
    """ferry's residency cannot serve this model (str: why, for the log)."""


def _ferry():
    import ferry
    import ferry.torch
    return ferry


def _spec(load_device):
    """The ferry device a model on load_device lives on, or None (ComfyUI's
    residency: the CPU without FERRY_COMFYUI_DEVICE, devices ferry lacks)."""
    dev = torch.device(load_device)
    if settings.residency is False:
        return None
    if dev.type == "cpu":
        return settings.sim_device
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    return None


def wanted(load_device=None):
    """Whether models for load_device (default: ComfyUI's torch device) would
    be held by ferry's store: the loaders then build them without dynamic
    VRAM, whose loading ferry replaces."""
    try:
        dev = load_device if load_device is not None else comfy.model_management.get_torch_device()
        return _spec(dev) is not None
    except Exception:
        return False


def _store(spec):
    with _lock:
        st = _stores.get(spec)
        if st is None:
            ferry = _ferry()
            budget, _ = settings.host_budget(ferry)
            st = ferry.torch.Store(spec, host_budget=budget, stream_copies=settings.stream_copies)
            if not _stores:
                atexit.register(close_stores)
            _stores[spec] = st
            _held[spec] = {}
            logging.info("ferry: a store on %s holds the ferry nodes' models (streamed blocks: %s copies)",
                         spec, settings.stream_copies)
            _use_keeper(st, spec)
        return st


def _use_keeper(st, spec):
    """The store asks a running keeper first (settings.keeper): none running
    there, or any other failure, leaves it reading checkpoints."""
    if settings.keeper is None:
        return
    where = "the default socket" if settings.keeper is True else settings.keeper
    try:
        st.use_keeper(settings.keeper)
        logging.info("ferry: the store on %s asks the keeper at %s for its weights first", spec, where)
    except Exception as e:  # (OSError: nothing running there) the store works without
        logging.info("ferry: no keeper for the store on %s (%s): it reads the checkpoints", spec, e)


def close_stores():
    """Close every store (run at interpreter exit, before PyTorch and the
    CUDA driver tear down): the device memory, streams and threads of ferry's
    stores go while the driver is still there, and the modules they held keep
    placeholders."""
    with _lock:
        items = list(_stores.items())
        _stores.clear()
        _held.clear()
        _gone.clear()
    for spec, st in items:
        try:
            if spec.startswith("cuda"):
                torch.cuda.synchronize(torch.device(spec))
            st.close()
        except Exception as e:  # exiting: say so, go on with the next
            logging.warning("ferry: closing the store on %s: %s", spec, e)


def _drop_gone():
    while _gone:
        _gone.pop().drop_if_unused()


def stores_stats():
    """{device: ferry.torch.Store.stats()} of the stores made so far."""
    _drop_gone()
    with _lock:
        items = list(_stores.items())
    out = {}
    for spec, st in items:
        try:
            out[spec] = st.stats()
        except Exception:
            pass
    return out


def models_stats():
    """{model label: {"device", "bytes", "granted", "streamed"} and, for a
    streamed one, the engine's figures (resident_bytes, window_bytes, steps,
    streamed_bytes_per_step)} of the models the stores hold."""
    with _lock:
        helds = [h for per in _held.values() for h in per.values()]
    out = {}
    for h in helds:
        rec = {"device": h.spec, "bytes": h.bytes, "granted": h.allowance, "streamed": bool(h.stream)}
        if h.stream and h.store is not None and h.name in h.store:
            try:
                st = h.store.stream_stats(h.name)
                rec.update({k: st.get(k) for k in ("resident_bytes", "window_bytes", "steps",
                                                    "streamed_bytes_per_step", "resident_blocks",
                                                    "streamed_blocks", "budget", "yields", "yielded_bytes")})
            except Exception:
                pass
        out[h.name or h.label] = rec
    return out


memstats.tracker.stores = stores_stats
memstats.tracker.models = models_stats


def _yieldable(spec):
    """Device bytes the streamed models of the store on spec hold beyond
    their plans' minimums: what a step that runs short gets from them."""
    with _lock:
        helds = [h for h in _held.get(spec, {}).values() if h.stream and h.store is not None]
    n = 0
    for h in helds:
        if h.name not in h.store:
            continue
        st = h.store.stream_stats(h.name)
        n += max(min(st["budget"], st["resident_bytes"] + st["window_bytes"]) - st["minimum_bytes"], 0)
    return n


def _granted(spec):
    """What ComfyUI granted the models of the store on spec, together."""
    with _lock:
        return sum(h.allowance for h in _held[spec].values())


class _Held:
    """One model's place in a store, shared by all of its patcher's clones
    (they share the module). views: {module key: (the tensor object the
    loader left there, its data: a view of the file)}, to hand back if the
    model goes back to ComfyUI's residency."""

    def __init__(self, module, files, keys, views, stream, label):
        self.module, self.files, self.keys, self.views = module, files, keys, views
        self.stream = stream
        self.label = label
        self.name = None          # in the store, once attached
        self.spec = None
        self.store = None
        self.allowance = 0        # device bytes ComfyUI granted
        self.hold = None          # store.use() context while loaded (a model held whole)
        self.wrapped = False      # encode_token_weights runs as the store's step (streamed text encoders)
        self.own_encode = None
        self.patched = []         # modules whose weight/bias functions carry patches
        self.bytes = sum(d.numel() * d.element_size() for _, d in {id(t): (t, d) for t, d in views.values()}.values())
        self.patchers = weakref.WeakSet()  # its patcher and their clones: while one lives, so does it

    def track(self, patcher):
        self.patchers.add(patcher)
        weakref.finalize(patcher, _gone.append, self)

    def drop_if_unused(self):
        """After the last patcher of the model went (ComfyUI dropped the
        node's output): the store lets it go, and the module holds its views
        of the file again (anything still holding the module keeps working)."""
        if len(self.patchers) or self.store is None:
            return
        spec = self.spec
        try:
            self.give_back()
        except Exception as e:
            logging.warning("ferry: %s: could not leave the store: %s", self.label, e)
            return
        self.module._ferry_held = None
        try:
            _stores[spec].set_device_budget(max(_granted(spec), 1))
        except Exception:
            pass

    # ---- attach / give back ----

    def attach(self, device):
        if self.store is not None:
            return
        spec = _spec(device)
        if spec is None:
            raise Unsupported(f"ferry has no device for {device}")
        store = _store(spec)
        name = f"{self.label}-{next(_names)}"
        # the budget with this model's grant in it, as the engine plans at once
        store.set_device_budget(max(_granted(spec) + self.allowance, 1))
        kw = {}
        if self.stream:
            # (on a GPU the engine measures what PyTorch needs beside it: 2 GiB
            # left free until a step ran, then that step's peak and a margin;
            # a sim device has no PyTorch allocations)
            kw = {"stream": "auto", "reserve": None if spec.startswith("cuda") else 0}
        try:
            store.add(name, self.files, module=self.module, strict=False, keys=self.keys, **kw)
        except ValueError as e:
            if not self.stream or "block" not in str(e):
                raise
            self.stream = False  # no repeated blocks: held whole instead
            store.add(name, self.files, module=self.module, strict=False, keys=self.keys)
        self.store, self.name, self.spec = store, name, spec
        if self.stream and callable(getattr(self.module, "encode_token_weights", None)):
            # a text encoder: ComfyUI runs its blocks from encode_token_weights,
            # not from forward, so each call of it is the step
            inner = self.module.encode_token_weights
            self.own_encode = self.module.__dict__.get("encode_token_weights")
            self.module.encode_token_weights = lambda *a, **k: store.run_step(name, inner, *a, **k)
            self.wrapped = True
        # the bytes the store counts for the model's own tensors
        states = store.tensor_states(name)
        self.bytes = sum(states[f].nbytes for f in set(self.keys.values()))
        with _lock:
            _held[spec][name] = self

    def give_back(self):
        """Detach from the store and put the loader's views back: the module
        is as the loader left it, for ComfyUI's own residency."""
        if self.store is None:
            return
        self.release()
        if self.wrapped:
            self.wrapped = False
            if self.own_encode is None:
                self.module.__dict__.pop("encode_token_weights", None)
            else:
                self.module.encode_token_weights = self.own_encode
        try:
            self.store.remove(self.name)
        finally:
            with _lock:
                _held[self.spec].pop(self.name, None)
            self.store = None
            # each tensor object the loader left (a tied tensor's names share
            # one) holds its view of the file again: the store swapped its
            # contents for a placeholder of its own
            back, cast = {}, {}
            for key, (obj, data) in self.views.items():
                owner, attr = _owner(self.module, key)
                built = getattr(owner, "ferry_built_dtypes", {}).get(attr)
                if built is not None:  # kept in the file's dtype for the store: as ComfyUI built it
                    data = data.to(built)
                    cast[id(owner)] = owner
                t = back.get(id(obj))
                if t is None:
                    t = back[id(obj)] = _restored(obj, data)
                if attr in owner._parameters:
                    owner._parameters[attr] = t
                else:
                    owner._buffers[attr] = t
            for owner in cast.values():
                del owner.ferry_built_dtypes
                owner.__dict__.pop("comfy_cast_weights", None)  # the layer's class default again

    # ---- device memory ----

    def set_budget(self):
        """The store's device budget: what ComfyUI granted its loaded models."""
        self.store.set_device_budget(max(_granted(self.spec), 1))

    def release(self):
        if self.hold is not None:
            h, self.hold = self.hold, None
            h.__exit__(None, None, None)


def _restored(obj, data):
    """obj (a Parameter or buffer the loader made) holding data again: obj
    itself where torch can swap contents (ferry.torch's own re-pointing),
    else a new Parameter (or data)."""
    if not isinstance(obj, torch.nn.Parameter):
        return data
    return _ferry().torch.swap_parameter_data(obj, data, False)


def _owner(module, key):
    path, _, attr = key.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


def prepare(patcher, module_attr, raw_names, files, stream, label):
    """Give patcher (just built by a ferry loader, not loaded yet) ferry's
    residency: its class becomes FerryModelPatcher (it adds no state of its
    own, so the object ComfyUI's builder made is kept) and the module at
    patcher.model.<module_attr> ("" for the patcher's model itself) is
    attached at the first load. raw_names: {data_ptr: (file tensor name,
    shape, dtype)} of the views ferry read, as the checkpoint names them.
    Raises Unsupported with the reason."""
    if type(patcher) is not comfy.model_patcher.ModelPatcher:
        raise Unsupported(f"its patcher is a {type(patcher).__name__} (ComfyUI's dynamic VRAM or another pack's)")
    module = comfy.utils.get_attr(patcher.model, module_attr) if module_attr else patcher.model
    if getattr(module, "_ferry_held", None) is not None:
        raise Unsupported("its module is already held")
    keys, views, total = {}, {}, 0
    seen = set()
    for key, _, _, _, t in _ferry().torch.module_tensors(module):  # as attached
        n = t.numel() * t.element_size()
        if id(t) not in seen:
            seen.add(id(t))
            total += n
        if not n or t.device.type != "cpu" or not t.is_contiguous() or type(t) not in (torch.Tensor,
                                                                                        torch.nn.Parameter):
            continue  # (a tensor subclass, e.g. ComfyUI's quantized weights, stays ComfyUI's to move)
        hit = raw_names.get(t.data_ptr())
        if hit is None or tuple(hit[1]) != tuple(t.shape) or hit[2] != t.dtype:
            continue
        keys[key] = hit[0]
        views[key] = (t, t.data if isinstance(t, torch.nn.Parameter) else t)
    held = _Held(module, files, keys, views, stream, label)
    if not total or held.bytes < _MIN_HELD * total:
        raise Unsupported(f"only {memstats.fmt_bytes(held.bytes)} of its {memstats.fmt_bytes(total)} are the "
                          "file's bytes as they are (ComfyUI converted the rest)")
    if patcher.model.model_loaded_weight_memory:
        # built on its load device, ComfyUI loaded it at once (a text encoder
        # on the CPU): unloaded as ComfyUI unloads (its marks of patched
        # weights go), from now on the store brings it
        patcher.unpatch_model(patcher.offload_device, unpatch_weights=True)
    module._ferry_held = held
    patcher.__class__ = FerryModelPatcher
    held.track(patcher)
    return held


class _Merged:
    """A patched weight (or bias) as ComfyUI's full load merges it into the
    model (ModelPatcher.patch_weight_to_device: the patches computed in
    lora_compute_dtype over the clean weight, rounded stochastically to the
    dtype ComfyUI built the weight in with the key's seed), computed from the
    clean weight the store put on the device each time its layer runs: outputs are those of
    the merged model, and the weights stay clean. ComfyUI's cast path hands
    the weight over in the compute dtype; the result goes back to it.
    stored_dtype None: no rounding (a GGUF layer's patched values are kept as
    computed)."""

    def __init__(self, key, patches, stored_dtype, convert_func):
        self.key, self.patches, self.dtype, self.convert_func = key, patches, stored_dtype, convert_func

    def __call__(self, weight):
        temp = weight.to(comfy.model_management.lora_compute_dtype(weight.device), copy=True)
        if self.convert_func is not None:
            temp = self.convert_func(temp, inplace=True)
        out = comfy.lora.calculate_weight(self.patches[self.key], temp, self.key)
        if self.dtype is not None:
            out = comfy.float.stochastic_rounding(out, self.dtype, seed=comfy.utils.string_to_seed(self.key))
        return out.to(weight.dtype)


class FerryModelPatcher(comfy.model_patcher.ModelPatcher):
    """A ModelPatcher whose weights ferry's store moves (see the module's
    comment). ComfyUI's orchestration (partially_load, patch_model with
    object patches and hooks, detach and its callbacks, clones) is the base
    class's; load, unpatch_model and partially_unload are ferry's while the
    model is held, the base class's once it went back to ComfyUI."""

    def _ferry(self):
        return getattr(self._ferry_module(), "_ferry_held", None)

    def clone(self, *args, **kwargs):
        n = super().clone(*args, **kwargs)
        held = self._ferry()
        if held is not None and n.model is self.model:
            held.track(n)
        return n

    def _ferry_module(self):
        m = self.model
        d = getattr(m, "diffusion_model", None)
        if d is not None and getattr(d, "_ferry_held", None) is not None:
            return d
        return m

    @torch.inference_mode(False)
    def _move_rest(self, held, device):
        """Move the model's tensors outside the held module (BaseModel's own
        beside its diffusion_model) to device, as ComfyUI moves a model."""
        inside = {id(m) for m in held.module.modules()}
        for m in self.model.modules():
            if id(m) in inside:
                continue
            for name, t in list(m._parameters.items()):
                if t is not None and t.device != device and not t.is_meta:
                    m._parameters[name] = torch.nn.Parameter(t.to(device), requires_grad=t.requires_grad)
            for name, t in list(m._buffers.items()):
                if t is not None and t.device != device and not t.is_meta:
                    m._buffers[name] = t.to(device)

    def _fallback(self, held, reason):
        logging.warning("ferry: %s goes back to ComfyUI's residency: %s", held.label, reason)
        memstats.tracker.note_residency({"model": held.label, "reason": reason})
        try:
            held.give_back()
        finally:
            held.module._ferry_held = None

    # ---- loading ----

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        _drop_gone()
        held = self._ferry()
        if held is None:
            return super().load(device_to, lowvram_model_memory, force_patch_weights, full_load)
        try:
            with self.use_ejected():
                self.unpatch_hooks()
                self._ferry_load(held, device_to, lowvram_model_memory, full_load)
                for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
                    callback(self, device_to, lowvram_model_memory, force_patch_weights, full_load)
                self.apply_hooks(self.forced_hooks, force_apply=True)
        except Unsupported as e:
            self._ferry_unload(held, self.offload_device)
            self._fallback(held, str(e))
            return super().load(device_to, lowvram_model_memory, force_patch_weights, full_load)
        except Exception as e:
            if isinstance(e, torch.cuda.OutOfMemoryError):
                raise  # ComfyUI frees memory and retries, as for its own models
            logging.debug("ferry: load of %s failed", held.label, exc_info=True)
            self._ferry_unload(held, self.offload_device)
            self._fallback(held, f"{type(e).__name__}: {e}")
            return super().load(device_to, lowvram_model_memory, force_patch_weights, full_load)

    def _ferry_load(self, held, device_to, lowvram_model_memory, full_load):
        device_to = torch.device(device_to) if device_to is not None else self.load_device
        total = self.model_size()
        want = total if full_load or lowvram_model_memory <= 0 or lowvram_model_memory >= 1e31 else \
            int(lowvram_model_memory)
        held.allowance = min(want, held.bytes)
        held.attach(device_to)
        if not held.stream and want < held.bytes:
            raise Unsupported(f"it has no repeated blocks to stream and needs {memstats.fmt_bytes(held.bytes)} "
                              f"on the device, {memstats.fmt_bytes(want)} were granted")
        held.allowance = min(want, held.bytes)  # (now the store's count)
        held.set_budget()
        if held.stream:
            # PyTorch's needs measured again at the first step: ComfyUI emptied
            # PyTorch's cache since the last prompt, and a model under dynamic
            # VRAM (a VAE) may hold device memory beyond what ComfyUI counts
            held.store.remeasure(held.name)
        self._set_patch_functions(held)
        self._move_rest(held, device_to)
        if not held.stream and held.hold is None:
            cm = held.store.use(held.name)
            cm.__enter__()
            held.hold = cm
        self.model.device = device_to
        self.model.model_lowvram = held.stream and held.allowance < held.bytes
        self.model.model_loaded_weight_memory = held.allowance
        self.model.model_offload_buffer_memory = 0
        self.model.current_weight_patches_uuid = self.patches_uuid
        logging.info("ferry: %s on %s: %s granted of %s%s", held.label, held.spec,
                     memstats.fmt_bytes(held.allowance), memstats.fmt_bytes(held.bytes),
                     ", streamed block by block" if self.model.model_lowvram else "")

    def _set_patch_functions(self, held):
        """Each patched weight or bias computed as its layer runs, from the
        clean weight the store put on the device."""
        self._wipe_patch_functions(held)
        patched = {}
        for key in list(self.patches) + list(self.weight_wrapper_patches):
            mod_name, _, param = key.rpartition(".")
            try:
                m = comfy.utils.get_attr(self.model, mod_name) if mod_name else self.model
            except AttributeError:
                raise Unsupported(f"a patch names {key}, which the model lacks")
            if param not in ("weight", "bias") or not hasattr(m, "comfy_cast_weights"):
                raise Unsupported(f"a patch changes {key}, which is not a ComfyUI layer's weight or bias")
            patched[id(m)] = m
        for m in patched.values():
            m.prev_comfy_cast_weights = m.comfy_cast_weights
            m.comfy_cast_weights = True
            m.weight_function, m.bias_function = [], []
        for key in self.patches:
            mod_name, _, param = key.rpartition(".")
            m = comfy.utils.get_attr(self.model, mod_name)
            if getattr(m, "ferry_qtype", None) is not None and param == "weight":
                # a GGUF layer (gguf_ops): its functions get the dequantized weight,
                # and a full load keeps the patched values as they come (set_weight)
                getattr(m, param + "_function").append(_Merged(key, self.patches, None, None))
                continue
            weight, set_func, convert_func = comfy.model_patcher.get_key_weight(self.model, key)
            if set_func is not None:
                raise Unsupported(f"a patch changes {key}, a quantized weight")
            dtype = getattr(m, "ferry_built_dtypes", {}).get(param, weight.dtype)
            getattr(m, param + "_function").append(_Merged(key, self.patches, dtype, convert_func))
        for key, fns in self.weight_wrapper_patches.items():
            mod_name, _, param = key.rpartition(".")
            getattr(comfy.utils.get_attr(self.model, mod_name), param + "_function").extend(fns)
        held.patched = list(patched.values())
        self.model.lowvram_patch_counter = len(self.patches)

    def _wipe_patch_functions(self, held):
        for m in held.patched:
            comfy.model_patcher.wipe_lowvram_weight(m)
        held.patched = []
        self.model.lowvram_patch_counter = 0

    # ---- unloading ----

    def _ferry_unload(self, held, device_to):
        """Everything of the model off the device: the hold let go, clean
        weights dropped (nothing to copy back), the rest moved to device_to."""
        held.release()
        self._wipe_patch_functions(held)
        if held.store is not None:
            held.allowance = 0
            held.store.offload(held.name)
            held.set_budget()
        if device_to is not None:
            self._move_rest(held, torch.device(device_to))
            self.model.device = device_to
        self.model.model_loaded_weight_memory = 0
        self.model.model_offload_buffer_memory = 0
        self.model.model_lowvram = False
        self.model.current_weight_patches_uuid = None

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        held = self._ferry()
        if held is None:
            return super().unpatch_model(device_to, unpatch_weights)
        self.eject_model()
        if unpatch_weights:
            self.unpatch_hooks()
            self._ferry_unload(held, device_to)
        for k in list(self.object_patches_backup):
            comfy.utils.set_attr(self.model, k, self.object_patches_backup[k])
        self.object_patches_backup.clear()

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        held = self._ferry()
        if held is None:
            return super().partially_unload(device_to, memory_to_free, force_patch_weights)
        loaded = self.model.model_loaded_weight_memory
        if not held.stream or held.store is None or memory_to_free >= loaded:
            self._ferry_unload(held, device_to)
            return loaded
        # a streamed model gives up part of its grant: the engine plans a
        # smaller resident set at its next step; what is over goes now
        held.allowance = max(loaded - int(memory_to_free), 1)
        held.set_budget()
        self.model.model_lowvram = held.allowance < held.bytes
        self.model.model_loaded_weight_memory = held.allowance
        return loaded - held.allowance

    def pinned_memory_size(self):
        return 0

    def get_free_memory(self, device):
        """What the sampler may count on for a step's activations (it sizes
        its batches from this: cond and uncond together when they fit): the
        device's free memory, as ComfyUI counts it, and what ferry's streamed
        models there give back when a step needs it (each one's plan down to
        its minimum). Batching as stock does keeps the outputs stock's."""
        free = super().get_free_memory(device)
        try:
            return free + _yieldable(_spec(device))
        except Exception:
            return free
