#!/usr/bin/env bash
# Sluice, SGLang's model gateway (SMG, PyPI sglang-router) and no gateway, side by side in the
# same run, over the same upstreams (issue 22, item 3). Results: docs/performance.md and
# docs/upstreams.md.
#
#   loadtests/bench/smg-side-by-side.sh [REPEATS]        (default 3; medians are printed)
#
# Environment: CARGO_TARGET_DIR (default target), SKIP_BUILD=1, SMG_DIR (a venv with
# sglang-router; default ~/.cache/sluice/smg, created when missing), DURATION (10 s), WARMUP (3 s),
# PARTS (default "overhead cap busy": which of the runs below to take), SLUICE_BIN (the `sluice`
# binary; default $CARGO_TARGET_DIR/release/sluice), SLUICE_B (a second `sluice` binary: the
# overhead runs then alternate it, as "sluice-b", with the first, for an A/B of two builds in
# the same minutes). Only the servers the chosen parts use are started.
#
# 1. overhead: open loop at 100 and 1,000 req/s against an instant upstream; added latency
#    = via the gateway minus direct, per repeat, then the median.
# 2. cap-4: a concurrency cap of 4 (Sluice active_max 4, queue 16, 10 s queue wait; SMG
#    --max-concurrent-requests 4 --queue-size 16 --queue-timeout-secs 10) in front of the real
#    engine (`sluice-engine serve --ranks 1`), offered 10x what 4 slots serve. The engine's
#    `vllm:num_requests_running` is sampled every 50 ms: its peak is the engine-side
#    concurrency. Reported: statuses, shed latency (503), what queued requests get at the
#    timeout.
# 3. busy-503: an upstream that answers every completion with vLLM's own 503: upstream attempts
#    per client request, and what the client gets.
# Caveat: the client, the gateways and the upstreams share this machine's cores.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPEATS=${1:-3}
TARGET=${CARGO_TARGET_DIR:-target}
BIN=$TARGET/release
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-3}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SMG_DIR=${SMG_DIR:-$HOME/.cache/sluice/smg}
SMG_VERSION=0.3.2
PARTS=" ${PARTS:-overhead cap busy} "
part() { [[ $PARTS == *" $1 "* ]]; }

P_UP=19200 P_BUSY=19201 P_ENG=19202
P_SLUICE=18200 P_SMG=18201 P_SLUICE_CAP=18202 P_SMG_CAP=18203 P_SLUICE_BUSY=18204 P_SMG_BUSY=18205
P_SLUICE_B=18206
SLUICE_BIN=${SLUICE_BIN:-$BIN/sluice}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    cargo build --release -p sluice-gateway --bin sluice -p sluice-engine --bin sluice-engine
    cargo build --release -p sluice-loadtests --example instant_upstream --example rate_bench
fi
[[ -f $MODEL ]] || { echo "$MODEL missing (make fetch-model)" >&2; exit 1; }
if [[ ! -x $SMG_DIR/bin/smg ]]; then
    python3 -m venv "$SMG_DIR"
    "$SMG_DIR/bin/pip" install -q "sglang-router==$SMG_VERSION"
fi

SCRATCH=$(mktemp -d /tmp/sluice-smg.XXXXXX)
source loadtests/bench/lib.sh

sluice() { # NAME POLICY PORT [BINARY]
    "${4:-$SLUICE_BIN}" serve --policy "$2" --model "$MODEL" --listen "127.0.0.1:$3" \
        --certs-dir "$SCRATCH/certs" --plain-http >"$SCRATCH/$1.log" 2>&1 &
    PIDS+=($!)
}

smg() { # NAME PORT UPSTREAM_PORT [FLAGS...]   (its metrics on PORT + 2000)
    "$SMG_DIR/bin/smg" launch --host 127.0.0.1 --port "$2" --prometheus-host 127.0.0.1 \
        --prometheus-port $(($2 + 2000)) \
        --worker-urls "http://127.0.0.1:$3" --backend openai --policy round_robin --log-level warn "${@:4}" \
        >"$SCRATCH/$1.log" 2>&1 &
    PIDS+=($!)
}

# SMG as shipped (its default retries and circuit breaker), with a cap of 4 where Sluice has one;
# its log at warn (at info it logs every request).
OVERHEAD_TARGETS=(direct sluice smg)
if part overhead; then
    "$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_UP 2>"$SCRATCH/up.log" &
    PIDS+=($!)
    policy "$SCRATCH/open.toml" 256 1024 $P_UP 10s
    sluice sluice "$SCRATCH/open.toml" $P_SLUICE
    smg smg $P_SMG $P_UP
    wait_up http://127.0.0.1:$P_UP/healthz
    wait_up http://127.0.0.1:$P_SLUICE/readyz
    wait_up http://127.0.0.1:$P_SMG/health
    if [[ -n ${SLUICE_B:-} ]]; then
        sluice sluice-b "$SCRATCH/open.toml" $P_SLUICE_B "$SLUICE_B"
        wait_up http://127.0.0.1:$P_SLUICE_B/readyz
        OVERHEAD_TARGETS=(direct sluice sluice-b smg)
    fi
