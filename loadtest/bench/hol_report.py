#!/usr/bin/env python3
"""Report of loadtest/bench/hol.sh: the path's share of ITL p99 of the open
streams without large request bodies ("quiet"), with them sent straight to
their replica ("direct", the control) and through the gateway ("gateway").

    hol_report.py WORK MACHINE ROUNDS SECS STREAMS BULK_RATE HZ
"""
import json
import sys

from quantiles import pct_pairs  # beside this script

work, machine, rounds, secs, streams, bulk_rate, hz = sys.argv[1:8]
rounds, hz = int(rounds), int(hz)


def run(name):
    r = json.load(open(f"{work}/{name}.json"))
    cpu, reduced = map(int, open(f"{work}/{name}.extra").read().split())
    s = [x for x in r["records"] if x["stream"] == "s"]
    bulk = [x for x in r["records"] if x["stream"] == "bulk"]
    path = r.get("itl_path_us", {}).get("chat", [])
    client = r.get("itl_us", {}).get("chat", [])
    return {
        "streams_done": sum(1 for x in s if x["outcome"] in ("ok", "length")),
        "streams_failed": sum(1 for x in s if x["outcome"] not in ("ok", "length")),
        "gaps": sum(c for _, c in path),
        "path50": pct_pairs(path, 0.5) / 1000,
        "path99": pct_pairs(path, 0.99) / 1000,
        "client99": pct_pairs(client, 0.99) / 1000,
        "bulk": len(bulk),
        "bulk_ok": sum(1 for x in bulk if x["outcome"] in ("ok", "length")),
        "reduced": reduced,
        "mib": sum(x["prompt_tokens"] for x in bulk) * 4 / 2**20,
        "cpu_s": cpu / hz,
    }


KINDS = ("quiet", "direct", "gateway")
rows = [(i, {k: run(f"{k}-{i}") for k in KINDS}) for i in range(1, rounds + 1)]
print("# Head-of-line blocking: large request bodies against open streams\n")
print(f"{machine}. Every figure below is from that run (`loadtest/bench/hol.sh`).\n")
print(f"""Two simulated replicas, each its own engine: A serves the streams (20 ms steps, every event stamped), B the large
requests, so the two never share an engine step and any change in the streams' ITL is the gateway's. One gateway in
front of both. Each round has three runs of {secs} s, all with {streams} open chat streams on A through the gateway (closed
loop, 150-250 tokens each): "quiet" (nothing else), "direct" (plus {bulk_rate} requests a second whose bodies are about
4 MiB, a 9-message chat history, sent straight to B: the client writes them and B reads them, the gateway does not
see them; the control) and "gateway" (the same requests through the gateway). The large requests' class has a 1 ms
TTFT target, so context reduction is on for it: through the gateway each large body is read, parsed whole and
rewritten (oldest turns dropped) before it goes upstream. Path ITL is each gap as the client saw it minus the same
gap as the replica sent it (the stamps): the gateway's share, plus whatever the shared cores delay. The first 5 s of
each run are warm-up and not counted.
""")
print("| round | run | streams done | failed | gaps | path ITL p50 ms | path ITL p99 ms | client ITL p99 ms | large bodies | of them answered | rewritten (reduced) | MiB read | gateway CPU s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for i, r in rows:
    for name in KINDS:
        x = r[name]
        print(f"| {i} | {name} | {x['streams_done']} | {x['streams_failed']} | {x['gaps']} | {x['path50']:.3f} | {x['path99']:.3f} | {x['client99']:.2f} | {x['bulk']} | {x['bulk_ok']} | {x['reduced']} | {x['mib']:.0f} | {x['cpu_s']:.1f} |")


def diff(a, b):
    xs = [r[b]["path99"] - r[a]["path99"] for _, r in rows]
    return xs, sum(xs) / len(xs)


added, mean = diff("direct", "gateway")
total, total_mean = diff("quiet", "gateway")
machine_xs, machine_mean = diff("quiet", "direct")
print("\n## Result\n")
print(f"Path ITL p99 added by the gateway handling the large bodies (gateway minus direct): "
      f"{', '.join(f'{a:+.3f} ms' for a in added)} by round; mean **{mean:+.3f} ms**. Target: at most +1 ms: "
      f"**{'met' if mean <= 1.0 else 'not met'}**.\n")
print(f"For scale: the same bodies sent around the gateway (direct minus quiet: the client writing them and the replica "
      f"reading them on the same two cores) add {machine_mean:+.3f} ms; through the gateway, over quiet, {total_mean:+.3f} ms.")
