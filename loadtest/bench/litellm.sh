#!/usr/bin/env bash
# slogate against LiteLLM's proxy (the gateway slogate replaces), each in front
# of the same simulated vLLM replica, measured in the same runs as ratios to
# the direct path:
#   - added TTFT p50/p99 and ITL p99 at 8, 32 and 200 streams per path: one group
#     of closed-loop streams whose requests take the gateway and the direct
#     path in turn (20-ms engine steps, 32-96 output tokens), one run per
#     gateway, the gateways' order alternating between rounds;
#   - streaming requests/s at 32 and 256 streams per path, side by side in one
#     run (1-ms steps, 16 tokens): N streams through the gateway, N direct;
#   - each gateway's CPU time per request, RSS idle and at its peak;
#   - whether a stream reaches the client as the replica sent it.
# LiteLLM runs as its docs start it (`litellm --config`, one uvicorn worker,
# the `hosted_vllm/` provider, the logging settings of its production page),
# installed into .venv-litellm at a pinned version. Everything runs on 127.0.0.1, bounded in time.
#
# PLACEMENT=pinned (default): simulator and load generator on CPU 0, the
# gateway under test alone on CPU 1 (one gateway runs at a time).
# PLACEMENT=shared: all processes on both cores.
# Writes loadtest/results/litellm-$PLACEMENT.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
bench_setup pinned
LITELLM_VERSION=1.106.2
VENV="$ROOT/.venv-litellm"

# LiteLLM in its own venv (about 740 MB), installed once.
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
fi
build_release

# start_litellm REPLICA_URL : LiteLLM's proxy in front of one replica; sets LL_URL, LL_PID once it answers.
start_litellm() {
  cat >"$WORK/litellm.yaml" <<EOS
model_list:
  - model_name: sim-llama-8b
    litellm_params:
      model: hosted_vllm/sim-llama-8b
      api_base: $1/v1
      api_key: none
litellm_settings:
  set_verbose: false
  json_logs: true
EOS
  local port; port=$(free_port)
  # Its production page's logging settings; no master key (the proxy then
  # checks no credentials: less work per request, not more); no network at start.
  ( export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY=true LITELLM_LOG=ERROR
    spawn_on "${GW_CPUS:-}" "$VENV/bin/litellm" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$port" >"$WORK/litellm.out" 2>"$WORK/litellm.err" )  &
  LL_PID=$!; PIDS+=($LL_PID); LL_URL="http://127.0.0.1:$port"
  for _ in $(seq 240); do curl -sf "$LL_URL/health/liveliness" >/dev/null && return 0; sleep 0.25; done
  echo "LiteLLM did not start; its log ends:" >&2; tail -n 20 "$WORK/litellm.err" >&2; exit 1
}
scenario() { # file seconds: the header; groups follow, each with its own target
  cat >"$1" <<EOS
target: http://127.0.0.1:1
duration: ${2}s
warmup: 5s
request_timeout: 120s
streams:
EOS
}
group() { # name streams tokens target
  local out="{ dist: fixed, value: $3 }"
  case $3 in *-*) out="{ dist: uniform, min: ${3%-*}, max: ${3#*-} }" ;; esac
  echo "  - { name: $1, class: chat, target: \"$4\", model: sim-llama-8b, arrival: { kind: closed, concurrency: $2 }, prompt_tokens: { dist: fixed, value: 32 }, output_tokens: $out }"
}

# start_gw slogate|litellm REPLICA_URL: start that gateway alone; sets UT_URL, UT_PID.
start_gw() {
  if [ "$1" = slogate ]; then
    # A fresh log: start_gateway reads the address from it.
    rm -f "$WORK/gateway.log"; gateway_config "$WORK/gw.yaml" "$2"; start_gateway "$WORK/gw.yaml"; UT_URL=$GW_URL; UT_PID=$GW_PID
  else
    start_litellm "$2"; UT_URL=$LL_URL; UT_PID=$LL_PID
  fi
}
stop_gw() { kill "$UT_PID" 2>/dev/null || true; wait "$UT_PID" 2>/dev/null || true; }
# Only the gateway under test runs (an idle LiteLLM still wakes up on slogate's
# core); the order of the two alternates between rounds.
order() { if [ $(($1 % 2)) -eq 1 ]; then echo slogate litellm; else echo litellm slogate; fi; }

# 1. Latency, interleaved with the direct path, and fidelity.
start_sim flat --step-base-ms 20 $SIM_EVEN
DIRECT=${SIM_URLS[0]}
# One short stream by each path, to compare what reaches the client.
REQ='{"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, "stream": true}'
fetch() { curl -sN --max-time 10 "$2/v1/chat/completions" -H 'content-type: application/json' -d "$REQ" >"$WORK/bytes-$1.txt"; }
fetch direct "$DIRECT"
for round in $(seq "$ROUNDS"); do
  for gw in $(order "$round"); do
    start_gw "$gw" "$DIRECT"
    if [ "$round" -eq 1 ]; then rss_kb "$UT_PID" >"$WORK/idle-$gw.rss"; fetch "$gw" "$UT_URL"; fi
    for c in 8 32 200; do
      scenario "$WORK/mix.yaml" $((LAT_SECS + 2))
      group mix $((2 * c)) 32-96 "$UT_URL,$DIRECT" >>"$WORK/mix.yaml"
      measure "lat-$gw-$c-$round" "$UT_PID" run_lg "$WORK/mix.yaml" "$DIRECT" "lat-$gw-$c-$round"
    done
    rss_kb "$UT_PID" VmHWM >>"$WORK/peak-$gw.rss"
    stop_gw
  done
done
cleanup; PIDS=()

# 2. Throughput, side by side in one run.
start_sim fast --step-base-ms 1 $SIM_EVEN
DIRECT=${SIM_URLS[0]}
for round in $(seq "$ROUNDS"); do
  for gw in $(order "$round"); do
    start_gw "$gw" "$DIRECT"
    for c in 32 256; do
      scenario "$WORK/tput.yaml" $((TPUT_SECS + 2))
      # The group listed first starts first; alternate with the rounds.
      if [ $((round % 2)) -eq 1 ]; then
        { group gateway "$c" 16 "$UT_URL"; group direct "$c" 16 "$DIRECT"; } >>"$WORK/tput.yaml"
      else
        { group direct "$c" 16 "$DIRECT"; group gateway "$c" 16 "$UT_URL"; } >>"$WORK/tput.yaml"
      fi
      measure "tput-$gw-$c-$round" "$UT_PID" run_lg "$WORK/tput.yaml" "$DIRECT" "tput-$gw-$c-$round"
    done
    stop_gw
  done
done
cleanup; PIDS=()

python3 "$HERE/bench/litellm_report.py" "$WORK" "$(machine_line)" "$(getconf CLK_TCK)" "$PLACEMENT" "$ROUNDS" "$LITELLM_VERSION" >"$HERE/results/litellm-$PLACEMENT.md"
cat "$HERE/results/litellm-$PLACEMENT.md"
if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; else echo "raw results kept in $WORK" >&2; fi
