//! A scripted OpenAI-compatible server with known latencies, started inside the test on
//! `127.0.0.1:0` (plain or TLS), and prompts that need no tokenizer.
#![allow(dead_code, clippy::unwrap_used)] // each test binary uses part of it; a broken fake should fail loudly

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::channel::{Channel, Sender};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice_loadtests::prompts::PromptSource;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub const KEY: &str = "test-key";
pub const MODEL: &str = "fake-model";
/// Before a stream's first content chunk, per request in flight (so more concurrency costs
/// TTFT, as on a real server).
pub const FIRST_CONTENT: Duration = Duration::from_millis(60);
/// Between content chunks.
pub const CHUNK_GAP: Duration = Duration::from_millis(5);

/// What the fake does with the n-th request it receives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// 4 content chunks (or, for chat: the needle's code when asked, a tool call when tools
    /// are offered), a finish chunk, usage claiming `max_tokens` completion tokens.
    Ok,
    /// Like `Ok`, but a wrong needle answer or a tool call whose arguments do not parse.
    Wrong,
    /// 3 content chunks and a finish chunk, no usage.
    OkNoUsage,
    /// HTTP 503 `overloaded` with `x-sluice-queue-ms` and `Retry-After: 1`, as the gateway
    /// sheds.
    Shed,
    /// One content chunk, then `data: {"error": ...}`.
    StreamError,
    /// Headers, then nothing for a long time.
    Hang,
}

/// Requests 4k..4k+3 are: ok, shed, ok without usage, error event.
pub fn mixed(n: usize) -> Kind {
    [Kind::Ok, Kind::Shed, Kind::OkNoUsage, Kind::StreamError][n % 4]
}

/// Even requests shed, odd ones answered: each request is served on its first retry.
pub fn shed_every_other(n: usize) -> Kind {
    if n.is_multiple_of(2) {
        Kind::Shed
    } else {
        Kind::Ok
    }
}

/// Even requests right, odd ones wrong.
pub fn alternating(n: usize) -> Kind {
    if n.is_multiple_of(2) {
        Kind::Ok
    } else {
        Kind::Wrong
    }
}

#[derive(Debug)]
pub struct Fake {
    pub addr: SocketAddr,
    tls: bool,
    plan: fn(usize) -> Kind,
    arrivals: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    prompts: Mutex<Vec<String>>,
    /// Requests that were not what the client should send.
    rejected: Mutex<Vec<String>>,
}

impl Fake {
    pub async fn start(plan: fn(usize) -> Kind) -> Arc<Self> {
        Self::serve(plan, None).await
    }

