//! The harness: the real gateway (TLS, stack, server) on `127.0.0.1:0`, a scripted upstream,
//! and an HTTPS client that trusts the generated development CA.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use serde_json::Value;
use sluice_gateway::app::{stack, App};
use sluice_gateway::forward::{http_client, ReplicaPool, StaticUpstream, Upstream};
use sluice_gateway::middleware::count::PromptCounter;
use sluice_gateway::policy::{LoadedPolicy, Policy, PolicyStore};
use sluice_gateway::routes::Router;
use sluice_gateway::server::Surface;
use sluice_gateway::{server, tls};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The development certificates, generated once per test process.
pub fn certs() -> &'static tls::DevCerts {
    static CERTS: OnceLock<tls::DevCerts> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sluice-e2e-certs-{}", std::process::id()));
        tls::generate_dev_certs(&dir).expect("dev certs")
    })
}

/// The real model's tokenizer, read once.
pub fn counter() -> Arc<PromptCounter> {
    static COUNTER: OnceLock<Arc<PromptCounter>> = OnceLock::new();
    COUNTER
        .get_or_init(|| {
            Arc::new(
                PromptCounter::open(&sluice_engine::model::default_model_path()).expect("model"),
            )
        })
        .clone()
}

/// A running gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The probe listener, when the policy names `server.probe_listen` (bound on
    /// `127.0.0.1:0` whatever address it names).
    pub probe_addr: Option<SocketAddr>,
    pub app: App,
    stop: Option<server::Stop>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    /// Starts a gateway over HTTPS with `policy` in front of `upstream`.
    pub async fn start(policy: Policy, upstream: Arc<dyn Upstream>) -> Self {
        Self::start_with(policy, |_| upstream).await
    }

    /// Starts a gateway in front of the replicas `policy.upstream.urls`, probed as in
    /// `sluice serve`.
    pub async fn start_replicas(policy: Policy) -> Self {
        Self::start_with(policy, |store| {
            let urls = store.current().policy.upstream.urls.clone();
            let pool = ReplicaPool::new(&urls, store.clone()).expect("pool");
            pool.spawn_probes(http_client(None).expect("client"));
            Arc::new(pool)
        })
        .await
    }

    /// Starts a gateway in front of the replicas `policy.upstream.urls`, counting prompts with
    /// `counting` (the upstream's own tokenizer and template).
    pub async fn start_replicas_counting(policy: Policy, counting: Arc<PromptCounter>) -> Self {
        Self::start_counting(
            policy,
            |store| {
                let urls = store.current().policy.upstream.urls.clone();
                let pool = ReplicaPool::new(&urls, store.clone()).expect("pool");
                pool.spawn_probes(http_client(None).expect("client"));
                Arc::new(pool)
            },
            counting,
        )
        .await
    }

    /// Starts a gateway with `policy` in front of the upstream `make` builds.
    pub async fn start_with(
        policy: Policy,
        make: impl FnOnce(&Arc<PolicyStore>) -> Arc<dyn Upstream>,
    ) -> Self {
        Self::start_counting(policy, make, counter()).await
    }

    async fn start_counting(
        policy: Policy,
        make: impl FnOnce(&Arc<PolicyStore>) -> Arc<dyn Upstream>,
        counting: Arc<PromptCounter>,
    ) -> Self {
        let mut loaded = LoadedPolicy::defaults();
        loaded.policy = policy;
        let store = PolicyStore::new(loaded);
        let upstream = make(&store);
        let app = App::new(store, upstream, "SmolLM2-135M-Instruct.Q4_1".into());
        let router = Router {
            stack: stack(&app, counting),
            app: app.clone(),
        };
        let c = certs();
        let acceptor = TlsAcceptor::from(tls::server_config(&c.cert, &c.key).expect("tls"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = server::Stop::default();
        let drain = Duration::from_secs(30);
        let mut probe_addr = None;
        if app.policy.current().policy.server.probe_listen.is_some() {
            let probes = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            probe_addr = Some(probes.local_addr().expect("addr"));
            let serve = server::serve(
                probes,
                Some(acceptor.clone()),
                router.clone(),
                Surface::Probes,
                stop.stopped(),
                drain,
            );
            tokio::spawn(async move { serve.await.expect("serve probes") });
        }
        let clients = server::serve(
            listener,
            Some(acceptor),
            router,
            Surface::Clients,
            stop.stopped(),
            drain,
        );
        let done = tokio::spawn(async move { clients.await.expect("serve") });
        Self {
            addr,
            probe_addr,
            app,
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// Stops accepting and waits for the requests in flight.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            s.stop();
        }
        if let Some(d) = self.done.take() {
            d.await.expect("server task");
        }
    }

    /// Every accepted request ended in exactly one outcome (checked at a quiet moment).
    pub async fn assert_accounted(&self) {
        let m = self.app.metrics.clone();
        let sum = move || {
            sluice_gateway::telemetry::Outcome::ALL
                .iter()
                .map(|o| m.outcome_total(*o))
                .sum::<u64>()
        };
        let accepted = self.app.metrics.accepted_total();
        assert!(
            eventually(Duration::from_secs(5), || sum()
                == self.app.metrics.accepted_total())
            .await,
            "accepted {accepted} != sum of outcomes {}",
            sum()
        );
    }

    pub fn client(&self) -> Client {
        Client::new(self.addr, &["h2", "http/1.1"])
    }
}

/// An HTTPS client of one connection per request.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    connector: TlsConnector,
    pub headers: Vec<(String, String)>,
}

