"""Report of one run of loadtest/bench/independent.sh: aiperf's numbers
beside slogate's own for the same requests (its /metrics before and after
the run). Writes DIR/report.md and DIR/measured.json (judged by
loadtest/run).

    independent_report.py DIR GENERATOR
"""
import json
import os
import sys

from report_common import write_measured  # beside this script
from prom import bucket_of, quantile, samples
from prom import buckets as buckets_between
from prom import delta_of

work, generator = sys.argv[1:3]
before, after = samples(f"{work}/before.prom"), samples(f"{work}/after.prom")
replica_before, replica_after = samples(f"{work}/replica-before.prom"), samples(f"{work}/replica-after.prom")


def delta(name, want=lambda l: True, b=None, a=None):
    b, a = (before, after) if b is None else (b, a)
    return delta_of(b, a, name, want)


def buckets(name, b=None, a=None):
    b, a = (before, after) if b is None else (b, a)
    return buckets_between(b, a, name)


a = json.load(open(f"{work}/aiperf/profile_export_aiperf.json"))
ttft = a["time_to_first_token"]
errors = sum(e.get("count", 0) for e in (a.get("error_summary") or []))
sent = a["request_count"]["avg"]
counted = delta("slogate_requests_total")
good = delta("slogate_requests_total", lambda l: l.get("outcome") in ("ok", "length"))
bs = buckets("slogate_time_to_first_token_seconds_bucket")
rows, measured = [], {}
for q, key in [(0.5, "p50"), (0.99, "p99")]:
    theirs = ttft[key] / 1000.0
    ours = quantile(q, bs)
    b_theirs, b_ours = bucket_of(theirs, bs), bucket_of(ours, bs)
    same = b_theirs == b_ours
    rows.append(f"| TTFT {key} | {theirs * 1000:.2f} ms | {ours * 1000:.2f} ms (from its buckets) | {b_theirs[0] * 1000:g}-{b_theirs[1] * 1000:g} ms | {'same' if same else 'different'} |")
    measured[f"{key}_same_bucket"] = (same, f"{theirs * 1000:.2f} ms vs {ours * 1000:.2f} ms")
mean_ours = delta("slogate_time_to_first_token_seconds_sum") / max(delta("slogate_time_to_first_token_seconds_count"), 1.0)
mean_theirs = ttft["avg"] / 1000.0
# The control: aiperf straight to one replica, against the simulator's own TTFT.
d = json.load(open(f"{work}/direct/profile_export_aiperf.json"))
rb, ra = replica_before, replica_after
sim_mean = delta("vllm:time_to_first_token_seconds_sum", b=rb, a=ra) / max(delta("vllm:time_to_first_token_seconds_count", b=rb, a=ra), 1.0)
direct_mean = d["time_to_first_token"]["avg"] / 1000.0
gap_gateway, gap_direct = mean_theirs - mean_ours, direct_mean - sim_mean
rows.insert(0, f"| TTFT mean | {mean_theirs * 1000:.2f} ms | {mean_ours * 1000:.2f} ms (exact: its sum over its count) | | |")
sim_b = buckets("vllm:time_to_first_token_seconds_bucket", b=rb, a=ra)
control = (f"| control, straight to the replicas: TTFT p99 | {d['time_to_first_token']['p99']:.2f} ms | "
           f"{quantile(0.99, sim_b) * 1000:.2f} ms (the replicas' own, from their buckets) | {bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b)[0] * 1000:g}-{bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b)[1] * 1000:g} ms | {'same' if bucket_of(d['time_to_first_token']['p99'] / 1000, sim_b) == bucket_of(quantile(0.99, sim_b), sim_b) else 'different'} |")
measured["gap_difference_ms"] = (
    abs(gap_gateway - gap_direct) * 1000,
    f"through slogate: aiperf {mean_theirs * 1000:.2f} - slogate {mean_ours * 1000:.2f} = {gap_gateway * 1000:+.2f} ms; "
    f"straight to the replicas: aiperf {direct_mean * 1000:.2f} - the replicas' own {sim_mean * 1000:.2f} = {gap_direct * 1000:+.2f} ms",
)
measured["counted_once"] = (counted == sent and errors == 0, f"aiperf {sent:.0f} sent ({errors} errors), slogate {counted:.0f} counted, {good:.0f} good")
write_measured(work, measured)

with open(os.path.join(work, "report.md"), "w") as f:
    f.write(f"Load generator: {generator}.\n\n")
    f.write("| measure | aiperf (client) | slogate (gateway) | bucket | same bucket |\n|---|---|---|---|---|\n")
    for r in rows + [control]:
        f.write(r + "\n")
    f.write(f"\naiperf's TTFT: mean {ttft['avg']:.2f} ms, p90 {ttft['p90']:.2f} ms, max {ttft['max']:.2f} ms.\n")
