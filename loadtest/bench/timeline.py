#!/usr/bin/env python3
"""Sample a running gateway's admission state over time, and switch
simulator faults at given offsets, for the admission scenarios.

    timeline.py --admin URL --class chat --duration 110 --out t.csv \
        [--fault 25=URL={"slowdown":8}] ...

Every 250 ms it reads the admin /metrics and writes one CSV row:
t (s since start), ttft_p99_ms, breaker_state (0 closed, 1 half-open, 2
open), reduction_active, queue_interactive, queue_batch, replica_limits (the
sum of slogate_replica_limit over the replicas), replica_slots (the sum of
slogate_replica_slots: this instance's part in a fleet; nan alone), batch_cut
(the sum of slogate_replica_batch_cut: seats batch leaves to interactive
because their first tokens came late) and inflight (the sum of
slogate_inflight_requests), seats_interactive / seats_batch / seats_reserved
(slogate_pool_seats per tier and slogate_pool_reserved_seats, summed over
pools). Fault switches are
POSTed to the simulator's /admin/faults at their offsets and logged to
stderr as `fault T URL JSON`. Loopback only; stops by itself.
"""
import argparse
import re
import sys
import time
import urllib.request
from urllib.parse import urlparse


def loopback(url):
    host = urlparse(url).hostname or ""
    if not (host == "localhost" or host.startswith("127.") or host == "::1"):
        sys.exit(f"timeline: {url}: loopback only")
    return url


def metric(text, name, labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def metric_sum(text, name, having=""):
    """The sum of NAME's series (those whose labels contain HAVING)."""
    return sum(float(v) for labels, v in re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M) if having in labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin", required=True)
    ap.add_argument("--class", dest="cls", default="chat")
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fault", action="append", default=[], help="SECONDS=SIM_URL=JSON")
    a = ap.parse_args()
    admin = loopback(a.admin.rstrip("/"))
    faults = []
    for f in a.fault:
        at, url, body = f.split("=", 2)
        faults.append((float(at), loopback(url.rstrip("/")), body))
    faults.sort()
    t0 = time.monotonic()
    step = 0.25
    with open(a.out, "w") as out:
        out.write("t,ttft_p99_ms,breaker_state,reduction_active,queue_interactive,queue_batch,replica_limits,replica_slots,batch_cut,inflight,seats_interactive,seats_batch,seats_reserved\n")
        n = 0
        while True:
            now = time.monotonic() - t0
            if now > a.duration:
                break
            while faults and faults[0][0] <= now:
                at, url, body = faults.pop(0)
                req = urllib.request.Request(url + "/admin/faults", data=body.encode(), method="POST",
                                             headers={"content-type": "application/json"})
                urllib.request.urlopen(req, timeout=5).read()
                print(f"fault {now:.3f} {url} {body}", file=sys.stderr, flush=True)
            try:
                text = urllib.request.urlopen(admin + "/metrics", timeout=2).read().decode()
                c = {"class": a.cls}
                row = [
                    now,
                    metric(text, "slogate_ttft_p99_seconds", c) * 1000,
                    metric(text, "slogate_breaker_state", c),
                    metric(text, "slogate_context_reduction_active", c),
                    metric(text, "slogate_queue_depth", {"tier": "interactive"}),
                    metric(text, "slogate_queue_depth", {"tier": "batch"}),
                    metric_sum(text, "slogate_replica_limit"),
                    metric_sum(text, "slogate_replica_slots") if "slogate_replica_slots{" in text else float("nan"),
                    metric_sum(text, "slogate_replica_batch_cut"),
                    metric_sum(text, "slogate_inflight_requests"),
                    metric_sum(text, "slogate_pool_seats", 'tier="interactive"'),
                    metric_sum(text, "slogate_pool_seats", 'tier="batch"'),
                    metric_sum(text, "slogate_pool_reserved_seats"),
                ]
                out.write(",".join(f"{v:.3f}" for v in row) + "\n")
                out.flush()
            except OSError as e:
                print(f"timeline: {e}", file=sys.stderr)
            n += 1
            time.sleep(max(0.0, t0 + n * step - time.monotonic()))


if __name__ == "__main__":
    main()
