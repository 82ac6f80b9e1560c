#!/usr/bin/env python3
"""Report of one run of loadtest/bench/retry.sh: Retry-After as retrying
clients see it. Writes DIR/report.md, DIR/measured.json (judged by
loadtest/run) and DIR/retries.svg.

    retry_report.py DIR OLD_REV
"""
import json
import math
import os
import sys

from report_common import chart, pct, write_measured  # beside this script

d, old_rev = sys.argv[1], sys.argv[2]
LABELS = (("constant", f"constant (slogate at {old_rev})"), ("measured", "measured (this commit)"))
BIN = 0.1  # seconds: the width in which a wave of retries is counted


def summary(r):
    att = [a for a in r["attempts"] if a["sent"] is not None]
    retries = [a for a in att if a["try"] > 0]
    first = [a for a in att if a["try"] == 0]
    reqs = r["requests"]
    served = [x for x in reqs if x["outcome"] == "served"]
    errors = [x for x in reqs if x["outcome"] not in ("served", "refused")]
    bins = {}
    for a in retries:
        bins[int(a["sent"] / BIN)] = bins.get(int(a["sent"] / BIN), 0) + 1
    span = max((a["sent"] for a in att), default=0) - min((a["sent"] for a in att), default=0)
    mean = len(retries) / max(span / BIN, 1)
    refused = [a for a in att if a["status"] == 429]
    told = [a["told"] for a in refused if a["told"] is not None]
    codes = {}
    for a in refused:
        codes[a["code"]] = codes.get(a["code"], 0) + 1
    waited_429 = [a["took"] for a in refused if a.get("took") is not None]
    return {
        "requests": len(reqs), "served": len(served), "errors": len(errors),
        "first_refused": sum(1 for a in first if a["status"] == 429),
        "retries": len(retries), "retries_served": sum(1 for a in retries if a["status"] == 200),
        "peak": max(bins.values(), default=0), "mean": mean,
        "p99_bin": pct(list(bins.values()) + [0] * max(0, int(span / BIN) - len(bins)), 0.99) if bins else 0,
        "told_p50": pct(told, 0.5), "told_p99": pct(told, 0.99), "told_distinct": len({round(t, 3) for t in told}),
        "codes": codes, "waited_429_p50": pct(waited_429, 0.5), "waited_429_p99": pct(waited_429, 0.99),
        "bins": bins,
    }


runs = {lab: json.load(open(os.path.join(d, f"{lab}.json"))) for lab, _ in LABELS}
s = {lab: summary(r) for lab, r in runs.items()}
c, m = s["constant"], s["measured"]
share = lambda x: x["retries_served"] / x["retries"] if x["retries"] else float("nan")
gain = 100 * (share(m) - share(c))
write_measured(d, {
    "retries_served_gain_pct": (gain, f"{100 * share(m):.1f} % of {m['retries']} retries vs {100 * share(c):.1f} % of {c['retries']}"),
    "peak_retries_less": (c["peak"] - m["peak"], f"peak {m['peak']} ({m['peak'] / max(m['mean'], 1e-9):.1f}x the mean) vs "
                          f"{c['peak']} ({c['peak'] / max(c['mean'], 1e-9):.1f}x)"),
    "served_vs_constant": (m["served"] / max(c["served"], 1), f"{m['served']} of {m['requests']} vs {c['served']} of {c['requests']}"),
})

# Retries sent per second, both variants.
path = os.path.join(d, "retries.csv")
end = int(max(max((a["sent"] for a in r["attempts"] if a["sent"] is not None), default=0) for r in runs.values())) + 1
with open(path, "w") as f:
    f.write("time (s)," + ",".join(f"{name}: retries sent per 100 ms" for _, name in LABELS) + "\n")
    for t in range(0, end * 10):
        f.write(f"{t / 10:.1f}," + ",".join(str(s[lab]["bins"].get(t, 0)) for lab, _ in LABELS) + "\n")
chart(path, d, "retries", "Retries arriving per 100 ms: a constant Retry-After brings a refused crowd back in waves", "retries", [])

with open(os.path.join(d, "report.md"), "w") as f:
    f.write("| | requests | served in the end | errors | first tries refused | retries | retries served | "
            "Retry-After told p50 / p99 s (distinct values) | refusals by code | wait for a 429 p50 / p99 s | busiest 100 ms (mean) |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
    for lab, name in LABELS:
        x = s[lab]
        codes = ", ".join(f"{k} {v}" for k, v in sorted(x["codes"].items(), key=lambda kv: str(kv[0])))
        f.write(f"| {name} | {x['requests']} | {x['served']} | {x['errors']} | {x['first_refused']} | {x['retries']} | "
                f"{x['retries_served']} ({100 * share(x):.1f} %) | {x['told_p50']:.2f} / {x['told_p99']:.2f} ({x['told_distinct']}) | "
                f"{codes} | {x['waited_429_p50']:.2f} / {x['waited_429_p99']:.2f} | {x['peak']} ({x['mean']:.1f}) |\n")
    f.write("\nChart: `retries.svg`.\n")
