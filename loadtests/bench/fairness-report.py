#!/usr/bin/env python3
"""The short tenant's TTFT alone and beside the long tenant, from loadtests/bench/fairness.sh.

    python3 loadtests/bench/fairness-report.py OUT_DIR

One table row per run and tenant (served, refused and why, TTFT p50 / p95 of those served, and
how many of them waited in the gateway's queue for a slot: the TTFT of those that did not is the
engine's alone), then the short tenant's TTFT p95 beside against alone, by round and by the median
of the rounds.
"""
import glob
import json
import os
import re
import statistics
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, -(-len(xs) * p // 100) - 1)] if xs else float("nan")


def main(out):
    rows, p95 = [], {}
    for path in sorted(glob.glob(os.path.join(out, "*-*-*.json"))):
        m = re.match(r"(alone|beside)-(\d+)-(short|long)\.json", os.path.basename(path))
        if not m:
            continue
        run, rnd, tenant = m.group(1), int(m.group(2)), m.group(3)
        d = json.load(open(path))
        served = [s for s in d["samples"] if s["outcome"] == "ok"]
        ttft = [s["ttft_s"] for s in served]
        queued = [s["queue_ms"] / 1000 for s in served if s["queue_ms"]]
        unqueued = [s["ttft_s"] for s in served if not s["queue_ms"]]
        refused = {k: v for k, v in d["outcomes"].items() if k != "ok"}
        rows.append((rnd, run, tenant, d["requests"], len(ttft), refused, pct(ttft, 50), pct(ttft, 95),
                     queued, unqueued))
        if tenant == "short":
            p95[(rnd, run)] = pct(ttft, 95)
    print("| round | run | tenant | requests | served | not served | TTFT p50 / p95 (s) "
          "| queued for a slot: n, max wait (s) | not queued: TTFT p50 / max (s) |")
    print("| ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for rnd, run, tenant, n, ok, refused, p50, p95v, queued, unqueued in sorted(rows):
        why = ", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "–"
        waits = f"{len(queued)}, {max(queued):.2f}" if queued else "0"
        alone = f"{pct(unqueued, 50):.2f} / {max(unqueued):.2f}" if unqueued else "–"
        print(f"| {rnd} | {run} | {tenant} | {n} | {ok} | {why} | {p50:.2f} / {p95v:.2f} "
              f"| {waits} | {alone} |")
    ratios = []
    for rnd in sorted({r for r, _ in p95}):
        if (rnd, "alone") in p95 and (rnd, "beside") in p95:
            ratio = p95[(rnd, "beside")] / p95[(rnd, "alone")]
            ratios.append(ratio)
            print(f"\nround {rnd}: short TTFT p95 beside / alone = "
                  f"{p95[(rnd, 'beside')]:.2f} / {p95[(rnd, 'alone')]:.2f} s = {ratio:.2f}x")
    if ratios:
        print(f"\nmedian of the rounds: {statistics.median(ratios):.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "loadtests/results/fairness")
