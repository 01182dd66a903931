# SPDX-License-Identifier: Apache-2.0
"""ferry.torch.Store: an attached module's tensors that its checkpoint lacks
(non-persistent buffers such as rotary tables, and parameters and buffers
that strict=False leaves out) follow the model: to the store's device when
the model comes there (forward pre-hook, use(), to_device, a streamed step),
back to the cpu when it leaves (offload, eviction, remove, close).

On ferry's simulated GPU the store's torch device is the cpu, so nothing
actually moves there: the end-to-end tests check that outputs stay right, and
the movement itself is checked by pointing the store's device for these
tensors (Store._extras_dev) at the meta device and recording each move, with
the copies made on the cpu so that forward still runs."""

import pytest

import stwriter

torch = pytest.importorskip("torch")
import ferry.torch as ft  # noqa: E402
from ferry.torch import _store_views  # noqa: E402
from ferry.torch._match import _module_extras  # noqa: E402

nn = torch.nn
SIM = "sim:1GiB"
META = torch.device("meta")
CPU = torch.device("cpu")
STREAMED = 0.75  # of the checkpoint's bytes: a budget that streams the blocks (each step moves them all)


class Rotary(nn.Module):
    """Rotary position tables, computed at construction and not saved
    (persistent=False), as diffusers' rotary embeddings keep them."""

    def __init__(self, dim, positions=16):
        super().__init__()
        inv = 1.0 / (100.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        ang = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, h):
        a, b = h[..., 0::2], h[..., 1::2]
        return torch.cat([a * self.cos - b * self.sin, a * self.sin + b * self.cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim, device=None):
        super().__init__()
        self.norm = nn.LayerNorm(dim, device=device)
        self.fc = nn.Linear(dim, dim, device=device)

    def forward(self, h):
        return h + torch.tanh(self.fc(self.norm(h)))


class Net(nn.Module):
    """Checkpoint tensors (inp, blocks, out) and four that the checkpoint
    lacks: the rotary tables (also under a second name, cos_alias), a
    parameter gate and a persistent buffer shift. device= places the
    parameters only (buffers stay real, as accelerate's init_empty_weights
    leaves them)."""

    CHECKPOINT_LACKS = ("gate", "shift")

    def __init__(self, dim=16, depth=4, device=None):
        super().__init__()
        self.inp = nn.Linear(8, dim, device=device)
        self.rope = Rotary(dim)
        self.blocks = nn.ModuleList([Block(dim, device) for _ in range(depth)])
        self.out = nn.Linear(dim, 8, device=device)
        self.gate = nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.register_buffer("shift", torch.linspace(-0.1, 0.1, dim))
        self.register_buffer("cos_alias", self.rope.cos, persistent=False)
        self.seen = None

    def forward(self, x):
        self.seen = {"rope.cos": self.rope.cos, "rope.sin": self.rope.sin, "gate": self.gate,
                     "shift": self.shift, "cos_alias": self.cos_alias}
        h = self.rope(self.inp(x)) * self.gate + self.shift + self.cos_alias[0, 0]
        for b in self.blocks:
            h = b(h)
        return self.out(h)


EXTRAS = ("rope.cos", "rope.sin", "gate", "shift")  # cos_alias is rope.cos


def get(m, key):
    for part in key.split("."):
        m = getattr(m, part)
    return m


def reference(seed=0):
    torch.manual_seed(seed)
    ref = Net()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
        ref.gate.uniform_(0.5, 1.5)
        ref.shift.uniform_(-0.2, 0.2)
    return ref


def tensor_bytes(t):
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())


def ref_and_file(tmp_path, seed=0, name="net"):
    """A reference Net and a checkpoint of everything of it but gate and shift."""
    ref = reference(seed)
    path = tmp_path / f"{name}.safetensors"
    stwriter.write(str(path), [(k, "F32", list(v.shape), tensor_bytes(v)) for k, v in ref.state_dict().items()
                               if k not in Net.CHECKPOINT_LACKS])
    return ref, path


def fresh_like(ref):
    """A Net built on meta, given ref's values of the tensors the checkpoint lacks."""
    m = Net(device="meta")
    with torch.no_grad():
        m.gate.copy_(ref.gate)
        m.shift.copy_(ref.shift)
    return m


def checkpoint_bytes(ref):
    return sum(v.numel() * v.element_size() for k, v in ref.state_dict().items() if k not in Net.CHECKPOINT_LACKS)


def x_for(seed=1):
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(seed))


