#!/usr/bin/env python3
"""Reports of loadtest/bench/tenants.sh (fair sharing, weights, per-key
token limits), one run each: DIR/report.md and DIR/measured.json, the
values the scenario file's checks judge (the runner, loadtest/run, judges).

    tenants_report.py fair DIR C
    tenants_report.py flood DIR C
    tenants_report.py weights DIR C
    tenants_report.py tpm DIR LIMIT
"""
import os
import sys

from admission_report import chart, load, misses, pct, window, within, write_measured  # beside this script

FLEET = ("two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each), "
         "`--max-num-batched-tokens 512`, `--scheduling-policy priority`, chunks stamped with when they left the replica "
         "(`--stamp-events`); 512-token prompts, 64-256 output tokens "
         "(uniform). slogate: learned limits (`auto`), `upstream_priority: true`, class `chat` (interactive, "
         "TTFT 300 ms, ITL 50 ms), everything else slogate's defaults.")


def tenant_row(recs, name, dur):
    rs = [x for x in recs if x["stream"] == name]
    done = [x for x in rs if x["outcome"] in ("ok", "length")]
    rej = [x for x in rs if x["outcome"] == "rejected" or x.get("status") == 429]
    ttft = [x["ttft_ms"] for x in done if x["ttft_ms"] is not None]
    good = [x for x in rs if within(x)]
    return {
        "requests": len(rs), "done": len(done), "rejected": len(rej), "failed": len(rs) - len(done) - len(rej),
        "p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99), "within": len(good) / len(rs) if rs else float("nan"),
        "goodput": len(good) / dur,
    }


def measured(r):
    w, d = window(r)
    return [x for x in r["records"] if w <= x["start_s"] < d], d - w


