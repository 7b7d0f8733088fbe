//! A streaming HTTP/1.1 client for OpenAI-compatible endpoints: one keep-alive connection per
//! worker, the SSE stream parsed as it arrives, one [`Sample`] per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// The response header in which Sluice reports how long a request waited for admission.
pub const QUEUE_HEADER: &str = "x-sluice-queue-ms";

/// Where requests go: `http://host:port` plus the OpenAI paths under it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `host:port`, what the TCP connection dials.
    addr: String,
    host: HeaderValue,
    completions: String,
    models: String,
    auth: Option<HeaderValue>,
}

impl Endpoint {
    /// `url` is the server's base (`http://127.0.0.1:8100`), its `/v1`, or the full
    /// `/v1/completions` URL. Plain `http` only.
    pub fn parse(url: &str, api_key: Option<&str>) -> Result<Self> {
        let uri: Uri = url.parse().with_context(|| format!("bad URL {url:?}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                bail!("URL {url:?}: scheme {other:?} is not supported (plain http only)")
            }
            None => bail!("URL {url:?}: expected http://host:port"),
        }
        let authority = uri
            .authority()
            .with_context(|| format!("URL {url:?} has no host"))?;
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let host = HeaderValue::from_str(authority.as_str())
            .with_context(|| format!("URL {url:?}: bad host"))?;
        let base = uri.path().trim_end_matches('/');
        let (completions, models) = if let Some(v1) = base.strip_suffix("/completions") {
            (base.to_owned(), format!("{v1}/models"))
        } else if base.ends_with("/v1") {
            (format!("{base}/completions"), format!("{base}/models"))
        } else {
            (
                format!("{base}/v1/completions"),
                format!("{base}/v1/models"),
            )
        };
        let auth = match api_key {
            Some(key) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
                    .context("the API key is not a valid header value")?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(Self {
            addr,
            host,
            completions,
            models,
            auth,
        })
    }

    /// The path requests are POSTed to.
    pub fn completions_path(&self) -> &str {
        &self.completions
    }

    /// The URL requests are POSTed to.
    pub fn completions_url(&self) -> String {
        let host = self.host.to_str().unwrap_or("?");
        format!("http://{host}{}", self.completions)
    }

    fn request(&self, method: Method, path: &str, body: Bytes) -> Result<Request<Full<Bytes>>> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        if !body.is_empty() {
            req = req
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream, application/json");
        }
        Ok(req.body(Full::new(body))?)
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A complete stream: `[DONE]` or a `finish_reason`, and no error event.
    Ok,
    /// A non-2xx response; `code` is the body's `error.code` (or `error.type`) when it has one.
    Http {
        status: u16,
        code: Option<String>,
        message: String,
    },
    /// A `data: {"error": ...}` event in a 2xx stream.
    StreamError { code: String, message: String },
    /// No complete response within the request timeout.
    Timeout(Duration),
    /// Connecting, sending, or reading failed.
    Transport(String),
    /// The server sent something that is not an OpenAI response.
    Protocol(String),
    /// The stream ended without `[DONE]` or a `finish_reason`.
    Incomplete,
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok)
    }

    /// The key outcomes are counted under: `ok`, `http_503`, `http_503:engine_unavailable`,
    /// `stream_error:internal_error`, `timeout`, `transport_error`, `protocol_error`,
    /// `incomplete_stream`.
    pub fn label(&self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Http {
                status,
                code: Some(code),
                ..
            } => format!("http_{status}:{code}"),
            Self::Http { status, .. } => format!("http_{status}"),
            Self::StreamError { code, .. } => format!("stream_error:{code}"),
            Self::Timeout(_) => "timeout".into(),
            Self::Transport(_) => "transport_error".into(),
            Self::Protocol(_) => "protocol_error".into(),
            Self::Incomplete => "incomplete_stream".into(),
        }
    }

    /// A human-readable detail for failures.
    pub fn message(&self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Http { message, .. } | Self::StreamError { message, .. } => message.clone(),
            Self::Timeout(t) => format!("no complete response within {t:?}"),
            Self::Transport(m) | Self::Protocol(m) => m.clone(),
            Self::Incomplete => "the stream ended without [DONE] or a finish_reason".into(),
        }
    }
}

