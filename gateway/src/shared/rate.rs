//! The shared GCRA: one theoretical arrival time per tenant in Redis, checked and advanced on
//! Redis's clock by the arrival's script ([`super::arrive`]), so every gateway admits from the
//! same bucket.
//!
//! A refusal is remembered until the time it named. A bucket's next admission only moves later
//! (the deployment's admissions push it, nothing pulls it), so until then Redis would refuse
//! too: the rate limit's check ([`crate::middleware::rate_limit`]) refuses at once, before the
//! body is parsed and counted, without asking. The time runs from when the call was sent,
//! before Redis's clock read it, so it never outlasts the real refusal; what a refusal can
//! outlast is a bucket emptied by a Redis restart, by at most one emission interval (a refusal
//! never names more). A reload that changes the tenant's rate or burst forgets it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Shared;

/// A tenant's GCRA in the script's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// The emission interval: microseconds per request.
    pub period_us: u64,
    pub burst: u32,
}

impl Rate {
    /// `per_second` requests a second with `burst` at once.
    pub fn new(per_second: f64, burst: u32) -> Self {
        Self {
            period_us: (1e6 / per_second).round().max(1.0) as u64,
            burst: burst.max(1),
        }
    }
}

/// The refusals of the shared GCRA still in force: per tenant, the rate it was refused under
/// and until when.
#[derive(Debug, Default)]
pub struct Refusals {
    until: Mutex<HashMap<String, (Rate, Instant)>>,
}

impl Refusals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Rate, Instant)>> {
        self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `tenant`'s bucket under `rate` refuses until `until`.
    pub fn note(&self, tenant: &str, rate: Rate, until: Instant) {
        self.lock().insert(tenant.to_owned(), (rate, until));
    }

    /// How long `tenant`'s bucket under `rate` still refuses, when a refusal says so.
    pub fn remaining(&self, tenant: &str, rate: Rate) -> Option<Duration> {
        let mut map = self.lock();
        let (noted, until) = *map.get(tenant)?;
        let left = until.saturating_duration_since(Instant::now());
        if noted != rate || left.is_zero() {
            map.remove(tenant);
            return None;
        }
        Some(left)
    }
}

impl Shared {
    /// How long `tenant`'s shared bucket of `per_second` and `burst` is known to refuse still
    /// (`None`: ask Redis, on arrival).
    pub fn rate_refused(&self, tenant: &str, per_second: f64, burst: u32) -> Option<Duration> {
        self.refusals
            .remaining(tenant, Rate::new(per_second, burst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refusal_stands_until_its_time_and_only_under_its_rate() {
        let r = Refusals::default();
        let rate = Rate::new(10.0, 1);
        assert_eq!(rate.period_us, 100_000);
        assert_eq!(r.remaining("alice", rate), None);
        r.note("alice", rate, Instant::now() + Duration::from_millis(80));
        assert_eq!(r.remaining("alice", rate), Some(Duration::from_millis(80)));
        assert_eq!(r.remaining("bob", rate), None, "per tenant");
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(r.remaining("alice", rate), Some(Duration::from_millis(50)));
        // A reload raised the burst: the refusal no longer holds.
        assert_eq!(r.remaining("alice", Rate::new(10.0, 5)), None);
        assert_eq!(r.remaining("alice", rate), None, "forgotten");
        r.note("alice", rate, Instant::now() + Duration::from_millis(50));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(r.remaining("alice", rate), None, "over: ask Redis again");
    }
}
