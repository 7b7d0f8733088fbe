#!/usr/bin/env bash
# `make cuda-check`: compile every CUDA kernel with NVRTC and assemble it with ptxas, on a machine
# with no GPU and no toolkit. NVRTC (libnvrtc.so.12 and its builtins) and ptxas come from PyPI
# (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12), installed once under $SLUICE_CUDA_DIR
# (default ~/.cache/sluice/cuda12, outside the repository). The PTX lands in $1 (default
# target/cuda-ptx). Fails on a compile error, a spill, or a PTX ISA the H200 driver cannot load.
# `--install` only installs them (CI fetches them in the background while it builds).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SLUICE_CUDA_DIR:-$HOME/.cache/sluice/cuda12}
install_only=false
[ "${1:-}" = --install ] && { install_only=true; shift; }
out=${1:-target/cuda-ptx}
if [ ! -x "$dir/nvidia/cuda_nvcc/bin/ptxas" ] || [ ! -e "$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  echo "cuda-check: installing NVRTC and ptxas from PyPI into $dir"
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir" \
    'nvidia-cuda-nvrtc-cu12==12.9.*' 'nvidia-cuda-nvcc-cu12==12.9.*'
fi
$install_only && exit 0
export LD_LIBRARY_PATH="$dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PTXAS="$dir/nvidia/cuda_nvcc/bin/ptxas"
# The dev profile of the main target dir: the example only drives NVRTC and ptxas, so an optimized
# engine would cost a minute of compiling for nothing, and target/release stays the default build.
# CUDA_CHECK_FEATURES (default `cuda`) lets CI reuse the library its `rdma,cuda` build compiled.
cargo run --quiet -p sluice-engine --features "${CUDA_CHECK_FEATURES:-cuda}" --example cuda_check -- "$out"
