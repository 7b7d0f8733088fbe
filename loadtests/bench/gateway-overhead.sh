#!/usr/bin/env bash
# The gateway overhead benchmark (issue 4, item 10): sluice vs nginx vs direct calls, in front of
# an instant fake upstream, on this machine. Results go to docs/performance.md.
#
#   loadtests/bench/gateway-overhead.sh [REPEATS]        (default 3; medians are printed)
#
# Environment: CARGO_TARGET_DIR (default target), SKIP_BUILD=1, RATE (1000), DURATION (20 s),
# WARMUP (5 s), MAX_DURATION (10 s), CONNECTIONS (64, open loop), CONCURRENCY (32, closed loop),
# SHED_RATE (1000), PIN=1 (client on CPU 1; proxies and upstream left to the scheduler).
#
# Runs, each repeat: open loop at RATE against direct / nginx / sluice (plain HTTP) / sluice
# (HTTPS); closed loop (max req/s) against the same four; then two shed runs:
#   shed-full: sluice with active_max 1, queue_depth 0, its slot held by one request to an
#              upstream that answers after 120 s: every request at SHED_RATE is shed (503).
#   shed-10x:  sluice with active_max 4, queue_depth 16 over an upstream that takes 40 ms, so
#              it serves 100 req/s; offered SHED_RATE (10x): ~90% shed, the rest queued/served.
# Caveat: the client, the proxies and the upstream share the same 2 cores.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPEATS=${1:-3}
TARGET=${CARGO_TARGET_DIR:-target}
BIN=$TARGET/release
RATE=${RATE:-1000}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-5}
MAX_DURATION=${MAX_DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
CONCURRENCY=${CONCURRENCY:-32}
SHED_RATE=${SHED_RATE:-1000}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}

P_UP=19100 P_UP_HOLD=19101 P_UP_40MS=19102
P_NGINX=18080 P_SLUICE=18081 P_TLS=18082 P_SHED=18083 P_SHED10=18084

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    cargo build --release -p sluice-gateway --bin sluice
    cargo build --release -p sluice-loadtests --example instant_upstream --example rate_bench
fi
command -v nginx >/dev/null || { echo "nginx not found (apt-get install -y nginx)" >&2; exit 1; }
[[ -f $MODEL ]] || { echo "$MODEL missing (make fetch-model)" >&2; exit 1; }

SCRATCH=$(mktemp -d /tmp/sluice-overhead.XXXXXX)
source loadtests/bench/lib.sh

CLIENT=("$BIN/examples/rate_bench")
[[ ${PIN:-0} == 1 ]] && CLIENT=(taskset -c 1 "${CLIENT[@]}")

gateway() { # NAME POLICY PORT [--plain-http]
    "$BIN/sluice" serve --policy "$2" --model "$MODEL" --listen "127.0.0.1:$3" \
        --certs-dir "$SCRATCH/certs" "${@:4}" >"$SCRATCH/$1.log" 2>&1 &
    PIDS+=($!)
    eval "PID_$1=$!"
}

# Upstreams: instant, slot-holding (120 s), and 40 ms.
"$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP 2>"$SCRATCH/up.log" &
PIDS+=($!)
"$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP_HOLD --delay-ms 120000 2>/dev/null &
PIDS+=($!)
"$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP_40MS --delay-ms 40 2>/dev/null &
PIDS+=($!)

# nginx, unprivileged, under the scratch prefix.
sed -e "s/127.0.0.1:18080/127.0.0.1:$P_NGINX/" -e "s/127.0.0.1:19100/127.0.0.1:$P_UP/" \
    loadtests/bench/nginx.conf >"$SCRATCH/nginx.conf"
nginx -p "$SCRATCH" -c "$SCRATCH/nginx.conf" -g "daemon off;" 2>"$SCRATCH/nginx.log" &
PIDS+=($!)

