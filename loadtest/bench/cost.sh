#!/usr/bin/env bash
# Driver of loadtest/scenarios/cost.yaml: cost per request at RAG rates.
# One run into $RUN: short requests through nginx direct, HAProxy (tcp,
# http) and slogate (wrk), allocations per request (the heap-profile
# build), streams through slogate and HAProxy, allocations per event,
# latency added at 32 streams a path against the direct path (slogate's and
# HAProxy's).
#
#   loadtest/run cost
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
SECS=$(bench_var secs) CONNS=$(bench_var conns) STREAMS=$(bench_var streams)
ulimit -n "$(ulimit -Hn)"

# wrk and nginx from Debian, installed once (root only), as HAProxy is.
ensure_pkg wrk wrk
ensure_haproxy

# The fixed answers, shaped as vLLM's: the embedding's 1,024 floats drawn once.
{
  printf '{"id":"embd-1","object":"list","created":1,"model":"m1","data":[{"index":0,"object":"embedding","embedding":['
  awk 'BEGIN { srand(1); for (i = 0; i < 1024; i++) printf "%s%.6f", (i ? "," : ""), rand() * 0.2 - 0.1 }'
  printf ']}],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null}}'
} >"$WORK/embeddings.json"
TEXT=$(printf 'token %.0s' $(seq 64))
printf '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m1","choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":76,"completion_tokens":64,"prompt_tokens_details":null}}' \
  "${TEXT% }" >"$WORK/completions.json"
printf '{"object":"list","data":[{"id":"m1","object":"model","owned_by":"vllm","max_model_len":4096}]}' >"$WORK/models.json"
printf '{"model": "m1", "input": "What does a token bucket do?"}' >"$WORK/embeddings.req"
printf '{"model": "m1", "prompt": "Once upon a time", "max_tokens": 64}' >"$WORK/completions.req"

start_nginx nginx /v1/embeddings="$WORK/embeddings.json" /v1/completions="$WORK/completions.json" /v1/models="$WORK/models.json"
UP=$NGINX_URL
# (Into a file: piped into head, curl fails when head leaves first.)
curl -sf -X POST "$UP/v1/embeddings" -d @"$WORK/embeddings.req" -o "$WORK/probe.json"
head -c 80 "$WORK/probe.json" >&2; echo >&2

# Two builds of slogate: the one its container image ships
# (scripts/build-release: compiled with a profile of its request path),
# which the targets judge, and a plain `cargo build --release`, beside it.
pgo_build
SIM_URLS=("$UP"); bench_config short "$RUN/gw.yaml"
start_gateway "$RUN/gw.yaml" gw-plain; PLAIN_URL=$GW_URL; PLAIN_PID=$GW_PID
GW_BIN=$PGO_BIN start_gateway "$RUN/gw.yaml"
# (Each is started with exec: the PID is HAProxy's own.)
start_haproxy hap-http http "$UP"; HAP_HTTP=$HAP_URL; HAP_HTTP_PID=${PIDS[-1]}
start_haproxy hap-tcp tcp "$UP"; HAP_TCP=$HAP_URL; HAP_TCP_PID=${PIDS[-1]}

for kind in embeddings completions; do
  cat >"$WORK/$kind.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/$kind.req"); wrk.body = f:read("*a"); f:close()
EOF
done

