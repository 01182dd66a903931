# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._store - ferry.torch.Store: the residency store (the C objects
are ferry._store.StoreCore's) with nn.Modules attached, whose tensors are
re-pointed at the store's device memory as it moves them; Job. Store's
methods are in this class (with its forward hooks and holds) and its bases:
_StoreViews (views of the store's memory, re-pointing; _store_views) and
_StoreTensors (calls on single tensors; _store_tensors).
"""
import contextlib
import os
import threading
import warnings

import torch

from .. import _core, _dlpack, _lib, _store, errors
from . import _stream
from ._match import _attach_plan, _module_extras, _repoint
from ._store_tensors import _StoreTensors
from ._store_views import _HOME, _Attached, _StoreViews
from ._tensors import _cuda_index, _torch_device

_UINT64_MAX = (1 << 64) - 1


def _store_device(device):
    """(ferry device spec, torch device of the views, DLPack device or None
    for host memory) of a Store's device argument."""
    if isinstance(device, str) and (device.startswith("sim:") or device == "cpu"):
        # ferry's simulated GPU (and its cpu device): "device" memory is host memory
        return device, torch.device("cpu"), None
    device = _torch_device(device, "ferry.torch.Store")
    if device.type != "cuda":
        raise ValueError(f"ferry.torch.Store: device must be cuda[:N], sim:SIZE or cpu, not {device}")
    index = _cuda_index(device)
    return f"cuda:{index}", torch.device("cuda", index), (_dlpack.KDL_CUDA, index)


def _size_opt(v, what):
    if v is None:
        return 0
    try:
        return _core.parse_size(v)
    except ValueError as e:
        raise ValueError(f"ferry.torch.Store: {what}: {e}") from None


class Job:
    """`with store.job(name) as j:` - per-job memory statistics
    (ferry_store_job_begin/end; one at a time per store, else BusyError).
    j.stats is None inside the block and a dict
    with ferry_job_stats's fields after it: job (ferry_store_job_name), seconds, rss, uss, pss and
    cgroup (each {"start", "end", "peak"} in bytes; cgroup all 0 outside a
    cgroup v2), device_bytes, pinned_bytes, host_bytes, spill_bytes (the
    tiers at the end), bytes_htod, bytes_dtoh, bytes_written, bytes_read,
    seconds_htod, seconds_dtoh, evicted, dropped (during the job)."""

    def __init__(self, store, name):
        self.store = store
        self.name = name
        self.stats = None

    def __enter__(self):
        with self.store._lock:
            self.store._live().job_begin(self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        with self.store._lock:
            try:
                self.stats = self.store._live().job_end()
            except (errors.FerryError, OSError, ValueError):
                if exc_type is None:
                    raise  # else the block's own exception is the one to see
        return False

    def __repr__(self):
        return f"<ferry.torch.Job {self.name!r} {'open' if self.stats is None else 'ended'}>"


class Store(_StoreViews, _StoreTensors):
    """ferry's residency store (ferry_store_*) with nn.Modules attached: see
    python/README.md ("Residency store").

        store = ferry.torch.Store("cuda:0", device_budget="20GiB")
        store.add("dit", "dit.safetensors", module=dit)      # dit's tensors now follow the store
        dit(x)                        # a forward pre-hook brings it to the device, held while it runs
        store.offload("dit")          # its parameters become meta tensors until the next use

    Every call is thread-safe. After every call that can move tensors, each
    attached module's parameters and buffers are re-pointed: zero-copy views of
    the device copy while the tensor is on the device, meta tensors of the
    right shape and dtype while it is not (so nothing ever points at memory the
    store gave to another tensor). With torch 2.3 and later re-pointing keeps
    the Parameter objects (their contents are swapped, requires_grad kept);
    with older torch it puts new ones in: look them up on the module after a
    store call rather than keeping them.

    stream_copies: where streamed blocks come from after the first step, for
    models added with stream= (add's pinned_cache overrides it per model):
    "auto" (the default) keeps a pinned copy of every streamed block when all
    of them fit the pinned budget, the host budget and the host's available
    memory (cgroup-aware), else reads them from the checkpoint through the
    pinned ring every step; "pinned" keeps copies of as many as fit; "ring"
    keeps none (host memory: the ring alone). stream_stats() says which
    was used ("pinned_copies").

    keeper: True (the default socket) or a socket path: a running keeper
    (`ferry keep`, docs/KEEPER.md) serves the clean tensors it holds and is
    fed those read (never a changed checkpoint's, never a dirty tensor);
    OSError when none runs there; one that dies later costs only its cache.
    None (the default): checkpoints only. See stats() and use_keeper()."""

    def __init__(self, device="cuda", *, device_budget=None, device_reserve=None, host_budget=None,
                 pinned_budget=None, host_reserve=None, spill_below=None, spill_above=None, spill_dir=None,
                 route="auto", threads=None, ring_buffers=None, ring_buffer_bytes=None, pinned_reserve=None,
                 stream_copies="auto", keeper=None, path_kind=None):
        self._core = None
        path_kind = _core.route_arg(route, path_kind, "ferry.torch.Store")
        if stream_copies not in _lib.STREAM_COPIES:
            raise ValueError(f"stream_copies must be one of {sorted(_lib.STREAM_COPIES)}, not {stream_copies!r}")
        self._stream_copies = stream_copies
        self._lock = threading.RLock()
        self._tls = threading.local()  # the forward pre-hooks' holds, per thread
        self._attached = {}  # model name -> _Attached
        self._states = {}    # model name -> [(tier, dptr)] of every tensor, as of the last call
        self._segs = {}      # (base, size) of a device block of the store's -> {dtype: 1-D view of it}
        spec, self._tdev, self._dl = _store_device(device)
        self._extras_dev = self._tdev  # where a model's tensors outside the checkpoint go with it
        self.device = spec
        fdev = _core.device(spec)
        opts = _core.LoadOptions(path_kind, threads, ring_buffers, ring_buffer_bytes)
        self._core = _store.StoreCore(
            fdev, device_budget=_size_opt(device_budget, "device_budget"),
            device_reserve=_size_opt(device_reserve, "device_reserve"),
            host_budget=_size_opt(host_budget, "host_budget"),
            pinned_budget=_size_opt(pinned_budget, "pinned_budget"),
            host_reserve=_size_opt(host_reserve, "host_reserve"),
            spill_below=_size_opt(spill_below, "spill_below"), spill_above=_size_opt(spill_above, "spill_above"),
            spill_dir=spill_dir, load_opts=opts.opts, pinned_reserve=_size_opt(pinned_reserve, "pinned_reserve"),
            keeper=keeper)

    # ---- lookups ----

    def _live(self):
        if self._core is None:
            raise ValueError(f"ferry.torch.Store on {self.device}: the store is closed")
        return self._core

    def _model(self, name):
        core = self._live()
        m = core.models.get(name) if isinstance(name, str) else None
        if m is None:
            have = ", ".join(f'"{k}"' for k in core.models) or "none"
            raise errors.NotFoundError(_lib.E_NOTFOUND, f"ferry.torch.Store on {self.device}: no model called "
                                                        f"{name!r} (models: {have})")
        return m

    def __contains__(self, name):
        return self._core is not None and name in self._core.models

    def __len__(self):
        return 0 if self._core is None else len(self._core.models)

    def names(self):
        """The models' names, in the order added."""
        return list(self._live().models)

    def tensor_names(self, name):
        """The tensors of a model, in the store's numbering (file by file)."""
        return [t.name for t in self._model(name).infos]

    def module(self, name):
        """The module attached to a model, or None."""
        self._model(name)
        a = self._attached.get(name)
        return a.module if a is not None else None

    # ---- models ----

    def add(self, name, path, *, module=None, priority=0, strict=True, stream=None, prefetch=None, reserve=None,
            pinned_cache=None, keys=None):
        """Add a model called name holding every tensor of path (anything
        ferry reads; a list of paths makes one model of several files). Its
        tensors start in the checkpoint (tier "source"): nothing is read yet.
        Higher priority models are evicted later.

        module: an nn.Module whose parameter and persistent buffer names are
        the checkpoint's tensor names. Keys, shapes and dtypes are checked
        first (RuntimeError worded as load_state_dict's; strict=False lets
        module tensors missing from the file keep their values and file
        tensors the module lacks stay in the store only). Its tensors then
        become meta placeholders (whatever memory they had is dropped) and
        follow the store from then on; a forward pre-hook brings the model to
        the device and holds it while forward runs. The module's tensors that
        the file lacks (non-persistent buffers, and what strict=False left
        out) move with the model instead: to the device with it, back to the
        cpu once it has left (_extras_to). keys: {module tensor name:
        checkpoint tensor name} for a module whose names differ from the
        file's (a prefix stripped, keys converted): its tensors are paired
        through it instead of by equal names, and one it leaves out counts as
        missing (so strict=False keeps it as the module's own).

        stream="auto" (or a list of block module names, or of ModuleLists
        whose children are the blocks) runs the module block by block instead,
        for a module larger than the device budget: "auto" finds the repeated
        blocks (the ModuleLists of same-class modules that hold most of the
        bytes). The store keeps a stable set of blocks resident and streams
        the rest through a window, overlapped with compute: before a block
        runs, the current CUDA stream waits for its copy (no host sync) and the
        next `prefetch` blocks are queued (default 2); after it runs, it is
        released on the current stream. Outputs are bit-identical to the
        resident module's. reserve: device bytes to leave free beside the
        store's budget (default: measured from PyTorch's peak in the first
        step, plus 512 MiB). Each call of the module's forward is one step
        (the module's forward attribute wraps its own while attached); a step
        that runs the device out of memory, in PyTorch's allocations or
        ferry's, gives back resident blocks and runs again, leaving that
        memory free from then on (stream_stats' yields, yielded_bytes).

        pinned_cache: None (the default) follows the store's stream_copies for
        streamed blocks; True keeps a pinned copy of every clean tensor of the
        model as it is first read (streamed blocks too, as many as the budgets
        hold), so a model that left the device comes back by one DMA (a model
        swap) instead of a read of its checkpoint; False keeps none (streamed
        blocks come from the checkpoint through the ring every step). The copies give way to modified tensors'
        saves when the host is short (set_pinned_cache changes it later). While streaming, a block's parameters are
        valid inside its forward only (they are new Parameter objects each
        time the block lands; outside, they may show another block's memory
        until the next store call re-points them). stream_stats(name) reports."""
        if not isinstance(name, str) or not name:
            raise TypeError("the model's name must be a non-empty str")
        paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
        if not paths:
            raise ValueError(f"model \"{name}\": no files")
        with self._lock:
            core = self._live()
            if name in core.models:
                raise errors.InvalidArgumentError(_lib.E_INVAL, f"ferry.torch.Store: a model called "
                                                               f"\"{name}\" is already in the store")
            if module is not None:
                if not isinstance(module, torch.nn.Module):
                    raise TypeError(f"module must be an nn.Module, not {type(module).__name__}")
                if getattr(module, "_ferry_store_model", None) is not None:
                    raise ValueError(f"this {type(module).__name__} is already attached to model "
                                     f"\"{module._ferry_store_model}\" of a ferry store")
            if stream is not None and module is None:
                raise ValueError(f"model \"{name}\": stream= needs module=")
            handles, infos = core.open_files(paths)
            if keys is not None and module is None:
                raise ValueError(f"model \"{name}\": keys= needs module=")
            plan = _attach_plan(module, infos, handles, strict, keys) if module is not None else None
            core.add(name, handles, infos, priority)
            try:
                if pinned_cache:
                    core.set_pinned_cache(core.models[name], True)
                if module is not None:
                    a = _Attached(module, plan, _module_extras(module, plan))
                    if stream is not None:
                        a.streamer = _stream.Streamer(self, name, a, stream, prefetch,
                                                      None if reserve is None else
                                                      _size_opt(reserve, "reserve"),
                                                      self._stream_copies if pinned_cache is None else
                                                      "pinned" if pinned_cache else "ring")
                    self._attached[name] = a
                    module._ferry_store_model = name
                    if a.streamer is not None:
                        a.streamer.install()
                    else:
                        self._install_hooks(name, a)
            except BaseException:
                a = self._attached.pop(name, None)
                if a is not None:  # hooks installed before the failure go too
                    for h in a.hooks:
                        h.remove()
                    if a.streamer is not None:
                        a.streamer.close()
                    module.__dict__.pop("_ferry_store_model", None)
                core.remove(core.models[name])
                raise
            self._refresh([name])
        return name

    def stream_stats(self, name):
        """A streaming model's plan and what its steps moved: blocks, order,
        prefetch, plan (ferry_plan as a dict), resident_blocks,
        streamed_blocks, resident_bytes, window_bytes, planned_streamed_bytes,
        steps, bytes_per_step (host to device, per step), streamed_bytes_per_step
        (their mean after the first step), seconds_per_step (host time of each
        forward)."""
        with self._lock:
            self._model(name)
            a = self._attached.get(name)
            if a is None or a.streamer is None:
                raise ValueError(f"model \"{name}\" was not added with stream=")
            return a.streamer.stats()

    def run_step(self, name, fn, *args, **kwargs):
        """fn(*args, **kwargs) as one step of streaming model name, as a call
        of its module's forward is: for a caller that runs the blocks from
        another method (a text encoder's encode). A step that runs the device
        out of memory gives back resident blocks and runs again (see add);
        inside a step already, fn just runs."""
        with self._lock:
            self._model(name)
            a = self._attached.get(name)
            if a is None or a.streamer is None:
                raise ValueError(f"model \"{name}\" was not added with stream=")
            st = a.streamer
        return st.run(fn, *args, **kwargs)

    def remeasure(self, name=None):
        """PyTorch's working memory is measured again at the next step of each
        streaming model (name: that model's only): that step plans with 2 GiB
        of the device left free (or the model's reserve=), and the plan after
        it leaves what the step took plus a margin. For a caller that released
        PyTorch's cached memory (torch.cuda.empty_cache) or whose inputs or
        other users of the device changed since the last measure."""
        with self._lock:
            self._live()
            names = list(self._attached) if name is None else [name]
            for n in names:
                if name is not None:
                    self._model(n)
                a = self._attached.get(n)
                if a is not None and a.streamer is not None:
                    a.streamer.remeasure()

    def set_device_budget(self, nbytes):
        """Change the store's device budget now (int or "12GiB"): what the
        store holds beyond it is evicted at once (dirty tensors saved), and
        streaming models are planned again at their next step."""
        n = _size_opt(nbytes, "nbytes")
        with self._lock:
            core = self._live()
            self._sync()
            self._drain()
            try:
                core.set_device_budget(n)
            finally:
                for a in self._attached.values():
                    if a.streamer is not None:
                        a.streamer.replan_wanted = True
                self._refresh()

    @contextlib.contextmanager
    def use(self, name):
        """`with store.use(name):` - the model on the device and held (never
        evicted) inside the block, e.g. while calling its submodules directly
        (the forward hooks are on the attached module only)."""
        self._enter(name)
        try:
            yield self
        finally:
            self._leave(name)

    def unpin(self, name):
        """Deprecated name of release_holds (kept for one release)."""
        warnings.warn("Store.unpin is deprecated, use Store.release_holds", DeprecationWarning, stacklevel=2)
        return self.release_holds(name)

    def release_holds(self, name):
        """Drop the holds the forward hooks keep on a model. Needed only with
        torch before 2.1 after a forward that raised (its forward hook did not
        run, so the model stayed held and cannot be evicted)."""
        with self._lock:
            m = self._model(name)
            a = self._attached.get(name)
            while a is not None and a.hook_holds:
                a.hook_holds -= 1
                self._core.release(m, -1)
            stack = self._tls.__dict__.get("holds")
            while stack and name in stack:
                stack.remove(name)
            if a is not None and a.streamer is not None:  # a streaming model's step that raised
                a.streamer.release_step()
                a.streamer.drain()

    def to_device(self, name, tensors=None):
        """Bring a model (or tensors: names, indices or tensors of it, with
        their groups; a model with an attached module: the tensors the module
        has) to the device, evicting others as the policy decides
        (least recently used, lowest priority first, never a held tensor).
        Marks the model used now. BudgetError when even that cannot make room
        (nothing evicted or moved then)."""
        with self._lock:
            m = self._model(name)
            idx = self._indices(m, tensors) if tensors is not None else self._own(name, m)
            moving = not self._all_on_device(m, idx)
            if moving:
                self._sync()
            try:
                self._to_device(m, idx)
            finally:
                if moving:
                    self._refresh()
            if tensors is None:
                self._extras_to(name)

    def offload(self, name, tensors=None):
        """Take a model (or some of its tensors) off the device: clean tensors
        are dropped, dirty ones saved to pinned RAM, host RAM or the spill
        file. Attached modules' tensors become meta placeholders."""
        with self._lock:
            m = self._model(name)
            idx = self._indices(m, tensors)
            self._sync()
            self._drain([name])
            try:
                self._core.evict(m, idx)
            finally:
                self._refresh([name])

    evict = offload

    def make_room(self, nbytes=None):
        """Make nbytes (int or "2GiB"; None: everything evictable) of device
        memory free for the caller, evicting what the policy picks, and give
        the store's cached device blocks back to the driver. Returns the
        tensor bytes evicted. BudgetError (with the library's message, and
        .could = the most that could be made free) when it is impossible:
        nothing is evicted then."""
        n = _UINT64_MAX if nbytes is None else _size_opt(nbytes, "nbytes")
        with self._lock:
            core = self._live()
            self._sync()
            self._drain()
            try:
                return core.make_room(n)
            finally:
                self._refresh()

    def set_priority(self, name, priority):
        with self._lock:
            self._core.set_priority(self._model(name), priority)

    def set_pinned_cache(self, name, on):
        """on=True: every clean tensor of the model read from its checkpoint
        from now on keeps a copy in pinned RAM as the budgets allow, so coming
        back to the device costs one DMA; False: the copies it has go now
        (streamed blocks follow add()'s pinned_cache)."""
        with self._lock:
            self._core.set_pinned_cache(self._model(name), bool(on))

    def stats(self):
        """ferry_store_get_stats as a dict: tier_bytes {tier: bytes}, the
        budgets, host_available and host_source, spilling, spill_path,
        spill_file_bytes, bytes and seconds moved each way, bytes_written and
        bytes_read (from checkpoints and the spill file), evicted, dropped, models, tensors,
        device_cached, pinned_pool_bytes, pinned_reserve and pinned_reserved (of the pool
        pinned ahead, so far); bytes_from_keeper (served by the keeper, not read) and keeper
        (ferry_store_get_keeper_stats: used, connected, bytes_served, bytes_fed, hits, misses,
        stale, refused, errors, connects, last_error)."""
        with self._lock:
            return self._live().stats()

    def use_keeper(self, keeper=True, timeout=None):
        """Start using a keeper (keeper= of the class); OSError when none runs there."""
        with self._lock:
            self._live().use_keeper(keeper, timeout)

    def wait_pinned(self):
        """Wait until the pool asked for with pinned_reserve= is pinned (a
        background thread of the store's pins it from the moment the store is
        made, so the first dirty eviction runs at the copy rate rather than
        the pinning rate, about 7 GB/s). Raises the error that stopped the
        pinning; the store then pins on demand and works on."""
        with self._lock:
            self._live().wait_pinned()

    def job(self, name):
        """`with store.job("denoise") as j: ...` then j.stats: see Job."""
        if not isinstance(name, str):
            raise TypeError("a job's name is a str")
        return Job(self, name)

    def _detach(self, name):
        self._extras_to(name, _HOME)
        a = self._attached.pop(name, None)
        if a is None:
            return
        for h in a.hooks:
            h.remove()
        keep = a.streamer is None
        if a.streamer is not None:
            a.streamer.close()
            a.streamer = None
        for idx, info, dt, entries in a.plan:
            if a.shown.get(idx, (None,))[0] == _lib.TIER_DEVICE:
                _repoint(entries, self._placeholder(info, dt), keep=keep)
        try:
            del a.module._ferry_store_model
        except AttributeError:
            pass

    def remove(self, name):
        """Remove a model: it frees whatever the store holds of it; an
        attached module is detached (hooks removed, its tensors left as meta
        placeholders). BusyError (an InvalidArgumentError) while it is held
        (in a forward or use())."""
        with self._lock:
            m = self._model(name)
            self._sync()
            self._drain([name])
            self._core.remove(m)
            self._states.pop(name, None)
            self._detach(name)

    def close(self):
        """Detach every module (meta placeholders, hooks removed) and let the
        store go: its memory is freed now unless a view taken from it is still
        alive elsewhere (then when the last one goes)."""
        with self._lock:
            if self._core is None:
                return
            self._sync()
            try:
                self._drain()
            except errors.FerryError:
                pass  # closing: what failed to land stays where it was, and goes with the store
            for name in list(self._attached):
                self._detach(name)
            self._states = {}
            self._segs = {}  # (their views keep the store's memory)
            self._core = None

    # ---- forward hooks, holds and moves to the device ----
    # The forward hooks bring a model to the device and hold it while forward
    # runs; streaming models' prefetched blocks go when another model needs
    # the room.

    def _drain(self, names=None):
        """Land the queued moves of streaming models (names None: all) and
        drop their holds, before anything moves them by other means."""
        for n, a in list(self._attached.items()):
            if a.streamer is not None and (names is None or n in names):
                a.streamer.drain()

    def _install_hooks(self, name, a):
        # Each forward hook undoes the hold of its own thread's pre-hook, if
        # that pre-hook got as far as holding (torch 2.1+ runs an always_call
        # hook even when a pre-hook raised).
        def pre(mod, args):
            self._enter(name, hook=True)
            stack = self._tls.__dict__.setdefault("holds", [])
            stack.append(name)

        def post(mod, args, out):
            stack = self._tls.__dict__.get("holds")
            if stack and name in stack:
                del stack[len(stack) - 1 - stack[::-1].index(name)]
                self._leave(name, hook=True)

        a.hooks.append(a.module.register_forward_pre_hook(pre))
        a.hooks.append(_stream.register_post(a.module, post))

    def _own(self, name, m):
        """The indices of the tensors an attached module has of model name,
        when its files hold more (strict=False or keys= left some out: those
        stay in the store only and never come to the device with it); None
        for all of them."""
        a = self._attached.get(name)
        if a is None:
            return None
        if a.own is False:
            idx = sorted(i for i, *_ in a.plan)
            a.own = idx if len(idx) < len(m) else None
        return a.own

    def _enter(self, name, hook=False):
        """to_device (which also marks the model used now) and hold it all."""
        with self._lock:
            m = self._model(name)
            own = self._own(name, m)
            moving = not self._all_on_device(m, own)
            if moving:
                self._sync()
            try:
                self._to_device(m, own)
            finally:
                if moving:
                    self._refresh()
            self._extras_to(name)
            self._core.hold(m, -1)
            if hook:
                self._attached[name].hook_holds += 1

    def _to_device(self, m, idx=None):
        """core.to_device; when the room is short while streaming models hold
        blocks prefetched for their next step, those are let go and it is
        tried once more."""
        try:
            self._core.to_device(m, idx)
        except errors.BudgetError:
            if not any(a.streamer is not None and a.streamer.ops and n != m.name
                       for n, a in self._attached.items()):
                raise
            self._drain([n for n in self._attached if n != m.name])
            self._core.to_device(m, idx)

    def _leave(self, name, hook=False):
        with self._lock:
            core = self._core
            m = core.models.get(name) if core is not None else None
            if m is None:
                return  # removed or closed meanwhile: nothing is held any more
            if hook:
                a = self._attached.get(name)
                if a is None or a.hook_holds == 0:
                    return
                a.hook_holds -= 1
            core.release(m, -1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._core is None:
            return f"<ferry.torch.Store on {self.device} (closed)>"
        return f"<ferry.torch.Store on {self.device}: {', '.join(self._core.models) or 'no models'}>"
