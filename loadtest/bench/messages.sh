#!/usr/bin/env bash
# Driver of loadtest/scenarios/messages.yaml: Anthropic's SDK streaming
# Messages through `slogate demo`, its own timings and usage beside
# slogate's /metrics. One run into $RUN on a fresh demo.
#
#   loadtest/run messages
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
bash "$ROOT/scripts/setup-test-deps" >&2   # Anthropic's SDK (.venv)
REQUESTS=$(bench_var requests) CONCURRENCY=$(bench_var concurrency)

start_demo

curl -s "$ADMIN/metrics" >"$RUN/before.prom"
"$ROOT/.venv/bin/python" "$HERE/messages_sdk.py" "$DATA" "$MODEL" "$REQUESTS" "$CONCURRENCY" "$SEED" "$RUN/sdk.json"
sleep 0.5   # the last streams' accounting lands after their last byte
curl -s "$ADMIN/metrics" >"$RUN/after.prom"
SDK_VERSION=$("$ROOT/.venv/bin/pip" show anthropic | awk '/^Version/{print $2}')
"$BIN/bench" report messages "$RUN" "anthropic $SDK_VERSION"
