//! Output: a human-readable table (one row per level) or one JSON object per level.

use serde_json::{json, Value};

use crate::stats::{LevelStats, Summary};

/// Latency in ms: whole milliseconds from 100 up, one decimal below; `-` for none.
fn ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

const COLUMNS: [(&str, usize); 12] = [
    ("shape", 9),
    ("conc", 4),
    ("ok/total", 8),
    ("out tok/s", 9),
    ("req/s", 6),
    ("TTFT p50", 8),
    ("TTFT p95", 8),
    ("E2E p50", 8),
    ("E2E p95", 8),
    ("TPOT p50", 8),
    ("queue p50", 9),
    ("queue p95", 9),
];

fn row(cells: [String; 12], outcomes: &str) -> String {
    let mut line = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS).enumerate() {
        if i == 0 {
            line.push_str(&format!("{cell:<width$}"));
        } else {
            line.push_str(&format!("  {cell:>width$}"));
        }
    }
    line.push_str("  ");
    line.push_str(outcomes);
    line.trim_end().to_owned()
}

/// The table's heading (latencies in ms).
pub fn table_header() -> String {
    row(COLUMNS.map(|(name, _)| name.to_owned()), "outcomes")
}

/// One level's row, then one indented line per kind of failure with an example message.
pub fn table_row(l: &LevelStats) -> String {
    let outcomes: Vec<String> = l.outcomes.iter().map(|(k, n)| format!("{k}={n}")).collect();
    let mut out = row(
        [
            l.shape.clone(),
            l.concurrency.to_string(),
            format!("{}/{}", l.succeeded, l.total),
            format!("{:.1}", l.output_tok_per_s()),
            format!("{:.2}", l.requests_per_s()),
            ms(l.ttft_ms.p50),
            ms(l.ttft_ms.p95),
            ms(l.e2e_ms.p50),
            ms(l.e2e_ms.p95),
            ms(l.tpot_ms.p50),
            ms(l.queue_ms.p50),
            ms(l.queue_ms.p95),
        ],
        &outcomes.join(" "),
    );
    for (label, example) in &l.failure_examples {
        out.push_str(&format!("\n    {label}: {example}"));
    }
    out
}

fn summary(s: &Summary) -> Value {
    json!({"p50": s.p50, "p95": s.p95, "mean": s.mean, "count": s.count})
}

/// One level as a JSON object (latencies in ms, wall time in s).
pub fn level_json(l: &LevelStats, url: &str, model: &str) -> Value {
    json!({
        "url": url,
        "model": model,
        "shape": l.shape,
        "input_tokens": l.input_tokens,
        "output_tokens": l.output_tokens,
        "concurrency": l.concurrency,
        "requests": l.total,
        "succeeded": l.succeeded,
        "failed": l.total - l.succeeded,
        "outcomes": l.outcomes,
        "failure_examples": l.failure_examples,
        "wall_s": l.wall.as_secs_f64(),
        "completion_tokens": l.completion_tokens,
        "usage_reported": l.usage_reported,
        "prompt_tokens_mean": l.prompt_tokens_mean,
        "output_tok_per_s": l.output_tok_per_s(),
        "requests_per_s": l.requests_per_s(),
        "ttft_ms": summary(&l.ttft_ms),
        "e2e_ms": summary(&l.e2e_ms),
        "tpot_ms": summary(&l.tpot_ms),
        "queue_ms": summary(&l.queue_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Outcome, Sample};
    use std::time::Duration;

    fn level() -> LevelStats {
        let ok = Sample {
            outcome: Outcome::Ok,
            ttft: Some(Duration::from_millis(42)),
            e2e: Duration::from_millis(1042),
            completion_tokens: Some(128),
            prompt_tokens: Some(256),
            content_chunks: 128,
            queue_ms: None,
        };
        let busy = Sample {
            outcome: Outcome::Http {
                status: 503,
                code: None,
                message: "busy".into(),
            },
            ..ok.clone()
        };
        LevelStats::from_samples(
            &"256:128".parse().unwrap(),
            4,
            &[ok, busy],
            Duration::from_secs(2),
        )
    }

    #[test]
    fn table_lines_up() {
        let header = table_header();
        let row = table_row(&level());
        let first = row.lines().next().unwrap();
        assert!(header.starts_with("shape"), "{header}");
        assert!(first.starts_with("256:128"), "{first}");
        // Every numeric column ends where its heading ends.
        let end = header.find("outcomes").unwrap();
        assert_eq!(&first[end..], "http_503=1 ok=1");
        assert!(first.contains(" 1/2 ") && first.contains(" 64.0 ") && first.contains(" 42.0 "));
        assert_eq!(row.lines().nth(1), Some("    http_503: busy"));
    }

    #[test]
    fn json_fields() {
        let v = level_json(&level(), "http://x", "m");
        assert_eq!(v["requests"], 2);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["outcomes"]["ok"], 1);
        assert_eq!(v["completion_tokens"], 128);
        assert_eq!(v["output_tok_per_s"], 64.0);
        assert_eq!(v["ttft_ms"]["p50"], 42.0);
        assert_eq!(v["queue_ms"]["p50"], Value::Null);
        assert_eq!(v["prompt_tokens_mean"], 256.0);
    }
}
