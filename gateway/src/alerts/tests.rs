//! The alerter under paused time, with a sink that records what it would post.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::sink::PostFuture;
use super::*;
use crate::policy::{Alerts, Class, LoadedPolicy, Policy};
use crate::telemetry::Outcome;

/// The error code a request that ended with `o` would carry.
fn code(o: Outcome) -> &'static str {
    match o {
        Outcome::Shed => "overloaded",
        Outcome::Timeout => "queue_timeout",
        Outcome::Rejected => "rate_limit_exceeded",
        _ => "none",
    }
}

/// Records every post instead of sending it.
#[derive(Debug, Default)]
struct Recorder {
    posts: Mutex<Vec<(Target, Alert)>>,
}

impl AlertSink for Recorder {
    fn post<'a>(&'a self, target: &'a Target, alert: &'a Alert) -> PostFuture<'a> {
        if let Ok(mut posts) = self.posts.lock() {
            posts.push((target.clone(), alert.clone()));
        }
        Box::pin(async { Ok(()) })
    }
}

impl Recorder {
    /// Takes the posts so far.
    fn take(&self) -> Vec<(Target, Alert)> {
        std::mem::take(&mut *self.posts.lock().expect("lock"))
    }

    /// Takes the posts so far, as `(alertname, status)` for one target kind.
    fn take_names(&self) -> Vec<(&'static str, Status)> {
        self.take()
            .into_iter()
            .filter(|(t, _)| matches!(t, Target::Alertmanager(_)))
            .map(|(_, a)| (a.name.as_str(), a.status))
            .collect()
    }
}

const AM: &str = "http://am.test:9093";
const HOOK: &str = "http://hooks.test/sluice";

/// Window 60 s, evaluated every 5 s, fires at 10 % with 20 requests, resolves below 5 %,
/// repeats every 30 s; one Alertmanager and one webhook.
fn rules() -> Alerts {
    Alerts {
        alertmanager_urls: vec![AM.into()],
        webhooks: vec![HOOK.into()],
        shed_ratio: 0.1,
        resolve_ratio: 0.05,
        min_requests: 20,
        window: Duration::from_secs(60),
        evaluate_every: Duration::from_secs(5),
        repeat_interval: Duration::from_secs(30),
        ..Alerts::default()
    }
}

fn store_with(alerts: Alerts) -> Arc<PolicyStore> {
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = Policy {
        alerts,
        ..Policy::default()
    };
    PolicyStore::new(loaded)
}

struct Harness {
    metrics: Arc<Metrics>,
    store: Arc<PolicyStore>,
    sink: Arc<Recorder>,
    alerter: Alerter,
}

fn start(alerts: Alerts) -> Harness {
    let metrics = Arc::new(Metrics::default());
    let store = store_with(alerts);
    let sink = Arc::new(Recorder::default());
    let alerter = Alerter::spawn_with(
        metrics.clone(),
        store.clone(),
        sink.clone(),
        "gw-a:8443".into(),
    );
    Harness {
        metrics,
        store,
        sink,
        alerter,
    }
}

impl Harness {
    fn end(&self, outcome: Outcome, n: usize) {
        for _ in 0..n {
            self.metrics
                .ended(outcome, code(outcome), Class::Interactive);
        }
    }

