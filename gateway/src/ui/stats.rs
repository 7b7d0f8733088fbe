//! `GET /ui/stats`: the figures the status page shows, as JSON.
//!
//! ```json
//! {
//!   "ready": true, "model": "…",
//!   "active": 1, "active_max": 4, "heavy_active": 0,
//!   "queued": {"interactive": 2, "batch": 0}, "queue_depth": 16,
//!   "ranks": [{"rank": 0, "up": true, "layers": [0, 29],
//!              "kv_tokens_used": 512, "kv_tokens_total": 8192, "kv_used_pct": 6.25}],
//!   "window": {"seconds": 300.0, "ended": 40, "shed": 3, "timeout": 1,
//!              "shed_per_min": 0.8, "shed_share": 0.1,
//!              "queue_wait_p50": 0.02, "queue_wait_p95": 1.9, "ttft_p50": 0.3, "ttft_p95": 2.2},
//!   "totals": {"accepted": 41, "ok": 35, "rejected": 1, "shed": 3, "timeout": 1, …},
//!   "policy": {"sha256": "…", "short": "3f2a9c0d1e4b", "loaded_at": 1767225600, "path": "…"},
//!   "prediction": {"predictive": true, "median_error": -0.04, "output_share": 0.9,
//!                  "parameters": {"prefill": [0.03, 0.5, 0.05, 0.0], "decode": [0.01, 0.002, 0.0],
//!                                 "prefill_observations": 12, "decode_observations": 12},
//!                  "points": [{"ago": 12.5, "predicted": 0.41, "actual": 0.38}, …]}
//! }
//! ```
//!
//! Percentiles are in seconds, over the window (`window.seconds` says how long it really
//! covers), and `null` when nothing was observed in it.

use std::time::UNIX_EPOCH;

use serde::Serialize;

use super::window::{quantile, Reading, Sampler, Window};
use crate::app::App;
use crate::bundled::RankStatus;
use crate::middleware::admission::{Admission, PredictionView};
use crate::policy::LoadedPolicy;
use crate::telemetry::{Metrics, Outcome};

/// How many hex digits of the policy hash the page shows.
pub const SHORT_HASH: usize = 12;

/// The whole answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stats {
    /// Whether the upstream can serve (`/readyz`).
    pub ready: bool,
    pub model: String,
    pub active: usize,
    pub active_max: usize,
    pub heavy_active: usize,
    pub queued: Queued,
    pub queue_depth: usize,
    pub ranks: Vec<RankView>,
    pub window: WindowView,
    pub totals: Totals,
    pub policy: PolicyView,
    /// The cost model, the prediction error and the recent predicted/actual pairs (the chart).
    pub prediction: PredictionView,
}

/// Requests waiting for a slot, per class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Queued {
    pub interactive: usize,
    pub batch: usize,
}

/// One engine rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankView {
    pub rank: usize,
    pub up: bool,
    pub layers: [usize; 2],
    pub kv_tokens_used: u64,
    pub kv_tokens_total: u64,
    /// `kv_tokens_used` as a percentage of `kv_tokens_total` (0 when the total is unknown).
    pub kv_used_pct: f64,
}

impl From<&RankStatus> for RankView {
    fn from(r: &RankStatus) -> Self {
        let kv_used_pct = if r.kv_tokens_total == 0 {
            0.0
        } else {
            100.0 * r.kv_tokens_used as f64 / r.kv_tokens_total as f64
        };
        Self {
            rank: r.rank,
            up: r.up,
            layers: r.layers,
            kv_tokens_used: r.kv_tokens_used,
            kv_tokens_total: r.kv_tokens_total,
            kv_used_pct,
        }
    }
}

/// The windowed figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowView {
    /// How many seconds the window covers.
    pub seconds: f64,
    pub ended: u64,
    pub shed: u64,
    pub timeout: u64,
    /// Shed plus timed out, per minute (over at least one minute).
    pub shed_per_min: f64,
    /// Shed plus timed out, as a share (0..=1) of the requests that ended.
    pub shed_share: f64,
    pub queue_wait_p50: Option<f64>,
    pub queue_wait_p95: Option<f64>,
    pub ttft_p50: Option<f64>,
    pub ttft_p95: Option<f64>,
}

impl From<&Window> for WindowView {
    fn from(w: &Window) -> Self {
        Self {
            seconds: w.span.as_secs_f64(),
            ended: w.ended,
            shed: w.shed,
            timeout: w.timeout,
            shed_per_min: w.shed_per_minute(),
            shed_share: w.shed_share(),
            queue_wait_p50: quantile(&w.queue_wait, 0.5),
            queue_wait_p95: quantile(&w.queue_wait, 0.95),
            ttft_p50: quantile(&w.ttft, 0.5),
            ttft_p95: quantile(&w.ttft, 0.95),
        }
    }
}

/// Counts since the gateway started.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Totals {
    pub accepted: u64,
    pub ok: u64,
    pub rejected: u64,
    pub shed: u64,
    pub timeout: u64,
    pub cancelled: u64,
    pub error: u64,
}

impl From<&Metrics> for Totals {
    fn from(m: &Metrics) -> Self {
        Self {
            accepted: m.accepted_total(),
            ok: m.outcome_total(Outcome::Ok),
            rejected: m.outcome_total(Outcome::Rejected),
            shed: m.outcome_total(Outcome::Shed),
            timeout: m.outcome_total(Outcome::Timeout),
            cancelled: m.outcome_total(Outcome::Cancelled),
            error: m.outcome_total(Outcome::Error),
        }
    }
}

/// The policy in force.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyView {
    pub sha256: String,
    /// The first [`SHORT_HASH`] hex digits.
    pub short: String,
    /// Unix seconds.
    pub loaded_at: u64,
    /// The file; none for the built-in defaults.
    pub path: Option<String>,
}

impl From<&LoadedPolicy> for PolicyView {
    fn from(p: &LoadedPolicy) -> Self {
        Self {
            sha256: p.sha256.clone(),
            short: p.sha256.chars().take(SHORT_HASH).collect(),
            loaded_at: p
                .loaded_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            path: p.path.as_ref().map(|p| p.display().to_string()),
        }
    }
}

impl Stats {
    /// The figures now: the live state of `app`, and the window of `sampler` up to now (the
    /// reading taken here is offered to the sampler too).
    pub fn collect(app: &App, sampler: &Sampler) -> Self {
        let now = Reading::take(&app.metrics);
        sampler.record(now.clone());
        let window = sampler.window(&now);
        Self::from_parts(
            app.upstream.is_ready(),
            &app.model,
            &app.admission,
            &app.upstream.ranks(),
            &window,
            &app.metrics,
            &app.policy.current(),
        )
    }

    /// The figures from their sources.
    pub fn from_parts(
        ready: bool,
        model: &str,
        admission: &Admission,
        ranks: &[RankStatus],
        window: &Window,
        metrics: &Metrics,
        policy: &LoadedPolicy,
    ) -> Self {
        let prediction = admission.prediction();
        let admission = admission.snapshot();
        Self {
            ready,
            model: model.to_owned(),
            active: admission.active,
            active_max: admission.active_max,
            heavy_active: admission.heavy_active,
            queued: Queued {
                interactive: admission.queued_interactive,
                batch: admission.queued_batch,
            },
            queue_depth: admission.queue_depth,
            ranks: ranks.iter().map(RankView::from).collect(),
            window: WindowView::from(window),
            totals: Totals::from(metrics),
            policy: PolicyView::from(policy),
            prediction,
        }
    }
}
