#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare GPU checkpoint loaders side by side on several workloads: ferry (CLI
and Python binding) against safetensors 0.8 and 0.9, InstantTensor,
fastsafetensors, the Run:ai streamer and a plain gguf reader; cold page cache,
hot page cache and a tmpfs copy; each run in a fresh process, methods alternated
(and rotated between rounds) so that drift on a shared machine hits all alike;
every loaded tensor checked bit-identical with the file.

    python3 bench/compare_load.py --ferry build/ferry --dir /data/cmp --make \\
        --workloads w10g,sharded,lora,small,gguf [--plan 'sharded:hot,tmpfs;small:hot'] \\
        [--methods ferry_auto,ferry_py,st_cuda,...] [--rounds 2] [--out OUT.json]

Methods (each run is a fresh child process):
  ferry_auto, ferry_ring, ferry_direct, ferry_register
                 FERRY load --device cuda:0 --route P --json [--verify] PATH (the CLI is
                 the child; its --verify checks the bytes); 'ferry_cli' names all four
  ferry_py       ferry.torch.load_file(PATH, device="cuda:0") (FERRY_LIBRARY and
                 PYTHONPATH are passed to the child: --ferry-library, --ferry-python)
  st_cuda        safetensors.torch.load_file(FILE, device="cuda:0"), the installed one
  st_cpu_to      load_file(FILE) on CPU, then .to("cuda:0") per tensor
  st_pin         load_file(FILE) on CPU, .pin_memory().to("cuda:0", non_blocking=True)
  torch_mmap     torch.load(FILE.pt, mmap=True, weights_only=True), .to("cuda:0")
  st09           safetensors 0.9 from --st09-path: safe_open(FILE).prefetch(device=...)
                 (its background CUDA loader), taking every tensor; load_file if it
                 has no prefetch
  it, it_buffered, it_mmap
                 instanttensor.safe_open(FILES, "pt", device=0, backend=...): its
                 default (io_uring/AIO with O_DIRECT), BackendPolicy.BUFFERED, Backend.MMAP
  fsafe, fsafe_gds
                 fastsafetensors.fastsafe_open(FILES, device="cuda:0", nogds=True / False)
  runai          runai_model_streamer.SafetensorsStreamer().stream_files(FILES,
                 device="cuda:0"), each yielded tensor .to("cuda:0")
  gguf_py        gguf.GGUFReader(FILE) (a memmap), torch.from_numpy(t.data).to("cuda:0")
A sharded checkpoint is loaded by ferry through its index; the others take the
list of shards (or loop over them inside the timed region). A method that does
not apply to a workload's format is listed as "n/a" with the reason.

Workloads (--workloads; made in --dir with --make, deterministic from --seed):
  w10g     the 10.4 GB BF16 checkpoint of scripts/make_sample.py (--blocks, --hidden;
           --file overrides its path)
  sharded  --sharded-gb (30) GB in shards of about 5 GB, with model.safetensors.index.json
  lora     --lora-tensors (3000) small BF16 LoRA A/B tensors, about 300 MB
  small    a 25 MB file of 40 tensors; its table also gives milliseconds and the
           time against the target 2 x bytes / copy rate + 5 ms
  gguf     a GGUF v3 file of --gguf-gb (3) GB: Q4_0 and Q8_0 blocks, F16, F32
--scale F multiplies the sizes of sharded, lora and gguf (a dry run: 0.003).

Caches (--caches, default cold,hot,tmpfs; --plan 'w10g:cold,hot;small:hot' per
workload): cold: every file fsync'ed and dropped with posix_fadvise(DONTNEED)
(and /proc/sys/vm/drop_caches where writable); hot: read once front to back by
one thread (as cat, cp or a download fill the cache; --warm-threads N fills it
with N threads interleaved on one descriptor, which leaves it in single-page
folios and makes the next read slow: docs/PERFORMANCE.md); tmpfs: the files copied fresh into --tmpfs-dir before the run (not timed)
and deleted after. The share of each file in the page cache before each run is
measured with mincore(), and the file system type recorded.

For every run: seconds of the load itself (torch children: from the first loader
call until the last tensor is on the device and torch.cuda.synchronize()
returned, after imports and CUDA initialisation; ferry CLI: the seconds it
reports), the process's wall time, bytes, GB/s (10^9 bytes per second), peak
RSS (VmHWM of the child, or the peak_rss_bytes ferry reports), and verified:
after the timing the child computes a digest of ALL the bytes of every tensor on
the tensor's device (tensor_digest below) and the parent compares them with
digests of the same byte ranges read from the file (a reference child, once per
workload, on the same device type; cached in --dir). Missing, extra or differing
tensors count as mismatches; the first few are named. GGUF tensors are compared
as the raw bytes stored in the file.

Limits, measured once per workload at the start and once at the end: the pinned
host-to-device copy rate (a child copies a pinned 1 GiB buffer several times,
best), the O_DIRECT read rate of the workload's files (aligned reads of each
--direct-threads shape: 16 MiB on 4 and on 16 threads, 512 KiB on 16; the fastest
counts) and the page-cache read rate (the same reads, buffered, cached).
Tables: GB/s median (best), ratio to the limit (cold: O_DIRECT; hot and tmpfs:
the copy rate), peak RSS, verified, per workload x cache x method.

Robust by design: a method that fails, crashes or hangs records its error and the
run goes on; one that times out is not started again (on any workload); after
--budget-seconds (counted from this script's start, including --make) the
remaining runs are skipped and reported as skipped. The JSON and markdown outputs
are rewritten after every run.

On a machine whose commands may take 10 minutes each: make everything once
(--make-only: the files and their reference digests, cached in --dir), then run
a few workloads per command, each with its own --out and a --budget-seconds that
ends it in time; bench/plot.py draws the JSONs together.

--dry-run (no GPU): torch methods run on the CPU where they can (a check of this
script's logic, not a measurement); ferry_py and the ferry CLI use --ferry-device
(sim:SIZE); /proc/sys/vm/drop_caches is left alone. --self-test checks the digest.
"""
import argparse
import ctypes
import json
import math
import mmap
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

T_PROC_START = time.perf_counter()

FERRY_PATHS = {"ferry_auto": "auto", "ferry_ring": "ring", "ferry_direct": "direct",
               "ferry_register": "register"}
FERRY_EXTRA = {}  # method -> further `ferry load` options
ST = {"safetensors"}
BOTH = {"safetensors", "gguf"}
# method -> the formats it loads
METHODS = {"ferry_auto": BOTH, "ferry_ring": BOTH, "ferry_direct": BOTH, "ferry_register": BOTH,
           "ferry_py": BOTH, "st_cuda": ST, "st_cpu_to": ST, "st_pin": ST, "torch_mmap": ST,
           "st09": ST, "it": ST, "it_buffered": ST, "it_mmap": ST, "fsafe": ST, "fsafe_gds": ST,
           "runai": ST, "gguf_py": {"gguf"}}
ALIASES = {"ferry_cli": [m for m in FERRY_PATHS if m not in FERRY_EXTRA]}  # one method per path
DEFAULT_METHODS = ["ferry_auto", "ferry_py", "st_cuda", "st09", "it", "it_buffered", "it_mmap",
                   "fsafe", "fsafe_gds", "runai", "gguf_py"]
# method -> the module its child imports (checked once before the runs)
MODULES = {"ferry_py": "ferry.torch", "st_cuda": "safetensors.torch", "st_cpu_to": "safetensors.torch",
           "st_pin": "safetensors.torch", "torch_mmap": "torch", "st09": "safetensors.torch",
           "it": "instanttensor", "it_buffered": "instanttensor", "it_mmap": "instanttensor",
           "fsafe": "fastsafetensors", "fsafe_gds": "fastsafetensors", "runai": "runai_model_streamer",
           "gguf_py": "gguf"}
WORKLOADS = ["w10g", "sharded", "lora", "small", "gguf"]
CACHES = ["cold", "hot", "tmpfs"]
RESULT_TAG = "COMPARE_LOAD_RESULT "
GB = 1e9
GIB = float(1 << 30)
MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- helpers

def vm_status(key):
    """A /proc/self/status field in bytes (VmHWM, VmRSS), or None."""
    return proc_field("/proc/self/status", key)


def proc_field(path, key):
    """A "Key: N kB" field of a /proc file (status, smaps_rollup) in bytes, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_header(path):
    """Parse a safetensors header with the standard library: ([(name, dtype,
    shape, begin, end)] with absolute offsets in file order, metadata)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than 8 bytes")
        n = int.from_bytes(raw, "little")
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is implausible")
        hdr = json.loads(f.read(n))
    base = 8 + n
    meta = hdr.pop("__metadata__", None)
    tensors = [(k, v["dtype"], v["shape"], base + v["data_offsets"][0], base + v["data_offsets"][1])
               for k, v in hdr.items()]
    tensors.sort(key=lambda t: t[3])
    return tensors, meta


def page_cache_fraction(path):
    """Share of path's pages in the page cache (mincore on a MAP_SHARED read-only
    mapping; mapping does not fault pages in). None if it cannot be measured."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            return 1.0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = os.sysconf("SC_PAGE_SIZE")
        npages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        finally:
            os.close(fd)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = (ctypes.c_ubyte * npages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            resident = bytes(vec).translate(bytes(i & 1 for i in range(256))).count(1)
        finally:
            libc.munmap(addr, size)
        return resident / npages
    except Exception:  # noqa: BLE001 - measuring is best effort
        return None


def drop_cache(path, use_drop_caches):
    """fsync + posix_fadvise(DONTNEED) on path, then (optionally) drop_caches.
    Returns a list of notes on what failed."""
    notes = []
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                os.fsync(fd)
            except OSError as e:
                notes.append(f"fsync: {e}")
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError) as e:
        notes.append(f"fadvise: {e}")
    if use_drop_caches:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError as e:
            notes.append(f"drop_caches: {e.strerror or e}")
    return notes


def warm_cache(path, threads=1, chunk=8 << 20):
    """Read path once fully: chunk i by thread i % threads, all on one descriptor
    (pread into reused buffers). Returns the seconds taken."""
    t0 = time.perf_counter()
    size = os.path.getsize(path)
    nchunks = (size + chunk - 1) // chunk
    fd = os.open(path, os.O_RDONLY)
    errors = []

    def worker(k):
        buf = bytearray(chunk)
        try:
            for i in range(k, nchunks, threads):
                os.preadv(fd, [buf], i * chunk)
        except OSError as e:
            errors.append(e)

    try:
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def fs_type(path):
    """Filesystem type of the mount holding path (from /proc/self/mountinfo)."""
    try:
        real = os.path.realpath(path)
        best, best_type = "", None
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4].encode().decode("unicode_escape")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, best_type = mnt, right.split()[0]
        return best_type
    except Exception:  # noqa: BLE001
        return None


