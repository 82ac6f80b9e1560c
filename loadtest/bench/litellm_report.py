#!/usr/bin/env python3
"""Report of one run of loadtest/bench/litellm.sh: slogate and LiteLLM's
proxy, each interleaved with the direct path (latency) and side by side
with it (throughput); what reaches the client; memory. Writes
DIR/report.md and DIR/measured.json (judged by loadtest/run).

    litellm_report.py DIR CLK_TCK LITELLM_VERSION
"""
import json
import os
import re
import sys

from report_common import write_measured  # beside this script

work, tck, version = sys.argv[1], int(sys.argv[2]), sys.argv[3]
GWS = ("slogate", "litellm")
NAMES = {"slogate": "slogate", "litellm": f"LiteLLM {version}"}
WARM = 5.0


def load(name):
    with open(f"{work}/{name}.json") as f:
        return json.load(f)


def pct(vals, q):
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(q * len(vals)))] if vals else float("nan")


def hpct(pairs, q):
    """Percentile in ms of (microseconds, count) pairs."""
    pairs = sorted(pairs)
    total, acc = sum(c for _, c in pairs), 0
    for v, c in pairs:
        acc += c
        if acc >= q * total:
            return v / 1000.0
    return float("nan")


def ok(x):
    return x["outcome"] in ("ok", "length")


def side(r, target):
    """One path of an interleaved run: its requests after the warm-up, TTFT and ITL as the client saw them."""
    recs = [x for x in r["records"] if x["start_s"] >= WARM and x.get("target") == target]
    t = [x["ttft_ms"] for x in recs if ok(x) and x["ttft_ms"] is not None]
    gaps = r.get("itl_by_target", {}).get("client_us", {}).get(str(target), [])
    return {"n": len(recs), "bad": sum(not ok(x) for x in recs), "ttft50": pct(t, 0.5), "ttft99": pct(t, 0.99), "itl50": hpct(gaps, 0.5), "itl99": hpct(gaps, 0.99)}


def extra(name, served):
    """The gateway's CPU per request it served (us) and the cores' busy shares (%) over a run."""
    ticks = int(open(f"{work}/{name}.cpu").read())
    c0, c1 = (float(v) * 100 for v in open(f"{work}/{name}.cores").read().split())
    return ticks / tck * 1e6 / max(1, served), c0, c1


