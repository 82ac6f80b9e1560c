#!/usr/bin/env python3
"""Report of one run of loadtest/bench/soak.sh: what slogate held before,
at its peak under the load and after it, and what the traffic met. Writes
DIR/report.md and DIR/measured.json (judged by loadtest/run).

    soak_report.py DIR
"""
import csv
import json
import os
import sys

from report_common import write_measured  # beside this script

work = sys.argv[1]
rows = list(csv.DictReader(open(f"{work}/samples.csv")))
before = [r for r in rows if r["phase"] == "before"][0]
load = [r for r in rows if r["phase"] == "load"]
last = [r for r in rows if r["phase"] == "after"][-1]
recs = json.load(open(f"{work}/soak.json"))["records"]
outcomes = {}
for r in recs:
    outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
clients = open(f"{work}/clients.txt").read().strip()
resumes, unresumed, gw_outcomes = {}, {}, {}
for line in open(f"{work}/end.metrics"):
    for name, into, key in [("slogate_stream_resumes_total{", resumes, "reason"), ("slogate_stream_unresumed_total{", unresumed, "why"),
                            ("slogate_requests_total{", gw_outcomes, "outcome")]:
        if line.startswith(name):
            label = line.split(f'{key}="', 1)[1].split('"', 1)[0]
            into[label] = into.get(label, 0) + int(float(line.rsplit(" ", 1)[1]))
early = load[: max(1, len(load) // 6)]
rss_early = max(int(r["rss_kb"]) for r in early) / 1024
measured = {}
with open(os.path.join(work, "report.md"), "w") as f:
    f.write("![what slogate holds over time](soak.svg)\n\n| | before | peak under load | after | back to its level before |\n|---|---:|---:|---:|---|\n")
    for k, name in [("inflight", "slots in flight"), ("queued", "queued requests"), ("connections", "client connections"), ("fds", "open file descriptors")]:
        ok = int(last[k]) <= int(before[k])
        measured[f"{k}_back"] = (ok, f"{before[k]} before, {max(int(r[k]) for r in load)} at the peak, {last[k]} after")
        f.write(f"| {name} | {before[k]} | {max(int(r[k]) for r in load)} | {last[k]} | {'yes' if ok else 'NO'} |\n")
    rss_b, rss_l, rss_a = int(before["rss_kb"]) / 1024, max(int(r["rss_kb"]) for r in load) / 1024, int(last["rss_kb"]) / 1024
    measured["rss_after_vs_early"] = (rss_a / rss_early, f"{rss_a:.1f} MB after, {rss_early:.1f} MB in the first sixth ({rss_a / rss_early:.2f}x)")
    f.write(f"| RSS MB | {rss_b:.1f} | {rss_l:.1f} | {rss_a:.1f} | {rss_a / rss_early:.2f}x the first sixth of the run's ({rss_early:.1f} MB) |\n")
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"
    f.write(f"\nloadgen's requests by outcome: {fmt(outcomes)}.\n")
    f.write(f"slogate's count of all requests (the misbehaving clients' too) by outcome: {fmt(gw_outcomes)}.\n")
    f.write(f"Streams continued on the other replica after they broke, by how: {fmt(resumes)}; broken and not continued, by why: {fmt(unresumed)}.\n")
    f.write(f"Misbehaving clients: {clients}.\n")
write_measured(work, measured)
