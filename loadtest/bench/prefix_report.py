#!/usr/bin/env python3
"""Report of one run of loadtest/bench/prefix.sh: prefix-aware routing
(estimated, and exact from the replicas' KV events) against least_loaded
and round_robin, from the load generator's records and
the simulated replicas' own prefix cache counters. Writes DIR/report.md,
DIR/measured.json (judged by loadtest/run) and DIR/{throughput,ttft}.{csv,title}
for the charts of the shared-prefix sweep.

    prefix_report.py DIR SECS PART...
"""
import json
import os
import sys

from report_common import write_measured  # beside this script

work, secs, *runs = sys.argv[1:]
secs = float(secs)  # a load's duration where its scenario does not say
DONE = ("ok", "length")


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def load(name):
    r = json.load(open(f"{work}/{name}.json"))
    recs = r["records"]
    dur = str(r.get("scenario", {}).get("duration", ""))
    span = float(dur[:-1]) if dur.endswith("s") and dur[:-1].replace(".", "", 1).isdigit() else secs
    done = [x for x in recs if x["outcome"] in DONE]
    before = [json.loads(l) for l in open(f"{work}/{name}.sim0") if l.strip()]
    after = [json.loads(l) for l in open(f"{work}/{name}.sim1") if l.strip()]
    # This run's share of the replicas' counters.
    sims = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    waiting = [[float(v) for v in l.split()] for l in open(f"{work}/{name}.waiting") if l.strip()]
    q, h = sum(s["queries"] for s in sims), sum(s["hits"] for s in sims)
    return {
        "sent": len(recs),
        "done": len(done),
        "rejected": sum(1 for x in recs if x["outcome"] == "rejected"),
        "failed": sum(1 for x in recs if x["outcome"] not in DONE and x["outcome"] != "rejected"),
        "tok_s": sum(x["tokens"] for x in done) / span,
        # Only what was delivered within the load's span: a fleet whose
        # queues grow finishes its backlog after it, at no rate of its own.
        "tok_s_within": sum(x["tokens"] for x in done if x["start_s"] + x["e2e_ms"] / 1000 <= span) / span,
        "p90": pct([x["ttft_ms"] for x in done if x["ttft_ms"] is not None], 0.9),
        "p99": pct([x["ttft_ms"] for x in done if x["ttft_ms"] is not None], 0.99),
        # Over every request sent, one refused or failed counted late: what
        # the callers saw, where a gateway keeps its admitted requests' TTFT
        # by refusing the rest.
        "p90_sent": pct([x["ttft_ms"] if x["outcome"] in DONE and x["ttft_ms"] is not None else float("inf")
                         for x in recs], 0.9),
        "hit": h / q if q else float("nan"),
        "per_replica": [int(s["requests"]) for s in sims],
        "max_waiting": [max((w[i] for w in waiting if len(w) > i), default=0) for i in range(len(sims))],
        "end_waiting": waiting[-1] if waiting else [],
    }


R = {n: load(n) for n in runs}


def ms(v):
    return "late" if v == float("inf") else f"{v:.0f}"


def row(label, x):
    return (f"| {label} | {x['sent']} | {x['done']} | {x['rejected']} | {x['failed']} | {x['tok_s']:.0f} | "
            f"{x['p90']:.0f} | {x['p99']:.0f} | {ms(x['p90_sent'])} | {100 * x['hit']:.1f} % |")


