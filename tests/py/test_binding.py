# SPDX-License-Identifier: Apache-2.0
"""The ferry package without a framework: File (tensor table, metadata,
shards), errors as exceptions, the library search, packaging; and
ferry.numpy.load_file against files written by the reference safetensors
package and ferry's independent test writers."""
import errno
import json
import os
import subprocess
import sys

import pytest

import conftest
import ferry
import gguf_writer
import stwriter

ST_DTYPES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
             "C64", "F8_E4M3", "F8_E5M2"]


def st_file(path, tensors, metadata=None):
    """ferry's own safetensors writer: tensors [(name, dtype, shape, seed)];
    returns {name: bytes}."""
    data = {n: conftest.raw_bytes(seed, stwriter.nbytes(d, s), d) for n, d, s, seed in tensors}
    stwriter.write(str(path), [(n, d, s, data[n]) for n, d, s, _ in tensors], metadata=metadata)
    return data


def sharded(tmp_path):
    """A two-shard checkpoint with its index; returns (index path, {name: bytes})."""
    a = st_file(tmp_path / "m-00001-of-00002.safetensors",
                [("a.w", "F32", [3, 4], 1), ("a.b", "BF16", [5], 2)])
    b = st_file(tmp_path / "m-00002-of-00002.safetensors", [("b.w", "I64", [2, 2], 3)])
    wm = {k: "m-00001-of-00002.safetensors" for k in a}
    wm.update({k: "m-00002-of-00002.safetensors" for k in b})
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    a.update(b)
    return idx, a


# ---- File ------------------------------------------------------------------

def test_version_and_library():
    assert ferry.library_version.count(".") == 2
    assert os.path.exists(ferry.library_path)


def test_file_table_and_metadata(tmp_path):
    p = tmp_path / "m.safetensors"
    data = st_file(p, [("z", "F32", [2, 3], 1), ("a", "BF16", [4], 2), ("s", "I8", [], 3)],
                   metadata={"format": "pt", "k": "v"})
    with ferry.File(p) as f:
        assert f.format == "safetensors"
        assert f.metadata == {"format": "pt", "k": "v"}
        assert f.typed_metadata == {"format": "pt", "k": "v"}  # __metadata__: strings only
        assert f.keys() == ["z", "a", "s"]  # file order
        assert len(f) == 3 and "a" in f and "nope" not in f
        assert f.shards == [str(p)]
        assert f.total_bytes == 24 + 8 + 1
        t = f.info("a")
        assert (t.dtype, t.shape, t.nbytes, t.strides, t.flags) == ("BF16", (4,), 8, None, 0)
        assert f.info(2).shape == ()
        assert f.read("z") == data["z"] and f.read("s") == data["s"]
        assert f.find("nope") is None
        with pytest.raises(KeyError):
            f.info("nope")
        assert 0 <= f.resident() <= 1
        assert "safetensors, 3 tensors" in repr(f)
    assert "closed" in repr(f)
    with pytest.raises(ValueError):
        f.keys()


def test_file_sharded(tmp_path):
    idx, data = sharded(tmp_path)
    f = ferry.File(idx)
    assert f.format == "safetensors-index"
    assert f.metadata == {"total_size": "1"} and f.typed_metadata == {"total_size": 1}
    assert len(f.shards) == 2
    assert sorted(f.keys()) == sorted(data)
    assert {t.shard for t in f.tensors} == {0, 1}
    for k, v in data.items():
        assert f.read(k) == v