# one ROUND KIND PATH URL PID: a wrk run; a CSV row of requests, seconds, CPU ticks, p50 and p99 (ms).
one() {
  local round=$1 kind=$2 path=$3 url=$4 pid=$5 t0=0 ticks=0
  [ "$pid" != - ] && t0=$(cpu_ticks "$pid")
  wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$WORK/$kind.lua" "$url/v1/$kind" >"$RUN/wrk-$kind-$path.txt" 2>&1
  [ "$pid" != - ] && ticks=$(( $(cpu_ticks "$pid") - t0 ))
  # requests, seconds, CPU ticks, p50 and p99 (ms), non-2xx answers and socket errors, from wrk's summary
  awk -v round="$round" -v kind="$kind" -v path="$path" -v ticks="$ticks" '
    function ms(v,   u) { u = v; sub(/^[0-9.]+/, "", u); v += 0; return u == "us" ? v / 1000 : u == "s" ? v * 1000 : v }
    $1 == "50%" { p50 = ms($2) }
    $1 == "99%" { p99 = ms($2) }
    / requests in / { reqs = $1; secs = $4; sub(/,$/, "", secs); unit = secs; sub(/^[0-9.]+/, "", unit); secs += 0; if (unit == "ms") secs /= 1000 }
    /Non-2xx or 3xx responses:/ { bad = $NF }
    /Socket errors:/ { errs = $0; sub(/.*Socket errors: /, "", errs); gsub(/,/, ";", errs) }
    END { printf "%s,%s,%s,%s,%.3f,%s,%.3f,%.3f,%d,%s\n", round, kind, path, reqs, secs, ticks, p50, p99, bad, errs }
  ' "$RUN/wrk-$kind-$path.txt" >>"$RUN/short.csv"
}

echo "round,kind,path,requests,secs,ticks,p50_ms,p99_ms,non2xx,socket_errors" >"$RUN/short.csv"
for kind in embeddings completions; do
  one "$SEED" "$kind" direct "$UP" -
  one "$SEED" "$kind" haproxy-tcp "$HAP_TCP" "$HAP_TCP_PID"
  one "$SEED" "$kind" haproxy-http "$HAP_HTTP" "$HAP_HTTP_PID"
  one "$SEED" "$kind" slogate "$GW_URL" "$GW_PID"
  one "$SEED" "$kind" slogate-plain "$PLAIN_URL" "$PLAIN_PID"
done
gw_down
kill "$PLAIN_PID"; wait "$PLAIN_PID" 2>/dev/null || true

# Allocations per request: a gateway built with `--features heap-profile`
# (dhat counts every allocation), two wrk runs of different lengths on
# fresh gateways; the difference in allocations over the difference in
# requests leaves start-up and shutdown out.
(cd "$ROOT" && cargo build --release --locked -q --features heap-profile --target-dir target/heap --bin slogate)
heap_run() { # NAME KIND SECONDS: the allocations to $RUN/NAME.heap.json, wrk's requests to $RUN/NAME.wrk
  GW_BIN="$ROOT/target/heap/release/slogate" SLOGATE_HEAP_PROFILE="$RUN/$1.heap.json" start_gateway "$RUN/gw.yaml" "gw-$1"
  wrk -t1 -c"$CONNS" -d"$3s" -s "$WORK/$2.lua" "$GW_URL/v1/$2" >"$RUN/$1.wrk" 2>&1
  gw_down
}
for kind in embeddings completions; do
  heap_run "heap-$kind-short" "$kind" 2
  heap_run "heap-$kind-long" "$kind" 5
done

