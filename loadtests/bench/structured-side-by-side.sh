#!/usr/bin/env bash
# Structured outputs and tool calls on the bundled engine and on llama-server, one server at a
# time, the same requests (issue 21, item 6). Results: docs/capacity.md.
#
#   loadtests/bench/structured-side-by-side.sh OUT_DIR [TARGETS]
#
# TARGETS (default "engine llama llama-tools"):
#   engine       `sluice-engine serve --ranks 3`, straight (no gateway).
#   llama        llama-server `--jinja -t 2 -np 4 -c 8192` with the GGUF's own chat template.
#   llama-tools  the same with `--chat-template-file` Qwen2.5-7B-Instruct's template (ChatML
#                with Hermes-style <tool_call> blocks, a format llama.cpp constrains): SmolLM2's
#                own template renders no tools, so llama-server drops them. Tool runs only.
# Each target runs `sluice-load run` at concurrency 4 with REQUESTS (20) requests of: json
# (response_format json_schema, ten schemas in turn, parsed and validated), json --unconstrained
# (the same prompts without response_format), tools (tool_choice required after a 256-token
# document, arguments validated), tools --unconstrained (the same text without tools). One JSON
# line per run in OUT_DIR/<target>.json; servers' logs in OUT_DIR/<target>.log.
#
# Environment: CARGO_TARGET_DIR (default target), PEER (llama.cpp bin dir), SEED (21), REQUESTS.
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${1:?usage: $0 OUT_DIR [TARGETS]}
TARGETS=${2:-engine llama llama-tools}
mkdir -p "$OUT"
BIN=${CARGO_TARGET_DIR:-target}/release
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
PEER=${PEER:-/tmp/peer/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
TEMPLATE=$PEER/../../models/templates/Qwen-Qwen2.5-7B-Instruct.jinja
SEED=${SEED:-21}
REQUESTS=${REQUESTS:-20}
BASE_PORT=18411

source loadtests/bench/lib.sh
PID=
stop() { # the server of the last target
    kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
}

load() { # TARGET WORKLOAD [extra sluice-load args]
    local target=$1 workload=$2
    shift 2
    echo "$(date -u +%H:%M:%S) $target $workload $* (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    "$BIN/sluice-load" run --url "http://127.0.0.1:$PORT" --workload "$workload" \
        --concurrency 4 --requests "$REQUESTS" --seed "$SEED" --timeout 120s --json "$@" \
        >>"$OUT/$target.json"
}

for target in $TARGETS; do
    # A port per target: the last server's may not be free yet.
    PORT=$((BASE_PORT++))
    case $target in
    engine) cmd=("$BIN/sluice-engine" serve --ranks 3 --model "$MODEL") ;;
    llama) cmd=(env "LD_LIBRARY_PATH=$PEER" "$PEER/llama-server" -m "$MODEL" --jinja -t 2
        -np 4 -c 8192) ;;
    llama-tools) cmd=(env "LD_LIBRARY_PATH=$PEER" "$PEER/llama-server" -m "$MODEL" --jinja
        -t 2 -np 4 -c 8192 --chat-template-file "$TEMPLATE") ;;
    *) echo "unknown target $target" >&2; exit 1 ;;
    esac
    # Started straight (no subshell), so that `stop` stops the server itself.
    if [[ $target == engine ]]; then
        exec_args=(--listen "127.0.0.1:$PORT")
    else
        exec_args=(--host 127.0.0.1 --port "$PORT")
    fi
    "${cmd[@]}" "${exec_args[@]}" >"$OUT/$target.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    wait_up "http://127.0.0.1:$PORT/health"
    if [[ $target != llama-tools ]]; then
        load "$target" json
        load "$target" json --unconstrained
    fi
    load "$target" tools --shape 256
    load "$target" tools --shape 256 --unconstrained
    stop
done
