#!/usr/bin/env bash
# Tenants: fair sharing of a tier among API keys, weights, and a key's own
# tokens-per-minute limit driven by the OpenAI Python SDK. Each scenario's
# result (README.md with its SVG charts, stamped with commit and machine)
# replaces loadtest/results/tenants/SCENARIO/:
#
#   fair     three tenants in `chat` at 1.5 C in all (the fleet of
#            bench/limits.sh, capacity C measured first) for DURATION (90 s,
#            three times the breaker's trip_after): A sends 80 %, B and C 10 %
#            each. `fifo`: no keys (one tenant, first come first served, as
#            before tenants); `fair`: a key each, weights equal, RUNS times
#            (3; judged on the median, the worst stated); `alone`: B and C
#            with A absent (the reference). Every gateway runs the defaults.
#   flood    one key sends chat at 0.5 C, another floods `batch` at 2 C, for
#            DURATION, RUNS times: chat must not be refused by a breaker
#   weights  two tenants in `chat`, weights 3 and 1, each offering 1.5 C:
#            the service each gets (tokens) over 60 s, RUNS times
#   tpm      one key with tokens_per_minute, driven for 5 minutes by the
#            OpenAI Python SDK (default retries) from 8 threads, against a
#            fast simulated replica, RUNS times
#
# RUNS (default 3): weights and tpm run into DIR/run-N/ (fresh replicas and
# gateway, another seed each), judged on the median run, every run's number
# stated (admission_report.py runs); fair and flood judge their runs themselves.
#
#   loadtest/bench/tenants.sh [fair] [flood] [weights] [tpm]   (default: all)
#
# Everything runs on 127.0.0.1 with free ports, bounded in time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
OUT="$ROOT/loadtest/results/tenants"
DURATION=${DURATION:-90}
RUNS=${RUNS:-3}
build_release
MACHINE=$(machine_line)
bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv) for tpm

loadgen() { run_on "${LG_CPUS:-}" "$BIN/loadgen" "$@"; }
hash_key() { printf %s "$1" | "$BIN/slogate" keys hash; }

OUTPUT="{ dist: uniform, min: 64, max: 256 }"

# gateway_yaml FILE KEYS_YAML : slogate over SIM_URLS, learned limits, upstream
# priority, everything else as a user gets it; KEYS_YAML under auth.keys.
gateway_yaml() {
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    replicas: [$(IFS=,; echo "${SIM_URLS[*]}" | sed 's/,/, /g')]"
    echo "    upstream_priority: true"
    if [ -n "$2" ]; then echo "auth:"; echo "  keys:"; echo "$2"; fi
  } >"$1"
}

# tenant_stream NAME KEY RATE [CLASS] : a stream of one tenant (Poisson, class chat unless named), 512-token prompts.
tenant_stream() {
  cat <<EOF
  - name: $1
    class: ${4:-chat}
    model: $MODEL
    api_key: $2
    arrival: { kind: poisson, rate: $3 }
    prompt_tokens: { dist: fixed, value: 512 }
    output_tokens: $OUTPUT
EOF
}

# run DIR LABEL KEYS_YAML SCENARIO : fresh replicas, a gateway with KEYS_YAML, the scenario through it.
run() {
  local d=$1 label=$2
  sim_up --replicas 2
  gateway_yaml "$WORK/gw-$label.yaml" "$3"
  start_gateway "$WORK/gw-$label.yaml" "gw-$label"
  loadgen run "$4" --target "$GW_URL" --label "$label" --out "$d/$label.json" --report "$d/$label.md" --no-progress
  curl -sf "$ADMIN_URL/metrics" >"$d/$label-metrics.txt" || true
  gw_down; sim_down
}

