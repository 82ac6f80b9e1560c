"""The report of bench/independent.sh: aiperf's numbers beside slogate's own
for the same requests (its /metrics before and after the run).

    independent_report.py WORK MACHINE GENERATOR REQUESTS CONCURRENCY
"""
import json
import re
import sys

work, machine, generator, requests, concurrency = sys.argv[1:6]
SERIES = re.compile(r'^([\w:]+)\{([^}]*)\} (\S+)$')


def samples(path):
    out = {}
    for line in open(path):
        m = SERIES.match(line.strip())
        if m:
            labels = dict(kv.split("=", 1) for kv in re.findall(r'\w+="[^"]*"', m.group(2)))
            labels = {k: v.strip('"') for k, v in labels.items()}
            out[(m.group(1), tuple(sorted(labels.items())))] = float(m.group(3))
    return out


before, after = samples(f"{work}/before.prom"), samples(f"{work}/after.prom")
replica_before, replica_after = samples(f"{work}/replica-before.prom"), samples(f"{work}/replica-after.prom")


def delta(name, want=lambda l: True, b=None, a=None):
    b, a = (before, after) if b is None else (b, a)
    total = 0.0
    for (n, labels), v in a.items():
        if n == name and want(dict(labels)):
            total += v - b.get((n, labels), 0.0)
    return total


def buckets(name, b=None, a=None):
    """(upper bound, cumulative count) of `name`'s buckets, summed over series."""
    b, a = (before, after) if b is None else (b, a)
    by_le = {}
    for (n, labels), v in a.items():
        if n == name:
            le = dict(labels)["le"]
            by_le[le] = by_le.get(le, 0.0) + v - b.get((n, labels), 0.0)
    return sorted(((float("inf") if le == "+Inf" else float(le), c) for le, c in by_le.items()))


def quantile(q, bs):
    """histogram_quantile's linear interpolation inside the bucket."""
    total = bs[-1][1]
    rank, lo, below = q * total, 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / max(c - below, 1e-12))
        lo, below = le, c
    return lo


def bucket_of(v, bs):
    lo = 0.0
    for le, _ in bs:
        if v <= le:
            return (lo, le)
        lo = le
    return (lo, float("inf"))


a = json.load(open(f"{work}/aiperf/profile_export_aiperf.json"))
ttft = a["time_to_first_token"]
errors = sum(e.get("count", 0) for e in (a.get("error_summary") or []))
sent = a["request_count"]["avg"]
counted = delta("slogate_requests_total")
good = delta("slogate_requests_total", lambda l: l.get("outcome") in ("ok", "length"))
bs = buckets("slogate_time_to_first_token_seconds_bucket")
rows, checks = [], []
for q, key in [(0.5, "p50"), (0.99, "p99")]:
    theirs = ttft[key] / 1000.0
    ours = quantile(q, bs)
    b_theirs, b_ours = bucket_of(theirs, bs), bucket_of(ours, bs)
    same = b_theirs == b_ours
    rows.append(f"| TTFT {key} | {theirs * 1000:.2f} ms | {ours * 1000:.2f} ms (from its buckets) | {b_theirs[0] * 1000:g}-{b_theirs[1] * 1000:g} ms | {'same' if same else 'different'} |")
    checks.append((f"TTFT {key}: aiperf's value in the bucket of slogate's", same, f"{theirs * 1000:.2f} ms vs {ours * 1000:.2f} ms"))
mean_ours = delta("slogate_time_to_first_token_seconds_sum") / max(delta("slogate_time_to_first_token_seconds_count"), 1.0)
mean_theirs = ttft["avg"] / 1000.0
# The control: aiperf straight to one replica, against the simulator's own TTFT.
d = json.load(open(f"{work}/direct/profile_export_aiperf.json"))
rb, ra = replica_before, replica_after
sim_mean = delta("vllm:time_to_first_token_seconds_sum", b=rb, a=ra) / max(delta("vllm:time_to_first_token_seconds_count", b=rb, a=ra), 1.0)
direct_mean = d["time_to_first_token"]["avg"] / 1000.0
gap_gateway, gap_direct = mean_theirs - mean_ours, direct_mean - sim_mean
close = abs(gap_gateway - gap_direct) <= 0.002
rows.insert(0, f"| TTFT mean | {mean_theirs * 1000:.2f} ms | {mean_ours * 1000:.2f} ms (exact: its sum over its count) | | |")
sim_b = buckets("vllm:time_to_first_token_seconds_bucket", b=rb, a=ra)
control = (f"| control, straight to the replicas: TTFT p99 | {d['time_to_first_token']['p99']:.2f} ms | "
           f"{quantile(0.99, sim_b) * 1000:.2f} ms (the replicas' own, from their buckets) | {bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b)[0] * 1000:g}-{bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b)[1] * 1000:g} ms | {'same' if bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b) == bucket_of(quantile(0.99, sim_b), sim_b) else 'different'} |")
checks.insert(0, (
    "aiperf's TTFT over slogate's: what aiperf adds straight to the replicas, within 2 ms",
    close,
    f"through slogate: aiperf {mean_theirs * 1000:.2f} - slogate {mean_ours * 1000:.2f} = {gap_gateway * 1000:+.2f} ms; "
    f"straight to the replicas: aiperf {direct_mean * 1000:.2f} - the replicas' own {sim_mean * 1000:.2f} = {gap_direct * 1000:+.2f} ms",
))
checks.insert(0, ("every request aiperf sent counted once by slogate", counted == sent and errors == 0, f"aiperf {sent:.0f} sent ({errors} errors), slogate {counted:.0f} counted, {good:.0f} good"))

print("# An independent load generator against `slogate demo`\n")
print(f"{machine}. Produced by `loadtest/bench/independent.sh`.\n")
print(f"{generator} (NVIDIA's load generator, from PyPI, run offline with a word-level tokenizer) streams "
      f"{requests} chat completions at concurrency {concurrency} (64-word prompts, 32 output tokens) through "
      "`slogate demo` (two simulated vLLM replicas of an 8B model). Its own counts and TTFT are set beside "
      "slogate's `/metrics` for the same requests (read before and after the run; slogate's percentiles "
      "interpolated inside its histogram buckets, as Prometheus's `histogram_quantile` does). The control: "
      f"the same run straight to the two replicas in turn (the same load on each and on aiperf), set "
      "beside the simulators' own TTFT (`vllm:time_to_first_token_seconds`): what aiperf measures beyond the "
      "server there is aiperf's own time (its Python client on the same two cores), not the gateway's.\n")
print("## Checks\n")
print("| check | result | measured |\n|---|---|---|")
for name, ok, measured in checks:
    print(f"| {name} | {'met' if ok else '**not met**'} | {measured} |")
print("\n| measure | aiperf (client) | slogate (gateway) | bucket | same bucket |\n|---|---|---|---|---|")
for r in rows + [control]:
    print(r)
print(f"\naiperf's TTFT: mean {ttft['avg']:.2f} ms, p90 {ttft['p90']:.2f} ms, max {ttft['max']:.2f} ms. "
      "aiperf measures at the client; slogate where it hands the event to "
      "the client's socket. The bucket rows compare percentiles across bucket bounds that slogate's histograms "
      "share with every Prometheus user (its class targets and common bounds).")
