#!/usr/bin/env bash
# Learned replica limits and the work-conserving reservation against
# simulated 70B replicas (the fleet of loadtest/bench/admission.sh: two
# replicas, max_num_seqs 64, KV for ~65k tokens each, priority scheduling).
# Each scenario's result (README.md with its SVG charts, stamped with commit
# and machine) replaces loadtest/results/limits/SCENARIO/:
#
#   overload  capacity C measured first; then 2 C offered (chat 0.4 C +
#             batch 1.6 C) for DURATION through three gateways in turn, each
#             on fresh replicas: `auto` (learned), `fixed` (64 = max_num_seqs,
#             the hand-tuned value) and `none` (4096: no limit to speak of)
#   shift     the same 2 C, through `auto`; halfway through, prompts double
#             (512 -> 1024 tokens): KV, not max_num_seqs, now caps what a
#             replica runs, and the learned limits must follow; then, for
#             reference, the chat alone with 1024-token prompts
#   slow      the same 2 C, through `auto`; halfway through, one replica's
#             engine steps take twice as long (a throttled GPU): the learned
#             limits follow, chat moves to the replica that holds its ITL
#   batch     batch alone at 2 C for 60 s, then chat at 0.4 C joins after
#             that quiet spell, through `auto`
#   fleet     three gateways in front of the same replicas, 2 C spread over
#             them: `alone` (each with the one-gateway limit 64, no fleet),
#             `fixed` (fleet, 64 shared), `even` and `skewed` (fleet, auto;
#             load 1/3 each, then 70/20/10), `one` (the even load, all of
#             it through one gateway: the reference), `kill` (fleet, auto,
#             even; the third gateway is killed halfway and its load moves to
#             the others)
#
#   coldstart a fresh gateway meets 32 concurrent streams (closed loop) on
#             one replica for 10 s: `auto` (the learned limit, from its
#             start) against `fixed` (256, more than enough), RUNS times (3)
#
#   loadtest/bench/limits.sh [overload] [shift] [slow] [batch] [fleet] [coldstart]   (default: all)
#
# RUNS (default 3) repeats every scenario, each run on fresh replicas with
# other seeds; checks are judged on the median run, the worst stated (shift
# and slow: each run into DIR/run-N/, judged by admission_report.py runs).
# FLEET_VARIANTS picks fleet's runs (default: all six).
#
# ENGINE=llamacpp runs overload, batch, fleet and coldstart against replicas
# with hard slots served first come first served, from an engine the project
# did not write: llama.cpp's server (loadtest/llama.sh: 4 slots each, on the
# last core; the gateways and load generators on the others), 128-token
# prompts; results in loadtest/results/limits-llamacpp/SCENARIO/.
#
# Everything runs on 127.0.0.1 with free ports, bounded in time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
OUT="$ROOT/loadtest/results/limits"
DURATION=${DURATION:-100}
RUNS=${RUNS:-3}
export RESERVED_SHARE=${RESERVED_SHARE:-0.5}   # tiers.interactive.reserved_share of every gateway (the default is 0.25)
ENGINE=${ENGINE:-sim}; export LIMITS_ENGINE=$ENGINE
PROMPT=512            # prompt tokens of every request
FIXED=64              # the hand-tuned limit: the replica's max_num_seqs
CAP_CONCURRENCY=128   # the capacity's closed loop: twice the replicas' slots
build_release
case $ENGINE in
  sim) ;;
  llamacpp)
    source "$HERE/../llama.sh"
    llama_build
    # One engine per core: two on the one core left to them would stall
    # each other's steps (the OS slices the core between them), and chat's
    # ITL with them. The scenarios' fleets of two replicas become one with
    # LLAMA_SLOTS slots.
    sim_up() { llama_up 1; }
    sim_down() { llama_down; }
    PROMPT=128; CAP_CONCURRENCY=$((2 * LLAMA_SLOTS)); FIXED=$LLAMA_SLOTS
    # The engines compute on the last core; gateways and load generators keep to the others.
    others="0-$(($(nproc) - 2))"; export GW_CPUS=${GW_CPUS:-$others} LG_CPUS=${LG_CPUS:-$others}
    OUT="$ROOT/loadtest/results/limits-llamacpp" ;;
  *) echo "ENGINE is sim or llamacpp, not $ENGINE" >&2; exit 2 ;;
esac
MACHINE=$(machine_line)

loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }

# gateway_yaml FILE LIMIT [ADMIN_PORT PEER...] : slogate over SIM_URLS with
# max_inflight_per_replica LIMIT; with peers, in a fleet with them.
gateway_yaml() {
  local file=$1 limit=$2 admin=${3:-0}
  shift 2; [ $# -gt 0 ] && shift
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:$admin, shutdown_grace: 5s }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    replicas: [$(IFS=,; echo "${SIM_URLS[*]}" | sed 's/,/, /g')]"
    echo "    max_inflight_per_replica: $limit"
    # llama.cpp's server has no priority scheduling: its slots are served in arrival order.
    if [ "$ENGINE" = llamacpp ]; then echo "    engine: llamacpp"; else echo "    upstream_priority: true"; fi
    echo "tiers:"
    echo "  interactive: { reserved_share: $RESERVED_SHARE }"
    echo "  batch: { queue_timeout: 2s }"
    if [ $# -gt 0 ]; then echo "fleet: { peers: [$(IFS=,; echo "$*" | sed 's/,/, /g')] }"; fi
  } >"$file"
}

OUTPUT="{ dist: uniform, min: 64, max: 256 }"

# window RATE FROM TO : Poisson arrivals at RATE between FROM and TO seconds, none
# (a negligible rate: stages need one) before and after.
window() {
  local r=$1 from=$2 to=$3 none=0.0001
  if [ "$from" = 0 ]; then
    echo "{ kind: stages, stages: [{ duration: 0.1s, rate: $r }, { duration: $(python3 -c "print($to - 0.1)")s, rate: $r }, { duration: 0.1s, rate: $none }, { duration: 3600s, rate: $none }] }"
  else
    echo "{ kind: stages, stages: [{ duration: ${from}s, rate: $none }, { duration: 0.1s, rate: $r }, { duration: $((to - from))s, rate: $r }] }"
  fi
}

# slow_replica [SECONDS] : after SECONDS (in the background), the first
# replica's engine steps take twice as long.
slow_replica() {
  local url=${SIM_URLS[0]}
  ( sleep "${1:-0}"; curl -sf -X POST -H 'content-type: application/json' -d '{"slowdown": 2.0}' "$url/admin/faults" >/dev/null ) &
}

# capacity_of PROMPT [slow] : the fleet's throughput saturated (closed loop at
# CAP_CONCURRENCY, twice the replicas' slots); with `slow`, one replica at half speed.
capacity_of() {
  sim_up --replicas 2
  if [ "${2:-}" = slow ]; then slow_replica 0; wait $!; fi
  { echo "target: $TARGETS"; echo "duration: 40s"; echo "warmup: 10s"; echo "streams:"
    chat_stream chat chat "{ kind: closed, concurrency: $CAP_CONCURRENCY }" "{ dist: fixed, value: $1 }" "$OUTPUT"
  } >"$WORK/capacity-$1.yaml"
  loadgen run "$WORK/capacity-$1.yaml" --label "capacity-$1" --out "$WORK/capacity-$1.json" --report "$WORK/capacity-$1.md" --no-progress >&2
  sim_down
  python3 "$HERE/admission_report.py" capacity "$WORK/capacity-$1.json"
}
capacity() {
  [ -n "${C:-}" ] && return 0
  C=$(capacity_of "$PROMPT")
  echo "capacity C = $C req/s" >&2
}

# through DIR LABEL LIMIT SCENARIO: fresh replicas, a gateway with LIMIT, the
# scenario through it, the gateway's timeline sampled; results in DIR.
through() {
  local d=$1 label=$2 limit=$3 scenario=$4
  sim_up --replicas 2
  gateway_yaml "$WORK/gw-$label.yaml" "$limit"
  start_gateway "$WORK/gw-$label.yaml" "gw-$label"
  [ -n "${SLOW_AT:-}" ] && slow_replica "$SLOW_AT"
  python3 "$HERE/timeline.py" --admin "$ADMIN_URL" --class chat --duration "$((DURATION + 5))" --out "$d/$label-timeline.csv" &
  local tl=$!
  loadgen run "$scenario" --target "$GW_URL" --label "$label" --out "$d/$label.json" --report "$d/$label.md" --no-progress
  kill "$tl" 2>/dev/null || true; wait "$tl" 2>/dev/null || true
  cp "$WORK/gw-$label.log" "$d/$label.log"   # read by the report; not committed
  gw_down; sim_down
}