class MoveLog(list):
    pass


@pytest.fixture
def moves(monkeypatch):
    """Each move of a tensor outside the checkpoint as (name, device type),
    the name being the key in EXTRAS whose tensor it was. The move itself
    makes a cpu copy (a Parameter stays a Parameter) tagged with the device
    it stands for, so that the module's identity changes are visible and its
    forward still runs."""
    log = MoveLog()
    names = {}  # id(tensor) -> name, kept current as copies replace tensors

    def fake(t, device):
        if t.device == CPU and getattr(t, "_where", "cpu") == device.type:
            return t
        if isinstance(t, nn.Parameter):
            new = nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
        else:
            new = t.detach().clone()
        new._where = device.type
        log.append((names.get(id(t), "?"), device.type))
        names[id(new)] = names.get(id(t), "?")
        return new

    def watch(m):
        for k in EXTRAS:
            names[id(get(m, k))] = k

    monkeypatch.setattr(_store_views, "_moved", fake)
    log.watch = watch
    return log


def where(t):
    return getattr(t, "_where", "cpu")


def took(log, device_type):
    """The names the log moved to device_type since it was last cleared."""
    got = [n for n, d in log if d == device_type]
    assert len(got) == len(set(got)), f"a tensor moved twice: {got}"
    assert all(d == device_type for _, d in log), log
    return sorted(got)


def test_extras_follow_the_module_on_sim(tmp_path, sim_free):
    """End to end on sim (device = cpu): the module with non-persistent
    buffers and tensors strict=False left out computes what the resident
    module computes, across offloads and a removal; the extras keep their
    values and objects (a move to the device they are on is none)."""
    ref, path = ref_and_file(tmp_path)
    m = fresh_like(ref)
    cos, gate = m.rope.cos, m.gate
    with torch.no_grad():
        want = ref(x_for())
    with ft.Store(SIM) as store:
        with pytest.raises(RuntimeError, match="Missing key"):
            store.add("net", path, module=Net(device="meta"))
        store.add("net", path, module=m, strict=False)
        for _ in range(2):
            with torch.no_grad():
                assert torch.equal(m(x_for()), want)
            store.offload("net")
        assert m.rope.cos is cos and m.cos_alias is cos and m.gate is gate
        assert isinstance(m.gate, nn.Parameter) and m.gate.requires_grad
        store.remove("net")
    for k in EXTRAS:
        assert get(m, k).device == CPU and torch.equal(get(m, k), get(ref, k)), k


@pytest.mark.parametrize("stream", [None, "auto"])
def test_extras_outputs_on_sim_streamed_or_not(tmp_path, sim_free, stream):
    ref, path = ref_and_file(tmp_path)
    m = fresh_like(ref)
    with torch.no_grad():
        want = [ref(x_for(s)) for s in range(3)]
    budget = checkpoint_bytes(ref) if stream is None else int(checkpoint_bytes(ref) * STREAMED)
    with ft.Store(SIM, device_budget=budget) as store:
        store.add("net", path, module=m, strict=False, stream=stream)
        with torch.no_grad():
            got = [m(x_for(s)) for s in range(3)]
        if stream is not None:
            assert store.stream_stats("net")["streamed_blocks"] > 0
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_moved_keeps_parameters_and_skips_meta():
    """_moved as Module.to moves a tensor: a buffer becomes a new tensor on the
    device; a Parameter stays a Parameter with its requires_grad and its
    gradient moved; a tensor already there, or a meta one (nothing to copy),
    is returned as it is."""
    buf = torch.arange(4.0)
    assert _store_views._moved(buf, CPU) is buf
    moved = _store_views._moved(buf, META)
    assert moved.is_meta and moved.shape == buf.shape and not isinstance(moved, nn.Parameter)
    assert _store_views._moved(moved, CPU) is moved  # (meta: no contents to bring back)
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    q = _store_views._moved(p, META)
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.is_meta
    assert q.grad is not None and q.grad.is_meta
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    assert not _store_views._moved(frozen, META).requires_grad


def test_moves_inside_inference_mode_make_normal_tensors():
    """A move made by a forward pre-hook under inference_mode: the moved
    tensors outlive that forward, so they are normal tensors, usable in
    autograd afterwards."""
    m = Net()
    extras = _module_extras(m, [])
    with torch.inference_mode():
        _store_views._move_extras(extras, META)
    for k in EXTRAS:
        t = get(m, k)
        assert t.is_meta and not t.is_inference(), k
    assert isinstance(m.gate, nn.Parameter) and m.gate.requires_grad
    assert m.cos_alias is m.rope.cos


