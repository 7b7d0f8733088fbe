//! The fault logic without Redis: what `fail` makes of an unavailable state, with paused time.

use std::time::Duration;

use super::testing::{unreachable, unreachable_policy};
use super::*;
use crate::middleware::admission::{Admission, Limits};
use crate::policy::{Class, LoadedPolicy, PolicyStore};

fn store(p: &Policy) -> Arc<PolicyStore> {
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = p.clone();
    PolicyStore::new(loaded)
}

/// A lease `shared` grants on its own while Redis is away (`fail = "local"`).
async fn local_lease(shared: &Arc<Shared>) -> Lease {
    shared
        .acquire(Class::Batch, 4, Duration::from_secs(60))
        .await
        .expect("decided locally")
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn fail_local_lowers_the_local_ceiling_to_the_gateways_share() {
    let p = unreachable_policy(SharedFail::Local);
    let shared = unreachable(SharedFail::Local);
    let admission = Admission::new(Limits::from(&p.admission));
    capacity::follow(&admission, store(&p), None, Some(shared.clone()));
    settle().await;
    assert!(!shared.health().is_up());
    assert_eq!(admission.snapshot().active_max, 2, "4 slots / 2 replicas");
    // The state comes back: the whole ceiling is shared again.
    shared.health().recovered();
    settle().await;
    assert_eq!(admission.snapshot().active_max, 4);
}

#[tokio::test(start_paused = true)]
async fn fail_closed_keeps_the_ceiling_and_refuses_instead() {
    let p = unreachable_policy(SharedFail::Closed);
    let shared = unreachable(SharedFail::Closed);
    let admission = Admission::new(Limits::from(&p.admission));
    capacity::follow(&admission, store(&p), None, Some(shared.clone()));
    settle().await;
    assert_eq!(admission.snapshot().active_max, 4);
    let started = tokio::time::Instant::now();
    let err = shared
        .acquire(Class::Interactive, 4, Duration::from_secs(60))
        .await
        .expect_err("refused");
    assert!(
        matches!(err, GatewayError::SharedStateUnavailable(_)),
        "{err:?}"
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no wait on a Redis known away"
    );
    assert_eq!(shared.report().degraded, 1);
}

#[tokio::test(start_paused = true)]
async fn fail_local_grants_a_lease_at_once_and_registers_it_for_adoption() {
    let shared = unreachable(SharedFail::Local);
    let lease = local_lease(&shared).await;
    assert_eq!(
        shared.report().leases,
        1,
        "renewed (adopted) once Redis is back"
    );
    drop(lease);
    assert_eq!(shared.report().leases, 0);
}

#[tokio::test(start_paused = true)]
async fn a_bundled_engine_keeps_its_ceiling_local() {
    let mut p = unreachable_policy(SharedFail::Local);
    p.upstream.kind = crate::policy::UpstreamKind::Bundled;
    let shared = Shared::start(&p).expect("valid").expect("on");
    assert!(!shared.shares_ceiling());
    let admission = Admission::new(Limits::from(&p.admission));
    capacity::follow(&admission, store(&p), None, Some(shared));
    settle().await;
    assert_eq!(admission.snapshot().active_max, 4);
}

#[test]
fn off_without_a_redis_url() {
    assert!(Shared::start(&Policy::default()).expect("valid").is_none());
}

#[tokio::test(start_paused = true)]
async fn fail_local_follows_a_reload_of_active_max_while_redis_is_away() {
    let p = unreachable_policy(SharedFail::Local);
    let shared = unreachable(SharedFail::Local);
    let policy = store(&p);
    let admission = Admission::new(Limits::from(&p.admission));
    capacity::follow(&admission, policy.clone(), None, Some(shared.clone()));
    settle().await;
    assert_eq!(admission.snapshot().active_max, 2, "4 slots / 2 replicas");
    // A reload halves the deployment's ceiling while Redis is still away: so does the share.
    let mut lower = p.clone();
    lower.admission.active_max = 2;
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = lower;
    policy.replace(loaded);
    settle().await;
    assert!(!shared.health().is_up());
    assert_eq!(admission.snapshot().active_max, 1, "2 slots / 2 replicas");
}

/// A response holding a lease hands admission's write-stall watch the lease's give-back (one
/// watch a response): run, it frees the lease; the body's end then frees nothing twice.
#[tokio::test(start_paused = true)]
async fn a_held_response_hands_its_lease_to_the_stall_watch() {
    let shared = unreachable(SharedFail::Local);
    let lease = local_lease(&shared).await;
    let resp = http::Response::new(crate::body::full("data: {}\n\n"));
    let resp = hold::held(resp, lease, Duration::ZERO).expect("held");
    let on_stall = resp
        .extensions()
        .get::<crate::body::stall::OnStall>()
        .expect("handed to the watch")
        .clone();
    assert_eq!(shared.report().leases, 1);
    on_stall.run();
    assert_eq!(shared.report().leases, 0, "given back at the stall");
    drop(resp);
    on_stall.run();
    assert_eq!(shared.report().leases, 0);
}