policy "$SCRATCH/open.toml" 256 1024 $P_UP
policy "$SCRATCH/shed-full.toml" 1 0 $P_UP_HOLD
policy "$SCRATCH/shed-10x.toml" 4 16 $P_UP_40MS
gateway sluice "$SCRATCH/open.toml" $P_SLUICE --plain-http
gateway tls "$SCRATCH/open.toml" $P_TLS
gateway shed "$SCRATCH/shed-full.toml" $P_SHED --plain-http
gateway shed10 "$SCRATCH/shed-10x.toml" $P_SHED10 --plain-http

wait_up http://127.0.0.1:$P_UP/healthz
wait_up http://127.0.0.1:$P_NGINX/healthz
wait_up http://127.0.0.1:$P_SLUICE/healthz
wait_up http://127.0.0.1:$P_SHED/healthz
wait_up http://127.0.0.1:$P_SHED10/healthz
wait_up https://127.0.0.1:$P_TLS/healthz --cacert "$SCRATCH/certs/sluice-dev-ca.pem"
CA=$SCRATCH/certs/sluice-dev-ca.pem

declare -A URL=(
    [direct]=http://127.0.0.1:$P_UP
    [nginx]=http://127.0.0.1:$P_NGINX
    [sluice]=http://127.0.0.1:$P_SLUICE
    [sluice-tls]=https://127.0.0.1:$P_TLS
)
ORDER=(direct nginx sluice sluice-tls)
RESULTS=$SCRATCH/results.txt
rss() { ps -o rss= -p "$1" | tr -d ' '; }
echo "# gateway RSS at start: plain $(rss "$PID_sluice") KiB, tls $(rss "$PID_tls") KiB," \
    "shed $(rss "$PID_shed") KiB" >&2
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

bench() { # REPEAT LABEL ARGS...
    local rep=$1 label=$2
    shift 2
    "${CLIENT[@]}" --label "$rep:$label" "$@" >>"$RESULTS"
}

for rep in $(seq "$REPEATS"); do
    echo "# repeat $rep/$REPEATS, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for t in "${ORDER[@]}"; do
        bench "$rep" "rate-$t" --url "${URL[$t]}" --ca "$CA" --mode rate --rate "$RATE" \
            --duration "$DURATION" --warmup "$WARMUP" --connections "$CONNECTIONS"
    done
    for t in "${ORDER[@]}"; do
        bench "$rep" "max-$t" --url "${URL[$t]}" --ca "$CA" --mode max \
            --duration "$MAX_DURATION" --warmup 3 --concurrency "$CONCURRENCY"
    done

    # shed-full: one request holds the only slot; everything else is refused at once.
    curl -s -o /dev/null --max-time 100 -H 'content-type: application/json' \
        -d '{"model":"instant","messages":[{"role":"user","content":"hold"}]}' \
        http://127.0.0.1:$P_SHED/v1/chat/completions &
    HOLD=$!
    sleep 1
    bench "$rep" shed-full --url http://127.0.0.1:$P_SHED --mode rate --rate "$SHED_RATE" \
        --duration "$DURATION" --warmup "$WARMUP" --connections "$CONNECTIONS"
    kill "$HOLD" 2>/dev/null || true
    wait "$HOLD" 2>/dev/null || true

    # shed-10x: 4 slots x 40 ms = 100 req/s of capacity, offered SHED_RATE.
    bench "$rep" shed-10x --url http://127.0.0.1:$P_SHED10 --mode rate --rate "$SHED_RATE" \
        --duration "$DURATION" --warmup "$WARMUP" --connections 256
done

echo "# gateway RSS at end: plain $(rss "$PID_sluice") KiB, tls $(rss "$PID_tls") KiB," \
    "shed $(rss "$PID_shed") KiB, shed10 $(rss "$PID_shed10") KiB" >&2
for name in sluice tls shed shed10; do
    log=$SCRATCH/$name.log
    echo "# gateway $name log: $(wc -l <"$log") lines, $(grep -c 'ERROR' "$log" || true) ERROR," \
        "$(grep -c 'WARN' "$log" || true) WARN, $(grep -c 'panick' "$log" || true) panics" >&2
    grep -E 'ERROR|panick' "$log" | head -3 >&2 || true
