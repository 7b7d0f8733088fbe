//! Windowed figures from cumulative metrics: readings of the histograms and outcome counters
//! kept in a ring every few seconds, and percentiles from the bucket counts between the
//! oldest kept reading and now.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sluice_engine::prom::HistogramSnapshot;
use tokio::time::Instant;

use crate::telemetry::{Metrics, Outcome};

/// How often the sampler keeps a reading.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How far back the window reaches.
pub const WINDOW: Duration = Duration::from_secs(300);

/// The cumulative values the status page derives its windowed figures from, at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub at: Instant,
    pub queue_wait: HistogramSnapshot,
    pub ttft: HistogramSnapshot,
    /// Requests shed (503 `overloaded`).
    pub shed: u64,
    /// Requests that waited past `queue_wait_max`.
    pub timeout: u64,
    /// Requests that ended, whatever the outcome.
    pub ended: u64,
}

impl Reading {
    /// The values in `metrics` now.
    pub fn take(metrics: &Metrics) -> Self {
        Self {
            at: Instant::now(),
            queue_wait: metrics.queue_wait.snapshot(),
            ttft: metrics.time_to_first_token.snapshot(),
            shed: metrics.outcome_total(Outcome::Shed),
            timeout: metrics.outcome_total(Outcome::Timeout),
            ended: Outcome::ALL.iter().map(|o| metrics.outcome_total(*o)).sum(),
        }
    }
}

/// What happened between two readings.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// How long the window really covers (shorter than [`WINDOW`] just after start).
    pub span: Duration,
    pub queue_wait: HistogramSnapshot,
    pub ttft: HistogramSnapshot,
    pub shed: u64,
    pub timeout: u64,
    pub ended: u64,
}

impl Window {
    /// Shed and timed-out requests per minute over the window; a window shorter than a minute
    /// counts as one (so one shed in the first seconds after start reads 1/min, not 20/min).
    pub fn shed_per_minute(&self) -> f64 {
        let minutes = (self.span.as_secs_f64() / 60.0).max(1.0);
        (self.shed + self.timeout) as f64 / minutes
    }

    /// The share of the requests that ended in the window that were shed or timed out.
    pub fn shed_share(&self) -> f64 {
        if self.ended == 0 {
            0.0
        } else {
            (self.shed + self.timeout) as f64 / self.ended as f64
        }
    }
}

/// A ring of readings, one every [`SAMPLE_EVERY`], reaching back [`WINDOW`].
#[derive(Debug)]
pub struct Sampler {
    every: Duration,
    keep: Duration,
    ring: Mutex<VecDeque<Reading>>,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new(SAMPLE_EVERY, WINDOW)
    }
}

impl Sampler {
    /// A sampler keeping a reading every `every` for `keep`.
    pub fn new(every: Duration, keep: Duration) -> Self {
        let cap = usize::try_from(keep.as_millis() / every.as_millis().max(1)).unwrap_or(64) + 2;
        Self {
            every,
            keep,
            ring: Mutex::new(VecDeque::with_capacity(cap)),
        }
    }

    /// How often readings are kept.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Keeps `reading` unless the newest kept one is less than `every` older; forgets those
    /// that fell out of the window (the newest of them stays, as the window's start, until a
    /// younger one reaches back far enough).
    pub fn record(&self, reading: Reading) {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = ring.back() {
            if reading.at.saturating_duration_since(last.at) < self.every {
                return;
            }
        }
        let horizon = reading.at.checked_sub(self.keep);
        ring.push_back(reading);
        if let Some(horizon) = horizon {
            while ring.get(1).is_some_and(|second| second.at <= horizon) {
                ring.pop_front();
            }
        }
    }

    /// The window from the oldest kept reading to `now` (empty when none is kept yet).
    pub fn window(&self, now: &Reading) -> Window {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let horizon = now.at.checked_sub(self.keep);
        // The oldest reading inside the window; failing that, the newest before it.
        let start = ring
            .iter()
            .find(|r| horizon.is_none_or(|h| r.at >= h))
            .or_else(|| ring.back())
            .unwrap_or(now);
        Window {
            span: now.at.saturating_duration_since(start.at),
            queue_wait: now.queue_wait.since(&start.queue_wait),
            ttft: now.ttft.since(&start.ttft),
            shed: now.shed.saturating_sub(start.shed),
            timeout: now.timeout.saturating_sub(start.timeout),
            ended: now.ended.saturating_sub(start.ended),
        }
    }

    /// How many readings are kept.
    pub fn len(&self) -> usize {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is kept yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `q`-quantile (0..=1) of the observations in `h`, interpolated linearly inside the bucket
/// it falls in (as Prometheus' `histogram_quantile` does: the first bucket starts at 0, and a
/// quantile in the `+Inf` bucket is the highest finite bound). `None` without observations.
pub fn quantile(h: &HistogramSnapshot, q: f64) -> Option<f64> {
    if h.count == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * h.count as f64;
    let mut below = 0u64;
    for (i, &n) in h.counts.iter().enumerate() {
        let upto = below + n;
        if n > 0 && upto as f64 >= rank {
            let Some(&upper) = h.bounds.get(i) else {
                return h.bounds.last().copied();
            };
            let lower = i
                .checked_sub(1)
                .and_then(|j| h.bounds.get(j))
                .copied()
                .unwrap_or(0.0);
            let into = (rank - below as f64) / n as f64;
            return Some(lower + (upper - lower) * into);
        }
        below = upto;
    }
    h.bounds.last().copied()
}