def rc_text(rc):
    """'exit 3', 'killed by SIGKILL'."""
    if rc is None:
        return "not started"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def tail(text, n=600):
    text = (text or "").strip()
    return text if len(text) <= n else "…" + text[-n:]


def last_line(text):
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def shrink(obj, depth=0):
    """A copy of a JSON value with long lists cut, so per-tensor listings do not
    bloat the output."""
    if isinstance(obj, dict):
        return {k: shrink(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        if len(obj) > 20:
            return [shrink(v, depth + 1) for v in obj[:20]] + [f"... {len(obj) - 20} more"]
        return [shrink(v, depth + 1) for v in obj]
    return obj


def parse_json_output(text):
    """The JSON object a CLI printed: the whole stdout, else the first object in it."""
    text = (text or "").strip()
    if not text:
        raise ValueError("no output")
    try:
        return json.loads(text)
    except ValueError:
        pass
    dec = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            obj, _ = dec.raw_decode(text, i)
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
        i = text.find("{", i + 1)
    raise ValueError("no JSON object in the output")


def run_process(cmd, timeout, env=None):
    """Run cmd in its own process group; on timeout kill that group (only what we
    started). Returns (rc, stdout, stderr, wall_seconds, timed_out)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace", start_new_session=True, env=env)
    except OSError as e:
        return None, "", f"cannot start {cmd[0]}: {e}", time.perf_counter() - t0, False
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.perf_counter() - t0, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return p.returncode, out, err, time.perf_counter() - t0, True
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        raise


# ----------------------------------------------------------------------------- GGUF header

GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
GGUF_STRING, GGUF_ARRAY, GGUF_UINT32 = 8, 9, 4
# ggml type -> (block elements, block bytes), for the types this script writes and common ones
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
               24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}


def read_gguf_tensors(path):
    """[(name, begin, end)] (absolute byte ranges, file order) of a GGUF v2/v3 file,
    read with the standard library, so the reference does not trust any loader."""
    with open(path, "rb") as f:
        buf = f.read(64 << 20)  # the header of any file this script makes fits
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = [8]

    def take(fmt):
        v = struct.unpack_from(fmt, buf, pos[0])
        pos[0] += struct.calcsize(fmt)
        return v[0]

    def string():
        n = take("<Q")
        s = buf[pos[0]:pos[0] + n].decode("utf-8", "replace")
        pos[0] += n
        return s

    def skip_value(vt):
        if vt == GGUF_STRING:
            string()
        elif vt == GGUF_ARRAY:
            et, n = take("<I"), take("<Q")
            if et in GGUF_SCALAR:
                pos[0] += GGUF_SCALAR[et] * n
            else:
                for _ in range(n):
                    skip_value(et)
        else:
            pos[0] += GGUF_SCALAR[vt]

    ntensors, nkv = take("<Q"), take("<Q")
    align = 32
    for _ in range(nkv):
        key, vt = string(), take("<I")
        if key == "general.alignment" and vt == GGUF_UINT32:
            align = take("<I")
        else:
            skip_value(vt)
    infos = []
    for _ in range(ntensors):
        name = string()
        ne = [take("<Q") for _ in range(take("<I"))]
        gtype, off = take("<I"), take("<Q")
        block, size = GGML_BLOCKS[gtype]
        infos.append((name, off, math.prod(ne) // block * size))
    data = pos[0] + (align - pos[0] % align) % align
    return sorted(((n, data + off, data + off + nb) for n, off, nb in infos), key=lambda t: t[1])


# ----------------------------------------------------------------------------- digest

def tensor_digest(t, torch, chunk_words=1 << 25):
    """The digest of all the bytes of tensor t, computed on t's device: the bytes,
    zero-padded to 4-byte words w_i (as int64), give S0 = sum w_i and
    S1 = sum w_i * (2i + 1), both wrapping mod 2^64. A flipped bit changes S1 by
    2^k times an odd number, never 0 mod 2^64; swapping two different words i, j
    changes it by 2 (w_j - w_i)(i - j), not 0 mod 2^64 while the tensor has fewer
    than 2^31 words (8 GiB); a shift moves every word to another weight. The byte
    count is part of the digest, so padding cannot hide a short tensor.
    Returns (nbytes, S0 tensor, S1 tensor): the caller collects them all and
    copies them to the host once, not one sync per tensor."""
    b = t.detach()
    if not b.is_contiguous():
        b = b.contiguous()
    b = b.reshape(-1).view(torch.uint8)
    n = b.numel()
    if n % 4:
        b = torch.cat([b, b.new_zeros(4 - n % 4)])
    try:
        w = b.view(torch.int32)
    except RuntimeError:  # a view at an offset int32 cannot start at
        w = b.clone().view(torch.int32)
    s0 = torch.zeros((), dtype=torch.int64, device=b.device)
    s1 = torch.zeros((), dtype=torch.int64, device=b.device)
    for start in range(0, w.numel(), chunk_words):
        x = w[start:start + chunk_words].to(torch.int64)
        i = torch.arange(start, start + x.numel(), dtype=torch.int64, device=b.device)
        s0 += x.sum()
        s1 += (x * (2 * i + 1)).sum()
    return n, s0, s1


def digests_of(named, torch):
    """{name: 'nbytes:S0:S1'} for an iterable of (name, tensor)."""
    names, sizes, s0s, s1s = [], [], [], []
    for name, t in named:
        n, s0, s1 = tensor_digest(t, torch)
        names.append(name)
        sizes.append(n)
        s0s.append(s0)  # left on the device: one copy to the host for all, below
        s1s.append(s1)
    if not names:
        return {}
    both = torch.stack([torch.stack(s0s), torch.stack(s1s)]).cpu().tolist()
    a0, a1 = both[0], both[1]
    return {k: f"{n}:{x & MASK64:016x}:{y & MASK64:016x}" for k, n, x, y in zip(names, sizes, a0, a1)}


def self_test_main():
    """--self-test: the digest catches a flipped bit, swapped words, a shift and a
    short tensor, and gives equal digests for equal bytes on any view."""
    import torch
    g = torch.Generator().manual_seed(7)
    fails, passes = [], 0
    for n in (1 << 20, 1001, 3):
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        base = tensor_digest(data, torch)
        key = lambda d: (d[0], int(d[1]), int(d[2]))  # noqa: E731
        cases = {}
        for pos in sorted({0, n // 2, n - 1}):
            for bit in (0, 7):
                x = data.clone()
                x[pos] ^= 1 << bit
                cases[f"n={n} bit {bit} of byte {pos} flipped"] = x
        if n >= 16:
            x = data.clone()
            w = x.view(torch.int32) if n % 4 == 0 else None
            if w is not None:
                i, j = 1, w.numel() - 2
                if w[i] == w[j]:
                    w[i] ^= 1
                w[i], w[j] = w[j].clone(), w[i].clone()
                cases[f"n={n} words {i} and {j} swapped"] = x
            cases[f"n={n} shifted by 1 byte"] = torch.roll(data, 1)
            cases[f"n={n} shifted by 4 bytes"] = torch.roll(data, 4)
        cases[f"n={n} one byte short"] = data[:-1]
        for what, x in cases.items():
            if key(tensor_digest(x, torch)) == key(base):
                fails.append(what + ": digest unchanged")
            else:
                passes += 1
        # the same bytes through another dtype view or an odd offset give the same digest
        padded = torch.cat([torch.zeros(1, dtype=torch.uint8), data])
        same = {"copy": data.clone(), "odd offset view": padded[1:]}
        if n % 2 == 0:
            same["bf16 view"] = data.view(torch.bfloat16)
        for what, x in same.items():
            if key(tensor_digest(x, torch, chunk_words=1000)) != key(base):
                fails.append(f"n={n} {what}: digest differs")
            else:
                passes += 1
    for f in fails:
        print("FAIL: " + f)
    print(f"{passes} passed, {len(fails)} failed")
    sys.exit(1 if fails else 0)


# ----------------------------------------------------------------------------- children

def child_exit(rep):
    """A child's end: its report on one RESULT_TAG line, then exit at once
    (0 ok, 1 failed), skipping the teardown of many GB of tensors."""
    sys.stdout.write(RESULT_TAG + json.dumps(rep) + "\n")
    sys.stdout.flush()
    os._exit(0 if rep["ok"] else 1)


def child_main(argv):
    """--child METHOD SPEC [--device DEV] ...: load the workload SPEC (a JSON file:
    path, files, format) with METHOD, digest every tensor, print one RESULT_TAG
    line of JSON, exit 0 (ok) or 1 (error)."""
    ap = argparse.ArgumentParser(prog="compare_load.py --child")
    ap.add_argument("method")
    ap.add_argument("spec")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ferry-device", default=None, help="dry run: ferry_py loads to this (sim:SIZE)")
    ap.add_argument("--st09-path", default=None)
    ap.add_argument("--corrupt", action="store_true", help="flip one bit after the timing (tests the check)")
    a = ap.parse_args(argv)
    if a.method == "st09" and a.st09_path:
        sys.path.insert(0, a.st09_path)  # before anything imports safetensors
    rep = {"method": a.method, "device": a.device, "ok": False}
    try:
        _child_load(a, rep)
        rep["ok"] = True
    except BaseException as e:  # noqa: BLE001 - report everything, even SystemExit
        import traceback
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
        rep["traceback"] = tail(traceback.format_exc(), 3000)
    rep["peak_rss_bytes"] = vm_status("VmHWM")
    rep["rss_end_bytes"] = vm_status("VmRSS")
    child_exit(rep)


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def _child_load(a, rep):
    import torch
    with open(a.spec) as f:
        spec = json.load(f)
    rep["torch"] = torch.__version__
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
        rep["gpu"] = torch.cuda.get_device_name(dev)
    load = _loader(a.method, spec, dev, cuda, a, rep)  # imports the method's package, untimed
    rep["init_seconds"] = time.perf_counter() - T_PROC_START  # interpreter, imports, CUDA init
    rep["rss_before_load_bytes"] = vm_status("VmRSS")
    t0 = time.perf_counter()
    out = load()
    if cuda:
        torch.cuda.synchronize(dev)
    rep["seconds"] = time.perf_counter() - t0
    rep["tensors"] = len(out)
    rep["bytes"] = sum(t.numel() * t.element_size() for t in out.values())
    rep["gbps"] = rep["bytes"] / rep["seconds"] / GB if rep["seconds"] > 0 else None
    rep["peak_rss_load_bytes"] = vm_status("VmHWM")
    rep["tensor_devices"] = sorted({str(t.device) for t in out.values()})
    if cuda:
        rep["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    if a.corrupt and out:
        victim = sorted(out)[0]
        flat = out[victim].detach().reshape(-1).view(torch.uint8)
        flat[flat.numel() // 2] ^= 4
        rep["corrupted"] = victim
    t1 = time.perf_counter()
    rep["digests"] = digests_of(out.items(), torch)
    rep["digest_seconds"] = time.perf_counter() - t1


def _loader(m, spec, dev, cuda, a, rep):
    """Import what method m needs and return the function whose call is timed;
    it returns {name: tensor} with every tensor on dev."""
    import torch
    files, path, d = spec["files"], spec["path"], str(dev)
    if m in ("st_cuda", "st_cpu_to", "st_pin", "st09"):
        import safetensors
        from safetensors import safe_open
        from safetensors.torch import load_file
        rep["safetensors"] = getattr(safetensors, "__version__", None)
        rep["safetensors_file"] = safetensors.__file__
    if m == "st_cuda":
        return lambda: {k: v for f in files for k, v in load_file(f, device=d).items()}
    if m == "st_cpu_to":
        return lambda: {k: v.to(dev) for f in files for k, v in load_file(f).items()}
    if m == "st_pin":
        if not cuda:
            rep["note"] = "dry run on CPU: pin_memory skipped"
            return lambda: {k: v.to(dev) for f in files for k, v in load_file(f).items()}
        return lambda: {k: v.pin_memory().to(dev, non_blocking=True) for f in files
                        for k, v in load_file(f).items()}
    if m == "torch_mmap":
        def mmap_load():
            cpu = torch.load(files[0] + ".pt", mmap=True, weights_only=True)
            return {k: v.to(dev) for k, v in cpu.items()}
        return mmap_load
    if m == "st09":
        if not hasattr(safe_open, "prefetch"):
            rep["st09_api"] = "load_file (this safetensors has no safe_open.prefetch)"
            return lambda: {k: v for f in files for k, v in load_file(f, device=d).items()}
        if not cuda:
            rep["st09_api"] = "load_file (dry run: prefetch needs CUDA)"
            return lambda: {k: v for f in files for k, v in load_file(f, device=d).items()}
        rep["st09_api"] = "safe_open(...).prefetch(device=...), every tensor taken"

        def prefetch():
            out = {}
            for f in files:  # one shard after the other, as a user's loop would
                with safe_open(f, framework="pt", device=d) as h:
                    with h.prefetch(device=d) as loader:
                        out.update(loader)
            return out
        return prefetch
    if m in ("it", "it_buffered", "it_mmap"):
        import instanttensor
        rep["instanttensor"] = _version("instanttensor")
        backend = {"it": None, "it_buffered": instanttensor.BackendPolicy.BUFFERED,
                   "it_mmap": instanttensor.Backend.MMAP}[m]
        rep["it_backend"] = "default" if backend is None else backend.name

        def it_load():
            names = files if len(files) > 1 else files[0]
            with instanttensor.safe_open(names, framework="pt", device=dev.index or 0, backend=backend) as f:
                return dict(f.tensors())
        return it_load
    if m in ("fsafe", "fsafe_gds"):
        from fastsafetensors import fastsafe_open
        rep["fastsafetensors"] = _version("fastsafetensors")

        def fsafe_load():
            with fastsafe_open(files, framework="pt", device=d, nogds=(m == "fsafe")) as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        return fsafe_load
    if m == "runai":
        from runai_model_streamer import SafetensorsStreamer
        rep["runai_model_streamer"] = _version("runai_model_streamer")

        def runai_load():
            out, seen = {}, set()
            with SafetensorsStreamer() as s:
                s.stream_files(files, device=d)
                for name, t in s.get_tensors():
                    seen.add(str(t.device))
                    out[name] = t.to(dev)
            rep["runai_yielded_on"] = sorted(seen)
            return out
        return runai_load
    if m == "ferry_py":
        import ferry
        import ferry.torch
        rep["ferry_module"] = ferry.__file__
        if cuda:
            return lambda: ferry.torch.load_file(path, device=d)
        if a.ferry_device:  # dry run: ferry's simulated GPU, its memory comes back as cpu tensors
            rep["note"] = f"dry run: ferry.torch.load_file(device={a.ferry_device!r}, owner='ferry')"
            return lambda: ferry.torch.load_file(path, device=a.ferry_device, owner="ferry")
        rep["note"] = "dry run: views of the file on cpu"
        return lambda: ferry.torch.load_file(path, device="cpu")
    if m == "gguf_py":
        import warnings
        from gguf import GGUFReader
        rep["gguf"] = _version("gguf")
        warnings.filterwarnings("ignore", message=".*not writable.*")  # from_numpy of a read-only memmap

        def gguf_load():
            r = GGUFReader(path)
            return {t.name: torch.from_numpy(t.data).to(dev) for t in r.tensors}
        return gguf_load
    raise ValueError(f"unknown method {m!r}")


def ref_child_main(argv):
    """--ref-child SPEC OUT [--device DEV]: digest the byte range of every tensor in
    SPEC's table, read from the file with numpy (a memmap) and moved to DEV, into
    OUT (JSON {name: digest}); print a RESULT_TAG line."""
    spec_path, out_path = argv[0], argv[1]
    dev_name = argv[3] if len(argv) > 3 and argv[2] == "--device" else "cpu"
    rep = {"ok": False}
    try:
        import numpy as np
        import torch
        dev = torch.device(dev_name)
        with open(spec_path) as f:
            spec = json.load(f)
        maps = {}

        def tensors():
            for name, fi, b, e in spec["tensors"]:
                if fi not in maps:
                    maps[fi] = np.memmap(spec["files"][fi], dtype=np.uint8, mode="r")
                yield name, torch.from_numpy(np.array(maps[fi][b:e])).to(dev)
        t0 = time.perf_counter()
        dig = digests_of(tensors(), torch)
        with open(out_path, "w") as f:
            json.dump(dig, f)
        rep.update(ok=True, tensors=len(dig), seconds=time.perf_counter() - t0, device=str(dev))
    except BaseException as e:  # noqa: BLE001
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
    child_exit(rep)


def copy_child_main(argv):
    """--copy-child DEV: the pinned host-to-device copy rate (a pinned 1 GiB buffer
    copied 5 times, the best), in a child so the parent never imports torch."""
    rep = {"ok": False}
    try:
        import torch
        dev = torch.device(argv[0])
        src = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
        dst = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst.copy_(src, non_blocking=True)  # first touch, not timed
        torch.cuda.synchronize(dev)
        best = None
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(dev)
            s = time.perf_counter() - t0
            best = s if best is None else min(best, s)
        rep.update(ok=True, gbps=src.numel() / best / GB, seconds_best=best)
    except BaseException as e:  # noqa: BLE001
        rep["error"] = f"{type(e).__name__}: {e}"[:1000]
    child_exit(rep)


def make_pt_main(argv):
    """--make-pt FILE: write FILE.pt (torch.save of the tensors loaded on CPU)."""
    path = argv[0]
    rep = {"ok": False}
    try:
        import torch
        from safetensors.torch import load_file
        t0 = time.perf_counter()
        sd = load_file(path)
        tmp = path + ".pt.tmp"
        torch.save(sd, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path + ".pt")
        rep.update(ok=True, seconds=time.perf_counter() - t0, bytes=os.path.getsize(path + ".pt"))
    except BaseException as e:  # noqa: BLE001
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
    child_exit(rep)


# ----------------------------------------------------------------------------- making workloads

def noise_chunks(seed, total, chunk=64 << 20):
    """total deterministic random bytes from seed, as buffers of up to chunk bytes:
    numpy's raw PCG64 output (twice as fast as Generator.bytes), chunk i from its
    own stream [seed, i]; the standard library's Random without numpy."""
    try:
        import numpy as np
    except ImportError:
        np = None
        import random
        rnd = random.Random(str(seed))
    for i, off in enumerate(range(0, total, chunk)):
        n = min(chunk, total - off)
        if np is None:
            yield rnd.randbytes(n)
        else:
            words = np.random.PCG64(list(seed if isinstance(seed, list) else [seed]) + [i]).random_raw((n + 7) // 8)
            yield memoryview(words).cast("B")[:n]


def write_with_noise(path, head, data_bytes, seed):
    """Write head, then data_bytes of noise, to path (through a .tmp and one fsync,
    so the first cold run does not pay for write-back)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        for buf in noise_chunks(seed, data_bytes):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def safetensors_head(tensors, meta=None):
    """The 8-byte length and JSON header of a safetensors file of (name, dtype,
    shape, nbytes) tensors laid out back to back in that order."""
    hdr, off = {}, 0
    if meta:
        hdr["__metadata__"] = meta
    for name, dt, shape, nb in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)  # data 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw, off


def bf16(name, shape):
    return (name, "BF16", shape, 2 * math.prod(shape))


def plan_sharded(total_bytes, shard_bytes=5 * 10**9, cols=4096):
    """Shards of about shard_bytes, each of 64 MiB BF16 tensors [rows, cols] (fewer
    rows when the shards are small): [[tensor, ...] per shard]."""
    nshards = max(2, math.ceil(total_bytes / shard_bytes))
    per_shard = total_bytes // nshards
    rows = max(1, min(8192, per_shard // 8 // (2 * cols)))
    per_tensor = rows * cols * 2
    shards, k = [], 0
    for _ in range(nshards):
        ts = []
        for _ in range(max(1, -(-per_shard // per_tensor))):  # rounded up: at least the total
            ts.append(bf16(f"model.layers.{k // 4}.w{k % 4}.weight", [rows, cols]))
            k += 1
        shards.append(ts)
    return shards


def plan_lora(ntensors):
    """LoRA A/B pairs: A [r, h], B [h, r], ranks 16-64, hidden sizes 2560-3072
    (3000 tensors: about 330 MB)."""
    ranks = [16] * 7 + [32] + [16] * 7 + [64]  # mostly 16, some 32 and 64: about 330 MB in 3000 tensors
    hiddens, targets = [2560, 3072, 2560], ["q_proj", "k_proj", "v_proj", "o_proj"]
    out = []
    for p in range(max(1, ntensors // 2)):
        r, h = ranks[p % len(ranks)], hiddens[p % len(hiddens)]
        base = f"base_model.model.layers.{p // len(targets)}.self_attn.{targets[p % len(targets)]}"
        out += [bf16(base + ".lora_A.weight", [r, h]), bf16(base + ".lora_B.weight", [h, r])]
    return out


def plan_small():
    """A 25 MB file of a few dozen tensors: 32 BF16 [400, 1024] and 8 F32 [1024]."""
    out = [bf16(f"encoder.layer.{i}.weight", [400, 1024]) for i in range(32)]
    return out + [(f"encoder.layer.{i}.norm", "F32", [1024], 4096) for i in range(8)]


def plan_gguf(total_bytes):
    """llama-like GGUF tensors: (name, ggml type, shape outermost-first) whose raw
    sizes add up to about total_bytes; d 4096 from 1 GB up, else 1024."""
    d = 4096 if total_bytes >= 10**9 else 1024
    ff, vocab = d * 7 // 2, 8 * d
    block = [("attn_q", "Q4_0", [d, d]), ("attn_k", "Q4_0", [d // 4, d]), ("attn_v", "Q8_0", [d // 4, d]),
             ("attn_output", "Q4_0", [d, d]), ("ffn_gate", "Q4_0", [ff, d]), ("ffn_up", "Q4_0", [ff, d]),
             ("ffn_down", "Q8_0", [d, ff]), ("attn_norm", "F32", [d]), ("ffn_norm", "F32", [d])]
    gw = gguf_writer()
    ends = [("token_embd.weight", "F16", [vocab, d]), ("output_norm.weight", "F32", [d]),
            ("output.weight", "Q8_0", [vocab, d])]
    fixed = sum(gw.nbytes(t, s) for _, t, s in ends)
    per_block = sum(gw.nbytes(t, s) for _, t, s in block)
    nblocks = max(1, (total_bytes - fixed) // per_block)
    out = [ends[0]]
    for b in range(nblocks):
        out += [(f"blk.{b}.{n}.weight", t, s) for n, t, s in block]
    return out + ends[1:]


def gguf_writer():
    """The repo's own GGUF writer (tests/data/gguf_writer.py): its packing and
    sizes; the data is streamed here, not built in memory."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "data"))
    import gguf_writer as gw
    return gw


def write_gguf(path, tensors, seed):
    gw = gguf_writer()
    align = gw.DEFAULT_ALIGNMENT
    kvs = [("general.architecture", gw.STRING, "llama"), ("general.name", gw.STRING, "compare_load noise")]
    rel, off = [], 0
    for _, tname, shape in tensors:
        off = gw.align_up(off, align)
        rel.append(off)
        off += gw.nbytes(tname, shape)
    head = gw.pack_header(3, len(tensors), len(kvs)) + b"".join(gw.pack_kv(*kv) for kv in kvs)
    for (name, tname, shape), r in zip(tensors, rel):
        head += gw.pack_tensor_info(name, list(reversed(shape)), gw.GGML_TYPES[tname][0], r)
    head += bytes(gw.align_up(len(head), align) - len(head))
    # every size here is a multiple of 32, so the tensors lie back to back: one noise stream
    assert rel[-1] + gw.nbytes(*tensors[-1][1:]) == sum(gw.nbytes(t, s) for _, t, s in tensors)
    write_with_noise(path, head, off, seed)


# ----------------------------------------------------------------------------- limits

def parse_direct_shapes(v):
    """'4,16,16x512K' -> [(4, 16 MiB), (16, 16 MiB), (16, 512 KiB)]"""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in v.split(","):
        t, _, size = part.strip().upper().partition("X")
        chunk = 16 << 20
        if size:
            mul = units.get(size[-1:], 1)
            chunk = int(size[:-1] if size[-1:] in units else size) * mul
        if int(t) < 1 or chunk < 4096 or chunk % 4096:
            raise argparse.ArgumentTypeError(f"{part}: threads >= 1 and a size of whole 4 KiB blocks")
        out.append((int(t), chunk))
    return out


def direct_key(threads, chunk):
    """The limits' key of one O_DIRECT shape: direct_gbps_t16 (16 MiB reads), direct_gbps_t16x512K."""
    if chunk == 16 << 20:
        return f"direct_gbps_t{threads}"
    return f"direct_gbps_t{threads}x{chunk >> 10}K"


def read_rate(files, limit_bytes, direct, threads=4, chunk=16 << 20):
    """GB/s of reading up to limit_bytes of files (in turn) with threads preads of
    chunk bytes into page-aligned buffers (mmap'ed), with O_DIRECT or buffered.
    Returns (gbps, bytes, error)."""
    jobs = []
    for f in files:
        size = os.path.getsize(f)
        for off in range(0, size, chunk):
            if sum(n for *_, n in jobs) >= limit_bytes:
                break
            jobs.append((f, off, min(chunk, size - off)))
    fds = {}
    try:
        for f in files:
            fds[f] = os.open(f, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        return None, 0, f"open{' O_DIRECT' if direct else ''}: {e.strerror or e}"
    errors, done, lock = [], [0], threading.Lock()
    it = iter(jobs)

    def worker():
        buf = mmap.mmap(-1, chunk)
        try:
            while True:
                with lock:
                    job = next(it, None)
                if job is None or errors:
                    return
                f, off, n = job
                want = n if not direct else (n + 4095) // 4096 * 4096  # O_DIRECT: whole blocks
                got = os.preadv(fds[f], [memoryview(buf)[:want]], off)
                with lock:
                    done[0] += min(got, n)
        except OSError as e:
            errors.append(f"pread{' O_DIRECT' if direct else ''}: {e.strerror or e}")
        finally:
            buf.close()

    t0 = time.perf_counter()
    try:
        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        for fd in fds.values():
            os.close(fd)
    s = time.perf_counter() - t0
    if errors:
        return None, done[0], errors[0]
    return (done[0] / s / GB if s > 0 else None), done[0], None


# ----------------------------------------------------------------------------- parent

def parse_plan(caches, plan, workloads):
    """{workload: [cache, ...]} from --caches and the --plan overrides
    'w10g:cold,hot;small:hot'."""
    default = [c.strip() for c in caches.split(",") if c.strip()]
    out = {w: list(default) for w in workloads}
    for part in (plan or "").split(";"):
        if not part.strip():
            continue
        w, sep, cs = part.partition(":")
        w = w.strip()
        if not sep or w not in WORKLOADS:
            raise ValueError(f"--plan: {part!r} is not WORKLOAD:CACHE,... (workloads: {', '.join(WORKLOADS)})")
        if w in out:
            out[w] = [c.strip() for c in cs.split(",") if c.strip()]
    for w, cs in out.items():
        bad = [c for c in cs if c not in CACHES]
        if bad:
            raise ValueError(f"unknown cache state(s) {', '.join(bad)} for {w}; known: {', '.join(CACHES)}")
    return out


def parse_methods(text):
    out = []
    for m in (x.strip() for x in text.split(",")):
        for mm in ALIASES.get(m, [m] if m else []):
            if mm not in METHODS:
                raise ValueError(f"unknown method {mm}; known: {', '.join(list(METHODS) + list(ALIASES))}")
            if mm not in out:
                out.append(mm)
    return out


class Workload:
    """One workload's files: path (what ferry loads: a .safetensors, the index of a
    sharded checkpoint, a .gguf), files (the data files), fmt, and the reference
    table [(name, file index, begin, end)]."""

    def __init__(self, name, path, files, fmt):
        self.name, self.path, self.files, self.fmt = name, path, list(files), fmt
        self.table = []
        self.refs = None

    def read_table(self):
        self.table = []
        for i, f in enumerate(self.files):
            if self.fmt == "gguf":
                self.table += [(n, i, b, e) for n, b, e in read_gguf_tensors(f)]
            else:
                tensors, _meta = read_header(f)
                self.table += [(n, i, b, e) for n, _dt, _sh, b, e in tensors]
        names = [t[0] for t in self.table]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a tensor name appears twice")

    @property
    def data_bytes(self):
        return sum(e - b for _n, _i, b, e in self.table)

    def all_files(self):
        """Every file that makes it up (the index too): what a tmpfs copy takes."""
        return ([self.path] if self.path not in self.files else []) + self.files

    def spec(self, where=None):
        """The JSON a child reads; where: a folder the files were copied to."""
        move = (lambda p: os.path.join(where, os.path.basename(p))) if where else (lambda p: p)
        return {"name": self.name, "format": self.fmt, "path": move(self.path),
                "files": [move(f) for f in self.files], "tensors": self.table}


class Bench:
    def __init__(self, a):
        self.a = a
        self.t_start = T_PROC_START
        self.runs = []
        self.out = {"tool": "bench/compare_load.py", "format": 2,
                    "units": {"gbps": "1e9 bytes/s", "rss": "bytes", "ms": "milliseconds"},
                    "args": vars(a), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "meta": {}, "preflight": {}, "workloads": {}, "limits": {}, "not_applicable": {},
                    "ferry_bench": None, "runs": self.runs}
        self.timed_out = set()     # methods that timed out once: a hang (GDS) costs one timeout, not one per run
        self.unavailable = {}      # method -> reason it cannot run at all
        self.workloads = {}
        self.tmp = tempfile.mkdtemp(prefix="compare_load.")

    # -- time
    def elapsed(self):
        return time.perf_counter() - self.t_start

    def remaining(self):
        return self.a.budget_seconds - self.elapsed()

    def log(self, msg):
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    # -- output
    def save(self):
        if not self.a.out:
            return
        try:
            self.out["elapsed_seconds"] = self.elapsed()
            self.out["summary"] = self.summary()
            self.out["table_markdown"] = self.tables()
            d = os.path.dirname(os.path.abspath(self.a.out))
            os.makedirs(d, exist_ok=True)
            tmp = self.a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.out, f, indent=1, default=str)
                f.write("\n")
            os.replace(tmp, self.a.out)
            with open(os.path.splitext(self.a.out)[0] + ".md", "w") as f:
                f.write(self.tables() + "\n")
        except Exception as e:  # noqa: BLE001 - never let output kill the run
            print(f"warning: cannot write {self.a.out}: {e}", file=sys.stderr, flush=True)

    # -- children
    def child_env(self):
        """The environment of every child: ferry's library and Python package."""
        env = dict(os.environ)
        if self.a.ferry_library:
            env["FERRY_LIBRARY"] = self.a.ferry_library
        if self.a.ferry_python:
            env["PYTHONPATH"] = self.a.ferry_python + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def child_device(self):
        return "cpu" if self.a.dry_run else self.a.device

    @staticmethod
    def child_report(stdout):
        for line in reversed((stdout or "").splitlines()):
            if line.startswith(RESULT_TAG):
                try:
                    return json.loads(line[len(RESULT_TAG):])
                except ValueError:
                    return None
        return None

    def python_has(self, module, extra_path=None):
        code = (f"import sys; sys.path.insert(0, {extra_path!r}); " if extra_path else "") + f"import {module}"
        rc, _out, err, _, to = run_process([self.a.python, "-c", code], 120, env=self.child_env())
        return rc == 0, ("timed out" if to else last_line(err))

    # -- setup
    def setup(self):
        a = self.a
        meta = self.out["meta"]
        meta["python"] = sys.version.split()[0]
        meta["child_python"] = a.python
        meta["host_cpus"] = os.cpu_count()
        try:
            meta["kernel"] = os.uname().release
            with open("/proc/meminfo") as f:
                meta["mem_total_bytes"] = int(f.readline().split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        rc, out, err, _, _ = run_process(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
             "--format=csv,noheader"], 20)
        meta["nvidia_smi"] = out.strip() if rc == 0 else f"unavailable: {last_line(err) or rc}"
        try:
            self.methods = parse_methods(a.methods)
            names = [w.strip() for w in a.workloads.split(",") if w.strip()]
            bad = [w for w in names if w not in WORKLOADS]
            if bad:
                raise ValueError(f"unknown workload(s) {', '.join(bad)}; known: {', '.join(WORKLOADS)}")
            self.plan = parse_plan(a.caches, a.plan, names)
        except ValueError as e:
            sys.exit(f"compare_load.py: {e}")
        self.out["plan"] = self.plan
        for w in names:
            self.workloads[w] = self.locate(w)
        missing = [w for w, wl in self.workloads.items() if not all(os.path.exists(f) for f in wl.all_files())]
        if missing:
            if not a.make:
                sys.exit(f"compare_load.py: workload(s) {', '.join(missing)} not in {a.dir} (add --make)")
            self.check_room(missing)
            for w in missing:
                self.make(w)
        for w, wl in self.workloads.items():
            wl.read_table()
            info = {"path": wl.path, "files": wl.files, "format": wl.fmt, "tensors": len(wl.table),
                    "data_bytes": wl.data_bytes, "file_bytes": sum(os.path.getsize(f) for f in wl.files),
                    "fs_type": fs_type(wl.files[0])}
            self.out["workloads"][w] = info
            self.log(f"{w}: {len(wl.files)} file(s), {info['file_bytes'] / GB:.3f} GB, {len(wl.table)} tensors, "
                     f"{wl.fmt}, on {info['fs_type']}")
            if info["fs_type"] in ("tmpfs", "ramfs", "overlay", "squashfs") and "cold" in self.plan[w]:
                self.log(f"WARNING: {w} is on {info['fs_type']}: its 'cold' runs cannot be cold")
            na = {m: self.not_applicable(m, wl) for m in self.methods}
            self.out["not_applicable"][w] = {m: why for m, why in na.items() if why}
        self.preflight()
        for wl in self.workloads.values():
            self.reference(wl)
        self.save()

    def locate(self, w):
        a = self.a
        d = a.dir
        if w == "w10g":
            p = a.file or os.path.join(d, "w10g.safetensors")
            return Workload(w, p, [p], "safetensors")
        if w == "sharded":
            n = len(plan_sharded(self.sharded_bytes()))
            sd = os.path.join(d, "sharded")
            files = [os.path.join(sd, f"model-{i + 1:05d}-of-{n:05d}.safetensors") for i in range(n)]
            return Workload(w, os.path.join(sd, "model.safetensors.index.json"), files, "safetensors")
        if w == "gguf":
            p = os.path.join(d, "model.gguf")
            return Workload(w, p, [p], "gguf")
        p = os.path.join(d, f"{w}.safetensors")
        return Workload(w, p, [p], "safetensors")

    def sharded_bytes(self):
        return int(self.a.sharded_gb * self.a.scale * GB)

    def planned_bytes(self, w):
        a = self.a
        if w == "w10g":
            return 2 * a.blocks * 18 * a.hidden * a.hidden * (2 if "torch_mmap" in self.methods else 1)
        if w == "sharded":
            return sum(nb for s in plan_sharded(self.sharded_bytes()) for *_, nb in s)
        if w == "lora":
            return sum(nb for *_, nb in plan_lora(self.lora_tensors()))
        if w == "small":
            return sum(nb for *_, nb in plan_small())
        gw = gguf_writer()
        return sum(gw.nbytes(t, s) for _, t, s in plan_gguf(int(a.gguf_gb * a.scale * GB)))

    def lora_tensors(self):
        return max(2, int(self.a.lora_tensors * min(1.0, self.a.scale * 100)))

    def check_room(self, names):
        """Refuse before writing anything if the disk under --dir lacks room."""
        need = sum(self.planned_bytes(w) for w in names) + (1 << 30)
        os.makedirs(self.a.dir, exist_ok=True)
        st = os.statvfs(self.a.dir)
        free = st.f_bavail * st.f_frsize
        if free < need:
            sys.exit(f"compare_load.py: --make needs about {need / GB:.1f} GB in {self.a.dir} for "
                     f"{', '.join(names)}, only {free / GB:.1f} GB are free: free some, choose fewer "
                     "workloads or a smaller --sharded-gb / --gguf-gb / --scale")

    def make(self, w):
        a, wl = self.a, self.workloads[w]
        t0 = time.perf_counter()
        seed = a.seed * 100 + WORKLOADS.index(w)
        if w == "w10g":
            self.make_w10g(wl.path)
        elif w == "sharded":
            os.makedirs(os.path.dirname(wl.path), exist_ok=True)
            weight_map = {}
            for i, (f, tensors) in enumerate(zip(wl.files, plan_sharded(self.sharded_bytes()))):
                head, n = safetensors_head(tensors, {"format": "pt"})
                write_with_noise(f, head, n, [seed, i])
                weight_map.update({t[0]: os.path.basename(f) for t in tensors})
            idx = {"metadata": {"total_size": sum(os.path.getsize(f) for f in wl.files)}, "weight_map": weight_map}
            with open(wl.path, "w") as fh:
                json.dump(idx, fh, indent=1)
        elif w in ("lora", "small"):
            tensors = plan_lora(self.lora_tensors()) if w == "lora" else plan_small()
            head, n = safetensors_head(tensors, {"format": "pt"})
            write_with_noise(wl.path, head, n, seed)
        else:
            write_gguf(wl.path, plan_gguf(int(a.gguf_gb * a.scale * GB)), seed)
        s = time.perf_counter() - t0
        self.out["meta"].setdefault("make_seconds", {})[w] = s
        self.log(f"made {w} in {s:.1f} s: {', '.join(os.path.basename(f) for f in wl.all_files()[:3])}"
                 + (" ..." if len(wl.all_files()) > 3 else ""))

    def make_w10g(self, path):
        a = self.a
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "make_sample.py")
        cmd = [a.python, script, path, "--blocks", str(a.blocks), "--hidden", str(a.hidden), "--bf16-only"]
        self.log("making the checkpoint: " + " ".join(cmd))
        try:
            r = subprocess.run(cmd, text=True, capture_output=True, timeout=max(60.0, self.remaining()))
        except subprocess.TimeoutExpired:
            sys.exit(f"compare_load.py: make_sample.py took longer than the budget; {path} not made")
        if r.returncode != 0:
            sys.exit(f"compare_load.py: make_sample.py failed (exit {r.returncode}): {tail(r.stderr)}")
        fd = os.open(path, os.O_RDONLY)  # write back now, not during the first cold run
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def not_applicable(self, m, wl):
        """Why method m does not apply to workload wl, or None."""
        if wl.fmt not in METHODS[m]:
            return f"n/a: {m} does not load {wl.fmt} files"
        if m == "torch_mmap" and len(wl.files) > 1:
            return "n/a: torch_mmap reads one FILE.pt (single-file workloads only)"
        return None

    def preflight(self):
        """Find once, before the runs, which methods cannot run at all here."""
        a = self.a
        pf = self.out["preflight"]
        ok_mod = {}
        for m in self.methods:
            if m in FERRY_PATHS:
                continue
            mod = MODULES[m]
            key = (mod, m == "st09")
            if key not in ok_mod:
                if m == "st09" and not a.st09_path:
                    ok_mod[key] = (False, "no --st09-path given")
                else:
                    ok_mod[key] = self.python_has(f"torch, {mod}", a.st09_path if m == "st09" else None)
                pf[f"import {mod}" + (" (st09)" if m == "st09" else "")] = "ok" if ok_mod[key][0] else ok_mod[key][1]
            good, why = ok_mod[key]
            if not good:
                self.unavailable[m] = f"cannot import {mod}: {why or 'import failed'}"
        if "torch_mmap" in self.methods and "torch_mmap" not in self.unavailable:
            for wl in self.workloads.values():
                if not self.not_applicable("torch_mmap", wl):
                    self.ensure_pt(wl)
        fm = [m for m in self.methods if m in FERRY_PATHS]
        if fm:
            reason = None
            if not a.ferry:
                reason = "no --ferry given"
            elif not os.access(a.ferry, os.X_OK):
                reason = f"{a.ferry}: not an executable file"
            else:
                rc, out, err, _, to = run_process([a.ferry, "load", "--help"], 30)
                if rc != 0:
                    reason = f"'{a.ferry} load' unavailable (exit {rc}): {'timed out' if to else last_line(err) or last_line(out)}"
            for m in fm:
                if reason:
                    self.unavailable[m] = reason
            pf["ferry"] = reason or "ok"
        for m, why in self.unavailable.items():
            self.log(f"{m}: unavailable: {why}")

    def ensure_pt(self, wl):
        pt = wl.files[0] + ".pt"
        if os.path.exists(pt) and os.path.getmtime(pt) >= os.path.getmtime(wl.files[0]):
            return
        if not self.a.make:
            self.out["not_applicable"][wl.name]["torch_mmap"] = f"n/a: {pt} missing (add --make to write it)"
            return
        self.log(f"writing {pt} for torch_mmap")
        rc, out, err, wall, to = run_process([self.a.python, os.path.abspath(__file__), "--make-pt", wl.files[0]],
                                             max(30, min(400, self.remaining() - 60)))
        rep = self.child_report(out)
        if not (rc == 0 and rep and rep.get("ok")):
            why = (rep or {}).get("error") or last_line(err) or ("timed out" if to else f"exit {rc}")
            self.out["not_applicable"][wl.name]["torch_mmap"] = f"n/a: cannot write {pt}: {why}"

    def reference(self, wl):
        """wl.refs: {name: digest} of the file's bytes, from a reference child on the
        children's device type; cached beside the workload, keyed by the files'
        sizes and times and the device type."""
        dev = self.child_device()
        key = {"files": [[f, os.path.getsize(f), os.path.getmtime(f)] for f in wl.files],
               "device_type": dev.split(":")[0], "digest": "s0s1-v1"}
        cache = os.path.join(os.path.dirname(wl.files[0]), f".compare_load-{wl.name}.digests.json")
        try:
            with open(cache) as f:
                c = json.load(f)
            if c.get("key") == key:
                wl.refs = c["digests"]
                self.log(f"{wl.name}: reference digests from {cache}")
                return
        except (OSError, ValueError, KeyError):
            pass
        spec_path = os.path.join(self.tmp, f"{wl.name}.ref.json")
        with open(spec_path, "w") as f:
            json.dump(wl.spec(), f)
        out_path = os.path.join(self.tmp, f"{wl.name}.digests.json")
        timeout = max(120.0, wl.data_bytes / 0.3e9)
        rc, out, err, wall, to = run_process([self.a.python, os.path.abspath(__file__), "--ref-child", spec_path,
                                              out_path, "--device", dev], timeout, env=self.child_env())
        rep = self.child_report(out)
        self.out["workloads"][wl.name]["reference"] = {"rc": rc, "wall_seconds": wall, "report": rep}
        if rc != 0 or not rep or not rep.get("ok"):
            why = (rep or {}).get("error") or ("timed out" if to else last_line(err) or rc_text(rc))
            self.log(f"{wl.name}: no reference digests ({why}): runs cannot be verified")
            return
        with open(out_path) as f:
            wl.refs = json.load(f)
        self.log(f"{wl.name}: reference digests of {len(wl.refs)} tensors in {wall:.1f} s on {dev}")
        try:
            with open(cache, "w") as f:
                json.dump({"key": key, "digests": wl.refs}, f)
        except OSError:
            pass

    def ferry_bench(self):
        a = self.a
        wl = next(iter(self.workloads.values()), None)
        if not wl or not a.ferry or not os.access(a.ferry, os.X_OK) or a.bench_timeout <= 0:
            return
        timeout = max(10, min(a.bench_timeout, self.remaining() - 60))
        self.log(f"ferry bench --json {wl.path} (up to {timeout:.0f} s)")
        rc, out, err, wall, to = run_process(
            [a.ferry, "bench", "--device", a.ferry_device or a.device, "--json", wl.path], timeout)
        res = {"ok": False, "rc": rc, "wall_seconds": wall, "timed_out": to, "workload": wl.name}
        if rc == 0:
            try:
                res["json"] = parse_json_output(out)
                res["ok"] = True
            except ValueError as e:
                res["error"] = f"unparsable output: {e}"
        else:
            res["error"] = "timed out" if to else (last_line(err) or f"exit {rc}")
        self.out["ferry_bench"] = res
        self.log(f"ferry bench: {'ok' if res['ok'] else res.get('error')} ({wall:.1f} s)")
        self.save()

    # -- limits
    def measure_limits(self, when):
        """Per workload: the pinned copy rate, the O_DIRECT and the page-cache read
        rates of its files (up to --limit-gb of them)."""
        for w, wl in self.workloads.items():
            lim = {"at": time.strftime("%H:%M:%S")}
            if self.a.dry_run:
                lim["copy_error"] = "dry run: no GPU"
            else:
                rc, out, err, _, to = run_process([self.a.python, os.path.abspath(__file__), "--copy-child",
                                                   self.a.device], 120)
                rep = self.child_report(out) or {}
                if rep.get("ok"):
                    lim["copy_gbps"] = rep["gbps"]
                else:
                    lim["copy_error"] = rep.get("error") or ("timed out" if to else last_line(err) or rc_text(rc))
            cap = int(self.a.limit_gb * GB)
            for f in wl.files:
                drop_cache(f, self.a.drop_caches and not self.a.dry_run)
            # O_DIRECT with each --direct-threads shape (4 and 16 threads of 16 MiB
            # reads; 16 of 512 KiB, fastsafetensors 0.5's nogds shape): the limit
            # is the fastest, so that a loader keeping more (or smaller) reads in
            # flight is not measured against one shape that suits this disk less
            best = None
            for k, chunk in self.a.direct_threads:
                g, n, e = read_rate(wl.files, cap, direct=True, threads=k, chunk=chunk)
                lim[direct_key(k, chunk)] = g
                if e:
                    lim["direct_error"] = e
                if g and (best is None or g > best[0]):
                    best = (g, n)
            if best:
                lim.update(direct_gbps=best[0], direct_bytes=best[1])
            read_rate(wl.files, cap, direct=False)  # fills the cache with what is read next
            g, n, e = read_rate(wl.files, cap, direct=False)
            lim.update(page_cache_gbps=g, page_cache_bytes=n, **({"page_cache_error": e} if e else {}))
            self.out["limits"].setdefault(w, {})[when] = lim
            fmt = lambda k: f"{lim[k]:.2f}" if lim.get(k) else "—"  # noqa: E731
            self.log(f"limits {when} {w}: copy {fmt('copy_gbps')} GB/s, O_DIRECT {fmt('direct_gbps')} GB/s, "
                     f"page cache {fmt('page_cache_gbps')} GB/s")
            self.save()

    def limit(self, w, key):
        vals = [v.get(key) for v in self.out["limits"].get(w, {}).values() if v.get(key)]
        return max(vals) if vals else None

    # -- runs
    def stage(self, wl, method, cache, run):
        """The spec this run loads: the workload itself, or for tmpfs a fresh copy
        of its files in --tmpfs-dir (returned with the folder to delete)."""
        if cache != "tmpfs":
            return wl.spec(), None
        files = wl.all_files() + ([wl.files[0] + ".pt"] if method == "torch_mmap" else [])
        need = sum(os.path.getsize(f) for f in files)
        os.makedirs(self.a.tmpfs_dir, exist_ok=True)
        st = os.statvfs(self.a.tmpfs_dir)
        avail = proc_field("/proc/meminfo", "MemAvailable") or 0
        if st.f_bavail * st.f_frsize < need + (1 << 30) or avail < need + (4 << 30):
            raise RuntimeError(f"no room for {need / GB:.1f} GB in {self.a.tmpfs_dir} "
                               f"({st.f_bavail * st.f_frsize / GB:.1f} GB free there, {avail / GB:.1f} GB RAM available)")
        where = tempfile.mkdtemp(prefix=wl.name + ".", dir=self.a.tmpfs_dir)
        t0 = time.perf_counter()
        for f in files:
            shutil.copyfile(f, os.path.join(where, os.path.basename(f)))
        run["tmpfs_copy_seconds"] = time.perf_counter() - t0
        return wl.spec(where), where

    def prepare_cache(self, files, cache, run):
        t0 = time.perf_counter()
        for path in files:
            if cache == "cold":
                notes = drop_cache(path, self.a.drop_caches and not self.a.dry_run)
                if notes:
                    run.setdefault("cache_notes", []).extend(notes)
            elif cache == "hot":
                frac = page_cache_fraction(path)
                if frac is None or frac < 0.99:
                    run["warm_read_seconds"] = run.get("warm_read_seconds", 0) + warm_cache(
                        path, threads=self.a.warm_threads)
        run["cache_prep_seconds"] = time.perf_counter() - t0
        fr = [page_cache_fraction(p) for p in files]
        run["cached_fraction_before"] = min(fr) if None not in fr else None
        run["fs_type"] = fs_type(files[0])
        c = run["cached_fraction_before"]
        if cache == "cold" and (c or 0) > 0.05:
            run.setdefault("warnings", []).append(f"cold run started with {c:.0%} of a file cached")
        if cache == "hot" and c is not None and c < 0.95:
            run.setdefault("warnings", []).append(f"hot run started with only {c:.0%} of a file cached")

    def run_one(self, wl, cache, method, rnd):
        run = {"workload": wl.name, "cache": cache, "method": method, "round": rnd,
               "status": "error", "ok": False}
        self.runs.append(run)
        if method in self.unavailable:
            run["error"] = self.unavailable[method]
            return run
        if method in self.timed_out:
            run.update(status="skipped", error="skipped: timed out in an earlier run")
            return run
        if self.remaining() <= 0:
            run.update(status="skipped", error=f"skipped: budget of {self.a.budget_seconds:.0f} s used up")
            return run
        where = None
        try:
            spec, where = self.stage(wl, method, cache, run)
            files = [f + ".pt" for f in spec["files"]] if method == "torch_mmap" else spec["files"]
            self.prepare_cache(files, cache, run)
            timeout = max(5.0, min(self.a.run_timeout, self.remaining() + 20))
            run["timeout_seconds"] = timeout
            if method in FERRY_PATHS:
                self.run_ferry(wl, spec, method, run, timeout)
            else:
                self.run_torch(wl, spec, method, run, timeout)
        except Exception as e:  # noqa: BLE001 - a bug or a full tmpfs must not end the benchmark
            run["error"] = f"harness error: {type(e).__name__}: {e}"
        except KeyboardInterrupt:
            run["error"] = "interrupted (the child was killed)"
            raise
        finally:
            if where:
                shutil.rmtree(where, ignore_errors=True)
        if run.get("timed_out"):
            self.timed_out.add(method)
        if run.get("seconds") and run.get("bytes") and not run.get("gbps"):
            run["gbps"] = run["bytes"] / run["seconds"] / GB
        if run.get("seconds"):
            run["ms"] = run["seconds"] * 1000
        if run.get("wall_seconds") and run.get("bytes"):
            run["wall_gbps"] = run["bytes"] / run["wall_seconds"] / GB
        if run["ok"]:
            run["status"] = "ok"
        return run

    def verify(self, wl, digests, run):
        """Compare a child's digests with the file's: verified, mismatches, names."""
        if wl.refs is None:
            run["verified"] = None
            run["verify_note"] = "no reference digests"
            return
        got = digests or {}
        missing = sorted(set(wl.refs) - set(got))
        extra = sorted(set(got) - set(wl.refs))
        wrong = sorted(k for k in set(got) & set(wl.refs) if got[k] != wl.refs[k])
        run["mismatched_tensors"] = len(missing) + len(extra) + len(wrong)
        run["verified"] = run["mismatched_tensors"] == 0
        if not run["verified"]:
            run["mismatch_examples"] = ([f"{k} (differs)" for k in wrong[:5]] + [f"{k} (missing)" for k in missing[:5]]
                                        + [f"{k} (extra)" for k in extra[:5]])[:8]

    def run_torch(self, wl, spec, method, run, timeout):
        a = self.a
        spec_path = os.path.join(self.tmp, f"{wl.name}.run.json")
        with open(spec_path, "w") as f:
            json.dump({k: v for k, v in spec.items() if k != "tensors"}, f)
        cmd = [a.python, os.path.abspath(__file__), "--child", method, spec_path, "--device", self.child_device()]
        if a.dry_run and a.ferry_device:
            cmd += ["--ferry-device", a.ferry_device]
        if method == "st09" and a.st09_path:
            cmd += ["--st09-path", a.st09_path]
        if method in (a.test_corrupt or "").split(","):
            cmd.append("--corrupt")
        run["cmd"] = cmd
        rc, out, err, wall, to = run_process(cmd, timeout, env=self.child_env())
        run.update(rc=rc, wall_seconds=wall, timed_out=to)
        rep = self.child_report(out)
        if rep is None:
            run["error"] = (f"timed out after {timeout:.0f} s" if to else
                            f"child died ({rc_text(rc)}) without a report: {last_line(err) or 'no message'}")
            run["stderr_tail"] = tail(err)
            return
        digests = rep.pop("digests", None)
        if (err or "").strip():  # a peer's warnings (a GDS fallback, say) belong with its numbers
            run["stderr_tail"] = tail(err, 800)
        for k, v in rep.items():
            if k not in ("ok", "error", "traceback", "method", "device"):
                run[k] = v
        if not rep.get("ok"):
            run["error"] = rep.get("error") or "child failed"
            run["traceback"] = rep.get("traceback")
            return
        self.verify(wl, digests, run)
        want = self.child_device()
        if want.startswith("cuda") and ":" not in want:
            want += ":0"
        problems = []
        if run.get("verified") is False:
            problems.append(f"{run['mismatched_tensors']} tensor(s) differ from the file: "
                            + ", ".join(run.get("mismatch_examples", [])))
        if rep.get("bytes") != wl.data_bytes:
            problems.append(f"{rep.get('bytes')} bytes loaded, the file has {wl.data_bytes}")
        if rep.get("tensor_devices") and rep.get("tensor_devices") != [want]:
            problems.append(f"tensors on {rep.get('tensor_devices')}, not on {want}")
        if problems:
            run["error"] = "wrong data: " + "; ".join(problems)
            return
        run["ok"] = True

    def run_ferry(self, wl, spec, method, run, timeout):
        a = self.a
        cmd = [a.ferry, "load", "--device", a.ferry_device or a.device, "--route", FERRY_PATHS[method], "--json"]
        cmd += FERRY_EXTRA.get(method, [])
        if a.ferry_verify:
            cmd.append("--verify")
        cmd.append(spec["path"])
        run["cmd"] = cmd
        rc, out, err, wall, to = run_process(cmd, timeout)
        run.update(rc=rc, wall_seconds=wall, timed_out=to)
        if to:
            run["error"] = f"timed out after {timeout:.0f} s"
            run["stderr_tail"] = tail(err)
            return
        if rc != 0:
            run["error"] = f"{rc_text(rc)}: {last_line(err) or last_line(out) or 'no message'}"
            run["stderr_tail"] = tail(err)
            return
        try:
            j = parse_json_output(out)
        except ValueError as e:
            run["error"] = f"unparsable ferry output: {e}"
            run["stdout_tail"] = tail(out)
            return
        run["ferry_json"] = shrink(j)
        if j.get("ok") is False:
            run["error"] = f"ferry reports ok: false: {last_line(err) or 'no message'}"
            return
        files = [f for f in (j.get("files") if isinstance(j.get("files"), list) else []) if isinstance(f, dict)]
        try:
            secs = [float(f["seconds"]) for f in files if f.get("seconds") is not None]
            nbytes = [int(f["bytes"]) for f in files if f.get("bytes") is not None]
            ntensors = sum(int(f.get("tensors") or 0) for f in files)
        except (TypeError, ValueError) as e:
            run["error"] = f"bad 'files' entries in ferry output: {e}"
            return
        if not secs or not nbytes:
            run["error"] = "ferry output has no files[].seconds / files[].bytes"
            return
        run.update(seconds=sum(secs), bytes=sum(nbytes), tensors=ntensors)
        run["gbps"] = run["bytes"] / run["seconds"] / GB if run["seconds"] > 0 else None
        run["path_used"] = sorted({str(f.get("route")) for f in files if f.get("route") is not None})
        whys = [f.get("why") for f in files if f.get("why")]
        if whys:
            run["path_why"] = whys[0] if len(set(whys)) == 1 else whys
        if isinstance(j.get("peak_rss_bytes"), (int, float)):
            run["peak_rss_bytes"] = int(j["peak_rss_bytes"])
        # the CLI holds the tensors, so its own --verify (XXH3-64 of every tensor
        # copied back, against the file's) is the check here
        run["verified"] = j.get("verified") if a.ferry_verify else None
        if not a.ferry_verify:
            run["verify_note"] = "not checked (--no-ferry-verify)"
        problems = []
        if run["verified"] is False:
            problems.append("ferry load --verify found tensors that differ from the file")
        if run["bytes"] != wl.data_bytes:
            problems.append(f"ferry reports {run['bytes']} bytes, the file has {wl.data_bytes}")
        if ntensors and ntensors != len(wl.table):
            run["mismatched_tensors"] = abs(ntensors - len(wl.table))
            problems.append(f"ferry loaded {ntensors} tensors, the file has {len(wl.table)}")
        if problems:
            run["error"] = "wrong data: " + "; ".join(problems)
            return
        run["ok"] = True

    def describe(self, r):
        if r["status"] == "skipped":
            return r.get("error", "skipped")
        c = r.get("cached_fraction_before")
        cs = f"cached {c:.0%} before" if c is not None else "cache unknown"
        if not r["ok"]:
            wall = f" after {r['wall_seconds']:.1f} s" if r.get("wall_seconds") else ""
            return f"ERROR{wall}: {r.get('error')} ({cs})"
        s = (f"{r['gbps']:.2f} GB/s ({r['seconds'] * 1000:.1f} ms load, {r['wall_seconds']:.1f} s process, "
             f"peak RSS {(r.get('peak_rss_bytes') or 0) / GIB:.2f} GiB, verified {r.get('verified')}, {cs}")
        if r.get("path_used"):
            s += f", path {'/'.join(r['path_used'])}"
        if r.get("warnings"):
            s += "; " + "; ".join(r["warnings"])
        return s + ")"

    def run_all(self):
        todo = [(w, c) for w in self.workloads for c in self.plan[w]]
        total = self.a.rounds * sum(1 for w, c in todo for m in self.methods
                                    if not self.out["not_applicable"][w].get(m))
        i = 0
        for rnd in range(1, self.a.rounds + 1):
            k = (rnd - 1) % max(1, len(self.methods))
            order = self.methods[k:] + self.methods[:k]  # rotated: no method always first after a cache change
            for w, c in todo:
                for m in order:
                    if self.out["not_applicable"][w].get(m):
                        continue
                    i += 1
                    r = self.run_one(self.workloads[w], c, m, rnd)
                    self.log(f"[{i}/{total}] round {rnd} {w} {c} {m}: {self.describe(r)}")
                    self.save()

    # -- report
    def summary(self):
        out = {}
        for w, wl in self.workloads.items():
            sw = out[w] = {}
            copy, direct = self.limit(w, "copy_gbps"), self.limit(w, "direct_gbps")
            for c in self.plan.get(w, []):
                sc = sw[c] = {}
                for m in self.methods:
                    na = self.out["not_applicable"].get(w, {}).get(m)
                    if na:
                        sc[m] = {"n/a": na}
                        continue
                    rs = [r for r in self.runs if r["workload"] == w and r["cache"] == c and r["method"] == m]
                    ok = [r for r in rs if r["ok"] and r.get("gbps")]
                    s = {"runs": len(rs), "ok": len(ok), "skipped": sum(r["status"] == "skipped" for r in rs)}
                    if ok:
                        g = [r["gbps"] for r in ok]
                        s.update(median_gbps=statistics.median(g), best_gbps=max(g),
                                 median_seconds=statistics.median(r["seconds"] for r in ok),
                                 median_wall_seconds=statistics.median(r["wall_seconds"] for r in ok))
                        lim = direct if c == "cold" else copy
                        if lim:
                            s["x_limit"] = s["median_gbps"] / lim
                        if w == "small" and copy:
                            s["target_seconds"] = 2 * wl.data_bytes / (copy * GB) + 0.005
                            s["x_target"] = s["median_seconds"] / s["target_seconds"]
                    rss = [r["peak_rss_bytes"] for r in rs if r.get("peak_rss_bytes")]
                    s["peak_rss_max_bytes"] = max(rss) if rss else None
                    ver = [r.get("verified") for r in rs if "verified" in r]
                    s["verified"] = (None if not ver or None in ver else all(ver))
                    s["mismatched_max"] = max((r.get("mismatched_tensors") or 0 for r in rs), default=0)
                    paths = sorted({p for r in rs for p in r.get("path_used") or []})
                    if paths:
                        s["path_used"] = paths
                    errs = []
                    for r in rs:
                        if r["status"] == "error" and r.get("error") and r["error"] not in errs:
                            errs.append(r["error"])
                    s["errors"] = errs[:3]
                    sc[m] = s
        return out

    def versions(self):
        """method -> the version of the package its children imported (first run that says)."""
        keys = ["safetensors", "instanttensor", "fastsafetensors", "runai_model_streamer", "gguf"]
        out = {}
        for r in self.runs:
            if r["method"] in out:
                continue
            for k in keys:
                if r.get(k):
                    out[r["method"]] = f"{k} {r[k]}" + (f" ({r['st09_api']})" if r.get("st09_api") else "")
                    break
        torch = next((r["torch"] for r in self.runs if r.get("torch")), None)
        if torch:
            out["torch"] = torch
        return out

    def tables(self):
        summ = self.summary()
        parts = []
        dry = " (DRY RUN: CPU, not a measurement)" if self.a.dry_run else ""
        for w, sw in summ.items():
            info = self.out["workloads"].get(w, {})
            fmt = lambda v: f"{v:.2f}" if v else "—"  # noqa: E731
            parts.append(f"### {w}: {(info.get('data_bytes') or 0) / GB:.3f} GB in {info.get('tensors')} tensors, "
                         f"{len(info.get('files') or [])} file(s), {info.get('format')}, on {info.get('fs_type')}{dry}\n\n"
                         f"limits (best of start and end): pinned copy {fmt(self.limit(w, 'copy_gbps'))} GB/s, "
                         f"O_DIRECT read {fmt(self.limit(w, 'direct_gbps'))} GB/s, "
                         f"page-cache read {fmt(self.limit(w, 'page_cache_gbps'))} GB/s\n")
            small = w == "small"
            head = ("| method | cache | GB/s median (best) | × limit | load ms | "
                    + ("× target | " if small else "") + "process s | peak RSS | verified | ok runs | notes |")
            lines = [head, "|" + " --- |" * (head.count("|") - 1)]
            na = {}  # method -> reason, one row per workload, not one per cache state
            for c, sc in sw.items():
                for m, s in sc.items():
                    if "n/a" in s:
                        na[m] = s["n/a"]
                        continue
                    notes = []
                    if s.get("path_used"):
                        notes.append("path " + "/".join(s["path_used"]))
                    if s["skipped"]:
                        notes.append(f"{s['skipped']} skipped")
                    if s["errors"]:
                        notes.append("error: " + s["errors"][0][:160].replace("|", "\\|").replace("\n", " "))
                    ver = {True: "yes", False: f"NO ({s['mismatched_max']} differ)", None: "—"}[s["verified"]]
                    cells = [m, c,
                             f"{s['median_gbps']:.2f} ({s['best_gbps']:.2f})" if s.get("median_gbps") else "—",
                             f"{s['x_limit']:.2f}" if s.get("x_limit") else "—",
                             f"{s['median_seconds'] * 1000:.1f}" if s.get("median_seconds") else "—"]
                    if small:
                        cells.append(f"{s['x_target']:.2f}" if s.get("x_target") else "—")
                    cells += [f"{s['median_wall_seconds']:.2f}" if s.get("median_wall_seconds") else "—",
                              f"{s['peak_rss_max_bytes'] / GIB:.2f} GiB" if s.get("peak_rss_max_bytes") else "—",
                              ver, f"{s['ok']}/{s['runs']}", "; ".join(notes)]
                    lines.append("| " + " | ".join(cells) + " |")
            for m, why in na.items():
                cells = [m, "all", why] + [""] * (head.count("|") - 4)
                lines.append("| " + " | ".join(cells) + " |")
            parts.append("\n".join(lines))
        parts.insert(0, "versions: " + (", ".join(f"{m} {v}" for m, v in self.versions().items()) or "—"))
        legend = ("× limit: median GB/s over the limit (cold: O_DIRECT read; hot, tmpfs: pinned copy). "
                  "× target (small): median load time over 2 × bytes / copy rate + 5 ms. "
                  "verified: every tensor's digest equals the file's (ferry CLI: its --verify).")
        return "\n\n".join(parts + [legend])

    def report(self):
        self.out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()
        print(flush=True)
        print(f"## GPU load comparison, {self.a.rounds} round(s), {self.elapsed():.0f} s; "
              f"GPU: {self.out['meta'].get('nvidia_smi')}\n", flush=True)
        print(self.tables(), flush=True)
        if self.a.out:
            print(f"\nJSON: {self.a.out}", flush=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    sub = {"--child": child_main, "--ref-child": ref_child_main, "--copy-child": copy_child_main,
           "--make-pt": make_pt_main}
    if len(sys.argv) > 1 and sys.argv[1] in sub:
        sub[sys.argv[1]](sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        self_test_main()
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default="build/ferry", help="the ferry CLI (default build/ferry)")
    ap.add_argument("--ferry-library", default=None,
                    help="libferry.so for ferry_py (default: beside --ferry, if there)")
    ap.add_argument("--ferry-python", default=os.path.join(here, "..", "python"),
                    help="the folder holding ferry's Python package (default: the repo's python/)")
    ap.add_argument("--st09-path", default=None, help="folder where safetensors 0.9 is installed (pip --target)")
    ap.add_argument("--dir", default=os.path.join(here, "..", "build-cmp"),
                    help="where the workloads are (made with --make); default build-cmp/ in the repo (git ignores it)")
    ap.add_argument("--workloads", default="w10g,sharded,lora,small,gguf")
    ap.add_argument("--file", default=None, help="w10g's file (default DIR/w10g.safetensors)")
    ap.add_argument("--make", action="store_true", help="make missing workloads (refuses if the disk lacks room)")
    ap.add_argument("--make-only", action="store_true",
                    help="make the workloads and their reference digests (cached in --dir), then stop: "
                         "a first command on a machine whose commands are limited in time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=44, help="w10g: transformer blocks (default 44)")
    ap.add_argument("--hidden", type=int, default=2560, help="w10g: hidden size (default 2560: 10.4 GB, 540 tensors)")
    ap.add_argument("--sharded-gb", type=float, default=30, help="sharded: total GB (default 30, shards of ~5 GB)")
    ap.add_argument("--lora-tensors", type=int, default=3000, help="lora: tensors (default 3000, ~330 MB)")
    ap.add_argument("--gguf-gb", type=float, default=3, help="gguf: GB (default 3)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the sizes of sharded and gguf (and lora's count below 0.01): 0.003 for a dry run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help=f"comma-separated (default {','.join(DEFAULT_METHODS)}); all: {','.join(METHODS)}; "
                         "ferry_cli = the four ferry CLI paths")
    ap.add_argument("--caches", default="cold,hot,tmpfs", help="cache states for every workload")
    ap.add_argument("--plan", default=None, help="per-workload cache states: 'w10g:cold,hot,tmpfs;small:hot'")
    ap.add_argument("--tmpfs-dir", default="/dev/shm/ferry-cmp")
    ap.add_argument("--direct-threads", type=parse_direct_shapes, default=parse_direct_shapes("4,16,16x512K"),
                    help="shapes of the O_DIRECT reads the cold limit is measured with, comma-separated: "
                         "THREADS (16 MiB reads) or THREADSxSIZE (e.g. 16x512K); the limit is the fastest "
                         "(default 4,16,16x512K)")
    ap.add_argument("--limit-gb", type=float, default=8,
                    help="GB of each workload read when measuring the O_DIRECT and page-cache limits (default 8)")
    ap.add_argument("--out", default="compare_load.json", help="JSON output (a .md table is written beside it)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ferry-device", help="--device for ferry load/bench (default: --device; sim:SIZE to test)")
    ap.add_argument("--no-ferry-verify", dest="ferry_verify", action="store_false",
                    help="do not pass --verify to ferry load (it copies every tensor back and hashes it, "
                         "after the timed load: the process takes longer)")
    ap.add_argument("--budget-seconds", type=float, default=540,
                    help="after this many seconds from the start (including --make) no run is started (default 540)")
    ap.add_argument("--run-timeout", type=float, default=180, help="seconds one run may take (default 180)")
    ap.add_argument("--bench-timeout", type=float, default=0,
                    help="seconds 'ferry bench --json' on the first workload may take; 0 (default) skips it")
    ap.add_argument("--warm-threads", type=int, default=1, help="threads that fill the cache before a hot run")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                    help="cold runs: posix_fadvise only, leave /proc/sys/vm/drop_caches alone")
    ap.add_argument("--no-limits", dest="limits", action="store_false", help="skip the limit measurements")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the torch children")
    ap.add_argument("--test-corrupt", default=None,
                    help="comma-separated methods whose child flips one bit after loading (checks the check)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: torch methods on the CPU where they can, ferry methods on --ferry-device")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.ferry_library is None and a.ferry:
        cand = os.path.join(os.path.dirname(os.path.abspath(a.ferry)), "libferry.so")
        a.ferry_library = cand if os.path.exists(cand) else None
    a.ferry_python = os.path.abspath(a.ferry_python) if a.ferry_python else None
    a.st09_path = os.path.abspath(a.st09_path) if a.st09_path else None
    b = Bench(a)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    b.log(f"compare_load: workloads {a.workloads}, methods {a.methods}, {a.rounds} round(s), "
          f"budget {a.budget_seconds:.0f} s" + (", DRY RUN" if a.dry_run else ""))
    try:
        b.setup()
        if a.make_only:
            b.log("--make-only: workloads made and reference digests cached; no runs")
            return
        b.ferry_bench()
        if a.limits:
            b.measure_limits("start")
        b.run_all()
        if a.limits:
            b.measure_limits("end")
    except KeyboardInterrupt:
        b.out["interrupted"] = True
        b.log("interrupted: writing what was measured")
    except SystemExit as e:  # a fatal setup error: still leave the JSON behind
        b.out["fatal"] = str(e.code)
        b.save()
        shutil.rmtree(b.tmp, ignore_errors=True)
        raise
    b.report()


if __name__ == "__main__":
    main()
