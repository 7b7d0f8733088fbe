#!/usr/bin/env bash
# The bundled three-rank engine against llama-server, one server at a time, in the same minutes
# (issue 19, item 3 "Serving" and "One 8,192-token prompt through the gateway").
#
#   loadtests/bench/engine-vs-llama-server.sh OUT_DIR
#
# For each SIMD level in LEVELS (default "native avx2"): `sluice-engine serve --ranks 3` (with
# SLUICE_SIMD=<level> unless native) and llama-server `-t 2 -np 8 -c 16384` (the build in
# PEER_<LEVEL>, for avx2 one without AVX-512), each driven by `sluice-load bench` at C4 and C8
# with 256:128 and at C4 with 1024:256. Then one 8,192-token prompt (16 output tokens), twice:
# through `sluice serve` in front of the bundled engine, and straight to llama-server
# `-np 1 -c 16384` (with -np 8 a slot holds 2,048 tokens). Every run writes its JSON lines to
# OUT_DIR/<level>-<server>-<shape>.json; the servers' logs go to OUT_DIR/*.log.
#
# Environment: CARGO_TARGET_DIR (default target), PEER_NATIVE, PEER_AVX2 (llama.cpp bin dirs),
# LEVELS (empty: only the 8K runs), LEVELS_8K (default "native avx2"), SEED (11), SKIP_8K=1.
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
LEVELS=${LEVELS-native avx2}
SEED=${SEED:-11}
P_ENGINE=18401 P_LLAMA=18402 P_GATEWAY=18403

# The servers start slowly (three ranks; llama-server at 16K context).
export WAIT_UP_S=${WAIT_UP_S:-300}
source loadtests/bench/lib.sh
PID=
# Stops the server of the last run (the others are stopped already; lib.sh's cleanup at exit).
stop() {
    [[ -n $PID ]] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
    PID=
}
start() { # LOG COMMAND...
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
}

load() { # NAME URL CONCURRENCY SHAPE REQUESTS [extra sluice-load args]
    local name=$1 url=$2 c=$3 shape=$4 n=$5
    shift 5
    echo "$(date -u +%H:%M:%S) $name C$c $shape ($n requests, load $(cut -d' ' -f1 /proc/loadavg))" >&2
    "$BIN/sluice-load" bench --url "$url" --concurrency "$c" --shape "$shape" --requests "$n" \
        --seed "$SEED" --json "$@" >>"$OUT/$name-${shape/:/x}.json"
}

matrix() { # NAME URL
    load "$1" "$2" 4 256:128 8
    load "$1" "$2" 8 256:128 16
    load "$1" "$2" 4 1024:256 8
}

for level in $LEVELS; do
    peer=$(peer_of "$level")
    start "$OUT/$level-engine.log" $(simd_of "$level") "$BIN/sluice-engine" serve --ranks 3 \
        --model "$MODEL" --listen 127.0.0.1:$P_ENGINE
    wait_up http://127.0.0.1:$P_ENGINE/health
    matrix "$level-engine" http://127.0.0.1:$P_ENGINE
    stop

    start "$OUT/$level-llama.log" env LD_LIBRARY_PATH="$peer" "$peer/llama-server" -m "$MODEL" \
        -t 2 -np 8 -c 16384 --host 127.0.0.1 --port $P_LLAMA
    wait_up http://127.0.0.1:$P_LLAMA/health
    matrix "$level-llama" http://127.0.0.1:$P_LLAMA
    stop
done

[[ ${SKIP_8K:-0} == 1 ]] && exit 0
# One 8,192-token prompt through the gateway (default policy: input cap 8,192, HTTPS with the
# dev certificate) in front of the bundled engine (its ranks inherit SLUICE_SIMD), then straight
# to llama-server.
for level in ${LEVELS_8K-native avx2}; do
    peer=$(peer_of "$level")
    start "$OUT/$level-8k-gateway.log" $(simd_of "$level") "$BIN/sluice" serve --model "$MODEL" \
        --listen 127.0.0.1:$P_GATEWAY
    wait_up https://127.0.0.1:$P_GATEWAY/readyz -k # ready once the bundled engine's ranks are
    load "$level-8k-gateway" https://127.0.0.1:$P_GATEWAY 1 8192:16 2 --ca certs/sluice-dev-ca.pem
    stop

    # llama-server clamps a slot to the model's training context (8,192), which an 8,192-token
    # prompt and its output exceed; the override gives it the 16,384 asked for.
    start "$OUT/$level-8k-llama.log" env LD_LIBRARY_PATH="$peer" "$peer/llama-server" \
        -m "$MODEL" -t 2 -np 1 -c 16384 --override-kv llama.context_length=int:16384 \
        --host 127.0.0.1 --port $P_LLAMA
    wait_up http://127.0.0.1:$P_LLAMA/health
    load "$level-8k-llama" http://127.0.0.1:$P_LLAMA 1 8192:16 2
    stop
done
