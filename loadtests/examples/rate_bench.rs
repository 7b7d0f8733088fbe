//! An open-loop HTTP/1.1 load generator for the gateway overhead benchmark
//! (`loadtests/bench/gateway-overhead.sh`), not product code.
//!
//! `--mode rate` (default) sends short chat requests at a fixed rate over `--connections`
//! keep-alive connections. A pacing thread releases request *i* at `start + i / rate` to an idle
//! connection (or queues it on one when all are busy); latency is taken from that scheduled time
//! to the last byte of the response, so a slow server cannot hide its stalls by slowing the
//! generator down (coordinated omission). The time from the actual send is reported too.
//!
//! `--mode max` is closed loop: `--concurrency` connections send back to back; it reports the
//! sustained request rate. In both modes `achieved` counts successful (2xx) answers only; the
//! failures (503s, timeouts, send errors) are reported beside it (`failed`, `statuses`).
//!
//! Every latency is kept (µs) and sorted: the percentiles are exact. Requests scheduled during
//! `--warmup` are sent but not counted. Output: a summary on stderr and one `key=value` line on
//! stdout for scripts.
//!
//! ```sh
//! cargo run --release -p sluice-loadtests --example rate_bench -- \
//!     --url http://127.0.0.1:8080 --rate 1000 --duration 20 --warmup 5
//! ```

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

#[derive(Debug, Clone)]
struct Args {
    url: String,
    path: String,
    ca: Option<PathBuf>,
    mode: String,
    rate: f64,
    duration: f64,
    warmup: f64,
    connections: usize,
    concurrency: usize,
    threads: usize,
    model: String,
    prompt: String,
    max_tokens: u32,
    stream: bool,
    api_key: Option<String>,
    timeout: Duration,
    label: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: rate_bench --url http(s)://HOST:PORT [--path /v1/chat/completions] [--ca CA.pem]\n\
         \x20 [--mode rate|max] [--rate 1000] [--duration 20] [--warmup 5]\n\
         \x20 [--connections 64] [--concurrency 32] [--threads 1]\n\
         \x20 [--model instant] [--prompt 'Say hi.'] [--max-tokens 8] [--stream] [--api-key KEY]\n\
         \x20 [--timeout-ms 10000] [--label NAME]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        url: String::new(),
        path: "/v1/chat/completions".into(),
        ca: None,
        mode: "rate".into(),
        rate: 1000.0,
        duration: 20.0,
        warmup: 5.0,
        connections: 64,
        concurrency: 32,
        threads: 1,
        model: "instant".into(),
        prompt: "Say hi.".into(),
        max_tokens: 8,
        stream: false,
        api_key: None,
        timeout: Duration::from_secs(10),
        label: String::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--stream" {
            a.stream = true;
            continue;
        }
        let Some(v) = it.next() else { usage() };
        let num = |v: &str| v.parse::<f64>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--url" => a.url = v,
            "--path" => a.path = v,
            "--ca" => a.ca = Some(v.into()),
            "--mode" => a.mode = v,
            "--rate" => a.rate = num(&v),
            "--duration" => a.duration = num(&v),
            "--warmup" => a.warmup = num(&v),
            "--connections" => a.connections = num(&v) as usize,
            "--concurrency" => a.concurrency = num(&v) as usize,
            "--threads" => a.threads = num(&v) as usize,
            "--model" => a.model = v,
            "--prompt" => a.prompt = v,
            "--max-tokens" => a.max_tokens = num(&v) as u32,
            "--api-key" => a.api_key = Some(v),
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&v) as u64),
            "--label" => a.label = v,
            _ => usage(),
        }
    }
    let ok = !a.url.is_empty()
        && (a.mode == "rate" || a.mode == "max")
        && a.rate > 0.0
        && a.duration > 0.0
        && a.warmup >= 0.0
        && a.connections > 0
        && a.concurrency > 0
        && a.threads > 0;
    if !ok {
        usage()
    }
    a
}

