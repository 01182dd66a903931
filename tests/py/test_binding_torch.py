# SPDX-License-Identifier: Apache-2.0
"""ferry.torch.load_file against independent writers: real torch.save (views,
shared storages, nested dicts), the reference safetensors package, ferry's
own safetensors and GGUF writers. Zero-copy and copy-on-write behaviour, the
file's lifetime, dtypes, errors, progress, and ferry-owned loads exported
through DLPack on the simulated GPU."""
import gc
import os
import weakref

import pytest

import conftest
import ferry
import gguf_writer
import stwriter

torch = pytest.importorskip("torch")
import ferry.torch as ft  # noqa: E402
from ferry import _dlpack  # noqa: E402

TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64]
FERRY_NAME = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
              torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64"}


def raw(t):
    """A tensor's bytes in row-major order."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.dtype != torch.bool else \
        bytes(t.reshape(-1).to(torch.uint8).tolist())


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


def rand(dtype, shape, seed):
    n = 1
    for d in shape:
        n *= d
    es = torch.empty((), dtype=dtype).element_size()
    b = conftest.raw_bytes(seed, n * es, "BOOL" if dtype == torch.bool else "U8")
    if not b:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dtype).reshape(shape).clone()


def flatten(obj, prefix=""):
    """Name tensors as ferry documents for PyTorch checkpoints."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def st_file(path, tensors, metadata=None):
    data = {n: conftest.raw_bytes(seed, stwriter.nbytes(d, s), d) for n, d, s, seed in tensors}
    stwriter.write(str(path), [(n, d, s, data[n]) for n, d, s, _ in tensors], metadata=metadata)
    return data


def mapped(path):
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


# ---- torch.save ------------------------------------------------------------

def test_torch_save_all_dtypes(tmp_path):
    sd = {f"t.{str(dt)[6:]}": rand(dt, (3, 5), i) for i, dt in enumerate(TORCH_DTYPES)}
    sd.update({"scalar": torch.tensor(2.5), "empty": torch.empty(0, 3, dtype=torch.bfloat16),
               "big": rand(torch.float32, (300, 257), 50)})
    p = tmp_path / "all.pt"
    torch.save(sd, p)
    got = ft.load_file(p)
    ref = torch.load(p)
    assert list(got) == sorted(ref)
    for k, v in ref.items():
        assert same(got[k], v), k


def test_torch_save_views_and_shared_storage(tmp_path):
    x = rand(torch.float32, (6, 8), 1)
    obj = {"x": x, "t": x.t(), "sl": x[:, 2:5], "step": x[::2], "row": x[3],
           "nested": {"list": [rand(torch.int64, (4,), 2), {"deep": rand(torch.bfloat16, (2, 2), 3)}]},
           "epoch": 7, "name": "not a tensor", "lone": rand(torch.float16, (5,), 4)}
    p = tmp_path / "views.pt"
    torch.save(obj, p)
    ref = flatten(torch.load(p))
    got = ft.load_file(p)
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert same(got[k], v), k
        assert got[k].stride() == v.stride(), k
    # views of one storage share one storage here too (where they overlap)
    def storage_ptr(t):
        return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()
    base = storage_ptr(got["x"])
    for k in ("t", "sl", "step", "row"):
        assert storage_ptr(got[k]) == base, k
    assert got["sl"].storage_offset() == 2 and got["row"].storage_offset() == 24
    got["x"][0, 3] = 1234.0
    assert got["t"][3, 0] == 1234.0 and got["sl"][0, 1] == 1234.0


def test_torch_save_tied_state_dict(tmp_path):
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight
    p = tmp_path / "tied.pt"
    torch.save(m.state_dict(), p)
    got = ft.load_file(p)
    assert same(got["0.weight"], m[0].weight) and same(got["1.weight"], m[1].weight)
    assert got["0.weight"].data_ptr() == got["1.weight"].data_ptr()


