//! The server over real HTTP on 127.0.0.1, against a scripted fake engine.

mod chat;
mod completions;
mod errors;
mod fields;
mod lifecycle;
mod tools;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::api::{
    Engine, EngineError, GenerationEvent, GenerationRequest, Health, MetricsSnapshot, RankHealth,
    Timings,
};
use crate::generate::{FinishReason, Grammars};
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::test_support::{toy_tokenizer, SMOLLM_TEMPLATE};
use crate::model::tokenizer::Tokenizer;

pub(super) const CONTEXT: usize = 2048;
pub(super) const MODEL: &str = "smollm2-test";

/// What the fake engine does with one submitted request.
pub(super) enum Script {
    /// These token texts, then `Finished` with this reason and the exact counts.
    Reply(Vec<&'static str>, FinishReason),
    /// These events verbatim.
    Events(Vec<GenerationEvent>),
    /// Refuse at submit.
    Refuse(EngineError),
    /// These token texts, then hand the sender to the test (see [`TestServer::held`]).
    Hold(Vec<&'static str>),
    /// Panic in `submit` (a bug somewhere under a handler).
    Panic,
}

type Sender = mpsc::UnboundedSender<GenerationEvent>;

/// A test double of the engine: scripted answers, recorded requests.
pub(super) struct FakeEngine {
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    scripts: Mutex<VecDeque<Script>>,
    pub requests: Mutex<Vec<GenerationRequest>>,
    held_tx: mpsc::UnboundedSender<Sender>,
    pub healthy: AtomicBool,
    grammars: Grammars,
}

fn token(i: usize, text: &str) -> GenerationEvent {
    GenerationEvent::Token {
        id: u32::try_from(i).unwrap(),
        text: text.to_owned(),
        logprob: None,
    }
}

fn finished(prompt: usize, completion: usize, reason: FinishReason) -> GenerationEvent {
    GenerationEvent::Finished {
        text: String::new(),
        reason,
        prompt_tokens: prompt,
        completion_tokens: completion,
        timings: Timings::default(),
    }
}

impl Engine for FakeEngine {
    fn model_id(&self) -> &str {
        MODEL
    }
    fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
    fn chat_template(&self) -> &ChatTemplate {
        &self.template
    }
    fn context_window(&self) -> usize {
        CONTEXT
    }
    fn grammars(&self) -> Option<&Grammars> {
        Some(&self.grammars)
    }
    fn submit(
        &self,
        req: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<GenerationEvent>, EngineError> {
        let n_prompt = req.prompt.len();
        self.requests.lock().unwrap().push(req);
        let script = self
            .scripts
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Script::Reply(vec!["Hello", " world"], FinishReason::Stop));
        let (tx, rx) = mpsc::unbounded_channel();
        match script {
            Script::Refuse(e) => return Err(e),
            Script::Panic => panic!("a scripted bug"),
            Script::Reply(texts, reason) => {
                for (i, t) in texts.iter().enumerate() {
                    tx.send(token(i, t)).unwrap();
                }
                tx.send(finished(n_prompt, texts.len(), reason)).unwrap();
            }
            Script::Events(events) => events.into_iter().for_each(|e| tx.send(e).unwrap()),
            Script::Hold(texts) => {
                for (i, t) in texts.iter().enumerate() {
                    tx.send(token(i, t)).unwrap();
                }
                self.held_tx.send(tx).unwrap();
            }
        }
        Ok(rx)
    }
    fn health(&self) -> Health {
        let up = self.healthy.load(Ordering::SeqCst);
        Health {
            status: if up { "ok" } else { "degraded" },
            ranks: vec![rank(0, true), rank(1, up)],
        }
    }
    fn metrics(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            num_requests_running: 1,
            kv_cache_usage: 0.5,
            prompt_tokens_total: 10,
            generation_tokens_total: 20,
            requests_finished_stop: 3,
            requests_finished_length: 1,
            ranks: vec![rank(0, true), rank(1, true)],
            ..MetricsSnapshot::default()
        }
    }
}

fn rank(rank: usize, up: bool) -> RankHealth {
    RankHealth {
        rank,
        layers: [rank * 15, rank * 15 + 14],
        up,
        kv_tokens_total: 4096,
        kv_tokens_used: 64,
        weight_bytes: 1000,
        kv_bytes: 2000,
    }
}

/// A running server with its fake engine.
pub(super) struct TestServer {
    pub addr: SocketAddr,
    pub engine: Arc<FakeEngine>,
    held_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Sender>>,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    pub async fn start(scripts: Vec<Script>) -> Self {
        Self::start_with_drain(scripts, std::time::Duration::from_secs(30)).await
    }

