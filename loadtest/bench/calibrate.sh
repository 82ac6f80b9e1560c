#!/usr/bin/env bash
# Driver of loadtest/scenarios/calibration.yaml: the simulator against
# published vLLM behaviour, end to end, no gateway. One run into $RUN:
#   1. loadgen's client-side TTFT/ITL against the simulator's own vllm:
#      histograms, in the same runs;
#   2. the batch-interference shape: P99/P50 TTFT at each of `concurrencies`
#      with 512-token prompts (70B FP8 profile), alone and with 5 % of
#      requests carrying a 4096-token prompt (a "long-prompt request hitting
#      the queue"); over HTTP with loadgen, and from the engine alone on
#      paused time (20 simulated minutes per level, for a stable P99);
#   3. the capacity knee: Poisson load at each of `rates` on one replica.
# Bounded: about 22 minutes; loopback only.
#
#   loadtest/run calibration
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
SECS=$(bench_var secs) CSECS=$(bench_var csecs) CONC=$(bench_var concurrencies) RATES=$(bench_var rates)
(cd "$ROOT" && cargo build -q --release --locked -p slogate-loadtest --example interference)
scrape() { curl -s "$1/metrics" >"$2"; }

# run NAME LOAD [--set K=V]...: one load against a fresh replica, its metrics scraped after.
run() {
  local name=$1 load=$2; shift 2
  PIDS=()
  start_sim "sim-$name" --profile llama70b-fp8-h100
  bench_load "$load" "$RUN/$name.yaml" "$@"
  "$BIN/loadgen" run "$RUN/$name.yaml" --target "${SIM_URLS[0]}" --label "$name" --no-progress --out "$RUN/$name.json" --report "$RUN/$name.md" >/dev/null
  scrape "${SIM_URLS[0]}" "$RUN/$name.metrics"
  cleanup; PIDS=()
}

# 1 + 2: interference at fixed concurrency; the same runs give the agreement check.
for c in $CONC; do
  run "c$c" closed --set concurrency="$c" --set prompt="$(bench_var prompt_512)"
  run "m$c" closed --set concurrency="$c" --set prompt="$(bench_var prompt_mix)"
done
# The same two workloads on the engine alone, paused time.
"$ROOT/target/release/examples/interference" 0 4096 1200 >"$RUN/engine-512.md"
"$ROOT/target/release/examples/interference" 0.05 4096 1200 >"$RUN/engine-mix.md"

# 3: capacity knee, open loop.
for r in $RATES; do run "r$r" open --set rate="$r"; done
"$BIN/bench" report calibration "$RUN" "$SECS" "$RATES" "$CSECS" "$CONC"
# Charts of the most loaded open-loop run.
"$BIN/loadgen" plot "$RUN/r$(echo $RATES | awk '{print $NF}').json" --dir "$RUN"
rm -f "$RUN"/*.png
