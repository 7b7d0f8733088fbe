//! What a run reports: a terminal table, JSON with every sample, the Markdown of
//! `docs/capacity.md` and an SVG chart.

mod json;
mod markdown;
mod svg;
mod table;

pub use json::{entry_json, sample_json};
pub use markdown::{capacity_doc, matrix_table, DocInfo};
pub use svg::chart;
pub use table::{table_header, table_row};

use crate::stats::ScenarioStats;
use crate::workload::{Run, Workload};

/// One scenario measured on one target.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `gateway`, `engine`, `llama-server`, or the URL.
    pub target: String,
    /// The scenario's short id (`short-c4`) and its title (`256→128, C=4`).
    pub id: String,
    pub title: String,
    /// What the chart groups points by (the shape: `256:128`).
    pub series: String,
    pub workload: Workload,
    pub stats: ScenarioStats,
    pub run: Run,
}

/// Seconds with two decimals, or `–` for none.
pub(crate) fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.2}"))
}

/// `ok=8 http_503:overloaded=2`, and `(3 retried)` when some were sent again after a refusal.
pub(crate) fn outcomes(stats: &ScenarioStats) -> String {
    let mut parts: Vec<String> = stats
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    if stats.retried > 0 {
        parts.push(format!("({} retried)", stats.retried));
    }
    parts.join(" ")
}

/// `C=4`, or `0.20/s (C≤8)` for an open loop.
pub(crate) fn load(w: &Workload) -> String {
    match w {
        Workload::Closed { concurrency } => format!("C={concurrency}"),
        Workload::Open {
            arrivals,
            concurrency,
        } => format!("{:.2}/s (C≤{concurrency})", arrivals.rate()),
    }
}
