#!/usr/bin/env bash
# What TLS to the replicas costs slogate per request, side by side in one run.
#
# Two simulated replicas with the same deterministic engine (every step
# 20 ms, events stamped), one plain and one behind TLS (a throwaway CA made
# here), and three gateways: P1 and P2 in front of the plain replica, T in
# front of the HTTPS one (`pools[].tls.ca`). One closed-loop stream of 64
# concurrent requests takes its targets in turn:
#   - run "test":    P1, T  (plain vs TLS upstream, same moments, same load)
#   - run "control": P1, P2 (both plain: the noise floor of the comparison)
# For each target: the path's share of TTFT (client TTFT minus the engine's,
# from the stamps), the path's share of ITL p99, and the gateway's CPU per
# request (its process's CPU time over the run, divided by its requests).
# Connections to replicas are kept alive, so TLS here costs record
# encryption and decryption; the handshake is paid per new connection.
# Everything runs on 127.0.0.1, bounded in time.
# Writes loadtest/results/tls/README.md (the runs and report: bench/pair.sh).
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

source "$HERE/bench/pair.sh"
pair_run "$P1_PID" "$T_PID" "$P1_URL" "$T_URL" "$P2_PID" "$P2_URL"
pair_report "TLS to the replicas: what it costs per request" \
"Two simulated replicas with the same deterministic engine (20 ms steps, stamped events), one plain and one
behind TLS (ECDSA P-256 certificate from a throwaway CA, TLS 1.3), and three gateways: P1 and P2 in front of
the plain replica, T in front of the HTTPS one (\`pools[].tls.ca\`). One closed-loop stream of 64 concurrent chat
streams takes its two targets in turn: P1 and T (plain vs TLS upstream, at the same moments under the same load),
then P1 and P2 (both plain). Connections to the replica are kept alive, so TLS costs record encryption and
decryption here; a new connection adds one handshake (resumed after the first, from the pool's session cache)." \
  "P1 plain" "T TLS" "P2 plain" "$WORK/out"
publish "$WORK/out" "$HERE/results/tls"
cat "$HERE/results/tls/README.md"
