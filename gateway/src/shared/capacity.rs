//! The local ceiling in force: the upstream's own capacity (replicas up and not saturated),
//! and, with `[shared] fail = "local"` while Redis is away, the gateway's share of the
//! deployment's `active_max` (`active_max / expected_replicas`, at least 1), recomputed when
//! either changes and when a reload changes `active_max`.

use std::sync::Arc;

use tokio::sync::watch;

use super::Shared;
use crate::middleware::admission::Admission;
use crate::policy::{PolicyStore, SharedFail};

/// Keeps `admission`'s capacity at the lower of the upstream's and the fallback share, as
/// either changes (the upstream's capacity, Redis's health, the policy's `active_max`).
/// Without a shared ceiling it follows the upstream alone, as before.
pub fn follow(
    admission: &Arc<Admission>,
    policy: Arc<PolicyStore>,
    upstream: Option<watch::Receiver<Option<usize>>>,
    shared: Option<Arc<Shared>>,
) {
    let shared = shared.filter(|s| s.shares_ceiling() && s.settings().fail == SharedFail::Local);
    if upstream.is_none() && shared.is_none() {
        return;
    }
    let mut upstream = upstream;
    let mut health = shared.as_ref().map(|s| s.health().subscribe());
    let mut reloads = policy.subscribe();
    let follower = Arc::downgrade(admission);
    tokio::spawn(async move {
        loop {
            reloads.mark_unchanged();
            let from_upstream = upstream.as_mut().and_then(|c| *c.borrow_and_update());
            let up = health.as_mut().is_none_or(|h| *h.borrow_and_update());
            let fallback = match &shared {
                Some(s) if !up => {
                    let active_max = policy.current().policy.admission.active_max;
                    Some((active_max / s.share()).max(1))
                }
                _ => None,
            };
            let capacity = match (from_upstream, fallback) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match follower.upgrade() {
                Some(admission) => admission.set_capacity(capacity),
                None => break,
            }
            let changed = async {
                let upstream = async {
                    match upstream.as_mut() {
                        Some(u) => u.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                let health = async {
                    match health.as_mut() {
                        Some(h) => h.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = upstream => r,
                    r = health => r,
                    r = reloads.changed() => r.is_ok(),
                }
            };
            if !changed.await {
                break;
            }
        }
    });
}
