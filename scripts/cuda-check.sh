#!/usr/bin/env bash
# `make cuda-check`: compile every CUDA kernel with NVRTC and assemble it with ptxas, on a machine
# with no GPU and no toolkit. NVRTC (libnvrtc.so.12 and its builtins) and ptxas come from PyPI
# (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12), installed once under $SLUICE_CUDA_DIR
# (default ~/.cache/sluice/cuda12, outside the repository). The PTX lands in $1 (default
# target/cuda-ptx). Fails on a compile error, a spill, or a PTX ISA the H200 driver cannot load.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SLUICE_CUDA_DIR:-$HOME/.cache/sluice/cuda12}
out=${1:-target/cuda-ptx}
if [ ! -x "$dir/nvidia/cuda_nvcc/bin/ptxas" ] || [ ! -e "$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  echo "cuda-check: installing NVRTC and ptxas from PyPI into $dir"
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir" \
    'nvidia-cuda-nvrtc-cu12==12.9.*' 'nvidia-cuda-nvcc-cu12==12.9.*'
fi
export LD_LIBRARY_PATH="$dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PTXAS="$dir/nvidia/cuda_nvcc/bin/ptxas"
# The main target dir: `cargo run --example` builds the library (with `cuda`, beside the default
# one) and the example, never the binaries, so target/release/sluice-engine stays the default build.
cargo run --release --quiet -p sluice-engine --features cuda --example cuda_check -- "$out"