def test_file_gguf(tmp_path):
    p = tmp_path / "m.gguf"
    q = bytes(range(256))[:18] * 4  # 4 Q4_0 blocks of 32 elements
    gguf_writer.write(str(p), [("w", "F32", [2, 3], bytes(24)), ("q", "Q4_0", [2, 64], q)],
                      kvs=[("general.name", gguf_writer.STRING, "tiny"), ("n", gguf_writer.UINT32, 2),
                           ("b", gguf_writer.BOOL, True), ("x", gguf_writer.FLOAT32, float("nan")),
                           ("a", gguf_writer.ARRAY, (gguf_writer.FLOAT32, [0.5, 2.0])),
                           ("t", gguf_writer.ARRAY, (gguf_writer.STRING, ["t"] * 17))])
    f = ferry.File(p)
    assert f.format == "gguf"
    assert f.metadata == {"general.name": "tiny", "n": "2", "b": "true", "x": "NaN", "a": "[0.5,2]",
                          "t": "[STRING x 17]"}
    tm = f.typed_metadata
    assert tm == {"general.name": "tiny", "n": 2, "b": True, "x": "NaN", "a": [0.5, 2], "t": "[STRING x 17]"}
    assert type(tm["n"]) is int and type(tm["b"]) is bool
    assert f.info("q").dtype == "Q4_0" and f.info("q").shape == (2, 64) and f.info("q").nbytes == 72
    assert f.read("q") == q


# ---- errors ----------------------------------------------------------------

def test_missing_file_is_enoent(tmp_path):
    p = str(tmp_path / "absent.safetensors")
    with pytest.raises(FileNotFoundError) as e:
        ferry.File(p)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == p
    assert p in str(e.value)


