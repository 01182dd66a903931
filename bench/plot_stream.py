#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draw a bench/stream.py result: steady step time per configuration (4096
and 1024 image tokens) beside peak host RSS.

    python3 bench/plot_stream.py RESULT.json OUT.png      (needs matplotlib)
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(sys.argv[1]))["results"]
    rows = [r for r in res if r.get("ok")]
    names = [r["config"] for r in rows]
    steps = {}
    for r in rows:
        for run in r["runs"]:
            steps.setdefault(run["image_tokens"], []).append(run["steady_seconds"])
    rss = [max(r.get(k, 0) or 0 for k in ("peak_rss_bytes", "vmhwm_bytes", "rss_peak_bytes")) / 2**30 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    w = 0.38
    for k, (tok, v) in enumerate(sorted(steps.items(), reverse=True)):
        a.barh([i + (k - 0.5) * w for i in range(len(v))], v, height=w, label=f"{tok} image tokens")
    a.set_yticks(range(len(names)))
    a.set_yticklabels(names)
    a.invert_yaxis()
    a.set_xscale("log")
    a.set_xlabel("steady step time, s (log)")
    a.legend(loc="lower right")
    a.set_title("FLUX.1-sized transformer (23.8 GB) on one H200")
    b.barh(range(len(names)), rss, color="tab:gray")
    b.set_yticks(range(len(names)))
    b.set_yticklabels([])
    b.invert_yaxis()
    b.set_xlabel("peak host RSS, GiB")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
