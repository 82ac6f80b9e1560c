#!/usr/bin/env bash
# Calibrate the simulator against published vLLM behaviour, end to end, and write
# loadtest/results/calibration/README.md with the numbers and charts:
#   1. loadgen's client-side TTFT/ITL vs the simulator's own vllm: histograms, same run;
#   2. the batch-interference shape: P99/P50 TTFT at 8, 16, 32, 64 concurrent
#      requests with 512-token prompts (70B FP8 profile), alone and with 5 % of
#      requests carrying a 4096-token prompt (a "long-prompt request
#      hitting the queue"); over HTTP with loadgen, and from the engine alone
#      on paused time (20 simulated minutes per level, for a stable P99);
#   3. the capacity knee: Poisson load swept past capacity on one replica.
# Bounded: about 20 minutes; loopback only.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/results/calibration"; mkdir -p "$OUT"
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
SECS=${SECS:-30}
CSECS=${CSECS:-120}   # each interference run
build_release
MACHINE=$(machine_line)   # stamped once: the build being measured
(cd "$ROOT" && cargo build -q --release --locked -p slogate-loadtest --example interference)

PROMPT_512='{ dist: fixed, value: 512 }'
PROMPT_MIX='{ dist: mix, parts: [{ weight: 0.95, len: { dist: fixed, value: 512 } }, { weight: 0.05, len: { dist: fixed, value: 4096 } }] }'
scen() { # file arrival-yaml seconds [prompt-dist]
  cat >"$1" <<EOS
target: http://127.0.0.1:1
duration: ${3}s
warmup: 5s
request_timeout: 300s
streams:
  - name: chat
    class: chat
    model: sim-llama-70b-fp8
    arrival: $2
    prompt_tokens: ${4:-$PROMPT_512}
    output_tokens: { dist: uniform, min: 64, max: 256 }
EOS
}
scrape() { curl -s "$1/metrics" >"$2"; }

# 1 + 2: interference at fixed concurrency; the same runs give the agreement check.
for c in 8 16 32 64; do
  start_sim "sim-c$c" --profile llama70b-fp8-h100
  scen "$WORK/c$c.yaml" "{ kind: closed, concurrency: $c }" "$CSECS"
  "$BIN/loadgen" run "$WORK/c$c.yaml" --target "${SIM_URLS[0]}" --label "concurrency-$c" --no-progress --out "$WORK/c$c.json" --report "$WORK/c$c.md"
  scrape "${SIM_URLS[0]}" "$WORK/c$c.metrics"
  cleanup; PIDS=()
  start_sim "sim-m$c" --profile llama70b-fp8-h100
  scen "$WORK/m$c.yaml" "{ kind: closed, concurrency: $c }" "$CSECS" "$PROMPT_MIX"
  "$BIN/loadgen" run "$WORK/m$c.yaml" --target "${SIM_URLS[0]}" --label "concurrency-$c-long-5pct" --no-progress --out "$WORK/m$c.json" --report "$WORK/m$c.md"
  cleanup; PIDS=()
done
# The same two workloads on the engine alone, paused time.
"$ROOT/target/release/examples/interference" 0 4096 1200 >"$WORK/engine-512.md"
"$ROOT/target/release/examples/interference" 0.05 4096 1200 >"$WORK/engine-mix.md"

# 3: capacity knee, open loop.
RATES=${RATES:-"2 4 6 8 10 12 14"}
for r in $RATES; do
  start_sim "sim-r$r" --profile llama70b-fp8-h100
  scen "$WORK/r$r.yaml" "{ kind: poisson, rate: $r }" "$SECS"
  "$BIN/loadgen" run "$WORK/r$r.yaml" --target "${SIM_URLS[0]}" --label "rate-$r" --no-progress --out "$WORK/r$r.json" --report "$WORK/r$r.md"
  cleanup; PIDS=()
done
last=$(echo $RATES | awk '{print $NF}')
python3 "$HERE/calibration_report.py" "$WORK" "$OUT" "$SECS" "$RATES" "$MACHINE" "$CSECS"
# Charts of the most loaded open-loop run; the per-run reports stay in $WORK.
"$BIN/loadgen" plot "$WORK/r$last.json" --dir "$WORK"
cp "$OUT/README.md" "$WORK/README.md"
publish "$WORK" "$OUT"
