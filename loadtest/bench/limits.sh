#!/usr/bin/env bash
# Driver of loadtest/scenarios/limits/*.yaml and limits-llamacpp/*.yaml:
# learned replica limits and the work-conserving reservation. One run of
# PART into $RUN, each gateway on fresh replicas:
#
#   overload   2 C through `auto`, `fixed` and `none` in turn
#   shift      2 C through `auto`, prompts doubling halfway; then chat alone
#   slow       2 C through `auto`, one replica slowing 2x halfway
#   batch      batch alone at 2 C, chat joining at 60 s
#   fleet      three gateways: alone, fixed, even, one, skewed, kill
#   coldstart  a fresh gateway meets 32 streams: auto against fixed
#
#   loadtest/run limits/overload     (limits-llamacpp/overload: llama.cpp's server)
#
# The scenario file's `engine` var says which replicas: the simulated 70B
# fleet of the admission benchmarks, or llama.cpp's server
# (loadtest/llama.sh: one replica with hard slots served first come first
# served, on the last core; the gateways and load generators on the others).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
PART=${1:?a part: overload, shift, slow, batch, fleet or coldstart}
ENGINE=$(bench_var engine 2>/dev/null || echo sim)
if [ "$ENGINE" = llamacpp ]; then
  source "$HERE/../llama.sh"
  llama_build
  # One engine per core: two on the one core left to them would stall
  # each other's steps (the OS slices the core between them), and chat's
  # ITL with them. The fleets of two replicas become one with LLAMA_SLOTS slots.
  sim_up() { llama_up 1; }
  sim_down() { llama_down; }
  others="0-$(($(nproc) - 2))"; export GW_CPUS=${GW_CPUS:-$others} LG_CPUS=${LG_CPUS:-$others}
fi
FIXED=$(bench_var fixed 2>/dev/null || echo 64)   # the hand-tuned limit: the replica's max_num_seqs (llama.cpp: its slots)

loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }

# capacity2 [slow]: C2, the scenario's `capacity2` load on two fresh
# replicas (with `slow`, the first one's steps twice as long); once for all runs.
capacity2() {
  if [ -f "$WORK/C2" ]; then C2=$(cat "$WORK/C2"); return 0; fi
  sim_up --replicas 2
  if [ "${1:-}" = slow ]; then curl -sf -X POST -H 'content-type: application/json' -d '{"slowdown": 2.0}' "${SIM_URLS[0]}/admin/faults" >/dev/null; fi
  bench_load capacity2 "$WORK/capacity2.yaml"
  loadgen run "$WORK/capacity2.yaml" --target "$TARGETS" --label capacity2 --out "$WORK/capacity2.json" --report "$WORK/capacity2.md" --no-progress >&2
  sim_down
  C2=$("$BIN/bench" report capacity "$WORK/capacity2.json")
  echo "$C2" >"$WORK/C2"
  echo "capacity C2 = $C2 req/s" >&2
}

# through LABEL LOAD [--set K=V]...: fresh replicas, gateway `main` with
# limit LIMIT (default auto), load LOAD through it, the gateway's timeline
# sampled; SLOW_AT: the first replica slows 2x then.
through() {
  local label=$1 loadname=$2; shift 2
  sim_up --replicas 2
  local opt=()
  [ -n "${PREEMPT:-}" ] && opt=(--set preempt="$PREEMPT")
  bench_config main "$RUN/gw-$label.yaml" --set limit="${LIMIT:-auto}" "${opt[@]}"
  start_gateway "$RUN/gw-$label.yaml" "gw-$label"
  local faults=()
  [ -n "${SLOW_AT:-}" ] && faults=(--fault "$SLOW_AT=${SIM_URLS[0]}={\"slowdown\":2.0}")
  bench_load "$loadname" "$RUN/$label.yaml" "$@"
  local secs; secs=$(awk '/^duration:/ {gsub("s", "", $2); print $2}' "$RUN/$label.yaml")
  "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration "$((secs + 5))" --out "$RUN/$label-timeline.csv" "${faults[@]}" &
  local tl=$!
  loadgen run "$RUN/$label.yaml" --target "$GW_URL" --label "$label" --out "$RUN/$label.json" --report "$RUN/$label.md" --no-progress
  kill "$tl" 2>/dev/null || true; wait "$tl" 2>/dev/null || true
  curl -s "$ADMIN_URL/metrics" >"$RUN/$label.prom" || true
  gw_down; sim_down
}

