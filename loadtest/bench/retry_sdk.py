#!/usr/bin/env python3
"""Clients that retry as the OpenAI Python SDK does, in a lasting overload
(for loadtest/bench/retry.sh).

    retry_sdk.py BASE_URL MODEL RATE SECONDS OUT.json [SEED]

New requests arrive at RATE a second (Poisson) for SECONDS; each is one
`chat.completions.create` of the real SDK (AsyncOpenAI,
max_retries 3): on a 429 the SDK itself waits what `retry-after-ms` or
`Retry-After` says and sends again. An httpx event hook sees every attempt
(its send time, status, the Retry-After it was told, its error code), so
the report can say which retries were served and whether they came back in
a wave. Loopback only; stops by itself.
"""
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse

import httpx2 as httpx  # the OpenAI SDK 3.x is built on httpx2
import openai

base, model, rate, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 7  # the arrivals' seed
if urlparse(base).hostname not in ("127.0.0.1", "localhost"):
    sys.exit(f"retry_sdk: {base}: loopback only")

start = time.monotonic()
attempts = []   # every HTTP attempt: request id, attempt index, sent at, status, told, code
requests = []   # every logical request: arrived at, outcome, attempts, first token after arrival
PROMPT = "Explain how a token bucket differs from a leaky bucket for rate limiting. " * 40


async def on_request(req):
    req.extensions["slogate_sent"] = time.monotonic() - start


async def on_response(resp):
    req = resp.request
    told = resp.headers.get("retry-after-ms")
    told = float(told) / 1000 if told else (float(resp.headers["retry-after"]) if "retry-after" in resp.headers else None)
    code = None
    if resp.status_code == 429:
        await resp.aread()
        try:
            code = resp.json()["error"]["code"]
        except Exception:
            code = "?"
    attempts.append({
        "rid": req.headers.get("x-rid"), "try": int(req.headers.get("x-stainless-retry-count", "0")),
        "sent": req.extensions.get("slogate_sent"), "took": time.monotonic() - start - req.extensions.get("slogate_sent", 0.0),
        "status": resp.status_code, "told": told, "code": code,
    })


async def one(client, rid, arrived):
    rec = {"rid": rid, "arrived": arrived, "outcome": None, "e2e": None}
    try:
        # Not streamed: the SDK retries a 429 the same way, and one JSON answer
        # costs this Python client far less than 128 parsed chunks (a client
        # short of CPU would blur when its retries go out).
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=128,
            extra_headers={"x-rid": rid},
        )
        rec["e2e"] = time.monotonic() - start - arrived
        rec["outcome"] = "served"
    except openai.RateLimitError:
        rec["outcome"] = "refused"
    except Exception as e:  # counted, not hidden
        rec["outcome"] = "error: " + repr(e)[:120]
    requests.append(rec)


async def main():
    http = httpx.AsyncClient(
        event_hooks={"request": [on_request], "response": [on_response]},
        limits=httpx.Limits(max_connections=2000, max_keepalive_connections=500), timeout=120,
    )
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=3, http_client=http)
    rng = random.Random(seed)
    tasks, n, t = [], 0, 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        delay = start + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        n += 1
        tasks.append(asyncio.create_task(one(client, str(n), t)))
    await asyncio.gather(*tasks)
    await http.aclose()
    with open(out, "w") as f:
        json.dump({"rate": rate, "seconds": seconds, "attempts": attempts, "requests": requests}, f)


asyncio.run(main())
