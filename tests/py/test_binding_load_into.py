# SPDX-License-Identifier: Apache-2.0
"""ferry.torch.load_model: in-place loads into materialised modules, meta
modules materialised as zero-copy views, key / shape / dtype reports as
load_state_dict gives them, tied weights, progress; safetensors' argument
order; load_into, its deprecated name."""
import gc

import pytest

import ferry

torch = pytest.importorskip("torch")
import ferry.torch as ft  # noqa: E402

nn = torch.nn


class Block(nn.Module):
    def __init__(self, dim=16, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(dim, **kw)
        self.qkv = nn.Linear(dim, 3 * dim, **kw)
        self.proj = nn.Linear(dim, dim, **kw)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, **kw), nn.GELU(), nn.Linear(4 * dim, dim, **kw))
        self.register_buffer("scale", torch.full((dim,), 0.5, device=device, dtype=dtype))
        self.register_buffer("cache", torch.zeros(2, device=device), persistent=False)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
        x = x + self.proj(a)
        return (x + self.mlp(x)) * self.scale


class Net(nn.Module):
    def __init__(self, device=None, dtype=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(device=device, dtype=dtype) for _ in range(2)])
        self.head = nn.Linear(16, 8, device=device, dtype=dtype)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def reference(tmp_path, dtype=torch.float32, name="ref.pt"):
    torch.manual_seed(0)
    m = Net(dtype=dtype)
    with torch.no_grad():
        for b in m.buffers():
            b.uniform_()
    p = tmp_path / name
    torch.save(m.state_dict(), p)
    return m, p


def check_same(m, ref):
    sa, sb = m.state_dict(), ref.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    x = torch.randn(3, 5, 16, dtype=next(ref.parameters()).dtype)
    assert torch.equal(m(x), ref(x))


def test_in_place_cpu(tmp_path):
    ref, p = reference(tmp_path)
    m = Net()
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    params = {k: id(v) for k, v in m.named_parameters()}
    calls = []
    r = ft.load_model(m, p, progress=lambda d, t: calls.append((d, t)))
    assert r.missing_keys == [] and r.unexpected_keys == []
    check_same(m, ref)
    # the same storage, the same Parameter objects: filled in place
    assert {k: v.data_ptr() for k, v in m.state_dict().items()} == ptrs
    assert {k: id(v) for k, v in m.named_parameters()} == params
    assert calls and calls[-1][0] == calls[-1][1] == sum(v.nbytes for v in ferry.File(p).tensors)


def test_meta_module_becomes_views(tmp_path):
    ref, p = reference(tmp_path, name="meta.pt")
    m = Net(device="meta")
    m.blocks[0].qkv.weight.requires_grad_(False)
    r = ft.load_model(m, p)
    assert r == ([], [])
    for k, v in m.state_dict().items():
        assert not v.is_meta, k
    assert isinstance(m.head.weight, nn.Parameter)
    assert m.head.weight.requires_grad and not m.blocks[0].qkv.weight.requires_grad
    assert m.blocks[0].cache.is_meta  # non-persistent: not in the file, left alone
    m.blocks[0].cache = torch.zeros(2)
    check_same(m, ref)
    # the views are copy-on-write: training them never touches the file
    before = p.read_bytes()
    with torch.no_grad():
        m.head.weight.fill_(3.0)
    assert p.read_bytes() == before


def test_meta_module_from_safetensors_file(tmp_path):
    """A file whose tensors are row-major (safetensors): meta params become
    plain views, and a second load_into into the now-materialised module
    loads in place."""
    ref, pt = reference(tmp_path, dtype=torch.bfloat16, name="bf.pt")
    import stwriter
    sd = ref.state_dict()
    p = tmp_path / "bf.safetensors"
    stwriter.write(str(p), [(k, {torch.bfloat16: "BF16", torch.float32: "F32"}[v.dtype], list(v.shape),
                             bytes(v.contiguous().view(-1).view(torch.uint8).tolist())) for k, v in sd.items()])
    m = Net(device="meta", dtype=torch.bfloat16)
    ft.load_model(m, p)
    m.blocks[0].cache = torch.zeros(2)
    m.blocks[1].cache = torch.zeros(2)
    check_same(m, ref)
    m2 = Net(dtype=torch.bfloat16)
    ft.load_model(m2, p)
    check_same(m2, ref)


