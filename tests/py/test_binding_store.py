# SPDX-License-Identifier: Apache-2.0
"""ferry.torch.Store on ferry's simulated GPU ("sim:1GiB", whose device memory
is host memory, so the attached modules' parameters are cpu views of it): an
attached module computes what the same module loaded normally computes,
across offloads (forward pre-hook reloads), evictions by the policy when
another model comes in or make_room runs, and dirty tensors saved to host RAM
or the spill file; job statistics; errors."""
import ctypes
import gc
import os
import re
import tempfile

import pytest

import ferry
import stwriter

torch = pytest.importorskip("torch")
import ferry.torch as ft  # noqa: E402
from ferry.torch import _stream  # noqa: E402

nn = torch.nn
SIM = "sim:1GiB"
FERRY_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


class Net(nn.Module):
    """Linear layers, a LayerNorm and a persistent buffer (and a non-persistent
    one, which moves with the model: test_binding_store_extras.py)."""

    def __init__(self, dim=32, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.inp = nn.Linear(dim, 2 * dim, **kw)
        self.norm = nn.LayerNorm(2 * dim, **kw)
        self.blocks = nn.ModuleList([nn.Linear(2 * dim, 2 * dim, **kw) for _ in range(2)])
        self.out = nn.Linear(2 * dim, 8, **kw)
        self.register_buffer("scale", torch.ones(8, **kw))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x):
        h = self.norm(self.inp(x))
        for b in self.blocks:
            h = h + torch.tanh(b(h))
        return self.out(h) * self.scale


