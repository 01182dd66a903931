# SPDX-License-Identifier: Apache-2.0
"""python -m ferry.plot SIMULATE.json -o timeline.png: a picture of a
`ferry simulate --json` run, one column per job: the bytes in each tier at
its end (stacked), the process's RSS (start, end, peak), the bytes moved and
the tensors evicted. matplotlib is needed for the picture only
(`pip install ferry[plot]`); reading the report (`read_report`, `series`)
needs nothing.
"""
import argparse
import json
import sys

TIERS = ("device", "pinned", "host", "spill")
MOVED = ("bytes_htod", "bytes_dtoh", "bytes_read", "bytes_written")


def read_report(lines, where="input"):
    """(jobs, summary) from `ferry simulate --json` output (one JSON object a
    line; the last one {"summary": ...}). ValueError naming the line otherwise."""
    jobs, summary = [], None
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            o = json.loads(line)
        except ValueError:
            raise ValueError(f"{where}:{n}: not JSON: is it `ferry simulate --json` output?") from None
        if isinstance(o, dict) and "summary" in o:
            summary = o["summary"]
        elif isinstance(o, dict) and "job" in o:
            jobs.append(o)
        else:
            raise ValueError(f"{where}:{n}: neither a job nor the summary of `ferry simulate --json`")
    if not jobs:
        raise ValueError(f"{where}: no jobs")
    return jobs, summary


def series(jobs):
    """The plotted numbers, per job in order: names, tiers {tier: [bytes]},
    rss {start, end, peak: [bytes]}, moved {key: [bytes]}, evicted, dropped, errors."""
    return {
        "names": [j.get("job", f"job {i}") for i, j in enumerate(jobs)],
        "seconds": [j.get("seconds") or 0.0 for j in jobs],
        "tiers": {t: [j.get(f"{t}_bytes") or 0 for j in jobs] for t in TIERS},
        "rss": {k: [(j.get("rss") or {}).get(k, 0) for j in jobs] for k in ("start", "end", "peak")},
        "moved": {k: [j.get(k) or 0 for j in jobs] for k in MOVED},
        "evicted": [j.get("evicted") or 0 for j in jobs],
        "dropped": [j.get("dropped") or 0 for j in jobs],
        "errors": [j.get("error") for j in jobs],
    }


def draw(s, out, title=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("ferry.plot: needs matplotlib (pip install 'ferry[plot]' or matplotlib)")
    mib = 1 << 20
    x = list(range(len(s["names"])))
    labels = [f"{n}\n{t:.2f} s" + ("\nFAILED" if e else "") for n, t, e in zip(s["names"], s["seconds"], s["errors"])]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    bottom = [0] * len(x)
    for t in TIERS:
        v = [b / mib for b in s["tiers"][t]]
        ax[0].bar(x, v, bottom=bottom, label=t)
        bottom = [a + b for a, b in zip(bottom, v)]
    ax[0].set_ylabel("MiB at job end")
    ax[0].legend(loc="upper left", fontsize=8)
    for k, style in (("start", ":"), ("end", "-"), ("peak", "--")):
        ax[1].plot(x, [b / mib for b in s["rss"][k]], style, marker="o", label=f"RSS {k}")
    ax[1].set_ylabel("RSS MiB")
    ax[1].legend(loc="upper left", fontsize=8)
    w = 0.8 / len(MOVED)
    for i, k in enumerate(MOVED):
        ax[2].bar([a - 0.4 + w * (i + 0.5) for a in x], [b / mib for b in s["moved"][k]], w, label=k)
    ax[2].set_ylabel("MiB moved")
    ax[2].legend(loc="upper left", fontsize=8)
    ev = ax[2].twinx()
    ev.plot(x, s["evicted"], "kx-", label="evicted")
    ev.plot(x, s["dropped"], "k+:", label="dropped (clean)")
    ev.set_ylabel("tensors")
    ev.legend(loc="upper right", fontsize=8)
    ax[2].set_xticks(x)
    ax[2].set_xticklabels(labels, fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ferry.plot", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="`ferry simulate --json` output (- for stdin)")
    ap.add_argument("-o", "--output", default="timeline.png")
    ap.add_argument("--title")
    a = ap.parse_args(argv)
    try:
        if a.report == "-":
            jobs, summary = read_report(sys.stdin, "stdin")
        else:
            with open(a.report, encoding="utf-8") as f:
                jobs, summary = read_report(f, a.report)
    except (OSError, ValueError) as e:
        print(f"ferry.plot: {e}", file=sys.stderr)
        return 2
    draw(series(jobs), a.output, a.title or (summary or {}).get("device"))
    print(f"ferry.plot: {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
