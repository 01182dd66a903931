# SPDX-License-Identifier: MIT
"""memstats - one memory line per prompt in ComfyUI's log, and the same as one
JSON line in $FERRY_COMFYUI_STATS.

Hooked through ComfyUI's cache-provider API (comfy_execution.cache_provider,
the implementation of comfy_api.latest's Caching.register_provider): a
provider's on_prompt_start / on_prompt_end run on the prompt worker's thread
at the start of PromptExecutor.execute and in its finally block, so failed and
interrupted prompts are reported too. The provider caches nothing
(should_cache is False).

Cheap by design: RSS and its anonymous part come from /proc/self/statm (a few
counters), sampled every 10 ms by a thread for the peak; the peak is exact
where the prompt raised the process's high-water mark (VmHWM). USS needs
/proc/self/smaps_rollup, whose read walks the page tables (10-30 ms per
resident GiB), so it is read at the start and the end only, and not at all
with FERRY_COMFYUI_USS=0."""
import json
import logging
import os
import threading
import time

from . import settings

_PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_SECONDS = 0.010


def _statm():
    """(rss, anon) bytes: resident, and resident less file-backed and shmem."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    rss, shared = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
    return rss, rss - shared


def _hwm():
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _uss():
    if not settings.read_uss:
        return None
    try:
        total = 0
        with open("/proc/self/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
        return total
    except OSError:
        return None


def _mapped(paths):
    """Bytes of this process's mappings of the given files (ferry's views of
    the checkpoints the pack loaded): from /proc/self/maps, no page walk."""
    if not paths:
        return 0
    total = 0
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].rstrip(b"\n").decode("utf-8", "surrogateescape") in paths:
                lo, hi = parts[0].split(b"-")
                total += int(hi, 16) - int(lo, 16)
    return total


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


class _Sampler(threading.Thread):
    def __init__(self):
        super().__init__(name="ferry-memstats", daemon=True)
        self.stop = threading.Event()
        self.rss_peak = 0
        self.anon_peak = 0

    def run(self):
        while True:
            try:
                rss, anon = _statm()
            except OSError:
                return
            self.rss_peak = max(self.rss_peak, rss)
            self.anon_peak = max(self.anon_peak, anon)
            if self.stop.wait(SAMPLE_SECONDS):
                return


class Tracker:
    """The current prompt's figures, and what the pack's loaders did in it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loads = []
        self._residency = []
        self._files = set()   # every checkpoint file ferry mapped in this process
        self._start = None
        self._sampler = None
        self.stores = None    # () -> {device: ferry.torch.Store.stats()} of the pack's stores
        self.models = None    # () -> {model: its residency figures}

    def note_residency(self, event):
        """A model ferry's store gave back to ComfyUI: {"model", "reason"}."""
        with self._lock:
            self._residency.append(event)

    def note_load(self, event):
        """A loader's record: {"node", "files", "via": "ferry"|"comfyui", ...}."""
        with self._lock:
            self._loads.append(event)
            if event.get("via") == "ferry":
                self._files.update(event.get("files", ()))

    def start(self, prompt_id):
        rss, anon = _statm()
        self._start = {"prompt_id": prompt_id, "t": time.perf_counter(), "rss": rss, "anon": anon,
                       "uss": _uss(), "hwm": _hwm(), "store": self._store_stats()}
        with self._lock:
            self._loads = []
            self._residency = []
        s = _Sampler()
        s.rss_peak, s.anon_peak = rss, anon
        s.start()
        self._sampler = s

    def end(self, prompt_id):
        st, s = self._start, self._sampler
        self._start = self._sampler = None
        if st is None:
            return None
        s.stop.set()
        s.join()
        seconds = time.perf_counter() - st["t"]
        rss, anon = _statm()
        hwm = _hwm()
        rss_peak = max(s.rss_peak, rss)
        if hwm > st["hwm"]:  # the prompt set the process's high-water mark: exact
            rss_peak = max(rss_peak, hwm)
        store = self._store_stats()
        with self._lock:
            loads, files = list(self._loads), set(self._files)
            given_back = list(self._residency)
        moved = read = kept = 0
        if store:
            was = st["store"] or {}  # (a store made during the prompt started from nothing)
            moved = sum(store.get(k, 0) - was.get(k, 0)
                        for k in ("bytes_htod", "bytes_dtoh", "bytes_read", "bytes_written"))
            read = store.get("bytes_read", 0) - was.get("bytes_read", 0)
            kept = store.get("bytes_from_keeper", 0) - was.get("bytes_from_keeper", 0)
        tiers = (store or {}).get("tier_bytes", {})
        rec = {
            "prompt_id": prompt_id,
            "seconds": round(seconds, 4),
            "rss": {"start": st["rss"], "end": rss, "peak": rss_peak},
            "uss": {"start": st["uss"], "end": _uss()},
            "anon": {"start": st["anon"], "end": anon, "peak": max(s.anon_peak, anon)},
            "ferry": {"device": tiers.get("device", 0), "pinned": tiers.get("pinned", 0),
                      "host": tiers.get("host", 0), "moved": moved, "mapped": _mapped(files),
                      "read": read, "from_keeper": kept, "store": store is not None},
            "loads": loads,
            "residency": given_back,
        }
        if self.models is not None:
            try:
                rec["models"] = self.models()
            except Exception:
                rec["models"] = {}
        limit, _ = settings.host_budget(None)
        rec["host_limit"] = limit
        return rec

    def _store_stats(self):
        """The pack's stores' figures, summed over devices (None: no store)."""
        if self.stores is None:
            return None
        try:
            per = self.stores()
        except Exception:  # a closed store: no figures rather than a failed prompt
            return None
        if not per:
            return None
        out = {"tier_bytes": {}}
        for st in per.values():
            for k, v in st.get("tier_bytes", {}).items():
                out["tier_bytes"][k] = out["tier_bytes"].get(k, 0) + v
            for k in ("bytes_htod", "bytes_dtoh", "bytes_read", "bytes_written", "bytes_from_keeper"):
                out[k] = out.get(k, 0) + st.get(k, 0)
        return out


