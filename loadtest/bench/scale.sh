#!/usr/bin/env bash
# Driver of loadtest/scenarios/scale.yaml: what each open stream costs
# slogate. One run into $RUN: a fleet of slow simulated replicas, then one
# part per number of streams and protocol (each on a gateway of its own,
# RSS sampled, the direct streams beside), then the heap-profile parts.
#
#   loadtest/run scale
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
H1=$(bench_var h1_streams) H2=$(bench_var h2_streams) HEAP_N=$(bench_var heap_streams)
ulimit -n "$(ulimit -Hn)"

start_sim sim --replicas "$(bench_var fleet)" --stagger --stamp-events --profile llama8b-h100 --step-base-ms 1000 --decode-per-seq-ms 0 \
  --prefill-per-token-ms 0 --max-num-seqs 20000 --max-num-batched-tokens 10000000 --kv-blocks 10000000
SIMS=$(IFS=,; echo "${SIM_URLS[*]}")
bench_config main "$RUN/gw.yaml"
echo "run,proto,streams,idle_kb,peak_kb,open_peak,cpu_ticks" >"$RUN/runs.csv"

# sample NAME: every 0.5 s, the gateway's RSS (kB) and open requests, until $RUN/NAME.stop exists.
sample() {
  local name=$1
  while [ ! -e "$RUN/$name.stop" ]; do
    echo "$(rss_kb "$GW_PID") $(curl -s "$ADMIN_URL/metrics" | awk '/^slogate_inflight_requests[ {]/ {s += $NF} END {print s + 0}')" >>"$RUN/$name.samples"
    sleep 0.5
  done
}

part() { # NAME PROTO N [heap]
  local name=$1 proto=$2 n=$3 heap=${4:-} http2=false
  [ "$proto" = h2 ] && http2=true
  if [ -n "$heap" ]; then
    GW_BIN="$ROOT/target/heap/release/slogate" SLOGATE_HEAP_PROFILE="$RUN/$name.heap.json" start_gateway "$RUN/gw.yaml" "gw-$name"
  else
    start_gateway "$RUN/gw.yaml" "gw-$name"
  fi
  sleep 2   # settled: the idle RSS
  IDLE_KB=$(rss_kb "$GW_PID")
  bench_load main "$RUN/$name.yaml" --set streams="$n" --set http2="$http2" --set replicas="$SIMS"
  if [ -n "$heap" ]; then
    # The live heap peaks with every stream open (all arrived in 10 s, each lasts 40); dhat writes it at exit.
    "$BIN/loadgen" run "$RUN/$name.yaml" --target "$GW_URL" --label "$name" --no-progress --out "$RUN/$name.json" >&2 & local lg=$!
    sleep 25
    kill -TERM "$GW_PID"; wait "$GW_PID" || true
    kill "$lg" 2>/dev/null; wait "$lg" || true
    return
  fi
  rm -f "$RUN/$name.stop"; sample "$name" & local sampler=$!
  local t0; t0=$(cpu_ticks "$GW_PID")
  "$BIN/loadgen" run "$RUN/$name.yaml" --target "$GW_URL" --label "$name" --no-progress --out "$RUN/$name.json" --report "$RUN/$name.md" >&2
  local ticks=$(( $(cpu_ticks "$GW_PID") - t0 ))
  touch "$RUN/$name.stop"; wait "$sampler"
  local peak open; read -r peak open < <(awk 'BEGIN{p=0;o=0} {if ($1>p) p=$1; if ($2>o) o=$2} END{print p, o}' "$RUN/$name.samples")
  echo "$name,$proto,$n,$IDLE_KB,$peak,$open,$ticks" >>"$RUN/runs.csv"
  gw_down
  sleep 2   # the sockets it held are gone before the next part
}

for n in $H1; do part "h1-$n" h1 "$n"; done
for n in $H2; do part "h2-$n" h2 "$n"; done
if [ -n "$HEAP_N" ]; then
  (cd "$ROOT" && cargo build --release --locked -q --features heap-profile --target-dir target/heap --bin slogate)
  part "heap-h1" h1 "$HEAP_N" heap
  part "heap-h2" h2 "$HEAP_N" heap
  "$BIN/bench" report heap "$HEAP_N" "HTTP/1.1=$RUN/heap-h1.heap.json" "HTTP/2=$RUN/heap-h2.heap.json" >"$RUN/heap.md"
fi
"$BIN/bench" report scale "$RUN" "$(getconf CLK_TCK)"
for p in h1 h2; do
  [ "$(wc -l <"$RUN/rss-$p.csv")" -gt 1 ] || continue
  "$BIN/loadgen" chart "$RUN/rss-$p.csv" --dir "$RUN" --stem "rss-$p" --title "slogate RSS against open streams ($p)" --y-label "MB" >&2
done
rm -f "$RUN"/*.png