# Fidelity.
def masked(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    text = re.sub(r'"(id)":"[^"]*"', r'"\1":"*"', text)
    return re.sub(r'"(created|sim_rx_ns|sim_t_ns)":\d+', r'"\1":0', text)


def fields(text):
    """Each event's JSON fields as dotted paths (with their null-ness), event by event."""
    def walk(v, at, acc):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{at}.{k}" if at else k, acc)
        elif isinstance(v, list):
            for x in v:
                walk(x, f"{at}[]", acc)
        else:
            acc.add(at + (" (null)" if v is None else ""))
        return acc
    evs = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [walk(json.loads(e), "", set()) if e.startswith("{") else {e} for e in evs]


def changes(a, b):
    fa, fb = fields(a), fields(b)
    gone = sorted(set().union(*fa) - set().union(*fb))
    new = sorted(set().union(*fb) - set().union(*fa))
    said = [f"{len(fa)} events from the replica, {len(fb)} to the client."]
    if gone:
        said.append("Fields the client never sees: " + ", ".join(f"`{x}`" for x in gone) + ".")
    if new:
        said.append("Fields the replica never sent: " + ", ".join(f"`{x}`" for x in new) + ".")
    return " ".join(said)


out, measured = [], {}
direct = masked(f"{work}/bytes-direct.txt")
out += ["**What reaches the client**: one 4-token chat stream by each path, compared with the replica's own (its `id` and `created` masked, as they differ per request):", ""]
for gw in GWS:
    got = masked(f"{work}/bytes-{gw}.txt")
    same = got == direct
    if gw == "slogate":
        measured["slogate_bytes_unchanged"] = (same, "unchanged" if same else changes(direct, got))
    if same:
        out.append(f"- {NAMES[gw]}: the replica's bytes, unchanged ({len(got)} bytes, {got.count('data: ')} events).")
    else:
        out.append(f"- {NAMES[gw]}: rewritten ({len(direct)} bytes from the replica, {len(got)} to the client, {got.count('data: ')} events). {changes(direct, got)}")
out += ["", "**Added latency, interleaved with the direct path** (the gateway's path minus the direct path in the same load):", "",
        "| gateway | streams per path | requests (gateway / direct) | failed (gateway / direct) | TTFT p50 ms (gateway / direct) | TTFT p99 ms | ITL p99 ms | gateway CPU per request | CPU 0 / CPU 1 busy |",
        "|---|---:|---|---|---|---|---|---:|---|"]
lat = {}
for gw in GWS:
    for c in (8, 32, 200):
        name = f"lat-{gw}-{c}"
        r = load(name)
        g, d = side(r, 0), side(r, 1)
        cpu, c0, c1 = extra(name, sum(x.get("target") == 0 for x in r["records"]))
        lat[(gw, c)] = {"p50": g["ttft50"] - d["ttft50"], "p99": g["ttft99"] - d["ttft99"], "itl99": g["itl99"] - d["itl99"], "cpu": cpu, "bad": g["bad"]}
        out.append(f"| {NAMES[gw]} | {c} | {g['n']} / {d['n']} | {g['bad']} / {d['bad']} | {g['ttft50']:.2f} / {d['ttft50']:.2f} | {g['ttft99']:.2f} / {d['ttft99']:.2f} | {g['itl99']:.3f} / {d['itl99']:.3f} | {cpu:.0f} us | {c0:.0f} % / {c1:.0f} % |")
out += ["", "| gateway | streams per path | added TTFT p50 ms | added TTFT p99 ms | added ITL p99 ms |", "|---|---:|---:|---:|---:|"]
out += [f"| {NAMES[gw]} | {c} | {x['p50']:+.3f} | {x['p99']:+.3f} | {x['itl99']:+.3f} |" for (gw, c), x in lat.items()]


def rps(r, cls):
    recs = [x for x in r["records"] if x["start_s"] >= WARM and x["stream"] == cls]
    return sum(ok(x) for x in recs) / (r["elapsed_s"] - WARM), sum(not ok(x) for x in recs)


out += ["", "**Streaming throughput, side by side**: N closed-loop streams through the gateway and N straight to the replica at the same time; the ratio is the gateway group's completed requests per second over the direct group's.", "",
        "| gateway | streams per path | direct req/s | gateway req/s | ratio | failed (gateway / direct) | gateway CPU per request | CPU 0 / CPU 1 busy |", "|---|---:|---:|---:|---:|---|---:|---|"]
tput = {}
for gw in GWS:
    for c in (32, 256):
        name = f"tput-{gw}-{c}"
        r = load(name)
        (g, gbad), (d, dbad) = rps(r, "gateway"), rps(r, "direct")
        cpu, c0, c1 = extra(name, sum(x["stream"] == "gateway" for x in r["records"]))
        tput[(gw, c)] = g / d if d else float("nan")
        out.append(f"| {NAMES[gw]} | {c} | {d:.0f} | {g:.0f} | {tput[(gw, c)]:.3f} | {gbad} / {dbad} | {cpu:.0f} us | {c0:.0f} % / {c1:.0f} % |")

idle = {gw: int(open(f"{work}/idle-{gw}.rss").read()) for gw in GWS}
peak = {gw: int(open(f"{work}/peak-{gw}.rss").read()) for gw in GWS}
out += ["", "| gateway | RSS idle | peak RSS over the latency loads |", "|---|---:|---:|"]
out += [f"| {NAMES[gw]} | {idle[gw] / 1024:.1f} MB | {peak[gw] / 1024:.1f} MB |" for gw in GWS]

s, l = lat[("slogate", 200)], lat[("litellm", 200)]
measured["slogate_added_ttft_p50_ms_200"] = (s["p50"], f"{s['p50']:+.3f} ms (LiteLLM {l['p50']:+.2f} ms)")
below = all(lat[("slogate", c)]["p50"] < lat[("litellm", c)]["p50"] for c in (8, 32, 200))
measured["slogate_below_litellm_ttft"] = (below, ", ".join(f"{c}: {lat[('slogate', c)]['p50']:+.3f} vs {lat[('litellm', c)]['p50']:+.2f} ms" for c in (8, 32, 200)))
measured["cpu_litellm_over_slogate_200"] = (l["cpu"] / s["cpu"], f"{l['cpu'] / s['cpu']:.0f}x ({l['cpu']:.0f} vs {s['cpu']:.0f} us)")
measured["slogate_tput_share_256"] = (tput[("slogate", 256)], f"{tput[('slogate', 256)]:.3f} (LiteLLM {tput[('litellm', 256)]:.3f})")
measured["idle_rss_litellm_over_slogate"] = (idle["litellm"] / idle["slogate"], f"{idle['litellm'] / idle['slogate']:.0f}x ({idle['litellm'] / 1024:.0f} vs {idle['slogate'] / 1024:.1f} MB)")
measured["slogate_failed"] = sum(lat[("slogate", c)]["bad"] for c in (8, 32, 200))
write_measured(work, measured)
open(os.path.join(work, "report.md"), "w").write("\n".join(out) + "\n")
