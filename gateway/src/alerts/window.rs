//! The shed share over a sliding window, from periodic samples of the outcome counters, and
//! the hysteresis rule that turns it into firing or not.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::Alerts;
use crate::telemetry::{Metrics, Outcome};

/// Whether a request that ended with `o` was shed: refused by admission (`overloaded`) or
/// given up after waiting past `queue_wait_max` (`queue_timeout`).
pub fn is_shed(o: Outcome) -> bool {
    matches!(o, Outcome::Shed | Outcome::Timeout)
}

/// Totals of the outcome counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests that ended shed (see [`is_shed`]).
    pub shed: u64,
    /// Requests that ended, however.
    pub ended: u64,
}

impl Counts {
    /// Reads the counters of `metrics` now.
    pub fn of(metrics: &Metrics) -> Self {
        let mut c = Self::default();
        for o in Outcome::ALL {
            let n = metrics.outcome_total(o);
            c.ended += n;
            if is_shed(o) {
                c.shed += n;
            }
        }
        c
    }
}

/// How many requests ended, and how many of them shed, over a span of time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Share {
    pub shed: u64,
    pub ended: u64,
    /// The span the counts cover: the window, or less while the gateway is younger.
    pub span: Duration,
}

impl Share {
    /// `shed / ended`, 0 when nothing ended.
    pub fn ratio(&self) -> f64 {
        if self.ended == 0 {
            0.0
        } else {
            self.shed as f64 / self.ended as f64
        }
    }

    /// Whether an alert that is `firing` now should be firing after this share: it fires at
    /// `shed_ratio` or more once at least `min_requests` ended, and resolves only when the share
    /// falls below `resolve_ratio` (or nothing at all was shed).
    pub fn fires(&self, firing: bool, rule: &Alerts) -> bool {
        if firing {
            self.shed > 0 && self.ratio() >= rule.resolve_ratio
        } else {
            self.ended >= rule.min_requests && self.ratio() >= rule.shed_ratio
        }
    }
}

/// Samples of the counters over the last window. The share is the difference between the
/// newest sample and the newest one at least a window older (the oldest kept), so it covers
/// between one window and one window plus one evaluation interval.
#[derive(Debug, Default)]
pub struct ShedWindow {
    samples: VecDeque<(Instant, Counts)>,
}

impl ShedWindow {
    /// Records the counts at `now` and returns the share over the last `window`.
    pub fn sample(&mut self, now: Instant, counts: Counts, window: Duration) -> Share {
        self.samples.push_back((now, counts));
        if let Some(start) = now.checked_sub(window) {
            while self.samples.get(1).is_some_and(|(t, _)| *t <= start) {
                self.samples.pop_front();
            }
        }
        let (since, base) = self.samples.front().copied().unwrap_or((now, counts));
        Share {
            shed: counts.shed.saturating_sub(base.shed),
            ended: counts.ended.saturating_sub(base.ended),
            span: now.saturating_duration_since(since),
        }
    }

    /// Samples held (at most about `window / evaluate_every` + 1).
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample was taken yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}