    /// Lets `secs` of (paused) time pass, with every evaluation and delivery in it.
    async fn pass(&self, secs: u64) {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn fires_at_the_threshold_to_both_formats() {
    let h = start(rules());
    h.pass(1).await;
    // 9 shed of 91 ended (9.9 %): below the 10 % threshold.
    h.end(Outcome::Ok, 80);
    h.end(Outcome::Shed, 5);
    h.end(Outcome::Timeout, 4);
    h.end(Outcome::Rejected, 2);
    h.pass(5).await;
    assert!(h.sink.take().is_empty());
    assert!(!h.alerter.firing(AlertName::LoadShedding));
    // One more timeout: 10 of 92 (10.9 %).
    h.end(Outcome::Timeout, 1);
    h.pass(5).await;
    let posts = h.sink.take();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(h.alerter.firing(AlertName::LoadShedding));
    let am = posts
        .iter()
        .find(|(t, _)| *t == Target::Alertmanager(AM.into()))
        .expect("posted to Alertmanager");
    assert_eq!(am.0.url(), "http://am.test:9093/api/v2/alerts");
    let body = am.0.body(&am.1);
    let a = &body[0];
    assert_eq!(a["labels"]["alertname"], "SluiceLoadShedding");
    assert_eq!(a["labels"]["service"], "sluice");
    assert_eq!(a["labels"]["severity"], "critical");
    assert_eq!(a["labels"]["instance"], "gw-a:8443");
    let description = a["annotations"]["description"].as_str().expect("text");
    assert!(description.contains("10 of 92"), "{description}");
    assert!(description.contains("10.9%"), "{description}");
    assert!(a["endsAt"].as_str() > a["startsAt"].as_str());
    assert_eq!(a["generatorURL"], "https://gw-a:8443/metrics");

    let hook = posts
        .iter()
        .find(|(t, _)| *t == Target::Webhook(HOOK.into()))
        .expect("posted to the webhook");
    assert_eq!(hook.0.url(), HOOK);
    let body = hook.0.body(&hook.1);
    assert_eq!(body["status"], "firing");
    assert_eq!(body["alert"], "SluiceLoadShedding");
    assert_eq!(body["instance"], "gw-a:8443");
    assert_eq!(body["shed"], 10);
    assert_eq!(body["total"], 92);
    assert_eq!(body["window_seconds"], 60.0);
    assert!((body["share"].as_f64().expect("share") - 10.0 / 92.0).abs() < 1e-9);
    assert!(body["started_at"].is_string());
    assert!(h
        .alerter
        .render_prometheus()
        .contains("sluice_alert_firing{alertname=\"SluiceLoadShedding\"} 1\n"));
}

#[tokio::test(start_paused = true)]
async fn too_few_requests_do_not_fire() {
    let h = start(rules());
    h.pass(1).await;
    // Every request shed, but only 19 of the 20 needed.
    h.end(Outcome::Shed, 19);
    h.pass(30).await;
    assert!(h.sink.take().is_empty());
    assert!(!h.alerter.firing(AlertName::LoadShedding));
    h.end(Outcome::Shed, 1);
    h.pass(5).await;
    assert_eq!(
        h.sink.take_names(),
        [("SluiceLoadShedding", Status::Firing)]
    );
}

#[tokio::test(start_paused = true)]
async fn hysteresis_repeats_and_resolves() {
    let h = start(rules());
    h.pass(1).await;
    // 40 shed of 100 ended: fires.
    h.end(Outcome::Ok, 60);
    h.end(Outcome::Shed, 40);
    h.pass(5).await;
    assert_eq!(
        h.sink.take_names(),
        [("SluiceLoadShedding", Status::Firing)]
    );

    // A minute later the burst has left the window. 7 shed of 100 (7 %): below shed_ratio but
    // above resolve_ratio, so it stays firing, and repeats every 30 s meanwhile.
    h.pass(55).await;
    h.end(Outcome::Ok, 93);
    h.end(Outcome::Shed, 7);
    h.pass(60).await;
    assert!(h.alerter.firing(AlertName::LoadShedding));
    let repeats = h.sink.take_names();
    assert!(
        repeats.len() >= 3
            && repeats
                .iter()
                .all(|r| *r == ("SluiceLoadShedding", Status::Firing)),
        "{repeats:?}"
    );

    // Only successes for a window: 0 % resolves, once.
    h.end(Outcome::Ok, 200);
    h.pass(60).await;
    let posts = h.sink.take();
    let resolved: Vec<_> = posts
        .iter()
        .filter(|(t, a)| matches!(t, Target::Webhook(_)) && a.status == Status::Resolved)
        .collect();
    assert_eq!(resolved.len(), 1, "{posts:?}");
    let body = resolved[0].0.body(&resolved[0].1);
    assert_eq!(body["status"], "resolved");
    assert_eq!(body["shed"], 0);
    let am = posts
        .iter()
        .find(|(t, a)| matches!(t, Target::Alertmanager(_)) && a.status == Status::Resolved)
        .expect("resolve sent to Alertmanager");
    // Resolving keeps the start and ends now.
    assert!(am.1.ends_at >= am.1.starts_at);
    assert!(am.1.ends_at <= std::time::SystemTime::now());
    assert!(!h.alerter.firing(AlertName::LoadShedding));
    h.pass(60).await;
    assert!(h.sink.take().is_empty());
}

#[tokio::test(start_paused = true)]
async fn no_urls_send_nothing_but_still_fire() {
    let h = start(Alerts {
        alertmanager_urls: Vec::new(),
        webhooks: Vec::new(),
        ..rules()
    });
    h.pass(1).await;
    h.end(Outcome::Shed, 50);
    h.pass(5).await;
    assert!(h.alerter.firing(AlertName::LoadShedding));
    assert!((h.alerter.shed_share() - 1.0).abs() < 1e-9);
    h.alerter.policy_reload_failed("line 1, column 1: bad");
    h.pass(5).await;
    assert!(h.sink.take().is_empty());
    assert!(h
        .alerter
        .render_prometheus()
        .contains("sluice_alert_notifications_total{result=\"ok\"} 0\n"));
}

#[tokio::test(start_paused = true)]
async fn policy_alert_fires_repeats_and_resolves() {
    let h = start(rules());
    h.pass(1).await;
    h.alerter.policy_reload_ok(); // nothing to resolve
    let error = "policies/p.toml: line 7, column 20: admission.heavy_active_max: 3 is larger \
                 than admission.active_max (2)";
    h.alerter.policy_reload_failed(error);
    h.pass(1).await;
    let posts = h.sink.take();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(h.alerter.firing(AlertName::PolicyReloadFailed));
    let a = &posts[0].1;
    assert_eq!(a.name, AlertName::PolicyReloadFailed);
    assert_eq!(a.status, Status::Firing);
    assert!(
        a.description.contains("line 7, column 20"),
        "{}",
        a.description
    );
    let am: Value = Target::Alertmanager(AM.into()).body(a);
    assert_eq!(am[0]["labels"]["alertname"], "SluicePolicyReloadFailed");
    assert_eq!(am[0]["labels"]["severity"], "warning");
    let started = a.starts_at;

    // Repeats while firing; a second error updates it and keeps its start.
    h.pass(35).await;
    assert_eq!(
        h.sink.take_names(),
        [("SluicePolicyReloadFailed", Status::Firing)]
    );
    h.alerter
        .policy_reload_failed("policies/p.toml: line 2, column 1: unknown field");
    h.pass(1).await;
    let again = h.sink.take();
    assert!(again[0].1.description.contains("line 2, column 1"));
    assert_eq!(again[0].1.starts_at, started);

    h.alerter.policy_reload_ok();
    h.pass(1).await;
    let resolved = h.sink.take_names();
    assert_eq!(resolved, [("SluicePolicyReloadFailed", Status::Resolved)]);
    assert!(!h.alerter.firing(AlertName::PolicyReloadFailed));
    h.pass(60).await;
    assert!(h.sink.take().is_empty(), "no repeats once resolved");
}

#[tokio::test(start_paused = true)]
async fn settings_follow_a_policy_reload() {
    let h = start(Alerts {
        webhooks: Vec::new(),
        ..rules()
    });
    h.pass(1).await;
    // 15 % shed: fires under 10 %.
    h.end(Outcome::Ok, 85);
    h.end(Outcome::Shed, 15);
    h.pass(5).await;
    assert_eq!(
        h.sink.take_names(),
        [("SluiceLoadShedding", Status::Firing)]
    );

    // Reload: threshold 50 %, resolve below 20 %, another Alertmanager, faster repeats.
    let other = "http://other-am.test:9093";
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy.alerts = Alerts {
        alertmanager_urls: vec![other.into()],
        webhooks: Vec::new(),
        shed_ratio: 0.5,
        resolve_ratio: 0.2,
        repeat_interval: Duration::from_secs(10),
        ..rules()
    };
    h.store.replace(loaded);
    h.pass(5).await;
    // 15 % is below the new resolve_ratio: resolved, at the new target.
    let posts = h.sink.take();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0].0, Target::Alertmanager(other.into()));
    assert_eq!(posts[0].1.status, Status::Resolved);

