#!/usr/bin/env bash
# The deployment's capacity matrix (docs/capacity.md) against three targets side by side:
#   gateway       `sluice serve` under policies/default.toml, as `make run` starts it (HTTPS,
#                 its bundled three-rank engine behind it);
#   engine        a second bundled engine reached directly (`sluice-engine serve --ranks 3`);
#   llama-server  llama.cpp's, `-t 2 -np 8 -c 65536 --jinja` (8,192 tokens a slot: the
#                 gateway's input cap).
# Only one target runs requests at a time; the other two sit idle.
#
#   loadtests/bench/capacity-matrix.sh [more sluice-load matrix arguments]
#
# Environment: CARGO_TARGET_DIR, PEER_NATIVE (the folder of llama-server), SCALE (0.25), SOAK
# (180s), TIMEOUT (300s), SEED (20261205), OUT (docs/capacity.md; the chart and the samples go
# to loadtests/results/capacity.svg and .json).
set -euo pipefail
cd "$(dirname "$0")/../.."
source loadtests/bench/lib.sh
OUT=${OUT:-docs/capacity.md}
GATEWAY_PORT=18443 ENGINE_PORT=18000 LLAMA_PORT=18081

"$BIN/sluice" serve --listen "127.0.0.1:$GATEWAY_PORT" --model "$MODEL" &
PIDS+=($!)
"$BIN/sluice-engine" serve --ranks 3 --listen "127.0.0.1:$ENGINE_PORT" --model "$MODEL" &
PIDS+=($!)
"$PEER_NATIVE/llama-server" -m "$MODEL" -t 2 -np 8 -c 65536 --jinja \
    --host 127.0.0.1 --port "$LLAMA_PORT" --log-disable &
PIDS+=($!)
wait_up "https://localhost:$GATEWAY_PORT/readyz" --cacert certs/sluice-dev-ca.pem
wait_up "http://127.0.0.1:$ENGINE_PORT/health"
wait_up "http://127.0.0.1:$LLAMA_PORT/health"

"$BIN/sluice-load" matrix \
    --gateway "https://localhost:$GATEWAY_PORT" --ca certs/sluice-dev-ca.pem \
    --engine "http://127.0.0.1:$ENGINE_PORT" --llama-server "http://127.0.0.1:$LLAMA_PORT" \
    --scale "${SCALE:-0.25}" --soak "${SOAK:-180s}" --timeout "${TIMEOUT:-300s}" \
    --seed "${SEED:-20261205}" --out "$OUT" \
    --svg loadtests/results/capacity.svg --json-out loadtests/results/capacity.json "$@"
