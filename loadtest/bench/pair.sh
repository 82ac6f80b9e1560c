# Paired runs, sourced by benchmarks that compare two gateways side by side
# (loadtest/bench/tls.sh, loadtest/bench/ab.sh). Needs lib.sh sourced, WORK set.
#
# pair_run PID_A PID_B URL_A URL_B PID_A2 URL_A2: ROUNDS rounds of a "test" run
# (one closed-loop stream of $PAIR_STREAMS, default 64, chat streams of 32-96
# tokens taking A and B in turn for $SECS seconds) and a "control" run (A and
# A2, two identical paths). Each run's gateway CPU is read from /proc.
pair_scenario() { # file targets
  cat >"$1" <<EOS
target: $2
duration: ${SECS}s
warmup: 3s
request_timeout: 60s
streams:
  - name: s
    class: chat
    model: sim-llama-8b
    arrival: { kind: closed, concurrency: ${PAIR_STREAMS:-64} }
    prompt_tokens: { dist: fixed, value: 32 }
    output_tokens: { dist: uniform, min: 32, max: 96 }
EOS
}
pair_one() { # name pidA pidB targets
  local name=$1 a=$2 b=$3 ta tb
  pair_scenario "$WORK/$name.yaml" "$4"
  ta=$(cpu_ticks "$a"); tb=$(cpu_ticks "$b")
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$WORK/$name.yaml" --label "$name" --no-progress --out "$WORK/$name.json" --report "$WORK/$name.md"
  echo "$(( $(cpu_ticks "$a") - ta )) $(( $(cpu_ticks "$b") - tb ))" >"$WORK/$name.cpu"
}
pair_run() {
  local round
  for round in $(seq "$ROUNDS"); do
    pair_one "test-$round" "$1" "$2" "$3,$4"
    pair_one "control-$round" "$1" "$5" "$3,$6"
  done
}
# pair_report TITLE INTRO_TEXT NAME_A NAME_B NAME_A2 OUT_DIR
pair_report() {
  mkdir -p "$6"
  printf '%s\n' "$2" >"$WORK/intro.txt"
  python3 "$HERE/bench/pair_report.py" "$WORK" "$MACHINE" "$(getconf CLK_TCK)" "$ROUNDS" "$SECS" "$1" "$WORK/intro.txt" "$3" "$4" "$5" >"$6/README.md"
}
