#!/usr/bin/env bash
# The engine's long-prompt chunks (`--chunk-context-tokens`): what they cost a long prompt alone,
# and what they save a short prompt that arrives while one is prefilling, straight to
# `sluice-engine serve --ranks 3 --prefill-order shortest` (no gateway).
#
#   KS="0 1024" DUR=60s loadtests/bench/long-chunks.sh [OUT_DIR]
#   python3 loadtests/bench/long-chunks-report.py OUT_DIR
#
# For each K in KS (0: every chunk --max-batch-tokens), ROUNDS times, alternating: a fresh
# engine; `alone`: 4096:1 and 8192:1 prompts, REPS each, one at a time (TTFT); then `beside`:
# 4096:1 prompts back to back (closed loop, one at a time) for DUR while 256:16 prompts arrive
# (Poisson, RATE req/s, the same arrivals every run): the short prompts' TTFT is the wait for
# the long chunk in flight plus their own prefill. One JSON per run and K.
set -euo pipefail
cd "$(dirname "$0")/../.."
source loadtests/bench/lib.sh
OUT=${1:-${OUT:-loadtests/results/long-chunks}}
KS=${KS:-0 1024}
DUR=${DUR:-60s}
RATE=${RATE:-0.5}
ROUNDS=${ROUNDS:-2}
SEED=${SEED:-20261207}
PORT=18631
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"

for round in $(seq 1 "$ROUNDS"); do
  for k in $KS; do
    echo "== round $round, K $k ($(date -u +%T))" >&2
    "$BIN/sluice-engine" serve --ranks 3 --listen 127.0.0.1:$PORT --model "$MODEL" \
      --prefill-order shortest --chunk-context-tokens "$k" >"$OUT/engine-$k-$round.log" 2>&1 &
    engine=$!
    PIDS+=($engine)
    wait_up $URL/health
    for n in 4096 8192; do
      "$BIN/sluice-load" run --url $URL --shape "$n:1" --concurrency 1 --requests "$REPS" \
        --timeout 300s --json >"$OUT/alone-$n-$k-$round.json"
    done
    "$BIN/sluice-load" run --url $URL --shape 4096:1 --concurrency 1 --duration "$DUR" \
      --timeout 300s --json >"$OUT/beside-long-$k-$round.json" &
    long=$!
    sleep 2
    "$BIN/sluice-load" run --url $URL --shape 256:16 --rate "$RATE" --poisson --duration "$DUR" \
      --seed "$SEED" --timeout 300s --json >"$OUT/beside-short-$k-$round.json"
    wait $long
    echo "$k $round $(date -u +%FT%TZ) $(uptime)" >>"$OUT/uptime.txt"
    kill "$engine"; wait "$engine" 2>/dev/null || true
  done
done
