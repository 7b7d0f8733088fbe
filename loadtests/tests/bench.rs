//! `bench` against a fake OpenAI-compatible SSE server started inside the test.
#![allow(clippy::unwrap_used)] // test scaffolding: a broken fake should fail loudly

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
use sluice_loadtests::client::Endpoint;
use sluice_loadtests::prompts::{PromptBuilder, PromptSource};
use sluice_loadtests::run::{self, BenchConfig};
use sluice_loadtests::stats::LevelStats;
use tokio::net::TcpListener;

const KEY: &str = "test-key";
const MODEL: &str = "fake-model";
/// Before a stream's first content chunk.
const FIRST_CONTENT: Duration = Duration::from_millis(60);

/// What the fake does with the n-th request it receives.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// 4 content chunks, a finish chunk, usage claiming `max_tokens` completion tokens.
    Ok,
    /// 3 content chunks and a finish chunk, no usage.
    OkNoUsage,
    /// HTTP 503 with an OpenAI error body.
    Unavailable,
    /// One content chunk, then `data: {"error": ...}`.
    StreamError,
    /// Headers, then nothing for a long time.
    Hang,
}

/// Requests 4k..4k+3 are: ok, 503, ok without usage, error event.
fn mixed(n: usize) -> Kind {
    [
        Kind::Ok,
        Kind::Unavailable,
        Kind::OkNoUsage,
        Kind::StreamError,
    ][n % 4]
}

#[derive(Debug)]
struct Fake {
    addr: SocketAddr,
    plan: fn(usize) -> Kind,
    arrivals: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    prompts: Mutex<Vec<String>>,
    /// Requests that were not what `bench` should send.
    rejected: Mutex<Vec<String>>,
}

