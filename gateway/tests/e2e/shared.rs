//! Several gateways sharing one real `redis-server` (`[shared]`): one ceiling in front of the
//! real engine, one rate limit and one token budget per tenant, a gateway killed with SIGKILL,
//! Redis killed and restarted. Each test starts its own `redis-server` on a free loopback port
//! (`--save '' --appendonly no`); without one installed the tests say so and pass, unless
//! `SLUICE_REQUIRE_REDIS=1` (CI), which makes a missing `redis-server` a failure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use sluice_gateway::bundled::{BundledConfig, Supervisor};
use sluice_gateway::policy::{Policy, SharedFail, UpstreamKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{certs, chat, h2_connection, policy, tenant, Gateway, ScriptedUpstream};
use crate::process::ServeProcess;

// ---------------------------------------------------------------------------------------------
// The real Redis.

/// A `redis-server` of this test's own on a loopback port.
struct Redis {
    bin: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Redis {
    /// Starts one on a free port; `None` (and a note) when `redis-server` is not installed and
    /// `SLUICE_REQUIRE_REDIS` is not set.
    async fn start() -> Option<Self> {
        let found = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .or_else(|| which("redis-server"));
        let Some(bin) = found else {
            assert!(
                std::env::var("SLUICE_REQUIRE_REDIS").as_deref() != Ok("1"),
                "SLUICE_REQUIRE_REDIS=1 but redis-server is not installed (apt-get install redis-server)"
            );
            eprintln!("redis-server not installed: skipping (apt-get install redis-server)");
            return None;
        };
        // A port found free may be taken by another test before redis-server binds it: then
        // the server exits, and another port is tried.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut r = Self {
                bin: bin.clone(),
                port,
                child: None,
            };
            if r.try_restart().await {
                return Some(r);
            }
        }
        panic!("redis-server did not start on any of five free ports");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)starts it on the same port and waits until it answers `PING`.
    async fn restart(&mut self) {
        assert!(
            self.try_restart().await,
            "redis-server on port {} did not answer PING",
            self.port
        );
    }

    /// Starts it on its port; whether it answers `PING` within 10 s (false, and it is gone,
    /// when it exits first: the port was taken).
    async fn try_restart(&mut self) -> bool {
        let mut child = Command::new(&self.bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if self.ping().await {
                // Answered by this server, not by another that holds the port.
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return false;
                }
                self.child = Some(child);
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// A client connection, for the tests to look inside.
    async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }

    async fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").await.is_ok()
            && s.read_exact(&mut buf).await.is_ok()
            && &buf == b"+PONG\r\n"
    }

    /// SIGKILL, and waits for it to be gone.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

// ---------------------------------------------------------------------------------------------
// Policies, requests, upstreams.

/// `active_max` slots in front of `urls`, shared through `redis` under `prefix`.
fn shared_policy(redis: &Redis, prefix: &str, urls: Vec<String>, active_max: usize) -> Policy {
    let mut p = policy(active_max, 16);
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = urls;
    p.upstream.health_interval = Duration::from_millis(200);
    p.shared.redis_url = Some(redis.url());
    p.shared.prefix = prefix.into();
    p.shared.lease_ttl = Duration::from_secs(2);
    // Five times the default bound: this machine's two cores are shared with builds, and a
    // call past the bound would put the limits on the local fallback (what the fault test
    // tests) instead of the shared path the other tests measure.
    p.shared.timeout = Duration::from_millis(250);
    p
}

/// Neither gateway decided anything without Redis (the figures are the shared path's).
async fn all_shared(gws: [&Gateway; 2]) {
    for gw in gws {
        let errors = gw.app.shared.as_ref().map(|s| s.report().errors);
        assert_eq!(
            gauge(gw, "sluice_shared_state_degraded_total").await,
            Some(0.0),
            "a Redis call failed or took longer than shared.timeout: {errors:?}"
        );
    }
}

/// Two gateways with `p`, both connected to Redis.
async fn pair(p: &Policy) -> (Gateway, Gateway) {
    let a = Gateway::start_replicas(p.clone()).await;
    let b = Gateway::start_replicas(p.clone()).await;
    for gw in [&a, &b] {
        let shared = gw.app.shared.clone().expect("[shared] on");
        assert!(shared.wait_up(Duration::from_secs(5)).await, "connected");
    }
    (a, b)
}

/// A scripted upstream that answers every request at once with a short stream whose usage
/// says `completion` tokens; it counts the requests.
struct Instant_ {
    url: String,
    requests: Arc<AtomicUsize>,
}

async fn instant_upstream(completion: u64) -> Instant_ {
    let mut up = ScriptedUpstream::start().await;
    let url = up.url();
    let requests: Arc<AtomicUsize> = Arc::default();
    let n = requests.clone();
    tokio::spawn(async move {
        while let Some(mut a) = up.arrivals.recv().await {
            n.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let usage = json!({"choices": [], "usage": {"prompt_tokens": 1,
                    "completion_tokens": completion, "total_tokens": 1 + completion}});
                let text = format!("data: {usage}\n\ndata: [DONE]\n\n");
                let _ = a.tx.send_data(Bytes::from(text)).await;
            });
        }
    });
    Instant_ { url, requests }
}

