#!/usr/bin/env python3
"""Report of one run of loadtest/bench/hol_uploads.sh: the streams' path ITL
p99 in each part, what the large bodies through the gateway add over the
same bodies sent direct, and how h2load's and loadgen's large requests fared. Writes
DIR/report.md and DIR/measured.json (judged by loadtest/run).

    hol_uploads_report.py DIR HZ JSON_RATE FORM_RATE
"""
import json
import os
import re
import sys

from report_common import write_measured  # beside this script
from quantiles import pct_pairs  # beside this script

d, hz, json_rate, form_rate = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
GOOD = ("ok", "length")
PARTS = ("quiet", "json-direct", "json-gateway", "form-direct", "form-gateway",
         "lg-json-direct", "lg-json-gateway", "lg-form-direct", "lg-form-gateway")


def h2load(part):
    """(succeeded, sent, 2xx) from h2load's summary, or loadgen's records;
    None for a part without large bodies."""
    lg = os.path.join(d, f"{part}.bulk.json")
    if os.path.exists(lg):
        recs = json.load(open(lg))["records"]
        ok = sum(1 for x in recs if 200 <= x.get("status", 0) < 300 and x["outcome"] in GOOD)
        return (ok, len(recs), ok)
    path = os.path.join(d, f"{part}.h2load")
    if not os.path.exists(path):
        return None
    text = open(path).read()
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded", text)
    s = re.search(r"status codes: (\d+) 2xx", text)
    if not m:
        return (0, 0, 0)
    return (int(m.group(4)), int(m.group(1)), int(s.group(1)) if s else 0)


def part(name):
    r = json.load(open(os.path.join(d, f"{name}.json")))
    recs = r["records"]
    path = r.get("itl_path_us", {}).get("chat", [])
    return {
        "done": sum(1 for x in recs if x["outcome"] in GOOD),
        "failed": sum(1 for x in recs if x["outcome"] not in GOOD),
        "path50": pct_pairs(path, 0.5) / 1000,
        "path99": pct_pairs(path, 0.99) / 1000,
        "client99": pct_pairs(r.get("itl_us", {}).get("chat", []), 0.99) / 1000,
        "cpu_s": int(open(os.path.join(d, f"{name}.cpu")).read()) / hz,
        "bulk": h2load(name),
    }


p = {k: part(k) for k in PARTS}
json_added = p["json-gateway"]["path99"] - p["json-direct"]["path99"]
form_added = p["form-gateway"]["path99"] - p["form-direct"]["path99"]
lg_json_added = p["lg-json-gateway"]["path99"] - p["lg-json-direct"]["path99"]
lg_form_added = p["lg-form-gateway"]["path99"] - p["lg-form-direct"]["path99"]
failed = sum(x["failed"] for x in p.values())
bulk_bad = sum(b[1] - b[2] for b in (x["bulk"] for x in p.values()) if b)
write_measured(d, {
    "json_added_ms": (json_added, f"{json_added:+.3f} ms ({p['json-gateway']['path99']:.3f} vs {p['json-direct']['path99']:.3f})"),
    "form_added_ms": (form_added, f"{form_added:+.3f} ms ({p['form-gateway']['path99']:.3f} vs {p['form-direct']['path99']:.3f})"),
    "lg_json_added_ms": (lg_json_added, f"{lg_json_added:+.3f} ms ({p['lg-json-gateway']['path99']:.3f} vs {p['lg-json-direct']['path99']:.3f})"),
    "lg_form_added_ms": (lg_form_added, f"{lg_form_added:+.3f} ms ({p['lg-form-gateway']['path99']:.3f} vs {p['lg-form-direct']['path99']:.3f})"),
    "all_answered": (failed == 0 and bulk_bad == 0, f"{failed} streams failed, {bulk_bad} large requests not answered 2xx"),
})
with open(os.path.join(d, "report.md"), "w") as f:
    f.write(f"Large requests: {json_rate} JSON bodies a second (json parts), {form_rate} uploads a second (form parts); "
            "from h2load, or from loadgen in the lg- parts.\n\n")
    f.write("| part | streams done | failed | path ITL p50 ms | path ITL p99 ms | client ITL p99 ms | large requests (2xx / sent) | gateway CPU s |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for name in PARTS:
        x = p[name]
        b = x["bulk"]
        bulk = f"{b[2]} / {b[1]}" if b else "-"
        f.write(f"| {name} | {x['done']} | {x['failed']} | {x['path50']:.3f} | {x['path99']:.3f} | {x['client99']:.2f} | {bulk} | {x['cpu_s']:.1f} |\n")
    f.write(f"\nFor scale: the bodies sent around the gateway (direct minus quiet: h2load writing them and nginx reading them on "
            f"the same two cores) add {p['json-direct']['path99'] - p['quiet']['path99']:+.3f} ms (json) and "
            f"{p['form-direct']['path99'] - p['quiet']['path99']:+.3f} ms (form) to the path's ITL p99 from h2load, "
            f"{p['lg-json-direct']['path99'] - p['quiet']['path99']:+.3f} ms and "
            f"{p['lg-form-direct']['path99'] - p['quiet']['path99']:+.3f} ms from loadgen.\n")
