#!/usr/bin/env bash
# Soak: does everything slogate holds come back when the traffic goes?
#
#   loadtest/bench/soak.sh DURATION_SECONDS      (default 1800)
#
# Two simulated replicas that each cut 2 % of their streams, end 2 % with an
# error event and answer 2 % with HTTP errors, and stall for 4 s every minute
# (past slogate's 2 s idle timeout), one after the other. slogate's defaults
# otherwise: an error before the response head is retried on the other
# replica, and a broken stream is continued there. Through slogate, for DURATION: loadgen
# streams chat at 20 req/s (Poisson), and misbehaving clients (soak_clients.py)
# that hang up midway, stop reading, or send half a request head. Every 5 s
# the sampler records slogate's RSS, open file descriptors, slots in flight,
# queue depth and open client connections. After the traffic stops and the
# timeouts have passed, each must be back at its level before the traffic.
# Everything runs on 127.0.0.1, bounded in time.
# Writes loadtest/results/soak/README.md and soak.svg.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
DURATION=${1:-1800}
build_release
MACHINE=$(machine_line)

start_sim soak --replicas 2 --cut-rate 0.02 --stream-error-rate 0.02 --error-rate 0.02
GATEWAY_EXTRA="    timeouts: { idle: 2s, first_token: 10s }
server_tuning_placeholder: null" gateway_config "$WORK/gw.yaml" "${SIM_URLS[@]}"
# The server section is the first line: give the misbehaving clients short limits.
sed -i '1s/.*/server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s, send_timeout: 5s, header_read_timeout: 3s, body_read_timeout: 3s }/; /server_tuning_placeholder/d' "$WORK/gw.yaml"
start_gateway "$WORK/gw.yaml"
PORT=${GW_URL##*:}

metric_sum() { # name: the sum of a metric's samples
  curl -sf "$ADMIN_URL/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s += $NF} END {printf "%d\n", s}'
}
sample() { # t phase
  echo "$1,$2,$(rss_kb "$GW_PID"),$(ls "/proc/$GW_PID/fd" | wc -l),$(metric_sum slogate_inflight_requests),$(metric_sum slogate_queue_depth),$(metric_sum slogate_open_connections)"
}
echo "t,phase,rss_kb,fds,inflight,queued,connections" >"$WORK/samples.csv"
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
sleep 5
sample "$(now)" before >>"$WORK/samples.csv"

cat >"$WORK/load.yaml" <<EOS
target: $GW_URL
duration: ${DURATION}s
warmup: 0s
request_timeout: 60s
streams:
  - name: chat
    class: chat
    model: sim-llama-8b
    arrival: { kind: poisson, rate: 20 }
    prompt_tokens: { dist: uniform, min: 32, max: 512 }
    output_tokens: { dist: uniform, min: 16, max: 256 }
EOS
"$BIN/loadgen" run "$WORK/load.yaml" --label soak --no-progress --out "$WORK/soak.json" --report "$WORK/soak.md" >/dev/null &
LG=$!; PIDS+=($LG)
python3 "$HERE/bench/soak_clients.py" 127.0.0.1 "$PORT" "$DURATION" >"$WORK/clients.txt" &
CL=$!; PIDS+=($CL)
END=$(( T0 + 5 + DURATION ))
NEXT_STALL=$(( $(date +%s) + 60 )) STALLS=0
while [ "$(date +%s)" -lt "$END" ]; do
  sleep 5
  sample "$(now)" load >>"$WORK/samples.csv"
  if [ "$(date +%s)" -ge "$NEXT_STALL" ]; then
    # The replicas stall in turn.
    SIM=${SIM_URLS[$(( STALLS % 2 ))]}; STALLS=$(( STALLS + 1 ))
    curl -sf -X POST "$SIM/admin/faults" -H 'content-type: application/json' -d '{"error_rate": 0.02, "stream_error_rate": 0.02, "cut_rate": 0.02, "stall_secs": 4}' >/dev/null || true
    NEXT_STALL=$(( NEXT_STALL + 60 ))
  fi
done
wait "$LG" || true
wait "$CL" || true
curl -sf "$ADMIN_URL/metrics" >"$WORK/end.metrics"
# The longest anything may stay after the traffic: idle keep-alive
# connections to the replica are kept 60 s for reuse (swept at each health
# check); the timeouts here are at most 5 s. Then three more samples.
sleep 65
for _ in 1 2 3; do sample "$(now)" after >>"$WORK/samples.csv"; sleep 5; done

mkdir -p "$WORK/out"
awk -F, 'NR > 1 {printf "%s,%.1f,%s,%s,%s,%s\n", $1, $3 / 1024, $4, $5, $6, $7}' "$WORK/samples.csv" \
  | { echo "t (s),RSS MB,open fds,slots in flight,queued,client connections"; cat; } >"$WORK/chart.csv"
"$BIN/loadgen" chart "$WORK/chart.csv" --dir "$WORK/out" --stem soak --title "slogate under soak: what it holds over time" --y-label "MB / count" >/dev/null
python3 - "$WORK" "$MACHINE" "$DURATION" >"$WORK/out/README.md" <<'PY'
import csv, json, sys
work, machine, duration = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = list(csv.DictReader(open(f"{work}/samples.csv")))
before = [r for r in rows if r["phase"] == "before"][0]
load = [r for r in rows if r["phase"] == "load"]
after = [r for r in rows if r["phase"] == "after"]
last = after[-1]
recs = json.load(open(f"{work}/soak.json"))["records"]
outcomes = {}
for r in recs:
    outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
clients = open(f"{work}/clients.txt").read().strip()
resumes, unresumed, gw_outcomes = {}, {}, {}
for line in open(f"{work}/end.metrics"):
    for name, into, key in [("slogate_stream_resumes_total{", resumes, "reason"), ("slogate_stream_unresumed_total{", unresumed, "why"), ("slogate_requests_total{", gw_outcomes, "outcome")]:
        if line.startswith(name):
            label = line.split(f'{key}="', 1)[1].split('"', 1)[0]
            into[label] = into.get(label, 0) + int(float(line.rsplit(" ", 1)[1]))
early = load[: max(1, len(load) // 6)]
rss_early = max(int(r["rss_kb"]) for r in early) / 1024

def peak(k):
    return max(int(r[k]) for r in load)

print("# Soak\n")
print(f"{machine}. Generated by `loadtest/bench/soak.sh {duration}`.\n")
print(f"{duration} s of traffic through slogate to two simulated replicas that each cut 2 % of their streams, end 2 % with")
print("an error event, answer 2 % with HTTP errors, and stall for 4 s every minute in turn (past the 2 s idle timeout):")
print("chat at 20 req/s (Poisson, 16-256 output tokens) from loadgen, and misbehaving clients that hang up midway,")
print("stop reading (past the 5 s send timeout) or send half a request head (past the 3 s header timeout).")
print("Sampled every 5 s; \"after\" is 65 s after the traffic stopped (idle connections to the replica are kept 60 s")
print("for reuse).\n")
print("![what slogate holds over time](soak.svg)\n")
print("| | before | peak under load | after | back to its level before |")
print("|---|---:|---:|---:|---|")
checks = []
for k, name in [("inflight", "slots in flight"), ("queued", "queued requests"), ("connections", "client connections"), ("fds", "open file descriptors")]:
    ok = int(last[k]) <= int(before[k])
    checks.append(ok)
    print(f"| {name} | {before[k]} | {peak(k)} | {last[k]} | {'yes' if ok else 'NO'} |")
rss_b, rss_l, rss_a = int(before["rss_kb"]) / 1024, max(int(r["rss_kb"]) for r in load) / 1024, int(last["rss_kb"]) / 1024
rss_ok = rss_a <= rss_early * 1.25
checks.append(rss_ok)
print(f"| RSS MB | {rss_b:.1f} | {rss_l:.1f} | {rss_a:.1f} | {'yes' if rss_ok else 'NO'} (allocator pools stay: compared with the first sixth of the run, {rss_early:.1f} MB, +25 % allowed) |")
fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"
print(f"\nloadgen's requests by outcome: {fmt(outcomes)}.")
print(f"slogate's count of all requests (the misbehaving clients' too) by outcome: {fmt(gw_outcomes)}.")
print(f"Streams continued on the other replica after they broke, by how: {fmt(resumes)}; broken and not continued, by why: {fmt(unresumed)}.")
print(f"Misbehaving clients: {clients}.\n")
print(f"Result: {'everything slogate held came back' if all(checks) else 'NOT everything came back (see NO above)'}.")
PY
publish "$WORK/out" "$HERE/results/soak"
cat "$HERE/results/soak/README.md"