def ttft_chart(d, runs, names, stem, title):
    """Each tenant's TTFT P99 per 5 s, one series per run and tenant."""
    path = os.path.join(d, stem + ".csv")
    series = {}
    end = 0
    for lab, r in runs.items():
        for n in names:
            by = {}
            for x in r["records"]:
                if x["stream"] == n and x["ttft_ms"] is not None:
                    by.setdefault(int(x["start_s"] // 5), []).append(x["ttft_ms"])
            series[f"{lab}: {n} TTFT P99 ms"] = by
            end = max(end, max(by) if by else 0)
    with open(path, "w") as f:
        f.write("time (s)," + ",".join(series) + "\n")
        for b in range(end + 1):
            # A bucket where some tenant finished nothing is left out (the chart needs every value).
            if all(v.get(b) for v in series.values()):
                f.write(f"{b * 5 + 2.5}," + ",".join(f"{pct(v[b], 0.99):.0f}" for v in series.values()) + "\n")
    chart(path, d, stem, title, "ms", ["chat TTFT target 300 ms=300"])


def codes(recs, name):
    """A tenant's refusals by error code."""
    out = {}
    for x in recs:
        if x["stream"] == name and (x["outcome"] == "rejected" or x.get("status") == 429):
            c = x.get("error_code") or "?"
            out[c] = out.get(c, 0) + 1
    return out


def cmd_fair(d, C):
    C = float(C)
    labels = [lab for lab in ("fifo", "fair", "alone") if os.path.exists(os.path.join(d, f"{lab}.json"))]
    runs = {lab: load(os.path.join(d, f"{lab}.json")) for lab in labels}
    rows, refusals = {}, {}
    for lab, r in runs.items():
        recs, dur = measured(r)
        rows[lab] = {n: tenant_row(recs, n, dur) for n in ("A", "B", "C") if lab != "alone" or n != "A"}
        refusals[lab] = {n: codes(recs, n) for n in ("A", "B", "C")}
    fair = rows["fair"]
    out = {}
    for n in ("B", "C"):
        out[f"{n}_within_pct"] = (100 * fair[n]["within"], f"{100 * fair[n]['within']:.2f} %")
        out[f"{n}_ttft_p99_ms"] = (fair[n]["p99"], f"{fair[n]['p99']:.0f} ms")
        bo = refusals["fair"][n].get("breaker_open", 0)
        out[f"{n}_breaker_open"] = (bo, f"{bo} breaker_open")
    own, every = refusals["fair"]["A"].get("tenant_over_share", 0), fair["A"]["rejected"]
    out["A_refusals_all_over_share"] = (own > 0 and own == every, f"{own} of {every}")
    g = sum(x["goodput"] for x in fair.values())
    out["goodput_pct_of_c"] = (100 * g / C, f"{g:.2f} req/s = {100 * g / C:.0f} % of C")
    write_measured(d, out)
    shown = {k: v for k, v in runs.items() if k in ("fifo", "fair")}
    ttft_chart(d, shown, ("A", "B", "C"), "ttft", "Each tenant's TTFT P99 per 5 s: first come first served vs fair")
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"**Fleet:** {FLEET}\n\n**Capacity C = {C:.2f} req/s.**\n")
        if "alone" in rows:
            a = rows["alone"]
            f.write(f"\nReference, A absent (`alone`): B {100 * a['B']['within']:.1f} % and C {100 * a['C']['within']:.1f} % "
                    f"within SLO, TTFT P99 {a['B']['p99']:.0f} / {a['C']['p99']:.0f} ms: what this fleet and machine give "
                    "them at best.\n")
        f.write("\n## Side by side\n\n| run | tenant | requests | completed | 429 (by code) | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
        f.write("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for lab in labels:
            for n, x in rows[lab].items():
                by = ", ".join(f"{c} {k}" for c, k in sorted(refusals[lab][n].items())) or "0"
                f.write(f"| {lab} | {n} | {x['requests']} | {x['done']} | {by} | {x['failed']} | "
                        f"{x['p50']:.0f} / {x['p99']:.0f} | {100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
            g = sum(x["goodput"] for x in rows[lab].values())
            if lab != "alone":
                f.write(f"| {lab} | **all** | | | | | | | **{g:.2f}** ({100 * g / C:.0f} % of C) |\n")
        f.write("\nChart: `ttft.svg`" + (" (run 1: first come first served against fair)" if "fifo" in runs else "") + ".\n")


def cmd_flood(d, C):
    C = float(C)
    r = load(os.path.join(d, "flood.json"))
    recs, dur = measured(r)
    rows = {n: tenant_row(recs, n, dur) for n in ("web", "bulk")}
    refused = {n: codes(recs, n) for n in ("web", "bulk")}
    bo = refused["web"].get("breaker_open", 0)
    web = rows["web"]
    write_measured(d, {
        "web_breaker_open": (bo, f"{bo} breaker_open"),
        "web_within_pct": (100 * web["within"], f"{100 * web['within']:.2f} %"),
        "web_ttft_p99_ms": (web["p99"], f"{web['p99']:.0f} ms"),
    })
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"**Fleet:** {FLEET}\n\n**Capacity C = {C:.2f} req/s.**\n\n")
        f.write("| tenant | class | requests | completed | 429 (by code) | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
        f.write("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for n, cls in (("web", "chat"), ("bulk", "batch")):
            x = rows[n]
            by = ", ".join(f"{c} {k}" for c, k in sorted(refused[n].items())) or "0"
            f.write(f"| {n} | {cls} | {x['requests']} | {x['done']} | {by} | {x['failed']} | {x['p50']:.0f} / {x['p99']:.0f} | "
                    f"{100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
        f.write(f"\n`web`'s {misses([x for x in recs if x['stream'] == 'web'], 'chat')}\n")


def cmd_weights(d, C):
    C = float(C)
    r = load(os.path.join(d, "weights.json"))
    w, end = window(r)
    served = {"heavy": [], "light": []}
    for x in r["records"]:
        if x["outcome"] in ("ok", "length") and x["stream"] in served:
            done_at = x["start_s"] + x["e2e_ms"] / 1000
            if w <= done_at < end:
                served[x["stream"]].append((done_at, (x.get("prompt_tokens") or 0) + (x.get("tokens") or 0)))
    tokens = {k: sum(t for _, t in v) for k, v in served.items()}
    ratio = tokens["heavy"] / tokens["light"] if tokens["light"] else float("inf")
    write_measured(d, {"heavy_over_light": (ratio, f"{ratio:.2f} : 1")})
    path = os.path.join(d, "served.csv")
    with open(path, "w") as f:
        f.write("time (s),heavy (weight 3): tokens served,light (weight 1): tokens served,light x 3\n")
        acc = {"heavy": 0, "light": 0}
        events = sorted((t, k, n) for k, v in served.items() for t, n in v)
        for t, k, n in events:
            acc[k] += n
            f.write(f"{t:.2f},{acc['heavy']},{acc['light']},{3 * acc['light']}\n")
    chart(path, d, "served", "Tokens served, weights 3 and 1, both saturating", "tokens", [])
    recs, dur = measured(r)
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Service counted for the requests that completed between {w:.0f} s and {end:.0f} s.\n\n")
        f.write("| tenant | weight | tokens served | requests | completed | 429 | TTFT p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
        for n, wt in (("heavy", 3), ("light", 1)):
            x = tenant_row(recs, n, dur)
            f.write(f"| {n} | {wt} | {tokens[n]} | {x['requests']} | {x['done']} | {x['rejected']} | {x['p50']:.0f} / {x['p99']:.0f} |\n")
        f.write("\nChart: `served.svg`.\n")


def cmd_tpm(d, limit):
    limit = float(limit)
    r = load(os.path.join(d, "tpm.json"))
    minutes = r["elapsed_s"] / 60
    used = r["gateway_tokens"]
    per_min = used / minutes
    answered = len(r["answers"])
    all_headers = all(x["headers"] for x in r["refusals"])
    per_minute = [sum(a["tokens"] for a in r["answers"] if m * 60 <= a["t"] < (m + 1) * 60) for m in range(int(r["minutes"]))]
    write_measured(d, {
        "tokens_per_min_over_limit": (per_min / limit, f"{per_min:.0f} tokens/min for a limit of {limit:.0f} ({100 * per_min / limit:.1f} %)"),
        "refusals_with_headers": (all_headers and bool(r["refusals"]),
                                  f"{len(r['refusals'])} RateLimitError, {'all' if all_headers else 'not all'} with the headers"),
        "answers_every_minute": (all(m > 0 for m in per_minute), ", ".join(f"{m}" for m in per_minute) + " tokens answered per minute"),
        "nothing_else_refused": (not r["errors"] and r["other"]["refused"] == 0 and r["other"]["error"] == 0,
                                 f"{len(r['errors'])} other errors for the limited key; key without limits: {r['other']['ok']} answered, "
                                 f"{r['other']['refused']} refused"),
    })
    path = os.path.join(d, "tokens.csv")
    with open(path, "w") as f:
        f.write("time (s),tokens answered over the last 60 s,limit\n")
        ts = sorted((a["t"], a["tokens"]) for a in r["answers"])
        for t, _ in ts:
            f.write(f"{t:.1f},{sum(n for u, n in ts if t - 60 < u <= t)},{limit:.0f}\n")
    chart(path, d, "tokens", "A key's tokens over any 60 s, driven by the OpenAI SDK", "tokens", [])
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"{answered} requests answered, {used:.0f} tokens in {r['elapsed_s']:.0f} s.\n\nChart: `tokens.svg`.\n")


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    {"fair": cmd_fair, "flood": cmd_flood, "weights": cmd_weights, "tpm": cmd_tpm}[cmd](*rest)
