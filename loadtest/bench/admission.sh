#!/usr/bin/env bash
# The admission scenarios against simulated 70B replicas, each run side by
# side; each scenario's result (README.md, stamped with commit and machine,
# and its SVG charts) replaces loadtest/results/admission/SCENARIO/:
#
#   overload   fleet of capacity C (measured first), offered 2C for 150 s:
#              chat 0.4C, batch 1.6C; straight to the replicas, then through slogate
#   breaker    a slowdown pushes chat TTFT P99 past 2x SLO; when does the
#              breaker open, what do callers get, when does it close
#   reduction  a moderate overload of long multi-turn chats, without and with
#              context reduction
#   shedlate   chat alone at 1.5 C and 3 C for 60 s, with
#              tiers.interactive.shed_late off and on, defaults otherwise:
#              goodput, chat within SLO, how long refused callers waited
#
#   loadtest/bench/admission.sh [overload] [breaker] [reduction] [shedlate]   (default: all)
#
# RUNS (default 3) repeats each scenario, each run on fresh replicas with its
# load drawn from another seed, into DIR/run-N/; the result judges each check
# on the median run and states every run's number (admission_report.py runs).
#
# Everything runs on 127.0.0.1 with free ports, bounded in time; it stops by itself.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
OUT="$ROOT/loadtest/results/admission"
RUNS=${RUNS:-3}
build_release
MACHINE=$(machine_line)   # stamped once: the build being measured

gw_up() { start_gateway "$1"; }

# write_config FILE EXTRA_YAML : a gateway over SIM_URLS with EXTRA_YAML appended.
write_config() {
  local file=$1 extra=$2
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    replicas: [$(IFS=,; echo "${SIM_URLS[*]}" | sed 's/,/, /g')]"
    echo "$extra"
  } >"$file"
}

loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }

overload() {
  local d="$WORK/overload" i; mkdir -p "$d"
  # 1. Capacity C: two replicas, closed loop at 128 (2 x max_num_seqs), round robin.
  measure_capacity "$d"
  for i in $(seq 1 "$RUNS"); do overload_run "$d/run-$i" "$i"; done
  judge "$d" overload
}

# judge DIR SCENARIO : the runs' result, published.
judge() {
  python3 "$HERE/admission_report.py" runs "$1" "loadtest/bench/admission.sh $2" "$MACHINE"
  publish "$1" "$OUT/$2"
}

overload_run() { # DIR SEED
  local d=$1 chat_rate batch_rate; mkdir -p "$d"
  chat_rate=$(python3 -c "print(round(0.4*$C, 3))")
  batch_rate=$(python3 -c "print(round(1.6*$C/8, 3))")   # M^X: batches of 8
  { echo "target: http://127.0.0.1:1"; echo "duration: 150s"; echo "warmup: 20s"; echo "request_timeout: 60s"; echo "seed: $2"; echo "streams:"
    chat_stream chat chat "{ kind: poisson, rate: $chat_rate }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
    chat_stream batch batch "{ kind: batch, rate: $batch_rate, size: { dist: fixed, value: 8 } }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
  } >"$d/scenario.yaml"
  # 2. Straight to the replicas (client-side round robin), fresh replicas.
  sim_up --replicas 2
  loadgen run "$d/scenario.yaml" --target "$TARGETS" --label direct --out "$d/direct.json" --report "$d/direct.md" --plots "$d" --no-progress
  sim_down
  # 3. Through slogate, fresh replicas.
  sim_up --replicas 2
  write_config "$WORK/gw.yaml" "    max_inflight_per_replica: 64   # = max_num_seqs: the replica runs everything it is given
    upstream_priority: true
tiers:
  interactive: { reserved_share: 0.5 }
  batch: { queue_timeout: 2s }     # a batch request served later than this misses its 3 s TTFT target anyway"
  sed -n '/max_inflight/,$p' "$WORK/gw.yaml" >"$d/gateway-extra.yaml"
  gw_up "$WORK/gw.yaml"
  python3 "$HERE/timeline.py" --admin "$ADMIN_URL" --class chat --duration 215 --out "$d/timeline.csv" &
  local tl=$!
  loadgen run "$d/scenario.yaml" --target "$GW_URL" --label gateway --out "$d/gateway.json" --report "$d/gateway.md" --plots "$d" --no-progress
  kill "$tl" 2>/dev/null || true; wait "$tl" 2>/dev/null || true
  cp "$WORK/gateway.log" "$d/gateway.log"   # read by the report; not committed
  gw_down; sim_down
  loadgen compare "$d/direct.json" "$d/gateway.json" >"$d/compare.md"
  python3 "$HERE/admission_report.py" overload "$d" "$C" "$MACHINE"
}

shedlate() {
  local d="$WORK/shedlate" i; mkdir -p "$d"
  measure_capacity "$d"
  for i in $(seq 1 "$RUNS"); do shedlate_run "$d/run-$i" "$i"; done
  judge "$d" shedlate
}