def make_reference(seed=0, dtype=torch.float32, dim=32):
    torch.manual_seed(seed)
    m = Net(dim=dim, dtype=dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
        m.scale.uniform_(0.5, 1.5)
    return m


def tensor_bytes(t):
    t = t.detach().contiguous()
    return bytes(t.reshape(-1).view(torch.uint8).tolist())


def write_checkpoint(path, module, names=None):
    """module's state_dict (or the names of it) as a safetensors file, with
    ferry's own writer (no safetensors package needed)."""
    sd = module.state_dict()
    stwriter.write(str(path), [(k, FERRY_DTYPE[v.dtype], list(v.shape), tensor_bytes(v))
                               for k, v in sd.items() if names is None or k in names])
    return path


def ref_and_file(tmp_path, seed=0, dtype=torch.float32, name="net.safetensors", dim=32):
    ref = make_reference(seed, dtype, dim)
    return ref, write_checkpoint(tmp_path / name, ref)


def managed(m):
    """The tensors the store manages (parameters and persistent buffers)."""
    return dict(m.state_dict())


def x_for(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 32, generator=g).to(dtype)


def same_output(m, ref, dtype=torch.float32):
    x = x_for(dtype)
    with torch.no_grad():
        a, b = m(x), ref(x)
    assert a.dtype == b.dtype and torch.equal(a, b)


def _fs_type(path):
    """The filesystem type holding path (longest mount point prefix)."""
    path = os.path.realpath(path)
    best, typ = "", None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mnt = parts[4]
            fstype = parts[parts.index("-") + 1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, typ = mnt, fstype
    return typ


@pytest.fixture
def spill_dir(tmp_path):
    """A directory for the spill file: not tmpfs, which the store refuses."""
    if _fs_type(tmp_path) not in ("tmpfs", "ramfs"):
        d = tmp_path / "spill"
        d.mkdir()
        yield str(d)
        return
    d = tempfile.mkdtemp(prefix="ferry-spill-", dir="/var/tmp")
    yield d
    os.rmdir(d)


@pytest.fixture
def sim_free():
    """The sim device's capacity is all free again after the test (every
    store freed its memory)."""
    yield
    gc.collect()
    free, total = ferry.device(SIM).mem_info()
    assert free == total, f"{total - free} bytes of the sim device still held"


def tiers(store, name):
    return {k: s.tier for k, s in store.tensor_states(name).items()}


# ---- attached modules ------------------------------------------------------

def test_attached_module_computes_like_the_reference(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM, spill_dir=str(tmp_path)) as store:
        assert store.add("net", path, module=m) == "net"
        assert store.module("net") is m and "net" in store and len(store) == 1
        # nothing read yet: meta placeholders of the right shape and dtype
        for k, t in managed(m).items():
            assert t.is_meta and t.shape == ref.state_dict()[k].shape and t.dtype == torch.float32, k
        assert set(tiers(store, "net").values()) == {"source"}
        assert m.cache.device.type == "cpu"  # not in the checkpoint: with the model (on sim, the cpu)
        same_output(m, ref)
        # the parameters are zero-copy views of the store's device memory
        states = store.tensor_states("net")
        for k, t in managed(m).items():
            assert t.device.type == "cpu", k
            assert states[k].tier == "device" and t.data_ptr() == states[k].dptr, k
            assert torch.equal(t, ref.state_dict()[k]), k
        assert isinstance(m.inp.weight, nn.Parameter) and m.inp.weight.requires_grad
        assert states["inp.weight"].holds == 0  # released after forward
        st = store.stats()
        assert st["tier_bytes"]["device"] == sum(s.nbytes for s in states.values())
        assert st["models"] == 1 and st["tensors"] == len(states)
    assert all(t.is_meta for t in managed(m).values())  # closed: detached, nothing dangles
    assert not m._forward_pre_hooks and not m._forward_hooks
    try:
        out = m(x_for())
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    else:  # torch 1.13 computes on meta weights: a meta result, never stale numbers
        assert out.is_meta


def test_materialised_module_and_bf16(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path, dtype=torch.bfloat16)
    m = Net(dtype=torch.bfloat16)  # a real cpu module: its own memory is dropped
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)
        assert all(t.is_meta for t in managed(m).values())
        same_output(m, ref, torch.bfloat16)
        assert m.inp.weight.dtype == torch.bfloat16


def test_offload_and_forward_pre_hook_reload(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)
        store.to_device("net")
        assert set(tiers(store, "net").values()) == {"device"}
        assert all(t.device.type == "cpu" for t in managed(m).values())
        same_output(m, ref)
        for _ in range(3):
            store.offload("net")
            assert set(tiers(store, "net").values()) == {"source"}  # clean: dropped
            assert all(t.is_meta for t in managed(m).values())
            same_output(m, ref)  # the pre-hook brings it back
            assert set(tiers(store, "net").values()) == {"device"}
        st = store.stats()
        assert st["dropped"] == st["evicted"] > 0 and st["bytes_written"] == 0
        # part of a model: a tensor and its group (the module's other tensors)
        store.offload("net", "blocks.0.weight")
        t = tiers(store, "net")
        assert t["blocks.0.weight"] == t["blocks.0.bias"] == "source" and t["inp.weight"] == "device"
        assert m.blocks[0].weight.is_meta and m.blocks[0].bias.is_meta and not m.inp.weight.is_meta
        store.to_device("net", ["blocks.0.bias"])
        assert not m.blocks[0].weight.is_meta
        same_output(m, ref)


def test_parameters_keep_their_identity_where_torch_can_swap(tmp_path, sim_free):
    """torch 2.3+ (torch.utils.swap_tensors): every move swaps the contents of
    the module's Parameter objects, so references kept to them (an
    optimizer's) stay valid; older torch puts new Parameters in, as
    documented. A parameter with a weak reference cannot be swapped: it is
    replaced, and the module still computes right."""
    import weakref

    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    can_swap = hasattr(torch.utils, "swap_tensors")
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)
        kept = dict(m.named_parameters())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for cycle in range(3):
            store.to_device("net")
            states = store.tensor_states("net")
            for k, p in m.named_parameters():
                assert isinstance(p, nn.Parameter) and p.requires_grad and not p.is_meta, k
                assert p.data_ptr() == states[k].dptr, k
                assert (p is kept[k]) == can_swap, (cycle, k)
            if can_swap:
                assert all(a is b for a, b in zip(opt.param_groups[0]["params"], m.parameters()))
            same_output(m, ref)
            store.offload("net")
            for k, p in m.named_parameters():
                assert p.is_meta and (p is kept[k]) == can_swap, (cycle, k)
        # a weak reference to a parameter: replaced instead of swapped
        w = weakref.ref(m.inp.weight)
        before = m.inp.weight
        store.to_device("net")
        assert m.inp.weight is not before and w() is before and before.is_meta
        assert m.inp.weight.data_ptr() == store.tensor_state("net", "inp.weight").dptr
        same_output(m, ref)


