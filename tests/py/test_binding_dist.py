# SPDX-License-Identifier: Apache-2.0
"""ferry.torch.load_file(..., process_group=pg) across processes: gloo on
cpu, several worker processes on this machine (file:// rendezvous in a temp
folder), as CI can run it.

The workers are this file run as a script (python test_binding_dist.py
worker ...): each joins the group, loads every checkpoint with the group,
records what it read from storage (every ferry_file_tensor_read call, by
wrapping the ctypes function) and writes a JSON report. The tests check those
reports: every tensor bit-identical to the plain load on every rank, each
rank's reads within ceil(total/N) + the largest tensor, the ranks' reads
disjoint and covering the file, subgroups, errors. All the workers of one
world size run once (module fixture) to keep the suite fast.
"""
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER_TIMEOUT = 120  # seconds for a whole world; a hang fails the test instead of blocking CI


# ---- checkpoints (written by the parent, read by every worker) -------------

def _bytes(seed, n):
    import random
    return random.Random(seed).randbytes(n)


def write_checkpoints(d):
    """{case: path} of small checkpoints of every kind; uneven tensor sizes so
    that shares split between tensors."""
    import gguf_writer
    import stwriter
    import torch
    paths = {}
    tensors = []
    for i, (dt, shape) in enumerate([("F32", [64, 33]), ("BF16", [7]), ("I64", [3, 5]), ("BOOL", [11]),
                                     ("F16", [128, 16]), ("U8", [0]), ("F32", []), ("I8", [999]),
                                     ("F64", [40, 40]), ("I32", [17, 3]), ("C64", [9]), ("F32", [300])]):
        data = _bytes(i, stwriter.nbytes(dt, shape))
        if dt == "BOOL":
            data = bytes(b & 1 for b in data)
        tensors.append((f"t{i:02d}", dt, shape, data))
    paths["st"] = os.path.join(d, "m.safetensors")
    stwriter.write(paths["st"], tensors)

    shard_of = {}
    for k, part in enumerate((tensors[:5], tensors[5:])):
        name = f"m-{k + 1:05d}-of-00002.safetensors"
        stwriter.write(os.path.join(d, name), part)
        shard_of.update({t[0]: name for t in part})
    paths["index"] = os.path.join(d, "m.safetensors.index.json")
    with open(paths["index"], "w") as f:
        json.dump({"metadata": {}, "weight_map": shard_of}, f)

    paths["gguf"] = os.path.join(d, "m.gguf")
    gguf_writer.write(paths["gguf"], [("w", "F32", [8, 32], _bytes(20, 1024)),
                                      ("q", "Q4_K", [4, 256], _bytes(21, 144 * 4)),
                                      ("h", "F16", [100], _bytes(22, 200))])

    # a real torch.save with views of one storage (overlapping, strided) next to lone tensors
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, 16, generator=g)
    obj = {"x": x, "xt": x.t(), "cols": x[:, 3:9], "row": x[5], "lone": torch.randn(70, generator=g),
           "ids": torch.arange(50), "other": torch.randn(8, 8, generator=g).half(),
           "alone_t": torch.randn(5, 7, generator=g).t()}  # strided, its storage its own
    paths["pt"] = os.path.join(d, "views.pt")
    torch.save(obj, paths["pt"])

    paths["other"] = os.path.join(d, "other.safetensors")  # a different table, for the mismatch error
    stwriter.write(paths["other"], tensors[:3])
    return paths


# ---- the worker ------------------------------------------------------------

def _digest(t):
    """dtype, shape, strides and a hash of the elements' bytes in row-major order."""
    import torch
    c = t.detach().contiguous().reshape(-1)
    b = c.view(torch.uint8) if c.dtype != torch.bool else c.to(torch.uint8)
    return [str(t.dtype), list(t.shape), list(t.stride()), hashlib.sha256(b.numpy().tobytes()).hexdigest()]


def _record_reads(lib, calls):
    """Wrap ferry_file_tensor_read so that each call's (tensor, offset, length) is kept."""
    real = lib.ferry_file_tensor_read

    def rec(f, i, off, buf, n):
        calls.append((i, off, n))
        return real(f, i, off, buf, n)
    lib.ferry_file_tensor_read = rec


def _load_case(ft, path, pg, calls):
    import ferry
    calls.clear()
    stats = {}
    got = ft.load_file(path, "cpu", process_group=pg, stats=stats)
    with ferry.File(path) as f:
        infos = f.tensors
    reads = [[infos[i].shard, infos[i].offset + off, infos[i].offset + off + n] for i, off, n in calls]
    ref = ft.load_file(path)  # the plain load, after: its views read through the mapping
    report = {"stats": stats, "reads": reads, "got": {k: _digest(v) for k, v in got.items()},
              "ref": {k: _digest(v) for k, v in ref.items()}}
    if "xt" in got:  # views of one storage alias each other here too
        got["x"][2, 4] = 1234.5
        report["alias"] = [float(got["xt"][4, 2]), float(got["cols"][2, 1]), float(ref["x"][2, 4])]
    return report


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the report says which
        return [type(e).__name__, str(e)]
    return None