/// Where and how to connect, and the request to send.
struct Target {
    addr: std::net::SocketAddr,
    host: HeaderValue,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    uri: Uri,
    body: Bytes,
    auth: Option<HeaderValue>,
    timeout: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("uri", &self.uri)
            .finish_non_exhaustive()
    }
}

impl Target {
    fn new(a: &Args) -> Self {
        let base: Uri = a
            .url
            .parse()
            .expect("--url: a URL like http://127.0.0.1:8080");
        let https = match base.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => panic!("--url: http:// or https://"),
        };
        let host = base.host().expect("--url: a host").trim_matches(['[', ']']);
        let port = base.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = (host, port)
            .to_socket_addrs()
            .expect("--url: resolve the host")
            .next()
            .expect("--url: the host has an address");
        let tls = https.then(|| {
            let ca = a.ca.as_ref().expect("https:// needs --ca CA.pem");
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).expect("--ca: read the PEM file") {
                roots
                    .add(cert.expect("--ca: a PEM certificate"))
                    .expect("--ca: a CA certificate");
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(host.to_string()).expect("--url: a TLS server name");
            (TlsConnector::from(Arc::new(cfg)), name)
        });
        let body = serde_json::json!({
            "model": a.model,
            "messages": [{"role": "user", "content": a.prompt}],
            "max_tokens": a.max_tokens,
            "stream": a.stream,
        });
        Self {
            addr,
            host: HeaderValue::from_str(&format!("{host}:{port}")).expect("host header"),
            tls,
            uri: a
                .path
                .parse()
                .expect("--path: a path like /v1/chat/completions"),
            body: Bytes::from(body.to_string()),
            auth: a.api_key.as_ref().map(|k| {
                HeaderValue::from_str(&format!("Bearer {k}")).expect("--api-key: header-safe")
            }),
            timeout: a.timeout,
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let sender = match &self.tls {
            None => {
                let (sender, conn) = http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                sender
            }
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| format!("tls: {e}"))?;
                let (sender, conn) = http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                sender
            }
        };
        Ok(sender)
    }

    /// One request to its last byte: the status (or an error kind).
    async fn send(&self, sender: &mut SendRequest<Full<Bytes>>) -> Result<u16, String> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(Full::new(self.body.clone()))
            .map_err(|e| format!("request: {e}"))?;
        if let Some(auth) = &self.auth {
            req.headers_mut().insert(AUTHORIZATION, auth.clone());
        }
        let exchange = async {
            sender.ready().await.map_err(|_| "closed".to_string())?;
            let res = sender
                .send_request(req)
                .await
                .map_err(|_| "send".to_string())?;
            let status = res.status().as_u16();
            res.into_body()
                .collect()
                .await
                .map_err(|_| "body".to_string())?;
            Ok(status)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or_else(|_| Err("timeout".into()))
    }
}

/// What the connections record, shared.
#[derive(Debug, Default)]
struct Record {
    /// From the scheduled send (rate mode) or the send (max mode) to the last byte, µs.
    latency_us: Vec<u32>,
    /// From the actual send to the last byte, µs.
    service_us: Vec<u32>,
    statuses: BTreeMap<String, usize>,
    /// `latency_us` again, by status.
    by_status_us: BTreeMap<String, Vec<u32>>,
    last_done: Option<Instant>,
}

impl Record {
    fn add(&mut self, outcome: &Result<u16, String>, sched: Instant, sent: Instant, done: Instant) {
        let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
        self.latency_us.push(us(done - sched));
        self.service_us.push(us(done - sent));
        let key = match outcome {
            Ok(status) => status.to_string(),
            Err(kind) => format!("err_{kind}"),
        };
        *self.statuses.entry(key.clone()).or_default() += 1;
        self.by_status_us
            .entry(key)
            .or_default()
            .push(us(done - sched));
        self.last_done = Some(self.last_done.map_or(done, |t| t.max(done)));
    }
}

