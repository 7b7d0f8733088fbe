#!/usr/bin/env bash
# llama.cpp's llama-bench, llama-batched-bench and llama-server for one lower SIMD level, the peers of
# `SLUICE_SIMD=avx2` and `SLUICE_SIMD=avx2vnni` (engine-vs-llama-*.sh, lib.sh's PEER_AVX2 and
# PEER_AVX2VNNI): the sources of shared/tools/build-llama-cpp.sh (run it first), configured
# without AVX-512, with or without AVX-VNNI, into /tmp/peer-LEVEL/build/bin.
#
#   loadtests/bench/build-peer-level.sh avx2|avx2vnni
#
# About 10 minutes on 2 cores each.
set -euo pipefail
level=${1:?usage: $0 avx2|avx2vnni}
case $level in
    avx2) vnni=OFF ;;
    avx2vnni) vnni=ON ;;
    *) echo "unknown level $level" >&2; exit 2 ;;
esac
src=${PEER_DIR:-/tmp/peer}/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
[ -d "$src" ] || { echo "no llama.cpp sources in $src: run shared/tools/build-llama-cpp.sh" >&2; exit 1; }
out=/tmp/peer-$level
cmake -S "$src" -B "$out/build" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX_VNNI=$vnni \
    -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$out/build" --target llama-server llama-bench llama-batched-bench -j2
# No zmm register in the CPU backend: what an AVX2-only CPU would run.
if objdump -d "$out"/build/bin/libggml-cpu.so | grep -q zmm; then
    echo "$out: libggml-cpu.so uses zmm registers" >&2; exit 1
fi
echo "peer built: $out/build/bin"
