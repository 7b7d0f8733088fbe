#!/usr/bin/env bash
# The device check, one command on a GPU machine (docs/operations.md, "The GPU check"):
#   scripts/gpu-check.sh prepare   # here, on any machine: builds what travels into dist/gpu-check
#   scripts/gpu-check.sh [OUT]     # on the GPU machine: writes gpu-check.json,
#                                  # gpu-check-model.json and gpu-check.log to OUT ($OUT where
#                                  # that is set, else target/gpu-check)
# `prepare` runs `make cuda-check` (PTX for compute_90 from NVRTC 12.9: ISA 8.8, which driver 580
# loads) and builds a stripped `gpu_check` binary; both go in dist/gpu-check, and it fails if
# that plus the tracked tree is over the 64 MiB a device run may carry (dist/ is ignored by git:
# carry it, e.g. the device tool's carry ["dist/gpu-check"]). The run needs no network, no
# toolkit and no NVRTC on the GPU machine: the PTX is loaded by the driver. It checks
#   1. every kernel against its CPU twin on seeded inputs with the model's shapes, and times them;
#   2. a seeded synthetic model with SmolLM2-135M's shapes (written there by the engine's own GGUF
#      writer, ~98 MB: the real model does not fit the copy) on CUDA against the CPU backend, for
#      1 rank and for 3 ranks sharing GPU 0: first-step top-5 logits, greedy tokens (1 sequence,
#      and 3 batched through a padded decode graph), graphs on vs off bit for bit;
#   3. bench: pp512 and pp8192, decode batch 1, 8 and 64 with graphs off, on, and up to 64.
# It stops after 8 minutes (`timeout 480`). `SLUICE_GPU_CHECK=kernels` runs step 1 only.
#
# The bundled model itself (98 MB) is over what one run may carry, so its golden check takes two
# runs on the same warm machine: `prepare` also splits the model into dist/gpu-model.1 and .2 and
# copies shared/golden/greedy.jsonl into dist/gpu-check; then
#   scripts/gpu-check.sh stash && scripts/gpu-check.sh "$OUT"   # carry dist/gpu-check, dist/gpu-model.1
#   scripts/gpu-check.sh golden "$OUT"                           # carry dist/gpu-check, dist/gpu-model.2
# `stash` keeps the first half outside the copy of the tree (/var/tmp), and `golden` joins the
# halves, checks the GGUF's sha256 and runs the real model on CUDA against llama.cpp's golden
# records (gpu-check-golden.json, gpu-check-golden.log).
set -uo pipefail
cd "$(dirname "$0")/.."
dist=dist/gpu-check
limit=$((64 * 1024 * 1024))
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${1:-}" = prepare ]; then
  set -e
  ./scripts/cuda-check.sh "$dist/ptx"
  CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda} \
    cargo build --release --quiet -p sluice-engine --features cuda --example gpu_check
  cp "${CARGO_TARGET_DIR:-target/cuda}/release/examples/gpu_check" "$dist/gpu_check"
  strip "$dist/gpu_check"
  golden=../shared/golden/greedy.jsonl
  half=0
  if [ -f "$golden" ] && [ -f "$model" ]; then
    cp -f "$golden" "$dist/golden.jsonl"
    rm -f dist/gpu-model.*
    split -n 2 --numeric-suffixes=1 -a 1 "$model" dist/gpu-model.
    half=$(du -b dist/gpu-model.1 | cut -f1)
    echo "$(sha256sum <"$model" | cut -d' ' -f1)  /var/tmp/sluice-model.gguf" >"$dist/model.sha256"
  else
    echo "gpu-check: no $model or $golden here: the golden runs are not prepared"
  fi
  tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  bundle=$(du -sb "$dist" | cut -f1)
  total=$((tracked + bundle + half))
  echo "gpu-check: dist $((bundle / 1024)) KiB + half the model $((half / 1024)) KiB + tracked tree $((tracked / 1024)) KiB = $((total / 1024)) KiB (limit $((limit / 1024)) KiB)"
  if [ "$total" -gt "$limit" ]; then
    echo "gpu-check: over the 64 MiB a device run may carry"
    exit 1
  fi
  exit 0
fi
stash=/var/tmp/sluice-gpu-model.1
if [ "${1:-}" = stash ]; then
  cp dist/gpu-model.1 "$stash" && echo "gpu-check: first half of the model kept in $stash"
  exit
fi
if [ "${1:-}" = golden ]; then
  out=${2:-${OUT:-target/gpu-check}}
  mkdir -p "$out"
  joined=/var/tmp/sluice-model.gguf # the name model.sha256 gives
  {
    echo "gpu-check golden: $(date -u +%FT%TZ) on $(hostname)"
    cat "$stash" dist/gpu-model.2 >"$joined" || exit 1
    sha256sum -c "$dist/model.sha256" || exit 1
    SLUICE_CUDA_PTX="$dist/ptx" timeout 300 "$dist/gpu_check" "$out" --golden "$joined" "$dist/golden.jsonl"
  } 2>&1 | tee "$out/gpu-check-golden.log"
  exit "${PIPESTATUS[0]}"
fi
out=${1:-${OUT:-target/gpu-check}}
mkdir -p "$out"
log="$out/gpu-check.log"
{
  echo "gpu-check: $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  if [ ! -x "$dist/gpu_check" ]; then
    echo "gpu-check: $dist/gpu_check is missing: run 'scripts/gpu-check.sh prepare' where cargo is"
    exit 1
  fi
  # Does the binary built here run on this image (glibc, libcuda by dlopen)?
  ldd "$dist/gpu_check" 2>&1 | grep -i "not found" && echo "gpu-check: missing libraries above"
  mode=()
  [ "${SLUICE_GPU_CHECK:-}" = kernels ] && mode=(--kernels)
  SLUICE_CUDA_PTX="$dist/ptx" timeout 480 "$dist/gpu_check" "$out" "${mode[@]}"
  status=$?
  [ "$status" -eq 124 ] && echo "gpu-check: stopped after 8 minutes"
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
