#!/usr/bin/env bash
# Issue 23, item 4, on the real engine: two tenants of one class, one sending 4K prompts at 3×
# the rate of the other's 256-token prompts. The short tenant's TTFT p95 beside the long one,
# against its value alone (target: within 1.5×).
#
#   DUR=120s RATE=0.1 DEADLINE=5s ORDER=shortest [ENGINE_ARGS=...] \
#     loadtests/bench/fairness.sh [OUT_DIR]
#   python3 loadtests/bench/fairness-report.py OUT_DIR
#
# One bundled engine (`sluice-engine serve --ranks 3`), the gateway in front of it as an
# `openai` upstream with two interactive tenants (`short`, `long`; the shipped admission
# otherwise, the interactive TTFT deadline DEADLINE; the engine's prefill order ORDER, `shortest`
# as the bundled engine's or `oldest`, given to both the engine and the gateway's
# `upstream.prefill_order`), started afresh for each run. Runs, each
# ROUNDS times, alternating: `alone` (the short tenant only: `256:64` Poisson at RATE req/s)
# and `beside` (the same arrivals, and the long tenant's `4k:64` Poisson at 3 × RATE). The
# long tenant's load asks for more prefill than the engine does, so its queue fills. One JSON
# per tenant and run, the gateway's /metrics after each. RUNS (default "alone beside") picks the
# runs; GATEWAY_BIN and ENGINE_BIN (default the build's) let two builds take turns on the
# same arrivals.
set -euo pipefail
cd "$(dirname "$0")/../.."
source loadtests/bench/lib.sh
OUT=${1:-${OUT:-loadtests/results/fairness}}
DUR=${DUR:-120s}
RATE=${RATE:-0.1}
DEADLINE=${DEADLINE:-5s}
ROUNDS=${ROUNDS:-2}
SEED=${SEED:-20261206}
ORDER=${ORDER:-shortest}
ENGINE_ARGS=${ENGINE_ARGS:-}
RUNS=${RUNS:-alone beside}
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/sluice}
ENGINE_BIN=${ENGINE_BIN:-$BIN/sluice-engine}
EPORT=18621
GPORT=18622
SHORT_KEY=sk-fairness-short
LONG_KEY=sk-fairness-long
mkdir -p "$OUT"
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

# shellcheck disable=SC2086 # ENGINE_ARGS: more `sluice-engine serve` flags, split on spaces
"$ENGINE_BIN" serve --ranks 3 --listen 127.0.0.1:$EPORT --model "$MODEL" --prefill-order "$ORDER" $ENGINE_ARGS \
  >"$OUT/engine.log" 2>&1 &
PIDS+=($!)
wait_up http://127.0.0.1:$EPORT/health

cat >"$OUT/policy.toml" <<TOML
[server]
listen = "127.0.0.1:$GPORT"

[admission]
interactive_ttft_deadline = "$DEADLINE"

[upstream]
kind = "openai"
urls = ["http://127.0.0.1:$EPORT"]
tokenizer = "$MODEL"
prefill_order = "$ORDER"

[[tenants]]
name = "short"
api_key_sha256 = "$(sha $SHORT_KEY)"
class = "interactive"
requests_per_second = 100.0
burst = 100

[[tenants]]
name = "long"
api_key_sha256 = "$(sha $LONG_KEY)"
class = "interactive"
requests_per_second = 100.0
burst = 100
TOML

load() { # $1: key, $2: shape, $3: rate, $4: seed, $5: output
  "$BIN/sluice-load" run --url http://127.0.0.1:$GPORT --api-key "$1" --shape "$2" --rate "$3" \
    --poisson --duration "$DUR" --timeout 300s --seed "$4" --json >"$5"
}

long_rate=$(python3 -c "print(3 * $RATE)")
for round in $(seq 1 "$ROUNDS"); do
  for run in $RUNS; do
    echo "== round $round, $run ($(date -u +%T))" >&2
    "$GATEWAY_BIN" serve --policy "$OUT/policy.toml" --plain-http --model "$MODEL" >"$OUT/gateway-$run-$round.log" 2>&1 &
    gw=$!
    PIDS+=($gw)
    wait_up http://127.0.0.1:$GPORT/readyz
    if [ $run = beside ]; then
      load $LONG_KEY 4k:64 "$long_rate" $((SEED + 1)) "$OUT/$run-$round-long.json" &
      long=$!
    fi
    load $SHORT_KEY 256:64 "$RATE" $SEED "$OUT/$run-$round-short.json"
    if [ $run = beside ]; then wait $long; fi
    curl -sf http://127.0.0.1:$GPORT/metrics >"$OUT/$run-$round.metrics.txt" || true
    echo "$run $round $(date -u +%FT%TZ) $(uptime)" >>"$OUT/uptime.txt"
    kill "$gw"; wait "$gw" 2>/dev/null || true
  done
done
