#!/usr/bin/env python3
"""Report of one run of loadtest/bench/cost.sh: short requests (requests/s,
CPU per request, p50/p99 per path), streams (CPU per event per path) and
allocations per request and per event. Writes DIR/report.md and
DIR/measured.json (judged by loadtest/run).

    cost_report.py DIR CLK_TCK STREAMS
"""
import csv
import json
import os
import sys

from report_common import write_measured  # beside this script
from quantiles import interleaved

d, hz, streams = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PATHS = ["direct", "haproxy-tcp", "haproxy-http", "slogate", "slogate-plain"]
NAMES = {"direct": "direct to nginx", "haproxy-tcp": "HAProxy `mode tcp`", "haproxy-http": "HAProxy `mode http`",
         "slogate": "**slogate** (release build)", "slogate-plain": "slogate, plain `cargo build --release`"}
KINDS = ["embeddings", "completions"]
out = open(os.path.join(d, "report.md"), "w")
measured = {}

short = {}
for r in csv.DictReader(open(os.path.join(d, "short.csv"))):
    n, s, t = int(r["requests"]), float(r["secs"]), int(r["ticks"])
    short[(r["kind"], r["path"])] = {"rps": n / s, "cpu_us": t * 1e6 / hz / n if r["path"] != "direct" and n else None,
                                     "p50": float(r["p50_ms"]), "p99": float(r["p99_ms"]), "bad": int(r["non2xx"]), "err": r["socket_errors"]}
errors = 0
for kind in KINDS:
    out.write(f"**{kind}**\n\n| path | requests/s | CPU per request | p50 | p99 | errors |\n|---|---:|---:|---:|---:|---:|\n")
    for path in PATHS:
        x = short.get((kind, path))
        if not x:
            continue
        errors += x["bad"] + (1 if x["err"] else 0)
        cpu = f"{x['cpu_us']:.1f} µs" if x["cpu_us"] is not None else "-"
        out.write(f"| {NAMES[path]} | {x['rps']:,.0f} | {cpu} | {x['p50']:.2f} ms | {x['p99']:.2f} ms | {x['bad']}{' ' + x['err'] if x['err'] else ''} |\n")
    s, h = short.get((kind, "slogate")), short.get((kind, "haproxy-http"))
    if s and h:
        p = short.get((kind, "slogate-plain"))
        plain = f"; plain build {p['cpu_us'] / h['cpu_us']:.2f}x" if p else ""
        for build, x, note in (("", s, plain), ("_plain", p, "")):
            if x:
                cpu, rps = x["cpu_us"] / h["cpu_us"], x["rps"] / h["rps"]
                measured[f"{kind}_cpu_vs_haproxy{build}"] = (cpu, f"{cpu:.2f}x ({x['cpu_us']:.1f} vs {h['cpu_us']:.1f} µs{note})")
                measured[f"{kind}_rps_vs_haproxy{build}"] = (rps, f"{rps:.2f}x ({x['rps']:,.0f} vs {h['rps']:,.0f}/s)")
    out.write("\n")


def metric_sum(path, name):
    total = 0.0
    for line in open(path):
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


out.write(f"**streams** ({streams} open)\n\n| path | content events | CPU | CPU per event |\n|---|---:|---:|---:|\n")
per_path = {}
for r in csv.DictReader(open(os.path.join(d, "streams.csv"))):
    recs = json.load(open(os.path.join(d, f"streams-{r['path']}.json")))["records"]
    events = sum(x.get("tokens") or 0 for x in recs)
    errors += sum(1 for x in recs if x["outcome"] not in ("ok", "length"))
    cpu = int(r["ticks"]) / hz
    per_path[r["path"]] = cpu * 1e6 / events if events else float("nan")
    out.write(f"| {NAMES[r['path']]} | {events:,} | {cpu:.1f} s | {per_path[r['path']]:.1f} µs |\n")
per_event = per_path.get("slogate", float("nan"))
rel = ""
if "haproxy-http" in per_path and "haproxy-tcp" in per_path:
    rel = f"; {per_event / per_path['haproxy-http']:.2f}x HAProxy `mode http`'s, {per_event / per_path['haproxy-tcp']:.2f}x `mode tcp`'s"
if "slogate-plain" in per_path:
    rel += f"; plain build {per_path['slogate-plain']:.1f} µs"
measured["event_cpu_us"] = (per_event, f"{per_event:.1f} µs{rel}")
if "haproxy-http" in per_path:
    ratio = per_event / per_path["haproxy-http"]
    plain_event = per_path.get("slogate-plain")
    extra = f"; plain build {plain_event / per_path['haproxy-http']:.2f}x" if plain_event else ""
    measured["event_cpu_vs_haproxy"] = (ratio, f"{ratio:.2f}x ({per_event:.1f} vs {per_path['haproxy-http']:.1f} µs{extra})")


def allocs(name):
    blocks, nbytes, requests = map(int, open(os.path.join(d, f"{name}.allocs")).read().split())
    return blocks, nbytes, requests


def heap_totals(path):
    pps = json.load(open(path))["pps"]
    # dhat: tbk is the allocations (blocks), tb their bytes.
    return sum(p["tbk"] for p in pps), sum(p["tb"] for p in pps)


def events_of(path):
    return metric_sum(path, "slogate_inter_token_latency_seconds_count") + metric_sum(path, "slogate_time_to_first_token_seconds_count")


out.write("\n**allocations** (the heap-profile build: the difference between a short and a long run, over the difference in "
          "requests or content events)\n\n| | allocations | bytes allocated |\n|---|---:|---:|\n")