keys_of() { # NAME:WEIGHT[:CLASS]... : auth.keys entries, key "sk-NAME", class chat unless named
  local spec name weight rest class
  for spec in "$@"; do
    name=${spec%%:*}; rest=${spec#*:}; weight=${rest%%:*}; class=chat
    [ "$rest" != "$weight" ] && class=${rest#*:}
    echo "    - { name: $name, key_sha256: $(hash_key "sk-$name"), classes: [$class], weight: $weight }"
  done
}

fair() {
  local d="$WORK/fair"; mkdir -p "$d"
  measure_capacity "$WORK"
  local a b
  a=$(python3 -c "print(round(1.5*$C*0.8, 3))"); b=$(python3 -c "print(round(1.5*$C*0.1, 3))")
  { echo "target: http://127.0.0.1:1"; echo "duration: ${DURATION}s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "streams:"
    tenant_stream A sk-A "$a"; tenant_stream B sk-B "$b"; tenant_stream C sk-C "$b"
  } >"$d/scenario.yaml"
  # The reference: B and C at the same rates with A absent.
  { echo "target: http://127.0.0.1:1"; echo "duration: ${DURATION}s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "streams:"
    tenant_stream B sk-B "$b"; tenant_stream C sk-C "$b"
  } >"$d/alone.yaml"
  run "$d" fifo "" "$d/scenario.yaml"
  local i
  for i in $(seq 1 "$RUNS"); do
    run "$d" "fair-$i" "$(keys_of A:1 B:1 C:1)" "$d/scenario.yaml"
  done
  run "$d" alone "$(keys_of A:1 B:1 C:1)" "$d/alone.yaml"
  python3 "$HERE/tenants_report.py" fair "$d" "$C" "$MACHINE"
  publish "$d" "$OUT/fair"
}

flood() {
  local d="$WORK/flood"; mkdir -p "$d"
  measure_capacity "$WORK"
  local chat batch
  chat=$(python3 -c "print(round(0.5*$C, 3))"); batch=$(python3 -c "print(round(2*$C, 3))")
  { echo "target: http://127.0.0.1:1"; echo "duration: ${DURATION}s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "streams:"
    tenant_stream web sk-web "$chat"; tenant_stream bulk sk-bulk "$batch" batch
  } >"$d/scenario.yaml"
  local i
  for i in $(seq 1 "$RUNS"); do
    run "$d" "flood-$i" "$(keys_of web:1 bulk:1:batch)" "$d/scenario.yaml"
  done
  python3 "$HERE/tenants_report.py" flood "$d" "$C" "$MACHINE"
  publish "$d" "$OUT/flood"
}

# judge DIR SCENARIO : the runs in DIR/run-N/ judged together, published.
judge() {
  python3 "$HERE/admission_report.py" runs "$1" "loadtest/bench/tenants.sh $2" "$MACHINE"
  publish "$1" "$OUT/$2"
}

weights() {
  local d="$WORK/weights" r i; mkdir -p "$d"
  measure_capacity "$WORK"
  r=$(python3 -c "print(round(1.5*$C, 3))")
  for i in $(seq 1 "$RUNS"); do
    mkdir -p "$d/run-$i"
    { echo "target: http://127.0.0.1:1"; echo "duration: 70s"; echo "warmup: 10s"; echo "request_timeout: 60s"; echo "seed: $i"; echo "streams:"
      tenant_stream heavy sk-heavy "$r"; tenant_stream light sk-light "$r"
    } >"$d/run-$i/scenario.yaml"
    run "$d/run-$i" weights "$(keys_of heavy:3 light:1)" "$d/run-$i/scenario.yaml"
    python3 "$HERE/tenants_report.py" weights "$d/run-$i" "$C" "$MACHINE"
  done
  judge "$d" weights
}

tpm() {
  local d="$WORK/tpm" i; mkdir -p "$d"
  local limit=${TPM_LIMIT:-30000} minutes=${TPM_MINUTES:-5}
  for i in $(seq 1 "$RUNS"); do
    mkdir -p "$d/run-$i"
    # One fast replica (8B on an H100): the key's limit, not the replica, is what binds.
    start_sim sim --replicas 1 --profile llama8b-h100; SIM_PID=${PIDS[-1]}
    { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
      echo "pools:"
      echo "  - name: default"
      echo "    models: [auto]"
      echo "    replicas: [${SIM_URLS[0]}]"
      echo "auth:"
      echo "  keys:"
      echo "    - { name: sdk, key_sha256: $(hash_key sk-sdk), classes: [chat], limits: { tokens_per_minute: $limit } }"
      echo "    - { name: other, key_sha256: $(hash_key sk-other), classes: [chat] }"
    } >"$WORK/gw-tpm.yaml"
    start_gateway "$WORK/gw-tpm.yaml" "gw-tpm-$i"
    "$ROOT/.venv/bin/python" "$HERE/tpm_sdk.py" "$GW_URL/v1" "$ADMIN_URL" "$limit" "$minutes" "$d/run-$i/tpm.json"
    gw_down; sim_down
    python3 "$HERE/tenants_report.py" tpm "$d/run-$i" "$limit" "$MACHINE"
  done
  judge "$d" tpm
}

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(fair flood weights tpm)
for s in "${want[@]}"; do
  case $s in fair) fair ;; flood) flood ;; weights) weights ;; tpm) tpm ;; *) echo "unknown scenario $s" >&2; exit 2 ;; esac
done
