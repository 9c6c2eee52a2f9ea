# SPDX-License-Identifier: MIT
"""The pictures (docs/operations.md "Pictures"): `cxlkv-bench --report-svg` (what `make
bench` writes as build/bench/report.svg) and `cxlkv-replay --sweep --plot`
write well-formed SVG (parsed by an XML parser) that librsvg renders to a
PNG with the expected colours on it; bad input is an error, never a half
file or a crash."""
import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
TOOLS = os.environ.get("CXLKV_TEST_TOOLS", os.path.join(BUILD, "tools"))
NS = "{http://www.w3.org/2000/svg}"
GREEN, RED, GREY, BLUE, ORANGE = (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28), (0x8c, 0x8c, 0x8c), (0x1f, 0x77, 0xb4), \
    (0xff, 0x7f, 0x0e)


def render(svg, tmp_path):
    """The SVG parsed as XML, and its PNG rendering by rsvg-convert (RGB)."""
    root = ET.parse(svg).getroot()
    assert root.tag == NS + "svg" and float(root.get("width")) > 100 and float(root.get("height")) > 100
    png = os.path.join(tmp_path, os.path.basename(svg) + ".png")
    r = subprocess.run(["rsvg-convert", "-o", png, svg], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    img = Image.open(png).convert("RGB")
    assert img.size == (int(float(root.get("width"))), int(float(root.get("height"))))
    return root, img


def colour_pixels(img, rgb, tol=6):
    return sum(n for n, c in img.getcolors(1 << 24) if all(abs(a - b) <= tol for a, b in zip(c, rgb)))


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(NS + "text")]


RESULTS = {
    "kv.publish_gbps": 6.4, "kv.gather_write_gbps": 7.4,                       # 0.865x, target 0.85: met
    "kv.fetch_gbps": 3.0, "kv.scatter_read_gbps": 4.8,                         # 0.625x: missed
    "kv.batch64_publish_us_per_block": 5.5, "kv.single_publish_us_per_block": 19.7,  # 3.6x; <= 1.5 us: missed
    "py.publish_gbps": 7.0, "py.kv_capi_publish_gbps_interleaved": 7.7, "py.publish_vs_kv_capi": 0.93,  # direct
    "alloc.mops": 9.1, "alloc.malloc_mops": 27.5,                              # no target
    "lock.handoff_ns_p99": 34600,                                              # no baseline: vs 50 us
    "replay.hit_vs_lru_min_4x4": 0.9998,                                       # just missed
    "ssd.uring_direct_read_gbps": None, "ssd.fio_read_gbps": 1.0,              # null: left out
    "some.unknown_metric": 1.0,
}


def test_bench_report_draws_each_metric_against_baseline_and_target(tmp_path):
    res = tmp_path / "results & <run>.json"  # the path lands in the subtitle: escaped
    res.write_text(json.dumps(RESULTS, indent=1))
    out = tmp_path / "report.svg"
    r = subprocess.run([os.path.join(TOOLS, "cxlkv-bench"), "--report-svg", str(res), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    root, img = render(str(out), str(tmp_path))
    t = texts(root)
    labels = [x for x in t if x in RESULTS]
    assert labels == ["kv.publish_gbps", "kv.fetch_gbps", "kv.batch64_publish_us_per_block", "py.publish_gbps",
                      "lock.handoff_ns_p99", "replay.hit_vs_lru_min_4x4", "alloc.mops"]
    assert any("results & <run>.json" in x and "3 of 6 targets met" in x for x in t), t
    verdict = {lab: next(x for x in t[t.index(lab):] if "\u00d7" in x) for lab in labels}
    assert verdict["kv.publish_gbps"].startswith("0.8649\u00d7") and verdict["kv.publish_gbps"].endswith("met")
    assert verdict["kv.fetch_gbps"].endswith("missed")
    assert verdict["kv.batch64_publish_us_per_block"].startswith("3.582\u00d7") and "13.1\u00d7" in \
        verdict["kv.batch64_publish_us_per_block"] and verdict["kv.batch64_publish_us_per_block"].endswith("missed")
    assert verdict["py.publish_gbps"].startswith("0.93\u00d7") and verdict["py.publish_gbps"].endswith("met")
    assert verdict["lock.handoff_ns_p99"].startswith("1.445\u00d7") and verdict["lock.handoff_ns_p99"].endswith("met")
    assert verdict["replay.hit_vs_lru_min_4x4"].startswith("0.9998\u00d7") and \
        verdict["replay.hit_vs_lru_min_4x4"].endswith("missed")
    assert "target" not in verdict["alloc.mops"]
    # Rendered: bars in the three colours, most of the picture white.
    assert colour_pixels(img, GREEN) > 500 and colour_pixels(img, RED) > 500 and colour_pixels(img, GREY) > 200
    w, h = img.size
    assert colour_pixels(img, (255, 255, 255), 0) < 0.97 * w * h


@pytest.mark.parametrize("content, why", [("", "expected '{'"), ('{"a": 1,}', "expected a metric name"),
                                         ('{"a": "x"}', "expected a number for a"), ('{"a": 1} x', "after"),
                                         ("[1, 2]", "expected '{'"), ('{"nothing.known": 1}', "none of")])
def test_bench_report_refuses_bad_results_without_writing(tmp_path, content, why):
    res = tmp_path / "results.json"
    res.write_text(content)
    out = tmp_path / "report.svg"
    r = subprocess.run([os.path.join(TOOLS, "cxlkv-bench"), "--report-svg", str(res), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and why in r.stderr, r.stderr
    assert not out.exists() and not (tmp_path / "report.svg.tmp").exists()


def test_replay_sweep_plot_draws_hit_ratio_against_capacity(tmp_path):
    out = tmp_path / "sweep.svg"
    r = subprocess.run([os.path.join(TOOLS, "cxlkv-replay"), "--requests", "30", "--sweep", "--plot", str(out),
                        "--json", "--quiet", "--no-verify", "--prefill", "1", "--decode", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    root, img = render(str(out), str(tmp_path))
    lines = root.findall(f".//{NS}polyline")
    assert len(lines) == 3  # cxlkv, LRU reference, theoretical reuse
    # One marker per sweep point and the unbounded run (at 100 %), on both measured series.
    assert len(root.findall(f".//{NS}circle")) == 2 * (len(summary["sweep"]) + 1)
    t = texts(root)
    assert f"theoretical reuse {summary['theoretical_hit_ratio']:.3f}" in t
    assert any(f"{summary['distinct_blocks']} distinct blocks" in x for x in t)
    assert "token hit ratio" in t and any("capacity" in x for x in t)
    # The plotted points are the sweep's: higher hit ratio = higher on the picture (smaller y).
    cx = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    ratios = [p["token_hit_ratio"] for p in summary["sweep"]] + [summary["token_hit_ratio"]]
    assert len(cx) == len(ratios)
    for (x1, y1), (x2, y2), r1, r2 in zip(cx, cx[1:], ratios, ratios[1:]):
        assert x2 > x1 and (y2 < y1) == (r2 > r1) or r1 == r2
    assert colour_pixels(img, BLUE) > 300 and colour_pixels(img, ORANGE) > 200 and colour_pixels(img, GREEN) > 100


def test_replay_plot_needs_sweep(tmp_path):
    r = subprocess.run([os.path.join(TOOLS, "cxlkv-replay"), "--plot", str(tmp_path / "x.svg")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--sweep" in r.stderr
    assert not (tmp_path / "x.svg").exists()
