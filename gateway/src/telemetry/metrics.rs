//! The gateway's counters and histograms, and `GET /metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{header, HeaderValue, Response};
use sluice_engine::prom::{header as help, Histogram, CONTENT_TYPE};

use super::outcome::Outcome;
use crate::body::{self, GatewayBody};
use crate::middleware::admission::Snapshot;

/// Queue-time buckets (seconds): from instant admission to the 60 s default wait limit.
const QUEUE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0,
    300.0,
];
/// Upstream-time buckets (seconds): vLLM's end-to-end buckets.
const UPSTREAM_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
];
/// Time-to-first-byte buckets (seconds): vLLM's TTFT buckets.
const TTFB_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];

/// Everything the gateway counts.
#[derive(Debug)]
pub struct Metrics {
    accepted: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    reload_ok: AtomicU64,
    reload_error: AtomicU64,
    /// Arrival at admission → slot granted (or given up).
    pub queue_time: Histogram,
    /// Slot granted → the response's last byte.
    pub upstream_time: Histogram,
    /// Slot granted → the response's first body byte (the first token, when streaming).
    pub upstream_first_byte: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            accepted: AtomicU64::new(0),
            outcomes: Default::default(),
            reload_ok: AtomicU64::new(0),
            reload_error: AtomicU64::new(0),
            queue_time: Histogram::new(QUEUE_BUCKETS),
            upstream_time: Histogram::new(UPSTREAM_BUCKETS),
            upstream_first_byte: Histogram::new(TTFB_BUCKETS),
        }
    }
}

impl Metrics {
    /// A request entered the stack.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended.
    pub fn ended(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests accepted so far.
    pub fn accepted_total(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Requests that ended with `outcome` so far.
    pub fn outcome_total(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }

    /// A policy reload was applied (`ok`) or refused.
    pub fn policy_reload(&self, ok: bool) {
        let c = if ok {
            &self.reload_ok
        } else {
            &self.reload_error
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe_queue(&self, d: Duration) {
        self.queue_time.observe(d);
    }

    /// The Prometheus text of these metrics and the admission state.
    pub fn render(&self, admission: &Snapshot) -> String {
        let mut out = String::new();
        help(
            &mut out,
            "sluice_requests_accepted_total",
            "Requests that entered the gateway's stack.",
            "counter",
        );
        let _ = writeln!(
            out,
            "sluice_requests_accepted_total {}",
            self.accepted_total()
        );
        help(
            &mut out,
            "sluice_requests_total",
            "Requests that ended, by outcome (accepted = the sum, at any quiet moment).",
            "counter",
        );
        for o in Outcome::ALL {
            let _ = writeln!(
                out,
                "sluice_requests_total{{outcome=\"{}\"}} {}",
                o.as_str(),
                self.outcome_total(o)
            );
        }
        help(
            &mut out,
            "sluice_policy_reloads_total",
            "Policy reloads, by result.",
            "counter",
        );
        let _ = writeln!(
            out,
            "sluice_policy_reloads_total{{result=\"ok\"}} {}",
            self.reload_ok.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "sluice_policy_reloads_total{{result=\"error\"}} {}",
            self.reload_error.load(Ordering::Relaxed)
        );
        self.queue_time.render(
            &mut out,
            "sluice_queue_time_seconds",
            "Time from arrival at admission until a slot was granted or the wait ended.",
            "stage=\"queue\"",
        );
        self.upstream_time.render(
            &mut out,
            "sluice_upstream_time_seconds",
            "Time from slot granted to the response's last byte (compute, not waiting).",
            "stage=\"upstream\"",
        );
        self.upstream_first_byte.render(
            &mut out,
            "sluice_upstream_first_byte_seconds",
            "Time from slot granted to the response's first body byte.",
            "stage=\"upstream\"",
        );
        let gauges = [
            (
                "sluice_active_requests",
                "Requests holding an upstream slot.",
                admission.active,
            ),
            (
                "sluice_active_heavy_requests",
                "Heavy-input requests holding a slot.",
                admission.heavy_active,
            ),
            (
                "sluice_active_max",
                "The admission ceiling in force.",
                admission.active_max,
            ),
            (
                "sluice_queue_depth_max",
                "The queue bound in force.",
                admission.queue_depth,
            ),
        ];
        for (name, h, v) in gauges {
            help(&mut out, name, h, "gauge");
            let _ = writeln!(out, "{name} {v}");
        }
        help(
            &mut out,
            "sluice_queue_depth",
            "Requests waiting for a slot, by class.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "sluice_queue_depth{{class=\"interactive\"}} {}",
            admission.queued_interactive
        );
        let _ = writeln!(
            out,
            "sluice_queue_depth{{class=\"batch\"}} {}",
            admission.queued_batch
        );
        out
    }

    /// `GET /metrics`.
    pub fn response(&self, admission: &Snapshot) -> Response<GatewayBody> {
        let mut resp = Response::new(body::full(self.render(admission)));
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        resp
    }
}
