#!/usr/bin/env python3
"""Summarises loadtests/bench/long-chunks.sh: per K and round, the long prompts' TTFT alone and
the short prompts' TTFT beside back-to-back 4K prefills (markdown table on stdout).

    python3 loadtests/bench/long-chunks-report.py OUT_DIR
"""
import json
import re
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("alone-*-*-*.json")) + sorted(out.glob("beside-*-*-*.json")):
    m = re.fullmatch(r"(alone-\d+|beside-long|beside-short)-(\d+)-(\d+)\.json", f.name)
    if not m:
        continue
    run, k, rnd = m.group(1), int(m.group(2)), int(m.group(3))
    d = json.loads(f.read_text())
    ok = [s["ttft_s"] for s in d["samples"] if s["outcome"] == "ok"]
    rows.setdefault((k, rnd), {})[run] = (ok, d["requests"])

print("| K | round | 4096 alone TTFT (s) | 8192 alone TTFT (s) | 4K back to back: served | "
      "short beside: served, TTFT p50 / p95 / max (s) |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for (k, rnd), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    med = lambda run: f"{statistics.median(r[run][0]):.2f}" if r.get(run, ([], 0))[0] else "–"
    short, n = r.get("beside-short", ([], 0))
    short = sorted(short)
    p = lambda q: short[min(len(short) - 1, int(round(q * (len(short) - 1))))] if short else float("nan")
    long_ok, _ = r.get("beside-long", ([], 0))
    print(f"| {k} | {rnd} | {med('alone-4096')} | {med('alone-8192')} | {len(long_ok)} | "
          f"{len(short)} of {n}, {p(0.5):.2f} / {p(0.95):.2f} / {short[-1] if short else float('nan'):.2f} |")
