#!/usr/bin/env bash
# Driver of loadtest/scenarios/short.yaml: does an embeddings request wait
# behind streams for a slot, when the streams hold every slot and chat
# queues? One run into $RUN: chat at 1.5 C with embeddings through the
# gateway, then the same with the embeddings straight to a replica (the
# control), each on fresh replicas and a fresh gateway.
#
#   loadtest/run short
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
measure_capacity "$WORK"
for where in gateway direct; do
  sim_up --replicas 2
  bench_config main "$WORK/gw.yaml"
  start_gateway "$WORK/gw.yaml" "gw-$where"
  emb_target=$GW_URL
  [ "$where" = direct ] && emb_target=${SIM_URLS[0]}
  bench_load main "$RUN/$where.yaml" --set chat_rate="$(calc "1.5*$C")" --set emb_target="$emb_target"
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/$where.yaml" --target "$GW_URL" --label "$where" --no-progress \
    --out "$RUN/$where.json" --report "$RUN/$where.md"
  gw_down; sim_down
done
"$BIN/bench" report short "$RUN" "$C"
