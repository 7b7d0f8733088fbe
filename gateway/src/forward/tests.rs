//! Forwarding against a scripted upstream on loopback.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
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
use crate::error::GatewayError;
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
        .body(Json::new(
            Endpoint::ChatCompletions,
            json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true, "max_tokens": 8}),
        ))
        .expect("request");
    let trace = RequestTrace::from_header(None);
    req.extensions_mut().insert(trace);
    req.extensions_mut().insert(PromptTokens(12));
    req.extensions_mut()
        .insert(crate::middleware::cap::MaxTokens(8));
    let resp = Forward::new(
        up,
        crate::policy::PolicyStore::new(crate::policy::LoadedPolicy::defaults()),
    )
    .oneshot(req)
    .await
    .expect("forwarded");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-sluice-prompt-tokens"], "12");
    assert_eq!(resp.headers()["x-sluice-max-tokens"], "8");
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
        .body(Json::new(Endpoint::Completions, json!({"prompt": "hi"})))
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

/// An upstream that answers the first request on each connection (keep-alive, as announced)
/// and, when `hang_up_on_reuse`, closes the connection under the second one unanswered, as
/// `llama-server` does after a stream; otherwise it closes under every request. Counts the
/// requests it read.
async fn hanging_up(hang_up_on_reuse: bool) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let read = Arc::new(AtomicUsize::new(0));
    let count = read.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for answered in 0.. {
                    if !read_request(&mut stream, &mut buf).await {
                        return;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    if !hang_up_on_reuse || answered > 0 {
                        return;
                    }
                    let body = r#"{"choices":[]}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nkeep-alive: timeout=5, max=100\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
                }
            });
        }
    });

    /// Reads one request (head and `content-length` body) off `stream`; false at its end.
    async fn read_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    buf.drain(..end + 4 + len);
                    return true;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
    (addr, read)
}

async fn post(forward: &Forward) -> Result<Response<crate::body::GatewayBody>, GatewayError> {
    let req = Request::post("/v1/chat/completions")
        .body(Json::new(
            Endpoint::ChatCompletions,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ))
        .expect("request");
    forward.clone().oneshot(req).await
}

fn forward_to(addr: std::net::SocketAddr) -> Forward {
    let up = Arc::new(StaticUpstream::new(&format!("http://{addr}")).expect("url"));
    Forward::new(
        up,
        crate::policy::PolicyStore::new(crate::policy::LoadedPolicy::defaults()),
    )
}

#[tokio::test]
async fn a_pooled_connection_closed_under_a_request_is_replaced_once() {
    let (addr, read) = hanging_up(true).await;
    let forward = forward_to(addr);
    for n in 1..=3 {
        let resp = post(&forward).await.expect("answered");
        assert_eq!(resp.status(), StatusCode::OK, "request {n}");
        let _ = resp.into_body().collect().await.expect("body");
    }
    // Requests 2 and 3 were each read once on the reused connection, unanswered, then once
    // more on a new one.
    assert_eq!(read.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_request_lost_on_its_own_new_connection_is_never_sent_again() {
    let (addr, read) = hanging_up(false).await;
    let e = post(&forward_to(addr)).await.expect_err("no answer");
    assert_eq!(e.class().status, StatusCode::BAD_GATEWAY, "{e:?}");
    assert_eq!(read.load(Ordering::SeqCst), 1, "sent exactly once");
}

#[test]
fn upstream_uris_keep_the_path_and_query_under_the_base_path() {
    let pq = http::uri::PathAndQuery::from_static("/v1/completions?x=1");
    for (base, want) in [
        (
            "http://127.0.0.1:8000",
            "http://127.0.0.1:8000/v1/completions?x=1",
        ),
        (
            "http://127.0.0.1:8000/",
            "http://127.0.0.1:8000/v1/completions?x=1",
        ),
        (
            "https://h.example/vllm/",
            "https://h.example/vllm/v1/completions?x=1",
        ),
    ] {
        let target = Target {
            base: base.parse().expect("base"),
        };
        assert_eq!(target.uri(&pq).expect("uri").to_string(), want, "{base}");
    }
}

#[test]
fn a_replica_is_shown_without_its_credentials_or_path() {
    let shown = |base: &str| {
        super::Target {
            base: base.parse().expect("a URI"),
        }
        .shown()
    };
    assert_eq!(
        shown("http://user:secret@10.0.0.7:8000/v1"),
        "http://10.0.0.7:8000"
    );
    assert_eq!(shown("https://vllm.internal"), "https://vllm.internal");
    assert_eq!(shown("http://[::1]:8000/"), "http://[::1]:8000");
}
