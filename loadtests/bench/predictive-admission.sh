#!/usr/bin/env bash
# Issue 23, item 5: open-loop Poisson arrivals of the seed's mix (90% 256:128, 5% 4k:128,
# 5% 8k:128) against one bundled engine, in three setups: (a) the engine directly, (b) the
# gateway with count-based admission only, (c) the gateway with predictive admission. One JSON
# per setup and rate, plus the gateway's /ui/stats after each run (predicted vs actual TTFT).
#
#   RATES="0.3 0.6 1.0" DUR=45s DEADLINE=5s [ORDER=oldest] [COST=calibrated-policy.toml] \
#     loadtests/bench/predictive-admission.sh [OUT_DIR]
#   DEADLINE=5 python3 loadtests/bench/predictive-report.py loadtests/results/predictive
#
# Run it inside `flock /tmp/sluice-bench.lock` on a shared machine; one setup and rate per call
# (SETUPS=predictive RATES=1.0) keeps each locked run to a few minutes, into the same OUT.
# uptime.txt gets a line (setup, rate, time, load) after each run. ORDER is the engine's prefill
# order, given to the engine and to the gateway's `upstream.prefill_order`: `shortest` (the
# bundled engine's, as the gateway starts it) unless set; the runs before 2026-12-06 had `oldest`.
# COST: a policy written by `sluice-load calibrate` against this engine, whose [admission.cost]
# seeds (c)'s model (the shipped seed otherwise; the runs before 2026-12-06 evening had none).
set -euo pipefail
cd "$(dirname "$0")/../.."
source loadtests/bench/lib.sh
ENGINE_BIN=${ENGINE_BIN:-$BIN/sluice-engine}
# The output directory: the argument, else $OUT (as the other bench scripts take it), else the
# committed sweep's directory.
OUT=${1:-${OUT:-loadtests/results/predictive}}
RATES=${RATES:-"0.3 0.6 1.0"}
DUR=${DUR:-45s}
SEED=${SEED:-20261201}
SETUPS=${SETUPS:-"engine count predictive"}
DEADLINE=${DEADLINE:-5s}
ORDER=${ORDER:-shortest}
COST=${COST:-}
EPORT=18611
GPORT=18612
mkdir -p "$OUT"

"$ENGINE_BIN" serve --ranks 3 --listen 127.0.0.1:$EPORT --model "$MODEL" --prefill-order "$ORDER" \
  >"$OUT/engine.log" 2>&1 &
PIDS+=($!)
wait_up http://127.0.0.1:$EPORT/health

write_policy() { # $1: predictive true|false
  cat >"$OUT/policy.toml" <<TOML
[server]
listen = "127.0.0.1:$GPORT"
open = true

[admission]
predictive = $1
interactive_ttft_deadline = "$DEADLINE"
$(if [ "$1" = false ]; then echo "prefill_tokens_max = 1000000"; fi)

[upstream]
kind = "openai"
urls = ["http://127.0.0.1:$EPORT"]
tokenizer = "$MODEL"
prefill_order = "$ORDER"
TOML
  if [ "$1" = true ] && [ -n "$COST" ]; then
    # The calibrated [admission.cost] section: from its header to the next section.
    awk '/^\[/ { on = ($0 == "[admission.cost]") } on' "$COST" >>"$OUT/policy.toml"
  fi
}

for setup in $SETUPS; do
  url=http://127.0.0.1:$EPORT
  gw=
  if [ "$setup" != engine ]; then
    if [ "$setup" = count ]; then write_policy false; else write_policy true; fi
    "$BIN/sluice" serve --policy "$OUT/policy.toml" --plain-http --model "$MODEL" >"$OUT/gateway-$setup.log" 2>&1 &
    gw=$!
    PIDS+=($gw)
    url=http://127.0.0.1:$GPORT
    wait_up $url/readyz
  fi
  for rate in $RATES; do
    echo "== $setup at $rate req/s for $DUR" >&2
    "$BIN/sluice-load" run --url $url --workload seed-mix --rate "$rate" --poisson \
      --duration "$DUR" --timeout 90s --seed "$SEED" --json >"$OUT/$setup-$rate.json"
    echo "$setup $rate $(date -u +%FT%TZ) $(uptime)" >>"$OUT/uptime.txt"
    if [ -n "$gw" ]; then
      curl -sf $url/ui/stats >"$OUT/$setup-$rate.stats.json"
      curl -sf $url/metrics >"$OUT/$setup-$rate.metrics.txt"
    fi
  done
  if [ -n "$gw" ]; then kill "$gw"; wait "$gw" 2>/dev/null || true; fi
done