fi
if part cap; then
    "$BIN/sluice-engine" serve --ranks 1 --threads 2 --model "$MODEL" \
        --model-id SmolLM2-135M-Instruct --listen 127.0.0.1:$P_ENG >"$SCRATCH/engine.log" 2>&1 &
    PIDS+=($!)
    policy "$SCRATCH/cap.toml" 4 16 $P_ENG 10s
    sluice sluice-cap "$SCRATCH/cap.toml" $P_SLUICE_CAP
    smg smg-cap $P_SMG_CAP $P_ENG --max-concurrent-requests 4 --queue-size 16 --queue-timeout-secs 10
    wait_up http://127.0.0.1:$P_ENG/health
    wait_up http://127.0.0.1:$P_SLUICE_CAP/readyz
    wait_up http://127.0.0.1:$P_SMG_CAP/health
fi
if part busy; then
    "$BIN/examples/instant_upstream" --listen 127.0.0.1:$P_BUSY --busy 2>"$SCRATCH/busy.log" &
    PIDS+=($!)
    policy "$SCRATCH/busy.toml" 4 16 $P_BUSY 10s
    sluice sluice-busy "$SCRATCH/busy.toml" $P_SLUICE_BUSY
    smg smg-busy $P_SMG_BUSY $P_BUSY
    wait_up http://127.0.0.1:$P_SLUICE_BUSY/readyz
    wait_up http://127.0.0.1:$P_SMG_BUSY/health
fi
sleep 2
RESULTS=$SCRATCH/results.txt
CLIENT=("$BIN/examples/rate_bench")
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
    "sluice $(git rev-parse --short HEAD), sglang-router $SMG_VERSION" >&2

