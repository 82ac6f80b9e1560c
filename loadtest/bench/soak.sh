#!/usr/bin/env bash
# Driver of loadtest/scenarios/soak.yaml: does everything slogate holds come
# back when the traffic goes? One run into $RUN: two faulty simulated
# replicas, loadgen's chat and misbehaving clients for `duration` seconds
# (the replicas stalling in turn every minute), slogate sampled every 5 s
# before, during and after.
#
#   loadtest/run soak
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
DURATION=$(bench_var duration)

start_sim soak --replicas 2 --cut-rate 0.02 --stream-error-rate 0.02 --error-rate 0.02
bench_config main "$RUN/gw.yaml"
start_gateway "$RUN/gw.yaml"
PORT=${GW_URL##*:}
bench_load main "$RUN/load.yaml"

metric_sum() { # name: the sum of a metric's samples
  curl -sf "$ADMIN_URL/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s += $NF} END {printf "%d\n", s}'
}
sample() { # t phase
  echo "$1,$2,$(rss_kb "$GW_PID"),$(ls "/proc/$GW_PID/fd" | wc -l),$(metric_sum slogate_inflight_requests),$(metric_sum slogate_queue_depth),$(metric_sum slogate_open_connections)"
}
echo "t,phase,rss_kb,fds,inflight,queued,connections" >"$RUN/samples.csv"
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
sleep 5
sample "$(now)" before >>"$RUN/samples.csv"

"$BIN/loadgen" run "$RUN/load.yaml" --target "$GW_URL" --label soak --no-progress --out "$RUN/soak.json" --report "$RUN/soak.md" >/dev/null &
LG=$!; PIDS+=($LG)
"$BIN/bench" soak-clients 127.0.0.1 "$PORT" "$DURATION" >"$RUN/clients.txt" &
CL=$!; PIDS+=($CL)
END=$(( T0 + 5 + DURATION ))
NEXT_STALL=$(( $(date +%s) + 60 )) STALLS=0
while [ "$(date +%s)" -lt "$END" ]; do
  sleep 5
  sample "$(now)" load >>"$RUN/samples.csv"
  if [ "$(date +%s)" -ge "$NEXT_STALL" ]; then
    # The replicas stall in turn.
    SIM=${SIM_URLS[$(( STALLS % 2 ))]}; STALLS=$(( STALLS + 1 ))
    curl -sf -X POST "$SIM/admin/faults" -H 'content-type: application/json' -d '{"error_rate": 0.02, "stream_error_rate": 0.02, "cut_rate": 0.02, "stall_secs": 4}' >/dev/null || true
    NEXT_STALL=$(( NEXT_STALL + 60 ))
  fi
done
wait "$LG" || true
wait "$CL" || true
curl -sf "$ADMIN_URL/metrics" >"$RUN/end.metrics"
# The longest anything may stay after the traffic: idle keep-alive
# connections to the replica are kept 60 s for reuse (swept at each health
# check); the timeouts here are at most 5 s. Then three more samples.
sleep 65
for _ in 1 2 3; do sample "$(now)" after >>"$RUN/samples.csv"; sleep 5; done

awk -F, 'NR > 1 {printf "%s,%.1f,%s,%s,%s,%s\n", $1, $3 / 1024, $4, $5, $6, $7}' "$RUN/samples.csv" \
  | { echo "t (s),RSS MB,open fds,slots in flight,queued,client connections"; cat; } >"$RUN/chart.csv"
"$BIN/loadgen" chart "$RUN/chart.csv" --dir "$RUN" --stem soak --title "slogate under soak: what it holds over time" --y-label "MB / count" >/dev/null
rm -f "$RUN"/*.png
"$BIN/bench" report soak "$RUN"
