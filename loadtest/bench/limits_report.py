#!/usr/bin/env python3
"""Report of one run of loadtest/bench/limits.sh (learned limits, the
work-conserving reservation). Each writes DIR/report.md, DIR/measured.json
(judged by loadtest/run) and its chart.

    limits_report.py overload DIR C
    limits_report.py change DIR C HALF C2 shift|slow
    limits_report.py batch DIR C QUIET
    limits_report.py fleet DIR C KILL_AT
    limits_report.py coldstart DIR
"""
import os
import sys
from collections import Counter

from admission_report import chart, class_row, load, misses, pct, timeline, window, write_measured  # beside this script


def between(r, a, b):
    return [x for x in r["records"] if a <= x["start_s"] < b]


def rows_of(recs, span):
    return {c: class_row(recs, c, span) for c in ("chat", "batch")}


def table(f, runs):
    f.write("| part | class | requests | completed | 429 | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
    f.write("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for name, rows, C, cname in runs:
        for c in ("chat", "batch"):
            x = rows[c]
            f.write(f"| {name} | {c} | {x['requests']} | {x['done']} | {x['rejected']} | {x['failed']} | "
                    f"{x['p50']:.0f} / {x['p99']:.0f} | {100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
        g = rows["chat"]["goodput"] + rows["batch"]["goodput"]
        f.write(f"| {name} | **all** | | | | | | | **{g:.2f}** ({100 * g / C:.0f} % of {cname}) |\n")


def good(x):
    """Goodput of both classes, req/s."""
    return x["chat"]["goodput"] + x["batch"]["goodput"]


def done(x):
    """Completions of both classes, req/s."""
    return x["chat"]["throughput"] + x["batch"]["throughput"]


def limit_chart(d, labels, stem, title):
    """Sum of the replicas' limits and the gateway's chat TTFT P99 over time, one series per part."""
    series = {lab: timeline(os.path.join(d, f"{lab}-timeline.csv")) for lab in labels}
    n = min(len(v) for v in series.values())
    path = os.path.join(d, stem + ".csv")
    with open(path, "w") as f:
        f.write("time (s)," + ",".join(f"{lab}: slots (sum of replica limits)" for lab in labels) + ","
                + ",".join(f"{lab}: chat TTFT P99 ms" for lab in labels) + "\n")
        for i in range(n):
            t = series[labels[0]][i]["t"]
            f.write(f"{t:.2f}," + ",".join(f"{series[l][i]['replica_limits']:.0f}" for l in labels) + ","
                    + ",".join(f"{series[l][i]['ttft_p99_ms']:.0f}" for l in labels) + "\n")
    chart(path, d, stem, title, "slots / ms", ["chat TTFT target 300 ms=300"])
    return series


def counter(path, name):
    """The sum of a Prometheus counter's samples in a scrape (0 without the file)."""
    if not os.path.exists(path):
        return 0.0
    return sum(float(l.rsplit(" ", 1)[1]) for l in open(path) if l.startswith(name + "{") or l.startswith(name + " "))


def cmd_overload(d, C):
    C = float(C)
    labs = ("auto", "fixed", "none") + (("no-preempt",) if os.path.exists(os.path.join(d, "no-preempt.json")) else ())
    rows, why = {}, None
    for lab in labs:
        r = load(os.path.join(d, f"{lab}.json"))
        w, dur = window(r)
        recs = [x for x in r["records"] if w <= x["start_s"] < dur]
        rows[lab] = rows_of(recs, dur - w)
        if lab == "auto":
            why = misses(recs, "chat")
    series = limit_chart(d, list(labs), "limits", "slots per gateway, and chat TTFT P99 as the gateway sees it")
    a = rows["auto"]
    learned = [row["replica_limits"] for row in series["auto"] if row["t"] >= 5]
    prom = os.path.join(d, "auto.prom")
    n, redone = counter(prom, "slogate_preemptions_total"), counter(prom, "slogate_preemption_redone_tokens_total")
    measured = {
        "auto_chat_p99_ms": (a["chat"]["p99"], f"{a['chat']['p99']:.0f} ms"),
        "auto_chat_within_pct": (100 * a["chat"]["within"], f"{100 * a['chat']['within']:.2f} %"),
        "auto_goodput_pct_of_c": (100 * good(a) / C, f"{good(a):.2f} req/s = {100 * good(a) / C:.0f} % of C"),
        "auto_failed": (a["chat"]["failed"] + a["batch"]["failed"], f"{a['chat']['failed'] + a['batch']['failed']} failed"),
    }
    p = rows.get("no-preempt")
    if p:
        share = 100 * a["batch"]["done"] / max(p["batch"]["done"], 1)
        measured.update({
            "batch_pct_of_no_preempt": (share, f"{a['batch']['done']} batch completed against {p['batch']['done']} without = {share:.0f} %; "
                                               f"{n:.0f} preemptions, {redone:.0f} tokens prefilled again"),
            "no_preempt_chat_within_pct": (100 * p["chat"]["within"], f"{100 * p['chat']['within']:.2f} %, P99 {p['chat']['p99']:.0f} ms"),
        })
    write_measured(d, measured)
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"Capacity C = {C:.2f} req/s. Learned slots (sum over the replicas) from 5 s on: min {min(learned):.0f}, "
                f"median {pct(learned, 0.5):.0f}, max {max(learned):.0f}.\n\n")
        table(f, [(lab, rows[lab], C, "C") for lab in labs])
        f.write(f"\n`auto` (the defaults, preemption on): {n:.0f} batch streams preempted, "
                f"{redone:.0f} tokens prefilled again by their continuations. `auto`'s {why}\n")
        f.write("\nChart: `limits.svg` (each gateway's slots and its rolling chat TTFT P99).\n")


def cmd_change(d, C, half, C2, what):
    """A run whose capacity changes at HALF (`what`: shift or slow)."""
    C, half, C2 = float(C), float(half), float(C2)
    r = load(os.path.join(d, "auto.json"))
    _, dur = window(r)
    before = rows_of(between(r, 5, half), half - 5)
    after = rows_of(between(r, half + 10, dur), dur - half - 10)
    change = {"shift": "prompts double", "slow": "one replica slows 2x"}[what]
    series = limit_chart(d, ["auto"], "limits", f"{change} at {half:.0f} s: learned slots and chat TTFT P99")
    lim = lambda a, b: [row["replica_limits"] for row in series["auto"] if a <= row["t"] < b]
    pre, post = lim(half - 20, half), lim(half + 10, dur)
    # The first moment after the change within a tenth of the level it settles at.
    level = pct(post, 0.5)
    follow = next((row["t"] - half for row in series["auto"] if row["t"] >= half and abs(row["replica_limits"] - level) <= 0.1 * level),
                  None)
    g = good(after)
    write_measured(d, {
        "follow_s": (follow, "never" if follow is None else f"{follow:.1f} s to the new level"),
        "after_chat_within_pct": (100 * after["chat"]["within"], f"{100 * after['chat']['within']:.2f} %"),
        "after_goodput_pct_of_c2": (100 * g / C2, f"{g:.2f} req/s = {100 * g / C2:.0f} % of C2"),
    })
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"C = {C:.2f} req/s before the change, C2 = {C2:.2f} req/s after it. Learned slots (sum over both replicas): "
                f"{pct(pre, 0.5):.0f} (median of the 20 s before the change), {level:.0f} (median after). \"After\" is from "
                f"{half + 10:.0f} s on.\n\n")
        table(f, [("before", before, C, "C"), ("after", after, C2, "C2")])
        f.write(f"\nAfter the change, {misses(between(r, half + 10, dur), 'chat')}\n")
        ref_path = os.path.join(d, "chat-alone.json")
        if os.path.exists(ref_path):
            rr = load(ref_path)
            w, e = window(rr)
            ref = class_row([x for x in rr["records"] if w <= x["start_s"] < e], "chat", e - w)
            f.write(f"\n**Reference: the same chat (0.4 C, 1024-token prompts) with no batch at all**, through `auto` on fresh "
                    f"replicas: {ref['done']} requests, TTFT p50 / p99 {ref['p50']:.0f} / {ref['p99']:.0f} ms, "
                    f"{100 * ref['within']:.2f} % within SLO: what chat gets on this fleet after the change with nothing "
                    "beside it.\n")
        f.write("\nChart: `limits.svg`.\n")


def cmd_batch(d, C, quiet):
    C, quiet = float(C), float(quiet)
    r = load(os.path.join(d, "auto.json"))
    _, dur = window(r)
    alone = [x for x in r["records"] if x["class"] == "batch" and x["outcome"] in ("ok", "length")
             and 10 <= x["start_s"] + x["e2e_ms"] / 1000 < quiet]
    rate = len(alone) / (quiet - 10)
    chat = rows_of(between(r, quiet, dur), dur - quiet)["chat"]
    limit_chart(d, ["auto"], "limits", f"batch alone, chat from {quiet:.0f} s: slots and chat TTFT P99")
    write_measured(d, {
        "batch_alone_pct_of_c": (100 * rate / C, f"{rate:.2f} req/s = {100 * rate / C:.0f} % of C"),
        "chat_p99_ms": (chat["p99"], f"{chat['p99']:.0f} ms"),
    })
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"C = {C:.2f} req/s.\n\n| batch alone req/s | % of C | chat requests | chat TTFT p50 / p99 ms | chat within SLO |\n")
        f.write("|---:|---:|---:|---:|---:|\n")
        f.write(f"| {rate:.2f} | {100 * rate / C:.0f} % | {chat['requests']} | {chat['p50']:.0f} / {chat['p99']:.0f} | "
                f"{100 * chat['within']:.1f} % |\n")
        f.write("\nChart: `limits.svg` (the sum of the replicas' learned limits, and chat's TTFT P99).\n")


