#!/usr/bin/env python3
"""Reports of loadtest/bench/admission.sh, one run each: reads the loadgen
results, the gateway's admission timeline and log, writes DIR/report.md and
DIR/measured.json (the values the scenario file's checks judge; the runner,
loadtest/run, judges them) and draws the timeline charts.

    admission_report.py capacity RESULT.json          -> prints C (req/s)
    admission_report.py overload DIR C
    admission_report.py breaker DIR
    admission_report.py reduction DIR
    admission_report.py shedlate DIR C
"""
import csv
import json
import math
import os
import subprocess
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.join(HERE, "..", "..", "target", "release", "loadgen")
TARGETS = {"chat": (300.0, 50.0), "batch": (3000.0, 200.0)}
# The outcomes of a request served whole.
DONE = ("ok", "length")


def load(path):
    with open(path) as f:
        return json.load(f)


def secs(d):
    """A humantime-ish duration as loadgen serialises it ("150s", "2m 30s", ...)."""
    if isinstance(d, (int, float)):
        return float(d)
    total = 0.0
    for part in str(d).split():
        for unit, mul in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
            if part.endswith(unit) and part[: -len(unit)].replace(".", "").isdigit():
                total += float(part[: -len(unit)]) * mul
                break
    return total


def window(r):
    sc = r["scenario"]
    return secs(sc.get("warmup", 0)), secs(sc["duration"])


def measured(r):
    w, d = window(r)
    return [x for x in r["records"] if w <= x["start_s"] < d]


