"""Report of one run of loadtest/bench/messages.sh: Anthropic's SDK's own
timings and usage beside slogate's /metrics for the same Messages (read
before and after the run). Writes DIR/report.md and DIR/measured.json.

    messages_report.py DIR CLIENT
"""
import json
import os
import sys

from report_common import write_measured  # beside this script
from prom import buckets, bucket_of, delta_of, quantile, samples
from quantiles import pct

work, client = sys.argv[1:3]
before, after = samples(f"{work}/before.prom"), samples(f"{work}/after.prom")
sdk = json.load(open(f"{work}/sdk.json"))
msgs = lambda l: l.get("endpoint") == "messages"  # noqa: E731
counted = delta_of(before, after, "slogate_requests_total", msgs)
good = delta_of(before, after, "slogate_requests_total", lambda l: msgs(l) and l.get("outcome") in ("ok", "length"))
read = len(sdk["ttft_s"])
measured, rows = {}, []
measured["counted_once"] = (
    counted == sdk["sent"] and good == read == sdk["sent"] and not sdk["errors"],
    f"the SDK sent {sdk['sent']}, read {read} ({len(sdk['errors'])} failed); slogate counted {counted:.0f}, {good:.0f} good",
)
prompt = delta_of(before, after, "slogate_prompt_tokens_total")
output = delta_of(before, after, "slogate_generation_tokens_total")
measured["tokens_equal"] = (
    (prompt, output) == (sdk["usage"]["input"], sdk["usage"]["output"]),
    f"prompt {prompt:.0f} vs {sdk['usage']['input']}, output {output:.0f} vs {sdk['usage']['output']}",
)
for name, series, values in [("TTFT", "slogate_time_to_first_token_seconds_bucket", sdk["ttft_s"]),
                             ("ITL", "slogate_inter_token_latency_seconds_bucket", sdk["gaps_s"])]:
    bs = buckets(before, after, series, msgs)
    for q, key in [(0.5, "p50"), (0.99, "p99")]:
        theirs, ours = pct(values, q), quantile(q, bs)
        b = bucket_of(theirs, bs)
        same = b == bucket_of(ours, bs)
        rows.append(f"| {name} {key} | {theirs * 1000:.2f} ms | {ours * 1000:.2f} ms | {b[0] * 1000:g}-{b[1] * 1000:g} ms | {'same' if same else 'different'} |")
        measured[f"{name.lower()}_{key}_same_bucket"] = (same, f"{theirs * 1000:.2f} ms vs {ours * 1000:.2f} ms")
write_measured(work, measured)
with open(os.path.join(work, "report.md"), "w") as f:
    f.write(f"Client: {client}. {read} streams read, {len(sdk['gaps_s'])} gaps.\n\n")
    f.write("| measure | the SDK (client) | slogate (gateway, from its buckets) | the SDK's bucket | same bucket |\n|---|---|---|---|---|\n")
    for r in rows:
        f.write(r + "\n")
    f.write(f"\nTokens: {measured['tokens_equal'][1]}.\n")
