"""The report of bench/scale.sh: one row per run, the checks, and the
RSS-against-open-streams series for the charts.

Usage: scale_report.py WORK MACHINE CLK_TCK  (Markdown on stdout; WORK/rss-h1.csv, WORK/rss-h2.csv)
"""
import csv
import json
import sys

work, machine, hz = sys.argv[1], sys.argv[2], int(sys.argv[3])
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

print("# Scale: what an open stream costs slogate\n")
print(f"Machine: {machine}. Produced by `loadtest/bench/scale.sh`.\n")
print("A fleet of simulated replicas (`REPLICAS`, each stepping once a second at its own instant, every sequence "
      "decoding: a token a second per stream, so streams stay open and idle between tokens, and tokens reach the gateway "
      "spread over the second, as from a real fleet); N chat streams through slogate (closed loop: N clients arriving "
      "over the first seconds, each starting its next stream when the last ends), and 100 more straight to the replicas "
      "in the same run (the direct path: the same engine steps). HTTP/1.1 clients hold a connection each; HTTP/2 "
      "clients multiplex every stream over one connection (the gateway allows it: `server.http2_max_streams: 16384` "
      "here; the default is 1,024). RSS sampled every 0.5 s; bytes per stream = (peak RSS - idle RSS) / peak open "
      "streams. The simulator stamps each event as it leaves the replica (`--stamp-events`), so each gap's growth on its way "
      "to the client (the path's share of ITL) is measured to the microsecond; a gap of a second read from the client's "
      "histogram alone is known to half a millisecond. Added ITL p99 = the path's share p99 through slogate minus the "
      "same for the direct streams.\n")
print("| run | streams asked | open at peak | completed / sent | RSS idle MB | RSS peak MB | bytes per open stream | ITL p99 through / direct ms | path's share of a gap p99 through / direct ms | added ITL p99 ms | CPU per event us | tokens/s through |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['run']} | {r['n']} | {r['open']} | {r['done']} / {r['sent']} | {r['idle']/1024:.1f} | {r['peak']/1024:.1f} | "
          f"{r['per']/1024:.1f} KB | {r['itl_gw']:.1f} / {r['itl_d']:.1f} | {r['path_gw']:.3f} / {r['path_d']:.3f} | "
          f"{r['path_gw'] - r['path_d']:+.3f} | {r['cpu']:.1f} | {r['tok']:.0f} |")

print("\n## Checks\n")
print("| check | result | measured |\n|---|---|---|")
big = max(rows, key=lambda r: r["n"]) if rows else None
if big:
    ok = big["per"] <= 25 * 1024
    print(f"| at most 25 KB per open stream at {big['n']} ({big['proto']}) | {'met' if ok else '**not met**'} | {big['per']/1024:.1f} KB |")
    added = big["path_gw"] - big["path_d"]
    ok = added <= 1.0
    print(f"| added ITL p99 <= 1 ms at {big['n']} | {'met' if ok else '**not met**'} | {added:+.3f} ms |")
    ok = big["done"] == big["sent"]
    print(f"| every stream completes at {big['n']} | {'met' if ok else '**not met**'} | {big['done']} of {big['sent']} |")
for n in sorted({r["n"] for r in rows}):
    h1 = [r for r in rows if r["n"] == n and r["proto"] == "h1"]
    h2 = [r for r in rows if r["n"] == n and r["proto"] == "h2"]
    if h1 and h2:
        ratio = h2[0]["tok"] / max(1e-9, h1[0]["tok"])
        print(f"| HTTP/2 throughput >= 0.9x HTTP/1.1 at {n} streams | {'met' if ratio >= 0.9 else '**not met**'} | {ratio:.2f}x |")
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
