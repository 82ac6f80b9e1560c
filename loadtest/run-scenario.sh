#!/usr/bin/env bash
# Run a scenario end to end: simulated replicas, the gateway in front, the
# same load straight to a replica and through the gateway, then the reports.
#
#   loadtest/run-scenario.sh NAME SCENARIO.yaml [vllm-sim args...]
#
# Writes loadtest/results/NAME/{direct,gateway}.{json,md} and compare.md.
# With several replicas (--replicas N) the direct run cannot spread load the
# way a gateway does, so it is skipped.
set -euo pipefail
name=$1; scenario=$2; shift 2
out="$(cd "$(dirname "$0")" && pwd)/results/$name"
mkdir -p "$out"
WORK=$(mktemp -d); export WORK
source "$(dirname "$0")/lib.sh"
build_release
start_sim sim "$@"
gateway_config "$WORK/gw.yaml" "${SIM_URLS[@]}"
start_gateway "$WORK/gw.yaml"
if [ "${#SIM_URLS[@]}" -eq 1 ]; then
  "$BIN/loadgen" run "$scenario" --target "${SIM_URLS[0]}" --label direct --out "$out/direct.json" --report "$out/direct.md"
fi
"$BIN/loadgen" run "$scenario" --target "$GW_URL" --label gateway --out "$out/gateway.json" --report "$out/gateway.md"
[ -f "$out/direct.json" ] && "$BIN/loadgen" compare "$out/direct.json" "$out/gateway.json" >"$out/compare.md"
cat "$out"/*.md
