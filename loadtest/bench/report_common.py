"""What the Python reports still here share (imported from the scripts
beside it): loadgen results' measured window, a quantile, charts and
DIR/measured.json. The reports of admission, learned limits, tenants and
short requests are Rust (`bench report`, loadtest/src/bench/report/),
which reads and writes the same files the same way.
"""
import json
import math
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.join(HERE, "..", "..", "target", "release", "loadgen")


def secs(d):
    """A humantime-ish duration as loadgen serialises it ("150s", "2m 30s", ...)."""
    if isinstance(d, (int, float)):
        return float(d)
    total = 0.0
    for part in str(d).split():
        for unit, mul in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
            if part.endswith(unit) and part[: -len(unit)].replace(".", "").isdigit():
                total += float(part[: -len(unit)]) * mul
                break
    return total


def window(r):
    sc = r["scenario"]
    return secs(sc.get("warmup", 0)), secs(sc["duration"])


def measured(r):
    w, d = window(r)
    return [x for x in r["records"] if w <= x["start_s"] < d]


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def chart(csv_path, d, stem, title, ylabel, lines):
    args = [LOADGEN, "chart", csv_path, "--dir", d, "--stem", stem, "--title", title, "--y-label", ylabel]
    for l in lines:
        args += ["--line", l]
    subprocess.run(args, check=True)


def write_measured(d, values):
    """DIR/measured.json for the runner: each value a number, a yes/no, None
    (not measured), or (value, text) where the report states it in words."""
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    out = {}
    for k, v in values.items():
        out[k] = {"value": clean(v[0]), "text": v[1]} if isinstance(v, tuple) else clean(v)
    with open(os.path.join(d, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)