/// A connection that keeps itself up: reconnects after an error.
async fn reconnecting(
    target: &Target,
    conn: &mut Option<SendRequest<Full<Bytes>>>,
) -> Result<u16, String> {
    if conn.is_none() {
        *conn = Some(target.connect().await?);
    }
    let Some(sender) = conn.as_mut() else {
        return Err("connect".into());
    };
    let outcome = target.send(sender).await;
    if outcome.is_err() {
        *conn = None;
    }
    outcome
}

/// Open loop at `rate`: the pacing thread hands scheduled times to the connections.
async fn run_rate(a: &Args, target: Arc<Target>, record: Arc<Mutex<Record>>) -> (Instant, Instant) {
    let n = a.connections;
    let outstanding: Arc<Vec<AtomicUsize>> =
        Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
    let mut senders = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + Duration::from_secs_f64(a.warmup);
    for i in 0..n {
        let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
        senders.push(tx);
        let (target, record, outstanding) = (target.clone(), record.clone(), outstanding.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = target.connect().await.ok();
            while let Some(sched) = rx.recv().await {
                let sent = Instant::now();
                let outcome = reconnecting(&target, &mut conn).await;
                let done = Instant::now();
                outstanding[i].fetch_sub(1, Ordering::AcqRel);
                if sched >= measure_from {
                    let mut r = record.lock().expect("record lock");
                    r.add(&outcome, sched, sent, done);
                }
            }
        }));
    }
    let total = ((a.warmup + a.duration) * a.rate).round() as u64;
    let interval = 1.0 / a.rate;
    let pacer_outstanding = outstanding.clone();
    let pacer = std::thread::spawn(move || {
        let mut next_conn = 0usize;
        for i in 0..total {
            let sched = start + Duration::from_secs_f64(i as f64 * interval);
            let now = Instant::now();
            if sched > now {
                std::thread::sleep(sched - now);
            }
            // An idle connection if there is one; else queue on the next in turn.
            let pick = (0..n)
                .map(|k| (next_conn + k) % n)
                .find(|&c| pacer_outstanding[c].load(Ordering::Acquire) == 0)
                .unwrap_or(next_conn);
            next_conn = (pick + 1) % n;
            pacer_outstanding[pick].fetch_add(1, Ordering::AcqRel);
            if senders[pick].send(sched).is_err() {
                break;
            }
        }
    });
    let _ = tokio::task::spawn_blocking(move || pacer.join()).await;
    for t in tasks {
        let _ = t.await;
    }
    (
        measure_from,
        measure_from + Duration::from_secs_f64(a.duration),
    )
}