shedlate_run() { # DIR SEED
  local d=$1 x rate shed; mkdir -p "$d"
  for x in 1.5 3; do
    rate=$(python3 -c "print(round($x*$C, 3))")
    { echo "target: http://127.0.0.1:1"; echo "duration: 70s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "seed: $2"; echo "streams:"
      chat_stream chat chat "{ kind: poisson, rate: $rate }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
    } >"$d/load-$x.yaml"
    for shed in false true; do
      sim_up --replicas 2
      write_config "$WORK/gw.yaml" "tiers: { interactive: { shed_late: $shed } }"
      gw_up "$WORK/gw.yaml"
      loadgen run "$d/load-$x.yaml" --target "$GW_URL" --label "x$x-$shed" --out "$d/x$x-$shed.json" --report "$d/x$x-$shed.md" --no-progress
      gw_down; sim_down
    done
  done
  python3 "$HERE/admission_report.py" shedlate "$d" "$C" "$MACHINE"
}

breaker() {
  local d="$WORK/breaker" i; mkdir -p "$d"
  for i in $(seq 1 "$RUNS"); do breaker_run "$d/run-$i" "$i"; done
  judge "$d" breaker
}

breaker_run() { # DIR SEED
  local d=$1; mkdir -p "$d"
  sim_up --replicas 1
  { echo "target: http://127.0.0.1:1"; echo "duration: 110s"; echo "warmup: 0s"; echo "request_timeout: 60s"; echo "seed: $2"; echo "streams:"
    chat_stream chat chat "{ kind: poisson, rate: 4 }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
  } >"$d/scenario.yaml"
  write_config "$WORK/gw.yaml" "    max_inflight_per_replica: 64
breaker: { window: 10s }   # P99 over the last 10 s, which must stay above 2x target for trip_after (30 s)"
  sed -n '/max_inflight/,$p' "$WORK/gw.yaml" >"$d/gateway-extra.yaml"
  gw_up "$WORK/gw.yaml"
  python3 "$HERE/timeline.py" --admin "$ADMIN_URL" --class chat --duration 112 --out "$d/timeline.csv" \
    --fault "25=${SIM_URLS[0]}={\"slowdown\": 8}" --fault "75=${SIM_URLS[0]}={\"slowdown\": 1}" 2>"$d/faults.log" &
  local tl=$!
  loadgen run "$d/scenario.yaml" --target "$GW_URL" --label breaker --out "$d/breaker.json" --report "$d/breaker.md" --plots "$d" --no-progress
  wait "$tl" || true
  cp "$WORK/gateway.log" "$d/gateway.log"   # read by the report; not committed
  gw_down; sim_down
  python3 "$HERE/admission_report.py" breaker "$d" "$MACHINE"
}

reduction() {
  local d="$WORK/reduction" i; mkdir -p "$d"
  for i in $(seq 1 "$RUNS"); do reduction_run "$d/run-$i" "$i"; done
  judge "$d" reduction
}

reduction_run() { # DIR SEED
  local d=$1; mkdir -p "$d"
  { echo "target: http://127.0.0.1:1"; echo "duration: 120s"; echo "warmup: 0s"; echo "request_timeout: 60s"; echo "seed: $2"; echo "streams:"
    chat_stream chat chat "{ kind: poisson, rate: ${REDUCTION_RATE:-5.6} }" "{ dist: fixed, value: 2500 }" "{ dist: fixed, value: 64 }" 9
  } >"$d/scenario.yaml"
  local common="    max_inflight_per_replica: 24   # keeps the backlog in the gateway queue, where it is reduced on its way out
tiers:
  interactive: { queue_timeout: 20s }
breaker: { window: 10s }"
  for mode in without with; do
    sim_up --replicas 1
    if [ "$mode" = without ]; then
      write_config "$WORK/gw.yaml" "$common
context_reduction: { trigger_ratio: 1000 }   # never triggers"
    else
      write_config "$WORK/gw.yaml" "$common
context_reduction: { max_prompt_tokens: 512, max_tokens_cap: 256 }"
    fi
    sed -n '/max_inflight/,$p' "$WORK/gw.yaml" >"$d/gateway-$mode.yaml"
    gw_up "$WORK/gw.yaml"
    python3 "$HERE/timeline.py" --admin "$ADMIN_URL" --class chat --duration 122 --out "$d/timeline-$mode.csv" &
    local tl=$!
    loadgen run "$d/scenario.yaml" --target "$GW_URL" --label "$mode-reduction" --out "$d/$mode.json" --report "$d/$mode.md" --plots "$d" --no-progress
    wait "$tl" || true
    cp "$WORK/gateway.log" "$d/gateway-$mode.log"   # read by the report; not committed
    gw_down; sim_down
  done
  loadgen compare "$d/without.json" "$d/with.json" >"$d/compare.md"
  python3 "$HERE/admission_report.py" reduction "$d" "$MACHINE"
}

todo=("$@"); [ ${#todo[@]} -eq 0 ] && todo=(overload breaker reduction shedlate)
for t in "${todo[@]}"; do "$t"; done
