#!/usr/bin/env python3
"""Reports of loadtest/bench/tenants.sh (fair sharing, weights, per-key token limits).

    tenants_report.py fair DIR C MACHINE
    tenants_report.py flood DIR C MACHINE
    tenants_report.py weights DIR C MACHINE
    tenants_report.py tpm DIR LIMIT MACHINE
"""
import os
import sys

from admission_report import chart, load, median_worst, pct, window, within, write_checks  # beside this script

FLEET = ("two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each), "
         "`--max-num-batched-tokens 512`, `--scheduling-policy priority`; 512-token prompts, 64-256 output tokens "
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


def cmd_fair(d, C, machine):
    C = float(C)
    fair_labels = sorted((f[:-5] for f in os.listdir(d) if f.startswith("fair-") and f.endswith(".json")),
                         key=lambda s: int(s.split("-")[1]))
    labels = [lab for lab in ("fifo",) if os.path.exists(os.path.join(d, f"{lab}.json"))] + fair_labels
    labels += [lab for lab in ("alone",) if os.path.exists(os.path.join(d, f"{lab}.json"))]
    runs = {lab: load(os.path.join(d, f"{lab}.json")) for lab in labels}
    rows, refusals = {}, {}
    for lab, r in runs.items():
        recs, dur = measured(r)
        rows[lab] = {n: tenant_row(recs, n, dur) for n in ("A", "B", "C") if lab != "alone" or n != "A"}
        refusals[lab] = {n: codes(recs, n) for n in ("A", "B", "C")}
    n_runs = len(fair_labels)
    checks = []
    lo, hi = min, max
    for n in ("B", "C"):
        med, worst = median_worst([rows[lab][n]["within"] for lab in fair_labels], lo)
        checks.append((f"fair: tenant {n} >= 99 % within SLO (median of {n_runs}; worst run)", med >= 0.99,
                       f"{100 * med:.2f} % (worst {100 * worst:.2f} %)"))
        med, worst = median_worst([rows[lab][n]["p99"] for lab in fair_labels], hi)
        checks.append((f"fair: tenant {n} TTFT P99 <= 300 ms (median; worst run)", med <= 300, f"{med:.0f} ms (worst {worst:.0f} ms)"))
        bo = [refusals[lab][n].get("breaker_open", 0) for lab in fair_labels]
        checks.append((f"fair: tenant {n} never refused by the breaker (every run)", max(bo) == 0, f"{sum(bo)} breaker_open in {n_runs} runs"))
    a_own = [refusals[lab]["A"].get("tenant_over_share", 0) for lab in fair_labels]
    a_all = [rows[lab]["A"]["rejected"] for lab in fair_labels]
    checks.append(("fair: A receives the refusals, as `tenant_over_share` (every run)",
                   all(o > 0 and o == t for o, t in zip(a_own, a_all)),
                   ", ".join(f"{o} of {t}" for o, t in zip(a_own, a_all))))
    goodputs = [sum(x["goodput"] for x in rows[lab].values()) for lab in fair_labels]
    med, worst = median_worst(goodputs, lo)
    checks.append((f"fair: goodput >= 90 % of C in total (median; worst run)", med >= 0.9 * C,
                   f"{med:.2f} req/s = {100 * med / C:.0f} % of C (worst {100 * worst / C:.0f} %)"))
    shown = {k: v for k, v in runs.items() if k in ("fifo", fair_labels[0] if fair_labels else "")}
    ttft_chart(d, shown, ("A", "B", "C"), "ttft", "Each tenant's TTFT P99 per 5 s: first come first served vs fair (run 1)")
    dur = window(runs[fair_labels[0]])[1] if fair_labels else 0
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Three tenants in one class: a heavy one does not take the others' SLO\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/tenants.sh fair`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Offered 1.5 C in all, all in `chat` (Poisson), for {dur:.0f} s "
                "(three times the breaker's `trip_after`): tenant A 80 %, "
                "B and C 10 % each. `fifo`: no keys configured, so every caller is one tenant and the class's queue is "
                f"first come, first served (slogate before tenants); `fair-1` to `fair-{n_runs}`: a key per tenant, "
                "equal weights, the same load on fresh replicas each time (judged on the median run, the worst "
                "stated); `alone`: B and C at the same rates with A absent, the reference: what this fleet and "
                "machine give them at best. Measured from 10 s after start. Every gateway runs slogate's defaults "
                "(`trip_after: 30s`, `tiers.interactive.shed_late: true`).\n\n")
        write_checks(f, checks)
        if "alone" in rows and fair_labels:
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
        f.write("\nChart: `ttft.svg`.\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_flood(d, C, machine):
    C = float(C)
    labels = sorted((f[:-5] for f in os.listdir(d) if f.startswith("flood-") and f.endswith(".json")), key=lambda s: int(s.split("-")[1]))
    rows, refused = {}, {}
    for lab in labels:
        r = load(os.path.join(d, f"{lab}.json"))
        recs, dur = measured(r)
        rows[lab] = {n: tenant_row(recs, n, dur) for n in ("web", "bulk")}
        refused[lab] = {n: codes(recs, n) for n in ("web", "bulk")}
    n_runs = len(labels)
    bo = [refused[lab]["web"].get("breaker_open", 0) for lab in labels]
    w_med, w_worst = median_worst([rows[lab]["web"]["within"] for lab in labels], min)
    p_med, p_worst = median_worst([rows[lab]["web"]["p99"] for lab in labels], max)
    checks = [
        (f"chat (web) never refused by a breaker (every one of {n_runs} runs)", max(bo) == 0, f"{sum(bo)} breaker_open"),
        ("chat (web) >= 99 % within SLO (median; worst run)", w_med >= 0.99, f"{100 * w_med:.2f} % (worst {100 * w_worst:.2f} %)"),
        ("chat (web) TTFT P99 <= 300 ms (median; worst run)", p_med <= 300, f"{p_med:.0f} ms (worst {p_worst:.0f} ms)"),
    ]
    dur = window(load(os.path.join(d, f"{labels[0]}.json")))[1]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Batch floods while chat stays within its share: chat is not refused\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/tenants.sh flood`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Key `web` sends `chat` at 0.5 C, key `bulk` floods `batch` at 2 C "
                f"(Poisson, 512-token prompts) for {dur:.0f} s, three times the breaker's `trip_after`; {n_runs} runs on fresh "
                "replicas (judged on the median, the worst stated). slogate's defaults. Measured from 10 s after start.\n\n")
        write_checks(f, checks)
        f.write("\n| run | tenant | class | requests | completed | 429 (by code) | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
        f.write("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for lab in labels:
            for n, cls in (("web", "chat"), ("bulk", "batch")):
                x = rows[lab][n]
                by = ", ".join(f"{c} {k}" for c, k in sorted(refused[lab][n].items())) or "0"
                f.write(f"| {lab} | {n} | {cls} | {x['requests']} | {x['done']} | {by} | {x['failed']} | {x['p50']:.0f} / {x['p99']:.0f} | "
                        f"{100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_weights(d, C, machine):
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
    checks = [(f"service received within 10 % of 3:1 over {end - w:.0f} s", abs(ratio / 3 - 1) <= 0.10, f"{ratio:.2f} : 1")]
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
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Weights 3:1 between two saturating tenants\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/tenants.sh weights`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Two tenants in `chat`, keys with weights 3 (`heavy`) and 1 (`light`), "
                "each offering 1.5 C (Poisson, same lengths). Service = prompt plus generated tokens of the requests "
                f"that completed between {w:.0f} s and {end:.0f} s.\n\n")
        write_checks(f, checks)
        f.write("\n| tenant | weight | tokens served | requests | completed | 429 | TTFT p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
        for n, wt in (("heavy", 3), ("light", 1)):
            x = tenant_row(recs, n, dur)
            f.write(f"| {n} | {wt} | {tokens[n]} | {x['requests']} | {x['done']} | {x['rejected']} | {x['p50']:.0f} / {x['p99']:.0f} |\n")
        f.write("\nChart: `served.svg`.\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_tpm(d, limit, machine):
    limit = float(limit)
    r = load(os.path.join(d, "tpm.json"))
    minutes = r["elapsed_s"] / 60
    used = r["gateway_tokens"]
    per_min = used / minutes
    answered = len(r["answers"])
    all_headers = all(x["headers"] for x in r["refusals"])
    per_minute = [sum(a["tokens"] for a in r["answers"] if m * 60 <= a["t"] < (m + 1) * 60) for m in range(int(r["minutes"]))]
    checks = [
        ("the limit holds within 5 % over the run", per_min <= 1.05 * limit, f"{per_min:.0f} tokens/min for a limit of {limit:.0f} ({100 * per_min / limit:.1f} %)"),
        ("every 429 carries Retry-After and the x-ratelimit-* headers", all_headers and bool(r["refusals"]),
         f"{len(r['refusals'])} RateLimitError, {'all' if all_headers else 'not all'} with the headers"),
        ("the SDK's backoff makes progress (answers every minute)", all(m > 0 for m in per_minute), ", ".join(f"{m}" for m in per_minute) + " tokens answered per minute"),
        ("nothing else is refused", not r["errors"] and r["other"]["refused"] == 0 and r["other"]["error"] == 0,
         f"{len(r['errors'])} other errors for the limited key; key without limits: {r['other']['ok']} answered, {r['other']['refused']} refused"),
    ]
    path = os.path.join(d, "tokens.csv")
    with open(path, "w") as f:
        f.write("time (s),tokens answered over the last 60 s,limit\n")
        ts = sorted((a["t"], a["tokens"]) for a in r["answers"])
        for t, _ in ts:
            f.write(f"{t:.1f},{sum(n for u, n in ts if t - 60 < u <= t)},{limit:.0f}\n")
    chart(path, d, "tokens", "A key's tokens over any 60 s, driven by the OpenAI SDK", "tokens", [])
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# A key's tokens_per_minute, driven by the OpenAI Python SDK\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/tenants.sh tpm`.\n\n")
        f.write(f"One simulated replica (`llama8b-h100`: the key's limit binds, not the replica). Key `sdk`: "
                f"`limits: {{ tokens_per_minute: {limit:.0f} }}`; eight threads call `chat.completions.create` "
                "(~200-token prompt, `max_tokens: 100`) with the SDK's default retries for "
                f"{r['minutes']:.0f} minutes; a key without limits sends one request a second beside them. "
                "Tokens are the replica's usage as the gateway counted it (`slogate_tenant_tokens_total`).\n\n")
        write_checks(f, checks)
        f.write(f"\n{answered} requests answered, {used:.0f} tokens in {r['elapsed_s']:.0f} s.\n\nChart: `tokens.svg`.\n")
    print(open(os.path.join(d, "README.md")).read())


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    {"fair": cmd_fair, "flood": cmd_flood, "weights": cmd_weights, "tpm": cmd_tpm}[cmd](*rest)
