# Paired runs, sourced by the drivers that compare two gateways side by side
# (loadtest/bench/tls.sh, loadtest/bench/ab.sh). Needs lib.sh sourced and a
# scenario run (RUN, SCENARIO); the load is the scenario's `pair` load.
#
# pair_run PID_A PID_B URL_A URL_B PID_A2 URL_A2: a "test" run (the load
# takes A and B in turn) and a "control" run (A and A2, two identical
# paths: the noise of the comparison). Each gateway's CPU over a run is read
# from /proc.
pair_one() { # name pidA pidB targets
  local name=$1 a=$2 b=$3 ta tb
  bench_load pair "$RUN/$name.yaml"
  ta=$(cpu_ticks "$a"); tb=$(cpu_ticks "$b")
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/$name.yaml" --target "$4" --label "$name" --no-progress \
    --out "$RUN/$name.json" --report "$RUN/$name.md"
  echo "$(( $(cpu_ticks "$a") - ta )) $(( $(cpu_ticks "$b") - tb ))" >"$RUN/$name.cpu"
}
pair_run() {
  pair_one test "$1" "$2" "$3,$4"
  pair_one control "$1" "$5" "$3,$6"
}
# pair_report NAME_A NAME_B NAME_A2: $RUN/report.md and measured.json.
pair_report() { "$BIN/bench" report pair "$RUN" "$(getconf CLK_TCK)" "$1" "$2" "$3"; }