VARIANTS = ("alone", "fixed", "even", "one", "skewed", "kill")


def gateways(d, part, only=(0, 1, 2)):
    """The records of a part's gateways (one loadgen each, started together)."""
    recs = []
    for i in only:
        path = os.path.join(d, f"{part}-{i}.json")
        if os.path.exists(path):
            recs += [dict(x, gateway=i) for x in load(path)["records"]]
    return recs


def kill_chart(d, kill_at):
    """Each gateway's slots over the kill part (their part of the replicas), and the fleet's limit."""
    series = [timeline(os.path.join(d, f"kill-{i}-timeline.csv")) for i in range(3)]
    path = os.path.join(d, "kill-slots.csv")
    with open(path, "w") as f:
        f.write("time (s),gateway 1 slots,gateway 2 slots,gateway 3 slots (killed),replica limits (gateway 1's view)\n")
        for row in series[0]:
            t = row["t"]
            near = [min(s, key=lambda r: abs(r["t"] - t)) if s else None for s in series]
            # A gateway not answering (killed) holds nothing.
            vals = [n["replica_slots"] if n and abs(n["t"] - t) < 0.5 and n["replica_slots"] == n["replica_slots"] else 0 for n in near]
            f.write(f"{t:.2f}," + ",".join(f"{v:.0f}" for v in vals) + f",{row['replica_limits']:.0f}\n")
    chart(path, d, "kill-slots", f"each gateway's part of the replicas; gateway 3 killed at {kill_at:.0f} s", "slots", [])


