# SPDX-License-Identifier: Apache-2.0
"""load_file(progress=True): a tqdm bar in bytes, tqdm imported only then
(a fake tqdm module here, so the test needs no tqdm); without tqdm one line
on stderr."""
import struct
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import ferry.torch  # noqa: E402


def write_st(path):
    import json
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + struct.pack("<6f", *range(6)))


class FakeBar:
    made = []

    def __init__(self, total, unit, **kw):
        self.total, self.unit, self.n, self.closed = total, unit, 0, False
        FakeBar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    """A small checkpoint, with the fake tqdm installed and no bar made yet."""
    p = tmp_path / "m.safetensors"
    write_st(p)
    FakeBar.made = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    return p


@pytest.mark.parametrize("owner,device", [("torch", "cpu"), ("ferry", "cpu"), ("ferry", "sim:64MiB")])
def test_progress_true_fake_tqdm(ckpt, owner, device):
    sd = ferry.torch.load_file(ckpt, device, owner=owner, progress=True)
    assert sorted(sd) == ["a", "b"]
    assert len(FakeBar.made) == 1
    bar = FakeBar.made[0]
    assert (bar.total, bar.n, bar.unit, bar.closed) == (24, 24, "B", True)


def test_progress_true_without_tqdm(tmp_path, monkeypatch, capsys):
    p = tmp_path / "m.safetensors"
    write_st(p)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    ferry.torch.load_file(p, "sim:64MiB", owner="ferry", progress=True)
    assert "m.safetensors: 24 of 24 bytes" in capsys.readouterr().err


def test_progress_off_by_default(ckpt):
    ferry.torch.load_file(ckpt, "sim:64MiB", owner="ferry")
    ferry.torch.load_file(ckpt, "sim:64MiB", owner="ferry", progress=False)
    assert FakeBar.made == []


def test_progress_real_tqdm(tmp_path, capsys):
    pytest.importorskip("tqdm")
    p = tmp_path / "m.safetensors"
    write_st(p)
    ferry.torch.load_file(p, "sim:64MiB", owner="ferry", progress=True)
    assert "m.safetensors" in capsys.readouterr().err


def test_load_into_progress_true(ckpt):
    m = torch.nn.Module()
    m.register_buffer("a", torch.zeros(4))
    m.register_buffer("b", torch.zeros(2))
    ferry.torch.load_model(m, ckpt, progress=True)
    assert m.a.tolist() == [0, 1, 2, 3]
    bar, = FakeBar.made
    assert (bar.total, bar.n, bar.closed) == (24, 24, True)
