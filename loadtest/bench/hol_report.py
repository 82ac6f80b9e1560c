#!/usr/bin/env python3
"""Report of one run of loadtest/bench/hol.sh: the path's share of ITL p99
of the open streams without large request bodies ("quiet"), with them sent
straight to their replica ("direct", the control) and through the gateway
("gateway"). Writes DIR/report.md and DIR/measured.json (judged by
loadtest/run).

    hol_report.py DIR HZ
"""
import json
import os
import sys

from report_common import write_measured  # beside this script
from quantiles import pct_pairs  # beside this script

d, hz = sys.argv[1], int(sys.argv[2])
GOOD = ("ok", "length")


def part(name):
    r = json.load(open(os.path.join(d, f"{name}.json")))
    cpu, reduced = map(int, open(os.path.join(d, f"{name}.extra")).read().split())
    s = [x for x in r["records"] if x["stream"] == "s"]
    bulk = [x for x in r["records"] if x["stream"] == "bulk"]
    path = r.get("itl_path_us", {}).get("chat", [])
    client = r.get("itl_us", {}).get("chat", [])
    return {
        "streams_done": sum(1 for x in s if x["outcome"] in GOOD),
        "streams_failed": sum(1 for x in s if x["outcome"] not in GOOD),
        "gaps": sum(c for _, c in path),
        "path50": pct_pairs(path, 0.5) / 1000,
        "path99": pct_pairs(path, 0.99) / 1000,
        "client99": pct_pairs(client, 0.99) / 1000,
        "bulk": len(bulk),
        "bulk_ok": sum(1 for x in bulk if x["outcome"] in GOOD),
        "reduced": reduced,
        "mib": sum(x["prompt_tokens"] for x in bulk) * 4 / 2**20,
        "cpu_s": cpu / hz,
    }


KINDS = ("quiet", "direct", "gateway")
p = {k: part(k) for k in KINDS}
added = p["gateway"]["path99"] - p["direct"]["path99"]
failed = sum(x["streams_failed"] + x["bulk"] - x["bulk_ok"] for x in p.values())
write_measured(d, {
    "added_path_itl_p99_ms": (added, f"{added:+.3f} ms"),
    "all_answered": (failed == 0, f"{failed} not answered"),
})
with open(os.path.join(d, "report.md"), "w") as f:
    f.write("| part | streams done | failed | gaps | path ITL p50 ms | path ITL p99 ms | client ITL p99 ms | large bodies | of them answered | "
            "rewritten (reduced) | MiB read | gateway CPU s |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for name in KINDS:
        x = p[name]
        f.write(f"| {name} | {x['streams_done']} | {x['streams_failed']} | {x['gaps']} | {x['path50']:.3f} | {x['path99']:.3f} | "
                f"{x['client99']:.2f} | {x['bulk']} | {x['bulk_ok']} | {x['reduced']} | {x['mib']:.0f} | {x['cpu_s']:.1f} |\n")
    f.write(f"\nFor scale: the same bodies sent around the gateway (direct minus quiet: the client writing them and the replica "
            f"reading them on the same two cores) add {p['direct']['path99'] - p['quiet']['path99']:+.3f} ms to the path's ITL p99; "
            f"through the gateway, over quiet, {p['gateway']['path99'] - p['quiet']['path99']:+.3f} ms.\n")
