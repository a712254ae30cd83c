#!/usr/bin/env python3
"""test_plot.py COORDINATOR - `coordinator plot` draws a metrics file with gnuplot.

The SVG's curves are read back: gnuplot draws each series as one path in its own group
(gnuplot_plot_1a: loss, 2a: val_loss, 1b: tokens/s), and its vertices must be the data
under one affine map per axis (pixel = a * value + b): the map is fitted on the first
and last vertex, and every other vertex must sit within 0.02 px of it (gnuplot prints
two decimals: 0.005 of rounding each, twice). The data curve, 5 exp(-s/12) + 0.1 sin(s),
is no affine function of the step, so a wrong column, a dropped or reordered point
moves vertices by whole pixels. Bad input: exit 2 with one line naming the file.
"""
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import fail  # noqa: E402

COORD = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="weft-plot-")
N = 40


def loss(s):
    return 5 * math.exp(-s / 12) + 0.1 * math.sin(s)


def tok(s):
    return 1000 + 300 * math.sin(s / 3)


def write_metrics(path, extra=""):
    with open(path, "w") as f:
        for s in range(1, N + 1):
            o = '{"step": %d, "loss": %r, "tokens_per_s": %r, "lr": 0.001' % (s, loss(s), tok(s))
            if s % 10 == 0:
                o += ', "val_loss": %r' % (loss(s) + 0.3)
            f.write(o + "}\n")
        f.write(extra)


def plot(src, out, rc=0):
    p = subprocess.run([COORD, "plot", src, out], capture_output=True, text=True, timeout=60)
    if p.returncode != rc:
        fail("coordinator plot %s %s: exit %d, expected %d: %s" % (src, out, p.returncode, rc,
                                                                    p.stderr))
    return p


def vertices(svg, group):
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg).getroot()
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("id") == group:
            paths = [p.get("d") for p in g.iter("{http://www.w3.org/2000/svg}path")]
            d = paths[-1]  # the key's sample first, then the data
            last = d.split("M")[-1]
            return [tuple(map(float, xy.split(","))) for xy in re.findall(r"[-\d.]+,[-\d.]+", last)]
    fail("no group %s in %s" % (group, svg))


def check_affine(pts, xs, ys, what):
    if len(pts) != len(xs):
        fail("%s: %d vertices for %d points" % (what, len(pts), len(xs)))
    for k, vals in ((0, xs), (1, ys)):
        a = (pts[-1][k] - pts[0][k]) / (vals[-1] - vals[0])
        b = pts[0][k] - a * vals[0]
        worst = max(abs(a * v + b - p[k]) for v, p in zip(vals, pts))
        if worst > 0.02:
            fail("%s: a vertex is %.3f px off the data's %s" % (what, worst, "xy"[k]))


try:
    m = os.path.join(TMP, "m.jsonl")
    write_metrics(m, '{"step": 41, "loss": 1.2')  # a running job's half-written line
    svg = os.path.join(TMP, "p.svg")
    out = plot(m, svg).stdout
    if "%d steps" % N not in out:
        fail("the summary: %r" % out)
    steps = list(range(1, N + 1))
    check_affine(vertices(svg, "gnuplot_plot_1a"), steps, [loss(s) for s in steps], "loss")
    evals = [s for s in steps if s % 10 == 0]
    check_affine(vertices(svg, "gnuplot_plot_2a"), evals, [loss(s) + 0.3 for s in evals], "val_loss")
    check_affine(vertices(svg, "gnuplot_plot_1b"), steps, [tok(s) for s in steps], "tokens/s")
    png = os.path.join(TMP, "p.png")
    plot(m, png)
    head = open(png, "rb").read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or struct.unpack(">II", head[16:24]) != (900, 700):
        fail("not a 900x700 PNG: %r" % head)
    # bad input: exit 2, one line that names the file
    bad = os.path.join(TMP, "bad.jsonl")
    write_metrics(bad)
    with open(bad, "a") as f:
        f.write("not json\n{\"step\": 99, \"loss\": 1}\n")
    cases = [(os.path.join(TMP, "missing.jsonl"), svg, "No such file"),
             (bad, svg, "bad.jsonl:%d is not a JSON object" % (N + 1)),
             (os.devnull, svg, "has no steps"),
             (m, os.path.join(TMP, "p.txt"), "name an .svg or a .png")]
    for src, dst, needle in cases:
        err = plot(src, dst, rc=2).stderr.strip()
        if needle not in err or len(err.splitlines()) != 1:
            fail("coordinator plot %s %s said %r, expected one line with %r" % (src, dst, err, needle))
    print("plot: SVG curves of %d losses, %d val_losses and %d tokens/s at the data's positions "
          "(within 0.02 px); a 900x700 PNG; 4 bad inputs refused with exit 2" % (N, len(evals), N))
finally:
    shutil.rmtree(TMP, ignore_errors=True)
