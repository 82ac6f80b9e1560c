#!/usr/bin/env bash
# Driver of loadtest/scenarios/independent.yaml: an independent load
# generator (NVIDIA's aiperf, offline with a word-level tokenizer) against
# `slogate demo`, its counts and TTFT beside slogate's own /metrics. One
# run into $RUN on a fresh demo. aiperf is installed once into
# target/venv-aiperf (about 1.2 GB).
#
#   loadtest/run independent
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
REQUESTS=$(bench_var requests) CONCURRENCY=$(bench_var concurrency)

VENV="$ROOT/target/venv-aiperf"
if [ ! -x "$VENV/bin/aiperf" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q aiperf tokenizers
fi
AIPERF_VERSION=$("$VENV/bin/pip" show aiperf | awk '/^Version/{print $2}')
[ -d "$WORK/hf" ] || "$VENV/bin/python" "$HERE/word_tokenizer.py" "$WORK/hf"

start_demo
REPLICA=$(sed -n 's|.* simulated vLLM replicas of [^ ]* (\(http://[0-9.:]*\), .*|\1|p' "$RUN/demo.out")
REPLICA2=$(sed -n 's|.* simulated vLLM replicas of [^ ]* (http://[0-9.:]*, \(http://[0-9.:]*\)).*|\1|p' "$RUN/demo.out")
# aiperf NAME CONCURRENCY URL...: one run (URLs in turn), its artifacts in $RUN/NAME.
aiperf() {
  local name=$1 conc=$2; shift 2
  local urls=(); for u in "$@"; do urls+=(--url "$u"); done
  HF_HUB_CACHE="$WORK/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/aiperf" profile \
    --model "$MODEL" "${urls[@]}" --url-strategy round_robin --endpoint-type chat --streaming \
    --tokenizer local/word --use-server-token-count \
    --concurrency "$conc" --request-count "$REQUESTS" \
    --prompt-input-tokens-mean 64 --prompt-input-tokens-stddev 0 \
    --prompt-output-tokens-mean 32 --prompt-output-tokens-stddev 0 \
    --random-seed "$SEED" --output-artifact-dir "$RUN/$name" --ui-type none >"$RUN/$name.log" 2>&1 \
    || { echo "aiperf failed:" >&2; tail -40 "$RUN/$name.log" >&2; exit 1; }
}
# Through the gateway, then the control: the same run straight to the two
# replicas in turn (the same load on each, and on aiperf), where the
# simulators' own TTFT is the server side. What aiperf adds on its side
# shows in the control's gap, and is not the gateway's.
curl -s "$ADMIN/metrics" >"$RUN/before.prom"
aiperf aiperf "$CONCURRENCY" "$DATA"
curl -s "$ADMIN/metrics" >"$RUN/after.prom"
{ curl -s "$REPLICA/metrics"; curl -s "$REPLICA2/metrics" | sed 's/}/,replica="2"}/'; } >"$RUN/replica-before.prom"
aiperf direct "$CONCURRENCY" "$REPLICA" "$REPLICA2"
{ curl -s "$REPLICA/metrics"; curl -s "$REPLICA2/metrics" | sed 's/}/,replica="2"}/'; } >"$RUN/replica-after.prom"

"$BIN/bench" report independent "$RUN" "aiperf $AIPERF_VERSION"