def worker(init, rank, world, paths_json, out):
    for p in (os.path.join(ROOT, "tests", "data"), os.path.join(ROOT, "python")):
        if p not in sys.path and (p.endswith("data") or os.environ.get("FERRY_TEST_INSTALLED") != "1"):
            sys.path.insert(0, p)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    import ferry.torch as ft
    from ferry._lib import lib
    paths = json.loads(paths_json)
    calls = []
    _record_reads(lib, calls)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    report = {}
    sub = dist.new_group(list(range(world)))  # an ordinary group over every rank
    report["st"] = _load_case(ft, paths["st"], dist.group.WORLD, calls)
    report["index"] = _load_case(ft, paths["index"], sub, calls)
    report["gguf"] = _load_case(ft, paths["gguf"], dist.group.WORLD, calls)
    report["pt"] = _load_case(ft, paths["pt"], sub, calls)
    # ranks that open different files all fail, before any bytes move
    mine = paths["other"] if rank == 1 else paths["st"]
    report["mismatch"] = _error(lambda: ft.load_file(mine, process_group=dist.group.WORLD))
    # a file that rank 1 cannot open: the same, before the plans are compared
    mine = os.path.join(os.path.dirname(paths["st"]), "absent.safetensors") if rank == 1 else paths["st"]
    report["open_error"] = _error(lambda: ft.load_file(mine, process_group=dist.group.WORLD))
    # a read that fails on rank 1 only: it raises its own error, the others
    # are told, and nobody waits in a broadcast
    real = lib.ferry_file_tensor_read
    if rank == 1:
        lib.ferry_file_tensor_read = lambda f, i, off, buf, n: -5  # -EIO
    report["read_error"] = _error(lambda: ft.load_file(paths["st"], process_group=dist.group.WORLD))
    lib.ferry_file_tensor_read = real
    if world == 3:
        # a subgroup of ranks 0 and 2: its members load (rank 2 is the group's
        # rank 1: broadcast's src must be mapped to the global rank); rank 1
        # does not take part and is refused if it tries
        pair = dist.new_group([0, 2])
        if rank in (0, 2):
            report["pair"] = _load_case(ft, paths["st"], pair, calls)
        else:
            report["not_member"] = _error(lambda: ft.load_file(paths["st"], process_group=pair))
    dist.barrier()
    dist.destroy_process_group()
    report["after_destroy"] = _error(lambda: ft.load_file(paths["st"], process_group=sub))
    with open(out, "w") as f:
        json.dump(report, f)


# ---- the parent ------------------------------------------------------------

def run_world(d, world, paths):
    """Start world workers, wait for them all (killing all on a timeout), and
    return their reports by rank."""
    init = os.path.join(d, f"init{world}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs, outs = [], []
    for r in range(world):
        out = os.path.join(d, f"report{world}-{r}.json")
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", init, str(r), str(world),
             json.dumps(paths), out], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=WORKER_TIMEOUT)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"world of {world}: a worker did not finish in {WORKER_TIMEOUT} s (hung collective?)")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of {world} exited {p.returncode}:\n{log}"
    reports = []
    for out in outs:
        with open(out) as f:
            reports.append(json.load(f))
    return reports


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    sys.exit(0)

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("dist"))
    return d, write_checkpoints(d)


@pytest.fixture(scope="module", params=[2, 3])
def world(request, files):
    d, paths = files
    return request.param, run_world(d, request.param, paths), paths


CASES = ["st", "index", "gguf", "pt"]


def _merged(ranges):
    by = {}
    for shard, a, b in sorted(map(tuple, ranges)):
        cur = by.setdefault(shard, [])
        if cur and a <= cur[-1][1]:
            cur[-1][1] = max(cur[-1][1], b)
        else:
            cur.append([a, b])
    return by


@pytest.mark.parametrize("case", CASES)
def test_bit_identical_on_every_rank(world, case):
    n, reports, _ = world
    for r, rep in enumerate(reports):
        got, ref = rep[case]["got"], rep[case]["ref"]
        assert set(got) == set(ref), (r, case)
        for k in ref:
            # dtype, shape, strides and bytes as the plain load gives them
            assert got[k] == ref[k], (r, case, k)
        st = rep[case]["stats"]
        assert st["rank"] == r and st["world"] == n