declare -A URL=([direct]=http://127.0.0.1:$P_UP [sluice]=http://127.0.0.1:$P_SLUICE
    [sluice-b]=http://127.0.0.1:$P_SLUICE_B [smg]=http://127.0.0.1:$P_SMG)
declare -A CAP=([direct]=http://127.0.0.1:$P_ENG [sluice]=http://127.0.0.1:$P_SLUICE_CAP
    [smg]=http://127.0.0.1:$P_SMG_CAP)
declare -A BUSY=([sluice]=http://127.0.0.1:$P_SLUICE_BUSY [smg]=http://127.0.0.1:$P_SMG_BUSY)

# The engine's running count every 50 ms while a run goes on: prints the peak.
peak_running() { # PIDFILE-TO-WATCH
    local peak=0 v
    while kill -0 "$1" 2>/dev/null; do
        v=$(curl -s --max-time 1 http://127.0.0.1:$P_ENG/metrics |
            awk '/^vllm:num_requests_running/ {s += $NF} END {print s + 0}')
        awk -v a="$v" -v b="$peak" 'BEGIN {exit !(a > b)}' && peak=$v
        sleep 0.05
    done
    echo "$peak"
}

# What 4 slots serve: one closed-loop run at concurrency 4 straight to the engine.
if part cap; then
    "${CLIENT[@]}" --label "0:capacity" --url "${CAP[direct]}" --mode max --duration "$DURATION" \
        --warmup 2 --concurrency 4 --model SmolLM2-135M-Instruct --max-tokens 16 >>"$RESULTS"
    CAPACITY=$(awk -F'achieved=' '/label=0:capacity/ {split($2, a, " "); print a[1]}' "$RESULTS")
    OFFERED=$(awk -v c="$CAPACITY" 'BEGIN {printf "%.0f", c * 10}')
    echo "# 4 slots serve $CAPACITY req/s: offering $OFFERED req/s (10x)" >&2
fi

for rep in $(seq "$REPEATS"); do
    echo "# repeat $rep/$REPEATS, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for rate in 100 1000; do
        part overhead || break
        targets=("${OVERHEAD_TARGETS[@]}")
        # With two builds, every other repeat runs the second first, so drift hits both alike.
        ((rep % 2 == 0)) && [[ -n ${SLUICE_B:-} ]] && targets=(direct sluice-b sluice smg)
        for t in "${targets[@]}"; do
            "${CLIENT[@]}" --label "$rep:overhead-$rate-$t" --url "${URL[$t]}" --mode rate \
                --rate "$rate" --duration "$DURATION" --warmup "$WARMUP" --connections 64 >>"$RESULTS"
        done
    done
    for t in direct sluice smg; do
        part cap || break
        "${CLIENT[@]}" --label "$rep:cap-$t" --url "${CAP[$t]}" --mode rate --rate "$OFFERED" \
            --duration "$DURATION" --warmup 0 --connections 256 --timeout-ms 60000 \
            --model SmolLM2-135M-Instruct --max-tokens 16 >>"$RESULTS" &
        load=$!
        peak=$(peak_running "$load")
        wait "$load" || true
        echo "label=$rep:cap-$t engine_peak=$peak" >>"$RESULTS"
        # Let the engine drain before the next target.
        for _ in $(seq 600); do
            [[ $(curl -s http://127.0.0.1:$P_ENG/metrics | awk '/^vllm:num_requests_running/ {s += $NF} END {print s + 0}') == 0 ]] && break
            sleep 0.1
        done
    done
    for t in sluice smg; do
        part busy || break
        before=$(curl -s http://127.0.0.1:$P_BUSY/attempts)
        "${CLIENT[@]}" --label "$rep:busy-$t" --url "${BUSY[$t]}" --mode rate --rate 10 \
            --duration "$DURATION" --warmup 0 --connections 16 --timeout-ms 60000 >>"$RESULTS"
        after=$(curl -s http://127.0.0.1:$P_BUSY/attempts)
        echo "label=$rep:busy-$t upstream_attempts=$((after - before))" >>"$RESULTS"
    done
done
cp "$RESULTS" "${RESULTS_COPY:-/tmp/sluice-smg-results.txt}"
for name in sluice sluice-b sluice-cap sluice-busy smg smg-cap smg-busy; do
    [[ -f $SCRATCH/$name.log ]] || continue
    echo "# $name log: $(wc -l <"$SCRATCH/$name.log") lines, $(grep -ci 'panick' "$SCRATCH/$name.log" || true) panics" >&2
done

python3 - "$RESULTS" <<'PY'
import statistics as st
import sys

runs = {}  # label -> repeat -> {key: value}
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    rep, label = kv.pop("label").split(":", 1)
    runs.setdefault(label, {}).setdefault(rep, {}).update(kv)

def med(label, key):
    vals = [float(r[key]) for r in runs.get(label, {}).values() if key in r]
    return st.median(vals) if vals else float("nan")

def added(rate, t, key):
    base = runs.get(f"overhead-{rate}-direct", {})
    d = [float(r[key]) - float(base[k][key])
         for k, r in runs.get(f"overhead-{rate}-{t}", {}).items() if k in base]
    return st.median(d) if d else float("nan")

def statuses(label):
    out = {}
    for r in runs.get(label, {}).values():
        for s in r.get("statuses", "").split(","):
            if ":" in s:
                code, n = s.split(":")
                out.setdefault(code, []).append(int(n))
    return " ".join(f"{c}: {st.median(v):.0f}" for c, v in sorted(out.items()))

n = len(runs.get("overhead-100-direct", {}))
print(f"\nmedians of {n} repeat(s); latency in ms from the scheduled send to the last byte\n")
print("| path | rate | p50 | p99 | added p50 | added p99 |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for rate in (100, 1000):
    for t in ("direct", "sluice", "sluice-b", "smg"):
        lab = f"overhead-{rate}-{t}"
        if lab not in runs:
            continue
        a50 = "—" if t == "direct" else f"{added(rate, t, 'p50'):+.3f}"
        a99 = "—" if t == "direct" else f"{added(rate, t, 'p99'):+.3f}"
        print(f"| {t} | {rate}/s | {med(lab, 'p50'):.3f} | {med(lab, 'p99'):.3f} | {a50} | {a99} |")
if "cap-direct" not in runs:
    sys.exit()
print(f"\ncap of 4 in front of the real engine, offered 10x (capacity {med('capacity', 'achieved'):.1f} req/s)\n")
print("| path | engine peak running | statuses (median count) | 503 p50 | 503 p99 | 200 p99 | other p99 |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for t in ("direct", "sluice", "smg"):
    lab = f"cap-{t}"
    others = [k[1:-4] for r in runs.get(lab, {}).values() for k in r
              if k.startswith("s") and k.endswith("_p99") and k[1:-4].isdigit()
              and k[1:-4] not in ("200", "503")]
    other = ", ".join(f"{c}: {med(lab, f's{c}_p99'):.0f}" for c in sorted(set(others))) or "—"
    print(f"| {t} | {med(lab, 'engine_peak'):.0f} | {statuses(lab)} | {med(lab, 's503_p50'):.1f} "
          f"| {med(lab, 's503_p99'):.1f} | {med(lab, 's200_p99'):.0f} | {other} |")
if "busy-sluice" not in runs:
    sys.exit()
print("\nan upstream answering every completion with vLLM's 503, 10 req/s\n")
print("| path | client statuses | upstream attempts per client request |")
print("| --- | --- | ---: |")
for t in ("sluice", "smg"):
    lab = f"busy-{t}"
    count = med(lab, "count")
    print(f"| {t} | {statuses(lab)} | {med(lab, 'upstream_attempts') / count:.2f} |")
PY