/// A chat request over a kept HTTP/2 connection: status, body text, and the prompt tokens the
/// gateway counted (`x-sluice-prompt-tokens`, 0 without it).
async fn h2_post(
    send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    key: Option<&str>,
    body: &Value,
) -> (StatusCode, String, u64) {
    let mut req = Request::post(format!(
        "https://localhost:{}/v1/chat/completions",
        addr.port()
    ))
    .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    send.ready().await.expect("connection ready");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status();
    let prompt = resp
        .headers()
        .get("x-sluice-prompt-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned(), prompt)
}

/// The value of the unlabelled gauge `name` in a gateway's `/metrics`.
async fn gauge(gw: &Gateway, name: &str) -> Option<f64> {
    let (_, _, text) = gw.client().json("GET", "/metrics", None).await;
    let prefix = format!("{name} ");
    text.as_str()?
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

/// Waits (at most `limit`) until the gauge reads `value`; how long it took.
async fn gauge_becomes(gw: &Gateway, name: &str, value: f64, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if gauge(gw, name).await == Some(value) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Shared ceiling in front of the real engine.

/// GET `path` from a plain-HTTP server (the engine's `/metrics`).
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// The engine's requests running plus waiting, from its `/metrics`.
fn engine_load(metrics: &str) -> Option<f64> {
    let value = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find(|l| l.starts_with(name))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    Some(value("vllm:num_requests_running")? + value("vllm:num_requests_waiting")?)
}

#[tokio::test]
async fn two_gateways_keep_one_engine_under_one_ceiling() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let _one = crate::engine::exclusive().await;
    let bin = BundledConfig::locate_engine_bin().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = BundledConfig::new(bin, sluice_engine::model::default_model_path());
    cfg.ranks = 3;
    let sup = Arc::new(Supervisor::start(cfg).await.expect("engine"));
    sup.wait_ready(Duration::from_secs(180))
        .await
        .expect("engine ready");
    let engine = sup.addr();
    let mut p = shared_policy(&redis, "ceiling", vec![format!("http://{engine}")], 4);
    // Sixteen clients on four slots: the last of each round waits three others' answers,
    // which a 2-core AVX2-only EPYC predicts just past the interactive class's 5 s deadline
    // (5.11 s seen), and refuses at once as `deadline_unmeetable`. What this test checks is the
    // ceiling, so its burst gets a deadline it can meet.
    p.admission.interactive_ttft_deadline = Duration::from_secs(60);
    let (a, b) = pair(&p).await;

    // The engine's load, sampled at 20 Hz for the whole run.
    let done = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let sampler = {
        let (done, samples) = (done.clone(), samples.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                if let Some(v) = http_get(engine, "/metrics")
                    .await
                    .and_then(|m| engine_load(&m))
                {
                    samples.lock().expect("samples").push(v);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let body = json!({"messages": [{"role": "user", "content": "Count to twenty."}],
                      "stream": true, "max_tokens": 12, "ignore_eos": true});
    let mut clients = Vec::new();
    for gw in [&a, &b] {
        for _ in 0..8 {
            let (c, body) = (gw.client(), body.clone());
            clients.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..2 {
                    let (status, _, text) = c.post("/v1/chat/completions", &body).await;
                    assert_eq!(status, StatusCode::OK, "{text}");
                    let text = text.as_str().unwrap_or_default().to_owned();
                    assert!(text.contains("data: [DONE]"), "a whole stream: {text}");
                    assert!(!text.contains("\"error\""), "{text}");
                    ok += 1;
                }
                ok
            }));
        }
    }
    let mut served = 0;
    for c in clients {
        served += c.await.expect("client");
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.expect("sampler");
    let samples = samples.lock().expect("samples").clone();
    let max = samples.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "shared ceiling: {served} of 32 served, engine load max {max} over {} samples",
        samples.len()
    );
    assert_eq!(served, 32, "no accepted request lost");
    assert!(samples.len() >= 20, "sampled at 20 Hz: {}", samples.len());
    all_shared([&a, &b]).await;
    assert!(
        max <= 4.0,
        "the engine held {max} requests at once (ceiling 4)"
    );
    assert!(max >= 3.0, "the ceiling was reached: {max}");
    a.assert_accounted().await;
    b.assert_accounted().await;
    a.shutdown().await;
    b.shutdown().await;
    if let Ok(sup) = Arc::try_unwrap(sup) {
        sup.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Shared rate limit and token budget.

#[tokio::test]
async fn a_rate_limit_shared_by_two_gateways_admits_its_rate_in_total() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let up = instant_upstream(2).await;
    let mut p = shared_policy(&redis, "rate", vec![up.url.clone()], 64);
    let mut t = tenant("alice", "sk-alice");
    t.requests_per_second = Some(10.0);
    t.burst = 1;
    p.tenants = vec![t];
    let (a, b) = pair(&p).await;

    // Four clients on each gateway, as fast as they can, for 4 s.
    let started = Instant::now();
    let run = Duration::from_secs(4);
    let admitted: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut tasks = Vec::new();
    for gw in [&a, &b] {
        for _ in 0..4 {
            let (addr, admitted) = (gw.addr, admitted.clone());
            tasks.push(tokio::spawn(async move {
                let mut send = h2_connection(addr).await;
                let mut limited = 0;
                while started.elapsed() < run {
                    let (status, text, _) =
                        h2_post(&mut send, addr, Some("sk-alice"), &chat()).await;
                    match status {
                        StatusCode::OK => admitted.lock().expect("lock").push(started.elapsed()),
                        StatusCode::TOO_MANY_REQUESTS => {
                            limited += 1;
                            // Keeps the offered load near 800/s in all (80 times the limit).
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        s => panic!("{s}: {text}"),
                    }
                }
                limited
            }));
        }
    }
    let mut limited = 0;
    for t in tasks {
        limited += t.await.expect("client");
    }
    let times = admitted.lock().expect("lock").clone();
    // Past the first second (the burst), per second in total.
    let in_window = times
        .iter()
        .filter(|t| **t >= Duration::from_secs(1) && **t < run)
        .count();
    let rate = in_window as f64 / (run.as_secs_f64() - 1.0);
    eprintln!(
        "shared rate limit: {} admitted, {limited} limited; {rate:.2}/s from 1 s to 4 s",
        times.len()
    );
    assert!(
        limited > 100,
        "the clients pushed past the limit: {limited}"
    );
    all_shared([&a, &b]).await;
    assert!((9.0..=11.0).contains(&rate), "{rate:.2} req/s, limit 10");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_token_budget_shared_by_two_gateways_stays_within_five_percent() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // Two completion tokens each: every request settles below its reservation.
    let up = instant_upstream(2).await;
    let mut p = shared_policy(&redis, "budget", vec![up.url.clone()], 64);
    let budget = 3000u64;
    let mut t = tenant("bob", "sk-bob");
    t.tokens_per_minute = Some(budget);
    p.tenants = vec![t];
    let (a, b) = pair(&p).await;

    let started = Instant::now();
    let mut tasks = Vec::new();
    for gw in [&a, &b] {
        for _ in 0..3 {
            let addr = gw.addr;
            tasks.push(tokio::spawn(async move {
                let mut send = h2_connection(addr).await;
                let (mut ok, mut refused, mut used) = (0, 0, 0);
                while started.elapsed() < Duration::from_secs(3) {
                    let (status, text, prompt) =
                        h2_post(&mut send, addr, Some("sk-bob"), &chat()).await;
                    match status {
                        StatusCode::OK => {
                            assert!(prompt > 0, "the gateway counted the prompt");
                            ok += 1;
                            used += prompt + 2;
                        }
                        StatusCode::TOO_MANY_REQUESTS => {
                            assert!(text.contains("tokens_per_minute_exceeded"), "{text}");
                            refused += 1;
                        }
                        s => panic!("{s}: {text}"),
                    }
                }
                (ok, refused, used)
            }));
        }
    }
    let (mut ok, mut refused, mut used) = (0, 0, 0u64);
    for t in tasks {
        let (o, r, u) = t.await.expect("client");
        ok += o;
        refused += r;
        used += u;
    }
    // `used`: what the admitted requests used, their prompts (as the gateway counted them) and
    // the two completion tokens each.
    eprintln!("shared budget: {ok} admitted, {refused} refused, {used} of {budget} tokens used");
    assert_eq!(up.requests.load(Ordering::SeqCst), ok);
    all_shared([&a, &b]).await;
    assert!(refused > 0, "the budget was reached");
    assert!(used <= budget, "{used} tokens used of a {budget} budget");
    assert!(
        used as f64 >= 0.95 * budget as f64,
        "{used} tokens used of a {budget} budget: more than 5% below"
    );
    // Each admitted request's lease (taken with its charge on arrival, or after its local
    // slot) went back with its settle: none is left, in either gateway or in Redis.
    for gw in [&a, &b] {
        let gone = gauge_becomes(gw, "sluice_shared_leases", 0.0, Duration::from_secs(2)).await;
        assert!(gone.is_some(), "a lease outlived its request");
    }
    let left = leases_left(&redis, "budget").await;
    assert_eq!(left, 0, "leases left in Redis after every request ended");
    a.shutdown().await;
    b.shutdown().await;
}

/// Sends a chat request's headers and half its body over TLS (HTTP/1.1), then stalls: the
/// connection, kept open.
async fn half_sent(addr: SocketAddr, key: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut cfg = (*sluice_gateway::tls::client_config(&certs().ca_cert).expect("cfg")).clone();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let body = chat().to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n\
         content-type: application/json\r\nauthorization: Bearer {key}\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("headers");
    tls.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .expect("half the body");
    tls.flush().await.expect("flush");
    tls
}

#[tokio::test]
async fn stalled_uploads_hold_no_shared_slot() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let up = instant_upstream(2).await;
    let mut p = shared_policy(&redis, "stall", vec![up.url.clone()], 2);
    p.admission.queue_wait_max = Duration::from_secs(3);
    let mut t = tenant("dave", "sk-dave");
    t.requests_per_second = Some(1000.0);
    t.burst = 100;
    p.tenants = vec![t];
    let gw = Gateway::start_replicas(p).await;
    assert!(
        gw.app
            .shared
            .as_ref()
            .expect("shared")
            .wait_up(Duration::from_secs(5))
            .await
    );
    // Two clients send half their bodies and stall, past the rate limit's check, with both of
    // the deployment's slots free.
    let stalled = [
        half_sent(gw.addr, "sk-dave").await,
        half_sent(gw.addr, "sk-dave").await,
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A whole request gets a slot at once: the stalled ones hold none, local or shared.
    let mut send = h2_connection(gw.addr).await;
    let started = Instant::now();
    let (status, text, _) = h2_post(&mut send, gw.addr, Some("sk-dave"), &chat()).await;
    let took = started.elapsed();
    eprintln!("two stalled uploads: a whole request answered {status} after {took:?}");
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        took < Duration::from_secs(1),
        "{took:?}: it waited for a shared slot"
    );
    assert_eq!(
        leases_left(&redis, "stall").await,
        0,
        "a stalled upload holds a shared slot"
    );
    all_shared([&gw, &gw]).await;
    drop(stalled);
    gw.shutdown().await;
}

/// `command`'s calls Redis answered since its stats were last reset (`INFO commandstats`:
/// the calls less the failed and rejected ones, such as a script's first `NOSCRIPT`).
async fn answered(redis: &Redis, command: &str) -> u64 {
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    field("calls") - field("failed_calls") - field("rejected_calls")
}

async fn reset_stats(redis: &Redis) {
    let mut conn = redis.connection().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");
}

#[tokio::test]
async fn a_request_makes_two_redis_calls_and_a_standing_refusal_none() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let up = instant_upstream(2).await;
    let mut p = shared_policy(&redis, "calls", vec![up.url.clone()], 4);
    // No renewal within the test (every third of the TTL).
    p.shared.lease_ttl = Duration::from_secs(60);
    let mut all = tenant("all", "sk-all");
    all.requests_per_second = Some(10_000.0);
    all.burst = 1000;
    all.tokens_per_minute = Some(100_000_000);
    let mut rate = tenant("rate", "sk-rate");
    rate.requests_per_second = Some(10_000.0);
    rate.burst = 1000;
    let open = tenant("open", "sk-open");
    let mut slow = tenant("slow", "sk-slow");
    slow.requests_per_second = Some(1.0);
    slow.burst = 1;
    p.tenants = vec![all, rate, open, slow];
    let gw = Gateway::start_replicas(p).await;
    assert!(
        gw.app
            .shared
            .as_ref()
            .expect("shared")
            .wait_up(Duration::from_secs(5))
            .await
    );
    let mut send = h2_connection(gw.addr).await;
    // Rate, budget and lease (all); rate and lease (rate); the lease alone (open): one call on
    // arrival and one at the end, each.
    let n = 40;
    for key in ["sk-all", "sk-rate", "sk-open"] {
        // The first request loads the scripts (a NOSCRIPT answer, then the script itself).
        let (status, text, _) = h2_post(&mut send, gw.addr, Some(key), &chat()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(leases_left(&redis, "calls").await, 0);
        reset_stats(&redis).await;
        for _ in 0..n {
            let (status, text, _) = h2_post(&mut send, gw.addr, Some(key), &chat()).await;
            assert_eq!(status, StatusCode::OK, "{key}: {text}");
        }
        // The end's call goes in the background: wait for every lease to be back.
        assert_eq!(leases_left(&redis, "calls").await, 0, "{key}: leases left");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let calls = answered(&redis, "evalsha").await;
        eprintln!("{key}: {n} requests, {calls} EVALSHA answered");
        assert_eq!(calls, 2 * n as u64, "{key}: two scripts a request");
        assert_eq!(
            answered(&redis, "publish").await,
            0,
            "{key}: below the ceiling"
        );
    }
    // A tenant past its rate: Redis refuses once, then the gateway answers the refusal alone
    // (before parsing and counting) until the time Redis named.
    reset_stats(&redis).await;
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..n {
        let (status, text, _) = h2_post(&mut send, gw.addr, Some("sk-slow"), &chat()).await;
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(text.contains("rate_limit_exceeded"), "{text}");
                limited += 1;
            }
            s => panic!("{s}: {text}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let calls = answered(&redis, "evalsha").await;
    eprintln!("past the rate: {ok} admitted, {limited} limited, {calls} EVALSHA answered");
    assert!(ok >= 1 && limited >= n - 2, "{ok} admitted of {n} at 1/s");
    assert!(
        calls <= 3 * ok as u64,
        "{calls} calls: two per admitted request and at most one refusal after each"
    );
    gw.shutdown().await;
}

/// The leases left in Redis under `prefix` once they stop going (at most 2 s): the end's
/// call goes in the background, after the response.
async fn leases_left(redis: &Redis, prefix: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut left = leases_in_redis(redis, prefix).await;
    while left > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = leases_in_redis(redis, prefix).await;
    }
    left
}

/// The leases held in Redis under `prefix`, every upstream's.
async fn leases_in_redis(redis: &Redis, prefix: &str) -> usize {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}}}:ceiling:*:leases"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let mut n = 0;
    for k in keys {
        let c: usize = redis::cmd("ZCARD")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        n += c;
    }
    n
}

