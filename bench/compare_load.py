#!/usr/bin/env python3
"""Compare GPU checkpoint loaders side by side: safetensors, torch.load(mmap=True)
and the ferry CLI's transfer paths, cold and hot page cache, each run in a fresh
process, alternating methods so that drift on a shared machine hits all alike.

    python3 bench/compare_load.py --ferry build/ferry --file /data/bench10g.safetensors \\
        --make [--rounds 2] [--out OUT.json] [--methods st_cuda,ferry_auto,...]

Methods (each run is a fresh child process):
  st_cuda        safetensors.torch.load_file(FILE, device="cuda:0")
  st_cpu_to      load_file(FILE) on CPU, then .to("cuda:0") per tensor
  st_pin         load_file(FILE) on CPU, .pin_memory().to("cuda:0", non_blocking=True), synchronize
  torch_mmap     torch.load(FILE.pt, mmap=True, weights_only=True), then .to("cuda:0") per tensor
  ferry_auto, ferry_ring, ferry_direct, ferry_register
                 FERRY load --device cuda:0 --path P --json FILE (the CLI is the child)

For every run: seconds of the load itself (torch children: from the first call to
the last torch.cuda.synchronize(), after imports and CUDA initialisation; ferry:
the seconds the CLI reports), the whole process's wall time measured by this
script, bytes, GB/s (10^9 bytes per second), peak RSS (VmHWM of the child, or the
peak_rss_bytes ferry reports), and for torch children a checksum of sampled bytes
(head, middle and tail of every tensor) compared with the same sample read from
the file, so a fast but wrong load is caught.

Cold: the data file is fsync'ed and dropped from the page cache with
posix_fadvise(DONTNEED) (and /proc/sys/vm/drop_caches, where writable) before the
run. Hot: the file is read once, front to back by one thread (as cat, cp or a
download fill the cache), if it is not already fully cached. --warm-threads N
reads it with N threads instead, interleaved on one descriptor: the kernel then
caches it in single-page folios, and the first read afterwards, by any method,
runs at about half speed while the kernel activates every page (bench/RESULTS.md,
third GPU session; bench/archive/folio_sizes.py shows the folios). The share of the
file in the page cache just before each run is measured with mincore() and
recorded, so a "cold" run that was not cold shows.

Robust by design: a method that fails, crashes or hangs records its error and the
run goes on; a method that times out is not started again; after --budget-seconds
(counted from this script's start, including --make) the remaining runs are
skipped and reported as skipped. The JSON output is rewritten after every run, so
an interrupted run still leaves its results.

--dry-run (for machines without a GPU): torch methods run on the CPU if torch is
installed (a check of this script's logic, not a measurement), else record
"torch not installed"; ferry methods run if the CLI has a 'load' command (and
fail without a GPU); /proc/sys/vm/drop_caches is left alone.
"""
import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib

T_PROC_START = time.perf_counter()

TORCH_METHODS = ["st_cuda", "st_cpu_to", "st_pin", "torch_mmap"]
FERRY_PATHS = {"ferry_auto": "auto", "ferry_ring": "ring", "ferry_direct": "direct",
               "ferry_register": "register"}
ALL_METHODS = TORCH_METHODS + list(FERRY_PATHS)
RESULT_TAG = "COMPARE_LOAD_RESULT "
SAMPLE = 256          # bytes per checksum sample
GB = 1e9
GIB = float(1 << 30)


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