/// One request's measurements.
#[derive(Debug, Clone)]
pub struct Sample {
    pub outcome: Outcome,
    /// Send → first chunk with non-empty text.
    pub ttft: Option<Duration>,
    /// Send → end of the response.
    pub e2e: Duration,
    /// `usage.completion_tokens`, when the server sent usage.
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens`, when the server sent usage.
    pub prompt_tokens: Option<u64>,
    /// Chunks with non-empty text.
    pub content_chunks: u64,
    /// The [`QUEUE_HEADER`] response header.
    pub queue_ms: Option<f64>,
}

impl Sample {
    fn failed(outcome: Outcome, e2e: Duration) -> Self {
        Self {
            outcome,
            ttft: None,
            e2e,
            completion_tokens: None,
            prompt_tokens: None,
            content_chunks: 0,
            queue_ms: None,
        }
    }

    /// Completion tokens: the server's usage when it sent one, else the content chunks.
    pub fn tokens(&self) -> u64 {
        self.completion_tokens.unwrap_or(self.content_chunks)
    }
}

/// Splits a `text/event-stream` body into the `data` of its events, however the bytes are cut
/// into frames. Other fields (`event:`, `id:`) and comments are ignored.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut consumed = 0;
        while let Some(nl) = self.buf[consumed..].iter().position(|&b| b == b'\n') {
            let line = &self.buf[consumed..consumed + nl];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            sse_line(&String::from_utf8_lossy(line), &mut self.data, &mut events);
            consumed += nl + 1;
        }
        self.buf.drain(..consumed);
        events
    }

    /// The end of the body: an event left without its closing blank line.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            let mut events = Vec::new();
            sse_line(&String::from_utf8_lossy(&line), &mut self.data, &mut events);
        }
        self.data.take()
    }
}

fn sse_line(line: &str, data: &mut Option<String>, events: &mut Vec<String>) {
    if line.is_empty() {
        events.extend(data.take());
    } else if let Some(rest) = line.strip_prefix("data:") {
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        match data {
            Some(d) => {
                d.push('\n');
                d.push_str(rest);
            }
            None => *data = Some(rest.to_owned()),
        }
    }
}

/// `(code, message)` of an OpenAI error object (`{"error": {...}}`'s inside, or a bare string).
fn error_fields(error: &Value) -> (Option<String>, String) {
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    match error {
        Value::Object(o) => (
            text(o.get("code")).or_else(|| text(o.get("type"))),
            text(o.get("message")).unwrap_or_else(|| error.to_string()),
        ),
        Value::String(s) => (None, s.clone()),
        other => (None, other.to_string()),
    }
}

fn clip(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// What a response stream has said so far.
#[derive(Debug)]
pub struct StreamState {
    start: Instant,
    first_content: Option<Instant>,
    content_chunks: u64,
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    finished: bool,
    done: bool,
    failure: Option<Outcome>,
}

impl StreamState {
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            first_content: None,
            content_chunks: 0,
            completion_tokens: None,
            prompt_tokens: None,
            finished: false,
            done: false,
            failure: None,
        }
    }

    /// Takes one event's data (a JSON chunk or `[DONE]`), received at `now`. Returns `false`
    /// once the stream has failed (an error event, or data that is not JSON).
    pub fn on_event(&mut self, data: &str, now: Instant) -> bool {
        if self.failure.is_some() {
            return false;
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return true;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.failure = Some(Outcome::Protocol(format!(
                    "bad SSE data ({e}): {}",
                    clip(data)
                )));
                return false;
            }
        };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let (code, message) = error_fields(err);
            self.failure = Some(Outcome::StreamError {
                code: code.unwrap_or_else(|| "unknown".into()),
                message,
            });
            return false;
        }
        let mut content = false;
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = choice
                .get("text")
                .or_else(|| choice.pointer("/delta/content"))
                .and_then(Value::as_str);
            content |= text.is_some_and(|t| !t.is_empty());
            self.finished |= choice.get("finish_reason").is_some_and(|r| !r.is_null());
        }
        if content {
            self.content_chunks += 1;
            self.first_content.get_or_insert(now);
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            if let Some(n) = usage.get("completion_tokens").and_then(Value::as_u64) {
                self.completion_tokens = Some(n);
            }
            if let Some(n) = usage.get("prompt_tokens").and_then(Value::as_u64) {
                self.prompt_tokens = Some(n);
            }
        }
        true
    }

    /// Whether the stream said all it had to (`[DONE]` or a finish reason, no failure).
    pub fn complete(&self) -> bool {
        self.failure.is_none() && (self.done || self.finished)
    }

    /// The sample, with the stream over at `end`.
    pub fn into_sample(self, end: Instant, queue_ms: Option<f64>) -> Sample {
        let outcome = match self.failure {
            Some(f) => f,
            None if self.done || self.finished => Outcome::Ok,
            None => Outcome::Incomplete,
        };
        Sample {
            outcome,
            ttft: self.first_content.map(|t| t - self.start),
            e2e: end - self.start,
            completion_tokens: self.completion_tokens,
            prompt_tokens: self.prompt_tokens,
            content_chunks: self.content_chunks,
            queue_ms,
        }
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// One worker's connection: kept alive between requests, redialled when the server closed it.
#[derive(Debug)]
pub struct Connection {
    endpoint: Arc<Endpoint>,
    sender: Option<Sender>,
}

impl Connection {
    pub fn new(endpoint: Arc<Endpoint>) -> Self {
        Self {
            endpoint,
            sender: None,
        }
    }

    async fn dial(&self) -> Result<Sender, String> {
        let addr = &self.endpoint.addr;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// The kept-alive sender if it is still usable (`true`), else a fresh one (`false`).
    async fn sender(&mut self) -> Result<(Sender, bool), String> {
        if let Some(mut s) = self.sender.take() {
            if s.ready().await.is_ok() {
                return Ok((s, true));
            }
        }
        Ok((self.dial().await?, false))
    }

    /// POSTs one streaming completion request (`body` is its JSON) and reads the whole
    /// response, within `timeout`.
    pub async fn complete(&mut self, body: Bytes, timeout: Duration) -> Sample {
        let start = Instant::now();
        match tokio::time::timeout(timeout, self.exchange(body, start)).await {
            Ok(sample) => sample,
            Err(_) => {
                // The connection went down with the dropped future.
                self.sender = None;
                Sample::failed(Outcome::Timeout(timeout), start.elapsed())
            }
        }
    }

    async fn exchange(&mut self, body: Bytes, start: Instant) -> Sample {
        let failed = |outcome| Sample::failed(outcome, start.elapsed());
        let (mut sender, reused) = match self.sender().await {
            Ok(s) => s,
            Err(e) => return failed(Outcome::Transport(e)),
        };
        let path = self.endpoint.completions.clone();
        let request = |body| self.endpoint.request(Method::POST, &path, body);
        let mut resp = match request(body.clone()) {
            Ok(req) => sender.send_request(req).await,
            Err(e) => return failed(Outcome::Transport(e.to_string())),
        };
        // A kept-alive connection the server closed just as we sent: once more, on a fresh one.
        if reused && matches!(&resp, Err(e) if e.is_canceled() || e.is_incomplete_message()) {
            sender = match self.dial().await {
                Ok(s) => s,
                Err(e) => return failed(Outcome::Transport(e)),
            };
            resp = match request(body) {
                Ok(req) => sender.send_request(req).await,
                Err(e) => return failed(Outcome::Transport(e.to_string())),
            };
        }
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return failed(Outcome::Transport(format!("send: {e}"))),
        };
        let status = resp.status();
        let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let queue_ms = header(QUEUE_HEADER).and_then(|v| v.trim().parse::<f64>().ok());
        let sse = header(CONTENT_TYPE.as_str()).is_some_and(|t| t.starts_with("text/event-stream"));

        if !status.is_success() {
            let bytes = match resp.into_body().collect().await {
                Ok(c) => {
                    self.sender = Some(sender);
                    c.to_bytes()
                }
                Err(_) => Bytes::new(),
            };
            let (code, message) = match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => error_fields(v.get("error").unwrap_or(&v)),
                Err(_) => (None, clip(&String::from_utf8_lossy(&bytes))),
            };
            let mut s = failed(Outcome::Http {
                status: status.as_u16(),
                code,
                message,
            });
            s.queue_ms = queue_ms;
            return s;
        }

        let mut state = StreamState::new(start);
        let mut body = resp.into_body();
        if !sse {
            // Not a stream after all: the whole completion in one JSON body.
            return match body.collect().await {
                Ok(c) => {
                    self.sender = Some(sender);
                    let text = String::from_utf8_lossy(&c.to_bytes()).into_owned();
                    state.on_event(&text, Instant::now());
                    state.into_sample(Instant::now(), queue_ms)
                }
                Err(e) => failed(Outcome::Transport(format!("reading the body: {e}"))),
            };
        }
        let mut parser = SseParser::default();
        loop {
            match body.frame().await {
                None => break,
                Some(Err(e)) => {
                    let mut s = failed(Outcome::Transport(format!("reading the stream: {e}")));
                    s.queue_ms = queue_ms;
                    return s;
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let now = Instant::now();
                    for event in parser.push(&data) {
                        if !state.on_event(&event, now) {
                            // Failed: drop the connection rather than read the rest.
                            return state.into_sample(now, queue_ms);
                        }
                    }
                }
            }
        }
        if let Some(event) = parser.finish() {
            state.on_event(&event, Instant::now());
        }
        if state.complete() {
            self.sender = Some(sender);
        }
        state.into_sample(Instant::now(), queue_ms)
    }

    /// `GET /v1/models` → the first model's id.
    pub async fn first_model_id(&mut self, timeout: Duration) -> Result<String> {
        let fetch = async {
            let (mut sender, _) = self.sender().await.map_err(anyhow::Error::msg)?;
            let req = self
                .endpoint
                .request(Method::GET, &self.endpoint.models, Bytes::new())?;
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            self.sender = Some(sender);
            if !status.is_success() {
                bail!("GET {}: HTTP {status}", self.endpoint.models);
            }
            let v: Value = serde_json::from_slice(&bytes)?;
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("GET {}: no data[0].id", self.endpoint.models))
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| anyhow::anyhow!("GET {}: timed out", self.endpoint.models))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_paths() {
        for (url, addr, path, models) in [
            (
                "http://127.0.0.1:8100",
                "127.0.0.1:8100",
                "/v1/completions",
                "/v1/models",
            ),
            (
                "http://localhost:8100/",
                "localhost:8100",
                "/v1/completions",
                "/v1/models",
            ),
            ("http://h/v1", "h:80", "/v1/completions", "/v1/models"),
            (
                "http://h:1/p/v1/completions",
                "h:1",
                "/p/v1/completions",
                "/p/v1/models",
            ),
            (
                "http://[::1]:9/api",
                "[::1]:9",
                "/api/v1/completions",
                "/api/v1/models",
            ),
        ] {
            let e = Endpoint::parse(url, None).unwrap();
            assert_eq!(
                (e.addr.as_str(), e.completions_path(), e.models.as_str()),
                (addr, path, models),
                "{url}"
            );
        }
        assert!(Endpoint::parse("https://h", None).is_err());
        assert!(Endpoint::parse("h:80", None).is_err());
        let e = Endpoint::parse("http://h", Some("sk-1")).unwrap();
        assert_eq!(e.auth.unwrap().to_str().unwrap(), "Bearer sk-1");
    }

    #[test]
    fn sse_events_survive_any_split() {
        let body = "data: {\"a\":1}\n\ndata: {\"b\":\n: comment\nevent: x\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
        let want = vec!["{\"a\":1}", "{\"b\":\n2}", "[DONE]"];
        for cut in 0..body.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&body.as_bytes()[..cut]);
            got.extend(p.push(&body.as_bytes()[cut..]));
            got.extend(p.finish());
            assert_eq!(got, want, "cut at {cut}");
        }
        // One byte at a time, and a last event without its blank line.
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for b in "data: x\n\ndata: y".bytes() {
            got.extend(p.push(&[b]));
        }
        got.extend(p.finish());
        assert_eq!(got, vec!["x", "y"]);
    }

    #[test]
    fn stream_state_counts_content_usage_and_errors() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"","finish_reason":null}]}"#, at(5)));
        assert!(s.on_event(
            r#"{"choices":[{"text":"Hi","finish_reason":null}]}"#,
            at(10)
        ));
        assert!(s.on_event(
            r#"{"choices":[{"text":" there","finish_reason":null}]}"#,
            at(20)
        ));
        assert!(s.on_event(
            r#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            at(21)
        ));
        assert!(s.complete());
        assert!(s.on_event(
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#,
            at(22)
        ));
        assert!(s.on_event("[DONE]", at(23)));
        let sample = s.into_sample(at(30), Some(4.0));
        assert_eq!(sample.outcome, Outcome::Ok);
        assert_eq!(sample.ttft, Some(Duration::from_millis(10)));
        assert_eq!(sample.e2e, Duration::from_millis(30));
        assert_eq!((sample.content_chunks, sample.tokens()), (2, 3));
        assert_eq!(sample.prompt_tokens, Some(7));

        // Chat-style deltas count too; without usage the chunks are the tokens.
        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"delta":{"content":"a"}}]}"#, at(1)));
        assert!(s.on_event("[DONE]", at(2)));
        let sample = s.into_sample(at(2), None);
        assert_eq!((&sample.outcome, sample.tokens()), (&Outcome::Ok, 1));

        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"a"}]}"#, at(1)));
        assert!(!s.on_event(
            r#"{"error":{"message":"kv full","type":"server_error","code":"internal_error"}}"#,
            at(2)
        ));
        let sample = s.into_sample(at(2), None);
        assert_eq!(sample.outcome.label(), "stream_error:internal_error");
        assert_eq!(sample.outcome.message(), "kv full");

        // llama.cpp's numeric codes.
        let mut s = StreamState::new(t0);
        assert!(!s.on_event(
            r#"{"error":{"code":500,"message":"x","type":"server_error"}}"#,
            at(1)
        ));
        assert_eq!(
            s.into_sample(at(1), None).outcome.label(),
            "stream_error:500"
        );

        let mut s = StreamState::new(t0);
        assert!(!s.on_event("not json", at(1)));
        assert_eq!(s.into_sample(at(1), None).outcome.label(), "protocol_error");

        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"a","finish_reason":null}]}"#, at(1)));
        assert_eq!(s.into_sample(at(1), None).outcome, Outcome::Incomplete);
    }
}
