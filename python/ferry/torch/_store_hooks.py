# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._store_hooks - how a Store runs an attached module: the
forward hooks that bring a model to the device and hold it while forward
runs, the holds they keep (_StoreHooks, a base of Store), and letting
streaming models' prefetched blocks go when another model needs the room.
"""
from .. import errors
from . import _stream


class _StoreHooks:
    """Store's forward hooks, holds and moves to the device (a base of Store;
    self is the Store)."""

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
