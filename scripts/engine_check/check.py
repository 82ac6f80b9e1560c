"""Checks of slogate in front of a real engine (llama.cpp's server through
llama-cpp-python): streaming, non-streaming, a client that hangs up, and the
OpenAI Python SDK. Each check compares what the client saw with what the
gateway measured (its /metrics).

Usage: check.py GATEWAY_URL ADMIN_URL MODEL

Prints a Markdown table of the checks; exits 1 if any failed.
"""
import http.client
import json
import sys
import time
import urllib.parse
import urllib.request

GW, ADMIN, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
rows, failed = [], []


def metrics():
    text = urllib.request.urlopen(ADMIN + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        out[series] = float(value)
    return out


def total(m, name, **labels):
    s = 0.0
    for series, v in m.items():
        n, _, rest = series.partition("{")
        if n == name and all(f'{k}="{val}"' in rest for k, val in labels.items()):
            s += v
    return s


def check(name, ok, detail):
    rows.append((name, "pass" if ok else "**FAIL**", detail))
    if not ok:
        failed.append(name)


def post(body):
    u = urllib.parse.urlparse(GW)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    return conn, conn.getresponse()


def events(resp):
    """Yield (seconds since start, data) for each SSE event."""
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            data = b"\n".join(l[5:].lstrip() for l in block.split(b"\n") if l.startswith(b"data:"))
            if data:
                yield time.monotonic(), data.decode()


def content_of(data):
    try:
        v = json.loads(data)
    except ValueError:
        return ""
    return "".join((c.get("delta") or {}).get("content") or "" for c in v.get("choices") or [])


msgs = [{"role": "user", "content": "hello gateway"}]

# 1. A stream, as a client that did not ask for usage.
before = metrics()
start = time.monotonic()
conn, resp = post({"model": MODEL, "messages": msgs, "max_tokens": 16, "stream": True})
first, content_events, raw, done = None, 0, [], False
for t, data in events(resp):
    raw.append(data)
    if data == "[DONE]":
        done = True
    elif content_of(data):
        content_events += 1
        first = first or t
conn.close()
time.sleep(0.2)
after = metrics()
client_ttft = (first - start) * 1000 if first else None
d = lambda name, **l: total(after, name, **l) - total(before, name, **l)
gw_ttft = d("slogate_time_to_first_token_seconds_sum") * 1000
ok_outcomes = d("slogate_requests_total", outcome="ok") + d("slogate_requests_total", outcome="length")
check(
    "stream: 200, content, [DONE]",
    resp.status == 200 and done and content_events > 0,
    f"HTTP {resp.status}, {len(raw)} events, {content_events} with content",
)
check(
    "stream: TTFT at the first content (gateway <= client)",
    client_ttft is not None and 0 < gw_ttft <= client_ttft + 1,
    f"gateway {gw_ttft:.1f} ms, client {client_ttft:.1f} ms" if client_ttft else "no content",
)
check(
    "stream: outcome ok/length, one ITL gap per content event after the first",
    ok_outcomes == 1 and d("slogate_inter_token_latency_seconds_count") == content_events - 1,
    f"{int(ok_outcomes)} ok/length, {int(d('slogate_inter_token_latency_seconds_count'))} gaps",
)
check(
    "stream: no usage sent, tokens counted from events and marked estimated",
    not any('"usage": {' in e or '"usage":{' in e for e in raw)
    and d("slogate_usage_estimated_requests_total") == 1
    and d("slogate_generation_tokens_total") == content_events,
    f"{int(d('slogate_generation_tokens_total'))} tokens counted, {int(d('slogate_usage_estimated_requests_total'))} estimated",
)

# 2. Non-streaming: the engine's usage is counted as it is.
before = metrics()
conn, resp = post({"model": MODEL, "messages": msgs, "max_tokens": 8})
body = json.loads(resp.read())
conn.close()
after = metrics()
usage = body.get("usage") or {}
check(
    "non-streaming: 200 with the engine's usage",
    resp.status == 200
    and usage.get("completion_tokens") is not None
    and d("slogate_generation_tokens_total") == usage["completion_tokens"]
    and d("slogate_usage_estimated_requests_total") == 0,
    f"usage {usage}, gateway counted {int(d('slogate_generation_tokens_total'))}",
)

# 3. A client that hangs up after its first token: cancelled, slot given back.
before = metrics()
conn, resp = post({"model": MODEL, "messages": msgs, "max_tokens": 400, "stream": True})
for _, data in events(resp):
    if content_of(data):
        break
conn.sock.close()
conn.close()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    after = metrics()
    if d("slogate_requests_total", outcome="cancelled") == 1 and total(after, "slogate_inflight_requests") == 0:
        break
    time.sleep(0.1)
conn, resp = post({"model": MODEL, "messages": msgs, "max_tokens": 4})
resp.read()
conn.close()
check(
    "hang-up: counted cancelled, slot given back",
    d("slogate_requests_total", outcome="cancelled") == 1 and resp.status == 200,
    f"cancelled {int(d('slogate_requests_total', outcome='cancelled'))}, next request HTTP {resp.status} (one slot)",
)

# 4. The OpenAI Python SDK, both ways.
from openai import OpenAI

client = OpenAI(base_url=GW + "/v1", api_key="unused", max_retries=0)
r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)
n = 0
for chunk in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, stream=True):
    n += sum(1 for c in chunk.choices if c.delta.content)
check("OpenAI SDK: create and stream", r.choices[0].finish_reason in ("stop", "length") and n > 0, f"finish {r.choices[0].finish_reason}, {n} streamed content chunks")
models = [m.id for m in client.models.list()]
check("OpenAI SDK: models.list through the gateway", MODEL in models, f"{models}")

print("| check | result | measured |")
print("|---|---|---|")
for name, res, detail in rows:
    print(f"| {name} | {res} | {detail} |")
sys.exit(1 if failed else 0)
