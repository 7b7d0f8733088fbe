//! One request as the load tests see it, over a shared HTTP/2 connection: when its headers
//! came, when its first token came, what it waited in the queue, how it ended.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use serde_json::Value;

use crate::common::Gateway;

/// How one request went.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub status: u16,
    /// The error's `code` (refusals), or `stream_error` for an error event in a stream.
    pub code: Option<String>,
    /// Request sent → response headers.
    pub headers: Duration,
    /// Request sent → first content chunk (streams answered 200).
    pub ttft: Option<Duration>,
    /// `x-sluice-queue-ms`.
    pub queue: Duration,
}

impl Sample {
    /// Time to first token after admission: the engine's part of the TTFT.
    pub fn admitted_ttft(&self) -> Option<Duration> {
        self.ttft.map(|t| t.saturating_sub(self.queue))
    }
}

/// An HTTP/2 connection to the gateway (one TLS handshake, many streams).
pub async fn connect(gw: &Gateway) -> SendRequest<Full<Bytes>> {
    crate::common::h2_connection(gw.addr).await
}

/// Sends `body` to `path` and reads the whole answer.
pub async fn run(mut send: SendRequest<Full<Bytes>>, path: &str, body: &Value) -> Sample {
    let req = Request::post(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let started = Instant::now();
    let resp = send.send_request(req).await.expect("response");
    let mut s = Sample {
        status: resp.status().as_u16(),
        headers: started.elapsed(),
        ..Sample::default()
    };
    if let Some(q) = resp
        .headers()
        .get("x-sluice-queue-ms")
        .and_then(|v| v.to_str().ok())
    {
        s.queue = Duration::from_millis(q.parse().unwrap_or(0));
    }
    let mut body = resp.into_body();
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("the body ends cleanly").into_data() else {
            continue;
        };
        text.push_str(&String::from_utf8_lossy(&data));
        if s.ttft.is_none() && has_token(&text) {
            s.ttft = Some(started.elapsed());
        }
    }
    if s.status != 200 {
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        s.code = v["error"]["code"].as_str().map(str::to_owned);
    } else if text.lines().any(|l| l.starts_with("data: {\"error\"")) {
        s.code = Some("stream_error".into());
    }
    s
}

/// Whether an SSE text holds a chunk with generated text (the first chunk, with the role and
/// empty content, comes before any token).
fn has_token(sse: &str) -> bool {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .any(|v| {
            let c = &v["choices"][0];
            [&c["delta"]["content"], &c["text"], &c["message"]["content"]]
                .iter()
                .any(|t| t.as_str().is_some_and(|t| !t.is_empty()))
        })
}

/// The `p`-th percentile (0–100) of `xs`, nearest rank.
pub fn percentile(xs: &[Duration], p: f64) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Sends a stream and hangs up after its first content chunk (a client going away).
pub async fn cancel_after_first_token(mut send: SendRequest<Full<Bytes>>, body: &Value) -> u16 {
    let req = Request::post("https://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut text = String::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(d) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
        }
        if has_token(&text) {
            break;
        }
    }
    status
}
