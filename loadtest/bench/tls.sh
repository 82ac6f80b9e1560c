#!/usr/bin/env bash
# What TLS to the replicas costs slogate per request, side by side in one run.
#
# Two simulated replicas with the same deterministic engine (every step
# 20 ms, events stamped), one plain and one behind TLS (a throwaway CA made
# here), and three gateways: P1 and P2 in front of the plain replica, T in
# front of the HTTPS one (`pools[].tls.ca`). One closed-loop stream of 64
# concurrent requests takes its targets in turn:
#   - run "tls":     P1, T  (plain vs TLS upstream, same moments, same load)
#   - run "control": P1, P2 (both plain: the noise floor of the comparison)
# For each target: the path's share of TTFT (client TTFT minus the engine's,
# from the stamps), the path's share of ITL p99, and the gateway's CPU per
# request (its process's CPU time over the run, divided by its requests).
# Connections to replicas are kept alive, so TLS here costs record
# encryption and decryption; the handshake is paid per new connection.
# Everything runs on 127.0.0.1, bounded in time.
# Writes loadtest/results/tls/README.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
trap cleanup EXIT
bench_setup shared
SECS=${SECS:-20}
build_release
MACHINE=$(machine_line)

# A throwaway CA and a certificate for the replica (127.0.0.1 is reached by name).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=slogate bench CA" \
  -keyout "$WORK/ca-key.pem" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=replica.bench" \
  -keyout "$WORK/replica-key.pem" -out "$WORK/replica.csr" 2>/dev/null
printf 'subjectAltName=DNS:replica.bench\nextendedKeyUsage=serverAuth\n' >"$WORK/ext.cnf"
openssl x509 -req -in "$WORK/replica.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca-key.pem" -CAcreateserial -days 1 \
  -extfile "$WORK/ext.cnf" -out "$WORK/replica.pem" 2>/dev/null

start_sim plain --step-base-ms 20 $SIM_EVEN --stamp-events; PLAIN_URL=${SIM_URLS[0]}
start_sim https --step-base-ms 20 $SIM_EVEN --stamp-events --tls-cert "$WORK/replica.pem" --tls-key "$WORK/replica-key.pem"
TLS_URL=${SIM_URLS[0]}

gateway_config "$WORK/p.yaml" "$PLAIN_URL"
GATEWAY_EXTRA="    tls: { ca: $WORK/ca.pem, server_name: replica.bench }" gateway_config "$WORK/t.yaml" "$TLS_URL"
start_gateway "$WORK/p.yaml" p1; P1_PID=$GW_PID; P1_URL=$GW_URL
start_gateway "$WORK/p.yaml" p2; P2_PID=$GW_PID; P2_URL=$GW_URL
start_gateway "$WORK/t.yaml" t; T_PID=$GW_PID; T_URL=$GW_URL
curl -sf "${T_URL}/v1/models" >/dev/null || { echo "the TLS gateway does not serve; see $WORK/t.log" >&2; exit 1; }

scenario() { # file targets
  cat >"$1" <<EOS
target: $2
duration: ${SECS}s
warmup: 3s
request_timeout: 60s
streams:
  - name: s
    class: chat
    model: sim-llama-8b
    arrival: { kind: closed, concurrency: 64 }
    prompt_tokens: { dist: fixed, value: 32 }
    output_tokens: { dist: uniform, min: 32, max: 96 }
EOS
}

cpu_run() { # name pidA pidB targets
  local name=$1 a=$2 b=$3 ta tb
  scenario "$WORK/$name.yaml" "$4"
  ta=$(cpu_ticks "$a"); tb=$(cpu_ticks "$b")
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$WORK/$name.yaml" --label "$name" --no-progress --out "$WORK/$name.json" --report "$WORK/$name.md"
  echo "$(( $(cpu_ticks "$a") - ta )) $(( $(cpu_ticks "$b") - tb ))" >"$WORK/$name.cpu"
}
for round in $(seq "$ROUNDS"); do
  cpu_run "tls-$round" "$P1_PID" "$T_PID" "$P1_URL,$T_URL"
  cpu_run "control-$round" "$P1_PID" "$P2_PID" "$P1_URL,$P2_URL"
done

mkdir -p "$WORK/out"
python3 - "$WORK" "$MACHINE" "$(getconf CLK_TCK)" "$ROUNDS" "$SECS" >"$WORK/out/README.md" <<'PY'
import json, sys
work, machine, hz, rounds, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]