    // 40 % of the window now: below the new 50 %, no alert.
    h.end(Outcome::Shed, 45);
    h.pass(5).await;
    assert!(h.sink.take().is_empty());
    // Past 50 %: fires, and repeats every 10 s.
    h.end(Outcome::Shed, 60);
    h.pass(25).await;
    let posts = h.sink.take_names();
    assert_eq!(posts.len(), 3, "{posts:?}");
}

#[test]
fn window_slides_and_rule_has_hysteresis() {
    let t0 = tokio::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let c = |shed, ended| Counts { shed, ended };
    let mut w = ShedWindow::default();
    let window = Duration::from_secs(10);
    assert_eq!(w.sample(at(0), c(0, 0), window).ended, 0);
    let s = w.sample(at(5), c(5, 10), window);
    assert_eq!((s.shed, s.ended), (5, 10));
    let s = w.sample(at(10), c(5, 20), window);
    assert_eq!((s.shed, s.ended, s.span), (5, 20, window));
    // The sample at 0 s left the window; the one at 5 s is the base.
    let s = w.sample(at(15), c(6, 40), window);
    assert_eq!((s.shed, s.ended), (1, 30));
    assert_eq!(w.len(), 3);

    let rule = rules();
    let share = |shed, ended| Share {
        shed,
        ended,
        span: window,
    };
    assert!(share(2, 20).fires(false, &rule));
    assert!(!share(2, 19).fires(false, &rule), "min_requests");
    assert!(!share(1, 20).fires(false, &rule));
    assert!(share(1, 20).fires(true, &rule), "5 % holds a firing alert");
    assert!(!share(1, 21).fires(true, &rule), "below 5 % resolves");
    assert!(
        share(1, 3).fires(true, &rule),
        "few requests, still shedding: holds"
    );
    assert!(!share(0, 0).fires(true, &rule), "nothing shed: resolves");
}

