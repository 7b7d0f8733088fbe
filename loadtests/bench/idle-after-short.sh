#!/bin/bash
# A long prompt on an idle upstream right after short traffic (docs/capacity.md, "A per-token term
# beside decodes"): the gateway under its default policy in front of the bundled engine it
# starts; 60 s of the seed's mix at 0.5 req/s, 60 s of 256:128 at C=3, then a streamed ~7,800-
# token prompt at once and 50 s later. Each answer's status, x-sluice-predicted-ttft-ms,
# Retry-After (or refusal) and time to first token go to 8k-{now,later}.txt; the cost model's
# parameters to stats-*.json.
#
#   loadtests/bench/idle-after-short.sh BIN_DIR OUT_DIR
set -u
cd "$(dirname "$0")/../.."
BIN=$1; OUT=$2; mkdir -p $OUT
cat > $OUT/policy.toml <<TOML
[server]
listen = "127.0.0.1:18631"
open = true
TOML
$BIN/sluice serve --policy $OUT/policy.toml --plain-http > $OUT/gateway.log 2>&1 &
GW=$!
for i in $(seq 60); do curl -sf http://127.0.0.1:18631/readyz >/dev/null && break; sleep 1; done
U=http://127.0.0.1:18631
target/release/sluice-load run --url $U --workload seed-mix --rate 0.5 --poisson --duration 60s --seed 20261205 > $OUT/mix.txt 2>&1
target/release/sluice-load run --url $U --shape 256:128 --concurrency 3 --duration 60s --seed 20261205 > $OUT/short.txt 2>&1
curl -s $U/ui/stats > $OUT/stats-after-load.json
long() { python3 -c "import json; print(json.dumps({'messages':[{'role':'user','content':'$1 '+('the quick brown fox jumps over the lazy dog and keeps running through the field ')*520}],'max_tokens':1,'stream':True}))"; }
for t in now later; do
  [ $t = later ] && sleep 50
  long $t-$RANDOM > $OUT/long-$t.json
  python3 - $OUT/long-$t.json > $OUT/8k-$t.txt <<'PY'
import http.client, json, sys, time
body = open(sys.argv[1]).read()
c = http.client.HTTPConnection("127.0.0.1", 18631, timeout=300)
t0 = time.time()
c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
r = c.getresponse()
print("status", r.status, "predicted-ms", r.getheader("x-sluice-predicted-ttft-ms"), "retry-after", r.getheader("retry-after"))
if r.status != 200:
    print(r.read().decode()[:400]); sys.exit()
for line in r:
    if line.startswith(b"data:") and b'"content"' in line and b'"content":""' not in line:
        print("first token after %.2f s" % (time.time() - t0)); break
PY
done
curl -s $U/ui/stats > $OUT/stats-end.json
kill $GW; wait $GW 2>/dev/null