def test_pinned_while_forward_runs(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    seen = {}
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)

        def inside(mod, args, out):
            seen["holds"] = {k: s.holds for k, s in store.tensor_states("net").items()}
            assert store.make_room(None) == 0  # everything is held: nothing evictable
            with pytest.raises(ferry.BudgetError):
                store.make_room("1GiB")
            with pytest.raises(ferry.BusyError, match="is in use"):
                store.offload("net")
            seen["device"] = set(tiers(store, "net").values())

        m.norm.register_forward_hook(inside)
        same_output(m, ref)
        assert set(seen["holds"].values()) == {1} and seen["device"] == {"device"}
        assert {s.holds for s in store.tensor_states("net").values()} == {0}
        # a forward that raises still releases where torch can say so (2.1+)
        with pytest.raises(RuntimeError):
            m(torch.randn(5, 7))
        if _stream._HOOK_ALWAYS_CALL:
            assert {s.holds for s in store.tensor_states("net").values()} == {0}
        store.release_holds("net")  # what older torch needs after such a forward
        with pytest.warns(DeprecationWarning, match="Store.unpin is deprecated"):
            store.unpin("net")  # the old name, one release more (nothing left to release)
        assert {s.holds for s in store.tensor_states("net").values()} == {0}
        with store.use("net"):
            assert {s.holds for s in store.tensor_states("net").values()} == {1}
            same_output(m, ref)
        assert {s.holds for s in store.tensor_states("net").values()} == {0}
        store.offload("net")


def test_mark_dirty_survives_the_spill_file(tmp_path, spill_dir, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM, host_budget="1", spill_dir=spill_dir) as store:
        store.add("net", path, module=m)
        same_output(m, ref)
        with torch.no_grad():
            # a LoRA-like merge into two weights, in place on the device
            delta = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)) * 0.1
            m.blocks[0].weight.add_(delta)
            ref.blocks[0].weight.add_(delta)
            m.out.bias.mul_(-2)
            ref.out.bias.mul_(-2)
        store.mark_dirty("net", "blocks.0.weight")  # by name ...
        store.mark_dirty("net", m.out.bias)          # ... or by the parameter itself
        assert store.tensor_state("net", "blocks.0.weight").dirty
        assert not store.tensor_state("net", "blocks.0.bias").dirty
        same_output(m, ref)
        store.offload("net")
        st = store.tensor_state("net", "blocks.0.weight")
        assert st.tier == "spill" and st.dirty and st.dptr == 0
        assert store.tensor_state("net", "out.bias").tier == "spill"
        assert store.tensor_state("net", "inp.weight").tier == "source"
        s = store.stats()
        assert s["bytes_written"] >= 64 * 64 * 4 + 8 * 4 and s["spill_file_bytes"] > 0
        assert s["tier_bytes"]["spill"] == 64 * 64 * 4 + 8 * 4 and s["spill_path"] == spill_dir
        assert os.listdir(spill_dir) == []  # the spill file has no name
        assert torch.equal(store.read("net", "blocks.0.weight"), ref.blocks[0].weight)  # from the spill file
        store.to_device("net")
        assert torch.equal(m.blocks[0].weight, ref.blocks[0].weight)
        assert store.tensor_state("net", "blocks.0.weight").dirty  # still differs from the file
        same_output(m, ref)
        for _ in range(3):  # and again, through the pre-hook
            store.offload("net")
            same_output(m, ref)


def test_unmarked_change_is_dropped_and_host_ram_tier(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM) as store:  # default host budget: dirty tensors go to pinned RAM
        store.add("net", path, module=m)
        store.to_device("net")
        with torch.no_grad():
            m.inp.weight.zero_()      # not marked: lost when it leaves
            m.blocks[1].bias.fill_(3)
            ref.blocks[1].bias.fill_(3)
        store.mark_dirty("net", m.blocks[1].bias.data)  # a view of the device memory works too
        store.offload("net")
        assert store.tensor_state("net", "blocks.1.bias").tier in ("pinned", "host")
        assert store.tensor_state("net", "inp.weight").tier == "source"
        same_output(m, ref)  # inp.weight came back from the file