def cmd_fleet(d, C, kill_at):
    C, kill_at = float(C), float(kill_at)
    parts = [v for v in VARIANTS if os.path.exists(os.path.join(d, f"{v}-0.json"))]
    _, dur = window(load(os.path.join(d, f"{parts[0]}-0.json")))
    rows = {v: rows_of([x for x in gateways(d, v) if 5 <= x["start_s"] < dur], dur - 5) for v in parts}
    measured = {}
    for v in ("even", "skewed"):
        if v in rows:
            x = rows[v]
            measured[f"{v}_done_pct_of_c"] = (100 * done(x) / C, f"{done(x):.2f} req/s = {100 * done(x) / C:.0f} % of C")
            measured[f"{v}_chat_p99_ms"] = (x["chat"]["p99"], f"{x['chat']['p99']:.0f} ms")
            measured[f"{v}_chat_within_pct"] = (100 * x["chat"]["within"], f"{100 * x['chat']['within']:.2f} %")
            measured[f"{v}_goodput_pct_of_c"] = (100 * good(x) / C, f"{good(x):.2f} req/s = {100 * good(x) / C:.0f} % of C")
    if "even" in rows and "one" in rows:
        e, o = rows["even"]["chat"], rows["one"]["chat"]
        measured["even_within_minus_one_pct"] = (100 * (e["within"] - o["within"]),
                                                 f"{100 * e['within']:.2f} % (one gateway: {100 * o['within']:.2f} %)")
        measured["even_p99_minus_one_ms"] = (e["p99"] - o["p99"], f"{e['p99']:.0f} ms (one gateway: {o['p99']:.0f} ms)")
    after = None
    if "kill" in rows:
        after = rows_of([x for x in gateways(d, "kill", (0, 1)) if kill_at + 5 <= x["start_s"] < dur], dur - kill_at - 5)
        measured["kill_after_chat_p99_ms"] = (after["chat"]["p99"], f"{after['chat']['p99']:.0f} ms")
        measured["kill_after_chat_within_pct"] = (100 * after["chat"]["within"], f"{100 * after['chat']['within']:.2f} %")
        kill_chart(d, kill_at)
    write_measured(d, measured)
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"Capacity C = {C:.2f} req/s.\n\n")
        table(f, [(v, rows[v], C, "C") for v in parts] + ([("kill, after", after, C, "C")] if after else []))
        if after:
            f.write("\nChart: `kill-slots.svg` (each gateway's `slogate_replica_slots`, summed over the replicas, and the "
                    "replicas' limit).\n")