def test_directory_is_an_error(tmp_path):
    with pytest.raises((OSError, ferry.FerryError)) as e:
        ferry.File(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("case", ["truncated", "garbage", "empty", "bad_json", "overlap"])
def test_invalid_files_raise_format_error(tmp_path, case):
    p = tmp_path / f"{case}.safetensors"
    if case == "truncated":
        st_file(p, [("w", "F32", [64, 64], 1)])
        p.write_bytes(p.read_bytes()[:1000])
    elif case == "garbage":
        p.write_bytes(conftest.raw_bytes(7, 4096, "U8"))
    elif case == "empty":
        p.write_bytes(b"")
    elif case == "bad_json":
        stwriter.write_raw(str(p), b"{not json}", b"")
    else:
        hdr = json.dumps({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                          "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}).encode()
        stwriter.write_raw(str(p), hdr, bytes(6))
    with pytest.raises(ferry.FormatError) as e:
        ferry.File(p)
    err = e.value
    assert isinstance(err, ferry.FerryError)
    assert err.code in (-4097, -4099, -4105)  # CORRUPT, FORMAT, LIMIT
    assert err.filename == str(p)
    assert str(p) in str(err), str(err)
    assert err.message and err.strerror


def test_error_classes():
    from ferry import errors
    assert isinstance(errors.error(-errno.EACCES, "x: denied", "x"), PermissionError)
    e = errors.error(-errno.ENOMEM, "x: out of memory", "x")
    assert type(e) is OSError and e.errno == errno.ENOMEM and e.strerror == "out of memory"
    assert isinstance(errors.error(-4098, "m", "f"), ferry.UnsupportedError)
    assert isinstance(errors.error(-4098, "m", "f"), ferry.FormatError)
    assert isinstance(errors.error(-4102, "m", "f"), ferry.BudgetError)
    assert isinstance(errors.error(-4103, "m", "f"), ferry.NoDeviceError)
    assert isinstance(errors.error(-4104, "m", "f"), ferry.DeviceError)
    assert isinstance(errors.error(-4100, "m", "f"), ValueError)
    assert isinstance(errors.error(-4101, "m", "f"), LookupError)
    assert str(errors.error(-4097, "bad header", "f.st")) == "f.st: bad header"
    assert errors.error(-4097, "", "f").message  # falls back to ferry_strerror


def test_error_map_covers_every_library_code():
    """Every FERRY_E_* code the library has (ferry_abi_enum_count) has its
    library name and a class; BUSY is BusyError, also an InvalidArgumentError
    (what those failures were before the code existed)."""
    from ferry import _lib, errors
    lib = _lib.lib
    n = lib.ferry_abi_enum_count(b"ferry_error")
    assert n >= 11  # CORRUPT .. BUSY
    codes = [_lib.E_BASE - k for k in range(n)]
    assert sorted(errors._CLASSES) == sorted(codes) == sorted(_lib.ERROR_NAMES)
    for code in codes:
        name = lib.ferry_error_name(code).decode()
        e = errors.error(code, "", "f")
        assert isinstance(e, ferry.FerryError) and e.code == code and e.name == name, (code, name)
        assert type(e) is errors._BY_NAME[name], (code, name)  # every library code has its own class
        assert e.message == lib.ferry_strerror(code).decode()
    # one past the last is no ferry code: a plain FerryError, no name
    assert lib.ferry_error_name(_lib.E_BASE - n) is None
    e = errors.error(_lib.E_BASE - n, "m", "f")
    assert type(e) is ferry.FerryError and e.name is None
    busy = errors.error(_lib.ERROR_CODES["BUSY"], "tensor \"w\" is in use", "f")
    assert type(busy) is ferry.BusyError and isinstance(busy, ferry.InvalidArgumentError)
    assert busy.code == _lib.E_BUSY == -4107 and busy.strerror == "in use"


def test_enum_tables_come_from_the_library():
    from ferry import _lib
    lib = _lib.lib
    for table, enum, name_fn in ((_lib.DTYPE_NAMES, b"ferry_dtype", lib.ferry_dtype_name),
                                 (_lib.ROUTES, b"ferry_route", lib.ferry_route_name),
                                 (_lib.TIER_NAMES, b"ferry_tier", lib.ferry_tier_name),
                                 (_lib.FORMAT_NAMES, b"ferry_format", lib.ferry_format_name)):
        n = lib.ferry_abi_enum_count(enum)
        assert n > 0 and list(table) == [name_fn(i).decode() for i in range(n)], enum
    assert _lib.TIER_NAMES[_lib.TIER_DEVICE] == "device" and _lib.TIER_NAMES[_lib.TIER_SOURCE] == "source"
    assert {"Q4_0", "Q4_K", "IQ2_XXS"} <= _lib.BLOCK_DTYPES
    assert not {"INVALID", "F32", "F4", "F6_E2M3", "BF16"} & _lib.BLOCK_DTYPES
    for route in _lib.ROUTES:  # every route the library names is a route=
        assert ferry._core.LoadOptions(route).opts.route == lib.ferry_route_parse(route.encode())
    with pytest.raises(ValueError, match="route must be one of " + ", ".join(_lib.ROUTES)):
        ferry._core.LoadOptions("teleport")


def test_plan_route_asks_the_library(tmp_path):
    """Device.plan_route is ferry_load_plan_route: the choice the load then makes."""
    import ferry._store
    p = tmp_path / "r.safetensors"
    stwriter.write(str(p), [("a", "F32", [1024], bytes(4096))])
    dev = ferry.Device("sim:64MiB")  # a device of its own: no ring pinned yet
    f = ferry.File(p)
    c = dev.plan_route(f)
    assert c["route"] == "pageable" and not c["pins"] and c["buffers"] == 0 and c["why"]
    c = dev.plan_route(f, route="ring", threads=2)
    assert c["route"] == "ring" and c["pins"] and c["threads"] == 2 and c["buffers"] == 2
    assert c["buffer_bytes"] == 4 << 20 and c["why"] == "asked for"
    c = dev.plan_route(None, nbytes=10 << 20)
    assert c["route"] == "ring" and c["buffers"] == 3 and c["pins"]
    assert ferry._core.prepare(dev, ferry._core.LoadOptions(), 10 << 20) == 0
    assert not dev.plan_route(None, nbytes=10 << 20)["pins"]
    with pytest.raises(ferry.UnsupportedError, match="cufile is not a route"):
        dev.plan_route(f, route="cufile")
    ok, why = dev.probe_cufile(f)
    assert not ok and "cuda device" in why and str(p) in why
    with pytest.warns(DeprecationWarning, match="pins is deprecated"):
        assert ferry._lib.PATHS == ferry._lib.ROUTES and ferry._store.TensorState("t", 0, "device", False, 2, 0, 0).pins == 2


def test_struct_mirrors_match_the_library():
    import ctypes
    from ferry import _lib
    for cls in _lib.MIRRORS:
        assert _lib.mirror_mismatch(cls) is None, cls._ferry_name_
        assert ctypes.sizeof(cls) == _lib.lib.ferry_abi_sizeof(cls._ferry_name_.encode())
        if cls._fields_[0][0] == "size":  # set for the library on every new instance
            assert cls().size == ctypes.sizeof(cls)


def _variant(base, fields):
    """A copy of the mirror base with other fields, under the same C name."""
    import ctypes
    return type(base.__name__, (ctypes.Structure,), {"_ferry_name_": base._ferry_name_, "_fields_": fields})


def test_a_wrong_mirror_is_refused():
    """A mirror that differs from the library (fields swapped, one missing or
    extra, a wrong type) is refused, naming the struct, the field and both
    offsets."""
    import ctypes
    from ferry import _lib
    f = list(_lib.LoadStats._fields_)
    names = [n for n, _ in f]
    i, j = names.index("resident"), names.index("why")
    swapped = list(f)
    swapped[i], swapped[j] = f[j], f[i]
    off_resident = _lib.lib.ferry_abi_offsetof(b"ferry_load_stats", b"resident")
    off_why = _lib.lib.ferry_abi_offsetof(b"ferry_load_stats", b"why")
    assert off_why > off_resident
    with pytest.raises(ImportError) as e:
        _lib.check_mirror(_variant(_lib.LoadStats, swapped))
    assert str(e.value) == (f"ferry: {__file__}'s ferry_load_stats does not match libferry "
                            f"{ferry.library_version} ({ferry.library_path}): field 'why' at {off_resident}, "
                            f"the library has it at {off_why}")
    last = f[-1][0]
    off_last = _lib.lib.ferry_abi_offsetof(b"ferry_load_stats", last.encode())
    with pytest.raises(ImportError, match=f"ferry_load_stats does not match .*: the library has field '{last}' at "
                                          f"{off_last}, which this mirror lacks"):
        _lib.check_mirror(_variant(_lib.LoadStats, f[:-1]))
    with pytest.raises(ImportError, match=f"field 'extra' at {ctypes.sizeof(_lib.LoadStats)}: the library has no "
                                          f"such field"):
        _lib.check_mirror(_variant(_lib.LoadStats, f + [("extra", ctypes.c_uint64)]))
    # same names and offsets, a different size (as the old char why[256] was):
    # the last field 256 bytes long instead of 8
    assert ctypes.sizeof(f[-1][1]) == 8
    with pytest.raises(ImportError, match=f"sizeof {off_last + 256}, the library's is {off_last + 8}"):
        _lib.check_mirror(_variant(_lib.LoadStats, f[:-1] + [(last, ctypes.c_double * 32)]))
    # the store's old layout (no size field first): the first field is off
    old = [(n, t) for n, t in _lib.TensorState._fields_ if n != "size"]
    off_name = _lib.lib.ferry_abi_offsetof(b"ferry_tensor_state", b"name")
    with pytest.raises(ImportError, match=f"ferry_tensor_state does not match .*: field 'name' at 0, the library "
                                          f"has it at {off_name}"):
        _lib.check_mirror(_variant(_lib.TensorState, old))
    unknown = type("Nope", (ctypes.Structure,), {"_ferry_name_": "ferry_nope", "_fields_": f})
    with pytest.raises(ImportError, match="ferry_nope does not match .*: the library does not know this struct"):
        _lib.check_mirror(unknown)


def test_a_wrong_mirror_fails_the_import(tmp_path, lib_path):
    """The check runs at import: a copy of the package whose _structs.py has
    two fields of ferry_load_stats swapped cannot be imported."""
    import shutil
    pkg = tmp_path / "ferry"
    shutil.copytree(os.path.join(conftest.ROOT, "python", "ferry"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "libferry.so*"))
    src = (pkg / "_structs.py").read_text()
    a = '        ("resident", ctypes.c_double),\n'
    b = '        ("why", ctypes.c_char_p),  # static text of the library\'s\n'
    assert src.count(a + b) == 1
    (pkg / "_structs.py").write_text(src.replace(a + b, b + a))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), FERRY_LIBRARY=lib_path, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", "import ferry"], env=env, capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode != 0
    assert (f"ImportError: ferry: {pkg / '_structs.py'}'s ferry_load_stats does not match libferry "
            f"{ferry.library_version}") in r.stderr, r.stderr
    lib = ferry._lib.lib
    off_resident = lib.ferry_abi_offsetof(b"ferry_load_stats", b"resident")
    off_why = lib.ferry_abi_offsetof(b"ferry_load_stats", b"why")
    assert f"field 'why' at {off_resident}, the library has it at {off_why}" in r.stderr, r.stderr


def test_no_device():
    # this machine may have a GPU; an absurd ordinal never exists
    with pytest.raises(ferry.NoDeviceError) as e:
        ferry.device("cuda:977")
    assert "cuda:977" in str(e.value)
    with pytest.raises(ferry.FerryError):
        ferry.device("tpu:0")


def test_sim_device():
    d = ferry.device("sim:64MiB")
    assert d is ferry.device("sim:64MiB")  # cached per spec
    free, total = d.mem_info()
    assert total == 64 << 20 and free <= total
    assert "sim" in d.description


def test_prepare_pins_the_ring_on_a_thread():
    """_core.prepare (ferry_device_prepare) returns the library's code and
    can run on a thread (ferry.torch pins the ring that way while it
    allocates); a bad path code is refused, not ignored."""
    import threading
    from ferry import _core
    d = _core.device("sim:96MiB")
    opts = _core.LoadOptions("auto", None, None, None, None)
    rc = []
    th = threading.Thread(target=lambda: rc.append(_core.prepare(d, opts, 40 << 20)))
    th.start()
    th.join()
    assert rc == [0]
    assert _core.prepare(d, _core.LoadOptions("register", None, None, None, None), 1 << 30) == 0
    opts.opts.route = 999
    assert _core.prepare(d, opts, 1) < 0


def test_host_available():
    nbytes, source = ferry.host_available()
    assert nbytes > 0
    assert source  # "MemAvailable" or a cgroup's file


def test_parse_size():
    assert ferry.parse_size("16MiB") == 16 << 20
    assert ferry.parse_size(4096) == 4096
    with pytest.raises(ValueError):
        ferry.parse_size("lots")


def test_library_search_order(tmp_path, lib_path):
    """$FERRY_LIBRARY is used when no copy is bundled; a bad one is reported."""
    env = dict(os.environ, PYTHONPATH=os.path.join(conftest.ROOT, "python"), FERRY_LIBRARY=lib_path)
    code = "import ferry; print(ferry.library_path)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.path.samefile(r.stdout.strip(), lib_path)


def test_pip_install_bundles_library(tmp_path, lib_path):
    """`pip install ./python` copies the library into the package, which then
    finds it without $FERRY_LIBRARY."""
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401  (setuptools < 70.1 builds wheels with it)
    except ImportError:
        pytest.skip("setuptools/wheel missing: cannot build without the network")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("no pip")
    target = tmp_path / "site"
    env = dict(os.environ, FERRY_LIBRARY=lib_path, PIP_DISABLE_PIP_VERSION_CHECK="1")
    src = tmp_path / "src"  # a copy: the build must not write into the checkout
    import shutil
    shutil.copytree(os.path.join(conftest.ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(target), str(src)],
                       env=env, capture_output=True, text=True, timeout=600)
    if r.returncode and "externally-managed" in r.stderr:
        pytest.skip("pip refuses to install here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "ferry" / "libferry.so").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", "import ferry; print(ferry.library_path)"], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target / "ferry" / "libferry.so")


# ---- numpy -----------------------------------------------------------------

def _np():
    return pytest.importorskip("numpy")


def test_numpy_reference_safetensors(tmp_path):
    """Every dtype the reference package can write, bit for bit."""
    np = _np()
    import ferry.numpy
    p = tmp_path / "ref.safetensors"
    spec = [(f"t.{d}", d, [3, 5], i) for i, d in enumerate(ST_DTYPES)]
    spec += [("scalar", "F32", [], 100), ("empty", "F16", [0, 4], 101), ("big", "F32", [257, 129], 102),
             ("4d", "F64", [2, 3, 4, 5], 103)]
    expected = conftest.write_reference(p, spec, metadata={"format": "np"})
    got = ferry.numpy.load_file(p)
    assert set(got) == set(expected)
    assert list(got) == sorted(got)
    shapes = {n: tuple(s) for n, _, s, _ in spec}
    for k, v in expected.items():
        assert got[k].shape == shapes[k], k
        assert got[k].tobytes() == v, k
    assert got["t.F32"].dtype == np.float32 and got["t.C64"].dtype == np.complex64
    try:
        from safetensors import safe_open
    except ImportError:
        return
    compared = 0
    with safe_open(str(p), framework="np") as f:
        for k in f.keys():
            try:
                v = f.get_tensor(k)
            except (AttributeError, TypeError, ValueError):
                continue  # a dtype the reference's numpy API cannot give (BF16, FP8)
            if v.dtype.kind == "V" or (v.dtype != got[k].dtype and "float8" in str(v.dtype)):
                continue
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert got[k].tobytes() == v.tobytes(), k
            compared += 1
    assert compared >= 13


def test_numpy_all_dtypes_own_writer(tmp_path):
    np = _np()
    import ferry.numpy
    p = tmp_path / "all.safetensors"
    data = st_file(p, [(d, d, [2, 4], i) for i, d in enumerate(ST_DTYPES)])
    got = ferry.numpy.load_file(p)
    for k, v in data.items():
        assert got[k].tobytes() == v and got[k].shape == (2, 4), k
    if ferry.numpy.ml_dtypes is None:
        assert got["BF16"].dtype == np.uint16  # raw bits, documented
        assert got["F8_E4M3"].dtype == np.uint8
    else:
        assert got["BF16"].dtype == ferry.numpy.ml_dtypes.bfloat16


def test_numpy_unsupported_dtype(tmp_path):
    _np()
    import ferry.numpy
    p = tmp_path / "f4.safetensors"
    st_file(p, [("ok", "F32", [2], 1), ("packed", "F4", [4, 8], 2)])
    with pytest.raises(ferry.UnsupportedError) as e:
        ferry.numpy.load_file(p)
    assert "packed" in str(e.value) and "F4" in str(e.value) and str(p) in str(e.value)


def test_numpy_sharded_and_gguf(tmp_path):
    np = _np()
    import ferry.numpy
    idx, data = sharded(tmp_path)
    got = ferry.numpy.load_file(idx)
    assert {k: v.tobytes() for k, v in got.items()} == data
    g = tmp_path / "m.gguf"
    f32 = np.arange(6, dtype=np.float32).tobytes()
    q = conftest.raw_bytes(5, 72, "U8")
    gguf_writer.write(str(g), [("w", "F32", [2, 3], f32), ("q", "Q4_0", [2, 64], q)])
    got = ferry.numpy.load_file(g)
    assert got["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert got["q"].dtype == np.uint8 and got["q"].shape == (72,) and got["q"].tobytes() == q


def test_numpy_copy_on_write(tmp_path):
    np = _np()
    import ferry.numpy
    p = tmp_path / "cow.safetensors"
    data = st_file(p, [("a", "F32", [1024], 1), ("b", "I32", [8], 2)])
    before = p.read_bytes()
    arrays = ferry.numpy.load_file(p)
    assert arrays["a"].flags.writeable
    arrays["a"][:] = 7.0
    assert (arrays["a"] == 7.0).all()
    assert p.read_bytes() == before
    assert ferry.numpy.load_file(p)["a"].tobytes() == data["a"]
