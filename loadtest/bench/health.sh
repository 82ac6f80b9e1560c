#!/usr/bin/env bash
# Driver of loadtest/scenarios/health.yaml: a busy replica is not a dead
# one. One run into $RUN: for each gateway (defaults, panic_off), a fresh
# replica streaming to thousands of open streams whose /health turns slow
# fail_at seconds in.
#
#   loadtest/run health
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
FAIL_AT=$(bench_var fail_at)
ulimit -n "$(ulimit -Hn)"

for name in defaults panic_off; do
  start_sim "sim-$name" --profile llama8b-h100 --step-base-ms 1000 --decode-per-seq-ms 0 --prefill-per-token-ms 0 \
    --max-num-seqs 20000 --max-num-batched-tokens 10000000 --kv-blocks 10000000
  sim=${SIM_URLS[0]}
  bench_config "$name" "$RUN/gw-$name.yaml"
  start_gateway "$RUN/gw-$name.yaml" "gw-$name"
  bench_load main "$RUN/$name.yaml"
  "$BIN/loadgen" run "$RUN/$name.yaml" --target "$GW_URL" --label "$name" --no-progress --out "$RUN/$name.json" >&2 &
  lg=$!
  sleep "$FAIL_AT"   # the fault comes this far into the load
  curl -sf -X POST "$sim/admin/faults" -H 'content-type: application/json' -d '{"health_delay_secs": 2}' >/dev/null
  sleep 10           # five check periods: the verdict is read after them
  curl -sf "$ADMIN_URL/slo.json" >"$RUN/$name.slo.json"
  wait "$lg"
  grep -c '"replica taken out' "$WORK/gw-$name.log" >"$RUN/$name.takeouts" || true
  cleanup; PIDS=()
done
"$BIN/bench" report health "$RUN"
