#!/usr/bin/env bash
# Driver of loadtest/scenarios/ab.yaml: what a change costs on the request
# path. One run into $RUN: OLD, OLD2 (built at the file's `rev`, once for
# all runs) and NEW (this build) in front of one simulated replica, a test
# run (OLD and NEW in turn) and a control run (OLD and OLD2).
#
#   loadtest/run ab [--set rev=BASE]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
OLD_REV=$(git -C "$ROOT" rev-parse --short "$(bench_var rev)")
slogate_at "$OLD_REV"   # sets OLD_BIN

start_sim flat --step-base-ms 20 $SIM_EVEN --stamp-events
bench_config old "$RUN/old.yaml"
bench_config new "$RUN/new.yaml"
GW_BIN=$OLD_BIN start_gateway "$RUN/old.yaml" old; OLD_PID=$GW_PID; OLD_URL=$GW_URL
GW_BIN=$OLD_BIN start_gateway "$RUN/old.yaml" old2; OLD2_PID=$GW_PID; OLD2_URL=$GW_URL
start_gateway "$RUN/new.yaml" new; NEW_PID=$GW_PID; NEW_URL=$GW_URL

source "$HERE/pair.sh"
pair_run "$OLD_PID" "$NEW_PID" "$OLD_URL" "$NEW_URL" "$OLD2_PID" "$OLD2_URL"
pair_report "OLD ($OLD_REV)" "NEW" "OLD2"