# fleet_part VARIANT LIMIT JOIN SHARES [KILL_AT]: three gateways (in a fleet
# when JOIN is yes; JOIN one: a single gateway takes all three load
# generators' requests) on fresh replicas, the load split by SHARES (a,b,c);
# with KILL_AT, the third is killed (SIGKILL) then and its share goes to the others.
fleet_part() {
  local v=$1 limit=$2 join=$3 kill_at=${5:-} i n=3 shares
  [ "$join" = one ] && n=1
  IFS=, read -r -a shares <<<"$4"
  sim_up --replicas 2
  local ports=() peers urls=() pids=() tls=() lgs=() conf=fleet
  for i in 0 1 2; do ports+=("$(free_port)"); done
  peers="[$(printf 'http://127.0.0.1:%s, ' "${ports[@]}" | sed 's/, $//')]"
  [ "$join" = yes ] || conf=alone
  for ((i = 0; i < n; i++)); do
    bench_config "$conf" "$RUN/gw-$v-$i.yaml" --set limit="$limit" --set admin_port="${ports[$i]}" --set peers="$peers"
    start_gateway "$RUN/gw-$v-$i.yaml" "gw-$v-$i"
    urls+=("$GW_URL"); pids+=("$GW_PID")
    "$BIN/bench" timeline --admin "$ADMIN_URL" --class chat --duration 105 --out "$RUN/$v-$i-timeline.csv" 2>/dev/null &
    tls+=($!)
  done
  for i in 0 1 2; do
    # Each gateway's load generator has its own seed: the parts are
    # independent, as a load balancer splitting one Poisson stream makes them.
    local seed=$((10 * SEED + i + 1)) share=${shares[$i]} loadname=part grown
    grown=$(calc "${shares[$i]} + ${shares[2]} / 2")
    if [ -n "$kill_at" ]; then if [ "$i" = 2 ]; then loadname=killed; else loadname=grown; fi; fi
    bench_load "$loadname" "$RUN/$v-$i.yaml" --set seed="$seed" --set chat_rate="$(calc "0.4*$C*$share")" \
      --set batch_rate="$(calc "1.6*$C*$share/8")" --set batch_total="$(calc "1.6*$C*$share")" \
      --set chat_rate2="$(calc "0.4*$C*$grown")" --set batch_total2="$(calc "1.6*$C*$grown")"
    loadgen run "$RUN/$v-$i.yaml" --target "${urls[$((i % n))]}" --label "$v-$i" --out "$RUN/$v-$i.json" --report "$RUN/$v-$i.md" --no-progress &
    lgs+=($!)
  done
  if [ -n "$kill_at" ]; then sleep "$kill_at"; kill -9 "${pids[2]}"; echo "$v: gateway 3 killed at ${kill_at} s" >&2; fi
  for i in "${lgs[@]}"; do wait "$i" || true; done
  for i in "${tls[@]}" "${pids[@]}"; do kill "$i" 2>/dev/null || true; wait "$i" 2>/dev/null || true; done
  sim_down
}

case $PART in
  overload)
    measure_capacity "$WORK"
    rates=(--set chat_rate="$(calc "0.4*$C")" --set batch_rate="$(calc "1.6*$C/8")")
    # Where the scenario asks: the defaults again with pools[].preempt off,
    # beside them (first in even runs, so that a drift of the machine's
    # speed in a sitting does not favour one).
    compare=$(bench_var preempt_part 2>/dev/null || echo no)
    if [ "$compare" = yes ] && [ $((SEED % 2)) = 0 ]; then PREEMPT=false through no-preempt main "${rates[@]}"; fi
    LIMIT=auto through auto main "${rates[@]}"
    if [ "$compare" = yes ] && [ $((SEED % 2)) = 1 ]; then PREEMPT=false through no-preempt main "${rates[@]}"; fi
    LIMIT=$FIXED through fixed main "${rates[@]}"
    LIMIT=4096 through none main "${rates[@]}"
    "$BIN/bench" report limits overload "$RUN" "$C" ;;
  shift)
    measure_capacity "$WORK"; capacity2
    through auto main --set chat_rate="$(calc "0.4*$C")" --set batch_total="$(calc "1.6*$C")"
    # The reference: the same chat with 1024-token prompts and no batch at
    # all, what this fleet can give chat at best once prompts have doubled.
    through chat-alone chat_alone --set chat_rate="$(calc "0.4*$C")"
    "$BIN/bench" report limits change "$RUN" "$C" 50 "$C2" shift ;;
  slow)
    measure_capacity "$WORK"; capacity2 slow
    SLOW_AT=50 through auto main --set chat_rate="$(calc "0.4*$C")" --set batch_rate="$(calc "1.6*$C/8")"
    "$BIN/bench" report limits change "$RUN" "$C" 50 "$C2" slow ;;
  batch)
    measure_capacity "$WORK"
    through auto main --set chat_rate="$(calc "0.4*$C")" --set batch_rate="$(calc "2*$C/8")"
    "$BIN/bench" report limits batch "$RUN" "$C" 60 ;;
  fleet)
    measure_capacity "$WORK"
    third=$(calc "1/3")
    for v in $(bench_var variants); do
      case $v in
        alone) fleet_part alone "$FIXED" no "$third,$third,$third" ;;
        fixed) fleet_part fixed "$FIXED" yes "$third,$third,$third" ;;
        even) fleet_part even auto yes "$third,$third,$third" ;;
        one) fleet_part one auto one "$third,$third,$third" ;;
        skewed) fleet_part skewed auto yes "0.7,0.2,0.1" ;;
        kill) fleet_part kill auto yes "$third,$third,$third" 50 ;;
        *) echo "unknown fleet variant $v" >&2; exit 2 ;;
      esac
    done
    "$BIN/bench" report limits fleet "$RUN" "$C" 50 ;;
  coldstart)
    for v in auto fixed; do
      sim_up --replicas 1
      bench_config "$v" "$RUN/gw-$v.yaml"
      start_gateway "$RUN/gw-$v.yaml" "gw-cold-$v"
      bench_load main "$RUN/$v.yaml"
      loadgen run "$RUN/$v.yaml" --target "$GW_URL" --label "$v" --out "$RUN/$v.json" --report "$RUN/$v.md" --no-progress
      gw_down; sim_down
    done
    "$BIN/bench" report limits coldstart "$RUN" ;;
  *) echo "unknown part $PART" >&2; exit 2 ;;
esac