def test_torch_save_legacy_refused(tmp_path):
    p = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(3)}, p, _use_new_zipfile_serialization=False)
    with pytest.raises(ferry.UnsupportedError) as e:
        ft.load_file(p)
    assert str(p) in str(e.value) and "legacy" in str(e.value)


# ---- safetensors -------------------------------------------------------------

def test_reference_safetensors_bit_identical(tmp_path):
    p = tmp_path / "ref.safetensors"
    names = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
             "C64", "F8_E4M3", "F8_E5M2"]
    spec = [(f"t.{d}", d, [4, 6], i) for i, d in enumerate(names) if d in ft.DTYPES]
    spec += [("scalar", "F32", [], 90), ("empty", "F32", [0, 7], 91), ("big", "F32", [129, 257], 92)]
    expected = conftest.write_reference(p, spec, metadata={"format": "pt"})
    got = ft.load_file(p)
    shapes = {n: tuple(s) for n, _, s, _ in spec}
    assert set(expected) <= set(got)
    for k, v in expected.items():
        assert tuple(got[k].shape) == shapes[k], k
        assert raw(got[k]) == v, k
    try:
        from safetensors.torch import load_file as ref_load
    except ImportError:
        return
    ref = ref_load(str(p))
    assert set(ref) == set(got)
    for k, v in ref.items():
        assert same(got[k], v), k


def test_every_ferry_dtype(tmp_path):
    """Each safetensors dtype: a tensor of the mapped torch dtype with the
    file's bytes, or UnsupportedError naming the tensor and the dtype."""
    for i, name in enumerate(stwriter.DTYPE_BITS):
        p = tmp_path / f"{name}.safetensors"
        shape = [4, 8]
        data = st_file(p, [("w", name, shape, i)])
        if name in ft.DTYPES:
            t = ft.load_file(p)["w"]
            assert t.dtype == ft.DTYPES[name] and tuple(t.shape) == (4, 8)
            assert raw(t) == data["w"], name
        else:
            with pytest.raises(ferry.UnsupportedError) as e:
                ft.load_file(p)
            assert "'w'" in str(e.value) and name in str(e.value) and str(p) in str(e.value)
    assert ft.DTYPES["BF16"] is torch.bfloat16 and ft.DTYPES["C64"] is torch.complex64
    if hasattr(torch, "float8_e4m3fn"):
        assert ft.DTYPES["F8_E4M3"] is torch.float8_e4m3fn and ft.DTYPES["F8_E5M2"] is torch.float8_e5m2


def test_sharded_index(tmp_path):
    a = st_file(tmp_path / "s1.safetensors", [("a.w", "F32", [3, 4], 1), ("a.b", "BF16", [5], 2)])
    b = st_file(tmp_path / "s2.safetensors", [("b.w", "I64", [2, 2], 3)])
    wm = dict({k: "s1.safetensors" for k in a}, **{k: "s2.safetensors" for k in b})
    idx = tmp_path / "m.safetensors.index.json"
    import json
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    got = ft.load_file(idx)
    a.update(b)
    assert {k: raw(v) for k, v in got.items()} == a


def test_gguf(tmp_path):
    p = tmp_path / "m.gguf"
    w = rand(torch.float32, (2, 3), 1)
    h = rand(torch.float16, (4,), 2)
    q = conftest.raw_bytes(3, 144 * 2, "U8")  # two Q4_K blocks
    gguf_writer.write(str(p), [("w", "F32", [2, 3], raw(w)), ("h", "F16", [4], raw(h)),
                               ("q", "Q4_K", [2, 256], q)])
    got = ft.load_file(p)
    assert same(got["w"], w) and same(got["h"], h)
    # block-quantized: raw bytes, documented
    assert got["q"].dtype == torch.uint8 and tuple(got["q"].shape) == (288,) and raw(got["q"]) == q


# ---- zero copy, copy-on-write, lifetime --------------------------------------

