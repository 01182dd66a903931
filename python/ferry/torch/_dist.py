# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._dist - ferry.torch.load_file(..., process_group=pg): the ranks of a
torch.distributed group each read about 1/N of a checkpoint's bytes from
storage and broadcast their share to the others over the group's own
collectives (gloo, NCCL, ...), so that every rank ends with every tensor
while the file is read about once in all, not once per rank.

Every rank computes the same plan without talking: which rank reads which
bytes, and where each tensor lies in the per-rank buffers, follow from the
file's tensor table alone. A digest of that plan is compared across the group
before any bytes move, so that ranks that opened different checkpoints all
fail together rather than exchange mismatched buffers (or hang).
"""
import hashlib
import time

import torch
import torch.distributed as dist

from .. import _core
from .._lib import lib
from ._tensors import _by_name, _cuda_index, _empty, _shape_view, _sync, dtype_for

# Each storage starts at a multiple of this in its rank's buffer (and each
# buffer's length is one): any dtype's view of a whole buffer is then legal
# and every tensor is as aligned as a fresh allocation would make it.
_ALIGN = 64

_WHO = "ferry.torch.load_file"


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# ---- the group -------------------------------------------------------------

def group_rank(pg):
    """(this process's rank in pg, pg's size). RuntimeError when
    torch.distributed is not initialised, ValueError when this process is not
    a member of pg, TypeError for something that is not a process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_WHO}: process_group= needs torch.distributed initialised "
                           "(torch.distributed.init_process_group) in every rank of the group")
    if pg is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns to a non-member
        raise ValueError(f"{_WHO}: this process (global rank {dist.get_rank()}) is not a member of "
                         "process_group; only the group's ranks may load with it")
    if not isinstance(pg, dist.ProcessGroup):
        raise TypeError(f"{_WHO}: process_group must be a torch.distributed ProcessGroup "
                        f"(or torch.distributed.group.WORLD), not {type(pg).__name__}")
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(f"{_WHO}: this process (global rank {dist.get_rank()}) is not a member of "
                         "process_group")
    return rank, dist.get_world_size(pg)


def _global_rank(pg, r):
    """The global rank of pg's rank r: broadcast's src is a global rank."""
    if pg is dist.GroupMember.WORLD:  # torch 1.13's get_global_rank refuses WORLD
        return r
    fn = getattr(dist, "get_global_rank", None) or getattr(dist.distributed_c10d, "get_global_rank", None)
    if fn is not None:
        return fn(pg, r)
    return dist.distributed_c10d._get_global_rank(pg, r)  # torch before 1.13


# ---- the plan --------------------------------------------------------------

class Plan:
    """Who reads what, from a file's tensor table. A "storage" is one run of
    bytes that must stay together: a tensor, or the tensors whose bytes
    overlap (views of one PyTorch storage: _core.plan_views groups them).

    storages: [(shard, start, end, first tensor index)] in storage order
    owner[s]: the rank that reads storage s; at[s]: its offset in that
    rank's buffer; where[i] = (storage, byte offset of tensor i in it);
    sizes[r]: the length of rank r's buffer; nbytes[r]: the bytes rank r
    reads (its storages without the alignment padding)."""

    def __init__(self, infos, world):
        bases, where = _core.plan_views(infos)
        order = sorted(range(len(bases)), key=lambda b: (bases[b][0], bases[b][1]))
        renum = {b: k for k, b in enumerate(order)}
        self.storages = [bases[b] for b in order]
        self.where = {i: (renum[b], off) for i, (b, off) in where.items()}
        lengths = [end - start for _, start, end, _ in self.storages]
        self.owner = partition(lengths, world)
        self.at, self.sizes, self.nbytes = [], [0] * world, [0] * world
        for s, n in enumerate(lengths):
            r = self.owner[s]
            self.at.append(self.sizes[r])
            self.sizes[r] = _align(self.sizes[r] + n)
            self.nbytes[r] += n
        self.total = sum(lengths)

    def digest(self, infos):
        """63 bits that differ when the ranks' tables (or plans) differ."""
        h = hashlib.blake2b(digest_size=8)
        for t in infos:
            h.update(repr((t.name, t.dtype, t.shape, t.nbytes, t.offset, t.shard, t.strides)).encode())
        h.update(repr((self.owner, self.sizes)).encode())
        return int.from_bytes(h.digest(), "little") >> 1