@pytest.mark.parametrize("case", CASES)
def test_each_rank_reads_its_share_once(world, case):
    n, reports, paths = world
    with ferry.File(paths[case]) as f:
        infos = [t for t in f.tensors if t.nbytes]
    # views of one storage count once: the bytes the file holds
    whole = _merged([[t.shard, t.offset, t.offset + t.nbytes] for t in infos])
    total = sum(b - a for spans in whole.values() for a, b in spans)
    largest = max(t.nbytes for t in infos)
    seen = []
    for r, rep in enumerate(reports):
        st, reads = rep[case]["stats"], rep[case]["reads"]
        got = sum(b - a for _, a, b in reads)
        assert st["bytes_read"] == got, (r, case)  # the stats tell what was read
        assert st["bytes_total"] == total
        assert got <= math.ceil(total / n) + largest, (r, case, got, total)
        # within one rank no byte is read twice (overlapping views included)
        assert sum(b - a for s in _merged(reads).values() for a, b in s) == got, (r, case)
        seen += reads
    # across ranks: disjoint (each byte read once in all) and covering the file
    assert sum(b - a for _, a, b in seen) == total, case
    assert _merged(seen) == whole, case


def test_shared_storage_stays_aliased(world):
    _, reports, _ = world
    for rep in reports:
        xt, cols, file_value = rep["pt"]["alias"]
        assert xt == 1234.5 and cols == 1234.5  # x[2, 4] written through x shows in its views
        assert file_value != 1234.5  # and not in the plain load's copy-on-write views


def test_ranks_with_different_files_all_fail(world):
    _, reports, _ = world
    for rep in reports:
        kind, msg = rep["mismatch"]
        assert kind == "RuntimeError" and "different checkpoints" in msg


def test_a_failed_read_fails_every_rank(world):
    _, reports, _ = world
    for r, rep in enumerate(reports):
        kind, msg = rep["read_error"]
        if r == 1:
            assert kind == "OSError" and "m.safetensors" in msg, msg
        else:
            assert kind == "RuntimeError" and "another rank" in msg, msg


def test_a_failed_open_fails_every_rank(world):
    _, reports, _ = world
    for r, rep in enumerate(reports):
        kind, msg = rep["open_error"]
        if r == 1:
            assert kind == "FileNotFoundError" and "absent.safetensors" in msg, msg
        else:
            assert kind == "RuntimeError" and "failed to open" in msg, msg


def test_subgroup_of_ranks_0_and_2(world):
    n, reports, _ = world
    if n != 3:
        pytest.skip("the subgroup case runs with 3 ranks")
    for r in (0, 2):
        rep = reports[r]["pair"]
        assert rep["got"] == rep["ref"]
        assert rep["stats"]["world"] == 2 and rep["stats"]["rank"] == r // 2
    # each member read about half
    a, b = (reports[r]["pair"]["stats"]["bytes_read"] for r in (0, 2))
    assert a + b == reports[0]["pair"]["stats"]["bytes_total"] and a and b
    kind, msg = reports[1]["not_member"]
    assert kind == "ValueError" and "not a member" in msg


def test_after_destroy_is_not_initialised(world):
    _, reports, _ = world
    for rep in reports:
        kind, msg = rep["after_destroy"]
        assert kind == "RuntimeError" and "init_process_group" in msg


def test_without_init_clear_error(files):
    _, paths = files
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ft.load_file(paths["st"], process_group=object())


def test_owner_ferry_refused(files):
    _, paths = files
    with pytest.raises(ValueError, match="owner='torch'"):
        ft.load_file(paths["st"], process_group=object(), owner="ferry")


def test_cuda_reads_fill_the_same_bytes(files):
    """The cuda path's addresses (one ferry_load_into of a share's tensors),
    run on ferry's cpu device into host memory: the same buffer as the cpu
    path's preads, for every rank's share (shared views, strides, shards)."""
    from ferry import _core
    from ferry.torch import _dist as td
    _, paths = files
    for case in CASES:
        h = _core._Handle(paths[case], 0)
        infos = h.infos()
        for n in (2, 3):
            plan = td.Plan(infos, n)
            for r in range(n):
                mine = td._members(infos, plan, r)
                a = torch.zeros(plan.sizes[r], dtype=torch.uint8)
                b = torch.zeros(plan.sizes[r], dtype=torch.uint8)
                assert td._read_cpu(h, plan, mine, a) == plan.nbytes[r]
                td._read_cuda(h, plan, mine, b, _core.device("cpu"), _core.LoadOptions())
                assert torch.equal(a, b), (case, n, r)


def test_partition_is_contiguous_and_even():
    from ferry.torch import _dist
    for lengths, n in [([10] * 10, 3), ([1, 1000, 1, 1], 3), ([], 2), ([0, 5], 4), ([7], 1)]:
        owners = _dist.partition(lengths, n)
        assert owners == sorted(owners) and all(0 <= o < n for o in owners)
        total = sum(lengths)
        for r in range(n):
            mine = sum(x for x, o in zip(lengths, owners) if o == r)
            assert mine <= math.ceil(total / n) + max(lengths, default=0)

