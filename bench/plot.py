#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draw a bench/compare_load.py result.

The current JSON (format 2: workloads x caches x methods): one panel per
workload, bars of median GB/s per method grouped by cache state (cold, hot,
tmpfs), the run's own limits (pinned copy, O_DIRECT read, page-cache read) as
lines, each method's peak RSS written under its bars; a run that failed or was
not verified is marked on its bar, a method that does not apply is named "n/a".
The older JSON (one file, methods x cold/hot) is drawn as before.

    python3 bench/plot.py RESULT.json [MORE.json ...] docs/compare.png

Several results of format 2 (say, one per command on a machine whose commands
are limited in time) are drawn together, a workload from a later file replacing
the same workload from an earlier one.

Needs matplotlib (not a dependency of ferry: `pip install matplotlib` in a venv).
"""
import argparse
import json
import math
import sys

LABELS = {
    "st_cuda": "safetensors\n(device=cuda)",
    "st_cpu_to": "safetensors CPU\n.to(cuda)",
    "st_pin": "safetensors CPU\npinned .to(cuda)",
    "torch_mmap": "torch.load(mmap)\n.to(cuda)",
    "ferry_auto": "ferry load\n(auto)",
    "ferry_ring": "ferry load\n--route ring",
    "ferry_direct": "ferry load\n--route direct",
    "ferry_register": "ferry load\n--route register",
    "ferry_py": "ferry.torch\nload_file",
    "st09": "safetensors 0.9\nprefetch",
    "it": "InstantTensor",
    "it_buffered": "InstantTensor\nbuffered",
    "it_mmap": "InstantTensor\nmmap",
    "fsafe": "fastsafetensors\nnogds",
    "fsafe_gds": "fastsafetensors\nGDS",
    "runai": "Run:ai\nstreamer",
    "gguf_py": "gguf reader\n.to(cuda)",
}
CACHE_COLORS = {"cold": "#8fa8c8", "hot": "#1f4e8c", "tmpfs": "#e08a3c"}
LIMITS = [("copy_gbps", "pinned copy", "#c0392b", "--"), ("direct_gbps", "O_DIRECT read", "#7f8c8d", ":"),
          ("page_cache_gbps", "page-cache read", "#27ae60", "-.")]


def best_limit(limits, key):
    vals = [v.get(key) for v in (limits or {}).values() if isinstance(v, dict) and v.get(key)]
    return max(vals) if vals else None


def draw_panel(ax, w, sw, info, limits, only):
    caches = list(sw)
    methods = []
    for c in caches:
        for m in sw[c]:
            if m not in methods and (not only or m in only):
                methods.append(m)
    na = [m for m in methods if all("n/a" in sw[c].get(m, {"n/a": 1}) for c in caches)]
    methods = [m for m in methods if m not in na]
    width = 0.8 / max(1, len(caches))
    top = 0.0
    for k, c in enumerate(caches):
        for i, m in enumerate(methods):
            s = sw[c].get(m) or {}
            g = s.get("median_gbps") or 0
            x = i - 0.4 + width * (k + 0.5)
            ax.bar(x, g, width, color=CACHE_COLORS.get(c, "#999999"), label=c if i == 0 else None)
            top = max(top, g)
            if "n/a" in s:
                mark = "n/a"
            elif s.get("verified") is False:
                mark = "WRONG DATA"
            elif not g:
                mark = "failed" if s.get("runs") else ""
            else:
                mark = "%.1f" % g if g >= 1 else "%.2f" % g
            ax.text(x, g, mark, ha="center", va="bottom", fontsize=6, rotation=90 if len(caches) > 2 else 0)
    for key, label, color, ls in LIMITS:
        v = best_limit(limits, key)
        if v:
            ax.axhline(v, color=color, ls=ls, lw=1, label="%s %.1f GB/s" % (label, v))
            top = max(top, v)
    for i, m in enumerate(methods):
        rss = [sw[c].get(m, {}).get("peak_rss_max_bytes") or 0 for c in caches]
        if max(rss):
            ax.text(i, -0.04, "RSS %.2f GiB" % (max(rss) / 2**30), ha="center", va="top", fontsize=6,
                    color="#555555", transform=ax.get_xaxis_transform())
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels([LABELS.get(m, m) for m in methods], fontsize=7)
    ax.tick_params(axis="x", pad=14)
    ax.set_ylim(0, (top or 1) * 1.18)
    ax.set_ylabel("GB/s (median)")
    size = (info.get("data_bytes") or 0) / 1e9
    title = "%s: %.2f GB, %s tensors, %s file(s)" % (w, size, info.get("tensors"), len(info.get("files") or []))
    if na:
        title += "\nn/a: " + ", ".join(na)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")


def plot_v2(d, a, plt):
    summary = d.get("summary") or {}
    only = [m for m in a.methods.split(",") if m] if a.methods else None
    ws = [w for w in summary if summary[w]]
    if not ws:
        sys.exit("plot.py: no workload with results in %s" % a.result)
    cols = min(2, len(ws))
    rows = math.ceil(len(ws) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(9 * cols, 4.6 * rows), dpi=110, squeeze=False)
    for ax, w in zip([x for r in axes for x in r], ws):
        draw_panel(ax, w, summary[w], (d.get("workloads") or {}).get(w, {}), (d.get("limits") or {}).get(w), only)
    for ax in [x for r in axes for x in r][len(ws):]:
        ax.axis("off")
    dry = " (DRY RUN on CPU: not a measurement)" if (d.get("args") or {}).get("dry_run") else ""
    fig.suptitle(a.title or ("Loading checkpoints to the GPU: fresh processes, alternated, every tensor "
                             "verified" + dry), fontsize=11)
    fig.tight_layout()
    fig.savefig(a.out)
    print("plot.py: wrote %s (%s)" % (a.out, ", ".join(ws)))


def plot_v1(d, a, plt):
    summary = d.get("summary") or {}
    want = a.methods or "st_cuda,st_cpu_to,st_pin,torch_mmap,ferry_auto"
    methods = [m for m in want.split(",") if m in summary]
    if not methods:
        sys.exit("plot.py: none of %s is in %s" % (want, a.result))
    limits = ((d.get("ferry_bench") or {}).get("json") or {}).get("limits") or {}
    cold = [summary[m]["cold"]["median_gbps"] if summary[m].get("cold") else 0 for m in methods]
    hot = [summary[m]["hot"]["median_gbps"] if summary[m].get("hot") else 0 for m in methods]
    rss = [(summary[m].get("peak_rss_max_bytes") or 0) / 2**30 for m in methods]

    fig, ax = plt.subplots(figsize=(1.6 * len(methods) + 2, 4.2), dpi=110)
    x = range(len(methods))
    w = 0.38
    ax.bar([i - w / 2 for i in x], cold, w, label="cold (page cache dropped)", color="#8fa8c8")
    ax.bar([i + w / 2 for i in x], hot, w, label="hot (in the page cache)", color="#1f4e8c")
    for i in x:
        ax.text(i + w / 2, hot[i] + 0.6, "%.1f" % hot[i], ha="center", va="bottom", fontsize=8)
        ax.text(i - w / 2, cold[i] + 0.6, "%.2f" % cold[i], ha="center", va="bottom", fontsize=7)
        ax.text(i, -0.085 * max(hot), "peak RSS %.2f GiB" % rss[i], ha="center", va="top", fontsize=7,
                transform=ax.transData, color="#555555")
    if limits.get("pinned_htod_gbps"):
        ax.axhline(limits["pinned_htod_gbps"], color="#c0392b", ls="--", lw=1)
        ax.text(len(methods) - 0.5, limits["pinned_htod_gbps"], "pinned copy limit %.1f GB/s" % limits["pinned_htod_gbps"],
                ha="right", va="bottom", fontsize=8, color="#c0392b")
    if limits.get("direct_read_gbps"):
        ax.axhline(limits["direct_read_gbps"], color="#7f8c8d", ls=":", lw=1,
                   label="the disk's O_DIRECT read, %.2f GB/s" % limits["direct_read_gbps"])
    ax.set_xticks(list(x))
    ax.set_xticklabels([LABELS.get(m, m) for m in methods], fontsize=8)
    ax.tick_params(axis="x", pad=18)
    ax.set_ylabel("GB/s (median of fresh processes)")
    ax.set_title(a.title or "Loading a 10.4 GB BF16 checkpoint to an H200 (same run, alternated)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.9))
    ax.set_ylim(0, max(max(hot), limits.get("pinned_htod_gbps", 0)) * 1.15 or 1)
    fig.tight_layout()
    fig.savefig(a.out)
    print("plot.py: wrote %s (%s)" % (a.out, ", ".join(methods)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="RESULT.json ... OUT.png",
                    help="the JSON(s) that compare_load.py --out wrote, then the picture to write (.png or .svg)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods, in the order to draw (default: all in the result; "
                         "the old format: the peers and ferry auto)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: needs matplotlib (pip install matplotlib)")
    if len(a.paths) < 2:
        ap.error("give at least one RESULT.json and the OUT picture")
    a.out, results = a.paths[-1], a.paths[:-1]
    a.result = ", ".join(results)
    docs = []
    for path in results:
        with open(path) as fh:
            docs.append(json.load(fh))
    if all(d.get("format") == 2 for d in docs):
        plot_v2(merge(docs), a, plt)
    elif len(docs) == 1:
        plot_v1(docs[0], a, plt)
    else:
        sys.exit("plot.py: only results of format 2 (compare_load.py with workloads) can be drawn together")


def merge(docs):
    """One format-2 result from several: per workload, the last file that has it."""
    out = {"format": 2, "summary": {}, "workloads": {}, "limits": {}, "args": docs[-1].get("args") or {}}
    for d in docs:
        for w, sw in (d.get("summary") or {}).items():
            if sw:
                out["summary"][w] = sw
                out["workloads"][w] = (d.get("workloads") or {}).get(w, {})
                out["limits"][w] = (d.get("limits") or {}).get(w, {})
    return out


if __name__ == "__main__":
    main()