// ---------------------------------------------------------------------------------------------
// A gateway killed, and Redis killed.

/// Starts a streamed request on a plain-HTTP gateway; its response, kept open.
async fn plain_stream(addr: SocketAddr) -> Option<hyper::Response<hyper::body::Incoming>> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("host", addr.to_string())
        .body(Full::new(Bytes::from(chat().to_string())))
        .ok()?;
    send.send_request(req).await.ok()
}

#[tokio::test]
async fn a_gateway_killed_mid_stream_gives_its_slots_back_within_the_ttl() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let mut up = ScriptedUpstream::start().await;
    let p = shared_policy(&redis, "crash", vec![up.url()], 2);
    let ttl = p.shared.lease_ttl;
    let dir = std::env::temp_dir().join(format!("sluice-shared-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let killed = ServeProcess::start(&p, &dir).await;
    let addr = killed.addr;
    let survivor = Gateway::start_replicas(p.clone()).await;
    assert!(
        survivor
            .app
            .shared
            .as_ref()
            .expect("shared")
            .wait_up(Duration::from_secs(5))
            .await
    );

    // The process gateway holds both slots with two streams the upstream keeps open.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut streams = Vec::new();
    while streams.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the gateway process never served"
        );
        match plain_stream(addr).await {
            Some(r) if r.status() == StatusCode::OK => streams.push(r),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            up.next(Duration::from_secs(5))
                .await
                .expect("arrived upstream"),
        );
    }
    // The survivor's request waits: the deployment's two slots are taken.
    let c = survivor.client();
    let waiting = tokio::spawn(async move { c.post("/v1/chat/completions", &chat()).await });
    assert!(
        up.next(Duration::from_millis(700)).await.is_none(),
        "the survivor must wait for a shared slot"
    );
    assert_eq!(gauge(&survivor, "sluice_shared_leases").await, Some(0.0));

    crate::engine::sigkill(killed.pid());
    killed.stop().await;
    let killed_at = Instant::now();
    let arrival = up
        .next(ttl * 2)
        .await
        .expect("the survivor's request went up");
    let took = killed_at.elapsed();
    eprintln!("gateway SIGKILLed: its slots came back after {took:?} (lease TTL {ttl:?})");
    assert!(
        took <= ttl + Duration::from_millis(500),
        "{took:?} > TTL {ttl:?} + the 100 ms poll and slack"
    );
    drop(arrival);
    let (status, _, _) = waiting.await.expect("the waiting request");
    assert_eq!(status, StatusCode::OK);
    drop(held);
    drop(streams);
    survivor.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One answer under the fault test's load.
