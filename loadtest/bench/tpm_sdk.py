#!/usr/bin/env python3
"""Drive a key with tokens_per_minute through the OpenAI Python SDK (for
loadtest/bench/tenants.sh tpm).

    tpm_sdk.py BASE_URL ADMIN_URL LIMIT MINUTES OUT.json

Eight threads call chat.completions.create with key `sk-sdk` as fast as
the SDK lets them (its default retries: on a 429 it waits as Retry-After
says, twice, then raises RateLimitError, after which the thread goes on),
and one thread sends a request a second with key `sk-other`, which has no
limits. Every 429 is checked for OpenAI's rate-limit headers. Writes what
happened (each answer's time and tokens, refusals, errors) and the
gateway's own token count for the key. Loopback only; stops by itself.
"""
import json
import sys
import threading
import time
import urllib.request
from urllib.parse import urlparse

import openai

base, admin, limit, minutes, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
for u in (base, admin):
    if urlparse(u).hostname not in ("127.0.0.1", "localhost"):
        sys.exit(f"tpm_sdk: {u}: loopback only")

# The key limits tokens only: these, and Retry-After, are on every 429 it gets.
HEADERS = ["x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", "retry-after"]
PROMPT = "Summarise the following notes on capacity planning for a fleet of inference replicas. " * 8
start = time.monotonic()
deadline = start + minutes * 60
lock = threading.Lock()
answers, refusals, errors, other = [], [], [], {"ok": 0, "refused": 0, "error": 0}


def driver(i):
    client = openai.OpenAI(base_url=base, api_key="sk-sdk")
    while time.monotonic() < deadline:
        try:
            r = client.chat.completions.create(
                model="sim-llama-8b", messages=[{"role": "user", "content": PROMPT}], max_tokens=100
            )
            with lock:
                answers.append({"t": time.monotonic() - start, "tokens": r.usage.total_tokens})
        except openai.RateLimitError as e:
            h = e.response.headers
            with lock:
                refusals.append({
                    "t": time.monotonic() - start,
                    "headers": all(k in h for k in HEADERS),
                    "missing": [k for k in HEADERS if k not in h],
                    "code": e.code,
                })
        except Exception as e:  # counted; the scenario says nothing else is refused
            with lock:
                errors.append(repr(e)[:200])


def bystander():
    client = openai.OpenAI(base_url=base, api_key="sk-other", max_retries=0)
    while time.monotonic() < deadline:
        t = time.monotonic()
        try:
            client.chat.completions.create(model="sim-llama-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=20)
            key = "ok"
        except openai.RateLimitError:
            key = "refused"
        except Exception:
            key = "error"
        with lock:
            other[key] += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))


threads = [threading.Thread(target=driver, args=(i,)) for i in range(8)] + [threading.Thread(target=bystander)]
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.monotonic() - start

metrics = urllib.request.urlopen(admin + "/metrics", timeout=10).read().decode()
gateway_tokens = 0.0
for line in metrics.splitlines():
    if line.startswith('slogate_tenant_tokens_total{tenant="sdk"'):
        gateway_tokens += float(line.rsplit(" ", 1)[1])

with open(out, "w") as f:
    json.dump({
        "limit": limit, "minutes": minutes, "elapsed_s": elapsed, "answers": answers, "refusals": refusals,
        "errors": errors, "other": other, "gateway_tokens": gateway_tokens,
    }, f)
print(f"tpm: {len(answers)} answered, {len(refusals)} RateLimitError, {len(errors)} other errors; "
      f"{gateway_tokens:.0f} tokens in {elapsed:.0f} s (limit {limit}/min)", file=sys.stderr)
