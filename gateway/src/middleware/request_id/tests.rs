use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt};

use super::*;
use crate::body;
use sluice_engine::trace::TraceContext;

fn service(
    fail: bool,
) -> impl tower::Service<Request<()>, Response = Response<GatewayBody>, Error = Infallible> + Clone
{
    RequestIdLayer::default().layer(tower::service_fn(move |req: Request<()>| async move {
        let trace = req
            .extensions()
            .get::<RequestTrace>()
            .copied()
            .expect("trace");
        assert!(req.extensions().get::<RequestId>().is_some());
        if fail {
            return Err(GatewayError::QueueTimeout {
                waited: std::time::Duration::from_secs(60),
            });
        }
        Ok(Response::new(body::full(trace.span.to_string())))
    }))
}

#[tokio::test]
async fn a_caller_trace_is_continued_and_a_missing_one_started() {
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let req = Request::builder()
        .header("traceparent", parent)
        .header(REQUEST_ID_HEADER, "req-42")
        .body(())
        .expect("request");
    let resp = service(false).oneshot(req).await.expect("infallible");
    assert_eq!(resp.headers()[REQUEST_ID_HEADER], "req-42");
    let tp = resp.headers()["traceparent"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        tp.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
        "{tp}"
    );
    assert!(
        !tp.contains("b7ad6b7169203331"),
        "the gateway has its own span: {tp}"
    );

    let resp = service(false)
        .oneshot(Request::new(()))
        .await
        .expect("infallible");
    let id = resp.headers()[REQUEST_ID_HEADER].to_str().expect("ascii");
    assert_eq!(id.len(), 32);
    let tp = resp.headers()["traceparent"].to_str().expect("ascii");
    assert!(TraceContext::parse(tp).is_some(), "{tp}");
}

#[tokio::test]
async fn errors_become_openai_shaped_responses_with_the_request_id() {
    let req = Request::builder()
        .header(REQUEST_ID_HEADER, "bad id with spaces")
        .body(())
        .expect("request");
    let resp = service(true).oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let id = resp.headers()[REQUEST_ID_HEADER].to_str().expect("ascii");
    assert_ne!(id, "bad id with spaces", "an unsafe id is replaced");
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "queue_timeout");
    assert_eq!(v["error"]["type"], "overloaded_error");
}

#[tokio::test]
async fn a_panic_below_is_answered_with_a_500_not_a_dropped_connection() {
    let svc = RequestIdLayer::default().layer(tower::service_fn(|_: Request<()>| async {
        if std::hint::black_box(true) {
            panic!("a bug in a layer");
        }
        Ok::<_, GatewayError>(Response::new(body::full(String::new())))
    }));
    let req = Request::builder()
        .header(REQUEST_ID_HEADER, "req-panic")
        .body(())
        .expect("request");
    let resp = svc.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.headers()[REQUEST_ID_HEADER], "req-panic");
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "internal_error");
    assert_eq!(v["error"]["type"], "server_error");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !msg.contains("a bug in a layer"),
        "the panic stays in the log: {msg}"
    );
}

async fn json_body(resp: Response<GatewayBody>) -> serde_json::Value {
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&body).expect("json")
}
