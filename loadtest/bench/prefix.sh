#!/usr/bin/env bash
# Prefix-cache-aware routing: `balance: prefix_aware` (the default) against
# `least_loaded` and `round_robin`, in front of four simulated vLLM replicas
# that keep a prefix cache as vLLM does (8B profile, one H100 each).
#
#   loadtest/bench/prefix.sh            # every scenario; about 20 minutes
#   SCENARIOS="shared random" loadtest/bench/prefix.sh
#
# Scenarios:
#   shared     inference-perf's shared_prefix shape at half its lengths: 150
#              groups x 5 questions, a 3,000-token system prompt and a
#              600-token question, 100 tokens out; Poisson arrivals at each of
#              RATES in turn (one run each, the caches carrying over).
#   multiturn  64 conversations of 10 turns resending their history: a
#              1,000-token system prompt (the application's, shared), 100
#              tokens a turn.
#   random     prompts that share nothing (3,600 tokens): what prefix-aware
#              routing costs where it cannot help, at RANDOM_RATES.
#   hot        half the load on one prefix, the other half on the 150 groups.
#   fleet      the shared scenario through three gateways (requests take them
#              in turn), at FLEET_RATES.
# Each scenario starts fresh replicas (every cache empty) and gateways, then
# runs its rates in turn. Gateways run the defaults a user gets (learned limits, the reference
# classes: chat's TTFT target is 300 ms); only `balance` changes. Writes
# loadtest/results/prefix/README.md and its SVG charts.
set -euo pipefail
WORK=$(mktemp -d); export WORK
source "$(dirname "$0")/../lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
SCENARIOS=${SCENARIOS:-"shared multiturn random hot fleet"}
SECS=${SECS:-30}
RATES=${RATES:-"20 40 60 80"}
RANDOM_RATES=${RANDOM_RATES:-"10 20"}
FLEET_RATES=${FLEET_RATES:-"20 40 60"}
POLICIES=${POLICIES:-"prefix_aware least_loaded round_robin"}
# The fleet: the simulator's default profile, an 8B model on one H100 each
# (KV for 464,000 tokens a replica). SIM_FLEET="--profile llama8b-h100
# --kv-blocks 12288" gives each a third of that, a fleet whose cache the
# shared prompts' working set fills.
SIM_FLEET=${SIM_FLEET:-"--profile llama8b-h100"}
MODEL=sim-llama-8b
build_release

# gateway_yaml FILE BALANCE URL...: the defaults, but for loopback listeners
# and the balance (JSON is YAML; written by a serializer, not by hand).
gateway_yaml() {
  python3 - "$@" <<'EOF'
import json, sys
path, balance, *urls = sys.argv[1:]
cfg = {"server": {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "shutdown_grace": "2s"},
       "pools": [{"name": "default", "models": ["auto"], "replicas": urls, "balance": balance}]}
json.dump(cfg, open(path, "w"), indent=1)
EOF
}

# scenario_json FILE KIND RATE: the loadgen scenario of KIND at RATE req/s.
scenario_json() {
  python3 - "$@" "$SECS" "$MODEL" <<'EOF'
import json, sys
path, kind, rate, secs, model = sys.argv[1:]
rate = float(rate)
def stream(name, dataset, r):
    return {"name": name, "class": "chat", "model": model, "arrival": {"kind": "poisson", "rate": r}, "dataset": dataset}
shared = {"name": "shared_prefix", "groups": 150, "prompts_per_group": 5, "system_prompt_len": 3000, "question_len": 600, "output_len": 100}
if kind in ("shared", "fleet"):
    streams = [stream("shared", shared, rate)]
elif kind == "multiturn":
    streams = [stream("conversations", {"name": "conversations", "conversations": 64, "turns": 10, "system_prompt_len": 1000,
                                        "turn_len": 100, "output_len": 100, "shared_system": True}, rate)]
elif kind == "random":
    streams = [stream("random", {"name": "random", "input_len": 3600, "output_len": 100}, rate)]
elif kind == "hot":
    hot = dict(shared, groups=1, prompts_per_group=2000)
    streams = [stream("hot", hot, rate / 2), stream("rest", shared, rate / 2)]
json.dump({"target": "http://127.0.0.1:1", "duration": f"{secs}s", "warmup": "0s", "request_timeout": "60s",
           "classes": {"chat": {"ttft_ms": 300, "itl_ms": 50}}, "streams": streams}, open(path, "w"), indent=1)
EOF
}