for kind in KINDS:
    (k1, b1, r1), (k2, b2, r2) = allocs(f"heap-{kind}-short"), allocs(f"heap-{kind}-long")
    n, nb = (k2 - k1) / (r2 - r1), (b2 - b1) / (r2 - r1)
    measured[f"{kind}_allocs"] = (n, f"{n:.1f} ({nb:,.0f} bytes)")
    out.write(f"| per {kind} request | {n:.1f} | {nb:,.0f} |\n")
(k1, b1), (k2, b2) = heap_totals(os.path.join(d, "heap-streams-short.heap.json")), heap_totals(os.path.join(d, "heap-streams-long.heap.json"))
e1, e2 = events_of(os.path.join(d, "heap-streams-short.metrics")), events_of(os.path.join(d, "heap-streams-long.metrics"))
n, nb = (k2 - k1) / (e2 - e1), (b2 - b1) / (e2 - e1)
measured["event_allocs"] = (n, f"{n:.2f} ({nb:,.0f} bytes)")
out.write(f"| per streamed event (a stream's own start and end spread over its 100 events) | {n:.2f} | {nb:,.0f} |\n")


def callgrind(path):
    """A callgrind dump's totals, by event (Ir, I1mr, D1mr, ...)."""
    events = totals = None
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(x) for x in line.split()[1:]]
    return dict(zip(events or [], totals or []))


out.write("\n**instructions per request** (callgrind, with its simulation of this machine's first-level caches; "
          "wrk at 8 connections)\n\n| kind | path | requests | instructions | I1 misses | D1 misses |\n|---|---|---:|---:|---:|---:|\n")
cg = {}
for r in csv.DictReader(open(os.path.join(d, "instructions.csv"))):
    c, n = callgrind(r["file"]), int(r["requests"])
    x = {k: v / n for k, v in c.items()}
    cg[(r["kind"], r["proxy"])] = x
    out.write(f"| {r['kind']} | {NAMES[r['proxy']]} | {n:,} | {x['Ir']:,.0f} | {x.get('I1mr', 0):,.0f} | "
              f"{x.get('D1mr', 0) + x.get('D1mw', 0):,.0f} |\n")
for kind in KINDS:
    h = cg.get((kind, "haproxy-http"))
    for path, key in (("slogate", f"{kind}_instructions"), ("slogate-plain", f"{kind}_instructions_plain")):
        s = cg.get((kind, path))
        if s:
            rel = f"; {s['Ir'] / h['Ir']:.2f}x HAProxy `mode http`'s" if h else ""
            measured[key] = (s["Ir"], f"{s['Ir']:,.0f}{rel}")

lat = {n: json.load(open(os.path.join(d, f"lat-{n}.json"))) for n in ("ab", "haproxy-http", "haproxy-tcp", "aa")}
rows = [("slogate", interleaved(lat["ab"], 0)), ("direct", interleaved(lat["ab"], 1)),
        ("HAProxy `mode http`", interleaved(lat["haproxy-http"], 0)), ("direct", interleaved(lat["haproxy-http"], 1)),
        ("HAProxy `mode tcp`", interleaved(lat["haproxy-tcp"], 0)), ("direct", interleaved(lat["haproxy-tcp"], 1)),
        ("A/A: direct", interleaved(lat["aa"], 0)), ("A/A: direct again", interleaved(lat["aa"], 1))]
out.write("\n**latency at 32 streams a path** (slogate on its defaults, then HAProxy in its place, then both paths direct: "
          "one load each, its requests taking the two paths in turn; the path's share is the client's TTFT minus the engine's, "
          "the ITL shift the client's ITL p99 minus the replica's)\n\n"
          "| path | requests | failed | TTFT p50 | path's share of TTFT p50 | ITL p99 | ITL p99 shift |\n|---|---:|---:|---:|---:|---:|---:|\n")
for name, x in rows:
    errors += x["bad"]
    out.write(f"| {name} | {x['n']:,} | {x['bad']} | {x['ttft50']:.3f} ms | {x['path50']:.3f} ms | {x['itl99']:.3f} ms | {x['shift99']:+.3f} ms |\n")
# What each proxy adds over the direct path of its own load: (TTFT p50 share, ITL p99 shift).
added = [(rows[i][1]["path50"] - rows[i + 1][1]["path50"], rows[i][1]["shift99"] - rows[i + 1][1]["shift99"]) for i in (0, 2, 4, 6)]
(ttft, itl), (h_ttft, h_itl), (t_ttft, t_itl), (aa_ttft, aa_itl) = added
out.write(f"\nAdded TTFT p50: slogate {ttft:+.3f} ms, HAProxy `mode http` {h_ttft:+.3f}, `mode tcp` {t_ttft:+.3f} "
          f"(A/A {aa_ttft:+.3f}); added ITL p99: {itl:+.3f}, {h_itl:+.3f}, {t_itl:+.3f} ms (A/A {aa_itl:+.3f}).\n")
measured["added_ttft_p50_ms"] = (ttft, f"{ttft:+.3f} ms; HAProxy `mode http` {h_ttft:+.3f}, `mode tcp` {t_ttft:+.3f} (A/A control {aa_ttft:+.3f})")
measured["added_ttft_p50_over_haproxy_ms"] = (ttft - h_ttft, f"{ttft - h_ttft:+.3f} ms (slogate {ttft:+.3f}, HAProxy `mode http` {h_ttft:+.3f}; `mode tcp` {t_ttft:+.3f}, A/A control {aa_ttft:+.3f})")
measured["added_itl_p99_ms"] = (itl, f"{itl:+.3f} ms; HAProxy `mode http` {h_itl:+.3f}, `mode tcp` {t_itl:+.3f} (A/A control {aa_itl:+.3f})")
measured["errors"] = (errors, f"{errors}")
write_measured(d, measured)
