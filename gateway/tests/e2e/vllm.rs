//! The gateway in front of a real vLLM (the CPU build, installed and the bundled model
//! converted by `scripts/vllm-peer.sh`): exact counting with vLLM's own tokenizer and template,
//! the saturation gate on vLLM's metrics, vLLM's own 503, disconnects and overload.
//!
//! One vLLM serves every test here (`--max-num-seqs 8 --max-num-queued-reqs 10`: vLLM 0.32
//! holds at most 10 requests, running or waiting, and answers the 11th with its 503; measured:
//! with `--max-num-queued-reqs 8`, 8 running left no room to wait), started on
//! first use and stopped when this process ends (or the one `SLUICE_VLLM_URL` names). Each
//! test, once vLLM is up, holds the same turn as the tests that run the bundled engine
//! (`engine::exclusive`): vLLM's inference beside the engine's on two cores starved both (a
//! Redis call of the shared-ceiling test ran past its bound while vLLM served a test here).
//! Without vLLM they skip,
//! unless `SLUICE_REQUIRE_VLLM=1` (CI), which makes a missing vLLM a failure.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{json, Value};
use sluice_gateway::middleware::count::PromptCounter;
use sluice_gateway::policy::{Policy, UpstreamKind};

use crate::common::{eventually, policy, Gateway};

const MODEL: &str = "SmolLM2-135M-Instruct";

struct Vllm {
    url: String,
    addr: String,
    model_dir: PathBuf,
}

static VLLM: OnceLock<Option<Vllm>> = OnceLock::new();

/// The shared vLLM, started on first use; none (skip) when it is not installed, unless CI
/// requires it.
fn vllm() -> Option<&'static Vllm> {
    VLLM.get_or_init(start).as_ref()
}

fn start() -> Option<Vllm> {
    let dir = std::env::var_os("SLUICE_VLLM_DIR").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/sluice/vllm"),
        PathBuf::from,
    );
    let (py, model_dir) = (dir.join("venv/bin/python"), dir.join("model"));
    wait_for_install();
    // One already running or starting (`scripts/vllm-peer.sh start PORT --max-num-seqs 8
    // --max-num-queued-reqs 10`; .ci/run starts it while the tests build): waited for until
    // healthy. Saves its minutes of start-up.
    if let Ok(url) = std::env::var("SLUICE_VLLM_URL") {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let started = Instant::now();
        while get(&addr, "/health").is_none_or(|(status, _)| status != 200) {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "the vLLM at SLUICE_VLLM_URL={url} was not healthy within 600 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        return Some(Vllm {
            url: format!("http://{addr}"),
            addr,
            model_dir,
        });
    }
    if !py.exists() || !model_dir.join("config.json").exists() {
        assert!(
            std::env::var("SLUICE_REQUIRE_VLLM").as_deref() != Ok("1"),
            "SLUICE_REQUIRE_VLLM=1 but there is no vLLM in {} (run scripts/vllm-peer.sh)",
            dir.display()
        );
        eprintln!(
            "vllm: not installed in {} (scripts/vllm-peer.sh); skipping",
            dir.display()
        );
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = std::env::temp_dir().join(format!("sluice-vllm-{}.log", std::process::id()));
    let log_file = std::fs::File::create(&log).expect("log");
    // The engine goes when this process does: a watcher shell kills it once its parent is gone.
    let mut watcher = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#""$@" & child=$!; while kill -0 "$PPID" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 1; done; kill "$child" 2>/dev/null; sleep 2; kill -9 "$child" 2>/dev/null"#)
        .arg("vllm")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/vllm-peer.sh"))
        .args(["start", &port.to_string()])
        .args(["--max-num-seqs", "8", "--max-num-queued-reqs", "10"])
        .stdout(log_file.try_clone().expect("log"))
        .stderr(log_file)
        .spawn()
        .expect("start vLLM");
    // Reaped by a thread of its own: it ends with this process (the watcher's rule above).
    std::thread::spawn(move || watcher.wait());
    let addr = format!("127.0.0.1:{port}");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if get(&addr, "/health").is_some_and(|(status, _)| status == 200) {
            eprintln!("vllm: up on {addr} after {:.0?}", started.elapsed());
            return Some(Vllm {
                url: format!("http://{addr}"),
                addr,
                model_dir,
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let tail = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: String = tail.lines().rev().take(30).collect::<Vec<_>>().join("\n");
    panic!("vLLM did not come up in 600 s; its log, last lines first:\n{tail}");
}

/// Where an install runs beside the tests (`.ci/run` starts `scripts/vllm-peer.sh` in the
/// background), `SLUICE_VLLM_READY` names the file it writes its exit status to when it ends:
/// wait for it, for up to 15 minutes.
fn wait_for_install() {
    let Some(ready) = std::env::var_os("SLUICE_VLLM_READY").map(PathBuf::from) else {
        return;
    };
    let started = Instant::now();
    while !ready.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "scripts/vllm-peer.sh did not finish in 15 minutes ({})",
            ready.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let status = std::fs::read_to_string(&ready).unwrap_or_default();
    let log = ready.with_extension("log");
    assert_eq!(
        status.trim(),
        "0",
        "scripts/vllm-peer.sh failed; its log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    eprintln!("vllm: installed after waiting {:.0?}", started.elapsed());
}

/// A blocking HTTP/1.0 GET: status and body.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((status, body))
}

/// A `vllm:*` gauge (summed over its label sets).
async fn gauge(v: &Vllm, name: &str) -> f64 {
    gauge_at(&v.addr, name).await
}

async fn gauge_at(addr: &str, name: &str) -> f64 {
    let addr = addr.to_owned();
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        let (_, text) = get(&addr, "/metrics").unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    })
    .await
    .expect("metrics")
}

fn gateway_policy(v: &Vllm, active_max: usize) -> Policy {
    let mut p = policy(active_max, 64);
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = vec![v.url.clone()];
    p.upstream.health_interval = Duration::from_millis(200);
    p.upstream.metrics_interval = Duration::from_millis(100);
    p.admission.queue_wait_max = Duration::from_secs(300);
    // These tests hold vLLM at the count ceiling and watch its queue: every request waits its
    // turn rather than being refused for a TTFT deadline (predictive.rs tests those).
    p.admission.predictive = false;
    p
}

async fn gateway(v: &Vllm, p: Policy) -> Gateway {
    let counting = Arc::new(PromptCounter::open(&v.model_dir).expect("the converted tokenizer"));
    let gw = Gateway::start_replicas_counting(p, counting).await;
    let app = gw.app.clone();
    assert!(
        eventually(Duration::from_secs(10), || app.upstream.is_ready()).await,
        "the gateway never saw vLLM healthy"
    );
    gw
}

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0})
}