impl Client {
    pub fn new(addr: SocketAddr, alpn: &[&str]) -> Self {
        let mut cfg = (*tls::client_config(&certs().ca_cert).expect("client config")).clone();
        cfg.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Self {
            addr,
            connector: TlsConnector::from(Arc::new(cfg)),
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// Sends a request; the response body is left to the caller (it may stream).
    pub async fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Response<Incoming> {
        let mut headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        if body.is_some() {
            headers.push(("content-type", b"application/json"));
        }
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        self.raw(method, path, &headers, bytes)
            .await
            .expect("response")
    }

    /// Sends any bytes as the body with exactly `headers` (values may be any header bytes);
    /// the protocol's error when the server refuses the request itself.
    ///
    /// Like any HTTP client, it sets its connection up again (at most [`SETUP_TRIES`] times)
    /// when the connection fails before the request was written: a TCP, TLS or HTTP/2
    /// handshake that fails, or a connection that closed with the request still unsent
    /// (hyper hands it back). A request is never sent twice, so whatever the gateway does with
    /// a request it received is what the test sees. Each retry is printed.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Bytes,
    ) -> Result<Response<Incoming>, hyper::Error> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("https://localhost:{}{path}", self.addr.port()));
        for (k, v) in headers {
            req = req.header(*k, http::HeaderValue::from_bytes(v).expect("header value"));
        }
        let mut req = req.body(Full::new(body)).expect("request");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt == SETUP_TRIES;
            let unsent = match self.connection().await {
                Ok(mut send) => match send.try_send(req).await {
                    Ok(resp) => return Ok(resp),
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !last => {
                            eprintln!("client: {method} {path}: connection closed before the request was sent ({}); setting it up again", e.error());
                            unsent
                        }
                        _ => return Err(e.into_error()),
                    },
                },
                Err(e) if !last => {
                    eprintln!("client: {method} {path}: connection set-up failed ({e}); trying again");
                    req
                }
                Err(e) => panic!("client: {method} {path}: connection set-up failed {SETUP_TRIES} times, last: {e}"),
            };
            req = unsent;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new connection to the gateway, over HTTP/2 when ALPN chose it (HTTP/1.1 otherwise).
    async fn connection(&self) -> Result<Sender, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from("localhost").expect("name");
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(conn);
            Ok(Sender::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("h1 handshake: {e}"))?;
            tokio::spawn(conn);
            Ok(Sender::H1(send))
        }
    }

    /// Sends and reads the whole answer as JSON (or a string value when it is not JSON).
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, http::HeaderMap, Value) {
        let resp = self.send(method, path, body).await;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, headers, v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, http::HeaderMap, Value) {
        self.json("POST", path, Some(body)).await
    }
}

/// How many times [`Client::raw`] sets a connection up before it gives up.
const SETUP_TRIES: u32 = 3;

/// One connection's request sender, whichever protocol ALPN chose.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    /// Sends `req`; hyper hands the request back in the error when it was never written.
    async fn try_send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Full<Bytes>>>> {
        match self {
            Self::H1(send) => send.try_send_request(req).await,
            Self::H2(send) => send.try_send_request(req).await,
        }
    }
}

/// A request as the scripted upstream saw it, with the sender of its streamed body.
pub struct Arrival {
    pub body: Value,
    pub headers: http::HeaderMap,
    pub at: tokio::time::Instant,
    /// Chunks for the response body; dropping it ends the body.
    pub tx: http_body_util::channel::Sender<Bytes, Infallible>,
}

/// An OpenAI-compatible upstream the test scripts: every request is answered 200 with a
/// streamed body the test writes through [`Arrival::tx`].
pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    pub arrivals: mpsc::UnboundedReceiver<Arrival>,
    /// The status `GET /health` answers (200 to start with).
    pub health: Arc<AtomicU16>,
    /// What `GET /metrics` answers (`None`: 404, as from a server without metrics).
    pub metrics: Arc<Mutex<Option<String>>>,
    /// Set: every POST is answered 503 with vLLM's "engine is busy" body and `Retry-After: 3`,
    /// and counted in `busy_answers` (as `--max-num-queued-reqs` makes vLLM do).
    pub busy: Arc<std::sync::atomic::AtomicBool>,
    pub busy_answers: Arc<std::sync::atomic::AtomicUsize>,
}