done
cp "$RESULTS" "${RESULTS_COPY:-/tmp/sluice-overhead-results.txt}"

python3 - "$RESULTS" "$RATE" "$SHED_RATE" <<'PY'
import statistics as st
import sys

path, rate, shed_rate = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}  # (repeat, label) -> {key: value}
for line in open(path):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    rep, label = kv.pop("label").split(":", 1)
    runs.setdefault(label, {}).setdefault(rep, {}).update(kv)

def med(label, key, reps=None):
    vals = [float(r[key]) for r in runs.get(label, {}).values() if key in r]
    return st.median(vals) if vals else float("nan")

def added(label, key):
    """Median over repeats of (via proxy - direct), each repeat's runs taken back to back."""
    d = [float(runs[label][r][key]) - float(runs["rate-direct"][r][key])
         for r in runs.get(label, {}) if r in runs.get("rate-direct", {})]
    return st.median(d) if d else float("nan")

n = len(runs.get("rate-direct", {}))
print(f"\nmedians of {n} repeat(s); latency in ms, from the scheduled send to the last byte\n")
print(f"| path | p50 @ {rate}/s | p90 | p99 | p99.9 | added p50 | added p99 | max req/s | p50 at max |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for t in ["direct", "nginx", "sluice", "sluice-tls"]:
    r, m = f"rate-{t}", f"max-{t}"
    a50 = "—" if t == "direct" else f"{added(r, 'p50'):+.3f}"
    a99 = "—" if t == "direct" else f"{added(r, 'p99'):+.3f}"
    print(f"| {t} | {med(r,'p50'):.3f} | {med(r,'p90'):.3f} | {med(r,'p99'):.3f} "
          f"| {med(r,'p999'):.3f} | {a50} | {a99} | {med(m,'achieved'):,.0f} | {med(m,'p50'):.3f} |")

print(f"\nshed runs at {shed_rate} req/s offered (latency of the 503 answers, ms)\n")
print("| run | served req/s (2xx) | 503s | 200s | 503 p50 | 503 p99 | 503 max | other statuses |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for s in ["shed-full", "shed-10x"]:
    last = runs.get(s, {}).get(str(n), {})
    print(f"| {s} | {med(s,'achieved'):,.0f} | {med(s,'s503_n'):.0f} | {med(s,'s200_n'):.0f} "
          f"| {med(s,'s503_p50'):.3f} | {med(s,'s503_p99'):.3f} | {med(s,'s503_max'):.3f} "
          f"| {last.get('statuses', '')} (last repeat) |")

ng50, ng99 = added("rate-nginx", "p50"), added("rate-nginx", "p99")
sl50, sl99 = added("rate-sluice", "p50"), added("rate-sluice", "p99")
print(f"\nsluice added latency vs nginx's: p50 {sl50/ng50:.1f}x, p99 {sl99/ng99:.1f}x; "
      f"max req/s sluice/nginx {med('max-sluice','achieved')/med('max-nginx','achieved'):.2f}, "
      f"sluice/direct {med('max-sluice','achieved')/med('max-direct','achieved'):.2f}")
print(f"target added p99 <= 1 ms at {rate}/s: {'met' if sl99 <= 1 else 'NOT met'} ({sl99:.3f} ms); "
      f"shed p99 <= 2 ms: {'met' if med('shed-full','s503_p99') <= 2 else 'NOT met'} "
      f"({med('shed-full','s503_p99'):.3f} ms full, {med('shed-10x','s503_p99'):.3f} ms 10x)")
print("\nper repeat:")
for label in sorted(runs):
    for rep in sorted(runs[label]):
        r = runs[label][rep]
        print(f"  {rep} {label}: {r.get('achieved')} req/s p50 {r.get('p50')} p99 {r.get('p99')} "
              f"{r.get('statuses')}")
PY
