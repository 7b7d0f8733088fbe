use std::sync::Arc;

use futures_util::StreamExt;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, ServiceExt};

use super::*;
use crate::policy::{LoadedPolicy, PolicyStore};

fn store(limit: usize) -> Arc<PolicyStore> {
    let mut p = LoadedPolicy::defaults();
    p.policy.server.body_limit_bytes = limit;
    PolicyStore::new(p)
}

/// The parse layer over a service that returns what it got.
async fn run(path: &str, body: &'static str, limit: usize) -> Result<Json, GatewayError> {
    let echo = tower::service_fn(|req: Request<Json>| async move {
        Ok::<_, GatewayError>(Response::new(req.into_body()))
    });
    let svc = ParseLayer::new(store(limit)).layer(echo);
    let req = Request::post(path)
        .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
        .expect("request");
    Ok(svc.oneshot(req).await?.into_body())
}

#[tokio::test]
async fn json_bodies_are_parsed_with_their_endpoint() {
    let j = run(
        "/v1/chat/completions",
        r#"{"messages":[],"ignore_eos":true}"#,
        1024,
    )
    .await
    .expect("parsed");
    assert_eq!(j.endpoint, Endpoint::ChatCompletions);
    assert_eq!(j.value["ignore_eos"], true);
    let j = run("/v1/completions", r#"{"prompt":"hi"}"#, 1024)
        .await
        .expect("parsed");
    assert_eq!(j.endpoint, Endpoint::Completions);
}

#[tokio::test]
async fn bad_json_is_400_naming_line_and_column() {
    let e = run("/v1/completions", "{\"prompt\":\n  \"hi\",}", 1024)
        .await
        .expect_err("bad json");
    let GatewayError::InvalidJson(msg) = &e else {
        panic!("expected invalid_json, got {e:?}");
    };
    assert!(msg.contains("line 2"), "{msg}");
    assert_eq!(e.into_response().status(), http::StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bodies_past_the_limit_are_413() {
    let e = run(
        "/v1/completions",
        r#"{"prompt":"a long prompt indeed"}"#,
        16,
    )
    .await
    .expect_err("too large");
    assert_eq!(e, GatewayError::BodyTooLarge { limit: 16 });
    assert_eq!(
        e.into_response().status(),
        http::StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[tokio::test]
async fn unknown_paths_are_404() {
    let e = run("/v1/embeddings", "{}", 1024).await.expect_err("404");
    assert!(matches!(e, GatewayError::NotFound { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_is_answered_request_timeout() {
    // Half a body, then nothing: answered 408 once BODY_IDLE passes without a byte.
    let frames = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
        http_body::Frame::data(bytes::Bytes::from_static(b"{\"messages\":")),
    )])
    .chain(futures_util::stream::pending());
    let body = http_body_util::StreamBody::new(frames);
    let started = tokio::time::Instant::now();
    let err = read_body(body, 1 << 20).await.expect_err("stalled");
    assert!(matches!(err, GatewayError::BodyTimeout(_)), "{err:?}");
    assert_eq!(err.class().status, http::StatusCode::REQUEST_TIMEOUT);
    assert_eq!(started.elapsed(), BODY_IDLE);
    // A body whose frames keep coming, each within the bound, is read whole however long.
    let slow = futures_util::stream::iter(0..3).then(|i| async move {
        tokio::time::sleep(BODY_IDLE - std::time::Duration::from_secs(1)).await;
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(
            ["[", "1", "]"][i],
        )))
    });
    let got = read_body(http_body_util::StreamBody::new(slow), 1 << 20)
        .await
        .expect("read");
    assert_eq!(&got[..], b"[1]");
}
