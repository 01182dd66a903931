"""_torch_stream - running an attached module larger than its device budget
block by block (Store.add(..., stream="auto")).

The module's repeated blocks (a ModuleList of same-class modules holding most
of its bytes, as diffusers' block-level offloading finds them; or the names
the caller gives) each become one group of the store's model, and the model
gets a plan (ferry_model_plan): a stable resident set and a window for the
streamed rest. Hooks then run each step:

- the module's forward pre-hook brings the tensors outside blocks to the
  device and holds them for the step; its forward hook releases them after the
  current stream;
- a block's pre-hook makes sure its move is queued (a prefetch usually did),
  holds it, orders the current stream after the move (no host sync) and points
  the block's parameters at the device copy;
- a block's forward hook releases it after the current stream (its memory is
  reused only once the kernels queued so far have run), lands its move and
  queues the moves of the next `prefetch` blocks of the pass (cyclically: the
  last block prefetches the next step's first ones).

The first step records the order the blocks really run in and the peak of
PyTorch's own allocations; the plan is then made again with them.
"""
import ctypes
import inspect
import time

import torch

from . import _lib, errors
from ._torch_match import _repoint

# torch 2.1+: forward hooks that run even when forward raises
_HOOK_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters

DEFAULT_PREFETCH = 2  # until the second step has measured the blocks (choose_prefetch)
PREFETCH_MAX = 4
_MARGIN = 512 << 20  # device bytes kept free beside PyTorch's measured peak


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


def spread(k, S, N):
    """Whether block k of N streams when S of them do: ferry_model_plan's
    rule (stream.c), streamed blocks spread evenly over the pass."""
    return (k + 1) * S // N != k * S // N


def predict_step(compute, copy, streams, prefetch):
    """The steady step time of a cyclic pass as the hooks run it: block b
    computes for compute[b] seconds, after block b - 1 and (when streams[b])
    after its copy, which takes copy[b] seconds; the copy engine copies the
    streamed blocks one at a time in pass order, the i-th only once the
    streamed block prefetch before it has computed (the window holds that
    one and the prefetch in flight). Three passes; the third is the answer."""
    N = len(compute)
    engine = t = 0.0
    ends = []  # compute end of every streamed block so far, in order
    start = 0.0
    for ps in range(3):
        if ps == 2:
            start = t
        for b in range(N):
            if streams[b]:
                i, back = len(ends), max(prefetch, 1)  # (prefetch 0: queued once the last one computed)
                free = ends[i - back] if i >= back else 0.0
                engine = max(engine, free) + copy[b]
                t = max(t, engine)
            t += compute[b]
            if streams[b]:
                ends.append(t)
    return t - start


SWITCH_GAIN = 0.05  # a measured prefetch replaces the current one only for this much less time


def choose_prefetch(compute, block_bytes, rate, plans, current=None):
    """(prefetch, {prefetch: predicted step seconds}): the smallest prefetch
    whose predicted step is within 1 % of the best, unless the current one's
    prediction is within SWITCH_GAIN of that (one step's timings are noisy,
    and a switch changes the resident set). compute: seconds per block,
    measured; block_bytes: each block's bytes; rate: the copy rate in
    bytes/s, measured; plans: {prefetch: streamed block count} from dry-run
    plans (a larger window leaves fewer blocks resident)."""
    N = len(compute)
    copy = [n / rate for n in block_bytes]
    pred = {}
    for p, S in sorted(plans.items()):
        pred[p] = predict_step(compute, copy, [spread(k, S, N) for k in range(N)], p)
    best = min(pred.values())
    pick = min(p for p, v in pred.items() if v <= best * 1.01)
    if current in pred and pred[current] <= pred[pick] * (1 + SWITCH_GAIN):
        pick = current
    return pick, pred


class _Block:
    __slots__ = ("name", "module", "idx", "leader", "c_idx", "c_out")

    def __init__(self, name, module, idx):
        self.name, self.module, self.idx = name, module, idx
        self.leader = idx[0]
        self.c_idx = (ctypes.c_int64 * len(idx))(*idx)  # for ferry_model_device_addrs
        self.c_out = (ctypes.c_uint64 * (3 * len(idx)))()


