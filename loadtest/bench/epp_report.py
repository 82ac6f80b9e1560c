#!/usr/bin/env python3
"""Report of one run of loadtest/bench/epp.sh: six paths taken in turn by
one load (direct; one Envoy's round robin, floor picker, slogate as the
picker and floor picker again; slogate's proxy); per path the share of
TTFT and ITL the path adds (from the simulator's stamps) and the CPU per
request of its processes (the shared Envoy's per request over its four
paths, plus the path's picker); slogate's decision time. Writes
DIR/report.md and DIR/measured.json.

    epp_report.py DIR HZ
"""
import json
import os
import sys

from report_common import measured as in_window, write_measured  # beside this script
from prom import bucket_of, buckets, quantile, samples
from quantiles import pct, pct_pairs

d, hz = sys.argv[1], int(sys.argv[2])
PATHS = ["direct", "Envoy, round robin", "Envoy + floor picker", "Envoy + slogate as the picker", "slogate's proxy", "control: Envoy + floor picker again"]
run = json.load(open(os.path.join(d, "paths.json")))
ticks = list(map(int, open(os.path.join(d, "paths.cpu")).read().split()))
# Ticks over the load: the shared Envoy, the floor picker, slogate as the picker, slogate's proxy.
envoy_t, floor_t, picker_t, proxy_t = (ticks[4 + i] - ticks[i] for i in range(4))


def done_on(idx):
    return [r for r in run["records"] if r.get("target") == idx and r["outcome"] in ("ok", "length")]


ENVOY_PATHS = (1, 2, 3, 5)
us = lambda t, n: t * 1e6 / hz / n if n else float("nan")
envoy_us = us(envoy_t, sum(len(done_on(i)) for i in ENVOY_PATHS))
floor_us = us(floor_t, len(done_on(2)) + len(done_on(5)))
cpu = {1: envoy_us, 2: envoy_us + floor_us, 3: envoy_us + us(picker_t, len(done_on(3))), 4: us(proxy_t, len(done_on(4))), 5: envoy_us + floor_us}


def side(idx):
    recs = [r for r in run["records"] if r.get("target") == idx]
    done = [r for r in recs if r["outcome"] in ("ok", "length")]
    # The TTFT shares over the measured window: the warmup's first wave (every stream at once) left out.
    timed = [r for r in in_window(run) if r.get("target") == idx and r["outcome"] in ("ok", "length")]
    path = [r["ttft_ms"] - r["engine_ttft_ms"] for r in timed if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None]
    gaps = run.get("itl_by_target", {}).get("path_us", {}).get(str(idx), [])
    n = len(done)
    return {
        "n": n,
        "errors": len(recs) - n,
        "ttft50": pct(path, 0.5),
        "ttft99": pct(path, 0.99),
        "itl99": pct_pairs(gaps, 0.99) / 1000 if gaps else float("nan"),
        "cpu_us": cpu.get(idx, float("nan")),
    }


rows = [side(i) for i in range(len(PATHS))]
floor, epp, floor2 = rows[2], rows[3], rows[5]
control = (floor2["ttft50"] - floor["ttft50"], floor2["ttft99"] - floor["ttft99"])
before, after = samples(os.path.join(d, "before.prom")), samples(os.path.join(d, "after.prom"))
bs = buckets(before, after, "slogate_epp_decision_seconds_bucket")
decided = bs[-1][1] if bs else 0
d50, d99 = (quantile(0.5, bs) * 1000, quantile(0.99, bs) * 1000) if decided else (float("nan"), float("nan"))
measured = {
    "epp_over_floor_ttft50_ms": (epp["ttft50"] - floor["ttft50"], f"{epp['ttft50'] - floor['ttft50']:+.3f} ms ({epp['ttft50']:.3f} vs {floor['ttft50']:.3f}; control {control[0]:+.3f})"),
    "epp_over_floor_ttft99_ms": (epp["ttft99"] - floor["ttft99"], f"{epp['ttft99'] - floor['ttft99']:+.3f} ms ({epp['ttft99']:.3f} vs {floor['ttft99']:.3f}; control {control[1]:+.3f})"),
    "errors": (sum(r["errors"] for r in rows), f"{sum(r['errors'] for r in rows)} of {sum(r['n'] + r['errors'] for r in rows)}"),
}
# The picker serves only its path: its TTFT histogram over the run against
# the client's own TTFT of the same requests.
tb = buckets(before, after, "slogate_time_to_first_token_seconds_bucket")
client = [r["ttft_ms"] / 1000 for r in run["records"] if r.get("target") == 3 and r["outcome"] in ("ok", "length") and r["ttft_ms"] is not None]
if tb and client:
    theirs, ours = pct(client, 0.5), quantile(0.5, tb)
    same = bucket_of(theirs, tb) == bucket_of(ours, tb)
    lo, hi = bucket_of(theirs, tb)
    measured["epp_ttft_p50_same_bucket"] = (same, f"the client's {theirs * 1000:.2f} ms, slogate's {ours * 1000:.2f} ms (bucket {lo * 1000:g}-{hi * 1000:g} ms)")
write_measured(d, measured)
envoy = open(os.path.join(d, "envoy.version")).read().strip()
with open(os.path.join(d, "report.md"), "w") as f:
    f.write(f"Envoy {envoy}, one process with two workers for its four paths. One load, the paths taken in turn; the TTFT shares are over the requests sent after the warmup, the other columns over all.\n\n")
    f.write("| path | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | CPU us/request (its processes) |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|\n")
    for name, r in zip(PATHS, rows):
        c = "" if r["cpu_us"] != r["cpu_us"] else f"{r['cpu_us']:.0f}"
        f.write(f"| {name} | {r['n']} | {r['errors']} | {r['ttft50']:.3f} | {r['ttft99']:.3f} | {r['itl99']:.3f} | {c} |\n")
    f.write(f"\nCPU per request: the Envoy paths' is Envoy's own, {envoy_us:.0f} us (over its four paths' requests), plus their picker's (the floor picker's over its two paths').\n")
    f.write(f"\nslogate's decision time (`slogate_epp_decision_seconds`, {decided:.0f} decisions): p50 {d50:.3f} ms, p99 {d99:.3f} ms.\n")
    f.write(f"\nThe floor picker over Envoy's round robin: TTFT p50 {floor['ttft50'] - rows[1]['ttft50']:+.3f} ms, p99 {floor['ttft99'] - rows[1]['ttft99']:+.3f} ms.\n")
    f.write(f"slogate as the picker over the floor: TTFT p50 **{measured['epp_over_floor_ttft50_ms'][1]}**, p99 **{measured['epp_over_floor_ttft99_ms'][1]}** (control: the floor path twice, its second over its first).\n")
