#!/usr/bin/env bash
# Driver of the tenant scenarios (loadtest/scenarios/tenants/*.yaml): fair
# sharing of a tier among API keys, weights, and a key's own
# tokens-per-minute limit driven by the OpenAI Python SDK. One run of the
# scenario it is given, into $RUN (report.md, measured.json, charts):
#
#   loadtest/run tenants/fair      three tenants in `chat` at 1.5 C, A sending 80 %
#                                  (run 1 also runs the `fifo` and `alone` references)
#   loadtest/run tenants/flood     chat at 0.5 C beside a batch flood at 2 C
#   loadtest/run tenants/weights   two tenants, weights 3 and 1, each offering 1.5 C
#   loadtest/run tenants/tpm       a key with tokens_per_minute, the OpenAI SDK's clients
#
# The gateway configurations and loads are the scenario file's; this script
# fills in what only a run knows (replicas, rates from the capacity C).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }

# through LABEL GATEWAY LOAD_FILE : fresh replicas, gateway configuration
# GATEWAY of the scenario, the load through it; results in RUN/LABEL.*.
through() {
  local label=$1
  sim_up --replicas 2
  bench_config "$2" "$WORK/gw-$label.yaml"
  start_gateway "$WORK/gw-$label.yaml" "gw-$label"
  loadgen run "$3" --target "$GW_URL" --label "$label" --out "$RUN/$label.json" --report "$RUN/$label.md" --no-progress
  curl -sf "$ADMIN_URL/metrics" >"$RUN/$label-metrics.txt" || true
  gw_down; sim_down
}

fair() {
  measure_capacity "$WORK"
  local rates=(--set a_rate="$(calc "1.5*$C*0.8")" --set bc_rate="$(calc "1.5*$C*0.1")")
  bench_load main "$RUN/scenario.yaml" "${rates[@]}"
  if [ "$SEED" = 1 ]; then   # the references, once
    through fifo fifo "$RUN/scenario.yaml"
    bench_load alone "$RUN/alone.yaml" "${rates[@]}"
    through alone keys "$RUN/alone.yaml"
  fi
  through fair keys "$RUN/scenario.yaml"
  "$BIN/bench" report tenants fair "$RUN" "$C"
}

flood() {
  measure_capacity "$WORK"
  bench_load main "$RUN/scenario.yaml" --set chat_rate="$(calc "0.5*$C")" --set batch_rate="$(calc "2*$C")"
  through flood keys "$RUN/scenario.yaml"
  "$BIN/bench" report tenants flood "$RUN" "$C"
}

weights() {
  measure_capacity "$WORK"
  bench_load main "$RUN/scenario.yaml" --set rate="$(calc "1.5*$C")"
  through weights keys "$RUN/scenario.yaml"
  "$BIN/bench" report tenants weights "$RUN" "$C"
}

tpm() {
  bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv)
  local limit minutes
  limit=$(bench_var limit); minutes=$(bench_var minutes)
  # One fast replica (8B on an H100): the key's limit, not the replica, is what binds.
  start_sim sim --replicas 1 --profile llama8b-h100; SIM_PID=${PIDS[-1]}
  bench_config main "$WORK/gw-tpm.yaml"
  start_gateway "$WORK/gw-tpm.yaml" "gw-tpm"
  "$ROOT/.venv/bin/python" "$HERE/tpm_sdk.py" "$GW_URL/v1" "$ADMIN_URL" "$limit" "$minutes" "$RUN/tpm.json"
  gw_down; sim_down
  "$BIN/bench" report tenants tpm "$RUN" "$limit"
}

case ${1:-} in
  fair|flood|weights|tpm) "$1" ;;
  *) echo "usage: tenants.sh fair|flood|weights|tpm (run through loadtest/run tenants/NAME)" >&2; exit 2 ;;
esac
