"""The same OpenAI SDK code against several base URLs: the models each
lists, and each model's answers (whole and streamed) to the same prompts.

    migration_sdk.py API_KEY OUT.json NAME=BASE_URL...
"""
import json
import sys

import openai

PROMPTS = ["Say hello.", "Count to three."]


def ask(client, model, prompt, stream):
    if not stream:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=12)
        return {"text": r.choices[0].message.content, "finish": r.choices[0].finish_reason}
    text, finish = [], None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=12, stream=True):
        for c in chunk.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return {"text": "".join(text), "finish": finish}


def main():
    key, out, bases = sys.argv[1], sys.argv[2], sys.argv[3:]
    result = {}
    for spec in bases:
        name, url = spec.split("=", 1)
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)
        entry = {"url": url, "models": None, "answers": {}, "failed": [], "unknown_model": None}
        try:
            entry["models"] = sorted(m.id for m in client.models.list())
        except Exception as e:  # noqa: BLE001 - stated in the report
            entry["failed"].append(f"models: {e!r}")
        for model in ("m-small", "m-big"):
            for prompt in PROMPTS:
                for stream in (False, True):
                    label = f"{model} / {prompt} / {'streamed' if stream else 'whole'}"
                    try:
                        entry["answers"][label] = ask(client, model, prompt, stream)
                    except Exception as e:  # noqa: BLE001
                        entry["failed"].append(f"{label}: {e!r}")
        try:
            ask(client, "no-such-model", PROMPTS[0], False)
            entry["unknown_model"] = "answered"
        except openai.APIStatusError as e:
            entry["unknown_model"] = e.status_code
        result[name] = entry
    json.dump(result, open(out, "w"), indent=1)


main()
