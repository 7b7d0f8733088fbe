//! For the unit tests of the layers over the shared state: a [`Shared`] whose Redis never
//! answers (nothing listens on port 1), so every decision goes by `fail`.

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::policy::{Policy, SharedFail, UpstreamKind};

/// A policy with `[shared]` on an unreachable Redis, an `openai` upstream (a shared ceiling),
/// `active_max` 4 and 2 expected replicas.
pub fn unreachable_policy(fail: SharedFail) -> Policy {
    let mut p = Policy::default();
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = vec!["http://127.0.0.1:9".into()];
    p.admission.active_max = 4;
    p.shared.redis_url = Some("redis://127.0.0.1:1".into());
    p.shared.fail = fail;
    p.shared.expected_replicas = 2;
    p
}

/// The shared state of [`unreachable_policy`] (down from the start: never connected).
pub fn unreachable(fail: SharedFail) -> Arc<Shared> {
    Shared::start(&unreachable_policy(fail))
        .expect("a valid URL")
        .expect("[shared] on")
}

/// Makes `shared` remember that `tenant`'s bucket of `per_second` and `burst` refuses for
/// `wait` (as an arrival's script would have said).
pub fn refused(shared: &Shared, tenant: &str, per_second: f64, burst: u32, wait: Duration) {
    let rate = super::Rate::new(per_second, burst);
    shared
        .refusals
        .note(tenant, rate, tokio::time::Instant::now() + wait);
}