mix() { # FILE PROMPT_BEFORE PROMPT_AFTER : 2 C (chat 0.4 C, batch 1.6 C in bursts of 8), prompts switching halfway
  local half=$((DURATION / 2)) chat_rate batch_rate
  chat_rate=$(python3 -c "print(round(0.4*$C, 3))"); batch_rate=$(python3 -c "print(round(1.6*$C/8, 3))")
  { echo "target: http://127.0.0.1:1"; echo "duration: ${DURATION}s"; echo "warmup: 5s"; echo "request_timeout: 60s"; echo "streams:"
    if [ "$2" = "$3" ]; then
      chat_stream chat chat "{ kind: poisson, rate: $chat_rate }" "{ dist: fixed, value: $2 }" "$OUTPUT"
      chat_stream batch batch "{ kind: batch, rate: $batch_rate, size: { dist: fixed, value: 8 } }" "{ dist: fixed, value: $2 }" "$OUTPUT"
    else
      local b; b=$(python3 -c "print(round(1.6*$C, 3))")
      chat_stream chat-a chat "$(window "$chat_rate" 0 "$half")" "{ dist: fixed, value: $2 }" "$OUTPUT"
      chat_stream chat-b chat "$(window "$chat_rate" "$half" "$DURATION")" "{ dist: fixed, value: $3 }" "$OUTPUT"
      chat_stream batch-a batch "$(window "$b" 0 "$half")" "{ dist: fixed, value: $2 }" "$OUTPUT"
      chat_stream batch-b batch "$(window "$b" "$half" "$DURATION")" "{ dist: fixed, value: $3 }" "$OUTPUT"
    fi
  } >"$1"
}

overload() {
  local d="$WORK/overload"; mkdir -p "$d"
  capacity
  local i
  for i in $(seq 1 "$RUNS"); do
    mix "$d/scenario-$i.yaml" "$PROMPT" "$PROMPT"
    echo "seed: $i" >>"$d/scenario-$i.yaml"
    through "$d" "auto-$i" auto "$d/scenario-$i.yaml"
    through "$d" "fixed-$i" "$FIXED" "$d/scenario-$i.yaml"
    through "$d" "none-$i" 4096 "$d/scenario-$i.yaml"
  done
  python3 "$HERE/limits_report.py" overload "$d" "$C" "$MACHINE"
  publish "$d" "$OUT/overload"
}

# judge DIR SCENARIO : the runs in DIR/run-N/ judged together, published.
judge() {
  python3 "$HERE/admission_report.py" runs "$1" "loadtest/bench/limits.sh $2" "$MACHINE"
  publish "$1" "$OUT/$2"
}

shift_() {
  local d="$WORK/shift" i r; mkdir -p "$d"
  capacity
  local C2; C2=$(capacity_of 1024)
  for i in $(seq 1 "$RUNS"); do
    r="$d/run-$i"; mkdir -p "$r"
    mix "$r/scenario.yaml" 512 1024
    echo "seed: $i" >>"$r/scenario.yaml"
    through "$r" auto auto "$r/scenario.yaml"
    # The reference: the same chat with 1024-token prompts and no batch at all,
    # what this fleet can give chat at best once prompts have doubled.
    { echo "target: http://127.0.0.1:1"; echo "duration: 60s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "seed: $i"; echo "streams:"
      chat_stream chat chat "{ kind: poisson, rate: $(python3 -c "print(round(0.4*$C, 3))") }" "{ dist: fixed, value: 1024 }" "$OUTPUT"
    } >"$r/chat-alone.yaml"
    DURATION=60 through "$r" chat-alone auto "$r/chat-alone.yaml"
    python3 "$HERE/limits_report.py" shift "$r" "$C" "$MACHINE" "$((DURATION / 2))" "$C2"
  done
  judge "$d" shift
}

slow() {
  local d="$WORK/slow" i r; mkdir -p "$d"
  capacity
  local C2; C2=$(capacity_of 512 slow)
  for i in $(seq 1 "$RUNS"); do
    r="$d/run-$i"; mkdir -p "$r"
    mix "$r/scenario.yaml" 512 512
    echo "seed: $i" >>"$r/scenario.yaml"
    SLOW_AT=$((DURATION / 2)) through "$r" auto auto "$r/scenario.yaml"
    python3 "$HERE/limits_report.py" slow "$r" "$C" "$MACHINE" "$((DURATION / 2))" "$C2"
  done
  judge "$d" slow
}

