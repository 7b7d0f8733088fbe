//! The gateway's own alerts against a real Alertmanager (Debian's `prometheus-alertmanager`)
//! on loopback: a scripted overload fires `SluiceLoadShedding`, Alertmanager notifies its
//! webhook receiver, the overload stops and the resolve comes through; then the policy alert
//! fires and resolves the same way.
//!
//! Without the binary the test is skipped, unless `SLUICE_REQUIRE_ALERTMANAGER` is set (CI),
//! in which case it fails. `SLUICE_ALERTMANAGER_BIN` names another binary.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use sluice_gateway::alerts::{AlertName, Alerter};
use sluice_gateway::policy::{Alerts, Class, LoadedPolicy, PolicyStore};
use sluice_gateway::telemetry::{Metrics, Outcome};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const DEBIAN_BIN: &str = "/usr/bin/prometheus-alertmanager";
const WAIT: Duration = Duration::from_secs(30);

/// The Alertmanager binary, if installed.
fn alertmanager_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_ALERTMANAGER_BIN") {
        return Some(PathBuf::from(p));
    }
    if Path::new(DEBIAN_BIN).is_file() {
        return Some(PathBuf::from(DEBIAN_BIN));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| {
            [
                dir.join("prometheus-alertmanager"),
                dir.join("alertmanager"),
            ]
        })
        .find(|p| p.is_file())
}

/// One notification the receiver got: its path and JSON body.
type Received = (String, Value);