/// POSTs `body` straight to vLLM and reads the whole answer: status and text (0 and the error
/// when it could not be sent).
async fn post_direct(url: &str, body: &Value) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    match client.request(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_prompt_tokens_are_counted_exactly_with_the_upstreams_template() {
    let Some(v) = vllm() else { return };
    let _turn = crate::engine::exclusive().await;
    let gw = gateway(v, gateway_policy(v, 4)).await;
    let c = gw.client();
    let weather = json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let cases = [
        (
            "/v1/chat/completions",
            chat("Write a haiku about queues.", 8),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the weather in Paris?"}], "tools": weather}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        ),
    ];
    for (path, body) in cases {
        let (status, headers, resp) = c.post(path, &body).await;
        assert_eq!(status, StatusCode::OK, "{path}: {resp}");
        let counted: u64 = headers["x-sluice-prompt-tokens"]
            .to_str()
            .expect("header")
            .parse()
            .expect("count");
        assert_eq!(
            Some(counted),
            resp["usage"]["prompt_tokens"].as_u64(),
            "{path} {body}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_runs_at_most_active_max_under_10x_overload_and_loses_nothing() {
    let Some(v) = vllm() else { return };
    let _turn = crate::engine::exclusive().await;
    let gw = gateway(v, gateway_policy(v, 4)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let addr = v.addr.clone();
        tokio::spawn(async move {
            let (mut peak, mut samples) = (0f64, 0usize);
            while !stop.load(Ordering::SeqCst) {
                peak = peak.max(gauge_at(&addr, "vllm:num_requests_running").await);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (peak, samples)
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..40)
        .map(|i| {
            let c = gw.client();
            tokio::spawn(async move {
                c.post("/v1/chat/completions", &chat(&format!("Count to {i}."), 12))
                    .await
            })
        })
        .collect();
    let mut ok = 0;
    for c in clients {
        let (status, _, v) = c.await.expect("client");
        assert_eq!(status, StatusCode::OK, "a request was lost or refused: {v}");
        ok += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (peak, samples) = sampler.await.expect("sampler");
    let secs = started.elapsed().as_secs_f64();
    eprintln!("vllm overload: 40 requests in {secs:.1} s, peak running {peak}, {samples} samples");
    assert_eq!(ok, 40);
    assert!(
        samples as f64 >= secs * 10.0 * 0.8,
        "sampled at {:.1} Hz",
        samples as f64 / secs
    );
    assert!(
        peak <= 4.0,
        "vLLM ran {peak} requests at once behind active_max 4"
    );
    assert!(
        peak >= 2.0,
        "the overload never reached the engine ({peak})"
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_slot_is_freed_within_a_second_of_a_client_disconnect() {
    let Some(v) = vllm() else { return };
    let _turn = crate::engine::exclusive().await;
    let gw = gateway(v, gateway_policy(v, 4)).await;
    let mut body = chat("Tell me a very long story about rivers.", 400);
    body["stream"] = json!(true);
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&body))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut incoming = resp.into_body();
    use http_body_util::BodyExt;
    let first = incoming
        .frame()
        .await
        .expect("a first chunk")
        .expect("chunk");
    assert!(first.is_data());
    assert!(
        gauge(v, "vllm:num_requests_running").await >= 1.0,
        "the stream is not running in vLLM"
    );
    drop(incoming);
    let dropped = Instant::now();
    let mut freed = None;
    while dropped.elapsed() < Duration::from_secs(5) {
        if gauge(v, "vllm:num_requests_running").await == 0.0 {
            freed = Some(dropped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let freed = freed.expect("vLLM kept the request after the client left");
    eprintln!("vllm disconnect: slot free {freed:?} after the client left");
    assert!(freed <= Duration::from_secs(1), "{freed:?}");
    gw.shutdown().await;
}

/// Fills vLLM directly: 8 long requests, which it runs (`--max-num-seqs 8`), then, once they
/// run, `waiting` more, which wait in its queue (2 at most; more get its 503). Returns their
/// tasks.
async fn flood(v: &Vllm, waiting: usize) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    let send = |i: usize| {
        let url = format!("{}/v1/chat/completions", v.url);
        tokio::spawn(async move {
            post_direct(&url, &chat(&format!("Write an essay number {i}."), 200)).await
        })
    };
    let mut tasks: Vec<_> = (0..8).map(send).collect();
    assert!(
        wait_for(v, "vllm:num_requests_running", 8.0).await,
        "vLLM never ran 8"
    );
    tasks.extend((8..8 + waiting).map(send));
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_busy_answer_becomes_the_gateways_overloaded_and_the_gate_reads_its_queue_and_kv() {
    let Some(v) = vllm() else { return };
    let _turn = crate::engine::exclusive().await;
    // Phase 1: the gate off (a queue of 100 allowed): vLLM's own 503 reaches the gateway.
    let mut p = gateway_policy(v, 4);
    p.upstream.engine_waiting_max = 100;
    let gw = gateway(v, p).await;
    let load = flood(v, 6).await;
    assert!(
        wait_for(v, "vllm:num_requests_waiting", 2.0).await,
        "vLLM never queued 2"
    );
    let (status, headers, body) = gw
        .client()
        .post("/v1/chat/completions", &chat("hi", 4))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(headers.contains_key("retry-after"));
    assert!(
        !body
            .to_string()
            .to_lowercase()
            .contains("engine is currently busy"),
        "{body}"
    );
    let answers: Vec<(u16, String)> = futures_join(load).await;
    let busy = answers.iter().filter(|(s, _)| *s == 503).count();
    assert!(
        busy >= 1,
        "the flood itself met no 503: {:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    gw.shutdown().await;

    // Phase 2: the gate on (engine_waiting_max 0): while vLLM queues, the gateway holds new
    // requests in its own queue, where the wait is measured, and sends them once it drains.
    let mut p = gateway_policy(v, 4);
    p.upstream.engine_waiting_max = 0;
    gate_holds_then_serves(v, p, 2, ("vllm:num_requests_waiting", 1.0), "vLLM's queue").await;

    // Phase 3: the gate on KV use (`vllm:kv_cache_usage_perc` above 0.1%; 8 running essays of
    // ~250 tokens hold about 4% of its 46,592-token cache), no queue needed.
    let mut p = gateway_policy(v, 4);
    p.upstream.engine_waiting_max = 100;
    p.upstream.engine_kv_usage_max = 0.001;
    gate_holds_then_serves(
        v,
        p,
        0,
        ("vllm:kv_cache_usage_perc", 0.002),
        "vLLM's KV use",
    )
    .await;
}

/// Behind `policy`, floods vLLM (8 running, `waiting` more) until `signal` reaches its level;
/// then the saturation gate must close on it (`what`), and a request must wait in the gateway
/// and be served once vLLM drains.
async fn gate_holds_then_serves(
    v: &Vllm,
    policy: Policy,
    waiting: usize,
    (signal, at_least): (&str, f64),
    what: &str,
) {
    let gw = gateway(v, policy).await;
    let load = flood(v, waiting).await;
    assert!(
        wait_for(v, signal, at_least).await,
        "{signal} never reached {at_least}"
    );
    let app = gw.app.clone();
    assert!(
        eventually(Duration::from_secs(5), || app
            .admission
            .snapshot()
            .active_max
            == 0)
        .await,
        "the gate did not close on {what}"
    );
    let (status, headers, body) = gw
        .client()
        .post("/v1/chat/completions", &chat("hi", 4))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let queued: u64 = headers["x-sluice-queue-ms"]
        .to_str()
        .expect("h")
        .parse()
        .expect("ms");
    assert!(
        queued > 0,
        "the request did not wait in the gateway for {what}"
    );
    let _ = futures_join(load).await;
    gw.shutdown().await;
}

async fn wait_for(v: &Vllm, name: &str, at_least: f64) -> bool {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if gauge(v, name).await >= at_least {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn futures_join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}
