#!/usr/bin/env python3
"""The report of loadtest/bench/resume.sh: per fault, resume on and off, what
the SDK clients saw and what slogate counted.

    resume_report.py WORK MACHINE RATE COUNT KILL_AT
"""
import json
import re
import sys

work, machine, rate, count, kill_at = sys.argv[1:6]

FAULTS = {
    "kill": f"replica A SIGKILLed {kill_at} s in",
    "faults": "both replicas cut 3 % of streams and end 3 % with an error event",
    "stall": f"replica A stops for 4 s, {kill_at} s in (idle timeout 2 s)",
}


def metrics(path):
    """name -> list of (labels dict, value) from Prometheus text."""
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'^([a-zA-Z_:]+)(\{(.*)\})? ([0-9.eE+-]+)$', line.strip())
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def total(m, name, **want):
    return int(sum(v for labels, v in m.get(name, []) if all(labels.get(k) == w for k, w in want.items())))


def by(m, name, key):
    got = {}
    for labels, v in m.get(name, []):
        if v:
            got[labels.get(key, "?")] = got.get(labels.get(key, "?"), 0) + int(v)
    return ", ".join(f"{k} {v}" for k, v in sorted(got.items())) or "none"


rows = []
checks = []
for fault, what in FAULTS.items():
    for mode in ("on", "off"):
        streams = json.load(open(f"{work}/{fault}-{mode}.json"))
        m = metrics(f"{work}/{fault}-{mode}.metrics")
        whole = sum(s["whole"] for s in streams)
        raised = sum(s["error"] is not None for s in streams)
        two_ids = sum(len(s["ids"]) > 1 for s in streams)
        two_roles = sum(s["roles"] > 1 for s in streams)
        ok = total(m, "slogate_requests_total", outcome="ok") + total(m, "slogate_requests_total", outcome="length")
        bad = {o: total(m, "slogate_requests_total", outcome=o) for o in ("stream_error", "timeout", "upstream_error", "unavailable")}
        bad_s = ", ".join(f"{k} {v}" for k, v in bad.items() if v) or "none"
        rows.append(
            f"| {fault} | {mode} | {len(streams)} | **{whole}** | {raised} | {two_ids} | {two_roles} | {ok} | {bad_s} "
            f"| {by(m, 'slogate_stream_resumes_total', 'reason')} | {by(m, 'slogate_stream_unresumed_total', 'why')} |"
        )
        if mode == "on":
            resumed = total(m, "slogate_stream_resumes_total")
            checks.append((fault, whole, len(streams), two_ids + two_roles, ok, resumed))

print(f"""# Lose no stream to a replica

`loadtest/bench/resume.sh` ({machine}).

Streaming chat through slogate over two simulated replicas (separate
processes, 20 ms engine steps, at most 96 tokens), {count} streams arriving at
{rate} a second (Poisson), each read to its end by the official OpenAI SDK
(`resume_sdk.py`, AsyncOpenAI, no retries) as a user's code reads it. Each
fault ran with slogate's defaults (resume on) and with
`resume: {{ max_attempts: 0 }}` (off), on fresh replicas.

- **whole**: the SDK raised nothing, the stream had one id, one role chunk
  and a finish_reason;
- **raised**: the SDK raised (an error event, a cut connection, an HTTP error);
- **2 ids / 2 roles**: streams whose chunks carried more than one id, or
  more than one role chunk (a splice that shows);
- **ok**: slogate's `requests_total` with outcome `ok` or `length`; **other
  outcomes** the rest it counted;
- **resumed**: `stream_resumes_total` by how the stream broke; **not
  resumed**: `stream_unresumed_total` by why.

| fault | resume | streams | whole | raised | 2 ids | 2 roles | ok | other outcomes | resumed | not resumed |
|---|---|---:|---:|---:|---:|---:|---:|---|---|---|""")
print("\n".join(rows))
print()
print("Faults:")
for fault, what in FAULTS.items():
    print(f"- **{fault}**: {what}.")
print()
print("## With resume on")
print()
for fault, whole, n, shown, ok, resumed in checks:
    verdict = "every stream whole" if whole == n and shown == 0 else f"{n - whole} of {n} not whole"
    print(f"- {fault}: {verdict}; {resumed} continued on the other replica; slogate counted {ok} of {n} ok.")
