#!/usr/bin/env bash
# Structured outputs and tool calls on the bundled engine and on llama-server, one server at a
# time, the same requests (issue 21, item 6). Results: docs/capacity.md.
#
#   loadtests/bench/structured-side-by-side.sh OUT_DIR [TARGETS]
#
# Run it inside `flock /tmp/sluice-bench.lock` so that every target runs in the same minutes.
# With ROUNDS=2 the targets run twice, the second round in reverse order (A B C C B A), so that
# neither server always gets the quieter minutes.
#
# TARGETS (default "engine llama llama-tools"):
#   engine       `sluice-engine serve --ranks 3`, straight (no gateway).
#   llama        llama-server `--jinja -t 2 -np 4 -c 8192` with the GGUF's own chat template.
#   llama-tools  the same with `--chat-template-file loadtests/bench/qwen2.5-tools.jinja`
#                (Qwen2.5-7B-Instruct's template, ChatML with Hermes-style <tool_call> blocks, a
#                format llama.cpp constrains; where it comes from is in its first lines):
#                SmolLM2's own template renders no tools, so llama-server drops them. Tool runs
#                only.
# Each target runs `sluice-load run` at concurrency 4 with REQUESTS (20) requests of: json
# (response_format json_schema, ten schemas in turn, parsed and validated), json --unconstrained
# (the same prompts without response_format), tools (tool_choice required after a 256-token
# document, arguments validated), tools --unconstrained (the same text without tools). One JSON
# line per run in OUT_DIR/r<round>-<target>.json; servers' logs in OUT_DIR/r<round>-<target>.log;
# at the end a table of every run (OUT_DIR/table.md).
#
# Environment: CARGO_TARGET_DIR (default target), PEER (llama.cpp bin dir), SEED (21), REQUESTS,
# ROUNDS (1).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${1:?usage: $0 OUT_DIR [TARGETS]}
TARGETS=${2:-engine llama llama-tools}
mkdir -p "$OUT"
PEER=${PEER:-/tmp/peer/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
TEMPLATE=loadtests/bench/qwen2.5-tools.jinja
SEED=${SEED:-21}
REQUESTS=${REQUESTS:-20}
ROUNDS=${ROUNDS:-1}
BASE_PORT=18411

source loadtests/bench/lib.sh
PID=
stop() { # the server of the last target
    kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
}

load() { # RUN WORKLOAD [extra sluice-load args]
    local run=$1 workload=$2
    shift 2
    echo "$(date -u +%H:%M:%S) $run $workload $* (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    "$BIN/sluice-load" run --url "http://127.0.0.1:$PORT" --workload "$workload" \
        --concurrency 4 --requests "$REQUESTS" --seed "$SEED" --timeout 120s --json "$@" \
        | jq -c --arg run "$run" --arg at "$(date -u +%H:%M)" \
            --arg load "$(cut -d' ' -f1 /proc/loadavg)" '. + {run: $run, at: $at, load: $load}' \
            >>"$OUT/$run.json"
}

order=()
for round in $(seq "$ROUNDS"); do
    round_targets=($TARGETS)
    if ((round % 2 == 0)); then
        for ((i = ${#round_targets[@]} - 1; i >= 0; i--)); do order+=("r$round-${round_targets[i]}"); done
    else
        for t in "${round_targets[@]}"; do order+=("r$round-$t"); done
    fi
done

for run in "${order[@]}"; do
    target=${run#r*-}
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
    "${cmd[@]}" "${exec_args[@]}" >"$OUT/$run.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    wait_up "http://127.0.0.1:$PORT/health"
    if [[ $target != llama-tools ]]; then
        load "$run" json
        load "$run" json --unconstrained
    fi
    load "$run" tools --shape 256
    load "$run" tools --shape 256 --unconstrained
    stop
done

# One row per run: decode tok/s = 1 / the median per-request (E2E - TTFT) / (tokens - 1), n/a
# where the answer came in one chunk (the engine sends a tool call once it is complete).
for run in "${order[@]}"; do cat "$OUT/$run.json"; done | jq -rs '
  def median: sort | if length == 0 then null
    else (if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end) end;
  def r(n): if . == null then "n/a" else (. * n | round) / n | tostring end;
  "| run | row | at (load) | ok | valid | out tok/s | TTFT p50 / p95 s | decode tok/s | E2E p50 s | tokens/answer | prompt tokens |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  (.[] | . as $x
   | ([.samples[] | select(.completion_tokens > 1 and .ttft_s != null)
        | (.e2e_s - .ttft_s) / (.completion_tokens - 1)] | median) as $tpot
   | "| \(.run) | \(.scenario) | \(.at) (\(.load)) | \(.success)/\(.requests) | \(if .score.checked > 0 then "\(.score.passed)/\(.score.checked)" else "-" end) | \(.output_tok_s | r(10)) | \(.ttft.p50 | r(100)) / \(.ttft.p95 | r(100)) | \(if $tpot == null or $tpot < 0.0005 then "n/a" else (1 / $tpot | r(10)) end) | \(.e2e.p50 | r(100)) | \((.completion_tokens / .success) | round) | \(.prompt_tokens_mean | round) |")
' | tee "$OUT/table.md"
