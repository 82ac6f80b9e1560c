#!/usr/bin/env bash
# Driver of loadtest/scenarios/litellm-migration.yaml: LiteLLM's proxy and
# slogate with `slogate import litellm`'s config in front of the same two
# replicas, the same OpenAI SDK code against both. One run into $RUN.
#
#   loadtest/run litellm-migration
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
LITELLM_VERSION=$(bench_var litellm_version)
VENV="$ROOT/.venv-litellm"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
fi
export LITELLM_MASTER_KEY="sk-migration-$SEED-master"

start_sim "small-$SEED" --step-base-ms 2 --model small-engine; SMALL=${SIM_URLS[0]}
start_sim "big-$SEED" --step-base-ms 2 --model big-engine; BIG=${SIM_URLS[0]}
cat >"$RUN/litellm.yaml" <<EOS
model_list:
  - model_name: m-small
    litellm_params:
      model: hosted_vllm/small-engine
      api_base: $SMALL/v1
      api_key: none
  - model_name: m-big
    litellm_params:
      model: openai/big-engine
      api_base: $BIG/v1
      api_key: none
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
litellm_settings:
  request_timeout: 60
EOS

# LiteLLM, as its docs start it (no network at start).
LL_PORT=$(free_port)
# (exec: the PID cleanup kills is LiteLLM's own, or it outlives the run)
( export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR
  exec "$VENV/bin/litellm" --config "$RUN/litellm.yaml" --host 127.0.0.1 --port "$LL_PORT" >"$RUN/litellm.out" 2>"$RUN/litellm.err" ) &
PIDS+=($!); LL_URL="http://127.0.0.1:$LL_PORT"

# slogate: the imported config, beside LiteLLM on this host (loopback, free ports).
"$BIN/slogate" import litellm --config "$RUN/litellm.yaml" --out "$RUN/imported" \
  --listen "127.0.0.1:$(free_port)" --admin-listen "127.0.0.1:$(free_port)" >"$RUN/import.out" 2>&1
cp "$RUN/imported/report.md" "$RUN/import-report.md"
CHECK_OK=false; "$BIN/slogate" check --config "$RUN/imported/slogate.yaml" >"$RUN/check.out" 2>&1 && CHECK_OK=true
start_gateway "$RUN/imported/slogate.yaml" "slogate-$SEED"

for _ in $(seq 240); do curl -sf "$LL_URL/health/liveliness" >/dev/null && break; sleep 0.25; done
curl -sf "$LL_URL/health/liveliness" >/dev/null || { echo "LiteLLM did not start; its log ends:" >&2; tail -n 20 "$RUN/litellm.err" >&2; exit 1; }

"$VENV/bin/python" "$HERE/migration_sdk.py" "$LITELLM_MASTER_KEY" "$RUN/answers.json" \
  "LiteLLM /v1=$LL_URL/v1" "LiteLLM, no /v1=$LL_URL" "slogate /v1=$GW_URL/v1" "slogate, no /v1=$GW_URL"
SDK_VERSION=$("$VENV/bin/python" -c "import openai; print(openai.__version__)")
"$BIN/bench" report migration "$RUN" "$CHECK_OK" "$LITELLM_VERSION" "$SDK_VERSION"
