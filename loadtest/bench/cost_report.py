#!/usr/bin/env python3
"""The report of loadtest/bench/cost.sh.

    cost_report.py WORK MACHINE CLK_TCK ROUNDS SECS CONNS STREAMS BUDGET.json

Exits 1 when allocations per request or per event exceed the budget by
more than its margin (the report says which).
"""
import csv
import json
import re
import statistics
import sys

work, machine, hz, rounds, secs, conns, streams, budget_file = sys.argv[1:9]
hz = int(hz)
rows = list(csv.DictReader(open(f"{work}/short.csv")))
PATHS = ["direct", "haproxy-tcp", "haproxy-http", "slogate"]
NAMES = {"direct": "direct to nginx", "haproxy-tcp": "HAProxy `mode tcp`", "haproxy-http": "HAProxy `mode http`", "slogate": "**slogate**"}


def runs(kind, path):
    out = []
    for r in rows:
        if r["kind"] == kind and r["path"] == path:
            n, s, t = int(r["requests"]), float(r["secs"]), int(r["ticks"])
            out.append({"rps": n / s, "cpu_us": t * 1e6 / hz / n if path != "direct" else None,
                        "p50": float(r["p50_ms"]), "p99": float(r["p99_ms"]), "bad": int(r["non2xx"]), "err": r["socket_errors"]})
    return out


def med(xs):
    return statistics.median(xs)


print(f"""# Cost per request

`loadtest/bench/cost.sh` ({machine}).

Short requests against nginx answering a fixed vLLM-shaped body with
Content-Length (an embeddings answer of 1,024 floats; a 64-token
non-streaming completion), sent by `wrk` at {conns} connections, keep-alive,
{secs} s a run; {rounds} rounds, the four paths interleaved within each. CPU per
request is the proxy's own user + system time from `/proc` over the run,
divided by the requests `wrk` counted. Medians over the rounds; the worst
round in brackets. slogate with a fixed limit (1,024) and no keys; HAProxy
2.6 from Debian with one thread per core. Every process shares both cores.
""")
verdicts = []
for kind in ["embeddings", "completions"]:
    print(f"## {kind}\n")
    print("| path | requests/s | CPU per request | p50 | p99 | errors |")
    print("|---|---:|---:|---:|---:|---:|")
    got = {}
    for path in PATHS:
        r = runs(kind, path)
        if not r:
            continue
        rps = [x["rps"] for x in r]
        cpu = [x["cpu_us"] for x in r if x["cpu_us"] is not None]
        got[path] = (med(rps), med(cpu) if cpu else None, min(rps), max(cpu) if cpu else None)
        cpu_s = f"{med(cpu):.1f} µs ({max(cpu):.1f})" if cpu else "-"
        bad = sum(x["bad"] for x in r)
        errs = "; ".join(sorted({x["err"] for x in r if x["err"]}))
        print(f"| {NAMES[path]} | {med(rps):,.0f} ({min(rps):,.0f}) | {cpu_s} | {med([x['p50'] for x in r]):.2f} ms | {med([x['p99'] for x in r]):.2f} ms | {bad}{' ' + errs if errs else ''} |")
    if "slogate" in got and "haproxy-http" in got:
        s, h = got["slogate"], got["haproxy-http"]
        cpu_ratio, rps_ratio = s[1] / h[1], s[0] / h[0]
        print(f"\nslogate against HAProxy `mode http`: **{cpu_ratio:.2f}x** the CPU per request (target at most 1.25x), "
              f"**{rps_ratio:.2f}x** the throughput (target at least 0.8x).\n")
        verdicts.append((kind, cpu_ratio, rps_ratio))

def metric_sum(path, name):
    total = 0.0
    for line in open(path):
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total

