#!/usr/bin/env python3
"""Report of one run of loadtest/bench/short.sh: embeddings requests'
latency through the gateway against straight to a replica, while chat
streams overload the replicas' slots, and what chat waited in the same
runs. Writes DIR/report.md and DIR/measured.json (judged by loadtest/run).

    short_report.py DIR C
"""
import json
import os
import sys

from admission_report import window, write_measured  # beside this script
from quantiles import pct  # beside this script

d, c = sys.argv[1], float(sys.argv[2])
GOOD = ("ok", "length")


def summary(name):
    r = json.load(open(os.path.join(d, f"{name}.json")))
    warmup = window(r)[0]
    recs = [x for x in r["records"] if x["start_s"] >= warmup]
    emb = [x for x in recs if x["stream"] == "emb"]
    chat = [x for x in recs if x["stream"] == "chat"]
    emb_ok = [x for x in emb if x["outcome"] in GOOD]
    chat_ok = [x for x in chat if x["outcome"] in GOOD]
    return {
        "emb": len(emb),
        "emb_failed": len(emb) - len(emb_ok),
        "emb50": pct([x["e2e_ms"] for x in emb_ok], 0.5),
        "emb99": pct([x["e2e_ms"] for x in emb_ok], 0.99),
        "emb_queue99": pct([x.get("queue_ms") or 0.0 for x in emb_ok], 0.99),
        "chat": len(chat),
        "chat_refused": sum(1 for x in chat if x["outcome"] == "rejected") / max(1, len(chat)),
        "chat_queue50": pct([x.get("queue_ms") or 0.0 for x in chat_ok], 0.5),
        "chat_queue99": pct([x.get("queue_ms") or 0.0 for x in chat_ok], 0.99),
    }


g, x = summary("gateway"), summary("direct")
added99, added50 = g["emb99"] - x["emb99"], g["emb50"] - x["emb50"]
write_measured(d, {
    "emb_p99_added_ms": (added99, f"{added99:+.2f} ms"),
    "emb_queue_p99_ms": (g["emb_queue99"], f"{g['emb_queue99']:.2f} ms"),
    "emb_failed": g["emb_failed"],
})
with open(os.path.join(d, "report.md"), "w") as f:
    f.write(f"Capacity C = {c:.2f} req/s. Added by the gateway to the embeddings: {added50:+.2f} ms at p50, {added99:+.2f} ms at p99. "
            f"In the same run chat, admitted as streams are, waited up to {g['chat_queue99']:.0f} ms in the queue (p99 of those "
            f"admitted) and {100 * g['chat_refused']:.1f} % of it was refused: what an embeddings request would meet without "
            "seats of its own.\n\n")
    f.write("| path | embeddings | failed | e2e p50 ms | e2e p99 ms | queue p99 ms | chat requests | chat refused | chat queue p50 ms | chat queue p99 ms |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for name, s in (("gateway", g), ("direct", x)):
        f.write(f"| {name} | {s['emb']} | {s['emb_failed']} | {s['emb50']:.2f} | {s['emb99']:.2f} | {s['emb_queue99']:.2f} | "
                f"{s['chat']} | {100 * s['chat_refused']:.1f} % | {s['chat_queue50']:.0f} | {s['chat_queue99']:.0f} |\n")
    f.write("\nIn `direct` the embeddings never pass the gateway: their queue column is 0.\n")
