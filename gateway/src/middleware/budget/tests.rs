use std::sync::Arc;
use std::time::Duration;

use http::Response;
use http_body_util::BodyExt;

use super::*;
use crate::body;
use crate::middleware::around::AroundLayer;

#[tokio::test(start_paused = true)]
async fn charges_on_arrival_so_concurrent_requests_cannot_overshoot() {
    let b = Arc::new(TokenBudgets::default());
    // Three concurrent requests of 400 reserved tokens against 1,000 per minute: the third is
    // refused at arrival, before anything ran.
    let _c1 = b.charge("alice", 1000, 400).expect("first");
    let _c2 = b.charge("alice", 1000, 400).expect("second");
    match b.charge("alice", 1000, 400) {
        Err(GatewayError::TokenBudget { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::from_secs(60));
        }
        other => panic!("expected 429, got {other:?}"),
    }
    // Another tenant has its own budget.
    b.charge("bob", 1000, 400).expect("bob");
}

#[tokio::test(start_paused = true)]
async fn settling_returns_unused_tokens_and_the_window_slides() {
    let b = Arc::new(TokenBudgets::default());
    let c1 = b.charge("alice", 1000, 900).expect("first");
    assert!(b.charge("alice", 1000, 200).is_err());
    // The request used 100 prompt + 50 completion tokens.
    c1.settle(150);
    b.charge("alice", 1000, 800).expect("room after settling");
    // Settling never raises a charge.
    c1.settle(10_000);
    assert!(b.charge("alice", 1000, 100).is_err());
    tokio::time::advance(Duration::from_secs(30)).await;
    let Err(GatewayError::TokenBudget { retry_after, .. }) = b.charge("alice", 1000, 900) else {
        panic!("expected 429");
    };
    // Both charges were made at t=0: the window frees them at t=60, 30 s from now.
    assert_eq!(retry_after, Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(30)).await;
    b.charge("alice", 1000, 900).expect("the window moved on");
}

#[tokio::test(start_paused = true)]
async fn usage_in_the_response_settles_the_charge() {
    let budgets = Arc::new(TokenBudgets::default());
    let charge = budgets.charge("alice", 1000, 600).expect("charge");
    let inner = body::full(
        r#"data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens": 7,"total_tokens":107}}"#,
    );
    let settle = Settle {
        reserved: Reserved {
            charge: Held::Local(charge),
            started: true,
        },
        prompt: 100,
        usage: UsageScanner::default(),
        sent: 0,
        ended: false,
        stream: true,
    };
    let body = TapBody::new(inner, settle);
    let bytes = body.collect().await.expect("body").to_bytes();
    assert!(
        bytes.starts_with(b"data: "),
        "the body passes through unchanged"
    );
    // 107 charged: 893 left.
    budgets
        .charge("alice", 1000, 893)
        .expect("settled to the real usage");
    assert!(budgets.charge("alice", 1000, 1).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_client_leaves_before_its_answer_gives_its_charge_back() {
    use tower::{Layer, ServiceExt};
    let stage = Budget::default();
    // An upstream (or a queue) that has not answered yet.
    let svc = AroundLayer::new(stage.clone()).layer(tower::service_fn(|_req: Request<()>| {
        std::future::pending::<Result<Response<body::GatewayBody>, GatewayError>>()
    }));
    let tenant = Arc::new(alice(None, 0, Some(1000)));
    let mut req = Request::new(());
    req.extensions_mut().insert(Caller {
        tenant: Some(tenant.clone()),
        class: crate::policy::Class::Interactive,
    });
    req.extensions_mut().insert(PromptTokens(600));
    let waiting = tokio::spawn(svc.oneshot(req));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        through(&stage, &tenant, 600).await.is_err(),
        "600 of 1,000 reserved while it waits"
    );
    // The client goes away: nothing was generated, nothing stays charged.
    waiting.abort();
    let _ = waiting.await;
    through(&stage, &tenant, 600)
        .await
        .expect("the charge came back whole");
}

/// Alice, with a rate limit of `rate` and `burst`, and a budget of `budget` per minute.
fn alice(rate: Option<f64>, burst: u32, budget: Option<u64>) -> crate::policy::Tenant {
    crate::policy::Tenant {
        name: "alice".into(),
        api_key_sha256: "0".repeat(64),
        class: crate::policy::Class::Interactive,
        requests_per_second: rate,
        burst,
        tokens_per_minute: budget,
    }
}

/// The layer over a service that answers 200 with an empty body, for one request of
/// `needed` prompt tokens from `tenant`.
async fn through(
    stage: &Budget,
    tenant: &crate::policy::Tenant,
    needed: usize,
) -> Result<(), GatewayError> {
    use tower::{Layer, ServiceExt};
    let svc = AroundLayer::new(stage.clone()).layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, GatewayError>(Response::new(body::full("")))
    }));
    let mut req = Request::new(());
    req.extensions_mut().insert(Caller {
        tenant: Some(Arc::new(tenant.clone())),
        class: crate::policy::Class::Interactive,
    });
    req.extensions_mut().insert(PromptTokens(needed));
    svc.oneshot(req).await.map(drop)
}

