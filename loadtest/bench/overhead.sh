#!/usr/bin/env bash
# Driver of loadtest/scenarios/overhead/{pinned,shared}.yaml: the gateway's
# overhead against the direct path, measured side by side. One run (one
# round of every load) into $RUN, its files named as round 1:
#   - latency at 200 streams (20 ms engine steps, stamped events): separate
#     loads; side by side at 32, 100 and 200 per path with an A/A control;
#     interleaved at 32 and 200 per path, 64 and 32-96 tokens, each with an
#     A/A control; the same interleaved loads through HAProxy `mode tcp` and
#     `mode http`, and (pinned) through a slogate with busy polling;
#   - throughput at 32 and 256 streams (1 ms steps, 16 tokens), separate and
#     side by side with an A/A control;
#   - RSS idle and with 1,000 open streams.
#
#   loadtest/run overhead/pinned     (overhead/shared)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
PLACEMENT=$(bench_var placement)
[ "$PLACEMENT" = pinned ] && export SIM_CPUS=0 LG_CPUS=0 GW_CPUS=1
LAT_SECS=20 TPUT_SECS=15 round=1
FIXED64="{ dist: fixed, value: 64 }" VARIED="{ dist: uniform, min: 32, max: 96 }" FIXED16="{ dist: fixed, value: 16 }"
# load FILE STREAMS OUTPUT SECS [WARMUP]: the file's one-group closed load.
load() { bench_load closed "$1" --set streams="$2" --set output="$3" --set secs="$4" --set warmup="${5:-3}"; }
# The group listed first starts first and fares worse: odd runs list slogate first.
PAIR=pair; [ $((SEED % 2)) -eq 0 ] && PAIR=pair_direct_first

# 1. Latency at 200 concurrent streams.
start_sim flat --step-base-ms 20 $SIM_EVEN --stamp-events
SIM=${SIM_URLS[0]}
bench_config main "$RUN/gw.yaml"
start_gateway "$RUN/gw.yaml"
IDLE_RSS=$(rss_kb "$GW_PID")
# The reference: HAProxy in front of the same replica, placed as slogate is.
# In `mode tcp` it relays bytes and parses nothing: what the extra hop itself
# costs on this machine. In `mode http` it is a mature L7 proxy.
HAP=()
if ensure_haproxy; then
  start_haproxy hap-tcp tcp "$SIM"; HAP_TCP=$HAP_URL
  start_haproxy hap-http http "$SIM"; HAP_HTTP=$HAP_URL
  HAP=(tcp http)
  haproxy -v | awk 'NR == 1 {print "HAProxy " $3}' >"$RUN/haproxy.version"   # awk reads it all: no SIGPIPE under pipefail
fi
load "$RUN/lat.yaml" 200 "$FIXED64" "$LAT_SECS"
run_lg "$RUN/lat.yaml" "$SIM" "lat-direct-$round"
measure "lat-gateway-$round" "$GW_PID" run_lg "$RUN/lat.yaml" "$GW_URL" "lat-gateway-$round"
# Side by side in one load: N streams through slogate and N straight to the
# replica at the same time, so both ride the same engine steps and the same
# load on the client's and replica's core; only the path differs.
for c in 32 100 200; do
  bench_load "$PAIR" "$RUN/pair-$c.yaml" --set streams="$c" --set output="$FIXED64" --set secs=$((LAT_SECS + 2)) --set direct="$SIM"
  with_cores "lat-pair-$c-$round" run_lg "$RUN/pair-$c.yaml" "$GW_URL" "lat-pair-$c-$round"
done
# Control (A/A): the same side by side at 200 per path with both groups
# direct. Whatever differs between the groups is the method's noise floor.
bench_load "$PAIR" "$RUN/aa.yaml" --set streams=200 --set output="$FIXED64" --set secs=$((LAT_SECS + 2)) --set direct="$SIM"
run_lg "$RUN/aa.yaml" "$SIM" "lat-aa-$round"
# Interleaved in one group: 2N closed-loop streams that take the two paths in
# turn. No group starts first and every burst alternates between the paths;
# the A/A load (both "paths" direct) is this method's noise floor.
for c in 32 200; do
  load "$RUN/mix-$c.yaml" $((2 * c)) "$FIXED64" $((LAT_SECS + 2)) 5
  measure "lat-mix-ab-$c-$round" "$GW_PID" run_lg "$RUN/mix-$c.yaml" "$GW_URL,$SIM" "lat-mix-ab-$c-$round"
