#!/usr/bin/env bash
# What a change costs on the request path: the gateway built at REV (default
# HEAD~1) against the working tree's, side by side in one run.
#
#   loadtest/bench/ab.sh [REV]
#   NEW_EXTRA=$'telemetry:\n  access_log: { to: /tmp/access.log }' loadtest/bench/ab.sh [REV]
#
# One simulated replica (every engine step 20 ms, events stamped) and three
# gateways in front of it: OLD and OLD2 (built from REV in a temporary
# worktree) and NEW (the working tree's build). One closed-loop stream of
# 200 concurrent chat streams takes OLD and NEW in turn (the same engine
# steps and the same load on every core for both), then OLD and OLD2 (the
# control: two identical paths). Per gateway: the path's share of TTFT and ITL and its
# CPU per request. Everything runs on 127.0.0.1, bounded in time.
# Writes loadtest/results/ab/README.md (the runs and report: bench/pair.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/lib.sh"
REV=${1:-HEAD~1}
OLD_REV=$(git -C "$ROOT" rev-parse --short "$REV")
trap 'cleanup; git -C "$ROOT" worktree remove --force "$WORK/old" 2>/dev/null || true' EXIT
bench_setup shared
SECS=${SECS:-20}
PAIR_STREAMS=${PAIR_STREAMS:-200}
build_release
MACHINE=$(machine_line)
git -C "$ROOT" worktree add --detach "$WORK/old" "$OLD_REV" >/dev/null 2>&1
(cd "$WORK/old" && CARGO_TARGET_DIR="$ROOT/target/ab" cargo build --release --locked -q --no-default-features --bin slogate)

start_sim flat --step-base-ms 20 $SIM_EVEN --stamp-events
gateway_config "$WORK/gw.yaml" "${SIM_URLS[0]}"
GW_BIN="$ROOT/target/ab/release/slogate" start_gateway "$WORK/gw.yaml" old; OLD_PID=$GW_PID; OLD_URL=$GW_URL
GW_BIN="$ROOT/target/ab/release/slogate" start_gateway "$WORK/gw.yaml" old2; OLD2_PID=$GW_PID; OLD2_URL=$GW_URL
# NEW_EXTRA: YAML appended to NEW's config only (a setting OLD does not know, e.g. an access log).
cp "$WORK/gw.yaml" "$WORK/gw-new.yaml"
if [ -n "${NEW_EXTRA:-}" ]; then echo "$NEW_EXTRA" >>"$WORK/gw-new.yaml"; fi
start_gateway "$WORK/gw-new.yaml" new; NEW_PID=$GW_PID; NEW_URL=$GW_URL

EXTRA_LINE=""
if [ -n "${NEW_EXTRA:-}" ]; then EXTRA_LINE=$'\n'"NEW's config adds: \`$(echo "$NEW_EXTRA" | tr '\n' ' ')\`."; fi
source "$HERE/bench/pair.sh"
pair_run "$OLD_PID" "$NEW_PID" "$OLD_URL" "$NEW_URL" "$OLD2_PID" "$OLD2_URL"
pair_report "The request path at $OLD_REV against the working tree" \
"One simulated replica (20 ms engine steps, stamped events) and three gateways in front of it: OLD and OLD2 built
at $OLD_REV, NEW built from the working tree (the commit in the line above). One closed-loop stream of
$PAIR_STREAMS concurrent chat streams (32-96 output tokens) takes OLD and NEW in turn (the same engine steps and the
same load on both cores for both), then OLD and OLD2 (two identical paths: the noise of the comparison).$EXTRA_LINE" \
  "OLD ($OLD_REV)" "NEW" "OLD2" "$WORK/out"
publish "$WORK/out" "$HERE/results/ab"
cat "$HERE/results/ab/README.md"