impl Fake {
    async fn start(plan: fn(usize) -> Kind) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
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
                let fake = server.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| fake.clone().handle(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        fake
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    fn prompts(&self) -> Vec<String> {
        self.prompts.lock().unwrap().clone()
    }

    fn rejected(&self) -> Vec<String> {
        self.rejected.lock().unwrap().clone()
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Channel<Bytes>>, Infallible> {
        let (tx, body) = Channel::new(64);
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
        let expected = path == "/v1/completions"
            && auth.as_ref().and_then(|a| a.to_str().ok()) == Some(&format!("Bearer {KEY}"))
            && v["model"] == MODEL
            && v["temperature"] == 0
            && v["ignore_eos"] == true
            && v["stream"] == true
            && v["stream_options"]["include_usage"] == true
            && v["prompt"].is_string()
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
        self.prompts
            .lock()
            .unwrap()
            .push(v["prompt"].as_str().unwrap().to_owned());
        let max_tokens = v["max_tokens"].as_u64().unwrap();
        let kind = (self.plan)(self.arrivals.fetch_add(1, Ordering::SeqCst));

        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Kind::Unavailable = kind {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let error = json!({"error": {"message": "the engine is busy",
                "type": "engine_unavailable", "param": null, "code": "engine_unavailable"}});
            send_all(tx, vec![error.to_string()]);
            let resp = respond(StatusCode::SERVICE_UNAVAILABLE, "application/json");
            return Ok(resp.body(body).unwrap());
        }
        let mut resp = respond(StatusCode::OK, "text/event-stream");
        if let Kind::Ok = kind {
            resp = resp.header("x-sluice-queue-ms", "2.5");
        }
        tokio::spawn(async move {
            stream(tx, kind, max_tokens).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(resp.body(body).unwrap())
    }
}

fn send_all(mut tx: Sender<Bytes>, parts: Vec<String>) {
    for p in parts {
        tx.try_send(hyper::body::Frame::data(Bytes::from(p)))
            .unwrap();
    }
}

fn chunk(text: &str, finish: Option<&str>) -> String {
    let c = json!({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

async fn stream(mut tx: Sender<Bytes>, kind: Kind, max_tokens: u64) {
    let sleep = |ms| tokio::time::sleep(Duration::from_millis(ms));
    let mut send = |s: String| {
        tx.try_send(hyper::body::Frame::data(Bytes::from(s)))
            .is_ok()
    };
    if let Kind::Hang = kind {
        sleep(10_000).await;
        return;
    }
    // An empty chunk first: TTFT waits for content.
    send(chunk("", None));
    tokio::time::sleep(FIRST_CONTENT).await;
    let content = match kind {
        Kind::Ok => 4,
        Kind::OkNoUsage => 3,
        _ => 1,
    };
    for k in 0..content {
        let c = chunk(&format!(" tok{k}"), None);
        // The first event arrives cut in two.
        let (a, b) = c.split_at(if k == 0 { 17 } else { c.len() });
        send(a.to_owned());
        if !b.is_empty() {
            sleep(2).await;
            send(b.to_owned());
        }
        sleep(3).await;
    }
    if let Kind::StreamError = kind {
        let e = json!({"error": {"message": "kv cache exhausted", "type": "server_error",
            "code": "internal_error"}});
        send(format!("data: {e}\n\n"));
        send("data: [DONE]\n\n".into());
        return;
    }
    send(chunk("", Some("length")));
    if let Kind::Ok = kind {
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 9,
            "completion_tokens": max_tokens, "total_tokens": 9 + max_tokens}});
        send(format!("data: {usage}\n\n"));
    }
    send("data: [DONE]\n\n".into());
}

/// Prompts that name their request: no tokenizer needed.
struct Numbered;

impl PromptSource for Numbered {
    fn prompt(&self, tokens: usize, request: u64) -> anyhow::Result<String> {
        Ok(format!("request {request}, {tokens} tokens"))
    }
}

fn config(fake: &Fake, concurrency: Vec<usize>, requests: Option<usize>) -> BenchConfig {
    BenchConfig {
        endpoint: Arc::new(Endpoint::parse(&fake.url(), Some(KEY)).unwrap()),
        model_name: MODEL.into(),
        shapes: vec!["16:5".parse().unwrap()],
        concurrency,
        requests,
        timeout: Duration::from_secs(20),
        progress: false,
    }
}

/// The 8-request mixed level: 2 of each kind.
fn check_mixed_level(l: &LevelStats) {
    assert_eq!((l.total, l.succeeded), (8, 4), "{l:?}");
    let outcomes: Vec<(&str, usize)> = l.outcomes.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        outcomes,
        [
            ("http_503:engine_unavailable", 2),
            ("ok", 4),
            ("stream_error:internal_error", 2)
        ]
    );
    assert_eq!(
        l.failure_examples["stream_error:internal_error"],
        "kv cache exhausted"
    );
    assert_eq!(
        l.failure_examples["http_503:engine_unavailable"],
        "the engine is busy"
    );
    // Usage (5) where sent, else the 3 content chunks.
    assert_eq!(l.completion_tokens, 2 * 5 + 2 * 3);
    assert_eq!(l.usage_reported, 2);
    assert_eq!(l.prompt_tokens_mean, Some(9.0));
    assert_eq!(l.ttft_ms.count, 4);
    assert_eq!(l.e2e_ms.count, 4);
    let first = FIRST_CONTENT.as_secs_f64() * 1e3;
    let (ttft50, ttft95) = (l.ttft_ms.p50.unwrap(), l.ttft_ms.p95.unwrap());
    assert!(ttft50 >= first && ttft95 < first + 500.0, "{:?}", l.ttft_ms);
    assert!(
        l.e2e_ms.p50.unwrap() > ttft50,
        "{:?} {:?}",
        l.e2e_ms,
        l.ttft_ms
    );
    assert_eq!((l.queue_ms.count, l.queue_ms.p50), (2, Some(2.5)));
    let tok_s = l.output_tok_per_s();
    assert!(tok_s > 0.0 && (tok_s - 16.0 / l.wall.as_secs_f64()).abs() < 1e-9);
}

#[tokio::test]
async fn bench_counts_requests_tokens_ttft_and_errors() {
    let fake = Fake::start(mixed).await;
    let cfg = config(&fake, vec![2], Some(8));
    let mut seen = 0;
    let levels = run::bench(&cfg, Arc::new(Numbered), |_| seen += 1)
        .await
        .unwrap();
    assert_eq!(fake.rejected(), Vec::<String>::new());
    assert_eq!((levels.len(), seen), (1, 1));
    assert_eq!(levels[0].concurrency, 2);
    check_mixed_level(&levels[0]);
    assert_eq!(fake.max_in_flight(), 2);
    let mut prompts = fake.prompts();
    prompts.sort();
    prompts.dedup();
    assert_eq!(prompts.len(), 8, "every request has its own prompt");
}

#[tokio::test]
async fn levels_run_in_turn_with_default_request_counts() {
    let fake = Fake::start(|_| Kind::Ok).await;
    let levels = run::bench(
        &config(&fake, vec![1, 3, 5], None),
        Arc::new(Numbered),
        |_| (),
    )
    .await
    .unwrap();
    let got: Vec<(usize, usize, usize)> = levels
        .iter()
        .map(|l| (l.concurrency, l.total, l.succeeded))
        .collect();
    assert_eq!(got, [(1, 8, 8), (3, 8, 8), (5, 10, 10)]);
    assert!(levels
        .iter()
        .all(|l| l.completion_tokens == 5 * l.total as u64));
    assert_eq!(fake.max_in_flight(), 5);
    // Request numbers run on across levels: no prompt repeats.
    let mut prompts = fake.prompts();
    prompts.sort();
    prompts.dedup();
    assert_eq!(prompts.len(), 26);
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_failures() {
    let fake = Fake::start(|_| Kind::Hang).await;
    let mut cfg = config(&fake, vec![2], Some(2));
    cfg.timeout = Duration::from_millis(300);
    let levels = run::bench(&cfg, Arc::new(Numbered), |_| ()).await.unwrap();
    assert_eq!(levels[0].succeeded, 0);
    assert_eq!(levels[0].outcomes["timeout"], 2);
    assert!(levels[0].wall < Duration::from_secs(5));

    // A port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    cfg.endpoint = Arc::new(Endpoint::parse(&url, None).unwrap());
    let levels = run::bench(&cfg, Arc::new(Numbered), |_| ()).await.unwrap();
    assert_eq!(levels[0].outcomes["transport_error"], 2);
}

fn model_path() -> Option<PathBuf> {
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

/// The binary end to end: real prompts of an exact size, the model name from `/v1/models`,
/// JSON lines and the table.
#[tokio::test]
async fn the_cli_reports_json_lines_and_a_table() {
    let Some(model) = model_path() else { return };
    let fake = Fake::start(mixed).await;
    let run_cli = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-load"));
        cmd.args([
            "bench",
            "--url",
            &fake.url(),
            "--concurrency",
            "2",
            "--shape",
            "32:5",
        ])
        .args([
            "--requests",
            "8",
            "--api-key",
            KEY,
            "--timeout",
            "20s",
            "--seed",
            "7",
        ])
        .arg("--model")
        .arg(&model)
        .args(extra);
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let out = run_cli(&["--json"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let l = &lines[0];
    assert_eq!(l["model"], MODEL);
    assert_eq!(
        (l["shape"].as_str(), l["input_tokens"].as_u64()),
        (Some("32:5"), Some(32))
    );
    assert_eq!(
        (l["concurrency"].as_u64(), l["requests"].as_u64()),
        (Some(2), Some(8))
    );
    assert_eq!(
        (l["succeeded"].as_u64(), l["failed"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(l["outcomes"]["http_503:engine_unavailable"], 2);
    assert_eq!(l["outcomes"]["stream_error:internal_error"], 2);
    assert_eq!(l["completion_tokens"], 16);
    assert!(l["ttft_ms"]["p50"].as_f64().unwrap() >= FIRST_CONTENT.as_secs_f64() * 1e3);
    assert_eq!(l["queue_ms"]["p95"], 2.5);
    assert_eq!(fake.rejected(), Vec::<String>::new());

    let builder = PromptBuilder::from_model(&model, 0).unwrap();
    let prompts = fake.prompts();
    assert_eq!(prompts.len(), 8);
    for p in &prompts {
        assert_eq!(builder.count(p).unwrap(), 32, "{p:?}");
    }

    let out = run_cli(&[]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let mut lines = stdout.lines();
    assert!(lines.next().unwrap().starts_with("shape"), "{stdout}");
    assert!(lines.next().unwrap().starts_with("32:5 "), "{stdout}");
    assert!(
        stdout.contains("stream_error:internal_error: kv cache exhausted"),
        "{stdout}"
    );
}