# Instructions per request: the gateway and HAProxy `mode http` each
# under valgrind's callgrind with its cache simulation (the machine's own
# cache sizes), counting every instruction they execute, and the first-level
# cache misses, which explain why the same instructions cost more time on
# one processor than another: wrk at 8 connections, the counts zeroed after a
# warm-up and dumped after CG_SECS, over the requests wrk counted. The
# count is the machine-independent half of the CPU per request (a
# simulation: it does not move with the machine's load), so it is also the
# budget a change is held to.
ensure_pkg valgrind valgrind
CG_SECS=$(bench_var cg_secs)
echo "proxy,kind,requests,file" >"$RUN/instructions.csv"
cg_run() { # PROXY URL PID OUT: one row of instructions.csv a kind
  local proxy=$1 url=$2 pid=$3 out=$4 kind n=0
  for kind in embeddings completions; do
    wrk -t1 -c8 -d2s -s "$WORK/$kind.lua" "$url/v1/$kind" >/dev/null 2>&1
    callgrind_control -z "$pid" >/dev/null 2>&1
    wrk -t1 -c8 -d"${CG_SECS}s" -s "$WORK/$kind.lua" "$url/v1/$kind" >"$RUN/cg-$proxy-$kind.wrk" 2>&1
    callgrind_control -d "$pid" >/dev/null 2>&1
    n=$((n + 1))
    # The dump is written by the process itself, after the command returns.
    for _ in $(seq 600); do [ -s "$out.$n" ] && grep -q '^totals:' "$out.$n" && break; sleep 0.05; done
    echo "$proxy,$kind,$(grep -oE '[0-9]+ requests in' "$RUN/cg-$proxy-$kind.wrk" | cut -d' ' -f1),$out.$n" >>"$RUN/instructions.csv"
  done
}
CG="valgrind --tool=callgrind --cache-sim=yes --dump-instr=no"
rm -f "$WORK"/cg-slogate* "$WORK"/cg-haproxy*   # not an earlier run's dumps
GW_BIN=$PGO_BIN GW_WRAP="$CG --log-file=$WORK/valgrind-slogate.log --callgrind-out-file=$WORK/cg-slogate" start_gateway "$RUN/gw.yaml" gw-cg
cg_run slogate "$GW_URL" "$GW_PID" "$WORK/cg-slogate"
gw_down
GW_WRAP="$CG --log-file=$WORK/valgrind-slogate-plain.log --callgrind-out-file=$WORK/cg-slogate-plain" start_gateway "$RUN/gw.yaml" gw-cg-plain
cg_run slogate-plain "$GW_URL" "$GW_PID" "$WORK/cg-slogate-plain"
gw_down
HAP_WRAP="$CG --log-file=$WORK/valgrind-haproxy.log --callgrind-out-file=$WORK/cg-haproxy" start_haproxy hap-cg http "$UP"
cg_run haproxy-http "$HAP_URL" "${PIDS[-1]}" "$WORK/cg-haproxy"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# Streams: STREAMS open, a token every 100 ms each, through slogate and
# through HAProxy (`mode http` and `mode tcp`) in front of the same
# simulator: each path's CPU over its whole run, divided by the content
# events its clients received (loadgen's token counts; every stream it
# opened finishes before it exits).
start_sim streams --profile llama8b-h100 --step-base-ms 100 --decode-per-seq-ms 0 --prefill-per-token-ms 0 \
  --max-num-seqs 20000 --max-num-batched-tokens 10000000 --kv-blocks 10000000
bench_config streams "$RUN/gw-streams.yaml"
start_gateway "$RUN/gw-streams.yaml" gw-streams-plain; PLAIN_URL=$GW_URL; PLAIN_PID=$GW_PID
GW_BIN=$PGO_BIN start_gateway "$RUN/gw-streams.yaml" gw-streams
start_haproxy hap-streams-http http "${SIM_URLS[0]}"; STREAM_HTTP=$HAP_URL; STREAM_HTTP_PID=${PIDS[-1]}
start_haproxy hap-streams-tcp tcp "${SIM_URLS[0]}"; STREAM_TCP=$HAP_URL; STREAM_TCP_PID=${PIDS[-1]}
bench_load streams "$RUN/streams.yaml"
echo "path,ticks" >"$RUN/streams.csv"
stream_run() { # PATH URL PID
  local t0; t0=$(cpu_ticks "$3")
  "$BIN/loadgen" run "$RUN/streams.yaml" --target "$2" --label "streams-$1" --no-progress --out "$RUN/streams-$1.json" >&2
  echo "$1,$(( $(cpu_ticks "$3") - t0 ))" >>"$RUN/streams.csv"
}
stream_run slogate "$GW_URL" "$GW_PID"
stream_run slogate-plain "$PLAIN_URL" "$PLAIN_PID"
stream_run haproxy-http "$STREAM_HTTP" "$STREAM_HTTP_PID"
stream_run haproxy-tcp "$STREAM_TCP" "$STREAM_TCP_PID"
gw_down
kill "$PLAIN_PID"; wait "$PLAIN_PID" 2>/dev/null || true
# Allocations per streamed event: 100 streams through the heap-profile
# build, for two lengths; events from its metrics.
for len in short long; do
  secs=10; [ $len = long ] && secs=20
  GW_BIN="$ROOT/target/heap/release/slogate" SLOGATE_HEAP_PROFILE="$RUN/heap-streams-$len.heap.json" start_gateway "$RUN/gw-streams.yaml" "gw-heap-streams-$len"
  bench_load streams "$RUN/heap-streams-$len.yaml" --set duration="${secs}s" --set warmup=0s --set streams=100
  "$BIN/loadgen" run "$RUN/heap-streams-$len.yaml" --target "$GW_URL" --label "heap-streams-$len" --no-progress --out "$RUN/heap-streams-$len.json" >&2
  curl -sf "$ADMIN_URL/metrics" >"$RUN/heap-streams-$len.metrics"
  gw_down
