#!/usr/bin/env python3
"""Report of loadtest/bench/short.sh: embeddings requests' latency through
the gateway against straight to a replica, while chat streams overload the
replicas' slots, and what chat waited in the same runs.

    short_report.py DIR MACHINE C RUNS DURATION WARMUP EMB_RATE
"""
import json
import statistics
import sys

from quantiles import pct  # beside this script

d, machine, c, runs, duration, warmup, emb_rate = sys.argv[1:8]
runs, warmup = int(runs), float(warmup)
GOOD = ("ok", "length")


def load(name):
    r = json.load(open(f"{d}/{name}.json"))
    return [x for x in r["records"] if x["start_s"] >= warmup]


def summary(name):
    recs = load(name)
    emb = [x for x in recs if x["stream"] == "emb"]
    chat = [x for x in recs if x["stream"] == "chat"]
    emb_ok = [x for x in emb if x["outcome"] in GOOD]
    chat_ok = [x for x in chat if x["outcome"] in GOOD]
    return {
        "emb": len(emb),
        "emb_failed": len(emb) - len(emb_ok),
        "emb50": pct([x["e2e_ms"] for x in emb_ok], 0.5),
        "emb99": pct([x["e2e_ms"] for x in emb_ok], 0.99),
        "emb_queue99": pct([x.get("queue_ms") or 0.0 for x in emb_ok], 0.99),
        "chat": len(chat),
        "chat_refused": sum(1 for x in chat if x["outcome"] == "rejected") / max(1, len(chat)),
        "chat_queue50": pct([x.get("queue_ms") or 0.0 for x in chat_ok], 0.5),
        "chat_queue99": pct([x.get("queue_ms") or 0.0 for x in chat_ok], 0.99),
    }


rows = [(i, summary(f"gateway-{i}"), summary(f"direct-{i}")) for i in range(1, runs + 1)]
added99 = [g["emb99"] - x["emb99"] for _, g, x in rows]
added50 = [g["emb50"] - x["emb50"] for _, g, x in rows]
queue99 = [g["emb_queue99"] for _, g, _ in rows]
failed = [g["emb_failed"] for _, g, _ in rows]
chat_wait = [g["chat_queue99"] for _, g, _ in rows]
chat_refused = [g["chat_refused"] for _, g, _ in rows]

print("# Short requests under load\n")
print(f"{machine}. Produced by `loadtest/bench/short.sh`; every figure below is from that run.\n")
print(f"""Two simulated vLLM replicas of a 70B model (64 sequences each) behind one slogate with a user's defaults (learned
limits; no class named, so embeddings go to `rag` by their endpoint). Capacity C = {c} req/s (chat alone, closed
loop at twice the replicas' sequences). In each run chat streams arrive at 1.5 C (Poisson, 512-token prompts, 64-256
output tokens): the slots stay full, chat queues and the requests that can no longer make their target are refused.
Beside them, {emb_rate} embeddings requests a second (256-token inputs) go through the gateway (`gateway`) or straight to
a replica (`direct`, the control). The replica answers embeddings beside its streams, so what an embeddings request
waits through the gateway beyond direct is the gateway's. {duration} s a run, the first {warmup:.0f} s not counted; {runs}
pairs of runs, each on fresh replicas and a fresh gateway.

How short requests are admitted (docs/design/seats.md): an interactive embeddings, rerank, score or tokenize request
that finds no slot free takes one of a few seats above the slots (a tenth of them) instead of waiting in the queue
behind streams: it holds its seat for milliseconds, a stream for seconds.
""")
print("## Checks\n")
print("| check | result | measured (median; worst run) |")
print("|---|---|---|")
med_added99, worst_added99 = statistics.median(added99), max(added99)
med_q99, worst_q99 = statistics.median(queue99), max(queue99)
print(f"| embeddings p99 through the gateway at most 10 ms over direct | {'met' if med_added99 <= 10 else '**not met**'} | {med_added99:+.2f} ms ({worst_added99:+.2f} ms) |")
print(f"| embeddings wait in the gateway's queue p99 at most 1 ms | {'met' if med_q99 <= 1 else '**not met**'} | {med_q99:.2f} ms ({worst_q99:.2f} ms) |")
print(f"| no embeddings request refused or failed | {'met' if statistics.median(failed) == 0 else '**not met**'} | {statistics.median(failed):.0f} ({max(failed)}) |")
print(f"\nIn the same runs chat, admitted as streams are, waited up to {statistics.median(chat_wait):.0f} ms in the queue (p99 of those admitted, median run) and {100 * statistics.median(chat_refused):.1f} % of it was refused: what an embeddings request would meet without seats of its own.\n")
print("## Runs\n")
print("| run | path | embeddings | failed | e2e p50 ms | e2e p99 ms | queue p99 ms | chat requests | chat refused | chat queue p50 ms | chat queue p99 ms |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i, g, x in rows:
    for name, s in (("gateway", g), ("direct", x)):
        print(
            f"| {i} | {name} | {s['emb']} | {s['emb_failed']} | {s['emb50']:.2f} | {s['emb99']:.2f} | {s['emb_queue99']:.2f} | "
            f"{s['chat']} | {100 * s['chat_refused']:.1f} % | {s['chat_queue50']:.0f} | {s['chat_queue99']:.0f} |"
        )
print(f"\nAdded by the gateway, p50: {', '.join(f'{a:+.2f}' for a in added50)} ms; p99: {', '.join(f'{a:+.2f}' for a in added99)} ms (run by run).")
print("In `direct` runs the embeddings never pass the gateway: their queue column is 0.")
