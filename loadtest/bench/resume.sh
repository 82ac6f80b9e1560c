#!/usr/bin/env bash
# Lose no stream to a replica: streaming chat through slogate over two
# simulated replicas (separate processes) while one of them fails, judged
# by the official OpenAI SDK as a user's code sees each stream
# (resume_sdk.py: an exception, the ids, the role chunks, the finish).
#
# Three faults, each run with slogate's defaults (resume on) and with
# `resume: { max_attempts: 0 }` (off), on fresh replicas:
#   - kill:   replica A is SIGKILLed KILL_AT seconds into the run;
#   - faults: both replicas cut 3 % of their streams (reset) and end 3 %
#             with an error event;
#   - stall:  replica A stops stepping for 4 s (a hung GPU) KILL_AT seconds
#             in; slogate's idle timeout is 2 s for this one (the default
#             is 1 minute, which would only make the run longer).
# COUNT streams arrive at RATE a second (Poisson), 96 tokens at most, 20 ms
# engine steps. Everything runs on 127.0.0.1, bounded in count and time.
# Writes loadtest/results/resume/README.md (stamped).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
RATE=${RATE:-25} COUNT=${COUNT:-200} KILL_AT=${KILL_AT:-3}
build_release
bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv)
MACHINE=$(machine_line)
SIM_MODEL=sim-chat

# run FAULT MODE: fresh replicas, a gateway, the SDK clients, the fault.
run() {
  local fault=$1 mode=$2 faults=() a_pid
  [ "$fault" = faults ] && faults=(--cut-rate 0.03 --stream-error-rate 0.03)
  start_sim "a-$fault-$mode" --model "$SIM_MODEL" --step-base-ms 20 $SIM_EVEN "${faults[@]}"; local a=${SIM_URLS[0]}; a_pid=${PIDS[-1]}
  start_sim "b-$fault-$mode" --model "$SIM_MODEL" --step-base-ms 20 $SIM_EVEN "${faults[@]}"; local b=${SIM_URLS[0]}
  local extra=""
  [ "$mode" = off ] && extra="    resume: { max_attempts: 0 }"
  [ "$fault" = stall ] && extra="$extra
    timeouts: { idle: 2s }"
  MAX_INFLIGHT=auto GATEWAY_EXTRA="$extra" gateway_config "$WORK/gw-$fault-$mode.yaml" "$a" "$b"
  start_gateway "$WORK/gw-$fault-$mode.yaml" "gw-$fault-$mode"
  "$ROOT/.venv/bin/python" "$HERE/bench/resume_sdk.py" "$GW_URL/v1" "$SIM_MODEL" "$RATE" "$COUNT" "$WORK/$fault-$mode.json" &
  local clients=$!
  sleep "$KILL_AT"
  case $fault in
    kill) kill -KILL "$a_pid" ;;
    stall) curl -sf -X POST "$a/admin/faults" -H 'content-type: application/json' -d '{"stall_secs": 4}' >/dev/null ;;
  esac
  wait "$clients"
  sleep 1
  curl -sf "$ADMIN_URL/metrics" >"$WORK/$fault-$mode.metrics"
  cleanup; PIDS=()
}

for fault in kill faults stall; do
  for mode in on off; do
    echo "== $fault, resume $mode" >&2
    run "$fault" "$mode"
  done
done

OUT="$ROOT/loadtest/results/resume"
python3 "$HERE/bench/resume_report.py" "$WORK" "$MACHINE" "$RATE" "$COUNT" "$KILL_AT" >"$WORK/README.md"
publish "$WORK" "$OUT"
cat "$OUT/README.md"
