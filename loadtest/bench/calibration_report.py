"""Report of one run of loadtest/bench/calibrate.sh: DIR/report.md and
DIR/measured.json (judged by loadtest/run).

    calibration_report.py DIR SECS RATES CSECS CONCURRENCIES
"""
import json, os, sys, re
from report_common import write_measured  # beside this script
work, secs, rates, csecs, concs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), [int(c) for c in sys.argv[5].split()]
measured = {}
def load(n): return json.load(open(f"{work}/{n}.json"))
def pct(v, q):
    v = sorted(v); return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
def recs(r): return [x for x in r["records"] if x["start_s"] >= 5.0]
def ttfts(r, prompt=None): return [x["ttft_ms"] for x in recs(r) if x["ttft_ms"] is not None and (prompt is None or x["prompt_tokens"] == prompt)]
def itl_mean(r):
    pairs = [p for c in r["itl_us"].values() for p in c]; n = sum(c for _, c in pairs)
    return sum(v * c for v, c in pairs) / n / 1000.0 if n else float("nan")
def sim_hist(path, name):
    s = c = None; buckets = []
    for line in open(path):
        if line.startswith(name + "_sum"): s = float(line.split()[-1])
        elif line.startswith(name + "_count"): c = float(line.split()[-1])
        elif line.startswith(name + "_bucket"):
            le = re.search(r'le="([^"]+)"', line).group(1); buckets.append((float(le), float(line.split()[-1])))
    return s, c, buckets
