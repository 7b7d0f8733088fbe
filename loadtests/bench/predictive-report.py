#!/usr/bin/env python3
"""Issue 23, item 5: the three setups' figures from predictive-admission.sh's JSON files.

Per setup and rate: SLO goodput (requests whose arrival -> first token met the interactive
deadline, $DEADLINE s, default 5, per second of the scheduled run: the JSON's `duration_s`, or
$DUR for files written before sluice-load recorded it), the share that waited and then failed (a failure after more than 1 s),
of them the ones refused (`deadline_unmeetable`) after waiting and the `queue_timeout`s, the share refused at once, TTFT p95 (arrival -> first token, successes; also by request kind:
256:128, 4k:128, 8k:128), and for the gateway
the prediction error over the run's admitted streams (from /ui/stats). Writes a markdown table
on stdout and an SVG of goodput against arrival rate.

    python3 loadtests/bench/predictive-report.py loadtests/results/predictive [out.svg]
    DUR=90s DEADLINE=30 python3 loadtests/bench/predictive-report.py loadtests/results/predictive-agree

Tests: python3 -m doctest loadtests/bench/predictive-report.py
"""
import json
import os
import sys
from pathlib import Path

DEADLINE = float(os.environ.get("DEADLINE", "5"))
SETUPS = [("engine", "(a) no gateway", "#888888"), ("count", "(b) count-based", "#d98e04"),
          ("predictive", "(c) predictive", "#2f6fde")]


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[max(0, -(-len(xs) * p // 100) - 1)]


def seconds(text):
    """A duration as predictive-admission.sh's DUR takes it.

    >>> [seconds(d) for d in ("90s", "40", "1500ms", "5m")]
    [90.0, 40.0, 1.5, 300.0]
    """
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def scheduled_s(run, name="run"):
    """The span the run's arrivals were scheduled over: its `duration_s`, else $DUR.

    >>> scheduled_s({"duration_s": 90.0, "samples": [{"arrival_s": 83.7}]})
    90.0
    """
    dur = run.get("duration_s")
    if dur is None:
        if "DUR" not in os.environ:
            sys.exit(f"{name}: no duration_s; set DUR to the run's --duration (e.g. DUR=90s)")
        dur = seconds(os.environ["DUR"])
    last = max((s["arrival_s"] for s in run["samples"]), default=0.0)
    if last >= dur:
        sys.exit(f"{name}: an arrival at {last:.1f} s, past the {dur:g} s scheduled: wrong DUR?")
    return dur


def figures(run, stats, name="run"):
    """One run's figures.

    >>> ok = lambda t: {"kind": "256:128", "arrival_s": t, "sent_s": t, "outcome": "ok",
    ...                 "ttft_s": 1.0, "arrival_to_end_s": 2.0}
    >>> run = {"wall_s": 95.0, "duration_s": 90.0, "samples": [ok(0.0), ok(30.0), ok(60.0)]}
    >>> round(figures(run, None)["goodput"], 4)  # 3 met in the 90 s scheduled
    0.0333
    """
    samples = run["samples"]
    wall = max(run["wall_s"], 1e-9)
    # Goodput per second of the scheduled run, the same span for every setup at a rate: the
    # wall time would favour a setup that refuses the slow requests' drain, and the last
    # arrival falls short of the schedule by chance (at 83.7 s of 90 s: goodput 7.5% high).
    span = scheduled_s(run, name)
    first = []
    by_kind = {}
    met = waited_failed = refused = waited_refused = timeouts = 0
    for s in samples:
        ok = s["outcome"] == "ok"
        if ok and s["ttft_s"] is not None:
            t = s["sent_s"] - s["arrival_s"] + s["ttft_s"]
            first.append(t)
            by_kind.setdefault(s["kind"], []).append(t)
            met += t <= DEADLINE
        elif not ok:
            if s["arrival_to_end_s"] > 1.0:
                waited_failed += 1
                waited_refused += "deadline_unmeetable" in s["outcome"]
                timeouts += "queue_timeout" in s["outcome"]
            else:
                refused += 1
    n = len(samples)
    err = None
    if stats:
        pts = [p for p in stats["prediction"]["points"] if p["ago"] <= wall + 5]
        rel = sorted((p["predicted"] - p["actual"]) / max(p["actual"], 1e-3) for p in pts)
        if rel:
            err = (rel[len(rel) // 2], len(rel),
                   sum(abs(r) <= 0.25 for r in rel) / len(rel))
    return {
        "n": n, "goodput": met / span, "waited_failed": waited_failed / max(n, 1),
        "waited_refused": waited_refused, "timeouts": timeouts,
        "refused": refused / max(n, 1), "ttft_p95": pct(first, 95), "err": err,
        "ttft_p95_by_kind": {k: pct(v, 95) for k, v in sorted(by_kind.items())},
        "outcomes": run.get("outcomes", {}),
    }


def svg(rows, path):
    W, H, L, B = 520, 300, 50, 40
    rates = sorted({r for (_, r) in rows})
    top = max([f["goodput"] for f in rows.values()] + [0.1]) * 1.15
    x = lambda r: L + (r - rates[0]) / max(rates[-1] - rates[0], 1e-9) * (W - L - 20)
    y = lambda g: H - B - g / top * (H - B - 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-10}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{W/2}" y="{H-8}" text-anchor="middle">arrival rate (req/s, Poisson, seed mix)</text>',
           f'<text x="12" y="{H/2}" transform="rotate(-90 12 {H/2})" text-anchor="middle">SLO goodput (req/s, TTFT ≤ {DEADLINE:g} s)</text>']
    for r in rates:
        out.append(f'<text x="{x(r):.1f}" y="{H-B+14}" text-anchor="middle">{r:g}</text>')
    for i in range(5):
        g = top * i / 4
        out.append(f'<text x="{L-4}" y="{y(g)+4:.1f}" text-anchor="end">{g:.2f}</text>')
    for k, (key, label, color) in enumerate(SETUPS):
        pts = [(r, rows[(key, r)]["goodput"]) for r in rates if (key, r) in rows]
        if not pts:
            continue
        d = " ".join(f"{x(r):.1f},{y(g):.1f}" for r, g in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r, g in pts:
            out.append(f'<circle cx="{x(r):.1f}" cy="{y(g):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{L+10}" y="{30+14*k}" fill="{color}">{label}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")


def main():
    d = Path(sys.argv[1])
    rows = {}
    for key, _, _ in SETUPS:
        for f in sorted(d.glob(f"{key}-*.json")):
            if f.name.endswith(".stats.json") or f.stat().st_size == 0:
                continue  # a run still going writes its JSON at the end
            rate = float(f.stem.split("-", 1)[1])
            st = f.with_name(f"{f.stem}.stats.json")
            stats = json.loads(st.read_text()) if st.exists() else None
            rows[(key, rate)] = figures(json.loads(f.read_text()), stats, f.name)
    print("| setup | rate (req/s) | requests | SLO goodput (req/s) | waited then failed | of which refused after waiting, queue timeouts | refused at once | TTFT p95 (s) | TTFT p95 by request kind (s) | prediction error: median, within ±25% |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---|---|")
    for key, label, _ in SETUPS:
        for (k, r), f in sorted(rows.items()):
            if k != key:
                continue
            e = f["err"]
            es = "—" if e is None else f"{100*e[0]:+.0f}% ({e[1]} streams), {100*e[2]:.0f}%"
            p95 = "—" if f["ttft_p95"] is None else f"{f['ttft_p95']:.2f}"
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in f["ttft_p95_by_kind"].items()) or "—"
            print(f"| {label} | {r:g} | {f['n']} | {f['goodput']:.3f} | {100*f['waited_failed']:.0f}% | {f['waited_refused']}, {f['timeouts']} | {100*f['refused']:.0f}% | {p95} | {kinds} | {es} |")
    svg(rows, sys.argv[2] if len(sys.argv) > 2 else d / "goodput.svg")


if __name__ == "__main__":
    main()
