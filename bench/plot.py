#!/usr/bin/env python3
"""Draw a bench/compare_load.py result: GB/s per method, cold and hot (medians),
with each method's peak RSS written beside its bars, and the run's own limits
(the disk's O_DIRECT read, the pinned copy) as lines.

    python3 bench/plot.py bench/results/compare-session4-h200.json docs/compare.png

Needs matplotlib (not a dependency of ferry: `pip install matplotlib` in a venv).
"""
import argparse
import json
import sys

LABELS = {
    "st_cuda": "safetensors\n(device=cuda)",
    "st_cpu_to": "safetensors CPU\n.to(cuda)",
    "st_pin": "safetensors CPU\npinned .to(cuda)",
    "torch_mmap": "torch.load(mmap)\n.to(cuda)",
    "ferry_auto": "ferry load\n(auto)",
    "ferry_ring": "ferry load\n--path ring",
    "ferry_direct": "ferry load\n--path direct",
    "ferry_register": "ferry load\n--path register",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", help="the JSON that compare_load.py --out wrote")
    ap.add_argument("out", help="the picture to write (.png or .svg)")
    ap.add_argument("--methods", default="st_cuda,st_cpu_to,st_pin,torch_mmap,ferry_auto",
                    help="comma-separated methods, in the order to draw (default: the peers and ferry auto)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: needs matplotlib (pip install matplotlib)")
    with open(a.result) as fh:
        d = json.load(fh)
    summary = d.get("summary") or {}
    methods = [m for m in a.methods.split(",") if m in summary]
    if not methods:
        sys.exit("plot.py: none of %s is in %s" % (a.methods, a.result))
    limits = ((d.get("ferry_bench") or {}).get("json") or {}).get("limits") or {}
    cold = [summary[m]["cold"]["median_gbps"] if summary[m].get("cold") else 0 for m in methods]
    hot = [summary[m]["hot"]["median_gbps"] if summary[m].get("hot") else 0 for m in methods]
    rss = [summary[m].get("peak_rss_max_bytes", 0) / 2**30 for m in methods]

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
    ax.set_ylim(0, max(max(hot), limits.get("pinned_htod_gbps", 0)) * 1.15)
    fig.tight_layout()
    fig.savefig(a.out)
    print("plot.py: wrote %s (%s)" % (a.out, ", ".join(methods)))


if __name__ == "__main__":
    main()
