//! The status page in a real browser: the gateway over HTTPS in front of a scripted upstream,
//! some traffic (two finished requests, one held streaming so a slot stays taken, one queued
//! behind it, one shed), then Debian's headless Chromium loads `/ui`, runs its script, and
//! the numbers in its DOM are checked against `/metrics` and `/ui/stats` at that moment. A
//! screenshot is kept under `$CARGO_TARGET_TMPDIR/ui-screenshot.png`.
//!
//! Without `/usr/bin/chromium` the test is skipped with a message, unless
//! `SLUICE_REQUIRE_CHROMIUM` is set (CI installs `chromium` and sets it).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use serde_json::{json, Value};
use sluice_engine::server::prompt::Endpoint;
use sluice_gateway::app::{stack, App};
use sluice_gateway::bundled::RankStatus;
use sluice_gateway::error::GatewayError;
use sluice_gateway::forward::{Target, Upstream};
use sluice_gateway::middleware::count::TokenCounter;
use sluice_gateway::policy::{LoadedPolicy, Policy, PolicyStore};
use sluice_gateway::routes::Router;
use sluice_gateway::{server, tls, ui};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Counts a word a token: enough for admission, no model needed.
#[derive(Debug)]
struct Words;

impl TokenCounter for Words {
    fn count(&self, _: Endpoint, body: &Value) -> Result<usize, GatewayError> {
        Ok(body.to_string().split_whitespace().count())
    }
}

/// An upstream of two ranks, served by the scripted server at `base`.
#[derive(Debug)]
struct TwoRanks {
    base: Uri,
}

impl Upstream for TwoRanks {
    fn target(&self) -> Result<Target, GatewayError> {
        Ok(Target {
            base: self.base.clone(),
        })
    }

    fn is_ready(&self) -> bool {
        true
    }

    fn ranks(&self) -> Vec<RankStatus> {
        let rank = |rank, layers, used| RankStatus {
            rank,
            up: true,
            layers,
            kv_tokens_total: 8192,
            kv_tokens_used: used,
        };
        vec![rank(0, [0, 14], 2048), rank(1, [15, 29], 6144)]
    }
}

type Held = Arc<Mutex<Vec<http_body_util::channel::Sender<Bytes, Infallible>>>>;

/// An SSE upstream: a request whose body mentions "hold" gets one delta and then stays open
/// until the test ends; any other gets two deltas and `[DONE]`.
async fn scripted_upstream(held: Held) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let held = held.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let held = held.clone();
                async move {
                    let body = req.into_body().collect().await.expect("body").to_bytes();
                    let hold = String::from_utf8_lossy(&body).contains("hold");
                    let (mut tx, rx) = http_body_util::channel::Channel::new(8);
                    let delta = |s: &str| {
                        let chunk = json!({"choices": [{"index": 0, "delta": {"content": s}}]});
                        Bytes::from(format!("data: {chunk}\n\n"))
                    };
                    tx.send_data(delta("Hello")).await.expect("send");
                    if hold {
                        held.lock().expect("lock").push(tx);
                    } else {
                        tx.send_data(delta(", world")).await.expect("send");
                        tx.send_data(Bytes::from("data: [DONE]\n\n"))
                            .await
                            .expect("send");
                    }
                    let mut resp = Response::new(rx);
                    resp.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("text/event-stream"),
                    );
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// The gateway over HTTPS; returns its address, app, CA file and the server's stop switch.
async fn gateway(
    upstream: Arc<dyn Upstream>,
    certs: &tls::DevCerts,
) -> (SocketAddr, App, oneshot::Sender<()>) {
    let mut policy = Policy::default();
    policy.admission.active_max = 1;
    policy.admission.heavy_active_max = 1;
    policy.admission.queue_depth = 1;
    policy.admission.queue_wait_max = Duration::from_secs(300);
    // The waiter behind the held stream must still be there when the page looks.
    policy.admission.interactive_ttft_deadline = Duration::from_secs(300);
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = policy;
    let app = App::new(PolicyStore::new(loaded), upstream, "scripted-model".into());
    ui::start(&app);
    let router = Router {
        stack: stack(&app, Arc::new(Words)),
        app: app.clone(),
    };
    let acceptor = TlsAcceptor::from(tls::server_config(&certs.cert, &certs.key).expect("tls"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        let _ = server::serve(
            listener,
            Some(acceptor),
            router,
            server::Surface::Clients,
            shutdown,
            Duration::from_secs(1),
        )
        .await;
    });
    (addr, app, stop)
}