batch() {
  local d="$WORK/batch"; mkdir -p "$d"
  capacity
  local quiet=60 rest=$((DURATION - 60)) chat_rate batch_rate i
  [ "$rest" -ge 20 ] || rest=30
  chat_rate=$(python3 -c "print(round(0.4*$C, 3))"); batch_rate=$(python3 -c "print(round(2*$C/8, 3))")
  for i in $(seq 1 "$RUNS"); do
    { echo "target: http://127.0.0.1:1"; echo "duration: $((quiet + rest))s"; echo "warmup: 5s"; echo "request_timeout: 60s"; echo "seed: $i"; echo "streams:"
      chat_stream batch batch "{ kind: batch, rate: $batch_rate, size: { dist: fixed, value: 8 } }" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
      chat_stream chat chat "$(window "$chat_rate" "$quiet" "$((quiet + rest))")" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
    } >"$d/scenario-$i.yaml"
    DURATION=$((quiet + rest)) through "$d" "auto-$i" auto "$d/scenario-$i.yaml"
  done
  python3 "$HERE/limits_report.py" batch "$d" "$C" "$MACHINE" "$quiet"
  publish "$d" "$OUT/batch"
}

# fleet_mix FILE SEED SHARE [KILL_AT [GROWN_SHARE]] : gateway's part of 2 C
# (chat 0.4 C, batch 1.6 C); with KILL_AT, the load stops then (GROWN_SHARE
# empty: the killed gateway's) or grows to GROWN_SHARE (a survivor's). Each
# gateway's load generator has its own SEED: the parts are independent, as a
# load balancer splitting one Poisson stream makes them (one seed for all
# would send three requests, and three bursts of batch, at the same instants).
fleet_mix() {
  local file=$1 seed=$2 share=$3 kill_at=${4:-} grown=${5:-} chat batch
  chat=$(python3 -c "print(round(0.4*$C*$share, 3))"); batch=$(python3 -c "print(round(1.6*$C*$share, 3))")
  { echo "target: http://127.0.0.1:1"; echo "duration: ${DURATION}s"; echo "warmup: 5s"; echo "request_timeout: 60s"; echo "seed: $seed"; echo "streams:"
    if [ -z "$kill_at" ]; then
      chat_stream chat chat "{ kind: poisson, rate: $chat }" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
      chat_stream batch batch "{ kind: batch, rate: $(python3 -c "print(round($batch/8, 3))"), size: { dist: fixed, value: 8 } }" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
    elif [ -z "$grown" ]; then
      chat_stream chat chat "$(window "$chat" 0 "$kill_at")" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
      chat_stream batch batch "$(window "$batch" 0 "$kill_at")" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
    else
      local chat2 batch2 rest=$((DURATION - kill_at))
      chat2=$(python3 -c "print(round(0.4*$C*$grown, 3))"); batch2=$(python3 -c "print(round(1.6*$C*$grown, 3))")
      chat_stream chat chat "{ kind: stages, stages: [{ duration: ${kill_at}s, rate: $chat }, { duration: ${rest}s, rate: $chat2 }] }" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
      chat_stream batch batch "{ kind: stages, stages: [{ duration: ${kill_at}s, rate: $batch }, { duration: ${rest}s, rate: $batch2 }] }" "{ dist: fixed, value: $PROMPT }" "$OUTPUT"
    fi
  } >"$file"
}

