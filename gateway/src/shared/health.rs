//! Whether the shared state is usable, and the bound on every call to it.
//!
//! Every Redis call goes through [`Health::bounded`]: it answers within `shared.timeout` or
//! counts as a failure. The first failure marks the state down (one `warn` line, the gauge
//! `sluice_shared_state_up` 0); from then on calls fail at once, without waiting on Redis, and
//! requests follow `[shared] fail`. The probe (see [`super::store`]) marks it up again when
//! Redis answers (one `info` line). So no request waits on Redis longer than the bound, and
//! none at all while it is known to be away.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::policy::SharedFail;

/// Redis is unreachable, failed, or did not answer in time (the reason).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The shared state's health and its counters.
#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    fail: SharedFail,
    up: AtomicBool,
    /// The last failure's reason, for the answers while down.
    why: Mutex<String>,
    /// Failed calls by operation.
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Decisions taken without the shared state (by `fail`).
    degraded: AtomicU64,
    changes: watch::Sender<bool>,
}

impl Health {
    /// Down until the first connection succeeds.
    pub fn new(timeout: Duration, fail: SharedFail) -> Self {
        Self {
            timeout,
            fail,
            up: AtomicBool::new(false),
            why: Mutex::new("not connected yet".into()),
            errors: Mutex::default(),
            degraded: AtomicU64::new(0),
            changes: watch::channel(false).0,
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn fail_mode(&self) -> SharedFail {
        self.fail
    }

    /// Up (`true`) and down as they change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// Why the state is down now.
    pub fn why(&self) -> String {
        self.why.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `call` within the bound: its value, or [`Unavailable`] (and the state marked down) when
    /// it fails or takes longer. While down: [`Unavailable`] at once, `call` never polled.
    pub async fn bounded<T, E: Display>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Unavailable> {
        if !self.is_up() {
            return Err(Unavailable(self.why()));
        }
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.failed(op, e.to_string())),
            Err(_) => Err(self.failed(
                op,
                format!("no answer within {:?} (shared.timeout)", self.timeout),
            )),
        }
    }

    /// Records a failed call and marks the state down; returns the failure.
    pub fn failed(&self, op: &'static str, why: String) -> Unavailable {
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(op)
            .or_default() += 1;
        *self.why.lock().unwrap_or_else(|e| e.into_inner()) = format!("{op}: {why}");
        if self.up.swap(false, Ordering::AcqRel) {
            let fail = match self.fail {
                SharedFail::Local => "local (each gateway its share of the limits)",
                SharedFail::Closed => "closed (503 shared_state_unavailable)",
            };
            tracing::warn!(op, reason = %why, fail, "shared state unavailable: Redis failed or is slower than shared.timeout");
            self.changes.send_replace(false);
        }
        Unavailable(format!("{op}: {why}"))
    }

    /// Redis answered again: the shared path is back.
    pub fn recovered(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!("shared state available: limits and the ceiling are shared again");
            self.changes.send_replace(true);
        }
    }

    /// A decision taken by `fail` instead of the shared state.
    pub fn degraded(&self) {
        self.degraded.fetch_add(1, Ordering::Relaxed);
    }

    /// Failed calls by operation.
    pub fn errors(&self) -> BTreeMap<&'static str, u64> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn degraded_total(&self) -> u64 {
        self.degraded.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up() -> Health {
        let h = Health::new(Duration::from_millis(50), SharedFail::Local);
        h.recovered();
        h
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_fails_at_the_bound_and_marks_the_state_down() {
        let h = up();
        let mut changes = h.subscribe();
        let started = tokio::time::Instant::now();
        let r: Result<(), _> = h
            .bounded("gcra", std::future::pending::<Result<(), String>>())
            .await;
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert!(r.expect_err("timed out").0.contains("shared.timeout"));
        assert!(!h.is_up());
        assert!(changes.has_changed().expect("sender alive"));
        assert!(!*changes.borrow_and_update());
        assert_eq!(h.errors().get("gcra"), Some(&1));
    }

    #[tokio::test(start_paused = true)]
    async fn while_down_calls_fail_at_once_without_touching_redis() {
        let h = up();
        let _ = h.failed("renew", "connection refused".into());
        let started = tokio::time::Instant::now();
        let polled = AtomicBool::new(false);
        let r = h
            .bounded("gcra", async {
                polled.store(true, Ordering::SeqCst);
                Ok::<_, String>(())
            })
            .await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(
            r,
            Err(Unavailable("renew: connection refused".into())),
            "the reason is the failure's"
        );
        assert!(
            !polled.load(Ordering::SeqCst),
            "Redis is not asked while down"
        );
        // Only the transition is reported; the counter counts every failure.
        let _ = h.failed("renew", "connection refused".into());
        assert_eq!(h.errors().get("renew"), Some(&2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_answer_fails_too_and_recovery_resumes_the_shared_path() {
        let h = up();
        let r: Result<(), _> = h
            .bounded("charge", async { Err::<(), _>("NOSCRIPT or worse") })
            .await;
        assert!(r.is_err());
        assert!(!h.is_up());
        h.recovered();
        assert!(h.is_up());
        let v = h.bounded("charge", async { Ok::<_, String>(7) }).await;
        assert_eq!(v, Ok(7));
    }

    #[test]
    fn a_new_state_is_down_until_connected() {
        let h = Health::new(Duration::from_millis(50), SharedFail::Closed);
        assert!(!h.is_up());
        assert_eq!(h.why(), "not connected yet");
    }
}
