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

from admission_report import chart, class_row, load, median_worst, pct, timeline, window, write_checks  # beside this script

ENGINE = os.environ.get("LIMITS_ENGINE", "sim")
SHARE = os.environ.get("RESERVED_SHARE", "0.5")
if ENGINE == "llamacpp":
    FLEET = ("one replica of llama.cpp's server (`llama-server` from llama-cpp-python 0.3.36's llama.cpp, built from source) "
             "with 8 hard slots (`--parallel 8`, continuous batching, at most 32 tokens a step so prompts are prefilled in "
             "chunks) served first come first served, one CPU thread on a core of its own (the gateways and load generators "
             "on the other), a random-weight llama model 256 wide with 4 blocks. 128-token prompts, 64-256 output tokens "
             "(uniform, `ignore_eos`) per request. slogate: `engine: llamacpp` (waiting and running read from "
             "`llamacpp:requests_deferred` / `llamacpp:requests_processing`), no `upstream_priority` (the engine has none), "
             f"`tiers.interactive.reserved_share: {SHARE}`, `tiers.batch.queue_timeout: 2s`, and the `max_inflight_per_replica` "
             "named per run.")
    SCRIPT = "ENGINE=llamacpp loadtest/bench/limits.sh"
    FIXED, PROMPT, CAP, SLOTS = 8, 128, 16, "8 = the slots"
else:
    FLEET = ("two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each: 22 ms + 0.3 ms/seq decode "
             "steps, max_num_seqs 64, KV cache for ~65k tokens), `--max-num-batched-tokens 512`, `--scheduling-policy priority`; "
             "512-token prompts, 64-256 output tokens (uniform) per request. slogate: `upstream_priority: true`, "
             f"`tiers.interactive.reserved_share: {SHARE}`, `tiers.batch.queue_timeout: 2s`, and the `max_inflight_per_replica` "
             "named per run.")
    SCRIPT = "loadtest/bench/limits.sh"
    FIXED, PROMPT, CAP, SLOTS = 64, 512, 128, "64 = max_num_seqs"


def runs_of(d, prefix, suffix=".json"):
    """The run numbers N of the files DIR/PREFIX-N.json (or PREFIX.N-0.json), in order."""
    out = set()
    for f in os.listdir(d):
        if f.startswith(prefix) and f.endswith(suffix):
            n = f[len(prefix):-len(suffix)]
            if n.isdigit():
                out.add(int(n))
    return sorted(out)


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


def good(x):
    """Goodput of both classes, req/s."""
    return x["chat"]["goodput"] + x["batch"]["goodput"]


