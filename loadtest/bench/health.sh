#!/usr/bin/env bash
# A busy replica is not a dead one: N (5000) streams held open through
# slogate on ONE simulated replica (a token a second each, HTTP/2 clients
# arriving over 10 s, each stream 40 tokens, closed loop for 60 s), and
# FAIL_AT seconds in the replica's health endpoint turns slow: it answers
# after 2 s, past slogate's 1 s check timeout, to the end of the run.
# slogate's health checks are the defaults (every 2 s, out after 2
# failures). Two runs, each on a fresh replica and gateway:
#   - defaults: a replica delivering tokens is kept in, and the pool's
#     panic threshold routes to it anyway once it is out;
#   - panic off (`health: { panic_threshold: 0 }`): only "kept in: it
#     delivers tokens" stands between the failing checks and 503s.
# Every request must complete; none may be answered 503.
# Everything runs on 127.0.0.1, bounded in count and time.
# Writes loadtest/results/health/README.md (stamped).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
N=${N:-5000} FAIL_AT=${FAIL_AT:-15} SECS=${SECS:-60}
build_release
MACHINE=$(machine_line)
ulimit -n "$(ulimit -Hn)"

run() { # NAME EXTRA_POOL_FIELD
  local name=$1
  start_sim "sim-$name" --profile llama8b-h100 --step-base-ms 1000 --decode-per-seq-ms 0 --prefill-per-token-ms 0 \
    --max-num-seqs 20000 --max-num-batched-tokens 10000000 --kv-blocks 10000000
  local sim=${SIM_URLS[0]}
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s, max_connections: 20000, http2_max_streams: 16384 }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    max_inflight_per_replica: 20000"
    echo "    replicas: [$sim]"
    [ -n "$2" ] && echo "    $2"
    echo "tiers: { interactive: { queue_capacity: 20000 } }"
  } >"$WORK/gw-$name.yaml"
  start_gateway "$WORK/gw-$name.yaml" "gw-$name"
  cat >"$WORK/$name.yaml" <<EOS
target: $GW_URL
duration: ${SECS}s
warmup: 0s
request_timeout: 300s
streams:
  - name: s
    class: chat
    model: sim-llama-8b
    http2: true
    arrival: { kind: closed, concurrency: $N, ramp: 10s }
    prompt_tokens: { dist: fixed, value: 16 }
    output_tokens: { dist: fixed, value: 40 }
EOS
  "$BIN/loadgen" run "$WORK/$name.yaml" --label "$name" --no-progress --out "$WORK/$name.json" >&2 &
  local lg=$!
  sleep "$FAIL_AT"
  curl -sf -X POST "$sim/admin/faults" -H 'content-type: application/json' -d '{"health_delay_secs": 2}' >/dev/null
  sleep 10
  curl -sf "$ADMIN_URL/slo.json" >"$WORK/$name.slo.json"
  curl -sf "$ADMIN_URL/metrics" >"$WORK/$name.metrics"
  wait "$lg"
  grep -c '"replica taken out' "$WORK/gw-$name.log" >"$WORK/$name.takeouts" || true
  grep -c 'panic: too few replicas' "$WORK/gw-$name.log" >"$WORK/$name.panics" || true
  cleanup; PIDS=()
}

run defaults ""
run panic-off "health: { panic_threshold: 0 }"

python3 - "$WORK" "$MACHINE" "$N" "$FAIL_AT" "$SECS" >"$WORK/README.md" <<'EOF'
import collections, json, sys
work, machine, n, fail_at, secs = sys.argv[1:6]
print(f"""# A busy replica is not a dead one

`loadtest/bench/health.sh` ({machine}).

{n} streams held open through slogate on one simulated replica (a token a
second each, 40 tokens, HTTP/2 clients arriving over 10 s, a closed loop for
{secs} s), with slogate's default health checks (every 2 s, out after 2
failures, 1 s timeout). {fail_at} s in, the replica's `/health` turns slow: it
answers after 2 s, to the end of the run, so every check times out; the
replica goes on streaming. Each run on a fresh replica and gateway.

| run | requests | ok | 503 | other outcomes | replica's verdict 10 s after `/health` turned slow | pool in panic | take-outs logged |
|---|---:|---:|---:|---|---|---|---:|""")
for name, label in [("defaults", "defaults (panic_threshold 0.5)"), ("panic-off", "`panic_threshold: 0`")]:
    recs = json.load(open(f"{work}/{name}.json"))["records"]
    out = collections.Counter(r["outcome"] for r in recs)
    s503 = sum(1 for r in recs if r["status"] == 503)
    ok = out.get("ok", 0) + out.get("length", 0)
    other = ", ".join(f"{k} {v}" for k, v in sorted(out.items()) if k not in ("ok", "length")) or "none"
    slo = json.load(open(f"{work}/{name}.slo.json"))
    p = slo["pools"][0]
    r = p["replicas"][0]
    verdict = ("passing" if r["healthy"] else "failing") + (f": {r['reason']}" if r.get("reason") else "")
    takeouts = open(f"{work}/{name}.takeouts").read().strip() or "0"
    print(f"| {label} | {len(recs)} | {ok} | **{s503}** | {other} | {verdict} | {'yes' if p.get('panic') else 'no'} | {takeouts} |")
EOF
OUT="$ROOT/loadtest/results/health"
publish "$WORK" "$OUT"
cat "$OUT/README.md"
