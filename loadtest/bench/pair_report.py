#!/usr/bin/env python3
"""Report of a paired run (loadtest/bench/pair.sh): one closed-loop stream
takes two targets in turn, in a "test" run (A vs B) and a "control" run (A vs
A'); per target: the path's share of TTFT and ITL (from the simulator's
stamps) and the gateway process's CPU per request.

    pair_report.py WORK MACHINE HZ ROUNDS SECS TITLE INTRO_FILE A B A2

Prints Markdown: INTRO_FILE's text, the table, then B minus A against the
control's A2 minus A."""
import json
import sys

from quantiles import pct, pct_pairs  # beside this script

work, machine, hz, rounds, secs, title, intro, a_name, b_name, a2_name = sys.argv[1:11]
hz, rounds = int(hz), int(rounds)


def side(run, idx, ticks):
    done = [r for r in run["records"] if r.get("target") == idx and r["outcome"] in ("ok", "length")]
    errors = sum(1 for r in run["records"] if r.get("target") == idx and r["outcome"] not in ("ok", "length"))
    path = [r["ttft_ms"] - r["engine_ttft_ms"] for r in done if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None]
    gaps = run.get("itl_by_target", {}).get("path_us", {}).get(str(idx), [])
    n = len(done)
    return {
        "n": n,
        "errors": errors,
        "ttft50": pct(path, 0.5),
        "ttft99": pct(path, 0.99),
        "itl99": pct_pairs(gaps, 0.99) / 1000 if gaps else float("nan"),
        "cpu_us": ticks * 1e6 / hz / n if n else float("nan"),
    }


rows = {"test": [], "control": []}
for kind in rows:
    for r in range(1, rounds + 1):
        run = json.load(open(f"{work}/{kind}-{r}.json"))
        ta, tb = map(int, open(f"{work}/{kind}-{r}.cpu").read().split())
        rows[kind].append((side(run, 0, ta), side(run, 1, tb)))

print(f"# {title}\n")
print(f"{machine}. Every figure below is from that run.\n")
print(open(intro).read().strip() + "\n")
print(f"Each run lasts {secs} s; CPU per request is a gateway process's CPU time over the run divided by the requests it")
print(f"completed (clock ticks of 1/{hz} s). Path TTFT is the client's TTFT minus the engine's share (the simulator's stamps);")
print("path ITL p99 is the same for the gaps.\n")
print("| run | round | target | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | gateway CPU us/request |")
print("|---|---|---|---|---|---|---|---|---|")
names = {"test": (a_name, b_name), "control": (a_name, a2_name)}
for kind, rs in rows.items():
    for i, (a, b) in enumerate(rs, 1):
        for name, s in zip(names[kind], (a, b)):
            print(f"| {kind} | {i} | {name} | {s['n']} | {s['errors']} | {s['ttft50']:.2f} | {s['ttft99']:.2f} | {s['itl99']:.2f} | {s['cpu_us']:.0f} |")


def mean_diff(kind, key):
    xs = [b[key] - a[key] for a, b in rows[kind]]
    return sum(xs) / len(xs)


print("\n## Result\n")
print(f"{b_name} minus {a_name}, mean of {rounds} rounds (control: {a2_name} minus {a_name}, the noise of this comparison):\n")
for key, what, unit, fmt in [
    ("cpu_us", "gateway CPU per request", "us", "{:+.0f}"),
    ("ttft50", "path TTFT p50", "ms", "{:+.3f}"),
    ("ttft99", "path TTFT p99", "ms", "{:+.3f}"),
    ("itl99", "path ITL p99", "ms", "{:+.3f}"),
]:
    t, c = fmt.format(mean_diff("test", key)), fmt.format(mean_diff("control", key))
    print(f"- {what}: **{t} {unit}** (control {c} {unit}).")