def done(x):
    """Completions of both classes, req/s."""
    return x["chat"]["throughput"] + x["batch"]["throughput"]


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
    labs = ("auto", "fixed", "none")
    runs = runs_of(d, "auto-")
    rows = {}
    for lab in labs:
        for i in runs:
            r = load(os.path.join(d, f"{lab}-{i}.json"))
            w, dur = window(r)
            rows[(lab, i)] = rows_of([x for x in r["records"] if w <= x["start_s"] < dur], dur - w)
    series = limit_chart(d, [f"{lab}-{runs[0]}" for lab in labs], "limits", "slots per run, and chat TTFT P99 as the gateway sees it")
    auto = [rows[("auto", i)] for i in runs]
    p, pw = median_worst([a["chat"]["p99"] for a in auto], max)
    w, ww = median_worst([a["chat"]["within"] for a in auto], min)
    g, gw = median_worst([good(a) for a in auto], min)
    learned = [row["replica_limits"] for row in series[f"auto-{runs[0]}"] if row["t"] >= 5]
    checks = [
        (f"auto: chat TTFT P99 <= 300 ms (median of {len(runs)}; worst run)", p <= 300, f"{p:.0f} ms (worst {pw:.0f} ms)"),
        ("auto: >= 99 % of chat within SLO (median; worst run)", w >= 0.99, f"{100 * w:.2f} % (worst {100 * ww:.2f} %)"),
        ("auto: goodput >= 90 % of C (median; worst run)", g >= 0.9 * C, f"{g:.2f} req/s = {100 * g / C:.0f} % of C (worst {100 * gw / C:.0f} %)"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Learned limits at 2x overload: auto against the hand-tuned limit and no limit\n\n")
        f.write(f"Machine: {machine}. Produced by `{SCRIPT} overload`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s** ({PROMPT}-token prompts, closed loop at {CAP}, 30 s after 10 s warm-up). "
                f"**Offered 2 C**: chat Poisson {0.4 * C:.2f} req/s, batch {1.6 * C:.2f} req/s in bursts of 8, {PROMPT}-token prompts, "
                "through three gateways in turn, each on fresh replicas: `auto` (learned, starting at 16 per replica), "
                f"`fixed` ({SLOTS}: the hand-tuned value) and `none` (4096). Measured from 5 s after start. "
                "Goodput = requests within their class's TTFT and ITL targets (chat 300/50 ms, batch 3000/200 ms) per second. "
                f"{len(runs)} runs of each, other seeds each time.\n\n")
        write_checks(f, checks)
        f.write(f"\nLearned slots (sum over the replicas, run {runs[0]}) from 5 s on: min {min(learned):.0f}, median "
                f"{pct(learned, 0.5):.0f}, max {max(learned):.0f}.\n\n## Side by side\n\n")
        table(f, [(f"{lab} {i}", rows[(lab, i)], C, "C") for lab in labs for i in runs])
        f.write(f"\nChart: `limits.svg` (run {runs[0]}: each limit's slots and the gateway's rolling chat TTFT P99).\n")
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
        f.write(f"Machine: {machine}. Produced by `{SCRIPT} {what}`.\n\n")
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
    runs = runs_of(d, "auto-")
    rates, chats = {}, {}
    for i in runs:
        r = load(os.path.join(d, f"auto-{i}.json"))
        _, dur = window(r)
        alone = [x for x in r["records"] if x["class"] == "batch" and x["outcome"] in ("ok", "length")
                 and 10 <= x["start_s"] + x["e2e_ms"] / 1000 < quiet]
        rates[i] = len(alone) / (quiet - 10)
        chats[i] = rows_of(between(r, quiet, dur), dur - quiet)["chat"]
    limit_chart(d, [f"auto-{i}" for i in runs], "limits", f"batch alone, chat from {quiet:.0f} s: slots and chat TTFT P99")
    r_med, r_worst = median_worst(list(rates.values()), min)
    p_med, p_worst = median_worst([x["p99"] for x in chats.values()], max)
    n = len(runs)
    checks = [
        (f"batch alone completes >= 90 % of C (median of {n} runs; worst run)", r_med >= 0.9 * C,
         f"{r_med:.2f} req/s = {100 * r_med / C:.0f} % of C (worst {100 * r_worst / C:.0f} %)"),
        (f"chat after 60 s of quiet: TTFT P99 <= 300 ms (median; worst run)", p_med <= 300,
         f"{p_med:.0f} ms (worst {p_worst:.0f} ms)"),
    ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Batch alone, then chat: the reservation is work-conserving\n\n")
        f.write(f"Machine: {machine}. Produced by `{SCRIPT} batch`.\n\n")
        f.write(f"**Fleet:** {FLEET}\n\n")
        f.write(f"C = {C:.2f} req/s (closed loop at twice the replicas' slots, chat alone, direct). Batch offered at 2 C "
                f"(bursts of 8) for the whole run, through `auto` (slogate's learned limit); chat at 0.4 C joins at "
                f"{quiet:.0f} s, after a quiet spell longer than the 30 s the reservation looks back. Batch's completions "
                f"are counted between 10 s and {quiet:.0f} s. {n} runs on fresh replicas and gateways, other seeds.\n\n")
        write_checks(f, checks)
        f.write("\n| run | batch alone req/s | % of C | chat requests | chat TTFT p50 / p99 ms | chat within SLO |\n")
        f.write("|---:|---:|---:|---:|---:|---:|\n")
        for i in runs:
            c = chats[i]
            f.write(f"| {i} | {rates[i]:.2f} | {100 * rates[i] / C:.0f} % | {c['requests']} | {c['p50']:.0f} / {c['p99']:.0f} | "
                    f"{100 * c['within']:.1f} % |\n")
        f.write("\nChart: `limits.svg` (each run's sum of the replicas' learned limits, and chat's TTFT P99).\n")
    print(open(os.path.join(d, "README.md")).read())


FLEET_RUNS = [
    ("alone", f"three gateways, each with the one-gateway limit ({FIXED}), no fleet"),
    ("fixed", f"fleet, the hand-tuned {FIXED} per replica shared"),
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


def kill_chart(d, run, kill_at):
    """Each gateway's slots over a kill run (their part of the replicas), and the fleet's limit."""
    series = [timeline(os.path.join(d, f"{run}-{i}-timeline.csv")) for i in range(3)]
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


def fleet_checks(runs, after, C):
    """Checks judged on the median over repeated runs, the worst run stated."""
    checks = []
    for v in ("even", "skewed"):
        if v not in runs:
            continue
        xs = list(runs[v].values())
        p, pw = median_worst([x["chat"]["p99"] for x in xs], max)
        w, ww = median_worst([x["chat"]["within"] for x in xs], min)
        g, gw = median_worst([good(x) for x in xs], min)
        t, tw = median_worst([done(x) for x in xs], min)
        checks += [
            (f"{v}: completes >= 85 % of C (median of {len(xs)}; worst run)", t >= 0.85 * C,
             f"{t:.2f} req/s = {100 * t / C:.0f} % of C (worst {100 * tw / C:.0f} %)"),
            (f"{v}: chat TTFT P99 <= 300 ms (median; worst run)", p <= 300, f"{p:.0f} ms (worst {pw:.0f} ms)"),
            (f"{v}: >= 99 % of chat within SLO (median; worst run)", w >= 0.99, f"{100 * w:.2f} % (worst {100 * ww:.2f} %)"),
            (f"{v}: goodput >= 85 % of C (median; worst run)", g >= 0.85 * C,
             f"{g:.2f} req/s = {100 * g / C:.0f} % of C (worst {100 * gw / C:.0f} %)"),
        ]
    if "even" in runs and "one" in runs:
        ew = median_worst([x["chat"]["within"] for x in runs["even"].values()], min)[0]
        ow = median_worst([x["chat"]["within"] for x in runs["one"].values()], min)[0]
        ep = median_worst([x["chat"]["p99"] for x in runs["even"].values()], max)[0]
        op = median_worst([x["chat"]["p99"] for x in runs["one"].values()], max)[0]
        checks += [
            ("even: chat within SLO at least one gateway's on the same load (medians)", ew >= ow,
             f"{100 * ew:.2f} % (one gateway: {100 * ow:.2f} %)"),
            ("even: chat TTFT P99 at most one gateway's on the same load (medians)", ep <= op,
             f"{ep:.0f} ms (one gateway: {op:.0f} ms)"),
        ]
    if after:
        xs = list(after.values())
        p, pw = median_worst([x["chat"]["p99"] for x in xs], max)
        w, ww = median_worst([x["chat"]["within"] for x in xs], min)
        checks += [
            ("kill: from 5 s after, chat TTFT P99 <= 300 ms (median; worst run)", p <= 300, f"{p:.0f} ms (worst {pw:.0f} ms)"),
            ("kill: from 5 s after, >= 99 % of chat within SLO (median; worst run)", w >= 0.99,
             f"{100 * w:.2f} % (worst {100 * ww:.2f} %)"),
        ]
    return checks


def cmd_fleet(d, C, machine, kill_at):
    C, kill_at = float(C), float(kill_at)
    variants = [(v, t) for v, t in FLEET_RUNS if runs_of(d, f"{v}.", "-0.json")]
    first = variants[0][0]
    _, dur = window(load(os.path.join(d, f"{first}.{runs_of(d, first + '.', '-0.json')[0]}-0.json")))
    runs = {v: {i: rows_of([x for x in gateways(d, f"{v}.{i}") if 5 <= x["start_s"] < dur], dur - 5)
                for i in runs_of(d, f"{v}.", "-0.json")} for v, _ in variants}
    after = {i: rows_of([x for x in gateways(d, f"kill.{i}", (0, 1)) if kill_at + 5 <= x["start_s"] < dur], dur - kill_at - 5)
             for i in runs.get("kill", {})}
    if after:
        kill_chart(d, f"kill.{min(after)}", kill_at)
    n = max(len(r) for r in runs.values())
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# Three gateways in front of the same replicas\n\n")
        f.write(f"Machine: {machine}. Produced by `{SCRIPT} fleet`.\n\n")
        f.write(f"**Fleet:** {FLEET} Three slogate instances, each listing all three admin listeners in `fleet.peers` "
                "(default period 100 ms, peer_timeout 1 s, takeover_after 3 s), one load generator per gateway.\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s.** Offered 2 C in all (chat 0.4 C Poisson, batch 1.6 C in bursts of 8; in `kill`, "
                "Poisson stages), split over the gateways as named. Measured from 5 s after start; "
                f"`kill` after: from {kill_at + 5:.0f} s (5 s after the kill), the two survivors' requests. Each run on fresh "
                f"replicas; {n} runs of each variant, other seeds each time.\n\n")
        f.write("Variants: " + "; ".join(f"`{r}`: {t}" for r, t in variants) + ".\n\n")
        write_checks(f, fleet_checks(runs, after, C))
        f.write("\n## Side by side\n\n")
        rows = [(f"{v} {i}", runs[v][i], C, "C") for v, _ in variants for i in runs[v]]
        rows += [(f"kill {i}, after", after[i], C, "C") for i in after]
        table(f, rows)
        if after:
            f.write("\nChart: `kill-slots.svg` (the first kill run: each gateway's `slogate_replica_slots`, summed over the "
                    "replicas, and the replicas' limit).\n")
    print(open(os.path.join(d, "README.md")).read())


def cmd_coldstart(d, machine):
    """A fresh gateway's first seconds: TTFT of the first round of 32 streams and of the whole run, auto vs fixed."""
    runs = runs_of(d, "auto-")
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
        f.write(f"Machine: {machine}. Produced by `{SCRIPT} coldstart`.\n\n")
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
