#!/usr/bin/env bash
# Two builds of the gateway, A and B, in the same minutes: each in turn (A B B A per round) in
# front of the instant fake upstream, plain HTTP, driven by rate_bench open loop at RATE and
# closed loop at CONCURRENCY (the gateway-overhead bench's sluice rows, without nginx).
#
#   loadtests/bench/gateway-ab.sh A_SLUICE_BIN B_SLUICE_BIN [ROUNDS]   (default 2)
#
# Environment: CARGO_TARGET_DIR (default target: its examples instant_upstream and rate_bench),
# RATE (1000), DURATION (15 s), WARMUP (3 s), MAX_DURATION (10 s), CONNECTIONS (64),
# CONCURRENCY (32). Results: one rate_bench line each, labelled ROUND:BUILD:MODE, on stdout.
set -euo pipefail

cd "$(dirname "$0")/../.."
A=${1:?usage: $0 A_SLUICE_BIN B_SLUICE_BIN [ROUNDS]}
B=${2:?usage: $0 A_SLUICE_BIN B_SLUICE_BIN [ROUNDS]}
ROUNDS=${3:-2}
RATE=${RATE:-1000}
DURATION=${DURATION:-15}
WARMUP=${WARMUP:-3}
MAX_DURATION=${MAX_DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
CONCURRENCY=${CONCURRENCY:-32}
P_UP=19200 P_GW=19201

SCRATCH=$(mktemp -d /tmp/sluice-ab.XXXXXX)
source loadtests/bench/lib.sh

"$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP 2>"$SCRATCH/up.log" &
PIDS+=($!)
wait_up http://127.0.0.1:$P_UP/healthz
policy "$SCRATCH/open.toml" 256 1024 $P_UP

run() { # ROUND NAME SLUICE_BIN
    "$3" serve --policy "$SCRATCH/open.toml" --model "$MODEL" --listen 127.0.0.1:$P_GW \
        --certs-dir "$SCRATCH/certs" --plain-http >"$SCRATCH/$2.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait_up http://127.0.0.1:$P_GW/healthz
    "$BIN/examples/rate_bench" --label "$1:$2:rate" --url http://127.0.0.1:$P_GW --mode rate \
        --rate "$RATE" --duration "$DURATION" --warmup "$WARMUP" --connections "$CONNECTIONS"
    "$BIN/examples/rate_bench" --label "$1:$2:max" --url http://127.0.0.1:$P_GW --mode max \
        --duration "$MAX_DURATION" --warmup 3 --concurrency "$CONCURRENCY"
    kill "$pid" && wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
    echo "# round $round/$ROUNDS, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    run "$round" A "$A"
    run "$round" B "$B"
    run "$round" B "$B"
    run "$round" A "$A"
done