/// A webhook receiver on `127.0.0.1:0` that records every POST.
async fn receiver() -> (SocketAddr, mpsc::UnboundedReceiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let bytes = req.into_body().collect().await.expect("body").to_bytes();
                        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let _ = tx.send((path, body));
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// A running Alertmanager; killed when dropped.
struct Alertmanager {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Alertmanager {
    /// Starts `bin` on a free loopback port, routing every alert to `hook` (group wait 100 ms,
    /// group interval 1 s, resolves sent), and waits until it is ready.
    async fn start(bin: &Path, hook: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-alertmanager-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("temp dir");
        let config = dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            format!(
                "route:\n  receiver: sluice-test\n  group_by: ['alertname']\n  \
                 group_wait: 100ms\n  group_interval: 1s\n  repeat_interval: 1h\n\
                 receivers:\n  - name: sluice-test\n    webhook_configs:\n      \
                 - url: '{hook}'\n        send_resolved: true\n"
            ),
        )
        .expect("config");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = dir.join("alertmanager.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let am = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let ready = format!("{}/-/ready", am.url);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let req = Request::get(&ready).body(Full::default()).expect("request");
            if let Ok(resp) = client.request(req).await {
                if resp.status().is_success() {
                    return am;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Alertmanager not ready within {WAIT:?}:\n{}",
                am.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Whether a notification at `path` carries `alertname` with `status`, in either format.
fn matches(got: &Received, path: &str, alertname: &str, status: &str) -> bool {
    let (p, body) = got;
    if p != path {
        return false;
    }
    match body["alerts"].as_array() {
        // Alertmanager's webhook: {status, alerts: [{status, labels, annotations}]}.
        Some(alerts) => alerts
            .iter()
            .any(|a| a["labels"]["alertname"] == alertname && a["status"] == status),
        // Sluice's plain webhook: {status, alert, ...}.
        None => body["alert"] == alertname && body["status"] == status,
    }
}

/// What the receiver got, in order; notifications not yet asked for are kept for later.
struct Inbox {
    rx: mpsc::UnboundedReceiver<Received>,
    unclaimed: Vec<Received>,
}

impl Inbox {
    /// The first notification at `path` about `alertname` with `status`, received already or
    /// within [`WAIT`].
    async fn expect(
        &mut self,
        am: &Alertmanager,
        path: &str,
        alertname: &str,
        status: &str,
    ) -> Value {
        if let Some(i) = self
            .unclaimed
            .iter()
            .position(|got| matches(got, path, alertname, status))
        {
            return self.unclaimed.remove(i).1;
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(got)) if matches(&got, path, alertname, status) => return got.1,
                Ok(Some(got)) => self.unclaimed.push(got),
                _ => panic!(
                    "no {status} {alertname} at {path} within {WAIT:?}; got {:#?}\n\
                     Alertmanager's log:\n{}",
                    self.unclaimed,
                    am.log_text()
                ),
            }
        }
    }
}

/// Every 50 ms ends `shed` requests shed (overloaded or queue timeout) and `ok` requests
/// served, until the returned sender is dropped or sent to.
fn traffic(metrics: Arc<Metrics>, shed: usize, ok: usize) -> tokio::sync::oneshot::Sender<()> {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        loop {
            for i in 0..shed {
                if i % 2 == 0 {
                    metrics.ended(Outcome::Shed, "overloaded", Class::Interactive);
                } else {
                    metrics.ended(Outcome::Timeout, "queue_timeout", Class::Batch);
                }
            }
            for _ in 0..ok {
                metrics.ended(Outcome::Ok, "none", Class::Interactive);
            }
            tokio::select! {
                _ = &mut stopped => return,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_shedding_fires_and_resolves_through_a_real_alertmanager() {
    let Some(bin) = alertmanager_bin() else {
        assert!(
            std::env::var_os("SLUICE_REQUIRE_ALERTMANAGER").is_none(),
            "SLUICE_REQUIRE_ALERTMANAGER is set but {DEBIAN_BIN} is missing \
             (apt-get install prometheus-alertmanager)"
        );
        eprintln!(
            "SKIPPED: {DEBIAN_BIN} is not installed (apt-get install prometheus-alertmanager); \
             set SLUICE_REQUIRE_ALERTMANAGER=1 to make this a failure"
        );
        return;
    };
    let (hook, rx) = receiver().await;
    let mut inbox = Inbox {
        rx,
        unclaimed: Vec::new(),
    };
    let am = Alertmanager::start(&bin, &format!("http://{hook}/am")).await;

    let mut loaded = LoadedPolicy::defaults();
    loaded.policy.alerts = Alerts {
        alertmanager_urls: vec![am.url.clone()],
        webhooks: vec![format!("http://{hook}/plain")],
        shed_ratio: 0.5,
        resolve_ratio: 0.2,
        min_requests: 10,
        window: Duration::from_secs(2),
        evaluate_every: Duration::from_millis(200),
        repeat_interval: Duration::from_secs(1),
        ..Alerts::default()
    };
    let store = PolicyStore::new(loaded);
    let metrics = Arc::new(Metrics::default());
    let alerter = Alerter::spawn(metrics.clone(), store, "gw-a:8443".into()).unwrap();

    // Overload: three of every four requests shed.
    let overload = traffic(metrics.clone(), 3, 1);
    let fired = inbox
        .expect(&am, "/am", "SluiceLoadShedding", "firing")
        .await;
    let alert = &fired["alerts"][0];
    assert_eq!(alert["labels"]["service"], "sluice");
    assert_eq!(alert["labels"]["instance"], "gw-a:8443");
    assert_eq!(alert["labels"]["severity"], "critical");
    let description = alert["annotations"]["description"].as_str().unwrap_or("");
    assert!(description.contains("were shed"), "{fired}");
    assert!(alerter.firing(AlertName::LoadShedding));
    let plain = inbox
        .expect(&am, "/plain", "SluiceLoadShedding", "firing")
        .await;
    assert!(plain["share"].as_f64().is_some_and(|s| s >= 0.5), "{plain}");
    assert!(plain["total"].as_u64().is_some_and(|n| n >= 10), "{plain}");

    // The overload stops: only successes from now on.
    let _ = overload.send(());
    let calm = traffic(metrics.clone(), 0, 4);
    inbox
        .expect(&am, "/am", "SluiceLoadShedding", "resolved")
        .await;
    inbox
        .expect(&am, "/plain", "SluiceLoadShedding", "resolved")
        .await;
    assert!(!alerter.firing(AlertName::LoadShedding));
    let _ = calm.send(());

    // A refused policy edit raises the policy alert until the next good reload.
    let error = "policies/p.toml: line 7, column 20: admission.heavy_active_max: 3 is larger \
                 than admission.active_max (2)";
    alerter.policy_reload_failed(error);
    let fired = inbox
        .expect(&am, "/am", "SluicePolicyReloadFailed", "firing")
        .await;
    let description = fired["alerts"][0]["annotations"]["description"]
        .as_str()
        .unwrap_or("");
    assert!(description.contains("line 7, column 20"), "{fired}");
    alerter.policy_reload_ok();
    inbox
        .expect(&am, "/am", "SluicePolicyReloadFailed", "resolved")
        .await;

    let text = alerter.render_prometheus();
    assert!(
        text.contains("sluice_alert_notifications_total{result=\"error\"} 0\n"),
        "{text}"
    );
}
