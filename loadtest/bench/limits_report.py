#!/usr/bin/env python3
"""Reports of loadtest/bench/limits.sh (learned limits, work-conserving reservation).

    limits_report.py overload DIR C MACHINE
    limits_report.py shift DIR C MACHINE HALF C2
    limits_report.py slow DIR C MACHINE HALF C2
    limits_report.py batch DIR C MACHINE QUIET
    limits_report.py fleet DIR C MACHINE KILL_AT
"""
import os
import sys

from admission_report import chart, class_row, load, pct, timeline, window, write_checks  # beside this script

FLEET = ("two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each: 22 ms + 0.3 ms/seq decode "
         "steps, max_num_seqs 64, KV cache for ~65k tokens), `--max-num-batched-tokens 512`, `--scheduling-policy priority`; "
         "64-256 output tokens (uniform) per request. slogate: `upstream_priority: true`, "
         "`tiers.interactive.reserved_share: 0.5`, `tiers.batch.queue_timeout: 2s`, and the `max_inflight_per_replica` named per run.")


def between(r, a, b):
    return [x for x in r["records"] if a <= x["start_s"] < b]


def rows_of(recs, span):
    return {c: class_row(recs, c, span) for c in ("chat", "batch")}


def table(f, runs):
    f.write("| run | class | requests | completed | 429 | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
    f.write("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for name, rows, C, cname in runs:
        for c in ("chat", "batch"):
            x = rows[c]
            f.write(f"| {name} | {c} | {x['requests']} | {x['done']} | {x['rejected']} | {x['failed']} | "
                    f"{x['p50']:.0f} / {x['p99']:.0f} | {100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
        g = rows["chat"]["goodput"] + rows["batch"]["goodput"]
        f.write(f"| {name} | **all** | | | | | | | **{g:.2f}** ({100 * g / C:.0f} % of {cname}) |\n")


def limit_chart(d, labels, stem, title):
    """Sum of the replicas' limits and the gateway's chat TTFT P99 over time, one series per run."""
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


def cmd_overload(d, C, machine):
    C = float(C)
    runs = {}
    for lab in ("auto", "fixed", "none"):
        r = load(os.path.join(d, f"{lab}.json"))
        w, dur = window(r)
        runs[lab] = rows_of([x for x in r["records"] if w <= x["start_s"] < dur], dur - w)
    series = limit_chart(d, ["auto", "fixed", "none"], "limits", "slots per run, and chat TTFT P99 as the gateway sees it")
    a = runs["auto"]
    good = a["chat"]["goodput"] + a["batch"]["goodput"]
    learned = [row["replica_limits"] for row in series["auto"] if row["t"] >= 5]
    checks = [
        ("auto: chat TTFT P99 <= 300 ms", a["chat"]["p99"] <= 300, f"{a['chat']['p99']:.0f} ms"),
        ("auto: >= 99 % of chat within SLO", a["chat"]["within"] >= 0.99, f"{100 * a['chat']['within']:.2f} %"),
        ("auto: goodput >= 90 % of C", good >= 0.9 * C, f"{good:.2f} req/s = {100 * good / C:.0f} % of C"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Learned limits at 2x overload: auto against the hand-tuned limit and no limit\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/limits.sh overload`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s** (512-token prompts, closed loop at 128, 30 s after 10 s warm-up). "
                f"**Offered 2 C**: chat Poisson {0.4 * C:.2f} req/s, batch {1.6 * C:.2f} req/s in bursts of 8, 512-token prompts, "
                "through three gateways in turn, each on fresh replicas: `auto` (learned, starting at 16 per replica), "
                "`fixed` (64 = max_num_seqs: the hand-tuned value) and `none` (4096). Measured from 5 s after start. "
                "Goodput = requests within their class's TTFT and ITL targets (chat 300/50 ms, batch 3000/200 ms) per second.\n\n")
        write_checks(f, checks)
        f.write(f"\nLearned slots (sum over both replicas) from 5 s on: min {min(learned):.0f}, median {pct(learned, 0.5):.0f}, "
                f"max {max(learned):.0f}.\n\n## Side by side\n\n")
        table(f, [(lab, runs[lab], C, "C") for lab in ("auto", "fixed", "none")])
        f.write("\nChart: `limits.svg` (each run's slots and the gateway's rolling chat TTFT P99).\n")
    print(open(os.path.join(d, "README.md")).read())


def capacity_change(d, C, machine, half, C2, what):
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
                  float("nan"))
    good = after["chat"]["goodput"] + after["batch"]["goodput"]
    ref_path = os.path.join(d, "chat-alone.json")
    ref = None
    if os.path.exists(ref_path):
        rr = load(ref_path)
        w, e = window(rr)
        ref = class_row([x for x in rr["records"] if w <= x["start_s"] < e], "chat", e - w)
    checks = [
        ("learned limits follow within 10 s", follow <= 10, f"{follow:.1f} s to the new level"),
        (">= 97 % of chat within SLO after that", after["chat"]["within"] >= 0.97, f"{100 * after['chat']['within']:.2f} %"),
        ("goodput >= 85 % of the new capacity", good >= 0.85 * C2, f"{good:.2f} req/s = {100 * good / C2:.0f} % of C2"),
    ]
    new_c2 = {"shift": f"with 1024-token prompts C2 = {C2:.2f} req/s (the KV cache, not max_num_seqs, now caps what a replica runs)",
              "slow": f"with the first replica's engine steps twice as long C2 = {C2:.2f} req/s (measured the same way)"}[what]
    at = {"shift": "every new request's prompt doubles",
          "slow": "the first replica's engine steps start taking twice as long (`POST /admin/faults {\"slowdown\": 2}`: a throttled "
                  "GPU); its decode gaps go to 2 x (22 ms + 0.3 ms/seq), past chat's 50 ms ITL target whatever it runs"}[what]
    title = {"shift": "Capacity changes mid-run: prompts double, the learned limits follow",
             "slow": "Capacity changes mid-run: one replica slows 2x, chat moves to the one that holds its ITL"}[what]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write(f"# {title}\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/limits.sh {what}`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"Capacity with 512-token prompts C = {C:.2f} req/s; {new_c2}. Offered 2 C (chat 0.4 C, batch 1.6 C) through "
                f"`auto`; at {half:.0f} s {at}. \"After\" is from {half + 10:.0f} s on.\n\n")
        write_checks(f, checks)
        f.write(f"\nLearned slots (sum over both replicas): {pct(pre, 0.5):.0f} (median of the 20 s before the change), "
                f"{level:.0f} (median after).\n\n## Before and after\n\n")
        table(f, [("before", before, C, "C"), ("after", after, C2, "C2")])
        if ref:
            f.write(f"\n**Reference: the same chat (0.4 C, 1024-token prompts) with no batch at all**, through `auto` on fresh "
                    f"replicas: {ref['done']} requests, TTFT p50 / p99 {ref['p50']:.0f} / {ref['p99']:.0f} ms, "
                    f"{100 * ref['within']:.2f} % within SLO: what chat gets on this fleet after the change with "
                    "nothing beside it. With 1024-token prompts a prefill takes three 512-token steps (less the "
                    "decodes' share of each step), so every batch prefill the replicas run delays the chat "
                    "prefills behind it by whole steps.\n")
        f.write("\nChart: `limits.svg`.\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_shift(d, C, machine, half, C2):
    capacity_change(d, C, machine, half, C2, "shift")


def cmd_slow(d, C, machine, half, C2):
    capacity_change(d, C, machine, half, C2, "slow")


def cmd_batch(d, C, machine, quiet):
    C, quiet = float(C), float(quiet)
    r = load(os.path.join(d, "auto.json"))
    _, dur = window(r)
    alone = [x for x in r["records"] if x["class"] == "batch" and x["outcome"] in ("ok", "length")
             and 10 <= x["start_s"] + x["e2e_ms"] / 1000 < quiet]
    rate = len(alone) / (quiet - 10)
    chat = rows_of(between(r, quiet, dur), dur - quiet)["chat"]
    limit_chart(d, ["auto"], "limits", f"batch alone, chat from {quiet:.0f} s: slots and chat TTFT P99")
    checks = [
        ("batch alone completes >= 90 % of C", rate >= 0.9 * C, f"{rate:.2f} req/s = {100 * rate / C:.0f} % of C"),
        ("chat after 60 s of quiet: TTFT P99 <= 300 ms", chat["p99"] <= 300, f"{chat['p99']:.0f} ms ({chat['done']} chat requests)"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Batch alone, then chat: the reservation is work-conserving\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/limits.sh batch`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"C = {C:.2f} req/s. Batch offered at 2 C (bursts of 8) for the whole run, through `auto`; chat at 0.4 C joins "
                f"at {quiet:.0f} s, after a quiet spell longer than the 30 s the reservation looks back. Batch's completions "
                f"are counted between 10 s and {quiet:.0f} s.\n\n")
        write_checks(f, checks)
        f.write(f"\nChat from {quiet:.0f} s: {chat['requests']} requests, TTFT p50 {chat['p50']:.0f} ms, p99 {chat['p99']:.0f} ms, "
                f"{100 * chat['within']:.1f} % within SLO.\n\nChart: `limits.svg`.\n")
    print(open(os.path.join(d, "README.md")).read())


FLEET_RUNS = [
    ("alone", "three gateways, each with the one-gateway limit (64), no fleet"),
    ("fixed", "fleet, the hand-tuned 64 per replica shared"),
    ("even", "fleet, auto, load 1/3 each"),
    ("one", "one gateway, auto, taking all three load generators' requests: `even`'s load exactly (the same seeds), "
            "the reference for what one gateway gets on it"),
    ("skewed", "fleet, auto, load 70/20/10"),
    ("kill", "fleet, auto, load 1/3 each; the third gateway killed halfway, its load moved to the others"),
]


def gateways(d, run, only=(0, 1, 2)):
    """The records of a run's gateways (one loadgen each, started together)."""
    recs = []
    for i in only:
        path = os.path.join(d, f"{run}-{i}.json")
        if os.path.exists(path):
            recs += [dict(x, gateway=i) for x in load(path)["records"]]
    return recs


def cmd_fleet(d, C, machine, kill_at):
    C, kill_at = float(C), float(kill_at)
    _, dur = window(load(os.path.join(d, "even-0.json")))
    runs = {run: rows_of([x for x in gateways(d, run) if 5 <= x["start_s"] < dur], dur - 5) for run, _ in FLEET_RUNS}
    after = rows_of([x for x in gateways(d, "kill", (0, 1)) if kill_at + 5 <= x["start_s"] < dur], dur - kill_at - 5)
    # Each gateway's slots over the kill run (their part of the replicas), and the fleet's limit.
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
    def good(x):
        return x["chat"]["goodput"] + x["batch"]["goodput"]
    checks = []
    for run in ("even", "skewed"):
        x = runs[run]
        checks += [
            (f"{run}: chat TTFT P99 <= 300 ms", x["chat"]["p99"] <= 300, f"{x['chat']['p99']:.0f} ms"),
            (f"{run}: >= 99 % of chat within SLO", x["chat"]["within"] >= 0.99, f"{100 * x['chat']['within']:.2f} %"),
            (f"{run}: goodput >= 85 % of C", good(x) >= 0.85 * C, f"{good(x):.2f} req/s = {100 * good(x) / C:.0f} % of C"),
        ]
    even, one = runs["even"]["chat"], runs["one"]["chat"]
    checks += [
        ("even: chat within SLO at least one gateway's on the same load", even["within"] >= one["within"],
         f"{100 * even['within']:.2f} % (one gateway: {100 * one['within']:.2f} %)"),
        ("even: chat TTFT P99 at most one gateway's on the same load", even["p99"] <= one["p99"],
         f"{even['p99']:.0f} ms (one gateway: {one['p99']:.0f} ms)"),
        ("kill: from 5 s after, chat TTFT P99 <= 300 ms", after["chat"]["p99"] <= 300, f"{after['chat']['p99']:.0f} ms"),
        ("kill: from 5 s after, >= 99 % of chat within SLO", after["chat"]["within"] >= 0.99, f"{100 * after['chat']['within']:.2f} %"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Three gateways in front of the same replicas\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/limits.sh fleet`.\n\n")
        f.write(f"**Fleet:** {FLEET} Three slogate instances, each listing all three admin listeners in `fleet.peers` "
                "(default period 100 ms, peer_timeout 1 s, takeover_after 3 s), one load generator per gateway.\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Offered 2 C in all (chat 0.4 C Poisson, batch 1.6 C in bursts of 8; in `kill`, "
                "Poisson stages), 512-token prompts, split over the gateways as named. Measured from 5 s after start; "
                f"`kill` after: from {kill_at + 5:.0f} s (5 s after the kill), the two survivors' requests. Each run on fresh replicas.\n\n")
        f.write("Runs: " + "; ".join(f"`{r}`: {t}" for r, t in FLEET_RUNS) + ".\n\n")
        write_checks(f, checks)
        f.write("\n## Side by side\n\n")
        table(f, [(run, runs[run], C, "C") for run, _ in FLEET_RUNS] + [("kill, after", after, C, "C")])
        f.write("\nChart: `kill-slots.svg` (each gateway's `slogate_replica_slots`, summed over the replicas, and the replicas' limit).\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_coldstart(d, machine):
    """A fresh gateway's first seconds: TTFT of the first round of 32 streams and of the whole run, auto vs fixed."""
    runs = sorted({f.split("-")[1].split(".")[0] for f in os.listdir(d) if f.startswith("auto-") and f.endswith(".json")}, key=int)
    rows = {}
    for v in ("auto", "fixed"):
        for i in runs:
            recs = load(os.path.join(d, f"{v}-{i}.json"))["records"]
            first = [x["ttft_ms"] for x in recs if x["start_s"] < 1.0 and x["ttft_ms"] is not None]
            early = [x["ttft_ms"] for x in recs if x["start_s"] < 2.0 and x["ttft_ms"] is not None]
            every = [x["ttft_ms"] for x in recs if x["ttft_ms"] is not None]
            queued = [x.get("queue_ms") or 0 for x in recs if x["start_s"] < 2.0]
            rows[(v, i)] = {"first_p99": pct(first, 0.99), "early_p99": pct(early, 0.99), "all_p99": pct(every, 0.99),
                            "queue_max": max(queued, default=0), "n": len(recs),
                            "failed": sum(1 for x in recs if x["outcome"] not in ("ok", "length"))}
    med = lambda v, k: sorted(rows[(v, i)][k] for i in runs)[len(runs) // 2]
    worst = lambda v, k: max(rows[(v, i)][k] for i in runs)
    diff = [rows[("auto", i)]["early_p99"] - rows[("fixed", i)]["early_p99"] for i in runs]
    d_med = sorted(diff)[len(diff) // 2]
    checks = [
        (f"first 2 s: auto's TTFT p99 within 5 ms of fixed's (median of {len(runs)} runs)", d_med <= 5.0,
         f"{d_med:+.1f} ms (worst run {max(diff):+.1f} ms)"),
        ("first 2 s: no request waits in the gateway's queue (every run)", max(rows[("auto", i)]["queue_max"] for i in runs) == 0,
         f"longest wait {max(rows[('auto', i)]['queue_max'] for i in runs):.0f} ms"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# A fresh gateway's first seconds: the learned limit does not queue what the replica could take\n\n")
        f.write(f"Machine: {machine}. Produced by `loadtest/bench/limits.sh coldstart`.\n\n")
        f.write("One simulated vLLM replica (`llama70b-fp8-h100`, `max_num_seqs` 64); a gateway started fresh for each run, "
                "then 32 concurrent streams at once (closed loop, 512-token prompts, 64-256 output tokens) for 10 s. `auto`: "
                "slogate's default, a learned limit from `learned_limit.initial: 16`, in slow start until the replica shows "
                f"a queue; `fixed`: `max_inflight_per_replica: 256`, more than enough. {len(runs)} runs of each, alternating.\n\n")
        write_checks(f, checks)
        f.write("\n| limit | run | requests | failed | TTFT p99 ms, first 1 s | first 2 s | whole run | longest queue wait in the first 2 s ms |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for v in ("auto", "fixed"):
            for i in runs:
                r = rows[(v, i)]
                f.write(f"| {v} | {i} | {r['n']} | {r['failed']} | {r['first_p99']:.0f} | {r['early_p99']:.0f} | {r['all_p99']:.0f} | {r['queue_max']:.0f} |\n")
            f.write(f"| {v} | median | | | {med(v, 'first_p99'):.0f} | {med(v, 'early_p99'):.0f} | {med(v, 'all_p99'):.0f} | {med(v, 'queue_max'):.0f} |\n")
    print(open(os.path.join(d, "README.md")).read())


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"overload": cmd_overload, "shift": cmd_shift, "slow": cmd_slow, "batch": cmd_batch, "fleet": cmd_fleet,
     "coldstart": cmd_coldstart}[cmd](*rest)
