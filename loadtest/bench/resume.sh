#!/usr/bin/env bash
# Driver of loadtest/scenarios/resume.yaml: lose no stream to a replica.
# One run into $RUN: three faults (kill, faults, stall), each with resume on
# (the defaults) and off, on fresh replicas, the official OpenAI SDK reading
# every stream.
#
#   loadtest/run resume
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv)
RATE=$(bench_var rate) COUNT=$(bench_var count) FAULT_AT=$(bench_var fault_at)
SIM_MODEL=sim-chat

# one FAULT MODE: fresh replicas, a gateway, the SDK clients, the fault.
one() {
  local fault=$1 mode=$2 faults=() a_pid a b conf=$2
  [ "$fault" = faults ] && faults=(--cut-rate 0.03 --stream-error-rate 0.03)
  [ "$fault" = stall ] && conf=${mode}_stall
  start_sim "a-$fault-$mode" --model "$SIM_MODEL" --step-base-ms 20 $SIM_EVEN "${faults[@]}"; a=${SIM_URLS[0]}; a_pid=${PIDS[-1]}
  start_sim "b-$fault-$mode" --model "$SIM_MODEL" --step-base-ms 20 $SIM_EVEN "${faults[@]}"; b=${SIM_URLS[0]}
  SIM_URLS=("$a" "$b")
  bench_config "$conf" "$RUN/gw-$fault-$mode.yaml"
  start_gateway "$RUN/gw-$fault-$mode.yaml" "gw-$fault-$mode"
  "$ROOT/.venv/bin/python" "$HERE/resume_sdk.py" "$GW_URL/v1" "$SIM_MODEL" "$RATE" "$COUNT" "$RUN/$fault-$mode.json" "$SEED" &
  local clients=$!
  sleep "$FAULT_AT"
  case $fault in
    kill) kill -KILL "$a_pid" ;;
    stall) curl -sf -X POST "$a/admin/faults" -H 'content-type: application/json' -d '{"stall_secs": 4}' >/dev/null ;;
  esac
  wait "$clients"
  sleep 1   # the last streams' accounting lands after their last byte
  curl -sf "$ADMIN_URL/metrics" >"$RUN/$fault-$mode.metrics"
  cleanup; PIDS=()
}

for fault in kill faults stall; do
  for mode in on off; do
    echo "== $fault, resume $mode" >&2
    one "$fault" "$mode"
  done
done
"$BIN/bench" report resume "$RUN" "$FAULT_AT"
