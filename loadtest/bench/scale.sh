#!/usr/bin/env bash
# Scale: what each open stream costs slogate. Streams held open by slow
# engines (a fleet of REPLICAS simulated replicas, each stepping once a
# second at its own instant, every sequence decoding: a token a second per
# stream), N of them through slogate at once (clients arriving over RAMP
# seconds), HTTP/1.1 clients (one connection each) and HTTP/2 clients
# (multiplexed on one connection), with 100 more streams straight to the
# replicas in the same run (the direct path, for the ITL slogate adds: the
# simulator stamps each event, so what a gap gains on its way to the client
# is measured to the microsecond). Per run: the gateway's RSS idle and at
# its peak, bytes per open stream, added ITL p99, CPU per event forwarded;
# a chart of RSS against open streams;
# then where an open stream's memory goes (the live heap of a gateway built
# with `--features heap-profile`, by what allocated it, at HEAP_N streams).
# Writes loadtest/results/scale/README.md.
#
#   loadtest/bench/scale.sh            (N = 1000 and 5000 over HTTP/1.1,
#                                       1000, 5000 and 10000 over HTTP/2)
#   H1="1000" H2="1000" HEAP_N="" loadtest/bench/scale.sh   (no heap profile)
#
# HTTP/1.1 stops at 5000: each stream is a client connection and a replica
# connection in the gateway, and this machine's file limit is 20000.
# Everything runs on 127.0.0.1 with free ports, bounded in time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
OUT=${OUT:-"$ROOT/loadtest/results/scale"}
H1=${H1:-"1000 5000"}
H2=${H2:-"1000 5000 10000"}
HOLD=${HOLD:-40}        # seconds each stream lasts (tokens, one a second)
RAMP=${RAMP:-10}        # seconds over which the N clients arrive
REPLICAS=${REPLICAS:-100}
HEAP_N=${HEAP_N-1000}   # streams of the heap-profile runs ("" skips them)
build_release
MACHINE=$(machine_line)
ulimit -n "$(ulimit -Hn)"

start_sim sim --replicas "$REPLICAS" --stagger --stamp-events --profile llama8b-h100 --step-base-ms 1000 --decode-per-seq-ms 0 \
  --prefill-per-token-ms 0 --max-num-seqs 20000 --max-num-batched-tokens 10000000 --kv-blocks 10000000
SIMS=$(IFS=,; echo "${SIM_URLS[*]}")
# Each run on a gateway of its own: memory an allocator keeps after a run
# would count as the next run's idle.
{ echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s, max_connections: 20000, http2_max_streams: 16384 }"
  echo "pools:"
  echo "  - name: default"
  echo "    models: [auto]"
  echo "    max_inflight_per_replica: 20000"
  echo "    replicas: [$SIMS]"
  echo "tiers: { interactive: { queue_capacity: 20000 } }"
} >"$WORK/gw.yaml"
echo "run,proto,streams,idle_kb,peak_kb,open_peak,cpu_ticks,events" >"$WORK/runs.csv"

# sample NAME: every 0.5 s, the gateway's RSS (kB) and open requests, until $WORK/NAME.stop exists.
sample() {
  local name=$1
  while [ ! -e "$WORK/$name.stop" ]; do
    echo "$(rss_kb "$GW_PID") $(curl -s "$ADMIN_URL/metrics" | awk '/^slogate_inflight_requests[ {]/ {s += $NF} END {print s + 0}')" >>"$WORK/$name.samples"
    sleep 0.5
  done
}

run() { # NAME PROTO N [heap]
  local name=$1 proto=$2 n=$3 heap=${4:-}
  if [ -n "$heap" ]; then
    GW_BIN="$ROOT/target/heap/release/slogate" SLOGATE_HEAP_PROFILE="$WORK/$name.heap.json" start_gateway "$WORK/gw.yaml" "gw-$name"
  else
    start_gateway "$WORK/gw.yaml" "gw-$name"
  fi
  sleep 2
  IDLE_KB=$(rss_kb "$GW_PID")
  { echo "target: $GW_URL"
    echo "duration: $((HOLD + 20))s"
    echo "warmup: 15s"
    echo "request_timeout: 300s"
    echo "streams:"
    for s in through direct; do
      local c=$n t=""
      [ $s = direct ] && c=100 t="    target: $SIMS"
      echo "  - name: $s"
      if [ $s = through ]; then echo "    class: chat"; else echo "    class: direct"; fi
      echo "    model: sim-llama-8b"
      [ -n "$t" ] && echo "$t"
      [ $s = through ] && [ "$proto" = h2 ] && echo "    http2: true"
      echo "    arrival: { kind: closed, concurrency: $c, ramp: ${RAMP}s }"
      echo "    prompt_tokens: { dist: fixed, value: 16 }"
      echo "    output_tokens: { dist: fixed, value: $HOLD }"
    done
  } >"$WORK/$name.yaml"
  if [ -n "$heap" ]; then
    # The live heap peaks with every stream open; dhat writes it at exit.
    "$BIN/loadgen" run "$WORK/$name.yaml" --label "$name" --no-progress --out "$WORK/$name.json" >&2 & local lg=$!
    sleep $((RAMP + 15))
    kill -TERM "$GW_PID"; wait "$GW_PID" || true
    kill "$lg" 2>/dev/null; wait "$lg" || true
    return
  fi
  rm -f "$WORK/$name.stop"; sample "$name" & local sampler=$!
  local t0; t0=$(cpu_ticks "$GW_PID")
  "$BIN/loadgen" run "$WORK/$name.yaml" --label "$name" --no-progress --out "$WORK/$name.json" --report "$WORK/$name.md" >&2
  local ticks=$(( $(cpu_ticks "$GW_PID") - t0 ))
  touch "$WORK/$name.stop"; wait "$sampler"
  local events; events=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sum(x["tokens"] for x in r["records"] if x["stream"]=="through"))' "$WORK/$name.json")
  local peak open; read -r peak open < <(awk 'BEGIN{p=0;o=0} {if ($1>p) p=$1; if ($2>o) o=$2} END{print p, o}' "$WORK/$name.samples")
  echo "$name,$proto,$n,$IDLE_KB,$peak,$open,$ticks,$events" >>"$WORK/runs.csv"
  gw_down
  sleep 2
}

for n in $H1; do run "h1-$n" h1 "$n"; done
for n in $H2; do run "h2-$n" h2 "$n"; done
if [ -n "$HEAP_N" ]; then
  (cd "$ROOT" && cargo build --release --locked -q --features heap-profile --target-dir target/heap --bin slogate)
  run "heap-h1" h1 "$HEAP_N" heap
  run "heap-h2" h2 "$HEAP_N" heap
  python3 "$HERE/scale_heap.py" "$HEAP_N" "HTTP/1.1=$WORK/heap-h1.heap.json" "HTTP/2=$WORK/heap-h2.heap.json" >"$WORK/heap.md"
fi

python3 "$HERE/scale_report.py" "$WORK" "$MACHINE" "$(getconf CLK_TCK)" >"$WORK/README.md"
mkdir -p "$OUT"
for p in h1 h2; do
  [ "$(wc -l <"$WORK/rss-$p.csv")" -gt 1 ] || continue
  "$BIN/loadgen" chart "$WORK/rss-$p.csv" --dir "$WORK" --stem "rss-$p" --title "slogate RSS against open streams ($p)" --y-label "MB" >&2
done
publish "$WORK" "$OUT"
rm -f "$OUT"/*.png
cat "$OUT/README.md"
