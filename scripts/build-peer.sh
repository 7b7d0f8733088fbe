#!/usr/bin/env bash
# Builds the third-party peer the gateway's peer test fronts: llama.cpp's llama-server, from
# the sources inside the llama-cpp-python sdist on PyPI (CPU only; about 10 minutes on 2 cores).
# Then:  SLUICE_REQUIRE_PEER=1 cargo test --release -p sluice-gateway --test e2e peer
set -euo pipefail
VERSION=0.3.36
DIR=${PEER_DIR:-/tmp/peer}
BIN=$DIR/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp/build/bin/llama-server
if [ -x "$BIN" ]; then echo "llama-server present: $BIN"; exit 0; fi
command -v cmake >/dev/null || { echo "build-peer: cmake is missing (apt-get install cmake g++)" >&2; exit 1; }
mkdir -p "$DIR/sdist" && cd "$DIR/sdist"
# Only this package as a source archive: `--no-binary :all:` would build its build backend's
# cmake from source as well.
python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d .
tar xzf "llama_cpp_python-$VERSION.tar.gz"
cd "llama_cpp_python-$VERSION/vendor/llama.cpp"
# Portable x86-64 flags (no -march=native); AMX off: it faults inside some virtual machines.
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF >/dev/null
cmake --build build --target llama-server -j"$(nproc)"
echo "llama-server built: $BIN"
