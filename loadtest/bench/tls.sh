#!/usr/bin/env bash
# Driver of loadtest/scenarios/tls.yaml: what TLS to the replicas costs the
# gateway per request. One run into $RUN: a plain and an HTTPS replica
# (a throwaway CA made here), P1 and P2 in front of the plain one, T in
# front of the HTTPS one; a test run (P1 and T in turn) and a control run
# (P1 and P2).
#
#   loadtest/run tls
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"

# A throwaway CA and a certificate for the replica (127.0.0.1 is reached by name).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=slogate bench CA" \
  -keyout "$RUN/ca-key.pem" -out "$RUN/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=replica.bench" \
  -keyout "$RUN/replica-key.pem" -out "$RUN/replica.csr" 2>/dev/null
printf 'subjectAltName=DNS:replica.bench\nextendedKeyUsage=serverAuth\n' >"$RUN/ext.cnf"
openssl x509 -req -in "$RUN/replica.csr" -CA "$RUN/ca.pem" -CAkey "$RUN/ca-key.pem" -CAcreateserial -days 1 \
  -extfile "$RUN/ext.cnf" -out "$RUN/replica.pem" 2>/dev/null

start_sim plain --step-base-ms 20 $SIM_EVEN --stamp-events; PLAIN_URL=${SIM_URLS[0]}
start_sim https --step-base-ms 20 $SIM_EVEN --stamp-events --tls-cert "$RUN/replica.pem" --tls-key "$RUN/replica-key.pem"
TLS_URL=${SIM_URLS[0]}

SIM_URLS=("$PLAIN_URL"); bench_config plain "$RUN/p.yaml"
bench_config tls "$RUN/t.yaml" --set ca="$RUN/ca.pem" --set tls_url="$TLS_URL"
start_gateway "$RUN/p.yaml" p1; P1_PID=$GW_PID; P1_URL=$GW_URL
start_gateway "$RUN/p.yaml" p2; P2_PID=$GW_PID; P2_URL=$GW_URL
start_gateway "$RUN/t.yaml" t; T_PID=$GW_PID; T_URL=$GW_URL
curl -sf "${T_URL}/v1/models" >/dev/null || { echo "the TLS gateway does not serve; see $WORK/t.log" >&2; exit 1; }

source "$HERE/pair.sh"
pair_run "$P1_PID" "$T_PID" "$P1_URL" "$T_URL" "$P2_PID" "$P2_URL"
pair_report "P1 plain" "T TLS" "P2 plain"
