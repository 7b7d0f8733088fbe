# Shared by the benches in this folder (sourced, not run): the scratch processes and their
# cleanup, waiting for a server, and the policy every bench starts from.
#
#   cd "$(dirname "$0")/../.." && source loadtests/bench/lib.sh
#
# Defines PIDS (append every background process: `PIDS+=($!)`; all are killed at exit),
# wait_up, policy, stamp and the llama.cpp peers per SIMD level; and, unless the caller or the
# environment set them, BIN (the release binaries: $CARGO_TARGET_DIR/release), MODEL (the
# bundled GGUF) and REPS (3, repetitions per measurement).

BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
REPS=${REPS:-3}

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# Waits (up to WAIT_UP_S, default 120 s) until URL answers 2xx; exits the bench if it never does.
wait_up() { # URL [CURL ARGS...]
    local url=$1 tries=$((${WAIT_UP_S:-120} * 10))
    shift
    for _ in $(seq "$tries"); do
        curl -sf -o /dev/null "$@" "$url" && return 0
        sleep 0.1
    done
    echo "not up: $url" >&2
    exit 1
}

# A policy with an `openai` upstream at UPSTREAM_PORT and 8 tokens per answer by default;
# the caller appends to [upstream] (the last table) or adds tables with `cat >>FILE`.
policy() { # FILE ACTIVE_MAX QUEUE_DEPTH UPSTREAM_PORT [QUEUE_WAIT_MAX]
    cat >"$1" <<EOF_POLICY
[limits]
max_tokens_default = 8
[admission]
active_max = $2
queue_depth = $3
heavy_active_max = 1
${5:+queue_wait_max = \"$5\"}
[upstream]
kind = "openai"
urls = ["http://127.0.0.1:$4"]
EOF_POLICY
}

# llama.cpp peers per SIMD level (engine-vs-llama-*.sh): the build of
# shared/tools/build-llama-cpp.sh, and those of build-peer-level.sh without AVX-512: without
# AVX-VNNI standing in for the AVX2-only CPUs, and with it.
PEER_NATIVE=${PEER_NATIVE:-/tmp/peer/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
PEER_AVX2=${PEER_AVX2:-/tmp/peer-avx2/build/bin}
PEER_AVX2VNNI=${PEER_AVX2VNNI:-/tmp/peer-avx2vnni/build/bin}
# The command prefix that forces a SIMD level on the engine (none for native), and the
# llama.cpp build for that level.
simd_of() { [[ $1 == native ]] || echo "env SLUICE_SIMD=$1"; }
peer_of() {
    case $1 in
        avx2) echo "$PEER_AVX2" ;;
        avx2vnni) echo "$PEER_AVX2VNNI" ;;
        *) echo "$PEER_NATIVE" ;;
    esac
}

# A header line for a raw output file: the time, the load average and what follows.
stamp() { echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) $*"; }
