"""Renders loadtest/bench/litellm.sh's raw results as Markdown.

Usage: litellm_report.py WORK MACHINE CLK_TCK PLACEMENT ROUNDS LITELLM_VERSION
"""
import json
import re
import statistics
import sys

work, machine, tck, placement, rounds, version = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
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


def mean_range(xs):
    return f"{statistics.mean(xs):+.3f} ({min(xs):+.3f} to {max(xs):+.3f})"


where = {"pinned": "Simulator and load generator on CPU 0, the gateway under test alone on CPU 1 (taskset); one gateway runs at a time, started anew for each round.",
         "shared": "All processes share both cores."}[placement]
out = [f"# slogate vs LiteLLM ({placement})", "",
       f"Machine: {machine}. slogate: release build. LiteLLM {version} (`litellm[proxy]` from PyPI), started as its docs do: `litellm --config` (one uvicorn worker), the replica as a `hosted_vllm/` model, `set_verbose: false`, `json_logs: true` and `LITELLM_LOG=ERROR` as its production page advises, no master key. {where} "
       f"Produced by `PLACEMENT={placement} loadtest/bench/litellm.sh`; {rounds} rounds, the gateways' order alternating between rounds.", ""]

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


direct = masked(f"{work}/bytes-direct.txt")
out += ["## What reaches the client", "", "One 4-token chat stream by each path, compared with the replica's own (its `id` and `created` masked, as they differ per request):", ""]
for gw in GWS:
    got = masked(f"{work}/bytes-{gw}.txt")
    if got == direct:
        out.append(f"- {NAMES[gw]}: the replica's bytes, unchanged ({len(got)} bytes, {got.count('data: ')} events).")
    else:
        out.append(f"- {NAMES[gw]}: rewritten ({len(direct)} bytes from the replica, {len(got)} to the client, {got.count('data: ')} events). {changes(direct, got)}")
out.append("")

# Latency.
out += ["## Added latency, interleaved with the direct path", "",
        "Each run is one group of closed-loop streams whose requests take the gateway and the direct path in turn (N in flight on each; every engine step 20 ms; 32-token prompts, 32-96 output tokens; the first 5 s left out), so both paths meet the same engine steps and the same load on the client's and replica's core. "
        "Numbers are as the client saw them (TTFT at the first content-bearing event), the gateway's path minus the direct path in the same run. "
        "A p99 rests on the requests of one path after the warm-up (the requests column): at 8 streams per path about a hundred per round, so its p99 is about the second-slowest request and moves by a millisecond between rounds. "
        "slogate's own targets are read in `overhead-pinned.md`, on thousands of requests with the engine's share of each TTFT and gap taken out. "
        "CPU per request is the gateway's user and system time over the run divided by the requests it served: at a few events per engine step each event wakes the gateway on its own, so slogate's time per request is highest at 8 streams and falls with load (about 180 us per 16-token request at 256 streams below). "
        "LiteLLM rebuilds every chunk and drops the simulator's time stamps, so the engine's share cannot be taken out here as `overhead.sh` does for slogate; interleaving keeps the engine's step phase the same on both paths.", "",
        "| gateway | streams per path | round | requests (gateway / direct) | failed (gateway / direct) | TTFT p50 ms (gateway / direct) | TTFT p99 ms | ITL p99 ms | gateway CPU per request | CPU 0 / CPU 1 busy |",
        "|---|---:|---:|---|---|---|---|---|---:|---|"]
lat = {}
for gw in GWS:
    for c in (8, 32, 200):
        for rnd in range(1, rounds + 1):
            name = f"lat-{gw}-{c}-{rnd}"
            r = load(name)
            g, d = side(r, 0), side(r, 1)
            cpu, c0, c1 = extra(name, sum(x.get("target") == 0 for x in r["records"]))
            lat.setdefault((gw, c), []).append({"p50": g["ttft50"] - d["ttft50"], "p99": g["ttft99"] - d["ttft99"], "itl99": g["itl99"] - d["itl99"], "cpu": cpu, "bad": g["bad"]})
            out.append(f"| {NAMES[gw]} | {c} | {rnd} | {g['n']} / {d['n']} | {g['bad']} / {d['bad']} | {g['ttft50']:.2f} / {d['ttft50']:.2f} | {g['ttft99']:.2f} / {d['ttft99']:.2f} | {g['itl99']:.3f} / {d['itl99']:.3f} | {cpu:.0f} us | {c0:.0f} % / {c1:.0f} % |")
out += ["", f"Added by each gateway (mean of {rounds} rounds, range in brackets):", "",
        "| gateway | streams per path | added TTFT p50 ms | added TTFT p99 ms | added ITL p99 ms | failed requests | CPU per request |", "|---|---:|---|---|---|---:|---:|"]
