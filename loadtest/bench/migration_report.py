"""Report of one litellm-migration run: measured.json and report.md.

    migration_report.py RUN CHECK_OK LITELLM_VERSION SDK_VERSION
"""
import json
import os
import sys

from report_common import write_measured  # beside this script

run, check_ok, ll_version, sdk_version = sys.argv[1], sys.argv[2] == "true", sys.argv[3], sys.argv[4]
got = json.load(open(os.path.join(run, "answers.json")))
names = list(got)
models = {n: got[n]["models"] for n in names}
same_models = len({json.dumps(m) for m in models.values()}) == 1 and models[names[0]] is not None
labels = sorted(set().union(*(got[n]["answers"].keys() for n in names)))
same_answers = all(len({json.dumps(got[n]["answers"].get(l)) for n in names}) == 1 for l in labels) and len(labels) == 8
failed = sum(len(got[n]["failed"]) for n in names)
write_measured(run, {
    "check_ok": check_ok,
    "same_models": (same_models, "; ".join(f"{n}: {models[n]}" for n in names)),
    "same_answers": (same_answers, f"{len(labels)} answers compared across {len(names)} base URLs"),
    "failed": (failed, f"{failed} failed" + (": " + "; ".join(f for n in names for f in got[n]["failed"]) if failed else "")),
})
out = [f"LiteLLM {ll_version}, OpenAI SDK {sdk_version}.", "",
       "| base URL | models | answers | failed | unknown model |", "|---|---|---:|---:|---|"]
for n in names:
    e = got[n]
    out.append(f"| {n} | {', '.join(e['models'] or [])} | {len(e['answers'])} | {len(e['failed'])} | {e['unknown_model']} |")
out += ["", "Each answer (the first base URL's; the others' are compared with it):", "",
        "| request | text | finish |", "|---|---|---|"]
for l in labels:
    a = got[names[0]]["answers"].get(l) or {}
    out.append(f"| {l} | {a.get('text')!r} | {a.get('finish')} |")
report = os.path.join(run, "import-report.md")
if os.path.exists(report):
    out += ["", "What the importer reported (its report.md):", ""]
    out += ["> " + line if line else ">" for line in open(report).read().splitlines()]
open(os.path.join(run, "report.md"), "w").write("\n".join(out) + "\n")
