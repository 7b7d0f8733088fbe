//! JSON: one object per scenario with its aggregate (seconds) and, on request, every sample.

use serde_json::{json, Value};

use super::Entry;
use crate::stats::{Score, Summary};
use crate::workload::{Record, Workload};

fn summary(s: &Summary) -> Value {
    json!({"p50": s.p50, "p95": s.p95, "mean": s.mean, "count": s.count})
}

fn score(s: &Score) -> Value {
    json!({"passed": s.passed, "checked": s.checked})
}

/// One request: when it arrived and was sent (s after the start), how it ended, its timings.
pub fn sample_json(r: &Record) -> Value {
    let s = &r.sample;
    let secs = |d: std::time::Duration| d.as_secs_f64();
    let mut v = json!({
        "kind": r.kind,
        "arrival_s": secs(r.arrival),
        "sent_s": secs(r.sent),
        "outcome": s.outcome.label(),
        "ttft_s": s.ttft.map(secs),
        "e2e_s": secs(s.e2e),
        "arrival_to_end_s": secs(r.arrival_to_end()),
        "completion_tokens": s.tokens(),
        "prompt_tokens": s.prompt_tokens,
        "queue_ms": s.queue_ms,
        "retries": s.retries,
        "passed": r.passed,
    });
    if !s.outcome.is_ok() {
        v["message"] = s.outcome.message().into();
    }
    v
}

/// A scenario's aggregate (the fields later checks read: `success`, `requests`,
/// `output_tok_s`, `ttft_p50`, `ttft_p95`, `e2e_p50`, `e2e_p95`, in seconds; `duration_s`, the
/// scheduled duration or null), with every sample when `samples`.
pub fn entry_json(e: &Entry, samples: bool) -> Value {
    let s = &e.stats;
    let (mode, rate) = match e.workload {
        Workload::Closed { .. } => ("closed", None),
        Workload::Open { arrivals, .. } => (
            match arrivals {
                crate::workload::Arrivals::Fixed(_) => "open-fixed",
                crate::workload::Arrivals::Poisson(_) => "open-poisson",
            },
            Some(arrivals.rate()),
        ),
    };
    let mut v = json!({
        "target": e.target,
        "scenario": e.id,
        "title": e.title,
        "series": e.series,
        "workload": mode,
        "concurrency": e.workload.concurrency(),
        "rate": rate,
        "requests": s.total,
        "success": s.succeeded,
        "failed": s.total - s.succeeded,
        "outcomes": s.outcomes,
        "retried": s.retried,
        "failure_examples": s.failure_examples,
        "wall_s": s.wall.as_secs_f64(),
        // The scheduled span (`--duration`), so that rates per second of arrivals need not
        // guess it from the last arrival.
        "duration_s": e.run.duration.map(|d| d.as_secs_f64()),
        "completion_tokens": s.completion_tokens,
        "usage_reported": s.usage_reported,
        "prompt_tokens_mean": s.prompt_tokens_mean,
        "output_tok_s": s.output_tok_per_s(),
        "requests_per_s": s.requests_per_s(),
        "ttft_p50": s.ttft.p50,
        "ttft_p95": s.ttft.p95,
        "e2e_p50": s.e2e.p50,
        "e2e_p95": s.e2e.p95,
        "sent_to_end_p95": s.e2e.p95,
        "arrival_to_end_p95": s.arrival_to_end.p95,
        "arrival_to_first_p95": s.arrival_to_first.p95,
        "queue_p50": s.queue.p50,
        "queue_p95": s.queue.p95,
        "tpot_p50": s.tpot.p50,
        "ttft": summary(&s.ttft),
        "e2e": summary(&s.e2e),
        "arrival_to_end": summary(&s.arrival_to_end),
        "tpot": summary(&s.tpot),
        "queue": summary(&s.queue),
        "score": s.score.as_ref().map(score),
        "score_by_kind": s.score_by_kind.iter().map(|(k, sc)| (k.clone(), score(sc))).collect::<serde_json::Map<_, _>>(),
    });
    if samples {
        v["samples"] = e.run.records.iter().map(sample_json).collect();
    }
    v
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::ScenarioStats;
    use crate::workload::{Arrivals, Run};

    #[test]
    fn open_loops_record_their_scheduled_duration() {
        let entry = |duration| Entry {
            target: "gateway".into(),
            id: "seedmix".into(),
            title: "SeedMix".into(),
            series: "seed-mix".into(),
            workload: Workload::Open {
                arrivals: Arrivals::Poisson(0.4),
                concurrency: 64,
            },
            stats: ScenarioStats::default(),
            run: Run {
                records: Vec::new(),
                wall: Duration::from_secs(102),
                duration,
            },
        };
        // 90 s scheduled: per second of arrivals is per 90 s, wherever the last one fell.
        let v = entry_json(&entry(Some(Duration::from_secs(90))), false);
        assert_eq!(v["duration_s"], 90.0);
        // Bounded by a count only: no duration.
        assert!(entry_json(&entry(None), false)["duration_s"].is_null());
    }
}