def test_rehomed_inference_parameter_takes_views():
    """A Parameter made under inference_mode (ComfyUI builds its models so)
    and moved out of it, as a store moves a module's extras to the GPU: the
    result takes views and ops inside inference_mode again. (Given new .data,
    it keeps the inference tensor's missing version counter beside normal
    contents, and its first view raises "Inference tensors do not track
    version counter"; set_data needs a second device to reach from _moved.)"""
    with torch.inference_mode():
        p = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    held = {"modulation": p}
    with torch.inference_mode(False):
        q = _store_views._rehomed(p, torch.ones(2, 3))
    held["modulation"] = q
    assert isinstance(q, nn.Parameter) and not q.requires_grad and not q.is_inference()
    with torch.inference_mode():
        out = (held["modulation"].unsqueeze(0) + torch.zeros(1, 2, 3)).unbind(2)
    assert torch.equal(torch.stack(out, 2)[0], torch.ones(2, 3))
    # a normal Parameter keeps its object
    r = nn.Parameter(torch.zeros(2))
    assert _store_views._rehomed(r, torch.ones(2)) is r and torch.equal(r.detach(), torch.ones(2))


@pytest.mark.parametrize("stream", [None, "auto"])
def test_views_made_inside_inference_mode_are_normal(tmp_path, sim_free, stream):
    """A forward under inference_mode (as ComfyUI runs every node) brings the
    model in and re-points its tensors: the views and Parameters made then
    are normal tensors (a later swap, wrap or autograd use of an inference
    tensor fails), and the module still computes right outside it."""
    ref, path = ref_and_file(tmp_path)
    m = fresh_like(ref)
    with torch.no_grad():
        want = ref(x_for())
    budget = checkpoint_bytes(ref) if stream is None else int(checkpoint_bytes(ref) * STREAMED)
    with ft.Store(SIM, device_budget=budget) as store:
        store.add("net", path, module=m, strict=False, stream=stream)
        with torch.inference_mode():
            got = m(x_for())
        assert torch.equal(got, want)
        inference = [k for k, t in list(m.named_parameters()) + list(m.named_buffers())
                     if not t.is_meta and t.is_inference()]
        assert not inference, inference
        store.offload("net")
        with torch.no_grad():
            assert torch.equal(m(x_for()), want)


def test_extras_moves_with_the_model(tmp_path, sim_free, moves):
    """Where the store moves the extras, recorded: to the device at the first
    forward (each tensor once, tied names together, seen by forward), not
    again while it stays; back at offload; not for a partial to_device; to
    the device at to_device(name) and use(); back when another model evicts
    it all, and at remove."""
    ref, path = ref_and_file(tmp_path)
    _, other = ref_and_file(tmp_path, seed=5, name="other")
    m = fresh_like(ref)
    moves.watch(m)
    with torch.no_grad():
        want = ref(x_for())
    with ft.Store(SIM, device_budget=checkpoint_bytes(ref)) as store:
        store._extras_dev = META
        store.add("net", path, module=m, strict=False)
        store.add("other", other)
        assert moves == [] and all(where(get(m, k)) == "cpu" for k in EXTRAS)
        with torch.no_grad():
            assert torch.equal(m(x_for()), want)
        assert took(moves, "meta") == sorted(EXTRAS)
        assert all(where(m.seen[k]) == "meta" for k in EXTRAS)
        assert m.seen["cos_alias"] is m.seen["rope.cos"] and m.cos_alias is m.rope.cos
        assert isinstance(m.gate, nn.Parameter) and m.gate.requires_grad
        moves.clear()
        with torch.no_grad():
            assert torch.equal(m(x_for()), want)
        assert moves == []  # still there

        store.offload("net")
        assert took(moves, "cpu") == sorted(EXTRAS)
        assert all(where(get(m, k)) == "cpu" for k in EXTRAS)
        for k in EXTRAS:
            assert torch.equal(get(m, k), get(ref, k)), k
        moves.clear()

        store.to_device("net", ["inp.weight"])
        assert moves == []  # part of the model: its forward brings the rest
        store.to_device("net")
        assert took(moves, "meta") == sorted(EXTRAS)
        moves.clear()

        store.to_device("other")  # the budget holds one model: net is evicted whole
        assert all(s.tier != "device" for s in store.tensor_states("net").values())
        assert took(moves, "cpu") == sorted(EXTRAS)
        moves.clear()

        with store.use("net"):
            assert took(moves, "meta") == sorted(EXTRAS)
            assert torch.equal(m(x_for()), want)
        moves.clear()
        store.remove("net")
        assert took(moves, "cpu") == sorted(EXTRAS)
        assert m.cos_alias is m.rope.cos
    for k in EXTRAS:
        assert torch.equal(get(m, k), get(ref, k)), k


