"""Check an OpenAI-compatible endpoint with the real OpenAI Python SDK.

Usage: python openai_check.py BASE_URL MODEL
Exits non-zero with a message on the first mismatch.
"""
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base.rstrip("/") + "/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "Say something about gateways."}]

chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True))
with_choices = [c for c in chunks if c.choices]
assert with_choices[0].choices[0].delta.role == "assistant", with_choices[0]
assert (with_choices[0].choices[0].delta.content or "") == "", "the role chunk carries no content"
text = "".join(c.choices[0].delta.content or "" for c in with_choices)
assert len(text.split()) == 8, text
assert with_choices[-1].choices[0].finish_reason == "length", with_choices[-1]
assert all(c.usage is None for c in chunks), "no usage unless asked"

chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}))
last = chunks[-1]
assert last.choices == [] and last.usage is not None, last
assert last.usage.completion_tokens == 6 and last.usage.prompt_tokens > 0, last.usage

r = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length", r
assert r.choices[0].message.role == "assistant" and r.choices[0].message.content

parts = list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=3, stream=True))
assert "".join(p.choices[0].text for p in parts if p.choices).strip(), parts
assert parts[-1].choices[0].finish_reason == "length"

e = client.embeddings.create(model=model, input=["a", "b"])
assert len(e.data) == 2 and len(e.data[0].embedding) > 0, e

ids = [m.id for m in client.models.list().data]
assert model in ids, ids

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    raise AssertionError("unknown model must fail")
except openai.NotFoundError:
    pass

print("openai sdk: ok")
