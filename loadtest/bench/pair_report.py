#!/usr/bin/env python3
"""Report of one paired run (loadtest/bench/pair.sh): one closed-loop load
takes two targets in turn, in a "test" run (A and B) and a "control" run (A
and A2); per target: the path's share of TTFT and ITL (from the simulator's
stamps) and the gateway process's CPU per request. Writes DIR/report.md and
DIR/measured.json (judged by loadtest/run): B minus A for each measure
(`*_added`), its control A2 minus A beside it.

    pair_report.py DIR HZ A B A2
"""
import json
import os
import sys

from report_common import write_measured  # beside this script
from quantiles import pct, pct_pairs  # beside this script

d, hz, a_name, b_name, a2_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]


def side(run, idx, ticks):
    done = [r for r in run["records"] if r.get("target") == idx and r["outcome"] in ("ok", "length")]
    errors = sum(1 for r in run["records"] if r.get("target") == idx and r["outcome"] not in ("ok", "length"))
    path = [r["ttft_ms"] - r["engine_ttft_ms"] for r in done if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None]
    gaps = run.get("itl_by_target", {}).get("path_us", {}).get(str(idx), [])
    n = len(done)
    return {
        "n": n,
        "errors": errors,
        "ttft50": pct(path, 0.5),
        "ttft99": pct(path, 0.99),
        "itl99": pct_pairs(gaps, 0.99) / 1000 if gaps else float("nan"),
        "cpu_us": ticks * 1e6 / hz / n if n else float("nan"),
    }


rows = {}
for kind in ("test", "control"):
    run = json.load(open(os.path.join(d, f"{kind}.json")))
    ta, tb = map(int, open(os.path.join(d, f"{kind}.cpu")).read().split())
    rows[kind] = (side(run, 0, ta), side(run, 1, tb))

names = {"test": (a_name, b_name), "control": (a_name, a2_name)}
MEASURES = [
    ("cpu_us", "cpu_added_us", "gateway CPU per request", "us", "{:+.0f}"),
    ("ttft50", "ttft50_added_ms", "path TTFT p50", "ms", "{:+.3f}"),
    ("ttft99", "ttft99_added_ms", "path TTFT p99", "ms", "{:+.3f}"),
    ("itl99", "itl99_added_ms", "path ITL p99", "ms", "{:+.3f}"),
]
measured = {}
for key, label, _, unit, fmt in MEASURES:
    t = rows["test"][1][key] - rows["test"][0][key]
    c = rows["control"][1][key] - rows["control"][0][key]
    measured[label] = (t, f"{fmt.format(t)} {unit} (control {fmt.format(c)} {unit})")
a, b = rows["test"]
pct_added = 100 * (b["cpu_us"] - a["cpu_us"]) / a["cpu_us"] if a["cpu_us"] else float("nan")
measured["cpu_added_pct"] = (pct_added, f"{pct_added:+.1f} % ({b['cpu_us']:.0f} vs {a['cpu_us']:.0f} us)")
errors = sum(s["errors"] for pair in rows.values() for s in pair)
measured["errors"] = (errors, f"{errors} of {sum(s['n'] + s['errors'] for pair in rows.values() for s in pair)}")
write_measured(d, measured)

with open(os.path.join(d, "report.md"), "w") as f:
    f.write("| run | target | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | gateway CPU us/request |\n")
    f.write("|---|---|---:|---:|---:|---:|---:|---:|\n")
    for kind, pair in rows.items():
        for name, s in zip(names[kind], pair):
            f.write(f"| {kind} | {name} | {s['n']} | {s['errors']} | {s['ttft50']:.2f} | {s['ttft99']:.2f} | {s['itl99']:.2f} | {s['cpu_us']:.0f} |\n")
    f.write(f"\n{b_name} minus {a_name} (control: {a2_name} minus {a_name}, the noise of this comparison):\n\n")
    for key, label, what, unit, fmt in MEASURES:
        f.write(f"- {what}: **{measured[label][1]}**.\n")