# sim_metrics URL...: prefix cache queries and hits, and finished requests, of each replica (JSON lines).
sim_metrics() {
  for u in "$@"; do
    curl -s "$u/metrics" | python3 -c 'import sys, json
m = {"queries": 0, "hits": 0, "requests": 0}
for l in sys.stdin:
    if l.startswith("#"): continue
    name, _, v = l.rpartition(" ")
    if name.startswith("vllm:prefix_cache_queries_total"): m["queries"] += float(v)
    if name.startswith("vllm:prefix_cache_hits_total"): m["hits"] += float(v)
    if name.startswith("vllm:request_success_total"): m["requests"] += float(v)
print(json.dumps(m))'
  done
}

# sample_waiting NAME URL...: every second until stopped, each replica's waiting queue (one line per sample).
sample_waiting() {
  local name=$1; shift
  while true; do
    for u in "$@"; do curl -s -m 1 "$u/metrics" | awk '/^vllm:num_requests_waiting/ {printf "%s ", $NF}'; done
    echo; sleep 1
  done >"$WORK/$name.waiting"
}

# run_series NAME KIND BALANCE GATEWAYS RATE...: fresh replicas and gateways,
# then one run per rate in turn (the caches carry over, as under a load that
# rises); each run NAME-RATE with the replicas' counters before and after it.
run_series() {
  local name=$1 kind=$2 balance=$3 n=$4 targets=() i rate; shift 4
  PIDS=()
  # shellcheck disable=SC2086
  start_sim "sim-$name" --replicas 4 $SIM_FLEET
  gateway_yaml "$WORK/$name.gw.json" "$balance" "${SIM_URLS[@]}"
  for i in $(seq "$n"); do start_gateway "$WORK/$name.gw.json" "gw-$name-$i"; targets+=("$GW_URL"); done
  for rate in "$@"; do
    echo "$name-$rate: $kind, $balance, $rate req/s, $n gateway(s)" >&2
    scenario_json "$WORK/$name-$rate.scenario.json" "$kind" "$rate"
    sim_metrics "${SIM_URLS[@]}" >"$WORK/$name-$rate.sim0"
    sample_waiting "$name-$rate" "${SIM_URLS[@]}" & local sampler=$!
    run_lg "$WORK/$name-$rate.scenario.json" "$(IFS=,; echo "${targets[*]}")" "$name-$rate" >/dev/null
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    sim_metrics "${SIM_URLS[@]}" >"$WORK/$name-$rate.sim1"
    runs+=("$name-$rate")
  done
  cleanup; PIDS=()
}

# (Loop variables are named apart from lib.sh's `cleanup`, which uses `p`.)
runs=()
for scen in $SCENARIOS; do
  case $scen in
    shared) for pol in $POLICIES; do run_series "shared-$pol" shared "$pol" 1 $RATES; done ;;
    multiturn) for pol in prefix_aware least_loaded; do run_series "multiturn-$pol" multiturn "$pol" 1 20; done ;;
    random) for pol in prefix_aware least_loaded; do run_series "random-$pol" random "$pol" 1 $RANDOM_RATES; done ;;
    hot) for pol in prefix_aware least_loaded; do run_series "hot-$pol" hot "$pol" 1 40; done ;;
    fleet) for pol in prefix_aware least_loaded; do run_series "fleet-$pol" fleet "$pol" 3 $FLEET_RATES; done ;;
    *) echo "unknown scenario $scen" >&2; exit 2 ;;
  esac
done

# The decision's cost and the index's memory, outside any load.
(cd "$ROOT" && cargo run --release --locked -q --example prefix_cost) >"$WORK/cost.md"

python3 "$HERE/prefix_report.py" "$WORK" "$(machine_line)" "$SECS" "$SIM_FLEET" "${runs[@]}" >"$WORK/README.md"
for chart in throughput ttft; do
  [ -f "$WORK/$chart.csv" ] || continue
  line=(); [ "$chart" = ttft ] && line=(--line "chat TTFT target=300")
  "$BIN/loadgen" chart "$WORK/$chart.csv" --dir "$WORK" --stem "$chart" --title "$(head -1 "$WORK/$chart.title")" \
    --y-label "$(tail -1 "$WORK/$chart.title")" "${line[@]}"
done
rm -f "$WORK"/*.png
publish "$WORK" "$ROOT/loadtest/results/prefix"
cat "$ROOT/loadtest/results/prefix/README.md"
