#!/usr/bin/env bash
# Driver of loadtest/scenarios/hol.yaml: do large request bodies, read,
# parsed and rewritten while small streams are open, add to those streams'
# ITL? One run into $RUN: the parts quiet, direct and gateway, one after the
# other, through one gateway on fresh replicas.
#
#   loadtest/run hol
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"

start_sim a --step-base-ms 20 $SIM_EVEN --stamp-events --model sim-a; A_URL=${SIM_URLS[0]}
# B takes whole 4 MiB prompts (about a million tokens) at no prefill cost.
printf 'max_model_len: 4000000\n' >"$WORK/bulk-sim.yaml"
start_sim bulk --step-base-ms 20 $SIM_EVEN --model sim-bulk --config "$WORK/bulk-sim.yaml"; B_URL=${SIM_URLS[0]}
bench_config main "$WORK/gw.yaml" --set a_url="$A_URL" --set b_url="$B_URL"
start_gateway "$WORK/gw.yaml"
reduced() { curl -sf "$ADMIN_URL/metrics" | awk '/^slogate_context_reduced_requests_total\{class="bulk"\}/{print $2}' | tail -1; }

for part in quiet direct gateway; do
  case $part in
    quiet) bench_load quiet "$RUN/$part.yaml" ;;
    direct) bench_load main "$RUN/$part.yaml" --set bulk_target="$B_URL" ;;
    gateway) bench_load main "$RUN/$part.yaml" --set bulk_target="$GW_URL" ;;
  esac
  r0=$(reduced); r0=${r0:-0}; t0=$(cpu_ticks "$GW_PID")
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/$part.yaml" --target "$GW_URL" --label "$part" --no-progress \
    --out "$RUN/$part.json" --report "$RUN/$part.md"
  t1=$(cpu_ticks "$GW_PID"); r1=$(reduced); r1=${r1:-0}
  echo "$(( t1 - t0 )) $(( r1 - r0 ))" >"$RUN/$part.extra"
done
"$BIN/bench" report hol "$RUN" "$(getconf CLK_TCK)"
