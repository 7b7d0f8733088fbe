use std::sync::Arc;

use http::Request;

use super::*;
use crate::middleware::budget::Budget;
use crate::policy::{Class, Tenant};

fn caller(rate: Option<f64>, burst: u32) -> Caller {
    Caller {
        tenant: Some(Arc::new(Tenant {
            name: "alice".into(),
            api_key_sha256: "0".repeat(64),
            class: Class::Interactive,
            requests_per_second: rate,
            burst,
            tokens_per_minute: None,
        })),
        class: Class::Interactive,
    }
}

fn check(limit: &RateLimit, c: &Caller) -> Result<(), GatewayError> {
    let mut req = Request::new(());
    req.extensions_mut().insert(c.clone());
    limit.check(&mut req)
}

#[test]
fn burst_passes_then_429_with_retry_after() {
    let limit = RateLimit::default();
    let c = caller(Some(0.5), 3);
    for i in 0..3 {
        check(&limit, &c).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    match check(&limit, &c) {
        Err(GatewayError::RateLimited {
            retry_after,
            tenant,
            ..
        }) => {
            assert_eq!(tenant, "alice");
            // One request per 2 s: the next is allowed within 2 s.
            assert!(retry_after <= Duration::from_secs(2), "{retry_after:?}");
            assert!(retry_after > Duration::from_millis(1500), "{retry_after:?}");
        }
        other => panic!("expected 429, got {other:?}"),
    }
    let resp = GatewayError::RateLimited {
        tenant: "alice".into(),
        rate: 0.5,
        retry_after: Duration::from_millis(1200),
    }
    .into_response();
    assert_eq!(resp.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "2");
}

#[test]
fn tenants_have_their_own_buckets_and_unlimited_ones_pass() {
    let limit = RateLimit::default();
    let alice = caller(Some(1.0), 1);
    let mut bob = caller(Some(1.0), 1);
    if let Some(t) = bob.tenant.as_mut() {
        Arc::make_mut(t).name = "bob".into();
    }
    check(&limit, &alice).expect("alice");
    check(&limit, &bob).expect("bob has his own bucket");
    assert!(check(&limit, &alice).is_err());
    let free = caller(None, 1);
    for _ in 0..100 {
        check(&limit, &free).expect("no rate set");
    }
    // No caller at all (an open gateway): no limit.
    let mut req = Request::new(());
    limit.check(&mut req).expect("open");
}

#[test]
fn a_new_quota_replaces_the_old_bucket() {
    let limit = RateLimit::default();
    check(&limit, &caller(Some(1.0), 1)).expect("first");
    assert!(check(&limit, &caller(Some(1.0), 1)).is_err());
    // A reload raised the burst: the tenant starts afresh under it.
    for _ in 0..5 {
        check(&limit, &caller(Some(1.0), 5)).expect("new burst");
    }
}

#[test]
fn a_share_past_u32_neither_panics_nor_wraps_to_the_whole_burst() {
    let c = caller(Some(0.001), 3);
    let tenant = c.tenant.expect("tenant");
    for share in [1usize << 32, (1usize << 32) + 1, usize::MAX] {
        let limit = RateLimit::default();
        // The share of a burst of 3 rounds up to 1: one passes, the next waits.
        assert_eq!(limit.take_share(&tenant, share), Ok(()), "{share}");
        assert!(limit.take_share(&tenant, share).is_err(), "{share}");
    }
}

#[tokio::test(start_paused = true)]
async fn shared_it_answers_only_a_standing_refusal_of_redis() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Closed);
    let limit = RateLimit::new(Some(shared.clone()));
    let c = caller(Some(10.0), 1);
    for _ in 0..5 {
        check(&limit, &c).expect("left to the arrival's script");
    }
    crate::shared::testing::refused(&shared, "alice", 10.0, 1, Duration::from_millis(60));
    match check(&limit, &c) {
        Err(GatewayError::RateLimited { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::from_millis(60));
        }
        other => panic!("expected 429, got {other:?}"),
    }
    tokio::time::advance(Duration::from_millis(60)).await;
    check(&limit, &c).expect("over: Redis is asked again");
    assert_eq!(shared.report().degraded, 0, "no Redis call, no fallback");
}

/// The budget's stage (where a shared rate is taken, once the body is in) over a service that
/// answers 200, for one request of `c`.
async fn through(stage: &Budget, c: &Caller) -> Result<(), GatewayError> {
    use tower::{Layer, ServiceExt};
    let svc = crate::middleware::around::AroundLayer::new(stage.clone()).layer(tower::service_fn(
        |_req: Request<()>| async {
            Ok::<_, GatewayError>(http::Response::new(crate::body::full("")))
        },
    ));
    let mut req = Request::new(());
    req.extensions_mut().insert(c.clone());
    svc.oneshot(req).await.map(drop)
}

#[tokio::test(start_paused = true)]
async fn redis_away_fail_local_takes_the_gateways_share_of_the_bucket() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Local);
    let stage = Budget::new(Some(shared.clone()));
    // 10/s with a burst of 4 over 2 replicas: this gateway alone gets 5/s and a burst of 2.
    let c = caller(Some(10.0), 4);
    through(&stage, &c).await.expect("first");
    through(&stage, &c).await.expect("second");
    match through(&stage, &c).await {
        Err(GatewayError::RateLimited { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(200), "{retry_after:?}");
        }
        other => panic!("expected 429, got {other:?}"),
    }
    assert_eq!(shared.report().degraded, 3);
    // A tenant without a rate or a budget never needs the shared state.
    through(&stage, &caller(None, 1)).await.expect("unlimited");
    assert_eq!(shared.report().degraded, 3);
}

#[tokio::test(start_paused = true)]
async fn redis_away_fail_closed_refuses_with_shared_state_unavailable() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Closed);
    let stage = Budget::new(Some(shared));
    let err = through(&stage, &caller(Some(10.0), 4))
        .await
        .expect_err("refused");
    assert!(
        matches!(err, GatewayError::SharedStateUnavailable(_)),
        "{err:?}"
    );
    assert_eq!(err.class().status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(err.code(), "shared_state_unavailable");
}