L = [f"Closed-loop runs {csecs} s, open-loop runs {secs} s, the first 5 s left out of client statistics.", ""]
L += ["## 1. Client-side measurements agree with the simulator's own", "", "Same runs, whole-run means: loadgen (client, includes loopback HTTP and SSE parsing) vs the simulator's `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds` (engine side).", "",
      "| concurrency | TTFT mean client ms | TTFT mean engine ms | diff ms | ITL mean client ms | ITL mean engine ms | diff ms | requests client / engine |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
worst_t = worst_i = 0.0
for c in concs:
    r = load(f"c{c}"); allr = r["records"]
    t_client = sum(x["ttft_ms"] for x in allr if x["ttft_ms"] is not None) / max(1, sum(1 for x in allr if x["ttft_ms"] is not None))
    s, n, _ = sim_hist(f"{work}/c{c}.metrics", "vllm:time_to_first_token_seconds"); t_eng = s / n * 1000
    s2, n2, _ = sim_hist(f"{work}/c{c}.metrics", "vllm:inter_token_latency_seconds"); i_eng = s2 / n2 * 1000
    i_client = itl_mean(r)
    worst_t, worst_i = max(worst_t, abs(t_client - t_eng)), max(worst_i, abs(i_client - i_eng))
    L.append(f"| {c} | {t_client:.2f} | {t_eng:.2f} | {t_client - t_eng:+.2f} | {i_client:.2f} | {i_eng:.2f} | {i_client - i_eng:+.2f} | {len(allr)} / {int(n)} |")
measured["agree_ttft_ms"] = (worst_t, f"{worst_t:.2f} ms at worst")
measured["agree_itl_ms"] = (worst_i, f"{worst_i:.3f} ms at worst")
L += ["", "The engine counts a request when its first token is produced; a request still waiting at the end of the run is in neither column. Differences are the client's loopback and parsing time (fractions of a millisecond) plus requests in flight at the cut-off.", ""]
seed = {8: (45, 90, 2.0), 16: (52, 160, 3.1), 32: (68, 280, 4.1), 64: (95, 480, 5.1)}
def engine_rows(name):
    rows = {}
    for line in open(f"{work}/{name}"):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if f and f[0].isdigit(): rows[int(f[0])] = (int(f[1]), float(f[2]), float(f[3]))
    return rows
L += ["## 2. Batch interference (the default SLO table)", "",
      "The published reference (70B FP8 on an H100, 512-token prompts) has P99/P50 TTFT rising from 2.0 at 8 concurrent requests to 5.1 at 64, and says where the tail comes from: \"a long-prompt request hitting the queue at the same time as multiple concurrent short requests\", which \"monopolizes prefill capacity for 200-400 ms\". Two workloads, each measured twice: closed loop through loadgen over HTTP, and the engine alone on paused time (`examples/interference.rs`, 20 simulated minutes per level, so the P99 rests on thousands of requests instead of a few hundred).", "",
      "- **512 only**: every prompt 512 tokens. The tail comes only from 512-token prefills arriving together; it grows with concurrency, but stays near 2x.",
      "- **512 + 5 % long**: 5 % of requests carry a 4096-token prompt (320 ms of prefill on this profile, 200-400 ms as published for such prompts); the table is the TTFT of the 512-token requests only. This is the published mechanism and its magnitude.", "",
      "| concurrent requests | published P50 / P99 ms (ratio) | 512 only, loadgen: P50 / P99 ms (ratio) | 512 only, engine | 512 + 5 % long, loadgen: 512-token requests | 512 + 5 % long, engine |", "|---:|---|---|---|---|---|"]
e512, emix = engine_rows("engine-512.md"), engine_rows("engine-mix.md")
def cell(t, n=None):
    p50, p99 = pct(t, .5), pct(t, .99)
    return f"{p50:.0f} / {p99:.0f} ({p99 / p50:.2f}, n={len(t) if n is None else n})"
for c in concs:
    s0 = seed[c]
    a = ttfts(load(f"c{c}")); b = ttfts(load(f"m{c}"), 512)
    ea, eb = e512[c], emix[c]
    L.append(f"| {c} | {s0[0]} / {s0[1]} ({s0[2]}) | {cell(a)} | {ea[1]:.0f} / {ea[2]:.0f} ({ea[2] / ea[1]:.2f}, n={ea[0]}) | {cell(b)} | {eb[1]:.0f} / {eb[2]:.0f} ({eb[2] / eb[1]:.2f}, n={eb[0]}) |")
lo8 = [pct(ttfts(load("m8"), 512), .99) / pct(ttfts(load("m8"), 512), .5), emix[8][2] / emix[8][1]]
hi64 = [pct(ttfts(load("m64"), 512), .99) / pct(ttfts(load("m64"), 512), .5), emix[64][2] / emix[64][1]]
rising = all(emix[a][2] / emix[a][1] < emix[b][2] / emix[b][1] for a, b in zip(concs, concs[1:]))
ratios = ", ".join(f"{emix[c][2] / emix[c][1]:.2f}" for c in concs)
measured["mix_ratio_rises"] = (rising, f"engine P99/P50 at {', '.join(map(str, concs))}: {ratios}")
measured["mix_ratio_low"] = (emix[concs[0]][2] / emix[concs[0]][1], f"{emix[concs[0]][2] / emix[concs[0]][1]:.2f} at {concs[0]} (published 2.0)")
measured["mix_ratio_high"] = (emix[concs[-1]][2] / emix[concs[-1]][1], f"{emix[concs[-1]][2] / emix[concs[-1]][1]:.2f} at {concs[-1]} (published 5.1)")
L += ["", f"With the published mechanism the P99/P50 ratio goes from {min(lo8):.1f}-{max(lo8):.1f} at 8 concurrent requests to {min(hi64):.1f}-{max(hi64):.1f} at 64 (published: 2.0 to 5.1); on the engine it rises at every step ({'yes' if rising else 'NO'}): the shape of the default SLO table. The P99 is near a 400 ms target at 32 and past it at 64, where the published table puts the edge. "
      f"With identical 512-token prompts the ratio rises only from {e512[8][2] / e512[8][1]:.2f} to {e512[64][2] / e512[64][1]:.2f} (engine): a collision between equal short prefills costs one more prefill, not a long one.", "", "P50 is one prefill plus the wait for the step in progress (ours is higher than the published figures at low concurrency: a decode step here is 22-25 ms, which a newly arrived request waits out). A loadgen P99 rests on the slowest 1 % of a few hundred to two thousand requests, so it moves by a step time (25-45 ms) from run to run; the engine columns are the stable numbers.", ""]
L += ["", "## 3. Capacity knee (open loop, Poisson)", "", f"Requests sent between 5 s and {secs} s; rates are per second of that window (every request runs to completion after it).", "",
      "| offered req/s | completed req/s | goodput req/s, TTFT <= 300 ms | goodput req/s, TTFT <= 300 ms and ITL <= 50 ms | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | timeouts |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
for rate in rates:
    r = load(f"r{rate}"); rs = [x for x in recs(r) if x["start_s"] < secs]; span = secs - 5
    ok = [x for x in rs if x["outcome"] in ("ok", "length")]
    good_ttft = [x for x in ok if x["ttft_ms"] is not None and x["ttft_ms"] <= 300]
    good = [x for x in good_ttft if x["itl_over"] <= x["gaps"] // 100]
    t = [x["ttft_ms"] for x in ok if x["ttft_ms"] is not None]
    pairs = sorted(p for c in r["itl_us"].values() for p in c); tot = sum(c for _, c in pairs); acc = 0; i99 = float("nan")
    for v, c in pairs:
        acc += c
        if acc >= .99 * tot: i99 = v / 1000; break
    late = sum(1 for x in rs if x["outcome"] == "timeout")
    L.append(f"| {rate} | {len(ok) / span:.2f} | {len(good_ttft) / span:.2f} | {len(good) / span:.2f} | {pct(t, .5):.0f} | {pct(t, .99):.0f} | {i99:.1f} | {late} |")
L += ["", "Charts of the highest offered load: `r*-ttft-cdf.svg`, `r*-ttft-p99.svg`, `r*-throughput.svg` (run 1's).", ""]
open(os.path.join(work, "report.md"), "w").write("\n".join(L))
write_measured(work, measured)
