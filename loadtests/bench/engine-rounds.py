#!/usr/bin/env python3
"""Ratios of `engine-vs-llama-bench.sh` runs taken in rounds, and their medians.

    loadtests/bench/engine-rounds.py DIR [DIR ...]

Each DIR holds one round's `<level>-engine.txt` and `<level>-llama.txt`. On these shared
2-vCPU VMs one round can read 1.5x slower than the next for both peers (or for one only, when
the noise shifts between the engine's minutes and llama.cpp's), so the figure to quote is the
median over rounds of each round's own ratio.
"""
import re
import statistics
import sys
from pathlib import Path


def engine(text):
    out = {}
    for n, secs in re.findall(r"prefill pp(\d+): [\d.]+ tok/s \(([\d.]+) s\)", text):
        out[f"pp{n}"] = int(n) / float(secs)
        out[f"pp{n}_s"] = float(secs)
    for b, rate in re.findall(r"decode tg\d+ batch (\d+): ([\d.]+) tok/s", text):
        out[f"b{b}"] = float(rate)
    return out


def llama(text):
    out = {}
    # llama-batched-bench's rows: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s |
    batched = r"^\|\s+\d+\s+\|\s+\d+\s+\|\s+(\d+)\s+\|(?:[^|]+\|){4}\s+([\d.]+)"
    for b, rate in re.findall(batched, text, re.M):
        out[f"batched_b{b}"] = float(rate)
    for test, rate in re.findall(r"\|\s+(pp\d+|tg\d+)\s+\|\s+([\d.]+)", text):
        key = "b1" if test.startswith("tg") else test
        out[key] = float(rate)
        if test.startswith("pp"):
            out[f"{test}_s"] = int(test[2:]) / float(rate)
    return out


def main():
    rows = {}
    for d in map(Path, sys.argv[1:]):
        for f in sorted(d.glob("*-engine.txt")):
            level = f.name.removesuffix("-engine.txt")
            e = engine(f.read_text())
            l = llama((d / f"{level}-llama.txt").read_text())
            if not all(k in e and k in l for k in ("pp512", "pp4096", "pp8192", "b1")):
                print(f"{d}: {level} incomplete, left out", file=sys.stderr)
                continue
            r = {k: e[k] / l[k] for k in ("pp512", "pp4096", "pp8192", "b1")}
            r["b8/b1"] = e["b8"] / e["b1"]
            r["8K/4K"] = e["pp8192_s"] / e["pp4096_s"]
            r["8K/4K llama"] = l["pp8192_s"] / l["pp4096_s"]
            if "batched_b1" in l and "batched_b8" in l:
                # llama.cpp's own batch scaling, and the engine's batch 8 against llama.cpp's.
                r["b8/b1 llama"] = l["batched_b8"] / l["batched_b1"]
                r["b8"] = e["b8"] / l["batched_b8"]
            rows.setdefault(level, []).append((d, r))
    for level, runs in rows.items():
        keys = [k for k in runs[0][1] if all(k in r for _, r in runs)]
        print(f"{level}: {len(runs)} rounds")
        print("round".ljust(58) + "".join(k.rjust(13) for k in keys))
        for d, r in runs:
            print(str(d)[-58:].ljust(58) + "".join(f"{r[k]:13.2f}" for k in keys))
        med = {k: statistics.median(r[k] for _, r in runs) for k in keys}
        print("median".ljust(58) + "".join(f"{med[k]:13.2f}" for k in keys))


if __name__ == "__main__":
    main()
