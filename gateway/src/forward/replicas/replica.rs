//! One replica: its outstanding requests, its health (passive ejection after consecutive
//! failures, re-admitted by a recovery probe) and its engine's saturation signals.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::signals::Signals;
use crate::forward::upstream::Target;

/// The policy's health and saturation settings, as the replicas apply them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Consecutive failures (connect errors, 5xx other than 503, failed health checks) that
    /// eject a replica.
    pub eject_after: u32,
    /// How long the first ejection lasts; each ejection in a row doubles it (at most 32×).
    pub eject_for: Duration,
    /// Engine-side queue (`num_requests_waiting`) above which the replica takes no more.
    pub waiting_max: f64,
    /// KV cache use at or above which the replica takes no more.
    pub kv_usage_max: f64,
    /// Signals older than this count as saturation: an engine that stopped answering its
    /// metrics is not one to send more work to.
    pub stale_after: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Up,
    /// Out of rotation until `until`, then only a successful health check brings it back.
    Ejected {
        until: Instant,
    },
}

#[derive(Debug)]
struct State {
    health: Health,
    consecutive_failures: u32,
    /// Ejections without a recovery in between (the backoff exponent).
    ejections_in_a_row: u32,
    /// The last successful scrape that named a known metric, and when.
    signals: Option<(Signals, Instant)>,
}

/// A replica of the model behind the gateway.
#[derive(Debug)]
pub struct Replica {
    pub index: usize,
    pub target: Target,
    outstanding: AtomicUsize,
    ejections: AtomicU64,
    state: Mutex<State>,
}

impl Replica {
    pub fn new(index: usize, target: Target) -> Self {
        Self {
            index,
            target,
            outstanding: AtomicUsize::new(0),
            ejections: AtomicU64::new(0),
            state: Mutex::new(State {
                health: Health::Up,
                consecutive_failures: 0,
                ejections_in_a_row: 0,
                signals: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests sent to it whose responses have not ended.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    pub(super) fn take(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn give_back(&self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    /// Times it was ejected.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    pub fn is_up(&self) -> bool {
        self.lock().health == Health::Up
    }

    /// Ejected, and its ejection has run out: the next health check decides.
    pub fn recovery_due(&self, now: Instant) -> bool {
        matches!(self.lock().health, Health::Ejected { until } if now >= until)
    }

    /// A failure; `true` when it ejected the replica.
    pub fn failed(&self, t: &Thresholds) -> bool {
        let mut st = self.lock();
        st.consecutive_failures += 1;
        if st.health != Health::Up || st.consecutive_failures < t.eject_after.max(1) {
            return false;
        }
        let backoff = 1u32 << st.ejections_in_a_row.min(5);
        st.health = Health::Ejected {
            until: Instant::now() + t.eject_for * backoff,
        };
        st.ejections_in_a_row += 1;
        self.ejections.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A success from a request; it does not re-admit an ejected replica (only a health check
    /// does, once the ejection has run out).
    pub fn succeeded(&self) {
        let mut st = self.lock();
        if st.health == Health::Up {
            st.consecutive_failures = 0;
        }
    }

    /// A health check answered: an ejected replica whose time is up comes back.
    pub fn healthy(&self, now: Instant) {
        let mut st = self.lock();
        match st.health {
            Health::Up => st.consecutive_failures = 0,
            Health::Ejected { until } if now >= until => {
                st.health = Health::Up;
                st.consecutive_failures = 0;
                st.ejections_in_a_row = 0;
            }
            Health::Ejected { .. } => {}
        }
    }

    /// A health check failed while ejected: the ejection starts over (with more backoff).
    pub fn still_unhealthy(&self, t: &Thresholds) {
        let mut st = self.lock();
        if let Health::Ejected { .. } = st.health {
            let backoff = 1u32 << st.ejections_in_a_row.min(5);
            st.health = Health::Ejected {
                until: Instant::now() + t.eject_for * backoff,
            };
            st.ejections_in_a_row += 1;
        }
    }

    /// A scrape that named at least one known metric.
    pub fn scraped(&self, signals: Signals, now: Instant) {
        self.lock().signals = Some((signals, now));
    }

    /// The last signals and their age.
    pub fn signals(&self, now: Instant) -> Option<(Signals, Duration)> {
        self.lock().signals.map(|(s, at)| (s, now - at))
    }

    /// Whether its engine says it is full: its own queue or KV cache past the thresholds, or
    /// signals gone stale. An engine that never exposed metrics is never judged saturated.
    pub fn is_saturated(&self, t: &Thresholds, now: Instant) -> bool {
        let Some((s, age)) = self.signals(now) else {
            return false;
        };
        age > t.stale_after
            || s.waiting.is_some_and(|w| w > t.waiting_max)
            || s.kv_usage.is_some_and(|k| k >= t.kv_usage_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds() -> Thresholds {
        Thresholds {
            eject_after: 3,
            eject_for: Duration::from_secs(10),
            waiting_max: 2.0,
            kv_usage_max: 0.95,
            stale_after: Duration::from_secs(10),
        }
    }

    fn replica() -> Replica {
        Replica::new(
            0,
            Target {
                base: "http://r0".parse().expect("uri"),
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_eject_and_a_health_check_after_the_backoff_readmits() {
        let (r, t) = (replica(), thresholds());
        assert!(!r.failed(&t) && !r.failed(&t));
        r.succeeded();
        assert!(!r.failed(&t) && !r.failed(&t), "a success resets the count");
        assert!(r.failed(&t), "the third in a row ejects");
        assert!(!r.is_up() && r.ejections() == 1);
        r.succeeded();
        r.healthy(Instant::now());
        assert!(!r.is_up(), "nothing re-admits it before its time");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(r.recovery_due(Instant::now()));
        r.still_unhealthy(&t);
        tokio::time::advance(Duration::from_secs(19)).await;
        assert!(
            !r.recovery_due(Instant::now()),
            "the second ejection lasts 20 s"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        r.healthy(Instant::now());
        assert!(r.is_up());
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_from_queue_kv_and_staleness() {
        let (r, t) = (replica(), thresholds());
        let now = Instant::now();
        assert!(!r.is_saturated(&t, now), "no metrics: not judged");
        let s = |waiting, kv| Signals {
            running: Some(4.0),
            waiting: Some(waiting),
            kv_usage: Some(kv),
        };
        r.scraped(s(2.0, 0.5), now);
        assert!(!r.is_saturated(&t, now));
        r.scraped(s(3.0, 0.5), now);
        assert!(r.is_saturated(&t, now), "engine-side queue past 2");
        r.scraped(s(0.0, 0.95), now);
        assert!(r.is_saturated(&t, now), "KV at 95 %");
        r.scraped(s(0.0, 0.1), now);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(r.is_saturated(&t, Instant::now()), "stale signals");
    }
}
