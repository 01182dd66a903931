# SPDX-License-Identifier: Apache-2.0
"""The store with a keeper from Python: StoreCore(keeper=) and
ferry.torch.Store(keeper=) against a `ferry keep` started from the CLI built
beside libferry.so (skipped where there is none). A first store reads the
checkpoint and feeds the keeper; a fresh one is served it, bytes_read 0, the
same bytes; keeper=True finds the default socket; no keeper running raises;
a keeper killed meanwhile costs only the cache."""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import stwriter
from ferry import _core, _lib, _store

SIM = "sim:1GiB"
NAMES = [f"blk.{k}.{w}" for k in range(4) for w in ("w", "b")]


def _size(name):
    return 200_000 if name.endswith(".w") else 24


def _bytes(name, seed):
    return bytes((seed * 13 + len(name) * 7 + i * 31 + (i >> 8)) & 0xFF for i in range(_size(name)))


TOTAL = sum(_size(n) for n in NAMES)


def write_model(path, seed=1):
    stwriter.write(str(path), [(n, "U8", [_size(n)], _bytes(n, seed)) for n in NAMES])
    return path


def _cli():
    exe = os.path.join(os.path.dirname(_lib.path), "ferry")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"no ferry CLI beside {_lib.path} to run a keeper")
    return exe


def _answers(sock):
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(sock)
            return True
        except OSError:
            return False


class Keeper:
    """`ferry keep` in a subprocess: on sock, or with sock None on the
    default socket of the XDG_RUNTIME_DIR the caller set."""

    def __init__(self, sock, where):
        args = [_cli(), "keep", "--device", "sim:64MiB"] + (["--socket", sock] if sock else [])
        self.sock = sock or os.path.join(os.environ["XDG_RUNTIME_DIR"], "ferry", "keep.sock")
        self.log = open(os.path.join(where, "keeper.log"), "ab")
        self.proc = subprocess.Popen(args, stderr=self.log, stdout=self.log)
        t0 = time.monotonic()
        while not _answers(self.sock):
            if self.proc.poll() is not None or time.monotonic() - t0 > 10:
                self.close()
                raise AssertionError(f"the keeper did not start (log in {where})")
            time.sleep(0.02)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            assert self.proc.wait(10) == 0
        self.log.close()


@pytest.fixture
def where():
    d = tempfile.mkdtemp(prefix="fk-", dir="/tmp")
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def load(path, keeper):
    """A fresh StoreCore (keeper=) with the model moved to the device: its
    stats, and each tensor's bytes read back from the store."""
    core = _store.StoreCore(_core.device(SIM), keeper=keeper)
    handles, infos = core.open_files([str(path)])
    m = core.add("m", handles, infos)
    core.to_device(m)
    got = {}
    for i, t in enumerate(infos):
        buf = ctypes.create_string_buffer(t.nbytes)
        core.read(m, i, ctypes.addressof(buf))
        got[t.name] = buf.raw
    st = core.stats()
    del core
    return st, got


def test_core_fed_then_served(where):
    path = write_model(os.path.join(where, "m.safetensors"))
    k = Keeper(os.path.join(where, "k.sock"), where)
    try:
        st, got = load(path, None)
        assert st["bytes_read"] == TOTAL and st["bytes_from_keeper"] == 0 and not st["keeper"]["used"]
        st, got = load(path, k.sock)
        assert st["bytes_read"] == TOTAL
        assert st["keeper"]["used"] and st["keeper"]["connected"]
        assert st["keeper"]["bytes_fed"] == TOTAL and st["keeper"]["misses"] == len(NAMES)
        st, got = load(path, k.sock)
        assert st["bytes_read"] == 0
        assert st["bytes_from_keeper"] == TOTAL and st["keeper"]["hits"] == len(NAMES)
        assert got == {n: _bytes(n, 1) for n in NAMES}
        # a changed checkpoint is read again, never served stale
        write_model(path, seed=2)
        st, got = load(path, k.sock)
        assert st["bytes_read"] == TOTAL and st["keeper"]["stale"] == 1
        assert got == {n: _bytes(n, 2) for n in NAMES}
    finally:
        k.close()


def test_default_socket_and_errors(where, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", where)  # (the library's getenv sees it)
    assert _store.keeper_socket() == os.path.join(where, "ferry", "keep.sock")
    path = write_model(os.path.join(where, "m.safetensors"))
    with pytest.raises(OSError) as e:  # nothing runs there yet
        _store.StoreCore(_core.device(SIM), keeper=True)
    assert isinstance(e.value, (FileNotFoundError, ConnectionRefusedError))
    assert "no keeper is running there" in str(e.value)
    with pytest.raises(TypeError):
        _store.StoreCore(_core.device(SIM), keeper=3)
    k = Keeper(None, where)
    try:
        assert load(path, True)[0]["keeper"]["bytes_fed"] == TOTAL
        st, got = load(path, True)
        assert st["bytes_read"] == 0 and got == {n: _bytes(n, 1) for n in NAMES}
    finally:
        k.close()


def test_keeper_killed(where):
    path = write_model(os.path.join(where, "m.safetensors"))
    k = Keeper(os.path.join(where, "k.sock"), where)
    try:
        core = _store.StoreCore(_core.device(SIM), keeper=k.sock)
        handles, infos = core.open_files([str(path)])
        m = core.add("m", handles, infos)
        core.to_device(m)
        core.evict(m)
    finally:
        k.kill()
    core.to_device(m)  # from the checkpoint
    st = core.stats()
    assert st["bytes_read"] == 2 * TOTAL
    assert st["keeper"]["errors"] >= 1 and not st["keeper"]["connected"]
    assert k.sock in st["keeper"]["last_error"]
    buf = ctypes.create_string_buffer(_size(NAMES[0]))
    core.read(m, 0, ctypes.addressof(buf))
    assert buf.raw == _bytes(NAMES[0], 1)


def test_torch_store_keeper(where):
    torch = pytest.importorskip("torch")
    import ferry.torch as ft
    path = write_model(os.path.join(where, "m.safetensors"))
    k = Keeper(os.path.join(where, "k.sock"), where)
    try:
        for served in (False, True):
            with ft.Store(SIM, keeper=k.sock) as store:
                store.add("m", str(path))
                store.to_device("m")
                st = store.stats()
                assert st["bytes_read"] == (0 if served else TOTAL)
                assert st["bytes_from_keeper"] == (TOTAL if served else 0)
                for n in NAMES:
                    assert bytes(store.read("m", n).reshape(-1).view(torch.uint8).tolist()) == _bytes(n, 1)
        with ft.Store(SIM) as store:  # use_keeper later
            store.use_keeper(k.sock)
            store.add("m", str(path))
            store.to_device("m")
            assert store.stats()["bytes_read"] == 0
        with pytest.raises(OSError):
            ft.Store(SIM, keeper=os.path.join(where, "none.sock"))
    finally:
        k.close()
