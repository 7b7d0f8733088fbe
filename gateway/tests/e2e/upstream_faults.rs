//! Upstreams that misbehave below HTTP: one that answers bytes that are not HTTP, one that
//! hangs up without answering, one that breaks its stream off mid-way. Each gets a prompt,
//! explicit error (502 `upstream_error`, or an SSE error event then `[DONE]`), never a hang or
//! a cut that looks like a normal end. (A stalled upstream: `scripted.rs`.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use sluice_gateway::forward::StaticUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::{chat, policy, Gateway};

/// A TCP upstream that reads the request, writes `reply` and closes, on every connection.
async fn raw_upstream(reply: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

async fn gateway_before(reply: &'static [u8]) -> Gateway {
    let addr = raw_upstream(reply).await;
    let up = StaticUpstream::new(&format!("http://{addr}")).expect("url");
    Gateway::start(policy(4, 16), Arc::new(up)).await
}

#[tokio::test]
async fn an_upstream_answering_garbage_gets_a_502_at_once() {
    let replies: [(&str, &'static [u8]); 3] = [
        (
            "not HTTP",
            b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02 garbage\r\n\r\n",
        ),
        ("a broken status line", b"HTTP/1.1 abc\r\n\r\n"),
        ("a hang-up without an answer", b""),
    ];
    for (name, reply) in replies {
        let gw = gateway_before(reply).await;
        let started = Instant::now();
        let (status, _, v) = gw.client().post("/v1/chat/completions", &chat()).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{name}: {v}");
        assert_eq!(v["error"]["code"], "upstream_error", "{name}: {v}");
        assert_eq!(v["error"]["type"], "upstream_error", "{name}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("upstream"), "{name}: {message}");
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
        gw.assert_accounted().await;
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn a_stream_broken_off_mid_way_ends_with_an_error_event() {
    // One good chunk (16 bytes), then a chunk header that is not hex, then the hang-up.
    let gw = gateway_before(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
          10\r\ndata: {\"a\":1}\n\n\r\nZZZZ\r\n",
    )
    .await;
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&chat()))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("a whole body, not a cut")
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("data: {\"a\":1}\n\n"), "{text}");
    assert!(
        text.contains("\"code\":\"upstream_error\"") && text.contains("broke off"),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    gw.assert_accounted().await;
    let errors = gw
        .app
        .metrics
        .outcome_total(sluice_gateway::telemetry::Outcome::Error);
    assert_eq!(errors, 1, "counted as an error, not a success");
    gw.shutdown().await;
}