def pct_pairs(pairs, q):
    total = sum(c for _, c in pairs)
    seen = 0
    for v, c in sorted(pairs):
        seen += c
        if seen >= q * total:
            return v
    return float("nan")

def side(run, idx, ticks):
    recs = [r for r in run["records"] if r.get("target") == idx and r["outcome"] in ("ok", "length")]
    errors = sum(1 for r in run["records"] if r.get("target") == idx and r["outcome"] not in ("ok", "length"))
    path = [r["ttft_ms"] - r["engine_ttft_ms"] for r in recs if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None]
    gaps = []
    for pairs in run.get("itl_by_target", {}).get("path_us", {}).get(str(idx), []) and [run["itl_by_target"]["path_us"][str(idx)]] or []:
        gaps = pairs
    n = len(recs)
    return {
        "n": n, "errors": errors,
        "ttft50": pct(path, 0.5), "ttft99": pct(path, 0.99),
        "itl99": pct_pairs(gaps, 0.99) / 1000 if gaps else float("nan"),
        "cpu_us": ticks * 1e6 / hz / n if n else float("nan"),
    }

rows = {"tls": [], "control": []}
for kind in rows:
    for r in range(1, rounds + 1):
        run = json.load(open(f"{work}/{kind}-{r}.json"))
        ta, tb = map(int, open(f"{work}/{kind}-{r}.cpu").read().split())
        rows[kind].append((side(run, 0, ta), side(run, 1, tb)))

print("# TLS to the replicas: what it costs per request\n")
print(f"{machine}. Generated by `loadtest/bench/tls.sh`; every figure below is from that run.\n")
print("Two simulated replicas with the same deterministic engine (20 ms steps, stamped events), one plain and one")
print("behind TLS (ECDSA P-256 certificate from a throwaway CA, TLS 1.3), and three gateways: P1 and P2 in front of")
print("the plain replica, T in front of the HTTPS one. One closed-loop stream of 64 concurrent chat streams (32-96")
print(f"output tokens) takes its two targets in turn for {secs} s: P1 and T (plain vs TLS, at the same moments under")
print("the same load), then P1 and P2 (both plain: how far two identical paths differ here). Path TTFT is the")
print("client's TTFT minus the engine's (the stamps); path ITL p99 is the same for the gaps. CPU per request is the")
print("gateway process's CPU time over the run divided by the requests it completed (clock ticks of 1/%d s).\n" % hz)
print("| run | round | target | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | gateway CPU us/request |")
print("|---|---|---|---|---|---|---|---|---|")
names = {"tls": ("P1 plain", "T TLS"), "control": ("P1 plain", "P2 plain")}
for kind, rs in rows.items():
    for i, (a, b) in enumerate(rs, 1):
        for name, s in zip(names[kind], (a, b)):
            print(f"| {kind} | {i} | {name} | {s['n']} | {s['errors']} | {s['ttft50']:.2f} | {s['ttft99']:.2f} | {s['itl99']:.2f} | {s['cpu_us']:.0f} |")

def mean(xs):
    return sum(xs) / len(xs)

tls_cpu = mean([b["cpu_us"] - a["cpu_us"] for a, b in rows["tls"]])
ctl_cpu = mean([b["cpu_us"] - a["cpu_us"] for a, b in rows["control"]])
tls_t50 = mean([b["ttft50"] - a["ttft50"] for a, b in rows["tls"]])
ctl_t50 = mean([b["ttft50"] - a["ttft50"] for a, b in rows["control"]])
tls_i99 = mean([b["itl99"] - a["itl99"] for a, b in rows["tls"]])
ctl_i99 = mean([b["itl99"] - a["itl99"] for a, b in rows["control"]])
print("\n## Result\n")
print(f"- Gateway CPU per request, TLS minus plain: **{tls_cpu:+.0f} us** (control, plain minus plain: {ctl_cpu:+.0f} us).")
print(f"- Path TTFT p50, TLS minus plain: **{tls_t50:+.3f} ms** (control: {ctl_t50:+.3f} ms).")
print(f"- Path ITL p99, TLS minus plain: **{tls_i99:+.3f} ms** (control: {ctl_i99:+.3f} ms).")
print("\nConnections to the replica are kept alive, so these are the costs of encrypting the request and decrypting")
print("the stream's records. A new connection adds one TLS handshake (a resumed one after the first: the pool's")
print("session cache), paid once per connection, not per request.")
PY
publish "$WORK/out" "$HERE/results/tls"
cat "$HERE/results/tls/README.md"
