# Replicas with hard slots, served first come first served, from an engine
# the project did not write: llama.cpp's own server (`llama-server`, built
# once from the llama.cpp sources that the llama-cpp-python package on PyPI
# ships, into target/llama.cpp/), on CPU, with a random-weight llama model
# written by scripts/engine_check/tiny_gguf.py.
#
# Each replica has LLAMA_SLOTS slots (`--parallel`, default 8) and one CPU
# thread; a request beyond its slots waits in llama-server's own queue
# (`llamacpp:requests_deferred` on its /metrics). All replicas run on
# SIM_CPUS (default: the machine's last core), so the gateways and load
# generators on the other cores do not take the engines' compute.
#
# Source after lib.sh; llama_build, then llama_up N / llama_down.
LLAMA_CPP_PYTHON=0.3.36
LLAMA_DIR="$ROOT/target/llama.cpp"
LLAMA_SERVER="$LLAMA_DIR/$LLAMA_CPP_PYTHON/llama-server"
LLAMA_VENV="$ROOT/.venv-engines"
LLAMA_SLOTS=${LLAMA_SLOTS:-8}
MODEL=llama-tiny   # the name the replicas serve (--alias)
# 256 wide, 4 blocks: about 2 ms a decode step alone and 3 ms with four
# sequences in the batch on one core of this kind of machine.
LLAMA_MODEL_ARGS=(--width 256 --layers 4 --ctx 8192)

# llama_build: llama-server and a Python with gguf and numpy (minutes, once).
llama_build() {
  if [ ! -x "$LLAMA_VENV/bin/python" ]; then python3 -m venv "$LLAMA_VENV"; fi
  if ! "$LLAMA_VENV/bin/python" -c "import gguf, numpy, cmake, ninja" 2>/dev/null; then
    "$LLAMA_VENV/bin/pip" install -q gguf numpy cmake ninja
  fi
  [ -x "$LLAMA_SERVER" ] && return 0
  echo "llama.sh: building llama-server from llama-cpp-python $LLAMA_CPP_PYTHON's llama.cpp (about 10 minutes on 2 cores)" >&2
  local src="$LLAMA_DIR/src"
  rm -rf "$src"; mkdir -p "$src"
  "$LLAMA_VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$src"
  tar xzf "$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$src"
  local ll="$src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
  ( export PATH="$LLAMA_VENV/bin:$PATH"
    cmake -S "$ll" -B "$ll/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >"$LLAMA_DIR/build.log" 2>&1
    ninja -C "$ll/build" -j "$(nproc)" llama-server >>"$LLAMA_DIR/build.log" 2>&1
  ) || { tail -30 "$LLAMA_DIR/build.log" >&2; echo "llama.sh: llama-server did not build" >&2; return 1; }
  mkdir -p "$(dirname "$LLAMA_SERVER")"
  cp "$ll/build/bin/llama-server" "$LLAMA_SERVER"
  rm -rf "$src"
}

# llama_up N : N llama-server replicas (LLAMA_SLOTS slots each) serving MODEL;
# sets SIM_URLS, TARGETS, LLAMA_PIDS.
llama_up() {
  local n=$1 i port model="$LLAMA_DIR/model-$(IFS=_; echo "${LLAMA_MODEL_ARGS[*]}" | tr -d -).gguf"
  [ -f "$model" ] || "$LLAMA_VENV/bin/python" "$ROOT/scripts/engine_check/tiny_gguf.py" "$model" "${LLAMA_MODEL_ARGS[@]}"
  SIM_URLS=(); LLAMA_PIDS=()
  for ((i = 0; i < n; i++)); do
    port=$(free_port)
    # The context is split over the slots: 1024 tokens each (prompt and output).
    # At most 32 tokens a step (-b, -ub): prompts are prefilled in chunks
    # between decode steps, as vLLM's chunked prefill does, so a new
    # request's prefill does not stall the running streams' next tokens.
    ( spawn_on "${SIM_CPUS:-$(($(nproc) - 1))}" "$LLAMA_SERVER" -m "$model" -a "$MODEL" --host 127.0.0.1 --port "$port" \
        -np "$LLAMA_SLOTS" -c $((1024 * LLAMA_SLOTS)) -b 32 -ub 32 -t 1 -tb 1 --metrics --no-webui >"$WORK/llama-$port.log" 2>&1 ) &
    PIDS+=($!); LLAMA_PIDS+=($!); SIM_URLS+=("http://127.0.0.1:$port")
  done
  for u in "${SIM_URLS[@]}"; do
    for _ in $(seq 300); do curl -sf "$u/health" >/dev/null && break; sleep 0.1; done
    curl -sf "$u/health" >/dev/null || { tail -20 "$WORK"/llama-*.log >&2; echo "llama.sh: llama-server at $u did not start" >&2; return 1; }
  done
  TARGETS=$(IFS=,; echo "${SIM_URLS[*]}")
}
llama_down() {
  local p
  for p in "${LLAMA_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${LLAMA_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