def partition(lengths, world):
    """Owner rank of each of lengths' storages, in order: contiguous runs of
    about total/world bytes. A storage goes to the rank whose 1/world of the
    bytes its middle falls in, so a rank reads at most its share plus half
    a storage at each end (<= ceil(total/world) + the largest storage); a
    rank may get nothing (a storage larger than a share covers the next
    rank's share too)."""
    total = sum(lengths)
    owners, pos = [], 0
    for n in lengths:
        middle2 = 2 * pos + n  # twice the storage's middle byte: integers only
        owners.append(min(world - 1, middle2 * world // (2 * total)) if total else 0)
        pos += n
    return owners


def _agree(failure, digest, pg, device, what):
    """One small all_reduce before bytes move, so that a failure on some
    ranks fails all of them instead of leaving the others waiting in a
    broadcast until the group's timeout. failure: this rank's exception or
    None; digest: this rank's plan digest (0 where there is none). MAX of
    (failed, d, -d) over the group is (0, d, -d) only where no rank failed
    and every rank has d. A rank that failed raises its own error."""
    t = torch.tensor([int(failure is not None), digest, -digest], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
    failed, hi, neg_lo = t.tolist()
    if failure is not None:
        raise failure
    if failed:
        raise RuntimeError(f"{_WHO}: another rank of process_group failed {what} "
                           "(its own error says why)")
    if (hi, -neg_lo) != (digest, digest):
        raise RuntimeError(f"{_WHO}: the ranks of process_group opened different checkpoints "
                           "(their tensor tables differ): every rank must load the same file")


# ---- reading this rank's share ---------------------------------------------

def _members(infos, plan, rank):
    """This rank's storages, each with its tensors: {storage: [TensorInfo]}."""
    mine = {}
    for t in infos:
        if t.nbytes:
            s = plan.where[t.index][0]
            if plan.owner[s] == rank:
                mine.setdefault(s, []).append(t)
    return mine


def _read_cpu(h, plan, mine, buf):
    """Read this rank's storages into buf (a cpu uint8 tensor) with pread
    (ferry_file_tensor_read), each byte once even where views overlap, and
    nothing of other ranks' bytes. Returns the bytes read."""
    base, done = buf.data_ptr(), 0
    for s, ts in mine.items():
        _, start, _, _ = plan.storages[s]
        covered = start  # bytes of this storage before here are in buf already
        for t in sorted(ts, key=lambda t: t.offset):
            lo, hi = max(covered, t.offset), t.offset + t.nbytes
            if hi > lo:
                h.check(lib.ferry_file_tensor_read(h.f, t.index, lo - t.offset,
                                                   base + plan.at[s] + lo - start, hi - lo))
                done += hi - lo
                covered = hi
    return done


def _read_cuda(h, plan, mine, buf, fdev, opts):
    """Fill this rank's storages in buf (a cuda uint8 tensor) with one
    ferry_load_into of its tensors. Returns the load's statistics."""
    idx, ptrs = [], []
    for s, ts in mine.items():
        for t in ts:
            idx.append(t.index)
            ptrs.append(buf.data_ptr() + plan.at[s] + plan.where[t.index][1])
    return _core.load_into(fdev, h, idx, ptrs, opts)


def _read_share(h, plan, mine, buf, device, fdev, opts, progress):
    """This rank's storages into buf; returns ferry's load statistics (cuda) or {}."""
    if device.type == "cuda":
        _sync(device)  # the caching allocator's memory may still be in use on the stream
        return _read_cuda(h, plan, mine, buf, fdev, opts)
    got = _read_cpu(h, plan, mine, buf)
    if progress is not None:
        progress(got, got)
    return {}


# ---- the tensors -----------------------------------------------------------

def _tensors(infos, dts, plan, bufs, device):
    """name -> tensor: views of the buffers, dtype and shape as the file has
    them (ggml block types: raw uint8 of shape [nbytes])."""
    typed = {}  # (rank, dtype) -> that rank's whole buffer viewed as dtype

    def whole(r, dt):
        v = typed.get((r, dt))
        if v is None:
            v = typed[(r, dt)] = bufs[r] if dt == torch.uint8 else bufs[r].view(dt)
        return v

    out = {}
    for t in infos:
        dt = dts[t.index]
        if not t.nbytes:
            out[t.name] = _empty(t, dt, device)
            continue
        s, off = plan.where[t.index]
        r = plan.owner[s]
        # _shape_view's offsets are from the start of the storage it is given:
        # the whole buffer, so that as_strided's absolute offset is right too
        out[t.name] = _shape_view(whole(r, dt or torch.uint8), t, dt, plan.at[s] + off)
    return out


def load_file(path, device, pg, opts, progress, stats):
    """load_file's distributed part (see _load.load_file). device: a
    parsed torch.device (cpu or cuda); opts: its LoadOptions (used on cuda)."""
    rank, world = group_rank(pg)
    if device.type == "cpu" and str(dist.get_backend(pg)) == "nccl":
        raise ValueError(f"{_WHO}: device cpu with an NCCL process_group: NCCL moves cuda tensors "
                         "only (use a gloo group for cpu, or a cuda device)")
    failure = h = infos = dts = plan = None
    fdev, digest = None, 0
    try:
        if device.type == "cuda":
            device = torch.device("cuda", _cuda_index(device))
            fdev = _core.device(f"cuda:{device.index}", path)  # no GPU: say so first
        h = _core._Handle(path, 0)
        infos = h.infos()
        dts = {t.index: dtype_for(t, h.path) for t in infos}
        plan = Plan(infos, world)
        digest = plan.digest(infos)
    except Exception as e:  # noqa: BLE001 - told to the group first, raised by _agree
        failure = e
    _agree(failure, digest, pg, device, "to open the checkpoint")

    # one buffer per rank's share, on the target device: the owner's is read
    # into, the others are broadcast into
    bufs = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.sizes]
    t0 = time.perf_counter()
    st = {}
    try:
        st = _read_share(h, plan, _members(infos, plan, rank), bufs[rank], device, fdev, opts, progress)
    except Exception as e:  # noqa: BLE001 - as above
        failure = e
    _agree(failure, digest, pg, device, "to read its share of the checkpoint")
    t1 = time.perf_counter()
    for r in range(world):
        if plan.sizes[r]:  # a rank with no share sends nothing
            dist.broadcast(bufs[r], src=_global_rank(pg, r), group=pg)
    t2 = time.perf_counter()
    if stats is not None:
        stats.update(st)
        if device.type == "cpu":
            stats.update(path="pread", bytes=plan.nbytes[rank], seconds=t1 - t0, resident=-1.0,
                         why="this rank's share read with pread, the rest broadcast over process_group")
        stats.update(bytes_read=plan.nbytes[rank], bytes_total=plan.total, rank=rank, world=world,
                     read_seconds=t1 - t0, exchange_seconds=t2 - t1)
    return _by_name(_tensors(infos, dts, plan, bufs, device))