/// A notification as the evaluator would build it.
fn sample_alert() -> Alert {
    Alert {
        name: AlertName::PolicyReloadFailed,
        status: Status::Firing,
        summary: "s".into(),
        description: "d".into(),
        starts_at: std::time::SystemTime::now(),
        ends_at: std::time::SystemTime::now(),
        instance: "gw-a:8443".into(),
        generator_url: "https://gw-a:8443/metrics".into(),
        shed: None,
    }
}

/// One HTTPS server on loopback (the development certificate in `dir`) that answers 200 to
/// every request and hands over each body it got.
async fn tls_hook(
    dir: &std::path::Path,
) -> (u16, crate::tls::DevCerts, mpsc::UnboundedReceiver<Value>) {
    use http_body_util::BodyExt;
    let certs = crate::tls::generate_dev_certs(dir).expect("certificates");
    let config = crate::tls::server_config(&certs.cert, &certs.key).expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                // A client that does not trust the CA ends the handshake: nothing to serve.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let _ = tx.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
                            Ok::<_, hyper::Error>(http::Response::new(http_body_util::Empty::<
                                bytes::Bytes,
                            >::new(
                            )))
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(tls);
                // HTTP/1.1 or h2, whichever ALPN chose.
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(io, service)
                .await;
            });
        }
    });
    (port, certs, rx)
}

#[tokio::test]
async fn https_targets_are_posted_over_tls_trusting_alerts_ca() {
    let dir = std::env::temp_dir().join(format!("sluice-alerts-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (port, certs, mut got) = tls_hook(&dir).await;
    let hook = Target::Webhook(format!("https://localhost:{port}/hook"));
    let alert = sample_alert();

    let trusting = HttpSink::new(Some(&certs.ca_cert)).expect("sink");
    trusting.post(&hook, &alert).await.expect("posted over TLS");
    let body = got.recv().await.expect("received");
    assert_eq!(body["alert"], "SluicePolicyReloadFailed");
    assert_eq!(body["instance"], "gw-a:8443");

    // The system's roots do not hold the development CA: the handshake is refused, and
    // nothing goes out in the clear either.
    let untrusting = HttpSink::new(None).expect("sink");
    let err = untrusting.post(&hook, &alert).await.expect_err("untrusted");
    assert!(matches!(err, SendError::Http { .. }), "{err}");
    assert!(got.try_recv().is_err());
    assert!(
        !err.to_string().contains("/hook"),
        "the webhook's path: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_instance_names_the_host_in_place_of_an_unspecified_address() {
    assert_eq!(
        instance("10.0.0.5:8443".parse().expect("addr")),
        "10.0.0.5:8443"
    );
    let any = instance("0.0.0.0:8443".parse().expect("addr"));
    assert!(
        any.ends_with(":8443") && !any.starts_with("0.0.0.0"),
        "{any}"
    );
    assert_eq!(any, instance("[::]:8443".parse().expect("addr")));
}

#[tokio::test]
async fn a_failed_post_names_its_target_without_a_secret() {
    // Nothing listens on port 1: the post fails, and its error (which the warning logs) names
    // the webhook by its host and the Alertmanager without its password.
    let sink = HttpSink::new(None).expect("sink");
    let alert = sample_alert();
    for (target, secret) in [
        (
            Target::Webhook("http://127.0.0.1:1/services/T0/B0/s3cret".into()),
            "s3cret",
        ),
        (
            Target::Alertmanager("http://am:pw@127.0.0.1:1".into()),
            ":pw@",
        ),
    ] {
        let err = sink.post(&target, &alert).await.expect_err("refused");
        let shown = err.to_string();
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
        assert!(!target.shown().contains(secret));
    }
}
