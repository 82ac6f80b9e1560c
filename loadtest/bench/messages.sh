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

# The demo on free ports; its first lines say where.
( "$BIN/slogate" demo --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$RUN/demo.out" 2>"$RUN/demo.err" ) &
PIDS+=($!)
for _ in $(seq 200); do grep -q '^admin:' "$RUN/demo.out" 2>/dev/null && break; sleep 0.05; done
DATA=$(sed -n 's|^slogate demo: gateway \(http://[0-9.:]*\) .*|\1|p' "$RUN/demo.out")
ADMIN=$(sed -n 's|^admin: \(http://[0-9.:]*\)/metrics.*|\1|p' "$RUN/demo.out")
MODEL=$(sed -n 's|.* simulated vLLM replicas of \([^ ]*\) .*|\1|p' "$RUN/demo.out")
[ -n "$DATA" ] && [ -n "$ADMIN" ] || { echo "the demo did not start:" >&2; cat "$RUN/demo.out" "$RUN/demo.err" >&2; exit 1; }
for _ in $(seq 200); do curl -sf "$DATA/health" >/dev/null && break; sleep 0.05; done

curl -s "$ADMIN/metrics" >"$RUN/before.prom"
"$ROOT/.venv/bin/python" "$HERE/messages_sdk.py" "$DATA" "$MODEL" "$REQUESTS" "$CONCURRENCY" "$SEED" "$RUN/sdk.json"
sleep 0.5   # the last streams' accounting lands after their last byte
curl -s "$ADMIN/metrics" >"$RUN/after.prom"
SDK_VERSION=$("$ROOT/.venv/bin/pip" show anthropic | awk '/^Version/{print $2}')
python3 "$HERE/messages_report.py" "$RUN" "anthropic $SDK_VERSION"