def test_two_models_under_one_budget(tmp_path, sim_free):
    """A budget of exactly one model: using one evicts all of the other."""
    ref_a, path_a = ref_and_file(tmp_path, seed=1, name="a.safetensors", dim=32)
    ref_b, path_b = ref_and_file(tmp_path, seed=2, name="b.safetensors", dim=32)
    size = sum(t.numel() * t.element_size() for t in managed(ref_a).values())
    a, b = Net(device="meta"), Net(device="meta")
    with ft.Store(SIM, device_budget=size) as store:
        store.add("a", path_a, module=a)
        store.add("b", path_b, module=b, priority=0)
        for i in range(4):
            same_output(a, ref_a)
            assert set(tiers(store, "a").values()) == {"device"}
            assert all(t.is_meta for t in managed(b).values()), "b was not re-pointed"
            same_output(b, ref_b)
            assert set(tiers(store, "b").values()) == {"device"}
            assert all(t.is_meta for t in managed(a).values()), "a was not re-pointed"
            if i == 1:  # a dirty change in b goes to host RAM and back when b is evicted
                with torch.no_grad():
                    b.blocks[1].weight.mul_(0.5)
                    ref_b.blocks[1].weight.mul_(0.5)
                store.mark_dirty("b", "blocks.1.weight")
        st = store.stats()
        assert st["evicted"] > 0 and st["tier_bytes"]["device"] <= st["device_budget"]
        # explicit switching works the same
        store.to_device("a")
        assert not a.inp.weight.is_meta and b.inp.weight.is_meta
        same_output(a, ref_a)


def test_model_swaps_from_the_pinned_cache(tmp_path, sim_free):
    """pinned_cache=True: two models under a budget of one swap by DMA from
    pinned RAM after their first loads (nothing read from the checkpoints),
    outputs unchanged; set_pinned_cache(False) drops the copies."""
    ref_a, path_a = ref_and_file(tmp_path, seed=1, name="a.safetensors", dim=32)
    ref_b, path_b = ref_and_file(tmp_path, seed=2, name="b.safetensors", dim=32)
    size = sum(t.numel() * t.element_size() for t in managed(ref_a).values())
    a, b = Net(device="meta"), Net(device="meta")
    with ft.Store(SIM, device_budget=size, pinned_budget="64MiB") as store:
        store.add("a", path_a, module=a, pinned_cache=True)
        store.add("b", path_b, module=b, pinned_cache=True)
        same_output(a, ref_a)
        same_output(b, ref_b)  # a leaves: its pinned copy stays
        assert set(tiers(store, "a").values()) == {"pinned"}
        read = store.stats()["bytes_read"]
        for _ in range(3):
            same_output(a, ref_a)
            assert set(tiers(store, "b").values()) == {"pinned"}
            same_output(b, ref_b)
        st = store.stats()
        assert st["bytes_read"] == read, "a swap read the checkpoint"
        assert st["bytes_written"] == 0
        assert st["pinned_cache_bytes"] >= 2 * size
        store.set_pinned_cache("a", False)
        assert set(tiers(store, "a").values()) == {"source"}
        same_output(a, ref_a)
        assert store.stats()["bytes_read"] > read
        with pytest.raises(ferry.NotFoundError):
            store.set_pinned_cache("nope", True)


def test_pinned_reserve_takes_the_dirty_evictions(tmp_path, sim_free):
    """pinned_reserve: the pool is pinned ahead (stats say how much), a dirty
    eviction lands in it (pinned, not pageable) without the pool growing, and
    the reserve stays pinned through make_room; capped at pinned_budget."""
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM, pinned_budget="64MiB", pinned_reserve="4MiB") as store:
        store.wait_pinned()
        st = store.stats()
        assert st["pinned_reserve"] == st["pinned_reserved"] == st["pinned_pool_bytes"] == 4 << 20
        store.add("net", path, module=m)
        same_output(m, ref)
        with torch.no_grad():
            m.out.bias.mul_(-2)
            ref.out.bias.mul_(-2)
        store.mark_dirty("net", "out.bias")
        store.offload("net")
        assert store.tensor_state("net", "out.bias").tier == "pinned"
        assert store.stats()["pinned_pool_bytes"] == 4 << 20
        same_output(m, ref)
        store.make_room()
        assert store.stats()["pinned_pool_bytes"] == 4 << 20
        same_output(m, ref)
    with ft.Store(SIM, pinned_budget="1MiB", pinned_reserve="4MiB") as store:
        store.wait_pinned()
        assert store.stats()["pinned_reserve"] == 1 << 20
    with ft.Store(SIM) as store:
        store.wait_pinned()  # none asked for: at once
        assert store.stats()["pinned_reserve"] == 0