    /// A server that lets requests in flight finish for at most `drain` once shut down.
    pub async fn start_with_drain(scripts: Vec<Script>, drain: std::time::Duration) -> Self {
        let (held_tx, held_rx) = mpsc::unbounded_channel();
        let tokenizer = Arc::new(toy_tokenizer());
        let eos = tokenizer.token_id("<|im_end|>").unwrap();
        let engine = Arc::new(FakeEngine {
            grammars: Grammars::new(tokenizer.clone(), eos).unwrap(),
            tokenizer,
            template: ChatTemplate::new(SMOLLM_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap(),
            scripts: Mutex::new(scripts.into()),
            requests: Mutex::new(Vec::new()),
            held_tx,
            healthy: AtomicBool::new(true),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(super::serve(listener, engine.clone(), stopped, drain));
        Self {
            addr,
            engine,
            held_rx: tokio::sync::Mutex::new(held_rx),
            stop: Some(stop),
            task,
        }
    }

    /// The sender of the next `Script::Hold` request.
    pub async fn held(&self) -> Sender {
        let mut rx = self.held_rx.lock().await;
        within(rx.recv()).await.unwrap()
    }

    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).unwrap();
        }
    }

    /// The last request the engine saw.
    pub fn last_request(&self) -> GenerationRequest {
        self.engine.requests.lock().unwrap().last().unwrap().clone()
    }

    /// The last prompt, decoded.
    pub fn last_prompt(&self) -> String {
        let ids = self.last_request().prompt;
        self.engine.tokenizer.decode(&ids, false).unwrap()
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, &body.to_string(), &[]).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, "", &[]).await
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        send(self.addr, method, path, body, headers).await
    }

    pub async fn open(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (Response<Incoming>, JoinHandle<()>) {
        open(self.addr, method, path, body, headers).await
    }
}

/// One request over a fresh HTTP/1.1 connection, read to the end.
pub(super) async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let (resp, conn) = open(addr, method, path, body, headers).await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = within(resp.into_body().collect()).await.unwrap().to_bytes();
    conn.abort();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// Sends a request over a fresh HTTP/1.1 connection and waits for the response head; the
/// handle owns the connection.
pub(super) async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (Response<Incoming>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = within(sender.send_request(req)).await.unwrap();
    (resp, conn)
}

/// Fails the test instead of hanging.
pub(super) async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(5), f)
        .await
        .expect("timed out")
}

#[derive(Debug)]
pub(super) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an event stream, in order.
    pub fn events(&self) -> Vec<String> {
        assert_eq!(
            self.headers["content-type"], "text/event-stream",
            "{}",
            self.body
        );
        assert!(self.body.ends_with("\n\n"), "{:?}", self.body);
        self.body
            .split_terminator("\n\n")
            .map(|e| e.strip_prefix("data: ").unwrap().to_owned())
            .collect()
    }

    /// Asserts an OpenAI error body; returns the error object.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.headers["content-type"], "application/json");
        let v = self.json();
        let e = v["error"].clone();
        for key in ["message", "type", "param", "code"] {
            assert!(e.get(key).is_some(), "no {key} in {v}");
        }
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        e
    }
}