def test_extras_of_a_streamed_model_move_at_step_start(tmp_path, sim_free, moves):
    """stream="auto": the streamer's step start brings the extras to the
    device (Store._extras_to(name)); they stay across steps and go back when
    the model is offloaded or the store closes."""
    ref, path = ref_and_file(tmp_path)
    m = fresh_like(ref)
    moves.watch(m)
    with torch.no_grad():
        want = [ref(x_for(s)) for s in range(3)]
    with ft.Store(SIM, device_budget=int(checkpoint_bytes(ref) * STREAMED)) as store:
        store._extras_dev = META
        store.add("net", path, module=m, strict=False, stream="auto")
        for s in range(3):
            with torch.no_grad():
                assert torch.equal(m(x_for(s)), want[s])
            assert all(where(m.seen[k]) == "meta" for k in EXTRAS), s
        assert store.stream_stats("net")["streamed_blocks"] > 0
        assert took(moves, "meta") == sorted(EXTRAS)
        moves.clear()
        store.offload("net")
        assert took(moves, "cpu") == sorted(EXTRAS)
        moves.clear()
        with torch.no_grad():
            assert torch.equal(m(x_for(0)), want[0])
        assert took(moves, "meta") == sorted(EXTRAS)
        moves.clear()
    assert took(moves, "cpu") == sorted(EXTRAS)  # closed: detached, sent back


def test_keys_pair_differently_named_tensors(tmp_path, sim_free):
    """add(keys=): a module whose names are the file's under a prefix (as
    ComfyUI's model holds a diffusion model's file) is paired through the
    map; the file's other tensors stay in the store only and never come to
    the device with the module; a map naming a tensor the file lacks is an
    error that names it."""
    ref = reference(0)
    sd = {k: v for k, v in ref.state_dict().items() if k not in Net.CHECKPOINT_LACKS}
    path = tmp_path / "prefixed.safetensors"
    entries = [("model." + k, "F32", list(v.shape), tensor_bytes(v)) for k, v in sd.items()]
    unused = torch.arange(4096, dtype=torch.float32)
    entries.append(("vae.unused", "F32", [4096], tensor_bytes(unused)))
    stwriter.write(str(path), entries)
    with torch.no_grad():
        want = ref(x_for())
    with ft.Store(SIM) as store:
        with pytest.raises(RuntimeError, match='"model.nope"'):
            store.add("bad", path, module=fresh_like(ref), strict=False, keys={"inp.weight": "model.nope"})
        m = fresh_like(ref)
        store.add("net", path, module=m, strict=False, keys={k: "model." + k for k in sd})
        with torch.no_grad():
            assert torch.equal(m(x_for()), want)
        store.to_device("net")
        states = store.tensor_states("net")
        assert states["vae.unused"].tier != "device", states["vae.unused"]
        assert all(states["model." + k].tier == "device" for k in sd)


def test_block_quantized_pairs_with_its_bytes(tmp_path, sim_free):
    """A GGUF block-quantized tensor pairs with a uint8 module tensor of its
    bytes (as load_file gives it) and comes to the device as those bytes; a
    float module tensor is a dtype mismatch that names it."""
    import gguf_writer
    raw = bytes(range(256)) * (34 * 8 // 256) + bytes(34 * 8 % 256)
    path = tmp_path / "q.gguf"
    gguf_writer.write(str(path), [("w", "Q8_0", [8, 32], raw), ("b", "F32", [8], bytes(32))])

    class Q(nn.Module):
        def __init__(self, dtype, shape):
            super().__init__()
            self.w = nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
            self.b = nn.Parameter(torch.empty(8, device="meta"))

    with ft.Store(SIM) as store:
        with pytest.raises(RuntimeError, match=r"dtype mismatch for w: a Q8_0 \(block-quantized\) tensor"):
            store.add("f", path, module=Q(torch.float32, (8, 32)))
        m = Q(torch.uint8, (len(raw),))
        store.add("q", path, module=m)
        store.to_device("q")
        assert m.w.dtype == torch.uint8 and bytes(m.w.tolist()) == raw
