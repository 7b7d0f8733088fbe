//! Forwarding against a scripted upstream on loopback.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sluice_engine::server::prompt::Endpoint;
use tower::ServiceExt;

use super::*;
use crate::middleware::count::PromptTokens;
use crate::middleware::parse::Json;
use crate::telemetry::RequestTrace;

type Seen = Arc<Mutex<Vec<(http::HeaderMap, serde_json::Value)>>>;

type Sender = http_body_util::channel::Sender<Bytes, Infallible>;

/// An upstream that records each request and streams what the test sends on the sender.
async fn upstream() -> (std::net::SocketAddr, Seen, Sender) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let (tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(4);
    let body = Arc::new(Mutex::new(Some(body)));
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let record = record.clone();
            let body = body.clone();
            async move {
                let (parts, b) = req.into_parts();
                let bytes = b.collect().await.expect("body").to_bytes();
                let v = serde_json::from_slice(&bytes).expect("json");
                record.lock().expect("lock").push((parts.headers, v));
                let body = body.lock().expect("lock").take().expect("one request");
                let mut resp = Response::new(body);
                resp.headers_mut()
                    .insert("content-type", "text/event-stream".parse().expect("v"));
                resp.headers_mut()
                    .insert("connection", "keep-alive".parse().expect("v"));
                Ok::<_, Infallible>(resp)
            }
        });
        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    });
    (addr, seen, tx)
}

#[tokio::test]
async fn requests_go_out_whole_and_responses_stream_back_chunk_by_chunk() {
    let (addr, seen, mut chunk_tx) = upstream().await;
    let up = Arc::new(StaticUpstream::new(&format!("http://{addr}")).expect("url"));
    let mut req = Request::post("/v1/chat/completions?x=1")
        .header("authorization", "Bearer secret")
        .header("x-custom", "kept")
        .body(Json {
            endpoint: Endpoint::ChatCompletions,
            value: json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true, "max_tokens": 8}),
        })
        .expect("request");
    let trace = RequestTrace::from_header(None);
    req.extensions_mut().insert(trace);
    req.extensions_mut().insert(PromptTokens(12));
    let resp = Forward::new(
        up,
        crate::policy::PolicyStore::new(crate::policy::LoadedPolicy::defaults()),
    )
    .oneshot(req)
    .await
    .expect("forwarded");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-sluice-prompt-tokens"], "12");
    assert!(
        resp.headers().get("connection").is_none(),
        "hop-by-hop dropped"
    );
    let mut body = resp.into_body();
    chunk_tx
        .send_data(Bytes::from_static(b"data: one\n\n"))
        .await
        .expect("send");
    let f = body.frame().await.expect("frame").expect("ok");
    assert_eq!(
        f.into_data().expect("data"),
        "data: one\n\n",
        "the first chunk arrives alone"
    );
    chunk_tx
        .send_data(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .expect("send");
    drop(chunk_tx);
    let rest = body.collect().await.expect("rest").to_bytes();
    assert_eq!(rest, "data: [DONE]\n\n");
    let seen = seen.lock().expect("lock");
    let (headers, v) = &seen[0];
    assert_eq!(v["ignore_eos"], true, "unused fields pass through");
    assert_eq!(v["max_tokens"], 8);
    assert!(
        headers.get("authorization").is_none(),
        "the caller's key stays here"
    );
    assert_eq!(headers["x-custom"], "kept");
    assert_eq!(headers["traceparent"], trace.span.to_string().as_str());
}

#[tokio::test]
async fn an_unreachable_upstream_is_engine_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let up = Arc::new(StaticUpstream::new(&format!("http://{addr}")).expect("url"));
    let req = Request::post("/v1/completions")
        .body(Json {
            endpoint: Endpoint::Completions,
            value: json!({"prompt": "hi"}),
        })
        .expect("request");
    let e = Forward::new(
        up,
        crate::policy::PolicyStore::new(crate::policy::LoadedPolicy::defaults()),
    )
    .oneshot(req)
    .await
    .expect_err("refused");
    assert!(
        matches!(e, crate::error::GatewayError::EngineUnavailable(_)),
        "{e:?}"
    );
}