def test_strict_reports_keys(tmp_path):
    ref, p = reference(tmp_path)

    class Bigger(Net):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.extra = nn.Linear(2, 2)
    m = Bigger()
    del m.head  # head.* become unexpected, extra.* missing
    m.head = None
    with pytest.raises(RuntimeError) as e:
        ft.load_model(m, p)
    msg = str(e.value)
    assert msg.startswith("Error(s) in loading state_dict for Bigger:")
    assert 'Missing key(s) in state_dict: "extra.weight", "extra.bias".' in msg
    assert 'Unexpected key(s) in state_dict: "head.weight", "head.bias".' in msg
    assert msg.index("Missing") < msg.index("Unexpected")
    r = ft.load_model(m, p, strict=False)
    assert r.missing_keys == ["extra.weight", "extra.bias"]
    assert r.unexpected_keys == ["head.weight", "head.bias"]
    assert torch.equal(m.blocks[1].qkv.weight, ref.blocks[1].qkv.weight)


def test_shape_and_dtype_mismatch_leave_module_untouched(tmp_path):
    ref, p = reference(tmp_path)
    m = Net()
    m.blocks[0].proj = nn.Linear(16, 15)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    for strict in (True, False):
        with pytest.raises(RuntimeError) as e:
            ft.load_model(m, p, strict=strict)
        assert ("size mismatch for blocks.0.proj.weight: copying a param with shape torch.Size([16, 16]) "
                "from checkpoint, the shape in current model is torch.Size([15, 16]).") in str(e.value)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    m = Net()
    m.head.to(torch.float64)
    with pytest.raises(RuntimeError, match="dtype mismatch for head.weight"):
        ft.load_model(m, p)


def test_tied_weights(tmp_path):
    class Tied(nn.Module):
        def __init__(self, device=None):
            super().__init__()
            self.emb = nn.Embedding(10, 4, device=device)
            self.out = nn.Linear(4, 10, bias=False, device=device)
            self.out.weight = self.emb.weight

    src = Tied()
    # a safetensors-style file holds a tied tensor once
    import stwriter
    w = src.emb.weight.detach()
    p = tmp_path / "tied.safetensors"
    stwriter.write(str(p), [("emb.weight", "F32", [10, 4], bytes(w.view(-1).view(torch.uint8).tolist()))])
    for dev in ("meta", None):
        m = Tied(device=dev)
        r = ft.load_model(m, p)
        assert r == ([], [])
        assert m.out.weight is m.emb.weight
        assert torch.equal(m.emb.weight, w)
    # torch.save keeps both names (views of one storage): both are used
    pt = tmp_path / "tied.pt"
    torch.save(src.state_dict(), pt)
    m = Tied(device="meta")
    assert ft.load_model(m, pt) == ([], [])
    assert m.out.weight is m.emb.weight and torch.equal(m.emb.weight, w)


def test_noncontiguous_file_tensors_are_copied(tmp_path):
    m = nn.Linear(6, 4)
    p = tmp_path / "t.pt"
    wt = torch.randn(6, 4)
    torch.save({"weight": wt.t(), "bias": torch.randn(4)}, p)  # a transposed view in the file
    ref = torch.load(p)
    assert ft.load_model(m, p) == ([], [])
    assert torch.equal(m.weight, ref["weight"]) and torch.equal(m.bias, ref["bias"])
    meta = nn.Linear(6, 4, device="meta")
    ft.load_model(meta, p)
    assert torch.equal(meta.weight, ref["weight"]) and meta.weight.stride() == (1, 4)


def test_mapping_outlives_load_into(tmp_path):
    ref, p = reference(tmp_path, name="life.pt")
    m = Net(device="meta")
    ft.load_model(m, p)
    gc.collect()
    m.blocks[0].cache = torch.zeros(2)
    m.blocks[1].cache = torch.zeros(2)
    check_same(m, ref)


def test_load_into_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ft.load_model(Net(), tmp_path / "absent.pt")
    if not torch.cuda.is_available():
        ref, p = reference(tmp_path)
        with pytest.raises(ferry.NoDeviceError):
            ft.load_model(Net(device="meta"), p, device="cuda")


def test_safetensors_arguments_and_the_deprecated_name(tmp_path):
    """load_model takes safetensors.torch.load_model's arguments (model,
    filename, strict, device; strict and device also by position); load_into
    is the same call under its former name, with a DeprecationWarning."""
    ref, p = reference(tmp_path, name="names.pt")
    m = Net()
    assert ft.load_model(model=m, filename=p, strict=True, device="cpu") == ([], [])
    check_same(m, ref)
    m = Net()
    missing, unexpected = ft.load_model(m, p, False, "cpu")
    assert (missing, unexpected) == ([], [])
    check_same(m, ref)
    m = Net()
    with pytest.warns(DeprecationWarning, match="ferry.torch.load_model"):
        assert ft.load_into(m, p, strict=True) == ([], [])
    check_same(m, ref)
