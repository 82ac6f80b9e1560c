#!/usr/bin/env bash
# Driver of loadtest/scenarios/hol-uploads.yaml: large request bodies from
# h2load, then from loadgen (about 4 MB of JSON with `model` last; multipart
# uploads with `model` last) to nginx, straight or through the gateway,
# beside 200 open streams on a simulated replica. One run into $RUN: the
# parts quiet, json-direct, json-gateway, form-direct, form-gateway, and
# the same four with lg- (loadgen), one after the other.
#
#   loadtest/run hol-uploads
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${WORK:?run through loadtest/run}" "${RUN:?}" "${SEED:?}" "${SCENARIO:?}"
source "$HERE/../lib.sh"
ensure_pkg nghttp2-client h2load
JSON_RATE=$(bench_var json_rate) FORM_RATE=$(bench_var form_rate)
SECS=20   # each part: the streams load's duration

# The large bodies (once for all runs) and nginx's fixed answers.
if [ ! -f "$WORK/big.json" ]; then
  # 4,000,000 characters: about 4 MB, under the default max_request_body (4 MiB) with the rest of the body
  { printf '{"messages": [{"role": "user", "content": "'
    yes 'the quick brown fox jumps over the lazy dog' | tr '\n' ' ' | head -c 4000000 || true   # (yes and tr end on SIGPIPE)
    printf '"}], "max_tokens": 1, "stream": false, "model": "bulk-llm"}'
  } >"$WORK/big.json"
  b=slogatebenchboundary
  { printf -- '--%s\r\nContent-Disposition: form-data; name="file"; filename="speech.wav"\r\nContent-Type: audio/wav\r\n\r\n' "$b"
    head -c 25000000 /dev/urandom
    printf -- '\r\n--%s\r\nContent-Disposition: form-data; name="model"\r\n\r\nbulk-whisper\r\n--%s--\r\n' "$b" "$b"
  } >"$WORK/big.form"
  printf '%s' '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bulk-llm","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":1048576,"completion_tokens":1,"total_tokens":1048577}}' >"$WORK/chat.answer"
  printf '%s' '{"text": "ok", "usage": {"type": "duration", "seconds": 781}}' >"$WORK/transcription.answer"
  printf '%s' '{"object": "list", "data": [{"id": "bulk-llm", "object": "model", "owned_by": "vllm"}, {"id": "bulk-whisper", "object": "model", "owned_by": "vllm"}]}' >"$WORK/models.answer"
fi

start_sim a --step-base-ms 20 $SIM_EVEN --stamp-events --model sim-a; A_URL=${SIM_URLS[0]}
start_nginx bulk /v1/chat/completions="$WORK/chat.answer" /v1/audio/transcriptions="$WORK/transcription.answer" \
  /v1/models="$WORK/models.answer"
B_URL=$NGINX_URL
bench_config main "$RUN/gw.yaml" --set a_url="$A_URL" --set b_url="$B_URL"
start_gateway "$RUN/gw.yaml"
bench_load streams "$RUN/streams.yaml"
bench_load bulk_json "$RUN/bulk-json.yaml"
bench_load bulk_form "$RUN/bulk-form.yaml"

# bulk PART URL: h2load (parts json-*, form-*) or loadgen (lg-json-*,
# lg-form-*) sends the part's large requests to URL for the part's 20 s.
bulk() {
  local part=$1 url=$2 rate n file path ctype
  case $part in
    lg-*)
      local kind=${part#lg-}; kind=${kind%%-*}
      run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/bulk-$kind.yaml" --target "$url" --label "$part bulk" --no-progress \
        --out "$RUN/$part.bulk.json" >/dev/null 2>&1 || true
      return ;;
    json-*) rate=$JSON_RATE file=$WORK/big.json path=/v1/chat/completions ctype=application/json ;;
    form-*) rate=$FORM_RATE file=$WORK/big.form path=/v1/audio/transcriptions ctype="multipart/form-data; boundary=slogatebenchboundary" ;;
  esac
  n=$(calc "int($rate * $SECS)")
  # One client per request a second, each sending one a second: they
  # overlap as independent uploads do, none waits for another.
  local clients; clients=$(calc "int($rate)"); [ "$clients" -ge 1 ] || clients=1
  h2load --h1 -c "$clients" --rps 1 -n "$n" -d "$file" -H "content-type: $ctype" "$url$path" >"$RUN/$part.h2load" 2>&1 || true
}

for part in quiet json-direct json-gateway form-direct form-gateway lg-json-direct lg-json-gateway lg-form-direct lg-form-gateway; do
  t0=$(cpu_ticks "$GW_PID"); bulk_pid=""
  case $part in
    *-direct) bulk "$part" "$B_URL" & bulk_pid=$! ;;
    *-gateway) bulk "$part" "$GW_URL" & bulk_pid=$! ;;
  esac
  run_on "${LG_CPUS:-}" "$BIN/loadgen" run "$RUN/streams.yaml" --target "$GW_URL" --label "$part" --no-progress \
    --out "$RUN/$part.json" --report "$RUN/$part.md"
  [ -n "$bulk_pid" ] && wait "$bulk_pid"
  echo "$(( $(cpu_ticks "$GW_PID") - t0 ))" >"$RUN/$part.cpu"
done
"$BIN/bench" report uploads "$RUN" "$(getconf CLK_TCK)" "$JSON_RATE" "$FORM_RATE"