def line(rec):
    r, u, a, f = rec["rss"], rec["uss"], rec["anon"], rec["ferry"]
    b = fmt_bytes
    return (f"ferry: prompt {rec['prompt_id']}: {rec['seconds']:.2f} s"
            f" | RSS start/end/peak {b(r['start'])} / {b(r['end'])} / {b(r['peak'])}"
            f" | USS start/end {b(u['start'])} / {b(u['end'])}"
            f" | anon start/end/peak {b(a['start'])} / {b(a['end'])} / {b(a['peak'])}"
            f" | ferry: device/pinned/host {b(f['device'])} / {b(f['pinned'])} / {b(f['host'])},"
            f" moved {b(f['moved'])}, mapped {b(f['mapped'])}")


def report(rec):
    logging.info(line(rec))
    limit = rec.get("host_limit")
    if limit and settings.host_limit_user and rec["anon"]["peak"] > limit:
        logging.warning("ferry: prompt %s: private memory peaked at %s, over %s=%s",
                        rec["prompt_id"], fmt_bytes(rec["anon"]["peak"]), settings.HOST_LIMIT_ENV,
                        fmt_bytes(limit))
    if settings.stats_path:
        try:
            with open(settings.stats_path, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        except OSError as e:
            logging.warning("ferry: cannot append to %s=%s: %s", settings.STATS_ENV, settings.stats_path, e)


tracker = Tracker()


def install():
    """Register the prompt hook; returns a word on how (for the start-up log)."""
    try:
        from comfy_execution.cache_provider import CacheProvider, register_cache_provider
    except ImportError:
        return "no prompt hook in this ComfyUI (comfy_execution.cache_provider is missing): no per-prompt memory line"

    class FerryPromptStats(CacheProvider):
        """Caches nothing: here for the prompt start and end calls."""

        async def on_lookup(self, context):
            return None

        async def on_store(self, context, value):
            return None

        def should_cache(self, context, value=None):
            return False

        def on_prompt_start(self, prompt_id):
            tracker.start(prompt_id)

        def on_prompt_end(self, prompt_id):
            rec = tracker.end(prompt_id)
            if rec is not None:
                report(rec)

    register_cache_provider(FerryPromptStats())
    return "per-prompt memory line through ComfyUI's cache-provider prompt hooks"
