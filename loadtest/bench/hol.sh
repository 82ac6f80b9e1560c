#!/usr/bin/env bash
# Head-of-line blocking: do large request bodies, read, parsed and
# rewritten while small streams are open, add to those streams' ITL?
#
# Two simulated replicas (each its own engine: the large requests never share
# a step with the streams): A serves `sim-a`, deterministic 20 ms steps with
# stamped events; B serves `sim-bulk`. One gateway with both as pools. Each
# round has three runs of SECS seconds, one after the other, all with 200
# open chat streams on A through the gateway (closed loop, 150-250 tokens):
#   - "quiet":  nothing else;
#   - "direct": plus ten requests a second whose bodies are about 4 MiB (a
#     9-message chat history), sent straight to B: the machine does the same
#     work for them (the client writes them, B reads them) but the gateway
#     does not: the control;
#   - "gateway": the same ten a second through the gateway. Their class
#     `bulk` has a 1 ms TTFT target, so context reduction is on for it after
#     a few seconds: each large body is read, parsed whole and rewritten
#     (oldest turns dropped) before it goes upstream. The breaker is set
#     never to trip, so none is refused.
# The result is the path's share of ITL p99 of the 200 streams (client gap
# minus engine gap, from the stamps) in each run; "gateway" minus "direct" is
# what the gateway's handling of the large bodies adds.
# Everything runs on 127.0.0.1, bounded in time.
# Writes loadtest/results/hol/README.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
bench_setup shared
SECS=${SECS:-20}
STREAMS=${STREAMS:-200}
BULK_RATE=${BULK_RATE:-10}
# About 4 MiB of JSON: the simulator counts 4 characters a token.
BULK_TOKENS=${BULK_TOKENS:-1040000}
build_release
MACHINE=$(machine_line)

start_sim a --step-base-ms 20 $SIM_EVEN --stamp-events --model sim-a; A_URL=${SIM_URLS[0]}
# B takes whole 4 MiB prompts (about a million tokens) at no prefill cost.
echo "max_model_len: 4000000" >"$WORK/bulk-sim.yaml"
start_sim bulk --step-base-ms 20 $SIM_EVEN --model sim-bulk --config "$WORK/bulk-sim.yaml"; B_URL=${SIM_URLS[0]}
cat >"$WORK/gw.yaml" <<EOS
server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s, max_request_body: 5MiB }
pools:
  - { name: streams, models: [sim-a], replicas: [$A_URL], max_inflight_per_replica: 4096 }
  - { name: bulk, models: [sim-bulk], replicas: [$B_URL], max_inflight_per_replica: 4096 }
classes:
  chat: { tier: interactive, ttft: 300ms, itl: 50ms }
  bulk: { tier: interactive, ttft: 1ms, itl: 50ms }
breaker: { trip_after: 1h }
context_reduction: { trigger_after: 1s }
EOS
start_gateway "$WORK/gw.yaml"

scenario() { # file bulk_target (none: no large bodies)
  cat >"$1" <<EOS
target: $GW_URL
duration: ${SECS}s
warmup: 5s
request_timeout: 120s
streams:
  - name: s
    class: chat
    model: sim-a
    arrival: { kind: closed, concurrency: $STREAMS }
    prompt_tokens: { dist: fixed, value: 32 }
    output_tokens: { dist: uniform, min: 150, max: 250 }
EOS
  if [ "$2" != none ]; then cat >>"$1" <<EOS
  - name: bulk
    class: bulk
    model: sim-bulk
    target: $2
    arrival: { kind: constant, rate: $BULK_RATE }
    prompt_tokens: { dist: fixed, value: $BULK_TOKENS }
    output_tokens: { dist: fixed, value: 1 }
    turns: 9
EOS
  fi
}
reduced() { curl -sf "$ADMIN_URL/metrics" | awk '/^slogate_context_reduced_requests_total\{class="bulk"\}/{print $2}' | tail -1; }

for round in $(seq "$ROUNDS"); do
  for kind in quiet direct gateway; do
    name="$kind-$round"
    case $kind in quiet) bulk=none ;; direct) bulk=$B_URL ;; gateway) bulk=$GW_URL ;; esac
    scenario "$WORK/$name.yaml" "$bulk"
    r0=$(reduced); r0=${r0:-0}
    t0=$(cpu_ticks "$GW_PID")
    run_lg "$WORK/$name.yaml" "$GW_URL" "$name"
    t1=$(cpu_ticks "$GW_PID"); r1=$(reduced); r1=${r1:-0}
    echo "$(( t1 - t0 )) $(( r1 - r0 ))" >"$WORK/$name.extra"
  done
done

mkdir -p "$WORK/out"
python3 "$HERE/bench/hol_report.py" "$WORK" "$MACHINE" "$ROUNDS" "$SECS" "$STREAMS" "$BULK_RATE" "$(getconf CLK_TCK)" >"$WORK/out/README.md"
publish "$WORK/out" "$HERE/results/hol"
cat "$HERE/results/hol/README.md"