#[tokio::test(start_paused = true)]
async fn redis_away_fail_local_charges_the_gateways_share_of_the_budget() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Local);
    let stage = Budget::new(Some(shared));
    // 1,000 per minute over 2 replicas: 500 for this gateway alone.
    let t = alice(None, 1, Some(1000));
    through(&stage, &t, 400).await.expect("first");
    match through(&stage, &t, 400).await {
        Err(GatewayError::TokenBudget { budget, .. }) => assert_eq!(budget, 500),
        other => panic!("expected 429, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn redis_away_fail_local_takes_the_rates_share_then_the_budgets() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Local);
    let stage = Budget::new(Some(shared.clone()));
    // 10/s with a burst of 4 and 1,000 tokens a minute over 2 replicas: this gateway alone
    // gets 5/s, a burst of 2 and 500 tokens.
    let both = alice(Some(10.0), 4, Some(1000));
    through(&stage, &both, 500).await.expect("rate and budget");
    assert!(matches!(
        through(&stage, &both, 1).await,
        Err(GatewayError::TokenBudget { budget: 500, .. })
    ));
    assert!(matches!(
        through(&stage, &both, 1).await,
        Err(GatewayError::RateLimited { .. })
    ));
    assert_eq!(
        shared.report().degraded,
        3,
        "one arrival, one decision each"
    );
    // Without a budget its rate is taken here too (once the body is in), from the same share.
    assert!(matches!(
        through(&stage, &alice(Some(10.0), 4, None), 10).await,
        Err(GatewayError::RateLimited { .. })
    ));
    assert_eq!(shared.report().degraded, 4);
}

#[tokio::test(start_paused = true)]
async fn redis_away_fail_closed_refuses_with_shared_state_unavailable() {
    let shared = crate::shared::testing::unreachable(crate::policy::SharedFail::Closed);
    let stage = Budget::new(Some(shared));
    for t in [alice(None, 1, Some(1000)), alice(Some(10.0), 4, Some(1000))] {
        let err = through(&stage, &t, 10).await.expect_err("refused");
        assert!(
            matches!(err, GatewayError::SharedStateUnavailable(_)),
            "{err:?}"
        );
        assert_eq!(err.class().status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.code(), "shared_state_unavailable");
    }
}

/// The layer over a service that answers `status` with `body` (and counts its calls), for one
/// request of `prompt` tokens and `max_tokens` from `tenant`.
async fn answered(
    stage: &Budget,
    tenant: &crate::policy::Tenant,
    prompt: usize,
    max_tokens: usize,
    status: http::StatusCode,
    body: &'static str,
    calls: &Arc<std::sync::atomic::AtomicUsize>,
) -> Result<Response<body::GatewayBody>, GatewayError> {
    use tower::{Layer, ServiceExt};
    let calls = calls.clone();
    let svc = AroundLayer::new(stage.clone()).layer(tower::service_fn(move |_req: Request<()>| {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let mut resp = Response::new(body::full(body));
            *resp.status_mut() = status;
            if body.starts_with("data:") {
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/event-stream"),
                );
            }
            Ok::<_, GatewayError>(resp)
        }
    }));
    let mut req = Request::new(());
    req.extensions_mut().insert(Caller {
        tenant: Some(Arc::new(tenant.clone())),
        class: crate::policy::Class::Interactive,
    });
    req.extensions_mut().insert(PromptTokens(prompt));
    req.extensions_mut().insert(MaxTokens(max_tokens));
    svc.oneshot(req).await
}

#[tokio::test(start_paused = true)]
async fn an_upstream_error_generated_nothing_and_charges_nothing() {
    let stage = Budget::default();
    let t = alice(None, 0, Some(1000));
    let calls = Arc::default();
    for status in [500, 400, 500] {
        let status = http::StatusCode::from_u16(status).expect("status");
        let resp = answered(&stage, &t, 100, 400, status, r#"{"error":{}}"#, &calls)
            .await
            .expect("the upstream's answer, passed on");
        assert_eq!(resp.status(), status);
        resp.into_body().collect().await.expect("body");
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "each 500 tokens reserved went back: the third request went up too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_short_is_charged_what_it_generated() {
    let stage = Budget::default();
    let t = alice(None, 0, Some(1000));
    let calls = Arc::default();
    const TOKENS: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"}}]}\n\n",
    );
    let resp = answered(&stage, &t, 100, 800, http::StatusCode::OK, TOKENS, &calls)
        .await
        .expect("200");
    // The client reads three tokens and goes away before the stream's end (and its usage).
    let mut body = resp.into_body();
    let frame = body.frame().await.expect("a frame").expect("data");
    assert!(frame.into_data().is_ok_and(|d| d.starts_with(b"data: ")));
    drop(body);
    // 100 prompt tokens and 3 generated are charged: 897 are left, and no more.
    through(&stage, &t, 897)
        .await
        .expect("the reservation settled to what the stream generated");
    assert!(through(&stage, &t, 1).await.is_err(), "103 stayed charged");
}