def within(x):
    ttft, itl = TARGETS.get(x["class"], (math.inf, math.inf))
    ok = x["outcome"] in DONE
    return ok and (x["ttft_ms"] is None or x["ttft_ms"] <= ttft) and x["itl_over"] <= x["gaps"] // 100


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def log_events(path):
    """(unix seconds, fields) of the gateway's JSON log lines."""
    out = []
    for line in open(path):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        ts = datetime.fromisoformat(j["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append((ts, j.get("fields", {})))
    return out


def timeline(path):
    with open(path) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def chart(csv_path, d, stem, title, ylabel, lines):
    args = [LOADGEN, "chart", csv_path, "--dir", d, "--stem", stem, "--title", title, "--y-label", ylabel]
    for l in lines:
        args += ["--line", l]
    subprocess.run(args, check=True)


def timeline_chart(tl_path, d, stem, title):
    """TTFT P99 (the gateway's rolling view) with breaker and reduction state scaled to be visible."""
    rows = timeline(tl_path)
    derived = os.path.join(d, stem + ".csv")
    with open(derived, "w") as f:
        f.write("time (s),chat TTFT P99 ms (gateway window),breaker state x500 (1000 = open),reduction active x400\n")
        for r in rows:
            f.write(f"{r['t']:.2f},{r['ttft_p99_ms']:.1f},{r['breaker_state'] * 500:.0f},{r['reduction_active'] * 400:.0f}\n")
    chart(derived, d, stem, title, "ms", ["chat TTFT target 300 ms=300", "2x target 600 ms=600"])


def class_row(recs, cls, dur):
    rs = [x for x in recs if x["class"] == cls]
    done = [x for x in rs if x["outcome"] in DONE]
    rej = [x for x in rs if x["outcome"] == "rejected"]
    ttft = [x["ttft_ms"] for x in done if x["ttft_ms"] is not None]
    good = [x for x in rs if within(x)]
    return {
        "requests": len(rs), "done": len(done), "rejected": len(rej), "failed": len(rs) - len(done) - len(rej),
        "p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99), "within": len(good) / len(rs) if rs else float("nan"),
        "within_served": len(good) / len(done) if done else float("nan"),
        "goodput": len(good) / dur, "throughput": len(done) / dur,
    }


def misses(recs, cls):
    """Why the completed requests of `cls` missed their SLO, in words: a
    late first token, or too many gaps over the ITL target; and, where the
    simulator stamped its chunks (`engine_itl_over`), how many of those
    gap misses the replica's own gaps already made (its steps, late on
    this machine) rather than the path through the gateway."""
    ttft, _ = TARGETS.get(cls, (math.inf, math.inf))
    done = [x for x in recs if x["class"] == cls and x["outcome"] in DONE and not within(x)]
    is_late = lambda x: x["ttft_ms"] is not None and x["ttft_ms"] > ttft
    late = [x for x in done if is_late(x)]
    gaps = [x for x in done if not is_late(x)]
    text = f"{cls} requests completed outside their SLO: {len(late)} with a late first token, {len(gaps)} on gaps over the ITL target"
    stamped = [x for x in gaps if x.get("engine_itl_over") is not None]
    if stamped:
        engine = [x for x in stamped if x["engine_itl_over"] > x["gaps"] // 100]
        text += (f"; of those {len(stamped)} (gaps stamped by the replica), {len(engine)} missed on the replica's own "
                 f"gaps as it sent them, {len(stamped) - len(engine)} only on what the path added")
    return text + "."


def retry_after_row(recs):
    """Every 429 the client got carried a Retry-After: (yes/no, in words)."""
    refused = [x for x in recs if x["outcome"] == "rejected"]
    told = [x for x in refused if x.get("retry_after") is not None]
    return (len(told) == len(refused), f"{len(told)} of {len(refused)} 429s carried Retry-After")


def median_worst(values, worse):
    """(median, worst) of per-run values; `worse` picks the worse of two (min or max)."""
    v = sorted(values)
    med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    w = v[0]
    for x in v:
        w = worse(w, x)
    return med, w


def write_measured(d, values):
    """DIR/measured.json for the runner: each value a number, a yes/no, None
    (not measured), or (value, text) where the report states it in words."""
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    out = {}
    for k, v in values.items():
        out[k] = {"value": clean(v[0]), "text": v[1]} if isinstance(v, tuple) else clean(v)
    with open(os.path.join(d, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)


def cmd_capacity(path):
    """Completions per second inside the measured window (by completion time:
    counting requests that merely started in it would add the in-flight tail)."""
    r = load(path)
    w, d = window(r)
    done = [x for x in r["records"] if x["outcome"] in DONE and w <= x["start_s"] + x["e2e_ms"] / 1000 < d]
    print(f"{len(done) / (d - w):.2f}")


def cmd_overload(d, C):
    C = float(C)
    res = {k: load(os.path.join(d, f"{k}.json")) for k in ("direct", "gateway")}
    w, dur = window(res["gateway"])
    span = dur - w
    rows = {k: {c: class_row(measured(r), c, span) for c in ("chat", "batch")} for k, r in res.items()}
    g = rows["gateway"]
    goodput = {k: rows[k]["chat"]["goodput"] + rows[k]["batch"]["goodput"] for k in rows}
    write_measured(d, {
        "chat_ttft_p99_ms": (g["chat"]["p99"], f"{g['chat']['p99']:.0f} ms"),
        "chat_within_pct": (100 * g["chat"]["within"], f"{100 * g['chat']['within']:.2f} %"),
        "goodput_pct_of_c": (100 * goodput["gateway"] / C, f"{goodput['gateway']:.2f} req/s = {100 * goodput['gateway'] / C:.0f} % of C"),
        "batch_completed": (g["batch"]["done"], f"{g['batch']['done']} batch requests completed ({g['batch']['throughput']:.2f} req/s)"),
        "refusals_with_retry_after": retry_after_row(measured(res["gateway"])),
    })
    tl = os.path.join(d, "timeline.csv")
    if os.path.exists(tl):
        timeline_chart(tl, d, "gateway-admission", "through slogate: chat TTFT P99 as the gateway sees it")
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("**Fleet:** two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each: "
                "22 ms + 0.3 ms/seq decode steps, 0.078 ms/prompt token, max_num_seqs 64), `--max-num-batched-tokens 512`, "
                "`--scheduling-policy priority`. Every request: 512 prompt tokens, 64-256 output tokens (uniform).\n\n")
        f.write(f"**Capacity C = {C:.2f} req/s**: the fleet's throughput saturated (closed loop, 128 concurrent = 2 x max_num_seqs, "
                "round robin, 30 s after 10 s warm-up). C is throughput capacity: at saturation the replicas' own "
                "TTFT P99 is already far over chat's 300 ms, so holding chat's SLO at 2 C is admission's work.\n\n")
        f.write(f"**Offered 2 C**: chat Poisson {0.4 * C:.2f} req/s (0.4 C), batch {1.6 * C:.2f} req/s (1.6 C) in bursts of 8.\n\n")
        f.write("## Side by side\n\n| run | class | requests | completed | 429 | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n")
        f.write("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for k in ("direct", "gateway"):
            for c in ("chat", "batch"):
                x = rows[k][c]
                f.write(f"| {k} | {c} | {x['requests']} | {x['done']} | {x['rejected']} | {x['failed']} | "
                        f"{x['p50']:.0f} / {x['p99']:.0f} | {100 * x['within']:.1f} % | {x['goodput']:.2f} |\n")
            f.write(f"| {k} | **all** | | | | | | | **{goodput[k]:.2f}** ({100 * goodput[k] / C:.0f} % of C) |\n")
        f.write("\nStraight to the replicas every request is accepted and waits in vLLM's unbounded queue: the queue grows "
                "for the whole run and chat's TTFT with it. Through slogate, chat finds a slot at once (reserved share, "
                "interactive first, vLLM priority), batch fills the rest of the slots and what cannot be served within its "
                "TTFT target is refused early with 429 + Retry-After instead of waiting.\n\n")
        f.write("Charts: `direct-*.svg`, `gateway-*.svg` (TTFT CDF, TTFT p99 over time, throughput and 429s), "
                "`gateway-admission.svg` (the gateway's rolling chat TTFT P99). \n")


def transitions(events, cls="chat"):
    out = []
    for ts, f in events:
        if f.get("class") != cls:
            continue
        msg = f.get("message", "")
        if msg.startswith("TTFT P99 above the breaker"):
            out.append((ts, "armed"))
        elif msg.startswith("TTFT P99 back under"):
            out.append((ts, "disarmed"))
        elif "breaker" in msg and f.get("to"):
            out.append((ts, f["to"]))
        elif msg.startswith("context reduction"):
            out.append((ts, "reduction " + ("on" if f.get("active") in (True, "true") else "off")))
    return out


def cmd_breaker(d):
    r = load(os.path.join(d, "breaker.json"))
    tl = timeline(os.path.join(d, "timeline.csv"))
    faults = [(float(l.split()[1]), l.split(None, 3)[3]) for l in open(os.path.join(d, "faults.log")) if l.startswith("fault ")]
    slow_start, slow_end = faults[0][0], faults[1][0]
    ev = transitions(log_events(os.path.join(d, "gateway.log")))
    armed = next((t for t, e in ev if e == "armed"), None)
    opened = next((t for t, e in ev if e == "open" and armed and t >= armed), None)
    exceed_t = next((x["t"] for x in tl if x["t"] >= slow_start and x["ttft_p99_ms"] > 600), None)
    open_t = next((x["t"] for x in tl if x["t"] >= slow_start and x["breaker_state"] == 2), None)
    # Closed again: the first sample at state 0 after the slowdown ended, once it had opened.
    was_open = any(x["breaker_state"] != 0 for x in tl if slow_start <= x["t"] <= slow_end)
    closed_t = next((x["t"] for x in tl if x["t"] >= slow_end and x["breaker_state"] == 0), None) if was_open else None
    # Align the log's clock with the timeline's through the opening.
    rej = [x for x in r["records"] if x["outcome"] == "rejected"]
    by_ra = {}
    for x in rej:
        by_ra[x["retry_after"]] = by_ra.get(x["retry_after"], 0) + 1
    open_delay = (opened - armed) if (armed and opened) else None
    close_delay = (closed_t - slow_end) if closed_t is not None else None
    # The open breaker's refusals: 429 breaker_open, Retry-After the time
    # until it half-opens (with jitter), within 1-30 s.
    brk = [x for x in rej if x.get("error_code") == "breaker_open"]
    brk_ra = sorted(x["retry_after"] for x in brk if x["retry_after"] is not None)
    brk_ok = bool(brk_ra) and len(brk_ra) == len(brk) and 1 <= brk_ra[0] and brk_ra[-1] <= 30
    write_measured(d, {
        "open_delay_s": (None if open_delay is None else round(open_delay, 2), f"{open_delay:.2f} s (gateway log: P99 above 600 ms -> open)" if open_delay is not None else "never opened"),
        "breaker_refusals_retry_after_in_1_30_s": (brk_ok, f"{len(brk)} responses, Retry-After {brk_ra[0]}-{brk_ra[-1]} s" if brk_ra
                                                   else f"{len(brk)} responses, none with Retry-After"),
        "close_delay_s": (None if close_delay is None else round(close_delay, 2), f"{close_delay:.2f} s (+-0.25 s sampling)" if close_delay is not None else "did not close"),
    })
    timeline_chart(os.path.join(d, "timeline.csv"), d, "breaker-timeline",
                   f"breaker: slowdown x8 from {slow_start:.0f} s to {slow_end:.0f} s")
    t0 = (opened - open_t) if (opened and open_t is not None) else None
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"The replica slowed down 8x at {slow_start:.1f} s and recovered at {slow_end:.1f} s.\n")
        f.write("\n## Timeline\n\n| time s | event |\n|---|---|\n")
        rows = [(slow_start, "replica slowed down 8x"), (slow_end, "replica back to normal")]
        if exceed_t is not None:
            rows.append((exceed_t, "gateway's chat TTFT P99 first sampled above 600 ms (2x target)"))
        if t0 is not None:
            rows += [(ts - t0, f"breaker log: {e}") for ts, e in ev]
        if brk:
            rows.append((min(x["start_s"] for x in brk), "first 429 breaker_open at a client (sent at)"))
        if rej:
            rows.append((min(x["start_s"] for x in rej), "first 429 of any kind at a client (sent at)"))
        for t, e in sorted(rows):
            f.write(f"| {t:.2f} | {e} |\n")
        by_code = {}
        for x in rej:
            ra = by_code.setdefault(x.get("error_code") or "none", {})
            ra[x["retry_after"]] = ra.get(x["retry_after"], 0) + 1
        f.write(f"\n429s by code, then by Retry-After in seconds: {by_code} (with the replica 8x slower its 64 slots fill, and "
                "queued requests that can no longer make the TTFT target are refused before the breaker opens; the open "
                "breaker's Retry-After is the time until it half-opens, with jitter).\n\n")
        f.write("Charts: `breaker-timeline.svg` (the gateway's rolling chat TTFT P99 with the breaker state), "
                "`breaker-ttft-p99.svg`, `breaker-throughput.svg` (completed and 429 per second, client side).\n")


def cmd_reduction(d):
    res = {m: load(os.path.join(d, f"{m}.json")) for m in ("without", "with")}
    ev = {m: transitions(log_events(os.path.join(d, f"gateway-{m}.log"))) for m in res}
    tls = {m: timeline(os.path.join(d, f"timeline-{m}.csv")) for m in res}
    summary = {}
    for m, r in res.items():
        recs = [x for x in r["records"] if x["class"] == "chat"]
        tl = tls[m]
        on_t = next((x["t"] for x in tl if x["reduction_active"] == 1), None)
        opened = any(x["breaker_state"] == 2 for x in tl) or any(e == "open" for _, e in ev[m])
        # Client TTFT p99 in 10 s windows by send time.
        wins = {}
        for x in recs:
            if x["ttft_ms"] is not None:
                wins.setdefault(int(x["start_s"] // 10), []).append(x["ttft_ms"])
        summary[m] = {
            "on_t": on_t, "opened": opened, "wins": {k: pct(v, 0.99) for k, v in sorted(wins.items())},
            "reduced": sum(1 for x in recs if x.get("context_reduced")),
            "rejected": sum(1 for x in recs if x["outcome"] == "rejected"),
            "requests": len(recs), "all_p99": pct([x["ttft_ms"] for x in recs if x["ttft_ms"] is not None], 0.99),
            "max_p99": max((x["ttft_ms_p99"] for x in []), default=None),
            "gw_max": max((x["ttft_p99_ms"] for x in tl), default=float("nan")),
        }
        timeline_chart(os.path.join(d, f"timeline-{m}.csv"), d, f"chart-timeline-{m}", f"{m} context reduction: chat TTFT P99 (gateway view)")
    w = summary["with"]
    on = w["on_t"]
    tl = tls["with"]

    def active_throughout(k):
        rows = [x for x in tl if k * 10 <= x["t"] < k * 10 + 10]
        return bool(rows) and all(x["reduction_active"] == 1 for x in rows)

    # Windows sent while reduction had been on for 10 s or more (the queue left from before has drained).
    settled = [k for k in w["wins"] if active_throughout(k) and (k == 0 or active_throughout(k - 1))]
    after = [w["wins"][k] for k in settled]
    before = [v for k, v in w["wins"].items() if on is not None and k * 10 + 10 <= on]
    on_share = sum(1 for x in tl if x["reduction_active"] == 1) / max(1, len(tl))
    write_measured(d, {
        "without_opened": (summary["without"]["opened"], "opened" if summary["without"]["opened"] else "never opened"),
        "with_opened": (w["opened"], "opened" if w["opened"] else "never opened"),
        "reduced_ttft_p99_max_ms": (max(after) if after else None,
                                    f"before: p99 {max(before):.0f} ms; with reduction on: p99 at most {max(after):.0f} ms over {len(after)} windows"
                                    if after and before else "no data"),
    })
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("## Before / after\n\n| run | requests | reduced | 429 | chat TTFT p99 whole run ms | gateway's rolling P99 max ms | reduction on at s | breaker opened |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|---|\n")
        for m in ("without", "with"):
            s = summary[m]
            f.write(f"| {m} | {s['requests']} | {s['reduced']} | {s['rejected']} | {s['all_p99']:.0f} | {s['gw_max']:.0f} | "
                    f"{'-' if s['on_t'] is None else format(s['on_t'], '.1f')} | {'yes' if s['opened'] else 'no'} |\n")
        f.write("\nClient-side chat TTFT p99 per 10 s of send time (ms):\n\n| window s | " + " | ".join(
            f"{k * 10}-{k * 10 + 10}" for k in summary["with"]["wins"]) + " |\n|---|" + "---:|" * len(summary["with"]["wins"]) + "\n")
        for m in ("without", "with"):
            f.write(f"| {m} | " + " | ".join(f"{summary[m]['wins'].get(k, float('nan')):.0f}" for k in summary["with"]["wins"]) + " |\n")
        f.write(f"\nReduction was on for {100 * on_share:.0f} % of the run with it. Windows that are not all reduced "
                "(the first seconds, and when it turns off after 30 s under target and the load, still too big unreduced, "
                "sends it straight back on) show the overload again until the backlog drains.\n")
        f.write("\nTransitions (gateway log, seconds after the first event):\n\n")
        for m in ("without", "with"):
            if ev[m]:
                t0 = ev[m][0][0]
                f.write(f"- {m}: " + "; ".join(f"{t - t0:.1f} s {e}" for t, e in ev[m]) + "\n")
        f.write("\nCharts: `chart-timeline-without.svg`, `chart-timeline-with.svg` (the gateway's rolling chat TTFT P99, breaker and "
                "reduction state), `*-reduction-ttft-p99.svg`, `*-reduction-throughput.svg`.\n")


def cmd_shedlate(d, C):
    """shed_late off and on at 1.5 C and 3 C: goodput, within SLO, how long refused callers waited."""
    C = float(C)
    rows = {}
    for x in ("1.5", "3"):
        for shed in ("false", "true"):
            r = load(os.path.join(d, f"x{x}-{shed}.json"))
            w, dur = window(r)
            recs = [y for y in r["records"] if w <= y["start_s"] < dur]
            row = class_row(recs, "chat", dur - w)
            refused = [y["e2e_ms"] for y in recs if y["outcome"] == "rejected"]
            row["refused_p50"], row["refused_p99"] = pct(refused, 0.5), pct(refused, 0.99)
            codes = {}
            for y in recs:
                if y["outcome"] == "rejected":
                    codes[y.get("error_code") or "?"] = codes.get(y.get("error_code") or "?", 0) + 1
            row["codes"] = codes
            rows[(x, shed)] = row
    measured = {}
    for x in ("1.5", "3"):
        on, off = rows[(x, "true")], rows[(x, "false")]
        measured[f"x{x}_goodput_on_over_off"] = (on["goodput"] / off["goodput"] if off["goodput"] else None,
                                                 f"{on['goodput']:.2f} vs {off['goodput']:.2f} req/s")
        measured[f"x{x}_refused_p50_ms"] = (on["refused_p50"], f"p50 {on['refused_p50']:.0f} ms, p99 {on['refused_p99']:.0f} ms "
                                            f"(off: {off['refused_p50']:.0f} / {off['refused_p99']:.0f} ms)")
    write_measured(d, measured)
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write(f"Capacity C = {C:.2f} req/s.\n\n")
        f.write("| load | shed_late | requests | completed | refused (by code) | goodput req/s | within SLO (all requests) | "
                "within SLO (served) | TTFT p50 / p99 ms (served) | refused caller waited p50 / p99 ms |\n")
        f.write("|---|---|---:|---:|---|---:|---:|---:|---:|---:|\n")
        for (x, shed), r in rows.items():
            codes = ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items())) or "0"
            f.write(f"| {x} C | {'on' if shed == 'true' else 'off'} | {r['requests']} | {r['done']} | {codes} | {r['goodput']:.2f} "
                    f"({100 * r['goodput'] / C:.0f} % of C) | {100 * r['within']:.1f} % | {100 * r['within_served']:.1f} % | "
                    f"{r['p50']:.0f} / {r['p99']:.0f} | {r['refused_p50']:.0f} / {r['refused_p99']:.0f} |\n")


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"capacity": cmd_capacity, "overload": cmd_overload, "breaker": cmd_breaker, "reduction": cmd_reduction,
     "shedlate": cmd_shedlate}[cmd](*rest)
