#!/usr/bin/env bash
# Retry-After in a lasting overload, as clients that honour it see it:
# OpenAI SDK clients (retry_sdk.py: AsyncOpenAI, max_retries 3, streaming
# chat, not streamed) arriving at RATE a second (about 2x this fleet's capacity) for
# SECONDS, through OLD_REV's slogate (every refusal said a constant: 1 s for
# an interactive queue, the breaker's 5 s) and through the working tree's
# (when capacity is likely back, bounded 1-30 s and spread). Same fleet and
# load for both, each on fresh replicas, slogate's defaults otherwise, and
# shed_late on for both (the default now; OLD_REV's default was off). The
# result (README.md and retries.svg, stamped) replaces loadtest/results/retry/.
#
#   loadtest/bench/retry.sh [OLD_REV]   (default 69232b0)
#
# Everything runs on 127.0.0.1 with free ports, bounded in time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d); export WORK
source "$HERE/../lib.sh"
OLD_REV=${1:-69232b0}
RATE=${RATE:-36} SECONDS_RUN=${SECONDS_RUN:-90}
trap 'cleanup; git -C "$ROOT" worktree remove --force "$WORK/old" 2>/dev/null || true' EXIT
build_release
bash "$ROOT/scripts/setup-test-deps" >&2   # the OpenAI SDK (.venv)
MACHINE=$(machine_line)
git -C "$ROOT" worktree add --detach "$WORK/old" "$OLD_REV" >/dev/null 2>&1
(cd "$WORK/old" && CARGO_TARGET_DIR="$ROOT/target/ab" cargo build --release --locked -q --no-default-features --bin slogate)

# variant LABEL BINARY : fresh replicas, a gateway with the defaults, the SDK clients through it.
variant() {
  sim_up --replicas 2
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    replicas: [$(IFS=,; echo "${SIM_URLS[*]}" | sed 's/,/, /g')]"
    # Both with today's default (OLD_REV's was off): only Retry-After differs.
    echo "tiers: { interactive: { shed_late: true } }"
  } >"$WORK/gw-$1.yaml"
  GW_BIN=$2 start_gateway "$WORK/gw-$1.yaml" "gw-$1"
  "$ROOT/.venv/bin/python" "$HERE/retry_sdk.py" "$GW_URL/v1" "$MODEL" "$RATE" "$SECONDS_RUN" "$WORK/$1.json"
  gw_down; sim_down
}
variant constant "$ROOT/target/ab/release/slogate"
variant measured "$BIN/slogate"
python3 "$HERE/retry_report.py" "$WORK" "$OLD_REV" "$MACHINE"
publish "$WORK" "$ROOT/loadtest/results/retry"
