#!/usr/bin/env bash
# Short requests under load: does an embeddings request wait behind streams
# for a slot, when the streams hold every slot and chat queues?
#
# The admission benchmarks' fleet (two simulated vLLM replicas of a 70B
# model, 64 sequences each) behind one slogate with a user's defaults (learned
# limits, no class named: embeddings go to `rag` by endpoint). Each run:
#   - chat streams arrive at 1.5 C (Poisson): the slots stay full, chat
#     requests queue and the late ones are refused (shed_late);
#   - EMB_RATE embeddings requests a second (256-token inputs, constant
#     rate) go either through the gateway ("gateway") or straight to a
#     replica ("direct", the control: the same work on the machine, none of
#     it in the gateway).
# The replica answers embeddings beside its streams (as a pooling endpoint
# does), so what an embeddings request waits through the gateway beyond
# direct is the gateway's: its queue, if it made them wait for a slot.
# RUNS (default 3) pairs of runs, each on fresh replicas and a fresh
# gateway; checks on the median run, the worst stated.
# Everything runs on 127.0.0.1 with free ports, bounded in time.
# Writes loadtest/results/short/README.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
trap cleanup EXIT
OUT="$ROOT/loadtest/results/short"
RUNS=${RUNS:-3}
DURATION=${DURATION:-40}
WARMUP=10
EMB_RATE=${EMB_RATE:-20}
build_release
MACHINE=$(machine_line)
d="$WORK/short"; mkdir -p "$d"
measure_capacity "$d"
chat_rate=$(python3 -c "print(round(1.5 * $C, 3))")

for i in $(seq 1 "$RUNS"); do
  for where in gateway direct; do
    sim_up --replicas 2
    cat >"$WORK/gw.yaml" <<EOS
server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }
pools:
  - { name: default, models: [auto], replicas: [$TARGETS] }
EOS
    start_gateway "$WORK/gw.yaml" "gw-$where-$i"
    emb_target=$GW_URL
    [ "$where" = direct ] && emb_target=${SIM_URLS[0]}
    { echo "target: $GW_URL"; echo "duration: ${DURATION}s"; echo "warmup: ${WARMUP}s"; echo "request_timeout: 60s"; echo "seed: $i"; echo "streams:"
      chat_stream chat chat "{ kind: poisson, rate: $chat_rate }" "{ dist: fixed, value: 512 }" "{ dist: uniform, min: 64, max: 256 }"
      cat <<EOS
  - name: emb
    model: $MODEL
    endpoint: embeddings
    stream: false
    target: $emb_target
    arrival: { kind: constant, rate: $EMB_RATE }
    prompt_tokens: { dist: fixed, value: 256 }
    output_tokens: { dist: fixed, value: 1 }
EOS
    } >"$d/$where-$i.yaml"
    run_lg "$d/$where-$i.yaml" "$GW_URL" "$where-$i"
    mv "$WORK/$where-$i.json" "$d/"
    gw_down; sim_down
  done
done

python3 "$HERE/short_report.py" "$d" "$MACHINE" "$C" "$RUNS" "$DURATION" "$WARMUP" "$EMB_RATE" >"$d/README.md"
publish "$d" "$OUT"
cat "$OUT/README.md"
