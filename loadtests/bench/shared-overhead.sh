#!/usr/bin/env bash
# The cost of the shared path (issue 24, item 6): one gateway alone vs one with [shared] on a
# local redis-server, both plain HTTP in front of an instant fake upstream, at RATE req/s.
# The tenant has a rate limit and a token budget, and the upstream is `openai`, so each shared
# request runs two scripts: on arrival the GCRA, the budget charge and the ceiling's lease in
# one (`arrive`), at the end the settle and the release in one (`finish`, in the background).
# The Redis line at the end gives the EVALSHA count: 2 a request, plus the first NOSCRIPT of
# each script. Results go to docs/performance.md ("Shared state").
#
#   loadtests/bench/shared-overhead.sh [REPEATS]        (default 3; medians are printed)
#
# Environment: CARGO_TARGET_DIR (default target), SKIP_BUILD=1, RATE (1000), DURATION (15 s),
# WARMUP (3 s), CONNECTIONS (64). Caveat: client, gateways, Redis and upstream share 2 cores.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPEATS=${1:-3}
TARGET=${CARGO_TARGET_DIR:-target}
BIN=$TARGET/release
RATE=${RATE:-1000}
DURATION=${DURATION:-15}
WARMUP=${WARMUP:-3}
CONNECTIONS=${CONNECTIONS:-64}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
P_UP=19200 P_LOCAL=18181 P_SHARED=18182 P_REDIS=16399

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    cargo build --release -p sluice-gateway --bin sluice
    cargo build --release -p sluice-loadtests --example instant_upstream --example rate_bench
fi
command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install -y redis-server)" >&2; exit 1; }

SCRATCH=$(mktemp -d /tmp/sluice-shared-overhead.XXXXXX)
source loadtests/bench/lib.sh

KEY=sk-bench
KEY_SHA=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
bench_policy() { # FILE [SHARED]
    policy "$1" 256 1024 $P_UP
    cat >>"$1" <<TOML
health_path = "/healthz"   # the fake upstream's
[[tenants]]
name = "bench"
api_key_sha256 = "$KEY_SHA"
requests_per_second = 100000.0
burst = 10000
tokens_per_minute = 1000000000
TOML
    if [[ -n ${2:-} ]]; then
        printf '[shared]\nredis_url = "redis://127.0.0.1:%s"\nprefix = "bench"\n' "$P_REDIS" >>"$1"
    fi
}

redis-server --port $P_REDIS --bind 127.0.0.1 --save '' --appendonly no >"$SCRATCH/redis.log" 2>&1 &
PIDS+=($!)
"$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP 2>"$SCRATCH/up.log" &
PIDS+=($!)
bench_policy "$SCRATCH/local.toml"
bench_policy "$SCRATCH/shared.toml" shared
for g in local:$P_LOCAL shared:$P_SHARED; do
    "$BIN/sluice" serve --policy "$SCRATCH/${g%%:*}.toml" --model "$MODEL" \
        --listen "127.0.0.1:${g##*:}" --plain-http >"$SCRATCH/${g%%:*}.log" 2>&1 &
    PIDS+=($!)
done
wait_up http://127.0.0.1:$P_UP/healthz
wait_up http://127.0.0.1:$P_LOCAL/healthz
wait_up http://127.0.0.1:$P_SHARED/healthz
sleep 1

RESULTS=$SCRATCH/results.txt
for rep in $(seq "$REPEATS"); do
    echo "# repeat $rep/$REPEATS, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for g in local:$P_LOCAL shared:$P_SHARED; do
        "$BIN/examples/rate_bench" --label "$rep:${g%%:*}" --url "http://127.0.0.1:${g##*:}" \
            --api-key "$KEY" --mode rate --rate "$RATE" --duration "$DURATION" \
            --warmup "$WARMUP" --connections "$CONNECTIONS" >>"$RESULTS"
    done
done
for name in local shared; do
    log=$SCRATCH/$name.log
    echo "# gateway $name log: $(grep -c 'WARN' "$log" || true) WARN, $(grep -c 'ERROR' "$log" || true) ERROR" >&2
    grep -E 'WARN|ERROR' "$log" | head -3 >&2 || true
done
echo "# redis: $(redis-cli -p $P_REDIS info commandstats | grep -E 'evalsha|publish' | tr '\r\n' '  ')" >&2
cp "$RESULTS" "${RESULTS_COPY:-/tmp/sluice-shared-overhead-results.txt}"

python3 - "$RESULTS" "$RATE" <<'PY'
import statistics as st
import sys

path, rate = sys.argv[1], sys.argv[2]
runs = {}
for line in open(path):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    rep, label = kv.pop("label").split(":", 1)
    runs.setdefault(label, {}).setdefault(rep, {}).update(kv)

def med(label, key):
    return st.median(float(r[key]) for r in runs[label].values())

def added(key):
    return st.median(float(runs["shared"][r][key]) - float(runs["local"][r][key])
                     for r in runs["shared"] if r in runs["local"])

print(f"\nmedians of {len(runs['local'])} repeat(s) at {rate} req/s; ms from the scheduled send to the last byte\n")
print("| path | p50 | p90 | p99 | p99.9 | ok |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for label in ["local", "shared"]:
    print(f"| {label} | {med(label, 'p50'):.3f} | {med(label, 'p90'):.3f} | {med(label, 'p99'):.3f} "
          f"| {med(label, 'p999'):.3f} | {med(label, 'ok'):.0f} |")
print(f"\nadded by the shared path: p50 {added('p50'):+.3f} ms, p99 {added('p99'):+.3f} ms "
      f"(median over repeats of shared - local, back to back)")
PY
