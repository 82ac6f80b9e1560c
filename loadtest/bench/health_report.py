#!/usr/bin/env python3
"""Report of one run of loadtest/bench/health.sh: per gateway, what the
streams got and what slogate thought of the replica. Writes DIR/report.md
and DIR/measured.json (judged by loadtest/run).

    health_report.py DIR
"""
import collections
import json
import os
import sys

from report_common import write_measured  # beside this script

work = sys.argv[1]
rows, measured, all_ok, kept = [], {}, [], []
for name, label in [("defaults", "defaults (panic_threshold 0.5)"), ("panic_off", "`panic_threshold: 0`")]:
    recs = json.load(open(f"{work}/{name}.json"))["records"]
    out = collections.Counter(r["outcome"] for r in recs)
    s503 = sum(1 for r in recs if r["status"] == 503)
    ok = out.get("ok", 0) + out.get("length", 0)
    other = ", ".join(f"{k} {v}" for k, v in sorted(out.items()) if k not in ("ok", "length")) or "none"
    p = json.load(open(f"{work}/{name}.slo.json"))["pools"][0]
    r = p["replicas"][0]
    verdict = ("passing" if r["healthy"] else "failing") + (f": {r['reason']}" if r.get("reason") else "")
    takeouts = open(f"{work}/{name}.takeouts").read().strip() or "0"
    rows.append(f"| {label} | {len(recs)} | {ok} | **{s503}** | {other} | {verdict} | {'yes' if p.get('panic') else 'no'} | {takeouts} |")
    measured[f"{name}_503"] = s503
    all_ok.append((len(recs) > 0 and ok == len(recs), f"{name} {ok} of {len(recs)}"))
    kept.append((bool(r["healthy"]) and takeouts == "0", f"{name}: {verdict}, {takeouts} take-outs"))
measured["all_ok"] = (all(a for a, _ in all_ok), ", ".join(t for _, t in all_ok))
measured["kept_in"] = (all(a for a, _ in kept), "; ".join(t for _, t in kept))
write_measured(work, measured)
with open(os.path.join(work, "report.md"), "w") as f:
    f.write("| gateway | requests | ok | 503 | other outcomes | replica's verdict 10 s after `/health` turned slow | pool in panic | take-outs logged |\n")
    f.write("|---|---:|---:|---:|---|---|---|---:|\n")
    f.write("\n".join(rows) + "\n")