def test_zero_copy_rss_and_copy_on_write(tmp_path):
    """A 256 MiB file: loading adds < 32 MiB of RSS; touching a tensor maps it;
    writing a view changes the tensor, never the file."""
    p = tmp_path / "big.safetensors"
    chunk = conftest.raw_bytes(9, 1 << 20, "U8")
    tensors = [(f"w{i}", "F32", [4096, 4096], lambda n: (chunk * (n // len(chunk) + 1))[:n])
               for i in range(4)]
    stwriter.write(str(p), tensors)
    assert p.stat().st_size > 256 << 20
    gc.collect()
    rss0 = conftest.rss_bytes()
    sd = ft.load_file(p)
    rss1 = conftest.rss_bytes()
    assert rss1 - rss0 < 32 << 20, f"loading added {(rss1 - rss0) >> 20} MiB of RSS"
    sd["w1"].sum()  # touch 64 MiB
    rss2 = conftest.rss_bytes()
    assert rss2 - rss1 > 32 << 20, "touching a tensor should map its pages"
    # write into a view: the tensor changes, the file does not
    fi = ferry.File(p)
    off = fi.info("w2").offset
    before = fi.read("w2")[:4096]
    sd["w2"][0, :1024] = 42.0
    assert bool((sd["w2"][0, :1024] == 42.0).all())
    with open(p, "rb") as f:
        f.seek(off)
        assert f.read(4096) == before
    assert raw(ft.load_file(p)["w2"][0, :1024]) == before


def test_views_keep_file_mapped(tmp_path):
    p = tmp_path / "life.safetensors"
    data = st_file(p, [("a", "F32", [256], 1), ("b", "F32", [256], 2)])
    sd = ft.load_file(p)
    keep = sd["b"][10:20]  # a view of a view
    del sd
    gc.collect()
    assert mapped(p)
    assert raw(keep) == data["b"][40:80]
    del keep
    gc.collect()
    assert not mapped(p), "the mapping should go with the last tensor"


def test_progress_cpu(tmp_path):
    p = tmp_path / "p.safetensors"
    st_file(p, [("a", "F32", [100], 1)])
    calls = []
    ft.load_file(p, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(400, 400)]


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        ft.load_file(tmp_path / "absent.safetensors")
    assert e.value.errno == 2 and e.value.filename == str(tmp_path / "absent.safetensors")
    p = tmp_path / "trunc.safetensors"
    st_file(p, [("w", "F32", [64, 64], 1)])
    p.write_bytes(p.read_bytes()[:500])
    with pytest.raises(ferry.FormatError) as e:
        ft.load_file(p)
    assert str(p) in str(e.value)
    g = tmp_path / "garbage.bin"
    g.write_bytes(conftest.raw_bytes(1, 10000, "U8"))
    with pytest.raises(ferry.FormatError):
        ft.load_file(g)
    with pytest.raises(ValueError):
        ft.load_file(p, device="sim:1GiB")  # sim only with owner="ferry"
    with pytest.raises(ValueError):
        ft.load_file(p, owner="numpy")


def test_cuda_without_gpu_is_no_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/gpu/test_torch_gpu.py covers it")
    p = tmp_path / "c.safetensors"
    st_file(p, [("w", "F32", [4], 1)])
    for dev in ("cuda", "cuda:0", 0):
        with pytest.raises(ferry.NoDeviceError) as e:
            ft.load_file(p, device=dev)
        assert str(p) in str(e.value) and "cuda:0" in str(e.value)


# ---- ferry-owned memory through DLPack (sim device: host memory) ---------------

def _owner_of(tensors):
    with _dlpack._lock:
        owners = {id(e[0]): e[0] for e in _dlpack._live.values()}
    assert len(owners) == 1
    return weakref.ref(next(iter(owners.values())))


def test_dlpack_owner_ferry_sim(tmp_path):
    x = rand(torch.float32, (6, 8), 1)
    obj = {"x": x, "t": x.t(), "b": rand(torch.bool, (7,), 2), "h": rand(torch.bfloat16, (3, 3), 3),
           "e": torch.empty(0), "s": torch.tensor(5, dtype=torch.int64)}
    p = tmp_path / "o.pt"
    torch.save(obj, p)
    ref = flatten(torch.load(p))
    dev = ferry.device("sim:1GiB")
    free0 = dev.mem_info()[0]
    live0 = _dlpack.live_count()
    calls = []
    got = ft.load_file(p, "sim:1GiB", owner="ferry", progress=lambda d, t: calls.append((d, t)))
    for k, v in ref.items():
        assert same(got[k], v), k
        assert got[k].device.type == "cpu"
    assert got["t"].stride() == (1, 8)
    nonempty = sum(1 for v in ref.values() if v.numel())
    assert _dlpack.live_count() == live0 + nonempty
    assert dev.mem_info()[0] < free0
    assert calls and calls[-1][0] == calls[-1][1] and all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
    owner = _owner_of(got)
    loaded = owner()
    f = ferry.File(p)
    for k in ("x", "h", "b"):  # ferry_loaded_read agrees with what the tensors show
        i = f.find(k)
        assert loaded.read(i, f.info(k).nbytes) == f.read(k)
    del loaded
    keep = got["h"]
    del got
    gc.collect()
    assert owner() is not None and _dlpack.live_count() == live0 + 1
    assert same(keep, ref["h"])
    del keep
    gc.collect()
    assert owner() is None, "the load should be freed with its last tensor"
    assert _dlpack.live_count() == live0
    assert dev.mem_info()[0] == free0


def test_dlpack_unconsumed_capsule_releases(tmp_path):
    class Owner:
        pass
    o = Owner()
    r = weakref.ref(o)
    buf = bytearray(16)
    import ctypes
    addr = ctypes.addressof((ctypes.c_char * 16).from_buffer(buf))
    cap = _dlpack.capsule(addr, 16, _dlpack.KDL_CPU, 0, o)
    del o
    assert r() is not None
    del cap
    gc.collect()
    assert r() is None


def test_owner_ferry_cpu_device_is_a_copy(tmp_path):
    p = tmp_path / "c.safetensors"
    data = st_file(p, [("a", "F32", [64], 1), ("b", "I16", [3, 3], 2)])
    got = ft.load_file(p, "cpu", owner="ferry", threads=2)
    assert {k: raw(v) for k, v in got.items()} == data
    got["a"][:] = 1.0  # ferry's own memory: writable, the file is untouched
    assert raw(ft.load_file(p)["a"]) == data["a"]


def test_owner_ferry_out_of_device_memory(tmp_path):
    p = tmp_path / "oom.safetensors"
    st_file(p, [("a", "F32", [4096], 1)])
    with pytest.raises(OSError) as e:
        ft.load_file(p, "sim:1KiB", owner="ferry")
    assert e.value.errno == 12 and str(p) in str(e.value)


def test_progress_exception_is_raised(tmp_path):
    p = tmp_path / "x.safetensors"
    st_file(p, [("a", "F32", [4096], 1)])

    def bad(done, total):
        raise KeyError("from progress")
    with pytest.raises(KeyError, match="from progress"):
        ft.load_file(p, "sim:1GiB", owner="ferry", progress=bad)


def test_load_options_checked(tmp_path):
    p = tmp_path / "x.safetensors"
    st_file(p, [("a", "F32", [4096], 1)])
    with pytest.raises(ValueError):
        ft.load_file(p, "sim:1GiB", owner="ferry", route="teleport")
    got = ft.load_file(p, "sim:1GiB", owner="ferry", route="ring", ring_buffers=2,
                       ring_buffer_bytes="64KiB", threads=1)
    assert got["a"].numel() == 4096
    # path_kind=, the old name of route=, still works for one release, with a warning
    st = {}
    with pytest.warns(DeprecationWarning, match="path_kind= is deprecated, use route="):
        got = ft.load_file(p, "sim:1GiB", owner="ferry", path_kind="ring", stats=st)
    assert got["a"].numel() == 4096 and st["route"] == "ring"


def test_loaded_outlives_its_file_handle_finalizer(tmp_path):
    """In a garbage cycle Python finalizes objects in any order: a ferry load
    whose file handle was finalized first must still free before the close."""
    from ferry import _core
    p = tmp_path / "cycle.safetensors"
    st_file(p, [("a", "F32", [1024], 1)])
    h = _core._Handle(p)
    loaded = _core.Loaded(ferry.device("sim:1GiB"), h, _core.LoadOptions())
    h.__del__()  # as the cycle collector may do first
    assert h.f is not None and mapped(p)
    del loaded
    gc.collect()
    assert h.f is None and not mapped(p)
    del h


def test_stats(tmp_path):
    p = tmp_path / "s.safetensors"
    st_file(p, [("a", "F32", [4096], 1)])
    st = {}
    ft.load_file(p, "sim:1GiB", owner="ferry", route="ring", stats=st)
    assert st["route"] == "ring" and st["bytes"] == 16384 and st["seconds"] >= 0 and st["why"]
    assert st["path"] == st["route"]  # the deprecated key, kept for one release
    st = {}
    ft.load_file(p, stats=st)
    assert st["route"] == "view" and st["bytes"] == 0


def test_device_path_on_ferry_cpu_device(tmp_path):
    """The cuda path's allocation and single ferry_load_into, run with host
    memory and ferry's cpu device: views, shared storages, strides, dtypes."""
    from ferry import _core
    from ferry.torch import _load
    x = rand(torch.float32, (6, 8), 1)
    obj = {"x": x, "t": x.t(), "sl": x[:, 2:5], "lone": rand(torch.bfloat16, (3, 7), 2),
           "b": rand(torch.bool, (5,), 3), "e": torch.empty(0, 2), "s": torch.tensor(3, dtype=torch.int16)}
    p = tmp_path / "dev.pt"
    torch.save(obj, p)
    ref = flatten(torch.load(p))
    h = _core._Handle(p)
    infos = h.infos()
    dts = {t.index: ft.dtype_for(t, h.path) for t in infos}
    out, idx, ptrs = _load._alloc(infos, dts, torch.device("cpu"))
    assert len(idx) == len(ptrs) == sum(1 for t in infos if t.nbytes)
    calls = []
    _core.load_into(ferry.device("cpu"), h, idx, ptrs,
                    _core.LoadOptions(progress=lambda d, t: calls.append((d, t))))
    for k, v in ref.items():
        assert same(out[k], v), k
        assert out[k].stride() == v.stride(), k
    assert out["t"].data_ptr() == out["x"].data_ptr() and out["sl"].storage_offset() == 2
    out["x"][1, 0] = -5.0
    assert out["t"][0, 1] == -5.0
    assert calls[-1][0] == calls[-1][1]


def test_views_copied_once(tmp_path):
    """Views of one storage land once where they overlap on the device (the
    shared bytes are copied with the storage, not once per view: two copies
    of the same bytes from two streams raced under the sim); views loaded
    into separate buffers get every byte each."""
    from ferry import _core
    x = rand(torch.float32, (64, 32), 3)  # 8 KiB
    obj = {"x": x, "t": x.t(), "sl": x[:, 3:9], "tail": x[40:], "lone": rand(torch.float32, (100,), 4)}
    p = tmp_path / "views.pt"
    torch.save(obj, p)
    ref = flatten(torch.load(p))
    st = {}
    got = ft.load_file(p, "sim:1GiB", owner="ferry", stats=st)
    for k, v in ref.items():
        assert same(got[k], v), k
    assert st["bytes"] == (x.numel() + obj["lone"].numel()) * 4  # the storage once, not x + its views
    # the same views into separate buffers: every view's bytes copied
    h = _core._Handle(p)
    infos = [t for t in h.infos() if t.nbytes]
    bufs = {t.index: torch.zeros(t.nbytes, dtype=torch.uint8) for t in infos}
    st = _core.load_into(ferry.device("cpu"), h, [t.index for t in infos], [bufs[t.index].data_ptr() for t in infos],
                         _core.LoadOptions())
    assert st["bytes"] == sum(t.nbytes for t in infos)
    for t in infos:
        assert bytes(bufs[t.index].numpy()) == bytes(h.buffer(h.data(t.index), t.nbytes)), t.name