done
# Latency at 32 streams a path, slogate on its defaults (a learned limit):
# one load of 64 closed-loop streams whose requests take the two paths in
# turn (slogate, then straight to the simulator), 20-ms engine steps, each
# chunk stamped with when its request arrived and when it left the
# replica, so the path's share of each TTFT and of each gap is known; then
# the same load with HAProxy (`mode http`, then `mode tcp`) in slogate's
# place, what a proxy adds on this machine; then both paths direct (A/A),
# the method's noise floor.
cleanup; PIDS=()
start_sim lat --step-base-ms 20 $SIM_EVEN --stamp-events
bench_config latency "$RUN/gw-lat.yaml"
GW_BIN=$PGO_BIN start_gateway "$RUN/gw-lat.yaml" gw-lat
bench_load mix "$RUN/mix.yaml"
run_lg "$RUN/mix.yaml" "$GW_URL,${SIM_URLS[0]}" lat-ab >&2
gw_down
for mode in http tcp; do
  start_haproxy "hap-lat-$mode" "$mode" "${SIM_URLS[0]}"
  run_lg "$RUN/mix.yaml" "$HAP_URL,${SIM_URLS[0]}" "lat-haproxy-$mode" >&2
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
done
run_lg "$RUN/mix.yaml" "${SIM_URLS[0]},${SIM_URLS[0]}" lat-aa >&2
# Idle: both builds on their defaults (a learned limit, so the replica's
# metrics are read) and HAProxy `mode http` in front of the same simulator,
# no traffic at all: each one's CPU (user + system from /proc, every
# thread's) over IDLE_SECS, after 5 s to settle. Side by side: nothing
# they do reaches the others.
IDLE_SECS=$(bench_var idle_secs)
GW_BIN=$PGO_BIN start_gateway "$RUN/gw-lat.yaml" gw-idle; IDLE_PGO=$GW_PID
start_gateway "$RUN/gw-lat.yaml" gw-idle-plain; IDLE_PLAIN=$GW_PID
start_haproxy hap-idle http "${SIM_URLS[0]}"; IDLE_HAP=${PIDS[-1]}
sleep 5
i0=$(cpu_ticks "$IDLE_PGO") p0=$(cpu_ticks "$IDLE_PLAIN") h0=$(cpu_ticks "$IDLE_HAP")
sleep "$IDLE_SECS"
{ echo "path,ticks,secs"
  echo "slogate,$(( $(cpu_ticks "$IDLE_PGO") - i0 )),$IDLE_SECS"
  echo "slogate-plain,$(( $(cpu_ticks "$IDLE_PLAIN") - p0 )),$IDLE_SECS"
  echo "haproxy-http,$(( $(cpu_ticks "$IDLE_HAP") - h0 )),$IDLE_SECS"; } >"$RUN/idle.csv"
cleanup; PIDS=()
"$BIN/bench" report cost "$RUN" "$(getconf CLK_TCK)" "$STREAMS"