def cmd_coldstart(d):
    """A fresh gateway's first seconds: TTFT of the first round of 32 streams and of the whole part, auto vs fixed."""
    rows = {}
    for v in ("auto", "fixed"):
        recs = load(os.path.join(d, f"{v}.json"))["records"]
        first = [x["ttft_ms"] for x in recs if x["start_s"] < 1.0 and x["ttft_ms"] is not None]
        early = [x["ttft_ms"] for x in recs if x["start_s"] < 2.0 and x["ttft_ms"] is not None]
        every = [x["ttft_ms"] for x in recs if x["ttft_ms"] is not None]
        queued = [x.get("queue_ms") or 0 for x in recs if x["start_s"] < 2.0]
        rows[v] = {"first_p99": pct(first, 0.99), "early_p99": pct(early, 0.99), "all_p99": pct(every, 0.99),
                   "queue_max": max(queued, default=0), "n": len(recs),
                   "failed": sum(1 for x in recs if x["outcome"] not in ("ok", "length")),
                   # why: the gateway's error code (a 429's reason), else the outcome
                   "why": Counter(x.get("error_code") or x["outcome"] for x in recs if x["outcome"] not in ("ok", "length"))}
    diff = rows["auto"]["early_p99"] - rows["fixed"]["early_p99"]
    write_measured(d, {
        "early_p99_over_fixed_ms": (diff, f"{diff:+.1f} ms ({rows['auto']['early_p99']:.0f} vs {rows['fixed']['early_p99']:.0f})"),
        "early_queue_max_ms": (rows["auto"]["queue_max"], f"longest wait {rows['auto']['queue_max']:.0f} ms"),
    })
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("| limit | requests | failed | TTFT p99 ms, first 1 s | first 2 s | whole part | longest queue wait in the first 2 s ms |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|\n")
        for v in ("auto", "fixed"):
            r = rows[v]
            why = ", ".join(f"{n} {k}" for k, n in r["why"].most_common())
            failed = f"{r['failed']} ({why})" if why else "0"
            f.write(f"| {v} | {r['n']} | {failed} | {r['first_p99']:.0f} | {r['early_p99']:.0f} | {r['all_p99']:.0f} | {r['queue_max']:.0f} |\n")


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"overload": cmd_overload, "change": cmd_change, "batch": cmd_batch, "fleet": cmd_fleet, "coldstart": cmd_coldstart}[cmd](*rest)