def test_partial_eviction_by_the_policy(tmp_path, sim_free):
    """A budget of one and a half models: bringing one in evicts only as many
    of the other's groups as needed; those (and only those) are re-pointed."""
    ref_a, path_a = ref_and_file(tmp_path, seed=1, name="a.safetensors")
    ref_b, path_b = ref_and_file(tmp_path, seed=2, name="b.safetensors")
    size = sum(t.numel() * t.element_size() for t in managed(ref_a).values())
    a, b = Net(device="meta"), Net(device="meta")
    with ft.Store(SIM, device_budget=size * 3 // 2) as store:
        store.add("a", path_a, module=a)
        store.add("b", path_b, module=b)
        for step in range(4):
            for mod, ref, name in ((a, ref_a, "a"), (b, ref_b, "b")):
                same_output(mod, ref)
                if step == 0 and name == "a":
                    continue  # b has not been on the device yet
                other, oname = (b, "b") if name == "a" else (a, "a")
                t = tiers(store, oname)
                off = {k for k, v in t.items() if v != "device"}
                assert off and len(off) < len(t)
                for k, v in managed(other).items():
                    assert v.is_meta == (k in off), k
                states = store.tensor_states(oname)
                for k, v in managed(other).items():
                    if k not in off:
                        assert v.data_ptr() == states[k].dptr, k
        assert store.stats()["tier_bytes"]["device"] <= size * 3 // 2


def test_make_room(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM, device_budget="64MiB") as store:
        store.add("net", path, module=m)
        store.to_device("net")
        before = store.tensor_states("net")
        with pytest.raises(ferry.BudgetError) as ei:
            store.make_room("2GiB")
        msg = str(ei.value)
        assert "2147483648" in msg and "nothing was evicted" in msg, msg
        assert ei.value.could < 2 << 30
        assert store.tensor_states("net") == before  # nothing evicted
        assert not m.inp.weight.is_meta
        assert store.make_room(0) == 0 and store.make_room("1MiB") == 0  # room enough already
        nbytes = sum(s.nbytes for s in before.values())
        assert store.make_room(None) == nbytes  # everything evictable
        assert all(t.is_meta for t in managed(m).values())  # re-pointed
        assert store.stats()["device_cached"] == 0  # given back to the driver
        same_output(m, ref)


def test_job_stats(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)
        with store.job("denoise") as j:
            assert j.stats is None
            same_output(m, ref)
            store.offload("net")
        s = j.stats
        assert s["job"] == "denoise" and s["seconds"] >= 0
        for k in ("rss", "uss", "pss", "cgroup"):
            assert set(s[k]) == {"start", "end", "peak"}, k
        assert s["rss"]["peak"] >= s["rss"]["start"] > 0 and s["rss"]["peak"] >= s["rss"]["end"] > 0
        for k in ("device_bytes", "pinned_bytes", "host_bytes", "spill_bytes", "bytes_htod", "bytes_dtoh",
                  "bytes_written", "bytes_read", "seconds_htod", "seconds_dtoh", "evicted", "dropped"):
            assert k in s, k
        total = sum(t.numel() * t.element_size() for t in managed(ref).values())
        assert s["bytes_htod"] == total and s["evicted"] == s["dropped"] > 0 and s["device_bytes"] == 0
        # one job at a time; a job ends (and has stats) when its block raises
        with store.job("outer"):
            with pytest.raises(ferry.BusyError, match="job .outer. is still open"):
                with store.job("inner"):
                    pass
        with pytest.raises(KeyError):
            with store.job("failing") as j2:
                raise KeyError("x")
        assert j2.stats["job"] == "failing"


def test_several_files_read_write_and_remove(tmp_path, sim_free):
    ref = make_reference(3)
    keys = list(ref.state_dict())
    p1 = write_checkpoint(tmp_path / "part1.safetensors", ref, keys[:5])
    p2 = write_checkpoint(tmp_path / "part2.safetensors", ref, keys[5:])
    m = Net(device="meta")
    with ft.Store(SIM) as store:
        store.add("net", [p1, str(p2)], module=m)
        assert sorted(store.tensor_names("net")) == sorted(keys)
        same_output(m, ref)
        # read: a cpu copy from whichever tier; write: overwrite on the device, dirty
        w = store.read("net", "out.weight")
        assert torch.equal(w, ref.out.weight) and w.data_ptr() != m.out.weight.data_ptr()
        store.write("net", "out.weight", torch.full((8, 64), 0.25))
        with torch.no_grad():
            ref.out.weight.fill_(0.25)
        assert store.tensor_state("net", "out.weight").dirty
        store.offload("net")
        assert torch.equal(store.read("net", "out.weight"), ref.out.weight)
        same_output(m, ref)
        # remove: the module is detached and the memory freed
        store.remove("net")
        assert "net" not in store and store.names() == []
        assert all(t.is_meta for t in managed(m).values())
        assert not m._forward_pre_hooks
        store.add("net", p1, module=Net(device="meta"), strict=False)  # the name is free again
        assert store.names() == ["net"]


def test_views_keep_the_store(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    store = ft.Store(SIM)
    store.add("net", path, module=m)
    store.to_device("net")
    w = m.inp.weight.detach()  # a view of the store's memory the caller kept
    store.close()
    store.close()  # twice is fine
    gc.collect()
    free, total = ferry.device(SIM).mem_info()
    assert free < total, "the store was freed while a view of it lives"
    assert torch.equal(w, ref.inp.weight)
    del w
    gc.collect()
    free, total = ferry.device(SIM).mem_info()
    assert free == total
    with pytest.raises(ValueError, match="closed"):
        store.to_device("net")


def test_errors(tmp_path, sim_free):
    ref, path = ref_and_file(tmp_path)
    m = Net(device="meta")
    with ft.Store(SIM) as store:
        store.add("net", path, module=m)
        for call in (lambda: store.to_device("nope"), lambda: store.offload("nope"),
                     lambda: store.mark_dirty("nope", "inp.weight"), lambda: store.tensor_state("nope", "x"),
                     lambda: store.remove("nope")):
            with pytest.raises(ferry.NotFoundError) as ei:
                call()
            assert isinstance(ei.value, (LookupError, ferry.FerryError))
            assert "no model called 'nope'" in str(ei.value) and '"net"' in str(ei.value)
        with pytest.raises(ferry.NotFoundError, match="no tensor called 'inp.nope'"):
            store.tensor_state("net", "inp.nope")
        with pytest.raises(ferry.NotFoundError, match="none of its tensors"):
            store.mark_dirty("net", torch.zeros(3))
        with pytest.raises(ferry.InvalidArgumentError, match="not on the device"):
            store.mark_dirty("net", "inp.weight")  # still in the checkpoint
        with pytest.raises(ferry.InvalidArgumentError, match="already in the store"):
            store.add("net", path)
        with pytest.raises(ValueError, match="already attached"):
            store.add("again", path, module=m)
        with pytest.raises(FileNotFoundError):
            store.add("missing", tmp_path / "absent.safetensors")
        assert store.names() == ["net"]

        # key, shape and dtype checks as load_state_dict's; nothing added then
        class Other(Net):
            def __init__(self, **kw):
                super().__init__(**kw)
                self.extra = nn.Linear(2, 2, **kw)
        with pytest.raises(RuntimeError, match='Missing key.*"extra.weight"'):
            store.add("other", path, module=Other(device="meta"))
        bad = Net(device="meta")
        bad.out = nn.Linear(64, 9, device="meta")
        with pytest.raises(RuntimeError, match="size mismatch for out.weight"):
            store.add("bad", path, module=bad)
        with pytest.raises(RuntimeError, match="dtype mismatch"):
            store.add("half", path, module=Net(device="meta", dtype=torch.float16))
        small = nn.Module()
        small.inp = nn.Linear(32, 64, device="meta")
        with pytest.raises(RuntimeError, match="Unexpected key"):
            store.add("small", path, module=small)
        assert store.names() == ["net"] and not bad._forward_pre_hooks
        store.add("small", path, module=small, strict=False)
        store.to_device("small")
        assert torch.equal(small.inp.weight, ref.inp.weight)
        with pytest.raises(ValueError, match="nbytes"):
            store.make_room("lots")
    with pytest.raises(ValueError, match="device"):
        ft.Store("tpu:0")
    with pytest.raises(ferry.InvalidArgumentError):
        ft.Store("sim:nonsense")


def test_device_arguments(tmp_path):
    """load_file and Store read their device argument the same way: bad
    strings are ValueErrors naming the caller, other types TypeErrors."""
    _, path = ref_and_file(tmp_path)
    for who, call in (("ferry.torch", lambda d: ft.load_file(path, device=d)),
                      ("ferry.torch.Store", lambda d: ft.Store(d))):
        with pytest.raises(ValueError, match=f"^{who}: bad device 'bogus'"):
            call("bogus")
        with pytest.raises(TypeError, match="device must be a str, int or torch.device, not float"):
            call(1.5)
    with pytest.raises(ValueError, match="needs owner='ferry'"):
        ft.load_file(path, device=SIM)
    with pytest.raises(ValueError, match="must be cuda"):
        ft.Store(torch.device("meta"))


def test_store_struct_layouts():
    """The ctypes structs have the C sizes (x86-64 / aarch64 LP64), which are
    the sizes the library reports."""
    from ferry import _lib
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("LP64 only")
    assert ctypes.sizeof(_lib.StoreOpts) == 88
    assert ctypes.sizeof(_lib.StoreStats) == 248
    assert ctypes.sizeof(_lib.JobStats) == 208
    assert ctypes.sizeof(_lib.TensorState) == 64
    assert ctypes.sizeof(_lib.PlanOpts) == 64
    assert ctypes.sizeof(_lib.Plan) == 88
    assert ctypes.sizeof(_lib.StreamerOpts) == 72
    assert ctypes.sizeof(_lib.StreamerStats) == 176
    for cls in (_lib.StoreOpts, _lib.StoreStats, _lib.JobStats, _lib.TensorState, _lib.PlanOpts, _lib.Plan,
                _lib.StreamerOpts, _lib.StreamerStats):
        assert ctypes.sizeof(cls) == _lib.lib.ferry_abi_sizeof(cls._ferry_name_.encode()), cls


def test_busy_tensors_and_jobs(tmp_path, sim_free):
    """FERRY_E_BUSY is BusyError, with the model's message: evicting or
    removing a model while it is in use, opening a second job."""
    from ferry import _lib
    _, path = ref_and_file(tmp_path)
    with ft.Store(SIM) as store:
        store.add("net", path)
        with store.use("net"):
            with pytest.raises(ferry.BusyError, match="is in use") as e:
                store.offload("net")
            assert e.value.code == _lib.E_BUSY and e.value.name == "BUSY" and e.value.filename == str(path)
            assert re.fullmatch(r"""model (['"])net\1: tensor (['"])[a-z0-9.]+\2 is in use: release it before """
                                r"evicting", e.value.message), e.value.message
            with pytest.raises(ferry.BusyError) as e:
                store.remove("net")
            assert re.fullmatch(r"""model (['"])net\1: tensor (['"])[a-z0-9.]+\2 is in use: release it first""",
                                e.value.message), e.value.message
            del e  # its traceback holds the store
            assert "net" in store and set(tiers(store, "net").values()) == {"device"}
        store.offload("net")
        store.remove("net")
        assert "net" not in store
        with store.job("a") as j:
            with pytest.raises(ferry.BusyError) as e:
                with store.job("b"):
                    pass
            assert re.fullmatch(r"""job (['"])a\1 is still open: end it before (['"])b\2""", e.value.message), \
                e.value.message
            del e
        assert j.stats["job"] == "a"


def test_spill_dir_from_the_environment(tmp_path, spill_dir, sim_free, monkeypatch):
    """The library reads no environment: with no spill_dir the binding passes
    $FERRY_SPILL_DIR; an explicit spill_dir wins over it."""
    ref, path = ref_and_file(tmp_path)

    def spill_once(store):
        m = Net(device="meta")
        store.add("net", path, module=m)
        assert store.stats()["spill_path"] == ""  # no spill file yet
        same_output(m, ref)
        store.mark_dirty("net", "out.bias")
        store.offload("net")
        assert store.tensor_state("net", "out.bias").tier == "spill"
        s = store.stats()
        assert s["tier_bytes"]["spill"] == 8 * 4
        d = ferry._lib.lib.ferry_store_spill_dir(store._core.s)
        assert d is not None and s["spill_path"] == os.fsdecode(d)
        return s["spill_path"]

    monkeypatch.setenv("FERRY_SPILL_DIR", spill_dir)
    with ft.Store(SIM, host_budget="1") as store:
        assert spill_once(store) == spill_dir
    monkeypatch.setenv("FERRY_SPILL_DIR", str(tmp_path / "not-there"))  # would fail the spill
    with ft.Store(SIM, host_budget="1", spill_dir=spill_dir) as store:
        assert spill_once(store) == spill_dir


def test_stats_keys_kept(tmp_path, sim_free):
    """stats() keeps the keys (and their order) the struct used to have:
    host_source after host_available, spill_path after spilling; no size."""
    _, path = ref_and_file(tmp_path)
    with ft.Store(SIM) as store:
        store.add("net", path)
        s = store.stats()
        keys = list(s)
        assert "size" not in keys and keys[0] == "tier_bytes"
        assert keys[keys.index("host_available") + 1] == "host_source" and s["host_source"]
        assert keys[keys.index("spilling") + 1] == "spill_path" and s["spill_path"] == ""
        assert s["models"] == 1 and s["tensors"] == len(store.tensor_names("net"))
        with store.job("j") as j:
            pass
        assert list(j.stats)[:2] == ["job", "seconds"] and "size" not in j.stats


def test_queued_moves_through_the_core(tmp_path, sim_free):
    """ferry_model_to_device_async through the binding's core: an Op to wait
    on, a stream to order after it (0 on sim: the caller's thread), a hold
    released after a stream; the bytes land, and an Op let go waits itself."""
    ref, path = ref_and_file(tmp_path)
    with ft.Store(SIM) as store:
        store.add("net", path)
        core, m = store._core, store._model("net")
        op = core.to_device_async(m)
        op.stream_wait(0)
        assert op.done()
        op.wait()
        op.wait()  # once is enough: a second wait is a no-op
        assert set(tiers(store, "net").values()) == {"device"}
        want = dict(ref.state_dict())
        for name, t in want.items():
            assert torch.equal(store.read("net", name), t), name
        store.offload("net")
        op = core.to_device_async(m, [0])
        del op  # let go: it waits for itself
        gc.collect()
        assert tiers(store, "net")[m.infos[0].name] == "device"
        core.hold(m, 0)
        core.release_after(m, 0, 0)  # the caller's thread on sim: nothing queued, the hold goes now
        assert store.tensor_state("net", m.infos[0].name).holds == 0
        with pytest.raises(ferry.InvalidArgumentError, match="not in use"):
            core.release_after(m, 0, 0)


def test_module_tensors_and_swap_parameter_data_are_public():
    """The two helpers code moving a module's tensors itself uses: the
    state_dict entries (tied names each listed, non-persistent buffers not),
    and a Parameter given new contents in place where torch can swap."""
    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    m[1].weight = torch.nn.Parameter(torch.zeros(2, 3))
    m.register_buffer("scratch", torch.zeros(1), persistent=False)
    m.register_buffer("kept", torch.zeros(1))
    got = [(k, owner is m or owner in m, attr, is_param, t is dict(m.state_dict(keep_vars=True))[k])
           for k, owner, attr, is_param, t in ft.module_tensors(m)]
    assert [g[0] for g in got] == list(m.state_dict().keys())
    assert all(g[1] and g[4] for g in got)
    assert dict((g[0], g[3]) for g in got) == {"0.weight": True, "0.bias": True, "1.weight": True,
                                               "1.bias": True, "kept": False}
    old = m[0].weight
    new = ft.swap_parameter_data(old, torch.ones(3, 2), requires_grad=True)
    assert isinstance(new, torch.nn.Parameter) and new.requires_grad and bool((new == 1).all())
    if hasattr(torch.utils, "swap_tensors"):
        assert new is old