class Streamer:
    """The streaming state of one model of a Store (see the module's doc)."""

    def __init__(self, store, name, attached, spec, prefetch, reserve, pinned_cache):
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
        self.user_prefetch = prefetch is not None
        self.prefetch = DEFAULT_PREFETCH if prefetch is None else int(prefetch)
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, not {prefetch}")
        self.user_reserve = reserve
        self.pinned_cache = bool(pinned_cache)
        self.order = list(blocks)      # the pass order (recorded by the first step)
        self.pos = {b: k for k, b in enumerate(self.order)}
        self.recording = []            # the first step's order, while it runs
        self.steps = 0
        self.ops = {}                  # block -> Op queued and not yet landed (held)
        self.active = set()            # blocks whose forward runs now (their holds go by stream)
        self.params = {}               # (model index, dptr) -> Parameter / buffer view
        self.step_htod = []            # bytes moved to the device per step
        self.step_seconds = []
        self._t0 = None
        self._h0 = 0
        self.in_step = False
        self.moved_others = False
        self.replan_wanted = False
        self.plan = None
        self.streamed = set()          # the blocks the plan streams
        self.held = set()              # resident blocks held for the whole step (steps after the first)
        self.timing = None             # block -> [begin, end] (CUDA events or host seconds) while measured
        self.choice = None             # how the default prefetch was chosen (stats)
        self.rate = None               # the pinned copy rate, bytes/s (for the choice)
        self.make_plan(first=True)
        if not self.user_prefetch:
            # measured now, while none of this model's copies run (a probe
            # beside them would read low): a 64 MiB buffer copied twice is
            # near the limit already, and pinning it costs a few ms
            try:
                self.rate = core.dev.copy_rate(128 << 20) * 1e9
            except errors.FerryError:
                self.rate = None  # (the device cannot spare 64 MiB now: the prefetch stays)

    # ---- the plan ----

    def _budget(self, first):
        """(budget, reserve) for ferry_model_plan: the store's budget, and on a
        GPU no more than what the device has beside PyTorch's needs (the
        reserve: the caller's, else 2 GiB before the first step and a margin
        after it, when PyTorch's allocator holds what the step needed, so the
        device's free memory is already net of it)."""
        st = self.store._core.stats()
        budget = st["device_budget"]
        if self.store._tdev.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.store._tdev)
            have = st["tier_bytes"]["device"] + st["device_cached"] + free
            reserve = self.user_reserve if self.user_reserve is not None else (2 << 30) if first else _MARGIN
            # (never 0: ferry_model_plan reads a budget of 0 as "the store's")
            return min(budget, max(have - reserve, 1)), 0
        return budget, self.user_reserve or 0

    def make_plan(self, first=False):
        """Plan with a window of prefetch + 1 blocks; without a prefetch of the
        caller's, a window that does not fit shrinks (prefetch down to 1)."""
        budget, reserve = self._budget(first)
        while True:
            try:
                self.plan = self.store._core.plan(self.m, [b.leader for b in self.order], window=self.prefetch + 1,
                                                  budget=budget, reserve=reserve, pinned_cache=self.pinned_cache)
                break
            except errors.BudgetError:
                if self.user_prefetch or self.prefetch <= 1:
                    raise
                self.prefetch -= 1
        core = self.store._core
        self.streamed = {b for k, b in enumerate(self.order) if core.block_streams(self.m, k)}
        self.replan_wanted = False

    # ---- moves ----

    def _stream(self):
        if self.store._tdev.type == "cuda":
            return torch.cuda.current_stream(self.store._tdev).cuda_stream
        return 0  # sim: the caller's thread

    def _queue(self, b):
        if b in self.ops:
            return self.ops[b]
        core = self.store._core
        op = core.to_device_async(self.m, b.idx)
        self.moved_others = len(core.models) > 1  # its room may have come from another model
        try:
            core.pin(self.m, b.leader)  # a group with a held member stays whole
        except BaseException:
            op.wait()
            raise
        self.ops[b] = op
        return op

    def _show(self, b, fresh=False):
        """Point block b's tensors at their device copies: their addresses in
        one call (fresh: b.c_out holds them already), and a view only for a
        tensor whose address changed (cached per address; made from a view of
        the device block that holds it)."""
        core = self.store._core
        out = b.c_out if fresh else core.device_addrs(self.m, b.c_idx, len(b.idx), b.c_out)
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
        """Drop the holds of a step whose forward hook never ran (torch before
        2.1 skips it when forward raises)."""
        if self.in_step:
            core = self.store._core
            for i in self.fixed + [b.leader for b in self.held]:
                try:
                    core.unpin(self.m, i)
                except errors.FerryError:
                    pass
            self.held = set()
            self.in_step = False

    def _hold_resident(self):
        """Hold the plan's resident blocks for the whole step, as the tensors
        outside the blocks are, so that their own hooks do nothing but time
        them: no move to queue, hold, order, release or land per block (on a
        step bound by the host, at short sequences, those calls were most of
        what a resident block cost beyond its kernels)."""
        core = self.store._core
        res = [b for b in self.order if b not in self.streamed and b not in self.ops]
        missing = []
        for b in res:
            out = core.device_addrs(self.m, b.c_idx, len(b.idx), b.c_out)
            if any(out[3 * k] == 0 and self.entry_of[i][0].nbytes for k, i in enumerate(b.idx)):
                missing.extend(b.idx)
        if missing:  # (another model's moves, or a re-plan, took some since)
            self.store._sync()  # what their memory is reused for may still be read
            core.to_device(self.m, missing)
            self.moved_others = len(core.models) > 1
        for b in res:
            core.pin(self.m, b.leader)
            self.held.add(b)
        if not self.active:
            self._prefetch_step_start()  # (the copies start before the views are made)
        for b in res:
            self._show(b, fresh=not missing)  # (the addresses read above, unless moves followed)

    def step_begin(self):
        with self.store._lock:
            core = self.store._live()
            self.release_step()
            if self.replan_wanted:
                self.make_plan()
            self._t0 = time.perf_counter()
            self._h0 = core.stats()["bytes_htod"]
            if self.store._tdev.type == "cuda" and self.steps == 0:
                torch.cuda.reset_peak_memory_stats(self.store._tdev)
            if self.fixed:
                moving = not self.store._all_on_device(self.m, self.fixed)
                if moving:
                    self.store._sync()
                core.to_device(self.m, self.fixed)
                for i in self.fixed:
                    core.pin(self.m, i)
                self.store._refresh([self.name], self.fixed)
            self.in_step = True
            if self.steps == 2 and self.timing is not None:
                self._choose()  # (before this step queues or holds anything)
            if self.steps == 1 and not self.user_prefetch and self.streamed:
                self.timing = {}  # the first steady step measures its blocks
            if self.steps == 0:
                self.recording = []
            else:
                self._hold_resident()  # (which queues the step's first prefetches)

    def step_end(self):
        with self.store._lock:
            core = self.store._core
            if core is None or not self.in_step:
                return
            self.in_step = False
            s = self._stream()
            held, self.held = self.held, set()
            for i in self.fixed + [b.leader for b in held]:
                core.release_after(self.m, i, s)
            if self.steps == 0 and self.recording:
                seen = set(self.recording)
                order = self.recording + [b for b in self.order if b not in seen]
                if order != self.order:
                    self.order = order
                    self.pos = {b: k for k, b in enumerate(order)}
                self.make_plan()  # with the real order and PyTorch's measured needs
            if self.moved_others:
                # other models' tensors the step's moves evicted: their modules
                # point at meta placeholders again, as after any store call
                self.store._refresh([n for n in core.models if n != self.name])
                self.moved_others = False
            self.steps += 1
            self.step_htod.append(core.stats()["bytes_htod"] - self._h0)
            self.step_seconds.append(time.perf_counter() - self._t0)

    def block_begin(self, b):
        with self.store._lock:
            self.store._live()
            if self.steps == 0 and self.in_step:
                self.recording.append(b)
            if b in self.held:
                self._time_begin(b)
                return
            op = self._queue(b)
            self.active.add(b)
            op.stream_wait(self._stream())
            self._show(b)
            if self.in_step:
                self._time_begin(b)

    def block_end(self, b):
        with self.store._lock:
            core = self.store._core
            if core is None:
                return
            self.active.discard(b)
            if self.timing is not None and b in self.timing:
                self.timing[b].append(self._mark())
            if b in self.held:
                self._prefetch(self.pos[b])
                return
            op = self.ops.pop(b, None)
            if op is None:
                return  # its pre-hook failed
            try:
                core.release_after(self.m, b.leader, self._stream())
            finally:
                op.wait()  # lands it (its copy was queued a block or more ago)
            if self.steps == 0 and self.recording != self.order[:len(self.recording)]:
                return  # the blocks run in another order than listed: no guessing until it is known
            self._prefetch(self.pos[b])

    def _time_begin(self, b):
        if self.timing is None:
            return
        if b in self.timing:
            self.timing = None  # a block ran twice in the step: nothing to go by
        else:
            self.timing[b] = [self._mark()]

    def _mark(self):
        """A point in the current stream's work: a timing event (cuda), else the host's clock."""
        if self.store._tdev.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.store._tdev))
            return ev
        return time.perf_counter()

    def _choose(self):
        """The default prefetch from what the last step measured: each block's
        compute time (from its start, its copy landed, to its end) and the
        device's pinned copy rate, through predict_step for each window the
        budget allows; re-plan when it differs."""
        timing, self.timing = self.timing, None
        try:
            if any(len(timing.get(b, ())) != 2 for b in self.order):
                return  # a block did not run: nothing to go by
            if self.store._tdev.type == "cuda":
                for b in self.order:
                    timing[b][1].synchronize()
                compute = [timing[b][0].elapsed_time(timing[b][1]) / 1e3 for b in self.order]
            else:
                compute = [timing[b][1] - timing[b][0] for b in self.order]
            core = self.store._core
            size = {}
            for b in self.order:
                size[b] = sum(self.entry_of[i][0].nbytes for i in b.idx)
            rate = self.rate
            if not rate:
                return
            budget, reserve = self._budget(False)
            plans = {}
            for p in range(1, PREFETCH_MAX + 1):
                try:
                    got = core.plan(self.m, [b.leader for b in self.order], window=p + 1, budget=budget,
                                    reserve=reserve, pinned_cache=self.pinned_cache, dry_run=True)
                except errors.BudgetError:
                    break
                plans[p] = got["streamed_blocks"]
            if not plans:
                return
            p, pred = choose_prefetch(compute, [size[b] for b in self.order], rate, plans, current=self.prefetch)
            self.choice = {"compute_s": sum(compute), "copy_gbps": rate / 1e9,
                           "predicted_s": {k: round(v, 6) for k, v in pred.items()}, "prefetch": p,
                           "was": self.prefetch}
            if p != self.prefetch:
                self.prefetch = p
                self.make_plan()
        except (errors.FerryError, RuntimeError, ValueError):
            pass  # (a timing event torch will not read, say): the prefetch stays

    def _prefetch_step_start(self):
        """No block runs yet, so the window has room for one more than the
        prefetch: queue it now (the prefetches the last step made have landed
        while the step ended: the copy engine would otherwise idle until the
        first streamed block has run; on the H200 that was 15-20 ms of each
        step)."""
        self._prefetch(len(self.order) - 1, self.prefetch + 1)

    def _prefetch(self, k, limit=None):
        """Queue the next blocks after position k of the pass (cyclically)
        until `prefetch` (or limit) of them that stream are in flight:
        resident blocks need no copy, so counting them would leave the copy
        engine idle where several come in a row."""
        if not self.streamed:
            return
        n = len(self.order)
        # (the step's start passes k = n - 1 and a limit: every block of the
        # pass, from the first; after block k, every other one)
        span = n if limit is None else n + 1
        limit = self.prefetch if limit is None else limit
        flying = sum(1 for b in self.ops if b in self.streamed)
        for j in range(1, span):
            if flying >= limit:
                break
            nb = self.order[(k + j) % n]
            if nb in self.streamed and nb not in self.ops:  # (those queued are counted already)
                self._queue(nb)
                flying += 1

    def drain(self):
        """Land every queued move and drop its hold (before the model is
        offloaded, removed, or its budget changes): the prefetches only; a
        block whose forward runs now (another thread's) keeps its move and
        hold, which its forward hook releases after its stream."""
        core = self.store._core
        err = None
        for b, op in list(self.ops.items()):
            if b in self.active:
                continue
            try:
                op.wait()
            except errors.FerryError as e:
                err = err or e
            try:
                core.unpin(self.m, b.leader)
            except errors.FerryError:
                pass
        for b in list(self.ops):
            if b not in self.active:
                del self.ops[b]
        if err is not None:
            raise err

    def close(self):
        """Forget the views and modules (the store is detaching the module):
        no cycle keeps the store's memory alive after this."""
        self.params.clear()
        self.ops.clear()
        self.entry_of = {}
        self.blocks = self.order = []
        self.pos = {}
        self.a = self.store = None

    def install(self):
        def pre(mod, args):
            self.step_begin()

        def post(mod, args, out):
            self.step_end()

        a = self.a
        a.hooks.append(a.module.register_forward_pre_hook(pre))
        a.hooks.append(register_post(a.module, post))
        for b in self.blocks:
            a.hooks.append(b.module.register_forward_pre_hook(lambda mod, args, b=b: self.block_begin(b)))
            a.hooks.append(register_post(b.module, lambda mod, args, out, b=b: self.block_end(b)))

    def stats(self):
        steady = self.step_htod[1:] or self.step_htod
        return {
            "blocks": len(self.blocks),
            "order": [b.name for b in self.order],
            "prefetch": self.prefetch,
            "prefetch_choice": self.choice,
            "plan": dict(self.plan or {}),
            "resident_blocks": (self.plan or {}).get("resident_blocks"),
            "streamed_blocks": (self.plan or {}).get("streamed_blocks"),
            "resident_bytes": (self.plan or {}).get("resident_bytes"),
            "window_bytes": (self.plan or {}).get("window_bytes"),
            "planned_streamed_bytes": (self.plan or {}).get("streamed_bytes"),
            "steps": self.steps,
            "bytes_per_step": list(self.step_htod),
            "streamed_bytes_per_step": (sum(steady) // len(steady)) if steady else 0,
            "seconds_per_step": list(self.step_seconds),
        }


def register_post(module, fn):
    """module.register_forward_hook(fn), run even when forward raises where torch can."""
    if _HOOK_ALWAYS_CALL:
        return module.register_forward_hook(fn, always_call=True)
    return module.register_forward_hook(fn)
