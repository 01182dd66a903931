# SPDX-License-Identifier: Apache-2.0
"""python -m ferry.plot: the report is read without matplotlib; the picture
is drawn only where matplotlib is installed."""
import json

import pytest

from ferry import plot

JOB = {"job": "encode", "index": 0, "seconds": 0.5, "rss": {"start": 1, "end": 3 << 20, "peak": 4 << 20},
       "device_bytes": 5 << 20, "pinned_bytes": 1, "host_bytes": 2, "spill_bytes": 0, "bytes_htod": 7,
       "bytes_dtoh": 0, "bytes_read": 7, "bytes_written": 0, "evicted": 3, "dropped": 2, "error": None}


def report(tmp_path):
    p = tmp_path / "sim.json"
    p.write_text(json.dumps(JOB) + "\n" + json.dumps(dict(JOB, job="again", error="boom")) + "\n" +
                 json.dumps({"summary": {"device": "sim (1.00 GiB)"}}) + "\n")
    return p


def test_read_and_series(tmp_path):
    with open(report(tmp_path)) as f:
        jobs, summary = plot.read_report(f)
    s = plot.series(jobs)
    assert s["names"] == ["encode", "again"] and summary["device"] == "sim (1.00 GiB)"
    assert s["tiers"]["device"] == [5 << 20] * 2 and s["tiers"]["host"] == [2, 2]
    assert s["rss"]["peak"] == [4 << 20] * 2 and s["evicted"] == [3, 3] and s["dropped"] == [2, 2]
    assert s["moved"]["bytes_htod"] == [7, 7] and s["errors"] == [None, "boom"]


def test_not_a_report(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text("encode: 1.2 s\n")
    assert plot.main([str(p), "-o", str(tmp_path / "o.png")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_draw(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    assert plot.main([str(report(tmp_path)), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
