#!/usr/bin/env bash
# Driver of loadtest/scenarios/litellm.yaml: slogate against LiteLLM's
# proxy (the gateway slogate replaces), each in front of the same simulated
# vLLM replica, measured against the direct path in the same loads. One run
# into $RUN: for each gateway in turn (the order alternating between runs),
# what reaches the client, latency interleaved with the direct path at 8,
# 32 and 200 streams per path, throughput side by side at 32 and 256, RSS.
# The simulator and load generator on CPU 0, the gateway alone on CPU 1.
#
#   loadtest/run litellm
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
export SIM_CPUS=0 LG_CPUS=0 GW_CPUS=1
LITELLM_VERSION=$(bench_var litellm_version)
VENV="$ROOT/.venv-litellm"

# LiteLLM in its own venv (about 740 MB), installed once.
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
fi

# start_litellm REPLICA_URL : LiteLLM's proxy in front of one replica; sets LL_URL, LL_PID once it answers.
start_litellm() {
  cat >"$RUN/litellm.yaml" <<EOS
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
    spawn_on "${GW_CPUS:-}" "$VENV/bin/litellm" --config "$RUN/litellm.yaml" --host 127.0.0.1 --port "$port" >"$RUN/litellm.out" 2>"$RUN/litellm.err" )  &
  LL_PID=$!; PIDS+=($LL_PID); LL_URL="http://127.0.0.1:$port"
  for _ in $(seq 240); do curl -sf "$LL_URL/health/liveliness" >/dev/null && return 0; sleep 0.25; done
  echo "LiteLLM did not start; its log ends:" >&2; tail -n 20 "$RUN/litellm.err" >&2; exit 1
}
# start_gw slogate|litellm REPLICA_URL: start that gateway alone; sets UT_URL, UT_PID.
start_gw() {
  if [ "$1" = slogate ]; then
    SIM_URLS=("$2"); bench_config main "$RUN/gw.yaml"; start_gateway "$RUN/gw.yaml" "gw-$SEED"; UT_URL=$GW_URL; UT_PID=$GW_PID
  else
    start_litellm "$2"; UT_URL=$LL_URL; UT_PID=$LL_PID
  fi
}
stop_gw() { kill "$UT_PID" 2>/dev/null || true; wait "$UT_PID" 2>/dev/null || true; }
# Only the gateway under test runs (an idle LiteLLM still wakes up on
# slogate's core); the order of the two alternates between runs.
ORDER="slogate litellm"; [ $((SEED % 2)) -eq 0 ] && ORDER="litellm slogate"

# 1. Latency, interleaved with the direct path, and fidelity.
start_sim "flat-$SEED" --step-base-ms 20 $SIM_EVEN
DIRECT=${SIM_URLS[0]}
# One short stream by each path, to compare what reaches the client.
REQ='{"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, "stream": true}'
fetch() { curl -sN --max-time 10 "$2/v1/chat/completions" -H 'content-type: application/json' -d "$REQ" >"$RUN/bytes-$1.txt"; }
fetch direct "$DIRECT"
for gw in $ORDER; do
  start_gw "$gw" "$DIRECT"
  rss_kb "$UT_PID" >"$RUN/idle-$gw.rss"
  fetch "$gw" "$UT_URL"
  for c in 8 32 200; do
    bench_load latency "$RUN/lat-$gw-$c.yaml" --set streams=$((2 * c)) --set targets="$UT_URL,$DIRECT"
    measure "lat-$gw-$c" "$UT_PID" run_lg "$RUN/lat-$gw-$c.yaml" "$DIRECT" "lat-$gw-$c"
  done
  rss_kb "$UT_PID" VmHWM >"$RUN/peak-$gw.rss"
  stop_gw
done
cleanup; PIDS=()

# 2. Throughput, side by side in one load.
start_sim "fast-$SEED" --step-base-ms 1 $SIM_EVEN
DIRECT=${SIM_URLS[0]}
LOAD=throughput; [ $((SEED % 2)) -eq 0 ] && LOAD=throughput_direct_first
for gw in $ORDER; do
  start_gw "$gw" "$DIRECT"
  for c in 32 256; do
    bench_load "$LOAD" "$RUN/tput-$gw-$c.yaml" --set streams="$c" --set gateway="$UT_URL" --set direct="$DIRECT"
    measure "tput-$gw-$c" "$UT_PID" run_lg "$RUN/tput-$gw-$c.yaml" "$DIRECT" "tput-$gw-$c"
  done
  stop_gw
done
cleanup; PIDS=()
"$BIN/bench" report litellm "$RUN" "$(getconf CLK_TCK)" "$LITELLM_VERSION"
