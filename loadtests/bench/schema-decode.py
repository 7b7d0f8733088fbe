#!/usr/bin/env python3
"""Decode with and without a JSON schema at batch 1 and 8 (issue 21, item 1): what the grammar
mask costs. Results: docs/performance.md, "Structured outputs".

    loadtests/bench/schema-decode.py HOST:PORT [REPEATS]     (default 3)

`BATCH` chat requests streamed at once, 128 output tokens each: without a schema `ignore_eos`;
with one a schema whose shortest answer is longer than 128 tokens (at least 60 objects of a
string and an integer), so every token is constrained. Per-sequence rate = tokens after the first
/ time from the first to the last; aggregate = all tokens / wall time. Prints one line per run
and the medians. Standard library only.
"""

import http.client
import json
import statistics
import sys
import threading
import time

TOKENS = 128
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 60,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "n": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "n"],
            },
        }
    },
    "required": ["items"],
}


def stream(addr, body, out):
    """One streamed request: (first token time, last token time, tokens)."""
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json"})
    resp = conn.getresponse()
    first = last = None
    tokens = 0
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            tokens = v["usage"]["completion_tokens"]
        if any(c.get("delta", {}).get("content") for c in v.get("choices", [])):
            last = time.monotonic()
            first = first or last
    out.append((first, last, tokens))


def run(addr, batch, schema, i):
    body = {
        "messages": [{"role": "user", "content": f"List things, as JSON ({i})."}],
        "max_tokens": TOKENS,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if schema:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "list", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    out = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=stream, args=(addr, dict(body, seed=i * 100 + k), out))
               for k in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    per_seq = statistics.mean((n - 1) / (b - a) for a, b, n in out if n > 1 and b > a)
    total = sum(n for _, _, n in out)
    return per_seq, total / wall, min(n for _, _, n in out)


def main():
    addr = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    run(addr, 1, True, 0)  # warm up (the first compile, the first pages)
    results = {}
    for r in range(repeats):
        for batch in (1, 8):
            for schema in (False, True):
                per_seq, agg, shortest = run(addr, batch, schema, 1 + r)
                results.setdefault((batch, schema), []).append((per_seq, agg))
                print(f"batch {batch} {'json_schema' if schema else 'none':11} "
                      f"per-seq {per_seq:6.1f} tok/s  aggregate {agg:6.1f} tok/s  "
                      f"shortest {shortest}", flush=True)
    print("medians:")
    for batch in (1, 8):
        base = None
        for schema in (False, True):
            rs = results[(batch, schema)]
            p = statistics.median(x for x, _ in rs)
            a = statistics.median(y for _, y in rs)
            rel = "" if base is None else f"  ({(p / base[0] - 1) * 100:+.1f}% per-seq, " \
                f"{(a / base[1] - 1) * 100:+.1f}% aggregate)"
            base = base or (p, a)
            print(f"batch {batch} {'json_schema' if schema else 'none':11} per-seq {p:6.1f} "
                  f"aggregate {a:6.1f}{rel}")


if __name__ == "__main__":
    main()
