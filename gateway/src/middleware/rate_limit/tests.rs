use std::sync::Arc;

use http::Request;

use super::*;
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