/// Closed loop: `concurrency` connections back to back until the deadline.
async fn run_max(a: &Args, target: Arc<Target>, record: Arc<Mutex<Record>>) -> (Instant, Instant) {
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(a.warmup);
    let end = measure_from + Duration::from_secs_f64(a.duration);
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (target, record) = (target.clone(), record.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = target.connect().await.ok();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let outcome = reconnecting(&target, &mut conn).await;
                let done = Instant::now();
                if sent >= measure_from && done <= end {
                    record
                        .lock()
                        .expect("record lock")
                        .add(&outcome, sent, sent, done);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (measure_from, end)
}

/// What a window served.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Throughput {
    /// Successful (2xx) answers per second.
    achieved: f64,
    ok: usize,
    /// Other statuses (a 503) and errors (`err_timeout`, `err_send`).
    failed: usize,
}

/// Throughput over `window` from the counts by status: only 2xx answers are served. A shed 503
/// comes back fast, and counting it would report a gateway that refuses everything as one that
/// serves at the offered rate.
fn throughput(statuses: &BTreeMap<String, usize>, window: Duration) -> Throughput {
    let is_ok = |key: &str| key.parse::<u16>().is_ok_and(|s| (200..300).contains(&s));
    let ok: usize = statuses
        .iter()
        .filter(|(k, _)| is_ok(k))
        .map(|(_, n)| n)
        .sum();
    let count: usize = statuses.values().sum();
    Throughput {
        achieved: ok as f64 / window.as_secs_f64(),
        ok,
        failed: count - ok,
    }
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn main() {
    let a = parse_args();
    let mut rt = if a.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(a.threads);
        b
    };
    let rt = rt.enable_all().build().expect("tokio runtime");
    let target = Arc::new(Target::new(&a));
    let record = Arc::new(Mutex::new(Record::default()));
    let (from, to) = rt.block_on(async {
        if a.mode == "rate" {
            run_rate(&a, target, record.clone()).await
        } else {
            run_max(&a, target, record.clone()).await
        }
    });
    let mut r = record.lock().expect("record lock");
    let count = r.latency_us.len();
    // Rate mode: the window is the scheduled span, stretched if the last answer came later.
    let window = r
        .last_done
        .map_or(to, |d| d.max(to))
        .saturating_duration_since(from);
    let window = if a.mode == "max" { to - from } else { window };
    let Throughput {
        achieved,
        ok,
        failed,
    } = throughput(&r.statuses, window);
    r.latency_us.sort_unstable();
    r.service_us.sort_unstable();
    let statuses: Vec<String> = r.statuses.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    let mut by_status = std::mem::take(&mut r.by_status_us);
    let (l, s) = (&r.latency_us, &r.service_us);
    eprintln!(
        "{} {} {}: {count} requests in {:.2}s, {ok} ok = {achieved:.1} req/s served, {failed} failed; statuses {}",
        a.label,
        a.mode,
        a.url,
        window.as_secs_f64(),
        statuses.join(" ")
    );
    eprintln!(
        "  latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        pct(l, 50.0),
        pct(l, 90.0),
        pct(l, 99.0),
        pct(l, 99.9),
        pct(l, 100.0)
    );
    eprintln!(
        "  service ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        pct(s, 50.0),
        pct(s, 90.0),
        pct(s, 99.0),
        pct(s, 99.9),
        pct(s, 100.0)
    );
    println!(
        "label={} mode={} offered={} achieved={achieved:.1} count={count} ok={ok} failed={failed} \
         p50={:.3} p90={:.3} p99={:.3} p999={:.3} max={:.3} svc_p50={:.3} svc_p99={:.3} statuses={}",
        if a.label.is_empty() { "-" } else { &a.label },
        a.mode,
        if a.mode == "rate" { a.rate } else { 0.0 },
        pct(l, 50.0),
        pct(l, 90.0),
        pct(l, 99.0),
        pct(l, 99.9),
        pct(l, 100.0),
        pct(s, 50.0),
        pct(s, 99.0),
        statuses.join(",")
    );
    // Per status (e.g. the shed 503s among 200s): `s503_p50=…` on a second stdout line.
    let mut per_status = vec![format!(
        "label={}",
        if a.label.is_empty() { "-" } else { &a.label }
    )];
    for (status, v) in &mut by_status {
        v.sort_unstable();
        eprintln!(
            "  status {status}: {} requests, latency ms p50 {:.3}  p99 {:.3}  max {:.3}",
            v.len(),
            pct(v, 50.0),
            pct(v, 99.0),
            pct(v, 100.0)
        );
        per_status.push(format!(
            "s{status}_n={} s{status}_p50={:.3} s{status}_p99={:.3} s{status}_max={:.3}",
            v.len(),
            pct(v, 50.0),
            pct(v, 99.0),
            pct(v, 100.0)
        ));
    }
    println!("{}", per_status.join(" "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_successes_are_served_throughput() {
        let statuses: BTreeMap<String, usize> = [
            ("200", 600),
            ("204", 100),
            ("503", 250),
            ("err_timeout", 40),
            ("err_send", 10),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
        let t = throughput(&statuses, Duration::from_secs(10));
        assert_eq!(
            t,
            Throughput {
                achieved: 70.0,
                ok: 700,
                failed: 300
            }
        );
        // Every request shed: nothing served, however fast the 503s came back.
        let shed: BTreeMap<String, usize> = [("503".to_owned(), 5000)].into_iter().collect();
        assert_eq!(throughput(&shed, Duration::from_secs(5)).achieved, 0.0);
    }
}
