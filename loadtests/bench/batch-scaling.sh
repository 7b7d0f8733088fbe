#!/usr/bin/env bash
# Where batch 8 against batch 1 goes, per SIMD level (issue 19, item 3: batch 8 ≥ 3× batch 1),
# in the same minutes:
#
#   loadtests/bench/batch-scaling.sh OUT_DIR
#
# For each level in LEVELS (default "native avx2"), into OUT_DIR/<level>-scaling.txt:
# `sluice-engine bench` tg128 at batch 1 and 8 on one thread and on two (one thread leaves the
# pool out of the ratio); `kernel_bench` on one thread and two at m = 1 and 8 (the products
# alone, their weights in cache); with `perf` on the PATH, a profile of batch-8 decode on two
# threads (the top symbols); and where the level's llama.cpp peer has llama-batched-bench,
# llama.cpp's own batch 1 and batch 8. The engine and kernel_bench come from CARGO_TARGET_DIR
# (default target; `cargo build --release -p sluice-engine --examples` first).
#
# Environment: CARGO_TARGET_DIR, LEVELS, REPS (3), PEER_NATIVE, PEER_AVX2, PEER_AVX2VNNI.
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
source loadtests/bench/lib.sh

for level in ${LEVELS-native avx2}; do
    simd=$(simd_of "$level")
    peer=$(peer_of "$level")
    {
        for threads in 1 2; do
            stamp engine "$threads thread(s)"
            $simd "$BIN/sluice-engine" bench --threads "$threads" --prefill-tokens 16 \
                --decode-tokens 128 --batches 1,8 --repetitions "$REPS"
            stamp kernel_bench "$threads thread(s)"
            $simd "$BIN/examples/kernel_bench" "$threads" 1,8
        done
        if command -v perf >/dev/null; then
            stamp perf batch 8
            data=$(mktemp)
            $simd perf record -q -F 1000 -o "$data" "$BIN/sluice-engine" bench --threads 2 \
                --prefill-tokens 16 --decode-tokens 256 --batches 8 --repetitions "$REPS" >/dev/null 2>&1
            perf report -i "$data" --no-children --sort symbol 2>/dev/null |
                awk '!/^#/ && /%/ && n++ < 20 { print $1, $2, $3 }'
            rm -f "$data"
        fi
        llama_batched "$peer" 2>&1 | awk '/^#|^\|/'
    } >>"$OUT/$level-scaling.txt" 2>&1
done