    /// Over TLS with a self-signed `localhost` certificate; returns the fake and its
    /// certificate's PEM file (the CA to trust).
    pub async fn start_tls(plan: fn(usize) -> Kind) -> (Arc<Self>, PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let pem = std::env::temp_dir().join(format!(
            "sluice-load-fake-{}-{}.pem",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::write(&pem, cert.cert.pem()).unwrap();
        let key =
            rustls_pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let fake = Self::serve(plan, Some(TlsAcceptor::from(Arc::new(config)))).await;
        (fake, pem)
    }

    async fn serve(plan: fn(usize) -> Kind, tls: Option<TlsAcceptor>) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            tls: tls.is_some(),
            plan,
            arrivals: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            prompts: Mutex::new(Vec::new()),
            rejected: Mutex::new(Vec::new()),
        });
        let server = fake.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (fake, tls) = (server.clone(), tls.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| fake.clone().handle(req));
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(stream), svc).await,
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(s) => http.serve_connection(TokioIo::new(s), svc).await,
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        fake
    }

    pub fn url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn arrivals(&self) -> usize {
        self.arrivals.load(Ordering::SeqCst)
    }

    pub fn prompts(&self) -> Vec<String> {
        self.prompts.lock().unwrap().clone()
    }

    pub fn distinct_prompts(&self) -> usize {
        let mut p = self.prompts();
        p.sort();
        p.dedup();
        p.len()
    }

    pub fn rejected(&self) -> Vec<String> {
        self.rejected.lock().unwrap().clone()
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Channel<Bytes>>, Infallible> {
        let (tx, body) = Channel::new(256);
        let respond = |status: StatusCode, content_type: &str| {
            Response::builder()
                .status(status)
                .header(CONTENT_TYPE, content_type)
        };
        if req.uri().path() == "/v1/models" {
            send_all(
                tx,
                vec![json!({"object": "list", "data": [{"id": MODEL}]}).to_string()],
            );
            return Ok(respond(StatusCode::OK, "application/json")
                .body(body)
                .unwrap());
        }
        let auth = req.headers().get(AUTHORIZATION).cloned();
        let path = req.uri().path().to_owned();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let chat = path == "/v1/chat/completions";
        let prompt = if chat {
            v.pointer("/messages/0/content").and_then(Value::as_str)
        } else {
            v["prompt"].as_str()
        };
        let expected = (chat || path == "/v1/completions")
            && auth.as_ref().and_then(|a| a.to_str().ok()) == Some(&format!("Bearer {KEY}"))
            && v["model"] == MODEL
            && v["temperature"] == 0
            && (chat || v["ignore_eos"] == true)
            && v["stream"] == true
            && v["stream_options"]["include_usage"] == true
            && prompt.is_some()
            && v["max_tokens"].is_u64();
        if !expected {
            self.rejected
                .lock()
                .unwrap()
                .push(format!("{path} {auth:?} {v}"));
            send_all(
                tx,
                vec![json!({"error": {"code": "unexpected_request"}}).to_string()],
            );
            return Ok(respond(StatusCode::BAD_REQUEST, "application/json")
                .body(body)
                .unwrap());
        }
        let prompt = prompt.unwrap_or_default().to_owned();
        self.prompts.lock().unwrap().push(prompt.clone());
        let kind = (self.plan)(self.arrivals.fetch_add(1, Ordering::SeqCst));
        if let Kind::Shed = kind {
            let error = json!({"error": {"message": "the queue is full",
                "type": "overloaded", "param": null, "code": "overloaded"}});
            send_all(tx, vec![error.to_string()]);
            let resp = respond(StatusCode::SERVICE_UNAVAILABLE, "application/json")
                .header("x-sluice-queue-ms", "0.5")
                .header("retry-after", "1");
            return Ok(resp.body(body).unwrap());
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let mut resp = respond(StatusCode::OK, "text/event-stream");
        if let Kind::Ok = kind {
            resp = resp.header("x-sluice-queue-ms", "2.5");
        }
        let answer = Answer {
            kind,
            chat,
            tools: v.get("tools").is_some(),
            prompt,
            max_tokens: v["max_tokens"].as_u64().unwrap(),
            wait: FIRST_CONTENT * now as u32,
        };
        tokio::spawn(async move {
            answer.stream(tx).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(resp.body(body).unwrap())
    }
}

fn rand_suffix() -> u64 {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst) as u64
}

fn send_all(mut tx: Sender<Bytes>, parts: Vec<String>) {
    for p in parts {
        tx.try_send(hyper::body::Frame::data(Bytes::from(p)))
            .unwrap();
    }
}

struct Answer {
    kind: Kind,
    chat: bool,
    tools: bool,
    prompt: String,
    max_tokens: u64,
    wait: Duration,
}

impl Answer {
    fn chunk(&self, text: &str, finish: Option<&str>) -> String {
        let choice = if self.chat {
            json!({"index": 0, "delta": {"content": text}, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        format!(
            "data: {}\n\n",
            json!({"id": "x-1", "model": MODEL, "choices": [choice]})
        )
    }

    /// The content pieces: the needle's code (or a wrong one) when the prompt hides one, else
    /// numbered tokens.
    fn pieces(&self) -> Vec<String> {
        const NEEDLE: &str = "secret code for the archive is ";
        if let Some(at) = self.prompt.find(NEEDLE) {
            let code = self.prompt[at + NEEDLE.len()..]
                .split('.')
                .next()
                .unwrap_or("");
            let said = if self.kind == Kind::Wrong {
                "none-0000"
            } else {
                code
            };
            return vec![
                "The code is ".into(),
                said.into(),
                ".".into(),
                String::new(),
            ];
        }
        let n = if self.kind == Kind::OkNoUsage { 3 } else { 4 };
        (0..n).map(|k| format!(" tok{k}")).collect()
    }

    async fn stream(self, mut tx: Sender<Bytes>) {
        let mut send = |s: String| {
            tx.try_send(hyper::body::Frame::data(Bytes::from(s)))
                .is_ok()
        };
        if let Kind::Hang = self.kind {
            tokio::time::sleep(Duration::from_secs(10)).await;
            return;
        }
        // An empty chunk first: TTFT waits for content.
        send(self.chunk("", None));
        tokio::time::sleep(self.wait).await;
        if self.tools {
            let args = if self.kind == Kind::Wrong {
                "{\"city\": "
            } else {
                "{\"city\": \"Oslo\"}"
            };
            for delta in [
                json!({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": args}}]}),
            ] {
                let c = json!({"id": "x", "choices": [{"index": 0, "delta": delta}]});
                send(format!("data: {c}\n\n"));
                tokio::time::sleep(CHUNK_GAP).await;
            }
        } else {
            let stop = if self.kind == Kind::StreamError {
                1
            } else {
                usize::MAX
            };
            for (k, piece) in self.pieces().iter().take(stop).enumerate() {
                let c = self.chunk(piece, None);
                // The first event arrives cut in two.
                let (a, b) = c.split_at(if k == 0 { 17 } else { c.len() });
                send(a.to_owned());
                if !b.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    send(b.to_owned());
                }
                tokio::time::sleep(CHUNK_GAP).await;
            }
        }
        if let Kind::StreamError = self.kind {
            let e = json!({"error": {"message": "kv cache exhausted", "type": "server_error",
                "code": "internal_error"}});
            send(format!("data: {e}\n\n"));
            send("data: [DONE]\n\n".into());
            return;
        }
        send(self.chunk("", Some("length")));
        if self.kind != Kind::OkNoUsage {
            let usage = json!({"choices": [], "usage": {"prompt_tokens": 9,
                "completion_tokens": self.max_tokens, "total_tokens": 9 + self.max_tokens}});
            send(format!("data: {usage}\n\n"));
        }
        send("data: [DONE]\n\n".into());
    }
}

/// Prompts that name their request and size: no tokenizer needed.
#[derive(Debug)]
pub struct Numbered;

impl PromptSource for Numbered {
    fn prompt(&self, tokens: usize, request: u64) -> sluice_loadtests::Result<String> {
        Ok(format!(
            "request {request}, {tokens} tokens. Filler. More filler. The end."
        ))
    }
}

/// The bundled model, when fetched (tests that need its tokenizer skip without it).
pub fn model_path() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(sluice_engine::model::DEFAULT_MODEL_PATH);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipping: model {} not found (scripts/fetch-model.sh fetches it)",
            path.display()
        );
        None
    }
}