# fleet_run DIR VARIANT.RUN LIMIT JOIN SHARES [KILL_AT] : three gateways (in a fleet
# when JOIN is yes; JOIN one: a single gateway takes all three load
# generators' requests) on fresh replicas, the load split by SHARES (a,b,c);
# with KILL_AT, the third is killed (SIGKILL) then and its share goes to the others.
fleet_run() {
  local d=$1 label=$2 limit=$3 join=$4 kill_at=${6:-} i n=3 run=${2##*.}
  [ "$join" = one ] && n=1
  local shares; IFS=, read -r -a shares <<<"$5"
  sim_up --replicas 2
  local ports=() peers=() urls=() pids=() tls=() lgs=()
  for i in 0 1 2; do ports+=("$(free_port)"); peers+=("http://127.0.0.1:${ports[$i]}"); done
  for ((i = 0; i < n; i++)); do
    if [ "$join" = yes ]; then gateway_yaml "$WORK/gw-$label-$i.yaml" "$limit" "${ports[$i]}" "${peers[@]}"
    else gateway_yaml "$WORK/gw-$label-$i.yaml" "$limit" "${ports[$i]}"; fi
    start_gateway "$WORK/gw-$label-$i.yaml" "gw-$label-$i"
    urls+=("$GW_URL"); pids+=("$GW_PID")
    python3 "$HERE/timeline.py" --admin "$ADMIN_URL" --class chat --duration "$((DURATION + 5))" --out "$d/$label-$i-timeline.csv" 2>/dev/null &
    tls+=($!)
  done
  for i in 0 1 2; do
    local seed=$((10 * run + i + 1))
    if [ -z "$kill_at" ]; then fleet_mix "$d/$label-$i.yaml" "$seed" "${shares[$i]}"
    elif [ "$i" = 2 ]; then fleet_mix "$d/$label-$i.yaml" "$seed" "${shares[$i]}" "$kill_at"
    else fleet_mix "$d/$label-$i.yaml" "$seed" "${shares[$i]}" "$kill_at" "$(python3 -c "print(${shares[$i]} + ${shares[2]} / 2)")"; fi
    loadgen run "$d/$label-$i.yaml" --target "${urls[$((i % n))]}" --label "$label-$i" --out "$d/$label-$i.json" --report "$d/$label-$i.md" --no-progress &
    lgs+=($!)
  done
  if [ -n "$kill_at" ]; then sleep "$kill_at"; kill -9 "${pids[2]}"; echo "$label: gateway 3 killed at ${kill_at} s" >&2; fi
  for i in "${lgs[@]}"; do wait "$i" || true; done
  for i in "${tls[@]}" "${pids[@]}"; do kill "$i" 2>/dev/null || true; wait "$i" 2>/dev/null || true; done
  sim_down
}

fleet() {
  local d="$WORK/fleet" third i v; mkdir -p "$d"
  capacity
  third=$(python3 -c "print(1/3)")
  for i in $(seq 1 "$RUNS"); do
    for v in ${FLEET_VARIANTS:-alone fixed even one skewed kill}; do
      case $v in
        alone) fleet_run "$d" "alone.$i" "$FIXED" no "$third,$third,$third" ;;
        fixed) fleet_run "$d" "fixed.$i" "$FIXED" yes "$third,$third,$third" ;;
        even) fleet_run "$d" "even.$i" auto yes "$third,$third,$third" ;;
        one) fleet_run "$d" "one.$i" auto one "$third,$third,$third" ;;
        skewed) fleet_run "$d" "skewed.$i" auto yes "0.7,0.2,0.1" ;;
        kill) fleet_run "$d" "kill.$i" auto yes "$third,$third,$third" "$((DURATION / 2))" ;;
        *) echo "unknown fleet variant $v" >&2; exit 2 ;;
      esac
    done
  done
  python3 "$HERE/limits_report.py" fleet "$d" "$C" "$MACHINE" "$((DURATION / 2))"
  publish "$d" "$OUT/fleet"
}

coldstart() {
  local d="$WORK/coldstart"; mkdir -p "$d"
  { echo "target: http://127.0.0.1:1"; echo "duration: 10s"; echo "warmup: 0s"; echo "request_timeout: 60s"; echo "streams:"
    chat_stream chat chat "{ kind: closed, concurrency: 32 }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
  } >"$d/scenario.yaml"
  local i v
  for i in $(seq 1 "$RUNS"); do
    for v in auto fixed; do
      sim_up --replicas 1
      { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
        echo "pools:"
        echo "  - name: default"
        echo "    models: [auto]"
        echo "    replicas: [${SIM_URLS[0]}]"
        [ "$v" = fixed ] && echo "    max_inflight_per_replica: 256"
      } >"$WORK/gw-cold-$v.yaml"
      start_gateway "$WORK/gw-cold-$v.yaml" "gw-cold-$v-$i"
      loadgen run "$d/scenario.yaml" --target "$GW_URL" --label "$v-$i" --out "$d/$v-$i.json" --report "$d/$v-$i.md" --no-progress
      gw_down; sim_down
    done
  done
  python3 "$HERE/limits_report.py" coldstart "$d" "$MACHINE"
  publish "$d" "$OUT/coldstart"
}

want=("$@")
if [ ${#want[@]} -eq 0 ]; then
  if [ "$ENGINE" = sim ]; then want=(overload shift slow batch fleet coldstart); else want=(overload batch fleet); fi
fi
for s in "${want[@]}"; do
  case $ENGINE:$s in llamacpp:shift | llamacpp:slow | llamacpp:coldstart)
    echo "$s needs the simulator (KV, slowdown faults, a replica far larger than its load); ENGINE=llamacpp runs overload, batch, fleet" >&2; exit 2 ;;
  esac
done
for s in "${want[@]}"; do
  case $s in overload) overload ;; shift) shift_ ;; slow) slow ;; batch) batch ;; fleet) fleet ;; coldstart) coldstart ;; *) echo "unknown scenario $s" >&2; exit 2 ;; esac
done