print("## Streams\n")
print(f"{streams} streams held open (a token every 100 ms each from the simulator, 100 tokens, closed loop, 10 s of warm-up and 25 s),")
print("through each path in turn, in front of the same simulator. CPU per event is the path's own CPU over its whole run over")
print("the content events its client received (each stream's own start and end spread over its 100 events).\n")
print("| path | content events | CPU | CPU per event |")
print("|---|---:|---:|---:|")
per_path = {}
for r in csv.DictReader(open(f"{work}/streams.csv")):
    recs = json.load(open(f"{work}/streams-{r['path']}.json"))["records"]
    events = sum(x.get("tokens") or 0 for x in recs)
    cpu = int(r["ticks"]) / hz
    per_path[r["path"]] = cpu * 1e6 / events if events else float("nan")
    print(f"| {NAMES[r['path']]} | {events:,} | {cpu:.1f} s | {per_path[r['path']]:.1f} µs |")
per_event = per_path.get("slogate", float("nan"))
floor = per_path.get("haproxy-tcp")
print(f"\nslogate: **{per_event:.1f} µs per streamed event** (target at most 5 µs)", end="")
if floor and "haproxy-http" in per_path:
    print(f", {per_event / per_path['haproxy-http']:.2f}x HAProxy `mode http`'s and {per_event / floor:.2f}x `mode tcp`'s", end="")
    if floor > 5:
        print(f", which relays the bytes and parses nothing: the target is below what such a relay spends on one read and one "
              f"write of each event on this machine ({floor:.1f} µs).\n")
    else:
        print(".\n")
else:
    print(".\n")
print("## Against the targets\n")
for kind, c, r in verdicts:
    print(f"- {kind}: CPU per request {c:.2f}x HAProxy `mode http`'s ({'met' if c <= 1.25 else 'not met'}), throughput {r:.2f}x ({'met' if r >= 0.8 else 'not met'}).")
print(f"- streams: {per_event:.1f} µs per event ({'met' if per_event <= 5 else 'not met'}).")


def allocs(name):
    blocks, nbytes, requests = map(int, open(f"{work}/{name}.allocs").read().split())
    return blocks, nbytes, requests


def events_of(path):
    return metric_sum(path, "slogate_inter_token_latency_seconds_count") + metric_sum(path, "slogate_time_to_first_token_seconds_count")


def heap_totals(path):
    pps = json.load(open(path))["pps"]
    # dhat: tbk is the allocations (blocks), tb their bytes.
    return sum(p["tbk"] for p in pps), sum(p["tb"] for p in pps)


budget = json.load(open(budget_file))
margin = budget["margin"]
measured = {}
for kind in ["embeddings", "completions"]:
    (k1, b1, r1), (k2, b2, r2) = allocs(f"heap-{kind}-short"), allocs(f"heap-{kind}-long")
    measured[kind] = ((k2 - k1) / (r2 - r1), (b2 - b1) / (r2 - r1))
(k1, b1), (k2, b2) = heap_totals(f"{work}/heap-streams-short.heap.json"), heap_totals(f"{work}/heap-streams-long.heap.json")
e1, e2 = events_of(f"{work}/heap-streams-short.metrics"), events_of(f"{work}/heap-streams-long.metrics")
measured["event"] = ((k2 - k1) / (e2 - e1), (b2 - b1) / (e2 - e1))
print("\n## Allocations (the gate)\n")
print("Counted by a gateway built with `--features heap-profile` (dhat): two runs of different lengths on fresh gateways, the")
print("difference in allocations over the difference in requests (or content events), so start-up and shutdown drop out.")
print(f"The run fails when a count exceeds its budget (`loadtest/bench/cost_budget.json`) by more than {margin:.0%}.\n")
print("| | allocations | bytes allocated | budget (allocations) | within |")
print("|---|---:|---:|---:|---|")
over = []
for key, label in [("embeddings", "per embeddings request"), ("completions", "per completion request"), ("event", "per streamed event (a stream's own start and end spread over its 100 events)")]:
    n, nb = measured[key]
    ok = n <= budget[key] * (1 + margin)
    if not ok:
        over.append(key)
    print(f"| {label} | {n:.1f} | {nb:,.0f} | {budget[key]} | {'yes' if ok else '**NO**'} |")
print(f"\nGate: {'passed' if not over else 'FAILED: ' + ', '.join(over)}.")
sys.exit(1 if over else 0)