done
run_lg "$RUN/mix-200.yaml" "$SIM,$SIM" "lat-mix-aa-$round"
# The same at 200 per path with output lengths drawn from 32-96 (same mean):
# with every stream 64 tokens long the closed loop runs in lockstep.
load "$RUN/mixv.yaml" 400 "$VARIED" $((LAT_SECS + 2)) 5
measure "lat-mixv-ab-$round" "$GW_PID" run_lg "$RUN/mixv.yaml" "$GW_URL,$SIM" "lat-mixv-ab-$round"
run_lg "$RUN/mixv.yaml" "$SIM,$SIM" "lat-mixv-aa-$round"
for mode in "${HAP[@]}"; do
  if [ "$mode" = tcp ]; then hap=$HAP_TCP; else hap=$HAP_HTTP; fi
  with_cores "lat-hap-$mode-$round" run_lg "$RUN/mix-200.yaml" "$hap,$SIM" "lat-hap-$mode-$round"
  with_cores "lat-hapv-$mode-$round" run_lg "$RUN/mixv.yaml" "$hap,$SIM" "lat-hapv-$mode-$round"
done
# The same two interleaved loads through a second slogate with
# `server.busy_poll: true` (pinned only: it keeps its core busy while
# streams are open, which on shared cores would slow the simulator and the
# client), started for these loads only.
if [ "$PLACEMENT" = pinned ]; then
  DEFAULT_GW=("$GW_PID" "$GW_URL" "$ADMIN_URL")
  bench_config busy "$RUN/gw-busy.yaml"
  start_gateway "$RUN/gw-busy.yaml" gateway-busy
  measure "lat-busy-$round" "$GW_PID" run_lg "$RUN/mix-200.yaml" "$GW_URL,$SIM" "lat-busy-$round"
  measure "lat-busyv-$round" "$GW_PID" run_lg "$RUN/mixv.yaml" "$GW_URL,$SIM" "lat-busyv-$round"
  gw_down
  GW_PID=${DEFAULT_GW[0]} GW_URL=${DEFAULT_GW[1]} ADMIN_URL=${DEFAULT_GW[2]}
fi
cleanup; PIDS=()

# 2. Throughput at 32 and 256 concurrent streams.
start_sim fast --step-base-ms 1 $SIM_EVEN
SIM=${SIM_URLS[0]}
bench_config main "$RUN/gw-fast.yaml"
start_gateway "$RUN/gw-fast.yaml" gateway-fast
for c in 32 256; do
  load "$RUN/tput-$c.yaml" "$c" "$FIXED16" "$TPUT_SECS"
  with_cores "tput-direct-$c-$round" run_lg "$RUN/tput-$c.yaml" "$SIM" "tput-direct-$c-$round"
  measure "tput-gateway-$c-$round" "$GW_PID" run_lg "$RUN/tput-$c.yaml" "$GW_URL" "tput-gateway-$c-$round"
done
# The same side by side in one load, and its A/A control (both groups direct).
for c in 32 256; do
  bench_load "$PAIR" "$RUN/tpair-$c.yaml" --set streams="$c" --set output="$FIXED16" --set secs=$((TPUT_SECS + 2)) --set direct="$SIM"
  with_cores "tput-pair-$c-$round" run_lg "$RUN/tpair-$c.yaml" "$GW_URL" "tput-pair-$c-$round"
done
run_lg "$RUN/tpair-256.yaml" "$SIM" "tput-aa-$round"
cleanup; PIDS=()

# 3. RSS with 1,000 open streams (50 ms steps, 400 tokens: each stream stays open ~20 s).
start_sim slow --step-base-ms 50 $SIM_EVEN
bench_config main "$RUN/gw-slow.yaml"
start_gateway "$RUN/gw-slow.yaml" gateway-slow
load "$RUN/rss.yaml" 1000 "{ dist: fixed, value: 400 }" 12
run_lg "$RUN/rss.yaml" "$GW_URL" "rss" &
LG=$!
sleep 8   # every stream open (they last ~20 s), none finished
OPEN=$(curl -s "$ADMIN_URL/metrics" | awk '/^slogate_inflight_requests/{s+=$2} END{print s+0}')
OPEN_RSS=$(rss_kb "$GW_PID")
wait "$LG"
cleanup; PIDS=()

"$BIN/bench" report overhead "$RUN" "$IDLE_RSS" "$OPEN_RSS" "$OPEN" "$(getconf CLK_TCK)" "$PLACEMENT"
