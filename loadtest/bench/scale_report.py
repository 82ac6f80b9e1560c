"""Report of one run of loadtest/bench/scale.sh: one row per part, the
RSS-against-open-streams series for the charts (DIR/rss-h1.csv,
DIR/rss-h2.csv), and where an open stream's memory goes. Writes
DIR/report.md and DIR/measured.json (judged by loadtest/run).

    scale_report.py DIR CLK_TCK
"""
import csv
import json
import os
import sys

from report_common import write_measured  # beside this script

work, hz = sys.argv[1], int(sys.argv[2])
runs = list(csv.DictReader(open(f"{work}/runs.csv")))


def quantile(pairs, q):
    total = sum(c for _, c in pairs)
    if total == 0:
        return float("nan")
    seen = 0
    for v, c in sorted(pairs):
        seen += c
        if seen >= q * total:
            return v / 1000.0
    return sorted(pairs)[-1][0] / 1000.0


rows, curves = [], {"h1": [], "h2": []}
for r in runs:
    res = json.load(open(f"{work}/{r['run']}.json"))
    through = [x for x in res["records"] if x["stream"] == "through"]
    done = sum(1 for x in through if x["outcome"] in ("ok", "length"))
    itl_gw = quantile(res["itl_us"].get("chat", []), 0.99)
    itl_direct = quantile(res["itl_us"].get("direct", []), 0.99)
    # What each gap gained between the replica and the client (the simulator's
    # stamps): exact to the microsecond, where a gap of a second is read from
    # the histogram to half a millisecond.
    path_gw = quantile(res.get("itl_path_us", {}).get("chat", []), 0.99)
    path_direct = quantile(res.get("itl_path_us", {}).get("direct", []), 0.99)
    idle, peak, open_peak = int(r["idle_kb"]), int(r["peak_kb"]), max(1, int(float(r["open_peak"])))
    per_stream = (peak - idle) * 1024 / open_peak
    cpu_us = int(r["cpu_ticks"]) / hz * 1e6 / max(1, int(r["events"]))
    warm = res["scenario"].get("warmup", "0s")
    tokens_s = sum(x["tokens"] for x in through) / res["elapsed_s"]
    rows.append(dict(run=r["run"], proto=r["proto"], n=int(r["streams"]), open=open_peak, idle=idle, peak=peak,
                     per=per_stream, itl_gw=itl_gw, itl_d=itl_direct, path_gw=path_gw, path_d=path_direct, cpu=cpu_us, done=done, sent=len(through),
                     tok=tokens_s))
    for line in open(f"{work}/{r['run']}.samples"):
        parts = line.split()
        if len(parts) == 2:
            curves[r["proto"]].append((float(parts[1]), int(parts[0]) / 1024))

for proto, pts in curves.items():
    with open(f"{work}/rss-{proto}.csv", "w") as f:
        f.write("open streams,RSS MB\n")
        for x, y in sorted(pts):
            f.write(f"{x:.0f},{y:.1f}\n")

sys.stdout = open(os.path.join(work, "report.md"), "w")
print("| run | streams asked | open at peak | completed / sent | RSS idle MB | RSS peak MB | bytes per open stream | ITL p99 through / direct ms | path's share of a gap p99 through / direct ms | added ITL p99 ms | CPU per event us | tokens/s through |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['run']} | {r['n']} | {r['open']} | {r['done']} / {r['sent']} | {r['idle']/1024:.1f} | {r['peak']/1024:.1f} | "
          f"{r['per']/1024:.1f} KB | {r['itl_gw']:.1f} / {r['itl_d']:.1f} | {r['path_gw']:.3f} / {r['path_d']:.3f} | "
          f"{r['path_gw'] - r['path_d']:+.3f} | {r['cpu']:.1f} | {r['tok']:.0f} |")

measured = {}
big = max(rows, key=lambda r: (r["n"], r["proto"])) if rows else None
if big:
    where = f"at {big['n']} ({big['proto']})"
    measured["kb_per_stream_most"] = (big["per"] / 1024, f"{big['per'] / 1024:.1f} KB {where}")
    added = big["path_gw"] - big["path_d"]
    measured["added_itl_p99_ms_most"] = (added, f"{added:+.3f} ms {where}")
    measured["all_complete_most"] = (big["done"] == big["sent"], f"{big['done']} of {big['sent']} {where}")
    measured["cpu_us_per_event_most"] = (big["cpu"], f"{big['cpu']:.1f} us {where}")
h1_rows = [r for r in rows if r["proto"] == "h1"]
if h1_rows:
    b1 = max(h1_rows, key=lambda r: r["n"])
    measured["kb_per_stream_h1_most"] = (b1["per"] / 1024, f"{b1['per'] / 1024:.1f} KB at {b1['n']} (h1)")
ratios = []
for n in sorted({r["n"] for r in rows}):
    h1 = [r for r in rows if r["n"] == n and r["proto"] == "h1"]
    h2 = [r for r in rows if r["n"] == n and r["proto"] == "h2"]
    if h1 and h2:
        ratios.append((h2[0]["tok"] / max(1e-9, h1[0]["tok"]), n))
if ratios:
    worst = min(ratios)
    measured["h2_over_h1_throughput"] = (worst[0], ", ".join(f"{r:.2f}x at {n}" for r, n in ratios))
write_measured(work, measured)
print("\nCharts: `rss-h1.svg`, `rss-h2.svg` (RSS against open streams, every sample of every run).")
try:
    heap = open(f"{work}/heap.md").read()
except FileNotFoundError:
    heap = None
if heap:
    print("\n## Where an open stream's memory goes\n")
    print("The live heap of a gateway built with `--features heap-profile` (dhat records every allocation with its call "
          "stack), at its peak with the streams open, by what allocated it, divided by the open streams. Heap bytes "
          "asked for, not pages touched: RSS per stream is lower where a buffer is allocated whole and written in part.\n")
    print(heap)
