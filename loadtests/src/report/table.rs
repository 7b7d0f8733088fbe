//! The terminal table: one row per scenario, latencies in seconds.

use super::{load, outcomes, secs, Entry};

const COLUMNS: [(&str, usize); 11] = [
    ("scenario", 14),
    ("load", 14),
    ("ok/total", 8),
    ("out tok/s", 9),
    ("TTFT p50", 8),
    ("TTFT p95", 8),
    ("E2E p50", 8),
    ("E2E p95", 8),
    ("arr→end p95", 11),
    ("queue p95", 9),
    ("score", 6),
];

fn row(cells: [String; 11], tail: &str) -> String {
    let mut line = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS).enumerate() {
        if i == 0 {
            line.push_str(&format!("{cell:<width$}"));
        } else {
            line.push_str(&format!("  {cell:>width$}"));
        }
    }
    line.push_str("  ");
    line.push_str(tail);
    line.trim_end().to_owned()
}

/// The table's heading (latencies in s).
pub fn table_header() -> String {
    row(COLUMNS.map(|(name, _)| name.to_owned()), "outcomes")
}

/// One scenario's row, then one indented line per kind of failure with an example message.
pub fn table_row(e: &Entry) -> String {
    let s = &e.stats;
    let score = s
        .score
        .map_or_else(|| "–".into(), |sc| format!("{}/{}", sc.passed, sc.checked));
    let mut out = row(
        [
            e.id.clone(),
            load(&e.workload),
            format!("{}/{}", s.succeeded, s.total),
            format!("{:.1}", s.output_tok_per_s()),
            secs(s.ttft.p50),
            secs(s.ttft.p95),
            secs(s.e2e.p50),
            secs(s.e2e.p95),
            secs(s.arrival_to_end.p95),
            secs(s.queue.p95),
            score,
        ],
        &outcomes(s),
    );
    for (label, example) in &s.failure_examples {
        out.push_str(&format!("\n    {label}: {example}"));
    }
    out
}
