#!/usr/bin/env bash
# `sluice-engine bench` against llama.cpp's `llama-bench`, per SIMD level, in the same minutes
# (issue 19, item 3 "Engine"): pp512, pp4096, pp8192, tg128 at batch 1, and batch 8.
#
#   loadtests/bench/engine-vs-llama-bench.sh OUT_DIR
#
# For each level in LEVELS (default "native avx2"): sluice-engine (SLUICE_SIMD=<level> unless
# native), then llama-bench from PEER_<LEVEL> (for avx2 and avx2vnni, builds without AVX-512:
# build-peer-level.sh), each first at 512 prompt tokens and 128 decode tokens (REPS
# repetitions), then 4,096 and 8,192 prompt tokens once; with DEPTHS (for example 4096,8192),
# then tg128 at batch 1 after that many tokens of context (`llama-bench -d`, with flash attention
# off and on: the engine's attention is always tiled), REPS repetitions. Raw output in
# OUT_DIR/<level>-{engine,llama}.txt.
#
# Environment: CARGO_TARGET_DIR (default target), PEER_NATIVE, PEER_AVX2, PEER_AVX2VNNI, LEVELS,
# REPS (3), DEPTHS (none).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
BIN=${CARGO_TARGET_DIR:-target}/release
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
REPS=${REPS:-3}
source loadtests/bench/lib.sh

stamp() { echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) $*"; }

for level in ${LEVELS-native avx2}; do
    simd=$(simd_of "$level")
    peer=$(peer_of "$level")
    {
        stamp engine short
        $simd "$BIN/sluice-engine" bench --threads 2 --prefill-tokens 512 \
            --decode-tokens 128 --batches 1,8 --repetitions "$REPS"
        stamp engine long
        $simd "$BIN/sluice-engine" bench --threads 2 --prefill-tokens 4096,8192 \
            --decode-tokens 0 --repetitions 1
        if [ -n "${DEPTHS:-}" ]; then
            stamp engine depth
            $simd "$BIN/sluice-engine" bench --threads 2 --prefill-tokens 512 \
                --decode-tokens 128 --batches 1 --depth "$DEPTHS" --repetitions "$REPS"
        fi
    } >>"$OUT/$level-engine.txt" 2>&1
    {
        stamp llama short
        LD_LIBRARY_PATH=$peer "$peer/llama-bench" -m "$MODEL" -t 2 -p 512 -n 128 -r "$REPS"
        stamp llama long
        LD_LIBRARY_PATH=$peer "$peer/llama-bench" -m "$MODEL" -t 2 -p 4096,8192 -n 0 -r 1
        if [ -n "${DEPTHS:-}" ]; then
            stamp llama depth
            LD_LIBRARY_PATH=$peer "$peer/llama-bench" -m "$MODEL" -t 2 -p 0 -n 128 \
                -d "$DEPTHS" -fa 0,1 -r "$REPS"
        fi
    } >>"$OUT/$level-llama.txt" 2>&1
done
