# Shared helpers for loadtest scripts: start simulated replicas and the
# gateway from release binaries on 127.0.0.1 with free ports, stop them all
# on exit. Source it; set WORK to a scratch directory first.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/target/release"
PIDS=()

cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Optional CPU placement (taskset lists): SIM_CPUS, GW_CPUS, LG_CPUS.
spawn_on() { local cpus=$1; shift; if [ -n "$cpus" ]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi; }
run_on() { local cpus=$1; shift; if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi; }

build_release() { (cd "$ROOT" && cargo build --release --locked -q --workspace --bins); }

# start_sim NAME ARGS... : start N replicas (--replicas) and set SIM_URLS (array).
start_sim() {
  local name=$1; shift
  ( spawn_on "${SIM_CPUS:-}" "$BIN/vllm-sim" --listen 127.0.0.1:0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" ) &
  PIDS+=($!)
  local want; want=$(printf '%s\n' "$@" | awk 'p{print;exit} /^--replicas$/{p=1}'); want=${want:-1}
  for _ in $(seq 100); do [ "$(wc -l <"$WORK/$name.out")" -ge "$want" ] && break; sleep 0.05; done
  mapfile -t SIM_URLS < <(python3 -c 'import json,sys; [print(json.loads(l)["url"]) for l in open(sys.argv[1])]' "$WORK/$name.out")
}

# start_gateway CONFIG : start slogate, set GW_URL, ADMIN_URL, GW_PID once ready.
start_gateway() {
  ( spawn_on "${GW_CPUS:-}" "$BIN/slogate" --log-format json serve --config "$1" 2>"$WORK/gateway.log" ) &
  GW_PID=$!; PIDS+=($GW_PID)
  for _ in $(seq 200); do grep -q '"slogate listening"' "$WORK/gateway.log" 2>/dev/null && break; sleep 0.05; done
  read -r GW_URL ADMIN_URL < <(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    f = json.loads(l).get("fields", {})
    if f.get("message") == "slogate listening":
        print(f["data"], f["admin"]); break' "$WORK/gateway.log")
  for _ in $(seq 200); do curl -sf "$ADMIN_URL/readyz" >/dev/null && break; sleep 0.05; done
}

# gateway_config FILE URL... : a config with one pool over the given replicas.
gateway_config() {
  local file=$1; shift
  { echo "server: { listen: 127.0.0.1:0, admin_listen: 127.0.0.1:0, shutdown_grace: 5s }"
    echo "pools:"
    echo "  - name: default"
    echo "    models: [auto]"
    echo "    max_inflight_per_replica: ${MAX_INFLIGHT:-4096}"
    echo "    replicas:"
    for u in "$@"; do echo "      - $u"; done
    if [ -n "${GATEWAY_EXTRA:-}" ]; then echo "$GATEWAY_EXTRA"; fi
  } >"$file"
}

rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }

machine_line() { echo "$(nproc) cores, $(free -g | awk '/^Mem/{print $2}') GiB, $(uname -r), $(rustc --version)"; }
