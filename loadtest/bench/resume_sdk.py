#!/usr/bin/env python3
"""Streaming chat clients of the official OpenAI SDK, judging each stream as
a user would (for loadtest/bench/resume.sh).

    resume_sdk.py BASE_URL MODEL RATE COUNT OUT.json [SEED]

COUNT streamed `chat.completions.create` calls (AsyncOpenAI, no retries),
arriving at RATE a second (Poisson). Each stream is read to its end and
recorded: whether the SDK raised (an error event, a cut connection, an
HTTP error), the ids its chunks carried, how many role chunks it had, its
finish_reason, and its text's length. A stream is whole when it raised
nothing, had one id, one role chunk and a finish_reason. Loopback only;
stops by itself.
"""
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse

import openai

base, model, rate, count, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 7  # the arrivals' seed
if urlparse(base).hostname not in ("127.0.0.1", "localhost"):
    sys.exit(f"resume_sdk: {base}: loopback only")

start = time.monotonic()
streams = []


async def one(client, i):
    rec = {"i": i, "sent": time.monotonic() - start, "error": None, "ids": [], "roles": 0, "finish": None, "chars": 0, "chunks": 0}
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Tell me a long story, number {i}."}],
            max_tokens=96,
            stream=True,
        )
        async for chunk in stream:
            rec["chunks"] += 1
            if chunk.id not in rec["ids"]:
                rec["ids"].append(chunk.id)
            for c in chunk.choices:
                if c.delta.role:
                    rec["roles"] += 1
                rec["chars"] += len(c.delta.content or "")
                if c.finish_reason:
                    rec["finish"] = c.finish_reason
    except Exception as e:  # what the user's code would see
        rec["error"] = f"{type(e).__name__}: {str(e)[:120]}"
    rec["whole"] = rec["error"] is None and len(rec["ids"]) == 1 and rec["roles"] == 1 and rec["finish"] is not None
    rec["took"] = time.monotonic() - start - rec["sent"]
    streams.append(rec)


async def main():
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(one(client, i)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    await client.close()


asyncio.run(main())
with open(out, "w") as f:
    json.dump(streams, f)
