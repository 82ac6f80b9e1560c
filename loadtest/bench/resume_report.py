#!/usr/bin/env python3
"""Report of one run of loadtest/bench/resume.sh: per fault, resume on and
off, what the SDK clients saw and what slogate counted. Writes
DIR/report.md and DIR/measured.json (judged by loadtest/run).

    resume_report.py DIR FAULT_AT
"""
import json
import os
import re
import sys

from report_common import write_measured  # beside this script

work, kill_at = sys.argv[1], sys.argv[2]
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
measured = {}
all_ok, off_lost = True, 0
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
            n = len(streams)
            good = n > 0 and whole == n and two_ids + two_roles == 0
            measured[f"{fault}_whole"] = (good, f"{whole} of {n} whole, {two_ids + two_roles} spliced visibly, "
                                          f"{total(m, 'slogate_stream_resumes_total')} resumed")
            # A stream that broke again after its continuation (the default
            # allows one) is lost by design; any other lost stream is not.
            again = total(m, "slogate_stream_unresumed_total", why="attempts")
            measured[f"{fault}_lost_not_twice_broken"] = (n - whole - again, f"{n - whole} lost, {again} of them broke again after their one continuation")
            all_ok = all_ok and ok == whole
            measured.setdefault("_ok", []).append(f"{fault} {ok} ok of {whole} whole")
            measured[f"{fault}_spliced"] = (two_ids + two_roles, f"{two_ids} with 2 ids, {two_roles} with 2 role chunks")
        else:
            off_lost += len(streams) - whole
measured["all_counted_ok"] = (all_ok, ", ".join(measured.pop("_ok")))
measured["off_lost"] = (off_lost, f"{off_lost} streams not whole with resume off")
write_measured(work, measured)

with open(os.path.join(work, "report.md"), "w") as f:
    f.write("| fault | resume | streams | whole | raised | 2 ids | 2 roles | ok | other outcomes | resumed | not resumed |\n")
    f.write("|---|---|---:|---:|---:|---:|---:|---:|---|---|---|\n")
    f.write("\n".join(rows) + "\n\nFaults:\n")
    for fault, what in FAULTS.items():
        f.write(f"- **{fault}**: {what}.\n")