impl ScriptedUpstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, arrivals) = mpsc::unbounded_channel();
        let health = Arc::new(AtomicU16::new(200));
        let metrics: Arc<Mutex<Option<String>>> = Arc::default();
        let busy: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let busy_answers: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (h, m) = (health.clone(), metrics.clone());
        let (bz, bn) = (busy.clone(), busy_answers.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (tx, h, m) = (tx.clone(), h.clone(), m.clone());
                let (bz, bn) = (bz.clone(), bn.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (tx, h, m) = (tx.clone(), h.clone(), m.clone());
                        let (bz, bn) = (bz.clone(), bn.clone());
                        async move {
                            if req.method() == http::Method::GET {
                                return Ok(probe_answer(req.uri().path(), &h, &m));
                            }
                            if bz.load(Ordering::SeqCst) {
                                bn.fetch_add(1, Ordering::SeqCst);
                                return Ok(busy_answer());
                            }
                            let (parts, b) = req.into_parts();
                            let bytes = b.collect().await.expect("body").to_bytes();
                            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            let (chunks, out) = http_body_util::channel::Channel::new(8);
                            let _ = tx.send(Arrival {
                                body,
                                headers: parts.headers,
                                at: tokio::time::Instant::now(),
                                tx: chunks,
                            });
                            let mut resp = Response::new(out);
                            resp.headers_mut().insert(
                                "content-type",
                                http::HeaderValue::from_static("text/event-stream"),
                            );
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            arrivals,
            health,
            metrics,
            busy,
            busy_answers,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn upstream(&self) -> Arc<dyn Upstream> {
        Arc::new(StaticUpstream::new(&format!("http://{}", self.addr)).expect("url"))
    }

    /// The next arrival within `within`, if any.
    pub async fn next(&mut self, within: Duration) -> Option<Arrival> {
        tokio::time::timeout(within, self.arrivals.recv())
            .await
            .ok()
            .flatten()
    }
}

/// The default policy with `active_max` slots and a queue of `queue_depth`.
pub fn policy(active_max: usize, queue_depth: usize) -> Policy {
    let mut p = Policy::default();
    p.admission.active_max = active_max;
    p.admission.queue_depth = queue_depth;
    p.admission.heavy_active_max = p.admission.heavy_active_max.min(active_max);
    p
}

/// A tenant of the default class whose key is `key`.
pub fn tenant(name: &str, key: &str) -> sluice_gateway::policy::Tenant {
    sluice_gateway::policy::Tenant {
        name: name.into(),
        api_key_sha256: sha256_hex(key),
        class: Default::default(),
        requests_per_second: None,
        burst: 10,
        tokens_per_minute: None,
    }
}

/// A short streamed chat request.
pub fn chat() -> Value {
    serde_json::json!({"messages": [{"role": "user", "content": "Hello"}], "stream": true, "max_tokens": 8})
}

/// `GET /health` and `GET /metrics` of a scripted upstream.
fn probe_answer(
    path: &str,
    health: &AtomicU16,
    metrics: &Mutex<Option<String>>,
) -> Response<http_body_util::channel::Channel<Bytes, Infallible>> {
    let (status, text) = match path {
        "/health" => (health.load(Ordering::Relaxed), String::new()),
        "/metrics" => match metrics.lock().expect("lock").clone() {
            Some(t) => (200, t),
            None => (404, String::new()),
        },
        _ => (404, String::new()),
    };
    let (mut tx, body) = http_body_util::channel::Channel::new(1);
    tokio::spawn(async move {
        let _ = tx.send_data(Bytes::from(text)).await;
    });
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(status).expect("status");
    resp
}

/// vLLM's answer with `--max-num-queued-reqs` reached.
fn busy_answer() -> Response<http_body_util::channel::Channel<Bytes, Infallible>> {
    let (mut tx, body) = http_body_util::channel::Channel::new(1);
    tokio::spawn(async move {
        let text = r#"{"error":{"message":"The engine is currently busy, internal queue full","type":"ServiceUnavailableError","code":503}}"#;
        let _ = tx.send_data(Bytes::from_static(text.as_bytes())).await;
    });
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut()
        .insert("retry-after", http::HeaderValue::from_static("3"));
    resp
}

/// Waits until `cond` holds (checked every 10 ms), at most `limit`.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// The lowercase hex SHA-256 of `s`, as the policy stores keys.
pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One HTTP/2 connection over TLS to `addr` (`TCP_NODELAY`: without it, Nagle's algorithm and
/// delayed ACKs add up to 40 ms to a request sent while another is in flight on it).
pub async fn h2_connection(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let mut cfg = (*tls::client_config(&certs().ca_cert).expect("client config")).clone();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let name = ServerName::try_from("localhost").expect("name");
    let tls = TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    send
}
