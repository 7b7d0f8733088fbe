#!/usr/bin/env python3
"""Decode with and without a JSON schema, as schema-decode.py (the same requests), but per
token: the median gap between streamed tokens, over every token of every run, at batch 1 and 8.
A load spike moves a per-request rate; it moves the median gap less (issue 21, the mask overlap).

    loadtests/bench/schema-gaps.py HOST:PORT ROUNDS
"""
import http.client
import importlib.util
import json
import os
import statistics as st
import sys
import threading
import time

spec = importlib.util.spec_from_file_location(
    "sd", os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema-decode.py"))
sd = importlib.util.module_from_spec(spec); spec.loader.exec_module(sd)

def stream(addr, body, out):
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    ts = []
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        v = json.loads(line[6:])
        if any(c.get("delta", {}).get("content") for c in v.get("choices", [])):
            ts.append(time.monotonic())
    out.append(ts)

def run(addr, batch, schema, i):
    body = {"messages": [{"role": "user", "content": f"List things, as JSON ({i})."}],
            "max_tokens": sd.TOKENS, "temperature": 0.8, "seed": i, "stream": True}
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "list", "schema": sd.SCHEMA}}
    else:
        body["ignore_eos"] = True
    out = []
    th = [threading.Thread(target=stream, args=(addr, dict(body, seed=i * 100 + k), out)) for k in range(batch)]
    [t.start() for t in th]; [t.join() for t in th]
    return [b - a for ts in out for a, b in zip(ts, ts[1:])]

addr, rounds = sys.argv[1], int(sys.argv[2])
run(addr, 1, True, 0)
g = {}
for r in range(rounds):
    for batch in (1, 8):
        for schema in (False, True):
            g.setdefault((batch, schema), []).extend(run(addr, batch, schema, r + 1))
for batch in (1, 8):
    a, b = st.median(g[(batch, False)]), st.median(g[(batch, True)])
    print(f"gaps batch {batch}: none {a*1000:.2f} ms ({1/a:.1f} tok/s)  schema {b*1000:.2f} ms ({1/b:.1f} tok/s)  "
          f"{(a/b-1)*100:+.1f}% rate  n={len(g[(batch, False)])}/{len(g[(batch, True)])}", flush=True)