/// Sends one HTTPS request (HTTP/1.1) and returns the response with its body unread.
async fn send(
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Response<Incoming> {
    let connector = TlsConnector::from(tls::client_config(ca).expect("client config"));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let io = connector.connect(name, tcp).await.expect("handshake");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(
            body.map(|b| Bytes::from(b.to_string())).unwrap_or_default(),
        ))
        .expect("request");
    sender.send_request(req).await.expect("response")
}

async fn text(resp: Response<Incoming>) -> String {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "stream": true, "max_tokens": 8})
}

/// The value of the unlabelled-or-labelled sample `series` (e.g. `name{class="batch"}`).
fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.trim().parse().ok()
    })
}

/// The text directly inside the element with `id` in serialized HTML.
fn by_id<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = at + dom.get(at..)?.find('>')? + 1;
    let close = open + dom.get(open..)?.find('<')?;
    dom.get(open..close)
}

/// Runs headless Chromium on `url` with `extra` arguments; its stdout.
async fn chromium(url: &str, extra: &[String]) -> String {
    let profile = scratch("chromium-profile");
    let mut cmd = tokio::process::Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--ignore-certificate-errors",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url)
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("chromium finishes within 90 s")
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A fresh directory under the system's temporary directory.
fn scratch(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("sluice-ui-{what}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_what_metrics_say() {
    if !Path::new(CHROMIUM).exists() {
        assert!(
            std::env::var_os("SLUICE_REQUIRE_CHROMIUM").is_none(),
            "SLUICE_REQUIRE_CHROMIUM is set but {CHROMIUM} is missing (apt-get install chromium)"
        );
        eprintln!("SKIPPED: {CHROMIUM} is missing; `apt-get install chromium` to run this test");
        return;
    }
    let held: Held = Arc::default();
    let up = scripted_upstream(held.clone()).await;
    let upstream = Arc::new(TwoRanks {
        base: format!("http://{up}").parse().expect("uri"),
    });
    let certs = tls::generate_dev_certs(&scratch("certs")).expect("dev certs");
    let ca = certs.ca_cert.clone();
    let (addr, app, stop) = gateway(upstream, &certs).await;

    // Two requests that finish: they give the window its queue waits and first tokens.
    for _ in 0..2 {
        let resp = send(
            addr,
            &ca,
            "POST",
            "/v1/chat/completions",
            Some(&chat("hi there")),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().contains_key("x-sluice-queue-ms"));
        assert!(text(resp).await.contains("[DONE]"));
    }
    // One held streaming: it keeps the only slot.
    let streaming = send(
        addr,
        &ca,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hold on")),
    )
    .await;
    assert_eq!(streaming.status(), StatusCode::OK);
    // One queued behind it.
    let (ca2, queued_body) = (ca.clone(), chat("waiting"));
    let queued = tokio::spawn(async move {
        send(
            addr,
            &ca2,
            "POST",
            "/v1/chat/completions",
            Some(&queued_body),
        )
        .await
    });
    for _ in 0..500 {
        if app.admission.snapshot().queued_interactive == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.admission.snapshot().queued_interactive, 1);
    // One shed: the queue is full.
    let shed = send(
        addr,
        &ca,
        "POST",
        "/v1/chat/completions",
        Some(&chat("too many")),
    )
    .await;
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let _ = text(shed).await;

    let url = format!("https://localhost:{}/ui", addr.port());
    let dom = chromium(&url, &["--dump-dom".into()]).await;
    let metrics = text(send(addr, &ca, "GET", "/metrics", None).await).await;
    let stats: Value =
        serde_json::from_str(&text(send(addr, &ca, "GET", "/ui/stats", None).await).await)
            .expect("stats json");

    let shown = |id: &str| by_id(&dom, id).unwrap_or_else(|| panic!("no #{id} in the DOM:\n{dom}"));
    let as_num = |id: &str| shown(id).parse::<f64>().ok();
    assert_ne!(
        shown("updated"),
        "never",
        "the page's script ran and polled /ui/stats"
    );
    assert_eq!(as_num("active"), metric(&metrics, "sluice_active_requests"));
    assert_eq!(as_num("active"), Some(1.0));
    assert_eq!(as_num("active-max"), Some(1.0));
    assert_eq!(
        as_num("queued-interactive"),
        metric(&metrics, "sluice_queue_depth{class=\"interactive\"}")
    );
    assert_eq!(as_num("queued-interactive"), Some(1.0));
    assert_eq!(
        as_num("queued-batch"),
        metric(&metrics, "sluice_queue_depth{class=\"batch\"}")
    );
    let sha = app.policy.current().sha256.clone();
    assert_eq!(Some(shown("policy-hash")), sha.get(..12));
    assert_eq!(stats["policy"]["short"].as_str(), sha.get(..12));
    assert_eq!(shown("total-shed"), "1");
    assert_eq!(shown("window-shed"), stats["window"]["shed"].to_string());
    assert_ne!(shown("ttft-p50"), "—", "two requests had a first token");
    assert_ne!(shown("queue-wait-p95"), "—");
    // The chart: one predicted and one actual dot per admitted stream with a first token.
    let points = stats["prediction"]["points"].as_array().map_or(0, Vec::len);
    assert!(points >= 2, "two finished streams: {stats}");
    assert_eq!(shown("prediction-points"), points.to_string());
    assert_eq!(dom.matches("class=\"predicted\"").count(), points, "{dom}");
    assert_eq!(dom.matches("class=\"actual\"").count(), points);
    // Drawn in the element's own pixels (never stretched to a fixed box), with its axes.
    assert!(!dom.contains("preserveAspectRatio"), "{dom}");
    assert!(
        !dom.contains("viewBox=\"0 0 600 180\""),
        "sized from the element: {dom}"
    );
    assert!(
        dom.contains(">now</text>") && dom.contains(">−5 min</text>"),
        "{dom}"
    );
    assert_ne!(shown("prediction-median-error"), "—");
    assert_eq!(shown("rank-1-kv"), "6,144 / 8,192");
    assert_eq!(shown("rank-0-up"), "up");

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &url,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,900".into(),
            "--hide-scrollbars".into(),
        ],
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", shot.display());

    drop(streaming);
    held.lock().expect("lock").clear();
    let queued = queued.await.expect("queued task");
    assert_eq!(
        queued.status(),
        StatusCode::OK,
        "the queued request got the slot"
    );
    let _ = text(queued).await;

    // The chat box, sent by `#chat=`, streams the deltas and shows the gateway's headers.
    let dom = chromium(&format!("{url}#chat=hi%20there"), &["--dump-dom".into()]).await;
    let shown = |id: &str| by_id(&dom, id).unwrap_or_else(|| panic!("no #{id} in the DOM:\n{dom}"));
    assert_eq!(shown("chat-status"), "done", "{dom}");
    let answer = dom
        .split("class=\"msg assistant\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next());
    assert_eq!(answer, Some("Hello, world"));
    assert_eq!(shown("chat-prompt-tokens"), "2");
    assert!(
        shown("chat-queue-ms").ends_with(" ms"),
        "{}",
        shown("chat-queue-ms")
    );
    assert_ne!(shown("chat-ttft"), "–");
    let _ = stop.send(());
    let _ = std::fs::remove_dir_all(&certs.dir);
}
