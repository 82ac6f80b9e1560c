#!/usr/bin/env python3
"""The OpenAI Python SDK against a key with limits (driven by tests/tenants.rs).

    openai_limits.py BASE_URL

Key `sk-sdk` (max_concurrent 1, requests_per_minute 100): the SDK reads
the x-ratelimit-* headers of a success; a second request while the first
streams is refused (429, max_concurrent), and the SDK, with its default
retries, waits as Retry-After says and gets through once the test lets the
first stream end (the test checks the refusal on the gateway's side). Key `sk-tight` (requests_per_minute 1): a second request
raises RateLimitError with the headers and OpenAI's error code. Exits 0
when all holds.
"""
import sys
import threading

import openai

base = sys.argv[1]
if not base.startswith("http://127.0.0.1:"):
    sys.exit("openai_limits: loopback only")

sdk = openai.OpenAI(base_url=base, api_key="sk-sdk")
msgs = [{"role": "user", "content": "hi"}]

# 1. Headers on a success, read through the SDK's raw response.
raw = sdk.chat.completions.with_raw_response.create(model="m1", messages=msgs, stream=True)
assert raw.headers["x-ratelimit-limit-requests"] == "100", raw.headers
assert raw.headers["x-ratelimit-remaining-requests"] == "99", raw.headers
first = raw.parse()
it = iter(first)
chunk = next(it)  # the stream is open: the key's one concurrent request
assert chunk.choices[0].delta.role == "assistant", chunk

# 2. A second request while it streams: 429, then the SDK's own retry.
result = {}


def second():
    try:
        r = sdk.chat.completions.create(model="m1", messages=msgs)
        result["ok"] = r.choices[0].message.content if r.choices else ""
    except Exception as e:  # reported below
        result["error"] = repr(e)


t = threading.Thread(target=second)
t.start()
# The test opens the replica's gate once the gateway refused the second one;
# the first stream then ends.
text = "".join(c.choices[0].delta.content or "" for c in it if c.choices)
assert "hello" in text, text
t.join(timeout=30)
assert not t.is_alive(), "the retried request did not finish"
assert "error" not in result, result
# (The test checks on the gateway's side that it was refused first.)
print("max_concurrent: retried and got through")

# 3. Over requests_per_minute with retries off: RateLimitError with the headers.
tight = openai.OpenAI(base_url=base, api_key="sk-tight", max_retries=0)
tight.chat.completions.create(model="m1", messages=msgs)
try:
    tight.chat.completions.create(model="m1", messages=msgs)
    sys.exit("a second request within the minute went through")
except openai.RateLimitError as e:
    assert e.status_code == 429
    assert e.code == "rate_limit_exceeded", e.body
    h = e.response.headers
    assert h["x-ratelimit-limit-requests"] == "1", h
    assert h["x-ratelimit-remaining-requests"] == "0", h
    assert int(h["retry-after"]) >= 1, h
print("requests_per_minute: RateLimitError with OpenAI's headers")