#[derive(Clone, Debug)]
struct Answer {
    /// From the `fail = "local"` gateway (else the `closed` one).
    local: bool,
    sent: Instant,
    status: StatusCode,
    took: Duration,
    text: String,
}

#[tokio::test]
async fn redis_killed_and_restarted_fails_by_policy_then_recovers() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let up = instant_upstream(2).await;
    let mut p = shared_policy(&redis, "faults", vec![up.url.clone()], 4);
    let mut t = tenant("carol", "sk-carol");
    t.requests_per_second = Some(1000.0);
    t.burst = 100;
    t.tokens_per_minute = Some(10_000_000);
    p.tenants = vec![t];
    let mut closed_p = p.clone();
    closed_p.shared.fail = SharedFail::Closed;
    let local = Gateway::start_replicas(p).await;
    let closed = Gateway::start_replicas(closed_p).await;
    for gw in [&local, &closed] {
        assert!(
            gw.app
                .shared
                .as_ref()
                .expect("shared")
                .wait_up(Duration::from_secs(5))
                .await
        );
    }

    // Load on both gateways the whole time; every answer is timed.
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let mut tasks = Vec::new();
    for (is_local, gw) in [(true, &local), (false, &closed)] {
        for _ in 0..2 {
            let (addr, stop, answers) = (gw.addr, stop.clone(), answers.clone());
            tasks.push(tokio::spawn(async move {
                let mut send = h2_connection(addr).await;
                while !stop.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    let (status, text, _) =
                        h2_post(&mut send, addr, Some("sk-carol"), &chat()).await;
                    answers.lock().expect("lock").push(Answer {
                        local: is_local,
                        sent,
                        status,
                        took: sent.elapsed(),
                        text,
                    });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.kill();
    let killed = Instant::now();
    // fail = "local": the gateway's share of the ceiling; fail = "closed": refusals.
    let fell = gauge_becomes(&local, "sluice_active_max", 2.0, Duration::from_secs(3)).await;
    assert!(fell.is_some(), "local fallback: active_max 4 / 2 replicas");
    assert_eq!(gauge(&local, "sluice_shared_state_up").await, Some(0.0));
    let noticed = gauge_becomes(
        &closed,
        "sluice_shared_state_up",
        0.0,
        Duration::from_secs(3),
    );
    assert!(noticed.await.is_some(), "the closed gateway noticed");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.restart().await;
    let restarted = Instant::now();
    let back_local = gauge_becomes(
        &local,
        "sluice_shared_state_up",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    let back_closed = gauge_becomes(
        &closed,
        "sluice_shared_state_up",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert!(back_local.is_some() && back_closed.is_some(), "recovered");
    assert_eq!(gauge(&local, "sluice_active_max").await, Some(4.0));
    let recovered = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("client");
    }
    let answers = answers.lock().expect("lock").clone();
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    let during = |is_local: bool| {
        answers.iter().filter(move |a| {
            a.local == is_local
                && a.sent > killed + Duration::from_millis(200)
                && a.sent + a.took < restarted
        })
    };
    let after = |is_local: bool| {
        answers
            .iter()
            .filter(move |a| a.local == is_local && a.sent > recovered)
    };
    let local_during: Vec<_> = during(true).collect();
    let closed_during: Vec<_> = during(false).collect();
    eprintln!(
        "redis killed: local answered {} ({} ok), closed answered {} ({} refused); back after \
         {back_local:?} / {back_closed:?}; slowest answer {slowest:?}",
        local_during.len(),
        local_during
            .iter()
            .filter(|a| a.status == StatusCode::OK)
            .count(),
        closed_during.len(),
        closed_during
            .iter()
            .filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE)
            .count(),
    );
    assert!(
        slowest < Duration::from_secs(1),
        "no request hangs on Redis: {slowest:?}"
    );
    assert!(!local_during.is_empty() && !closed_during.is_empty());
    assert!(
        local_during.iter().all(|a| a.status == StatusCode::OK),
        "fail = local serves"
    );
    assert!(
        closed_during
            .iter()
            .all(|a| a.status == StatusCode::SERVICE_UNAVAILABLE
                && a.text.contains("shared_state_unavailable")),
        "fail = closed refuses with shared_state_unavailable"
    );
    for is_local in [true, false] {
        let after: Vec<_> = after(is_local).collect();
        assert!(!after.is_empty());
        assert!(
            after.iter().all(|a| a.status == StatusCode::OK),
            "the shared path resumed"
        );
    }
    local.shutdown().await;
    closed.shutdown().await;
}
