#!/usr/bin/env bash
# Driver of loadtest/scenarios/retry.yaml: Retry-After in a lasting
# overload, as clients that honour it see it. One run into $RUN: the
# OpenAI SDK clients through old_rev's slogate (a constant Retry-After),
# then through the commit under test, each on fresh replicas. old_rev is
# built once for all runs (target/ab).
#
#   loadtest/run retry
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv)
RATE=$(bench_var rate) SECS=$(bench_var seconds) OLD_REV=$(bench_var old_rev)
slogate_at "$OLD_REV"   # sets OLD_BIN

# variant LABEL BINARY : fresh replicas, the gateway, the SDK clients through it.
variant() {
  sim_up --replicas 2
  bench_config main "$RUN/gw-$1.yaml"
  GW_BIN=$2 start_gateway "$RUN/gw-$1.yaml" "gw-$1"
  "$ROOT/.venv/bin/python" "$HERE/retry_sdk.py" "$GW_URL/v1" "$MODEL" "$RATE" "$SECS" "$RUN/$1.json" "$SEED"
  gw_down; sim_down
}
variant constant "$OLD_BIN"
variant measured "$BIN/slogate"
"$BIN/bench" report retry "$RUN" "$OLD_REV"
