#!/usr/bin/env bash
# An independent load generator against `slogate demo`: NVIDIA's aiperf
# (from PyPI, run offline with a word-level tokenizer) streams chat through
# the demo's gateway, and its request count and TTFT are set beside
# slogate's own (its /metrics) for the same requests.
#
#   loadtest/bench/independent.sh        # REQUESTS=300 CONCURRENCY=8
#
# aiperf is installed once into target/venv-aiperf (about 1.2 GB). Everything
# runs on 127.0.0.1 and stops by itself. Writes
# loadtest/results/independent/README.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
REQUESTS=${REQUESTS:-300}
CONCURRENCY=${CONCURRENCY:-8}
build_release
MACHINE=$(machine_line)

VENV="$ROOT/target/venv-aiperf"
if [ ! -x "$VENV/bin/aiperf" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q aiperf tokenizers
fi
AIPERF_VERSION=$("$VENV/bin/pip" show aiperf | awk '/^Version/{print $2}')
"$VENV/bin/python" "$HERE/bench/word_tokenizer.py" "$WORK/hf"

# The demo on free ports; its first lines say where.
( "$BIN/slogate" demo --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$WORK/demo.out" 2>"$WORK/demo.err" ) &
PIDS+=($!)
for _ in $(seq 200); do grep -q '^admin:' "$WORK/demo.out" 2>/dev/null && break; sleep 0.05; done
DATA=$(sed -n 's|^slogate demo: gateway \(http://[0-9.:]*\) .*|\1|p' "$WORK/demo.out")
ADMIN=$(sed -n 's|^admin: \(http://[0-9.:]*\)/metrics.*|\1|p' "$WORK/demo.out")
MODEL=$(sed -n 's|.* simulated vLLM replicas of \([^ ]*\) .*|\1|p' "$WORK/demo.out")
[ -n "$DATA" ] && [ -n "$ADMIN" ] || { echo "the demo did not start:" >&2; cat "$WORK/demo.out" "$WORK/demo.err" >&2; exit 1; }
for _ in $(seq 200); do curl -sf "$DATA/health" >/dev/null && break; sleep 0.05; done
REPLICA=$(sed -n 's|.* simulated vLLM replicas of [^ ]* (\(http://[0-9.:]*\), .*|\1|p' "$WORK/demo.out")
REPLICA2=$(sed -n 's|.* simulated vLLM replicas of [^ ]* (http://[0-9.:]*, \(http://[0-9.:]*\)).*|\1|p' "$WORK/demo.out")
# aiperf NAME CONCURRENCY URL...: one run (URLs in turn), its artifacts in $WORK/NAME.
aiperf() {
  local name=$1 conc=$2; shift 2
  local urls=(); for u in "$@"; do urls+=(--url "$u"); done
  HF_HUB_CACHE="$WORK/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/aiperf" profile \
    --model "$MODEL" "${urls[@]}" --url-strategy round_robin --endpoint-type chat --streaming \
    --tokenizer local/word --use-server-token-count \
    --concurrency "$conc" --request-count "$REQUESTS" \
    --prompt-input-tokens-mean 64 --prompt-input-tokens-stddev 0 \
    --prompt-output-tokens-mean 32 --prompt-output-tokens-stddev 0 \
    --output-artifact-dir "$WORK/$name" --ui-type none >"$WORK/$name.log" 2>&1 \
    || { echo "aiperf failed:" >&2; tail -40 "$WORK/$name.log" >&2; exit 1; }
}
# Through the gateway, then the control: the same run straight to the two
# replicas in turn (the same load on each, and on aiperf), where the
# simulators' own TTFT is the server side. What aiperf adds on its side
# shows in the control's gap, and is not the gateway's.
curl -s "$ADMIN/metrics" >"$WORK/before.prom"
aiperf aiperf "$CONCURRENCY" "$DATA"
curl -s "$ADMIN/metrics" >"$WORK/after.prom"
{ curl -s "$REPLICA/metrics"; curl -s "$REPLICA2/metrics" | sed 's/}/,replica="2"}/'; } >"$WORK/replica-before.prom"
aiperf direct "$CONCURRENCY" "$REPLICA" "$REPLICA2"
{ curl -s "$REPLICA/metrics"; curl -s "$REPLICA2/metrics" | sed 's/}/,replica="2"}/'; } >"$WORK/replica-after.prom"

mkdir -p "$WORK/out"
python3 "$HERE/bench/independent_report.py" "$WORK" "$MACHINE" "aiperf $AIPERF_VERSION" "$REQUESTS" "$CONCURRENCY" >"$WORK/out/README.md"
publish "$WORK/out" "$ROOT/loadtest/results/independent"
cat "$ROOT/loadtest/results/independent/README.md"