for (gw, c), xs in lat.items():
    out.append(f"| {NAMES[gw]} | {c} | {mean_range([x['p50'] for x in xs])} | {mean_range([x['p99'] for x in xs])} | {mean_range([x['itl99'] for x in xs])} | {sum(x['bad'] for x in xs)} | {statistics.mean(x['cpu'] for x in xs):.0f} us |")
out.append("")

# Throughput.
out += ["## Streaming throughput, side by side in one run", "",
        "Each run: N closed-loop streams through the gateway and N straight to the replica at the same time (every engine step 1 ms, 16 output tokens; the first 5 s left out); the ratio is the gateway group's completed requests per second over the direct group's. The group listed first starts first, so the order alternates between rounds.", "",
        "| gateway | streams per path | round | direct req/s | gateway req/s | ratio | failed (gateway / direct) | gateway CPU per request | CPU 0 / CPU 1 busy |", "|---|---:|---:|---:|---:|---:|---|---:|---|"]
tput = {}


def rps(r, cls):
    recs = [x for x in r["records"] if x["start_s"] >= WARM and x["stream"] == cls]
    return sum(ok(x) for x in recs) / (r["elapsed_s"] - WARM), sum(not ok(x) for x in recs)


for gw in GWS:
    for c in (32, 256):
        for rnd in range(1, rounds + 1):
            name = f"tput-{gw}-{c}-{rnd}"
            r = load(name)
            (g, gbad), (d, dbad) = rps(r, "gateway"), rps(r, "direct")
            cpu, c0, c1 = extra(name, sum(x["stream"] == "gateway" for x in r["records"]))
            ratio = g / d if d else float("nan")
            tput.setdefault((gw, c), []).append({"ratio": ratio, "cpu": cpu})
            out.append(f"| {NAMES[gw]} | {c} | {rnd} | {d:.0f} | {g:.0f} | {ratio:.3f} | {gbad} / {dbad} | {cpu:.0f} us | {c0:.0f} % / {c1:.0f} % |")
out += ["", "| gateway | streams per path | ratio to direct, mean (worst round) | CPU per request |", "|---|---:|---|---:|"]
for (gw, c), xs in tput.items():
    rs = [x["ratio"] for x in xs]
    out.append(f"| {NAMES[gw]} | {c} | {statistics.mean(rs):.3f} ({min(rs):.3f}) | {statistics.mean(x['cpu'] for x in xs):.0f} us |")
out.append("")

# Memory.
idle = [int(open(f"{work}/idle-{gw}.rss").read()) for gw in GWS]
peak = [max(int(v) for v in open(f"{work}/peak-{gw}.rss").read().split()) for gw in GWS]
out += ["## Memory", "", "| gateway | RSS idle | peak RSS over the latency runs (highest of the rounds) |", "|---|---:|---:|"]
out += [f"| {NAMES[gw]} | {idle[i] / 1024:.1f} MB | {peak[i] / 1024:.1f} MB |" for i, gw in enumerate(GWS)]
out.append("")

# Summary: how slogate compares.
s = {k: statistics.mean(x["itl99"] for x in v) for k, v in lat.items()}
t = {k: statistics.mean(x["p99"] for x in v) for k, v in lat.items()}
cpu = {k: statistics.mean(x["cpu"] for x in v) for k, v in lat.items()}
thr = {k: statistics.mean(x["ratio"] for x in v) for k, v in tput.items()}
out += ["## In short", ""]
p50 = {k: statistics.mean(x["p50"] for x in v) for k, v in lat.items()}
for c in (8, 32, 200):
    out.append(f"- {c} streams per path, added by LiteLLM: TTFT p50 {p50[('litellm', c)]:+.2f} ms, p99 {t[('litellm', c)]:+.2f} ms, ITL p99 {s[('litellm', c)]:+.2f} ms; by slogate: {p50[('slogate', c)]:+.3f}, {t[('slogate', c)]:+.3f} and {s[('slogate', c)]:+.3f} ms."
               + (" LiteLLM's core is saturated here (CPU 1 busy in the table above): requests queue inside it." if c > 8 else ""))
out += [f"- CPU per streamed request (32-96 tokens, 200 per path): LiteLLM {cpu[('litellm', 200)]:.0f} us, slogate {cpu[('slogate', 200)]:.0f} us ({cpu[('litellm', 200)] / cpu[('slogate', 200)]:.0f}x less).",
        f"- Throughput as a share of the direct path in the same run, 32 and 256 streams per path: LiteLLM {thr[('litellm', 32)]:.3f} and {thr[('litellm', 256)]:.3f}, slogate {thr[('slogate', 32)]:.3f} and {thr[('slogate', 256)]:.3f}.",
        f"- Memory idle: LiteLLM {idle[1] / 1024:.0f} MB, slogate {idle[0] / 1024:.1f} MB.", ""]
print("\n".join(out))