def sample_starts(n):
    """Start offsets of the checksum samples of an n-byte tensor (each SAMPLE
    bytes long, clipped to n). The child and the reference use the same ones."""
    if n <= 0:
        return []
    return [0, max(0, n // 2 - SAMPLE // 2), max(0, n - SAMPLE)]


def reference_checksum(path, tensors):
    """CRC32 of the sampled bytes of every tensor, in name order, read from the file."""
    crc = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for name, _dt, _sh, b, e in sorted(tensors):
            for s in sample_starts(e - b):
                crc = zlib.crc32(os.pread(fd, min(SAMPLE, e - b - s), b + s), crc)
    finally:
        os.close(fd)
    return crc & 0xFFFFFFFF


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


# ----------------------------------------------------------------------------- child (torch)

def child_main(argv):
    """--child METHOD FILE [--device DEV]: load FILE with METHOD, print one
    RESULT_TAG line of JSON, exit 0 (ok) or 1 (error)."""
    ap = argparse.ArgumentParser(prog="compare_load.py --child")
    ap.add_argument("method")
    ap.add_argument("file")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args(argv)
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
    sys.stdout.write(RESULT_TAG + json.dumps(rep) + "\n")
    sys.stdout.flush()
    os._exit(0 if rep["ok"] else 1)  # skip the teardown of 10 GB of tensors


def _child_load(a, rep):
    import torch
    from safetensors.torch import load_file
    import safetensors
    rep["torch"] = torch.__version__
    rep["safetensors"] = getattr(safetensors, "__version__", None)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
        rep["gpu"] = torch.cuda.get_device_name(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    rep["init_seconds"] = time.perf_counter() - T_PROC_START  # interpreter, imports, CUDA init
    rep["rss_before_load_bytes"] = vm_status("VmRSS")
    m, path = a.method, a.file
    t0 = time.perf_counter()
    if m == "st_cuda":
        out = load_file(path, device=str(dev))
        sync()
    elif m == "st_cpu_to":
        cpu = load_file(path)
        out = {k: v.to(dev) for k, v in cpu.items()}
        sync()
    elif m == "st_pin":
        cpu = load_file(path)
        if cuda:
            out = {k: v.pin_memory().to(dev, non_blocking=True) for k, v in cpu.items()}
        else:  # dry run: pinning needs CUDA
            out = {k: v.to(dev) for k, v in cpu.items()}
            rep["note"] = "dry run on CPU: pin_memory skipped"
        sync()
    elif m == "torch_mmap":
        cpu = torch.load(path + ".pt", mmap=True, weights_only=True)
        out = {k: v.to(dev) for k, v in cpu.items()}
        sync()
    else:
        raise ValueError(f"unknown method {m!r}")
    t1 = time.perf_counter()
    rep["seconds"] = t1 - t0
    rep["tensors"] = len(out)
    rep["bytes"] = sum(t.numel() * t.element_size() for t in out.values())
    rep["gbps"] = rep["bytes"] / rep["seconds"] / GB if rep["seconds"] > 0 else None
    rep["peak_rss_load_bytes"] = vm_status("VmHWM")
    devs = sorted({str(t.device) for t in out.values()})
    rep["tensor_devices"] = devs
    # checksum-lite: head, middle and tail SAMPLE bytes of every tensor, name order
    parts = []
    for k in sorted(out):
        flat = out[k].detach().reshape(-1).view(torch.uint8)
        n = flat.numel()
        for s in sample_starts(n):
            parts.append(flat[s:s + min(SAMPLE, n - s)])
    crc = 0
    if parts:
        blob = torch.cat(parts).cpu()
        try:
            data = blob.numpy().tobytes()
        except Exception:  # noqa: BLE001 - numpy missing
            data = bytes(blob.tolist())
        crc = zlib.crc32(data)
    rep["checksum"] = crc & 0xFFFFFFFF
    if cuda:
        rep["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)


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
    sys.stdout.write(RESULT_TAG + json.dumps(rep) + "\n")
    sys.stdout.flush()
    os._exit(0 if rep["ok"] else 1)


# ----------------------------------------------------------------------------- parent

class Bench:
    def __init__(self, a):
        self.a = a
        self.t_start = T_PROC_START
        self.runs = []
        self.out = {"tool": "bench/compare_load.py", "units": {"gbps": "1e9 bytes/s", "rss": "bytes"},
                    "args": vars(a), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "meta": {}, "preflight": {}, "ferry_bench": None, "runs": self.runs}
        self.timed_out_methods = set()
        self.unavailable = {}  # method -> reason it cannot run at all

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
            self.out["table_markdown"] = self.table()
            d = os.path.dirname(os.path.abspath(self.a.out))
            os.makedirs(d, exist_ok=True)
            tmp = self.a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.out, f, indent=1, default=str)
                f.write("\n")
            os.replace(tmp, self.a.out)
        except Exception as e:  # noqa: BLE001 - never let output kill the run
            print(f"warning: cannot write {self.a.out}: {e}", file=sys.stderr, flush=True)

    # -- setup
    def python_has(self, module):
        rc, _out, err, _, _ = run_process([self.a.python, "-c", f"import {module}"], 120)
        return rc == 0, last_line(err)

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

        methods = [m.strip() for m in a.methods.split(",") if m.strip()]
        bad = [m for m in methods if m not in ALL_METHODS]
        if bad:
            sys.exit(f"compare_load.py: unknown method(s) {', '.join(bad)}; known: {', '.join(ALL_METHODS)}")
        self.methods = methods

        if not os.path.exists(a.file):
            if not a.make:
                sys.exit(f"compare_load.py: {a.file} does not exist (add --make to create it)")
            self.make_file()
        tensors, st_meta = read_header(a.file)
        size = os.path.getsize(a.file)
        meta["file"] = {"path": a.file, "bytes": size, "tensors": len(tensors),
                        "data_bytes": sum(e - b for *_, b, e in tensors),
                        "dtypes": sorted({t[1] for t in tensors}), "metadata": st_meta,
                        "fs_type": fs_type(a.file)}
        self.data_bytes = meta["file"]["data_bytes"]
        self.n_tensors = len(tensors)
        self.ref_checksum = reference_checksum(a.file, tensors)
        meta["file"]["reference_checksum"] = self.ref_checksum
        self.log(f"file {a.file}: {size / GB:.2f} GB, {len(tensors)} tensors, "
                 f"dtypes {','.join(meta['file']['dtypes'])}, filesystem {meta['file']['fs_type']}")
        if meta["file"]["fs_type"] in ("tmpfs", "ramfs", "overlay", "squashfs"):
            self.log(f"WARNING: {a.file} is on {meta['file']['fs_type']}: 'cold' runs cannot be cold; "
                     "put the file on the disk")

        # torch availability for the torch methods
        tm = [m for m in methods if m in TORCH_METHODS]
        if tm:
            ok, why = self.python_has("torch, safetensors.torch")
            self.out["preflight"]["torch"] = "ok" if ok else why
            if not ok:
                reason = "torch not installed" + (f" ({why})" if why else "")
                for m in tm:
                    self.unavailable[m] = reason
            elif "torch_mmap" in tm:
                self.ensure_pt()

        # ferry CLI availability
        fm = [m for m in methods if m in FERRY_PATHS]
        if fm:
            reason = None
            if not a.ferry:
                reason = "no --ferry given"
            elif not os.access(a.ferry, os.X_OK):
                reason = f"{a.ferry}: not an executable file"
            else:
                rc, out, err, _, to = run_process([a.ferry, "load", "--help"], 30)
                self.out["preflight"]["ferry_load_help_rc"] = rc
                if rc != 0:
                    why = "timed out" if to else (last_line(err) or last_line(out))
                    reason = f"'{a.ferry} load' unavailable (exit {rc}): {why}"
            if reason:
                for m in fm:
                    self.unavailable[m] = reason
            self.out["preflight"]["ferry"] = reason or "ok"
        for m, why in self.unavailable.items():
            self.log(f"{m}: unavailable: {why}")
        self.save()

    def make_file(self):
        a = self.a
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "make_sample.py")
        est = 2 * 2 * a.blocks * 18 * a.hidden * a.hidden  # bytes (x2 room)
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(a.file)))
            free = st.f_bavail * st.f_frsize
            if free < est:
                sys.exit(f"compare_load.py: {free / GB:.1f} GB free next to {a.file}, "
                         f"about {est / GB:.1f} GB needed (file and its .pt copy)")
        except OSError:
            pass
        cmd = [a.python, script, a.file, "--blocks", str(a.blocks), "--hidden", str(a.hidden), "--bf16-only"]
        self.log("making the checkpoint: " + " ".join(cmd))
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, text=True, capture_output=True, timeout=max(60.0, self.remaining()))
        except subprocess.TimeoutExpired:
            sys.exit(f"compare_load.py: make_sample.py took longer than the budget; {a.file} not made")
        if r.returncode != 0:
            sys.exit(f"compare_load.py: make_sample.py failed (exit {r.returncode}): {tail(r.stderr)}")
        t1 = time.perf_counter()
        fd = os.open(a.file, os.O_RDONLY)  # write back now, not during the first cold run
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        t2 = time.perf_counter()
        self.out["meta"]["make_seconds"] = {"write": t1 - t0, "fsync": t2 - t1}
        self.log(f"made {a.file} ({last_line(r.stdout)}) in {t1 - t0:.1f} s + fsync {t2 - t1:.1f} s")

    def ensure_pt(self):
        a = self.a
        pt = a.file + ".pt"
        fresh = (os.path.exists(pt) and os.path.getmtime(pt) >= os.path.getmtime(a.file)
                 and os.path.getsize(pt) >= os.path.getsize(a.file) * 0.9)
        if fresh:
            return
        if not a.make:
            self.unavailable["torch_mmap"] = f"{pt} missing or older than the file (add --make to write it)"
            return
        self.log(f"writing {pt} (safetensors on CPU, torch.save, fsync) for torch_mmap")
        rc, out, err, wall, to = run_process([a.python, os.path.abspath(__file__), "--make-pt", a.file],
                                             max(30, min(400, self.remaining() - 60)))
        rep = self.child_report(out)
        self.out["meta"]["make_pt"] = {"rc": rc, "wall_seconds": wall, "timed_out": to, "report": rep}
        if rc == 0 and rep and rep.get("ok"):
            self.log(f"wrote {pt}: {rep['bytes'] / GB:.2f} GB in {wall:.1f} s")
        else:
            why = (rep or {}).get("error") or last_line(err) or ("timed out" if to else f"exit {rc}")
            self.unavailable["torch_mmap"] = f"cannot write {pt}: {why}"
            try:
                os.unlink(pt + ".tmp")
            except OSError:
                pass

    def ferry_bench(self):
        a = self.a
        if not a.ferry or not os.access(a.ferry, os.X_OK) or a.bench_timeout <= 0:
            return
        rc, out, err, _, _ = run_process([a.ferry, "bench", "--help"], 30)
        if rc != 0:
            self.out["ferry_bench"] = {"ok": False, "error": f"no 'ferry bench' (exit {rc}): {last_line(err)}"}
            self.log(f"ferry bench: unavailable ({last_line(err) or rc}), skipped")
            return
        timeout = max(10, min(a.bench_timeout, self.remaining() - 60))
        self.log(f"ferry bench --json (up to {timeout:.0f} s)")
        rc, out, err, wall, to = run_process(
            [a.ferry, "bench", "--device", a.ferry_device or a.device, "--json", a.file], timeout)
        res = {"ok": False, "rc": rc, "wall_seconds": wall, "timed_out": to}
        if rc == 0:
            try:
                res["json"] = parse_json_output(out)
                res["ok"] = True
            except ValueError as e:
                res["error"] = f"unparsable output: {e}"
                res["stdout_tail"] = tail(out)
        else:
            res["error"] = "timed out" if to else (last_line(err) or f"exit {rc}")
            res["stderr_tail"] = tail(err)
        self.out["ferry_bench"] = res
        self.log(f"ferry bench: {'ok' if res['ok'] else res.get('error')} ({wall:.1f} s)")
        self.save()

    # -- runs
    @staticmethod
    def child_report(stdout):
        for line in reversed((stdout or "").splitlines()):
            if line.startswith(RESULT_TAG):
                try:
                    return json.loads(line[len(RESULT_TAG):])
                except ValueError:
                    return None
        return None

    def data_file(self, method):
        return self.a.file + ".pt" if method == "torch_mmap" else self.a.file

    def prepare_cache(self, method, cache, run):
        path = self.data_file(method)
        t0 = time.perf_counter()
        if cache == "cold":
            notes = drop_cache(path, self.a.drop_caches and not self.a.dry_run)
            if notes:
                run["cache_notes"] = notes
        else:
            frac = page_cache_fraction(path)
            if frac is None or frac < 0.99:
                run["warm_read_seconds"] = warm_cache(path, threads=self.a.warm_threads)
        run["cache_prep_seconds"] = time.perf_counter() - t0
        run["cached_fraction_before"] = page_cache_fraction(path)
        if cache == "cold" and (run["cached_fraction_before"] or 0) > 0.05:
            run.setdefault("warnings", []).append(
                f"cold run started with {run['cached_fraction_before']:.0%} of the file cached")
        if cache == "hot" and run["cached_fraction_before"] is not None and run["cached_fraction_before"] < 0.95:
            run.setdefault("warnings", []).append(
                f"hot run started with only {run['cached_fraction_before']:.0%} of the file cached")

    def run_one(self, method, cache, rnd):
        run = {"method": method, "cache": cache, "round": rnd, "status": "error", "ok": False}
        self.runs.append(run)
        if method in self.unavailable:
            run["error"] = self.unavailable[method]
            return run
        if method in self.timed_out_methods:
            run.update(status="skipped", error="skipped: timed out in an earlier run")
            return run
        if self.remaining() <= 0:
            run.update(status="skipped", error=f"skipped: budget of {self.a.budget_seconds:.0f} s used up")
            return run
        try:
            self.prepare_cache(method, cache, run)
        except Exception as e:  # noqa: BLE001
            run["error"] = f"cache preparation failed: {type(e).__name__}: {e}"
            return run
        timeout = max(5.0, min(self.a.run_timeout, self.remaining() + 20))
        run["timeout_seconds"] = timeout
        try:
            if method in FERRY_PATHS:
                self.run_ferry(method, run, timeout)
            else:
                self.run_torch(method, run, timeout)
        except Exception as e:  # noqa: BLE001 - a bug here must not end the benchmark
            run["error"] = f"harness error: {type(e).__name__}: {e}"
        except KeyboardInterrupt:
            run["error"] = "interrupted (the child was killed)"
            raise
        if run.get("timed_out"):
            self.timed_out_methods.add(method)
        if run.get("seconds") and run.get("bytes") and not run.get("gbps"):
            run["gbps"] = run["bytes"] / run["seconds"] / GB
        if run.get("wall_seconds") and run.get("bytes"):
            run["wall_gbps"] = run["bytes"] / run["wall_seconds"] / GB
        if run["ok"]:
            run["status"] = "ok"
        return run

    def run_torch(self, method, run, timeout):
        a = self.a
        cmd = [a.python, os.path.abspath(__file__), "--child", method, a.file,
               "--device", "cpu" if a.dry_run else a.device]
        run["cmd"] = cmd
        rc, out, err, wall, to = run_process(cmd, timeout)
        run.update(rc=rc, wall_seconds=wall, timed_out=to)
        rep = self.child_report(out)
        if rep is None:
            run["error"] = (f"timed out after {timeout:.0f} s" if to else
                            f"child died ({rc_text(rc)}) without a report: {last_line(err) or 'no message'}")
            run["stderr_tail"] = tail(err)
            return
        for k in ("seconds", "bytes", "gbps", "tensors", "peak_rss_bytes", "peak_rss_load_bytes",
                  "rss_before_load_bytes", "rss_end_bytes", "init_seconds", "checksum",
                  "gpu_max_allocated_bytes", "tensor_devices", "gpu", "torch", "safetensors", "note"):
            if k in rep:
                run[k] = rep[k]
        if not rep.get("ok"):
            run["error"] = rep.get("error") or "child failed"
            run["traceback"] = rep.get("traceback")
            return
        problems = []
        if rep.get("checksum") != self.ref_checksum:
            problems.append(f"checksum {rep.get('checksum')} != file's {self.ref_checksum}")
        if rep.get("bytes") != self.data_bytes:
            problems.append(f"{rep.get('bytes')} bytes loaded, file has {self.data_bytes}")
        if rep.get("tensors") != self.n_tensors:
            problems.append(f"{rep.get('tensors')} tensors loaded, file has {self.n_tensors}")
        want = "cpu" if self.a.dry_run else self.a.device
        if want.startswith("cuda") and ":" not in want:
            want += ":0"
        if rep.get("tensor_devices") != [want]:
            problems.append(f"tensors on {rep.get('tensor_devices')}, not on {want}")
        run["checksum_ok"] = rep.get("checksum") == self.ref_checksum
        if problems:
            run["error"] = "wrong data: " + "; ".join(problems)
            return
        run["ok"] = True

    def run_ferry(self, method, run, timeout):
        a = self.a
        cmd = [a.ferry, "load", "--device", a.ferry_device or a.device, "--path", FERRY_PATHS[method], "--json"]
        if a.ferry_verify:
            cmd.append("--verify")
        cmd.append(a.file)
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
        files = j.get("files") if isinstance(j.get("files"), list) else []
        files = [f for f in files if isinstance(f, dict)]
        try:
            secs = [float(f["seconds"]) for f in files if f.get("seconds") is not None]
            nbytes = [int(f["bytes"]) for f in files if f.get("bytes") is not None]
        except (TypeError, ValueError) as e:
            run["error"] = f"bad 'files' entries in ferry output: {e}"
            return
        if not secs and isinstance(j.get("seconds"), (int, float)):
            secs = [float(j["seconds"])]
        if not nbytes and isinstance(j.get("bytes"), (int, float)):
            nbytes = [int(j["bytes"])]
        if not secs or not nbytes:
            run["error"] = "ferry output has no files[].seconds / files[].bytes"
            return
        run["seconds"] = sum(secs)
        run["bytes"] = sum(nbytes)
        run["gbps"] = run["bytes"] / run["seconds"] / GB if run["seconds"] > 0 else None
        rep_gbps = [f.get("gbps") for f in files if f.get("gbps") is not None]
        if rep_gbps:
            run["reported_gbps"] = rep_gbps[0] if len(rep_gbps) == 1 else rep_gbps
        run["path_used"] = sorted({str(f.get("path_used")) for f in files if f.get("path_used") is not None})
        whys = [f.get("why") for f in files if f.get("why")]
        if whys:
            run["path_why"] = whys[0] if len(whys) == 1 else whys
        if isinstance(j.get("peak_rss_bytes"), (int, float)):
            run["peak_rss_bytes"] = int(j["peak_rss_bytes"])
        if run["bytes"] != self.data_bytes:
            run["error"] = f"ferry reports {run['bytes']} bytes, the file has {self.data_bytes} bytes of tensors"
            return
        run["ok"] = True

    def describe(self, r):
        if r["status"] == "skipped":
            return r.get("error", "skipped")
        cached = r.get("cached_fraction_before")
        cs = f"cached {cached:.0%} before" if cached is not None else "cache unknown"
        if not r["ok"]:
            wall = f" after {r['wall_seconds']:.1f} s" if r.get("wall_seconds") else ""
            return f"ERROR{wall}: {r.get('error')} ({cs})"
        s = (f"{r['gbps']:.2f} GB/s ({r['seconds']:.2f} s load, {r['wall_seconds']:.1f} s process, "
             f"peak RSS {(r.get('peak_rss_bytes') or 0) / GIB:.2f} GiB, {cs}")
        if r.get("path_used"):
            s += f", path {'/'.join(r['path_used'])}"
        if r.get("warnings"):
            s += "; " + "; ".join(r["warnings"])
        return s + ")"

    def run_all(self):
        caches = ["cold", "hot"] if self.a.caches == "both" else [self.a.caches]
        total = self.a.rounds * len(self.methods) * len(caches)
        i = 0
        for rnd in range(1, self.a.rounds + 1):
            for m in self.methods:
                for c in caches:
                    i += 1
                    r = self.run_one(m, c, rnd)
                    self.log(f"[{i}/{total}] round {rnd} {m} {c}: {self.describe(r)}")
                    self.save()

    # -- report
    def summary(self):
        out = {}
        for m in getattr(self, "methods", []):
            rs = [r for r in self.runs if r["method"] == m]
            s = {"runs": len(rs), "ok": sum(r["ok"] for r in rs),
                 "skipped": sum(r["status"] == "skipped" for r in rs)}
            for c in ("cold", "hot"):
                ok = [r for r in rs if r["ok"] and r["cache"] == c and r.get("gbps")]
                if ok:
                    g = [r["gbps"] for r in ok]
                    s[c] = {"n": len(ok), "best_gbps": max(g), "median_gbps": statistics.median(g),
                            "median_seconds": statistics.median(r["seconds"] for r in ok),
                            "median_wall_seconds": statistics.median(r["wall_seconds"] for r in ok)}
            rss = [r["peak_rss_bytes"] for r in rs if r["ok"] and r.get("peak_rss_bytes")]
            s["peak_rss_max_bytes"] = max(rss) if rss else None
            paths = sorted({p for r in rs for p in r.get("path_used") or []})
            if paths:
                s["path_used"] = paths
            errs = []
            for r in rs:
                if r["status"] == "error" and r.get("error") and r["error"] not in errs:
                    errs.append(r["error"])
            s["errors"] = errs[:3]
            out[m] = s
        base = out.get("st_cuda", {})
        for m, s in out.items():
            for c in ("cold", "hot"):
                if c in s and c in base and base[c]["median_gbps"]:
                    s[c]["x_st_cuda_median"] = s[c]["median_gbps"] / base[c]["median_gbps"]
        return out

    def table(self):
        summ = self.summary()
        lines = ["| method | cold GB/s best / median | hot GB/s best / median | "
                 "× st_cuda (cold / hot median) | hot process wall s (median) | peak RSS (max) | ok runs | notes |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]

        def cell(s, c):
            return f"{s[c]['best_gbps']:.2f} / {s[c]['median_gbps']:.2f}" if c in s else "—"

        def ratio(s, c):
            return f"{s[c]['x_st_cuda_median']:.2f}" if c in s and "x_st_cuda_median" in s[c] else "—"

        for m, s in summ.items():
            notes = []
            if s.get("path_used"):
                notes.append("path " + "/".join(s["path_used"]))
            if s["skipped"]:
                notes.append(f"{s['skipped']} skipped")
            if s["errors"]:
                notes.append("error: " + s["errors"][0][:160].replace("|", "\\|"))
            rss = f"{s['peak_rss_max_bytes'] / GIB:.2f} GiB" if s.get("peak_rss_max_bytes") else "—"
            wall = f"{s['hot']['median_wall_seconds']:.2f}" if "hot" in s else "—"
            lines.append(f"| {m} | {cell(s, 'cold')} | {cell(s, 'hot')} | {ratio(s, 'cold')} / {ratio(s, 'hot')} "
                         f"| {wall} | {rss} | {s['ok']}/{s['runs']} | {'; '.join(notes)} |")
        return "\n".join(lines)

    def report(self):
        self.out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()
        f = self.out["meta"].get("file", {})
        print(flush=True)
        print(f"## GPU load: {f.get('path')} ({(f.get('bytes') or 0) / GB:.2f} GB, {f.get('tensors')} tensors), "
              f"{self.a.rounds} round(s), {self.elapsed():.0f} s{' (DRY RUN: CPU, not a measurement)' if self.a.dry_run else ''}",
              flush=True)
        print(f"GPU: {self.out['meta'].get('nvidia_smi')}", flush=True)
        print(flush=True)
        print(self.table(), flush=True)
        fb = self.out.get("ferry_bench")
        if fb and fb.get("ok"):
            print("\n### ferry bench --json (limits)\n", flush=True)
            print("```json\n" + json.dumps(fb["json"], indent=1)[:6000] + "\n```", flush=True)
        elif fb:
            print(f"\nferry bench: skipped ({fb.get('error')})", flush=True)
        if self.a.out:
            try:
                with open(os.path.splitext(self.a.out)[0] + ".md", "w") as fh:
                    fh.write(self.table() + "\n")
            except OSError:
                pass
            print(f"\nJSON: {self.a.out}", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--make-pt":
        make_pt_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default="build/ferry", help="the ferry CLI (default build/ferry)")
    ap.add_argument("--file", required=True, help="the .safetensors checkpoint (torch_mmap also uses FILE.pt)")
    ap.add_argument("--make", action="store_true",
                    help="create FILE (scripts/make_sample.py --bf16-only) if missing, and FILE.pt if torch_mmap runs")
    ap.add_argument("--blocks", type=int, default=44, help="--make: transformer blocks (default 44)")
    ap.add_argument("--hidden", type=int, default=2560,
                    help="--make: hidden size (default 2560: 44 x 2560 gives 10.4 GB, 540 tensors)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default=",".join(ALL_METHODS), help="comma-separated; default: all")
    ap.add_argument("--caches", choices=["both", "cold", "hot"], default="both")
    ap.add_argument("--out", default="compare_load.json", help="JSON output (a .md table is written beside it)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ferry-device", help="--device for ferry load/bench (default: --device; sim:SIZE to test)")
    ap.add_argument("--ferry-verify", action="store_true",
                    help="pass --verify to ferry load (copies back and hashes: slower process)")
    ap.add_argument("--budget-seconds", type=float, default=480,
                    help="after this many seconds from the start (including --make) no run is started (default 480)")
    ap.add_argument("--run-timeout", type=float, default=120, help="seconds one run may take (default 120)")
    ap.add_argument("--bench-timeout", type=float, default=60,
                    help="seconds 'ferry bench --json' may take; 0 skips it (default 60)")
    ap.add_argument("--warm-threads", type=int, default=1,
                    help="threads that fill the cache before a hot run (default 1; see above)")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                    help="cold runs: posix_fadvise only, leave /proc/sys/vm/drop_caches alone")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the torch children")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: torch methods on the CPU (if torch is installed), ferry methods as they come")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    b = Bench(a)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    b.log(f"compare_load: methods {a.methods}, {a.rounds} round(s), budget {a.budget_seconds:.0f} s"
          + (", DRY RUN" if a.dry_run else ""))
    try:
        b.setup()
        b.ferry_bench()
        b.run_all()
    except KeyboardInterrupt:
        b.out["interrupted"] = True
        b.log("interrupted: writing what was measured")
    except SystemExit as e:  # a fatal setup error: still leave the JSON behind
        b.out["fatal"] = str(e.code)
        b.save()
        raise
    b.report()


if __name__ == "__main__":
    main()
