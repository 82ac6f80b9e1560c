#!/usr/bin/env python3
"""Anthropic's SDK streaming Messages, timed by the client (for
loadtest/bench/messages.sh).

    messages_sdk.py BASE_URL MODEL COUNT CONCURRENCY SEED OUT.json

COUNT `messages.stream` calls (AsyncAnthropic, no retries), CONCURRENCY at
once, each a 64-word prompt and at most 32 output tokens. Each stream's
TTFT (the call to its first text event), its gaps (between text events)
and its final message's usage are written to OUT.json, with the errors.
Loopback only; stops by itself.
"""
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse

import anthropic

base, model, count, conc, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
if urlparse(base).hostname not in ("127.0.0.1", "localhost"):
    sys.exit(f"messages_sdk: {base}: loopback only")
rng = random.Random(seed)
WORDS = "the a gateway replica stream token answer model prompt cache queue slot river stone cloud light".split()
prompts = [" ".join(rng.choice(WORDS) for _ in range(64)) for _ in range(count)]
ttfts, gaps, errors = [], [], []
usage = {"input": 0, "output": 0}


async def one(client, prompt):
    start = time.perf_counter()
    last = None
    try:
        async with client.messages.stream(model=model, max_tokens=32, messages=[{"role": "user", "content": prompt}]) as s:
            async for _ in s.text_stream:
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - start)
                else:
                    gaps.append(now - last)
                last = now
            m = await s.get_final_message()
        usage["input"] += m.usage.input_tokens
        usage["output"] += m.usage.output_tokens
    except Exception as e:  # counted, reported
        errors.append(repr(e)[:200])


async def main():
    client = anthropic.AsyncAnthropic(base_url=base, api_key="demo", max_retries=0)
    queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)

    async def worker():
        while not queue.empty():
            await one(client, queue.get_nowait())

    await asyncio.gather(*(worker() for _ in range(conc)))
    json.dump({"sent": count, "ttft_s": ttfts, "gaps_s": gaps, "usage": usage, "errors": errors}, open(out, "w"))


asyncio.run(main())