HEAD = ("| | sent | done | 429 | failed | output tokens/s | TTFT p90 ms | TTFT p99 ms | TTFT p90 of all sent | engine cache hits |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
measured = {}


def against_least_loaded(part, mode, rates):
    """A mode's sweep judged against least_loaded's. Throughput: at the top
    rate, where least_loaded is saturated (its output no more than a tenth
    above its output at the rate below: the load is past what it can serve,
    so the ratio is of what each serves, not of the load offered). TTFT and
    hits: at the first rate where least_loaded's TTFT p90 over every
    request sent (refused or failed counted late) passes the target."""
    ll = {r: R[f"{part}-least_loaded-{r}"] for r in rates}
    top = rates[-1]
    a, b = R[f"{part}-{mode}-{top}"], ll[top]
    ratio = a["tok_s"] / b["tok_s"] if b["tok_s"] else float("inf")
    below = ll[rates[-2]]["tok_s"] if len(rates) > 1 else 0.0
    saturated = len(rates) > 1 and b["tok_s"] <= 1.1 * below
    tokens = (ratio if saturated else None,
              f"at {top} req/s: {a['tok_s']:.0f} vs {b['tok_s']:.0f} ({ratio:.2f}x; least_loaded "
              + (f"saturated: {below:.0f} at {rates[-2]} req/s)" if saturated else "not saturated there: not judged)"))
    sat = next((r for r in rates if ll[r]["p90_sent"] > 300), None)
    if sat is None:
        return {"tokens": tokens, "ttft": (None, "least_loaded within the target at every rate"),
                "hits": (None, "least_loaded within the target at every rate")}
    a, b = R[f"{part}-{mode}-{sat}"], ll[sat]
    ttft = (a["p90_sent"] <= 300 < b["p90_sent"],
            f"at {sat} req/s, over all sent: {ms(a['p90_sent'])} vs {ms(b['p90_sent'])} "
            f"(admitted: {a['p90']:.0f} vs {b['p90']:.0f} ms; refused {a['rejected']} vs {b['rejected']})")
    return {"tokens": tokens, "ttft": ttft, "hits": (100 * a["hit"], f"{100 * a['hit']:.1f} % at {sat} req/s")}


sys.stdout = open(os.path.join(work, "report.md"), "w")

# Through Envoy: slogate as its endpoint picker against Envoy's own round robin.
epp_rates = sorted({int(n.rsplit("-", 1)[1]) for n in runs if n.startswith("epp-slogate-")})
if epp_rates:
    print("## Through Envoy\n")
    for r in epp_rates:
        print(f"\n**{r} requests/s**\n\n{HEAD}")
        for label, key in (("slogate as the picker", "slogate"), ("Envoy round robin", "none")):
            print(row(label, R[f"epp-{key}-{r}"]))
    print("\nOutput tokens/s delivered within each rate's 30 s (without admission, Envoy's round robin lets the replicas'"
          " queues grow and finishes its backlog after the window: counted by the window, that is no rate of its own):\n")
    print("| requests/s | slogate as the picker | Envoy round robin |\n|---:|---:|---:|")
    for r in epp_rates:
        print(f"| {r} | {R[f'epp-slogate-{r}']['tok_s_within']:.0f} | {R[f'epp-none-{r}']['tok_s_within']:.0f} |")
    top = epp_rates[-1]
    a, b = R[f"epp-slogate-{top}"], R[f"epp-none-{top}"]
    ratio = a["tok_s_within"] / b["tok_s_within"] if b["tok_s_within"] else float("inf")
    measured["epp_tokens_ratio"] = (ratio, f"at {top} req/s: {a['tok_s_within']:.0f} vs {b['tok_s_within']:.0f} output tokens/s within the window ({ratio:.2f}x)")
    failed = sum(R[n]["failed"] for n in runs if n.startswith("epp-"))
    measured["epp_failed"] = (failed, f"{failed} of {sum(R[n]['sent'] for n in runs if n.startswith('epp-'))}")

shared = sorted({int(n.rsplit("-", 1)[1]) for n in runs if n.startswith("shared-")})
fleet = sorted({int(n.rsplit("-", 1)[1]) for n in runs if n.startswith("fleet-")})
policies = [p for p in ("prefix_aware", "exact", "least_loaded", "round_robin") if any(n.startswith(f"shared-{p}-") for n in runs)]
# The measures' names: estimated mode's as they were, exact mode's with its name.
KEY = {"prefix_aware": "", "exact": "exact_"}
if shared:
    print("## Shared prefixes\n")
    print("""inference-perf's `shared_prefix` shape at half llm-d's lengths: 150 groups x 5 questions, a 3,000-token system
prompt and a 600-token question, 100 tokens out, Poisson arrivals at each rate. The 750 prompts are taken in a
shuffled order, again from the start once all were sent: the first of each group finds its system prompt nowhere
(a first pass is at most 4/5 x 3,000/3,600 = 67 % cached), a prompt sent before is cached whole but its last block.
""")
    for r in shared:
        print(f"\n**{r} requests/s**\n\n{HEAD}")
        for p in policies:
            x = R.get(f"shared-{p}-{r}")
            if x:
                print(row(p, x))
    with open(f"{work}/throughput.csv", "w") as f:
        f.write("offered requests/s," + ",".join(policies) + "\n")
        for r in shared:
            f.write(f"{r}," + ",".join(f"{R[f'shared-{p}-{r}']['tok_s']:.1f}" for p in policies) + "\n")
    with open(f"{work}/ttft.csv", "w") as f:
        f.write("offered requests/s," + ",".join(policies) + "\n")
        for r in shared:
            f.write(f"{r}," + ",".join(f"{R[f'shared-{p}-{r}']['p90']:.1f}" for p in policies) + "\n")
    open(f"{work}/throughput.title", "w").write("Shared prefixes: output tokens/s\noutput tokens/s\n")
    open(f"{work}/ttft.title", "w").write("Shared prefixes: TTFT p90\nms\n")
    print("\nCharts: `throughput.svg` (output tokens/s against offered rate), `ttft.svg` (TTFT p90, the target drawn).\n")
    for mode in [m for m in KEY if m in policies and "least_loaded" in policies]:
        judged = against_least_loaded("shared", mode, shared)
        k = KEY[mode]
        measured[f"shared_{k}tokens_ratio"] = judged["tokens"]
        measured[f"shared_{k}ttft_within"] = judged["ttft"]
        measured[f"shared_{k}hits_pct"] = judged["hits"]

if any(n.startswith("multiturn-") for n in runs):
    print("## Multi-turn chat\n")
    print("""64 conversations of 10 turns at 20 requests/s, each turn resending the history: the application's 1,000-token
system prompt (the same for all), then 100 tokens a turn (the assistant's earlier answers stand in the history as
text the engine never generated, so only prompt blocks are reused, as with a client that edits its history).
""")
    print(HEAD)
    for p in ("prefix_aware", "least_loaded"):
        if f"multiturn-{p}-20" in R:
            print(row(p, R[f"multiturn-{p}-20"]))
    if "multiturn-prefix_aware-20" in R:
        h = R["multiturn-prefix_aware-20"]["hit"]
        measured["multiturn_hits_pct"] = (100 * h, f"{100 * h:.1f} %")
    print()

rand = sorted({int(n.rsplit("-", 1)[1]) for n in runs if n.startswith("random-")})
if rand:
    print("## No shared prefixes\n")
    print("Prompts of 3,600 tokens that share nothing, 100 out: what routing by prefix costs where nothing is cached.\n")
    worst_t, worst_p = 0.0, 0.0
    for r in rand:
        print(f"\n**{r} requests/s**\n\n{HEAD}")
        for p in ("prefix_aware", "least_loaded"):
            print(row(p, R[f"random-{p}-{r}"]))
        a, b = R[f"random-prefix_aware-{r}"], R[f"random-least_loaded-{r}"]
        worst_t = max(worst_t, (b["tok_s"] - a["tok_s"]) / b["tok_s"] if b["tok_s"] else 0)
        worst_p = max(worst_p, (a["p99"] - b["p99"]) / b["p99"] if b["p99"] else 0)
    measured["random_worst_pct"] = (100 * max(worst_t, worst_p), f"worst: throughput {100 * worst_t:+.1f} % lower, TTFT p99 {100 * worst_p:+.1f} % higher")
    print()

if any(n.startswith("hot-") for n in runs):
    print("## One hot prefix\n")
    print("""40 requests/s: half share one system prompt (2,000 questions on it), half are the 150 groups above. Requests
finished per replica (all of them, hot and not), and each replica's waiting queue (sampled every second):
""")
    print("| | output tokens/s | TTFT p90 ms | engine cache hits | requests per replica | most waiting, per replica | waiting at the end |")
    print("|---|---:|---:|---:|---|---|---|")
    for p in ("prefix_aware", "least_loaded"):
        x = R.get(f"hot-{p}-40")
        if x:
            print(f"| {p} | {x['tok_s']:.0f} | {x['p90']:.0f} | {100 * x['hit']:.1f} % | {x['per_replica']} | "
                  f"{[int(v) for v in x['max_waiting']]} | {[int(v) for v in x['end_waiting']]} |")
    if "hot-prefix_aware-40" in R:
        x = R["hot-prefix_aware-40"]
        spread = min(x["per_replica"]) / max(x["per_replica"]) if max(x["per_replica"]) else 0
        bounded = max(x["end_waiting"] or [0]) <= 20
        measured["hot_spread"] = (spread >= 0.5 and bounded,
                                  f"fewest/most requests per replica {spread:.2f}; waiting at the end {[int(v) for v in x['end_waiting']]}")
    print()

if fleet:
    print("## Three gateways\n")
    print("The shared-prefix load through three gateways run as a fleet, requests taking them in turn; each indexes what"
          " it sent and what the others say they sent (a period late), and all send a prompt none has seen to its home"
          " replica (the same rendezvous hash of its first block).\n")
    for r in fleet:
        print(f"\n**{r} requests/s**\n\n{HEAD}")
        for p in ("prefix_aware", "exact", "least_loaded"):
            if f"fleet-{p}-{r}" in R:
                print(row(p, R[f"fleet-{p}-{r}"]))
    for mode in KEY:
        if not all(f"fleet-{p}-{r}" in R for p in (mode, "least_loaded") for r in fleet):
            continue
        j = against_least_loaded("fleet", mode, fleet)
        met = (j["tokens"][0] is not None and j["tokens"][0] >= 1.8 and j["ttft"][0] is True
               and j["hits"][0] is not None and j["hits"][0] >= 80)
        measured[f"fleet_{KEY[mode]}same_targets"] = (met, f"tokens/s {j['tokens'][1]}; TTFT p90 {j['ttft'][1]}; hits {j['hits'][1]}")
    print()

if os.path.exists(f"{work}/cost.md"):
    cost = open(f"{work}/cost.md").read().strip()
    print("## Decision cost\n")
    print("""`cargo run --release --example prefix_cost`, alone on the machine after the runs: 10,000 prompts of 10 blocks
indexed over four replicas, then 100,000 routing decisions for prompts drawn from them (the index lookup, the
ranking, the slot taken); hashing a prompt once is beside it, and the resident memory the index added per name.
""")
    print(cost + "\n")
    try:
        cells = [c.strip() for c in cost.splitlines()[2].strip("|").split("|")]
        p99 = float(cells[5])
        measured["decision_p99_us"] = (p99, f"{p99:.1f} µs")
    except (IndexError, ValueError):
        measured["decision_p99_us"] = (None, "not measured")

write_measured(work, measured)
