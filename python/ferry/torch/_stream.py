# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._stream - running an attached module larger than its device budget
block by block (Store.add(..., stream="auto")), through the library's
streaming engine (ferry_streamer_*, see ferry.h).

The module's repeated blocks (a ModuleList of same-class modules holding most
of its bytes, as diffusers' block-level offloading finds them; or the names
the caller gives) each become one group of the store's model, and the engine
owns the pass: plan, moves queued ahead, ordering the current CUDA stream
after each move, release after it, retries when room runs short. What stays
here is what only PyTorch knows:

- hooks: the module's forward pre-hook starts a pass, each block's pre-hook
  and forward hook tell the engine the block is about to run and has run, on
  the current stream; the module's forward hook ends the pass;
- re-pointing: before a block runs, its parameters become views of the
  device memory the engine put it in;
- PyTorch's own allocations: after the first step (and the first after
  remeasure()) the engine plans again for the device memory PyTorch's
  allocator left free;
- yielding: a step that runs the device out of memory (PyTorch's
  allocation or ferry's own) gives back resident blocks and runs again, with
  that much more of the device left free from then on.
"""
import ctypes
import errno
import inspect
import logging
import re
import time

import torch

from .. import _lib, errors
from ._match import _repoint

# torch 2.1+: forward hooks that run even when forward raises
_HOOK_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters

_MARGIN = 512 << 20  # device bytes kept free beside PyTorch's measured peak
_SLACK = 16          # the store's free device pieces may take it 1/16 past its budget (arena.c)
_NO_FORWARD = object()


def out_of_memory(e):
    """Whether exception e says the device ran out of memory: PyTorch's
    allocator (torch.cuda.OutOfMemoryError), a library's workspace (cuBLAS,
    cuDNN: a RuntimeError naming the allocation), or ferry's own device
    memory (-ENOMEM from the driver, or a budget it could not make room in)."""
    if isinstance(e, torch.cuda.OutOfMemoryError) or isinstance(e, errors.BudgetError):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:
        return True
    if isinstance(e, RuntimeError):
        text = str(e)
        return "out of memory" in text or "ALLOC_FAILED" in text or "CUDA_ERROR_OUT_OF_MEMORY" in text
    return False


def _asked(e):
    """The bytes a PyTorch allocation that failed asked for, or 0."""
    m = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", str(e))
    if not m:
        return 0
    return int(float(m.group(1)) * 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(m.group(2)))


def _param_bytes(mod):
    seen, n = set(), 0
    for t in list(mod.parameters()) + list(mod.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


def find_blocks(module, spec):
    """[(qualified name, submodule)] of the blocks to stream, in module order.
    spec "auto": every ModuleList/Sequential of at least two modules of one
    class that is not inside another such block list, when together they hold
    at least half the module's bytes. spec a list of names: each names a
    block, or a ModuleList/Sequential whose children are the blocks."""
    named = dict(module.named_modules())
    if spec == "auto":
        lists = []
        for name, m in module.named_modules():
            if not isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) or len(m) < 2:
                continue
            kinds = {type(c) for c in m.children()}
            if len(kinds) != 1 or any(name.startswith(o + ".") for o, _ in lists):
                continue
            lists.append((name, m))
        blocks = [(f"{n}.{k}" if n else str(k), c) for n, m in lists for k, c in enumerate(m.children())]
        total = _param_bytes(module)
        got = sum(_param_bytes(c) for _, c in blocks)
        if not blocks or got * 2 < total:
            raise ValueError(f"stream=\"auto\": found no repeated blocks in this {type(module).__name__} "
                             f"(no ModuleList of same-class modules holding most of its {total} bytes; "
                             f"{got} bytes in the ones found): pass stream=[names of its blocks]")
        return blocks
    if isinstance(spec, str) or not hasattr(spec, "__iter__"):
        raise TypeError(f"stream must be None, \"auto\" or a list of module names, not {spec!r}")
    blocks = []
    for name in spec:
        if name not in named or not name:
            raise ValueError(f"stream: this {type(module).__name__} has no submodule called {name!r}")
        m = named[name]
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            blocks.extend((f"{name}.{k}", c) for k, c in enumerate(m.children()))
        else:
            blocks.append((name, m))
    if len(blocks) < 1:
        raise ValueError("stream: no blocks given")
    return blocks


class _Block:
    __slots__ = ("name", "module", "idx", "leader", "c_idx", "c_out")

    def __init__(self, name, module, idx):
        self.name, self.module, self.idx = name, module, idx
        self.leader = idx[0]
        self.c_idx = (ctypes.c_int64 * len(idx))(*idx)  # for ferry_model_device_addrs
        self.c_out = (ctypes.c_uint64 * (3 * len(idx)))()


class Streamer:
    """The streaming state of one model of a Store (see the module's doc)."""

    def __init__(self, store, name, attached, spec, prefetch, reserve, copies):
        self.store, self.name, self.a = store, name, attached
        core = store._core
        self.m = core.models[name]
        module = attached.module
        by_key = {}  # checkpoint key -> model index, for the module's tensors
        self.entry_of = {}  # model index -> (info, dtype, entries)
        for idx, info, dt, entries in attached.plan:
            self.entry_of[idx] = (info, dt, entries)
            for key, *_ in entries:
                by_key[key] = idx
        blocks = []
        in_block = set()
        for bname, bmod in find_blocks(module, spec):
            pre = bname + "."
            idx = sorted({i for key, i in by_key.items() if key.startswith(pre)})
            idx = [i for i in idx if i not in in_block]
            if not idx:
                continue  # a block without weights of its own: nothing to stream
            in_block.update(idx)
            blocks.append(_Block(bname, bmod, idx))
        if not blocks:
            raise ValueError(f"model \"{name}\": none of the blocks found holds a tensor of the checkpoint")
        self.blocks = blocks
        self.fixed = [i for i in self.entry_of if i not in in_block]
        for b in blocks:
            core.group(self.m, b.idx)
        if prefetch is not None and int(prefetch) < 0:
            raise ValueError(f"prefetch must be >= 0, not {prefetch}")
        # (the engine's 0 is its default, its -1 none)
        self.prefetch = 0 if prefetch is None else (-1 if int(prefetch) == 0 else int(prefetch))
        self.user_reserve = reserve
        self.copies = copies
        self.k_of = {b: k for k, b in enumerate(blocks)}
        self.steps = 0
        self.measured = False          # a step ran since PyTorch's needs were last to be measured
        self.active = set()            # blocks whose forward runs now
        self.params = {}               # (model index, dptr) -> Parameter / buffer view
        self.step_htod = []            # bytes moved to the device per step
        self.step_seconds = []
        self._t0 = None
        self.in_step = False
        self.replan_wanted = False
        self.yielded = 0               # device bytes left free beyond the reserve: steps that ran out gave them back
        self.yields = 0                # steps run again after the device ran out of memory
        self._forward = _NO_FORWARD    # the module's own forward attribute, while run() wraps it
        budget, reserve = self._budget()
        # (the passes bring the module's own tensors outside the blocks, not
        # the checkpoint's others: a tokenizer, tensors the module lacks)
        self.engine = core.streamer(self.m, [b.leader for b in blocks], prefetch=self.prefetch, budget=budget,
                                    reserve=reserve, copies=copies, fixed=self.fixed)

    @property
    def ops(self):
        """Whether moves may be queued ahead (held until they land)."""
        return self.engine is not None and self.steps > 0

    # ---- the budget ----

    def _budget(self):
        """(budget, reserve) for the engine: the store's budget, and on a GPU
        no more than what the device has beside PyTorch's needs (the reserve:
        the caller's, else 2 GiB until a step has run since the needs were
        last to be measured (the first step, or after remeasure()) and a
        margin after it, when PyTorch's allocator holds what the step needed,
        so the device's free memory is already net of it), less what steps
        that ran out of memory gave back, and less the store's free pieces
        (which may take it 1/16 past the tensors' bytes)."""
        st = self.store._core.stats()
        budget = st["device_budget"]
        if self.store._tdev.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.store._tdev)
            have = st["tier_bytes"]["device"] + st["device_cached"] + free
            reserve = self.user_reserve if self.user_reserve is not None else _MARGIN if self.measured else 2 << 30
            room = max(have - reserve - self.yielded, 0) * _SLACK // (_SLACK + 1)
            # (never 0: the engine reads a budget of 0 as "the store's")
            return min(budget, max(room, 1)), 0
        return max(budget - self.yielded, 1), self.user_reserve or 0

    def _replan(self):
        budget, reserve = self._budget()
        try:
            self.engine.set_budget(budget, reserve)
        except errors.BudgetError:
            pass  # below the minimum now: the passes shrink as they must, and say so if even that fails
        self.replan_wanted = False

    # ---- moves ----

    def _stream(self):
        if self.store._tdev.type == "cuda":
            return torch.cuda.current_stream(self.store._tdev).cuda_stream
        return 0  # sim: the caller's thread

    @torch.inference_mode(False)
    def _show(self, b):
        """Point block b's tensors at their device copies: their addresses in
        one call, and a view only for a tensor whose address changed (cached
        per address; made from a view of the device block that holds it).
        Out of inference mode, as Store._refresh."""
        core = self.store._core
        out = core.device_addrs(self.m, b.c_idx, len(b.idx), b.c_out)
        shown = self.a.shown
        for k, i in enumerate(b.idx):
            d = out[3 * k]
            if shown.get(i) == (_lib.TIER_DEVICE, d):
                continue
            key = (i, d)
            new = self.params.get(key)
            if new is None:
                if len(self.params) > 8 * len(self.entry_of):
                    self.params.clear()  # addresses the store no longer uses
                info, dt, entries = self.entry_of[i]
                base = out[3 * k + 1]
                if base:
                    view = self.store._seg_view(core, base, out[3 * k + 2], d, info, dt)
                else:
                    view = self.store._view(core, d, info, dt)
                grads = [e[4] for e in entries if e[3]]
                new = torch.nn.Parameter(view, requires_grad=grads[0]) if grads else view
                self.params[key] = new
            _repoint(self.entry_of[i][2], new, keep=False)
            shown[i] = (_lib.TIER_DEVICE, d)

    # ---- hooks ----

    def release_step(self):
        """End a step whose forward hook never ran (torch before 2.1 skips it
        when forward raises): its holds go after the current stream."""
        if self.in_step:
            self.in_step = False
            self.active.clear()
            self.engine.pass_end(self._stream())

    def step_begin(self):
        with self.store._lock:
            self.store._live()  # (raises once the store is closed)
            if self.replan_wanted:
                self._replan()
            self._t0 = time.perf_counter()
            if self.store._tdev.type == "cuda" and self.steps == 0:
                torch.cuda.reset_peak_memory_stats(self.store._tdev)
            others_there = any(n != self.name and any(t == _lib.TIER_DEVICE for t, _ in st)
                               for n, st in self.store._states.items())
            if others_there or not self.store._all_on_device(self.m, self.fixed):
                # memory the pass's moves take from other models may still be
                # read by kernels queued before (they were not released after
                # a stream); with none of theirs on the device, only this
                # model's own releases are in play, and those are ordered
                self.store._sync()
            self.active.clear()
            self.in_step = False
            self.engine.pass_begin(self._stream())
            self.in_step = True
            if self.fixed:
                self.store._refresh([self.name], self.fixed)
            self.store._extras_to(self.name)  # the module's tensors outside the checkpoint follow it

    def step_end(self):
        with self.store._lock:
            core = self.store._core
            if core is None or not self.in_step:
                return
            self.in_step = False
            self.engine.pass_end(self._stream())
            if not self.measured:
                self.measured = True
                self._replan()  # with PyTorch's measured needs
            if len(core.models) > 1:
                # other models' tensors the step's moves evicted: their modules
                # point at meta placeholders again, as after any store call
                self.store._refresh([n for n in core.models if n != self.name])
            self.steps += 1
            st = self.engine.stats()
            self.step_htod.append(st["pass_htod"])
            self.step_seconds.append(time.perf_counter() - self._t0)

    def block_begin(self, b):
        with self.store._lock:
            self.store._live()
            self.engine.block_begin(self.k_of[b], self._stream())
            self.active.add(b)
            self._show(b)

    def block_end(self, b):
        with self.store._lock:
            core = self.store._core
            if core is None or b not in self.active:
                return  # removed meanwhile, or its pre-hook failed
            self.active.discard(b)
            self.engine.block_end(self.k_of[b], self._stream())

    def remeasure(self):
        """Measure PyTorch's needs again: the next step keeps 2 GiB free (or
        the caller's reserve) and the plan after it leaves what that step
        took."""
        self.measured = False
        self.replan_wanted = True

    # ---- steps that yield ----

    def run(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) as one step (a pass over the blocks): begun
        here unless a step is running already (a call nested in one). When it
        runs the device out of memory, the pass ends, the store gives back
        resident blocks (make_room) and the freed memory stays free from then
        on, and fn runs again; the error goes to the caller only when the
        plan is at its minimum and nothing more can be given."""
        if self.in_step:
            return fn(*args, **kwargs)
        while True:
            try:
                self.step_begin()
                out = fn(*args, **kwargs)
            except BaseException as e:
                self.release_step()
                if not out_of_memory(e) or not self._give_back(e):
                    raise
                continue
            self.step_end()
            return out

    def _give_back(self, e):
        """After a step ran out of device memory: leave more of the device
        free (an eighth of the budget, or what PyTorch asked for and a margin
        when that is more; no more than the plan can lose) and make it free
        now. False when the plan is at its minimum already."""
        with self.store._lock:
            if self.store._core is None or self.engine is None:
                return False
            st = self.engine.stats()
            spare = st["budget"] - st["minimum_bytes"]
            if spare <= 0:
                return False
            asked = _asked(e)
            step = min(max(st["budget"] // 8, asked + _MARGIN if asked else 0), spare)
            self.yielded += step
            self.yields += 1
        logging.getLogger("ferry").warning(
            "ferry: model \"%s\" ran the device out of memory in a step (%s); it gives back %d MiB and runs the "
            "step again", self.name, str(e).splitlines()[0][:200], step >> 20)
        if self.store._tdev.type == "cuda":
            torch.cuda.synchronize(self.store._tdev)
            torch.cuda.empty_cache()
        try:
            self.store.make_room(step)
        except errors.BudgetError:
            pass  # as much as could go went: the smaller plan does the rest
        with self.store._lock:
            if self.engine is not None:
                self._replan()
        return True

    def drain(self):
        """Land every move queued ahead and drop its hold (before the model is
        offloaded, removed, or its budget changes); a block whose forward
        runs now (another thread's) keeps its move and hold, which its
        forward hook releases after its stream."""
        if self.engine is not None:
            self.engine.drain()

    def close(self):
        """Free the engine and forget the views and modules (the store is
        detaching the module): no cycle keeps the store's memory alive after
        this."""
        if self.a is not None:
            self.uninstall()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.params.clear()
        self.entry_of = {}
        self.blocks = []
        self.k_of = {}
        self.a = self.store = None

    def install(self):
        """Each call of the module's forward is a step (run(): begun, ended,
        run again where it ran the device out of memory); each block's
        hooks tell the engine it runs."""
        a = self.a
        mod = a.module
        self._forward = mod.__dict__.get("forward", _NO_FORWARD)
        inner = mod.forward

        def forward(*args, **kwargs):
            return self.run(inner, *args, **kwargs)

        mod.forward = forward
        for b in self.blocks:
            a.hooks.append(b.module.register_forward_pre_hook(lambda mod, args, b=b: self.block_begin(b)))
            a.hooks.append(register_post(b.module, lambda mod, args, out, b=b: self.block_end(b)))

    def uninstall(self):
        """The module's own forward back (the block hooks go with a.hooks)."""
        if self._forward is _NO_FORWARD:
            self.a.module.__dict__.pop("forward", None)
        else:
            self.a.module.forward = self._forward
        self._forward = _NO_FORWARD

    def stats(self):
        st = self.engine.stats()
        steady = self.step_htod[1:] or self.step_htod
        order = sorted(self.blocks, key=lambda b: self.engine.position(self.k_of[b]))
        plan = {k: st[k] for k in ("blocks", "resident_blocks", "streamed_blocks", "fixed_bytes", "resident_bytes",
                                   "window_bytes", "streamed_bytes", "budget", "minimum_bytes")}
        out = dict(st)
        out.update({
            "order": [b.name for b in order],
            "plan": plan,
            "planned_streamed_bytes": st["streamed_bytes"],
            "steps": self.steps,
            "bytes_per_step": list(self.step_htod),
            "streamed_bytes_per_step": (sum(steady) // len(steady)) if steady else 0,
            "seconds_per_step": list(self.step_seconds),
            "yields": self.yields,
            "yielded_bytes": self.yielded,
        })
        return out


def register_post(module, fn):
    """module.register_forward_hook(fn), run even when forward raises where torch can."""
    if _HOOK_ALWAYS_CALL:
        return module.register_forward_hook(fn, always_call=True)
    return module.register_forward_hook(fn)
