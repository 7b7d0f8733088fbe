//! Several OpenAI-compatible replicas behind one gateway: balancing, per-replica ceilings,
//! connect-failure retries, ejection and recovery, and the engines' own saturation signals —
//! against scripted upstreams that serve `/health` and vLLM's or SGLang's `/metrics`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use sluice_gateway::policy::{Policy, UpstreamKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::{certs, chat, eventually, policy, tenant, Gateway, ScriptedUpstream};

/// A policy over `urls` with quick probes.
fn replicas_policy(urls: Vec<String>, active_max: usize) -> Policy {
    let mut p = policy(active_max, 16);
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = urls;
    p.upstream.health_interval = Duration::from_millis(100);
    p.upstream.metrics_interval = Duration::from_millis(100);
    p.upstream.metrics_stale_after = Duration::from_secs(2);
    p.upstream.eject_for = Duration::from_millis(300);
    p.upstream.eject_after = 2;
    p
}

/// The value of the series `name{replica="url"}` in `/metrics`, if present.
async fn replica_gauge(gw: &Gateway, name: &str, url: &str) -> Option<f64> {
    let (_, _, text) = gw.client().json("GET", "/metrics", None).await;
    let prefix = format!("{name}{{replica=\"{url}/\"}} ");
    let alt = format!("{name}{{replica=\"{url}\"}} ");
    text.as_str()?.lines().find_map(|l| {
        l.strip_prefix(&prefix)
            .or_else(|| l.strip_prefix(&alt))
            .and_then(|v| v.parse().ok())
    })
}

/// Waits (at most 5 s) until the replica's gauge reads `value`.
async fn gauge_becomes(gw: &Gateway, name: &str, url: &str, value: f64) -> bool {
    for _ in 0..100 {
        if replica_gauge(gw, name, url).await == Some(value) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn least_outstanding_balancing_and_a_per_replica_ceiling() {
    let (mut a, mut b) = (
        ScriptedUpstream::start().await,
        ScriptedUpstream::start().await,
    );
    let mut p = replicas_policy(vec![a.url(), b.url()], 8);
    p.upstream.replica_active_max = Some(2);
    let gw = Gateway::start_replicas(p).await;
    let c = gw.client();
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(c.send("POST", "/v1/chat/completions", Some(&chat())).await);
    }
    let mut held = Vec::new();
    for up in [&mut a, &mut b] {
        for _ in 0..2 {
            held.push(up.next(Duration::from_secs(5)).await.expect("two on each"));
        }
    }
    // Two replicas × 2: the fifth waits in the gateway's queue although active_max is 8.
    assert_eq!(gw.app.admission.snapshot().active_max, 4);
    let c5 = c.clone();
    let fifth =
        tokio::spawn(async move { c5.send("POST", "/v1/chat/completions", Some(&chat())).await });
    assert!(eventually(Duration::from_secs(5), || gw.app.admission.queued() == 1).await);
    assert!(a.next(Duration::from_millis(200)).await.is_none());
    assert!(b.next(Duration::from_millis(1)).await.is_none());
    // One of b's streams ends: the fifth goes to b, the replica with room.
    drop(held.pop().expect("b's").tx);
    let fifth_arrival = b.next(Duration::from_secs(5)).await.expect("to b");
    drop(fifth_arrival.tx);
    assert_eq!(fifth.await.expect("task").status(), StatusCode::OK);
    drop(held);
    for s in streams {
        let _ = s.into_body().collect().await;
    }
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn connect_failures_retry_elsewhere_and_eject_the_dead_replica() {
    let mut live = ScriptedUpstream::start().await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let mut p = replicas_policy(vec![dead.clone(), live.url()], 4);
    // Slow health checks: the requests themselves must find the dead replica out.
    p.upstream.health_interval = Duration::from_secs(60);
    let gw = Gateway::start_replicas(p).await;
    let c = gw.client();
    for _ in 0..4 {
        let resp = c.send("POST", "/v1/chat/completions", Some(&chat())).await;
        let arrival = live
            .next(Duration::from_secs(5))
            .await
            .expect("reached the live one");
        drop(arrival.tx);
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.into_body().collect().await;
    }
    assert_eq!(
        replica_gauge(&gw, "sluice_upstream_replica_up", &dead).await,
        Some(0.0)
    );
    assert_eq!(
        replica_gauge(&gw, "sluice_upstream_replica_up", &live.url()).await,
        Some(1.0)
    );
    let (_, _, text) = c.json("GET", "/metrics", None).await;
    let retries: f64 = text
        .as_str()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("sluice_upstream_retries_total "))
        })
        .and_then(|v| v.parse().ok())
        .expect("retries counter");
    assert!(
        (1.0..=2.0).contains(&retries),
        "retried until ejected: {retries}"
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// An upstream that answers `/health` and starts every completion's stream, then drops the
/// connection mid-stream (an engine dying); counts the completions it received.
async fn dying_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let posts = Arc::new(AtomicUsize::new(0));
    let seen = posts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let n = s.read(&mut buf).await.unwrap_or(0);
                if buf[..n].starts_with(b"POST") {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n16\r\ndata: {\"choices\":[]}\n\n\r\n")
                        .await;
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
                // Dropped here: a completion's stream breaks off without its last chunk.
            });
        }
    });
    (url, posts)
}

#[tokio::test]
async fn a_request_that_reached_an_engine_is_never_retried() {
    let (a, a_posts) = dying_upstream().await;
    let (b, b_posts) = dying_upstream().await;
    let gw = Gateway::start_replicas(replicas_policy(vec![a, b], 4)).await;
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&chat()))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "the stream had started");
    let text = resp
        .into_body()
        .collect()
        .await
        .expect("a whole body")
        .to_bytes();
    // The break reaches the client as an error event (then `[DONE]`), never as a clean end.
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("\"code\":\"upstream_error\""), "{text}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        a_posts.load(Ordering::SeqCst) + b_posts.load(Ordering::SeqCst),
        1,
        "sent once, never retried"
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_replica_whose_streams_break_off_is_ejected() {
    let (a, _) = dying_upstream().await;
    let (b, _) = dying_upstream().await;
    let mut p = replicas_policy(vec![a.clone(), b.clone()], 4);
    // Only the streams judge the replicas here (a passing probe resets the count).
    p.upstream.health_interval = Duration::from_secs(60);
    let gw = Gateway::start_replicas(p).await;
    // Four streams that start well and break off: one replica at least fails twice in a row.
    for _ in 0..4 {
        let resp = gw
            .client()
            .send("POST", "/v1/chat/completions", Some(&chat()))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.into_body().collect().await;
    }
    let mut out = 0;
    for url in [&a, &b] {
        if replica_gauge(&gw, "sluice_upstream_replica_up", url).await == Some(0.0) {
            out += 1;
        }
    }
    assert!(
        out >= 1,
        "a replica whose every stream breaks off is ejected"
    );
    gw.shutdown().await;
}

/// An engine's own 503 ("engine is busy") goes to the other replica, once; with both busy the
/// client gets the gateway's 503 `overloaded` with the engine's Retry-After, never the engine's
/// text, and each request costs one attempt per replica at most. A busy engine is not ejected.
#[tokio::test]
async fn an_engines_503_moves_to_another_replica_else_the_gateways_overloaded() {
    let (a, mut b) = (
        ScriptedUpstream::start().await,
        ScriptedUpstream::start().await,
    );
    a.busy.store(true, Ordering::SeqCst);
    let gw = Gateway::start_replicas(replicas_policy(vec![a.url(), b.url()], 4)).await;
    assert!(gauge_becomes(&gw, "sluice_upstream_replica_up", &b.url(), 1.0).await);
    let c = gw.client();
    let body = chat();
    for _ in 0..4 {
        let send = c.post("/v1/chat/completions", &body);
        let serve = async {
            let arrival = b
                .next(Duration::from_secs(5))
                .await
                .expect("on the free replica");
            let mut tx = arrival.tx;
            let _ = tx
                .send_data(bytes::Bytes::from_static(b"data: [DONE]\n\n"))
                .await;
        };
        let ((status, _, _), ()) = tokio::join!(send, serve);
        assert_eq!(status, StatusCode::OK);
    }
    b.busy.store(true, Ordering::SeqCst);
    let before = a.busy_answers.load(Ordering::SeqCst) + b.busy_answers.load(Ordering::SeqCst);
    for _ in 0..3 {
        let (status, headers, v) = c.post("/v1/chat/completions", &chat()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
        assert_eq!(v["error"]["code"], "overloaded", "{v}");
        assert_eq!(
            headers.get("retry-after").map(|h| h.to_str().unwrap_or("")),
            Some("3")
        );
        let text = v.to_string();
        assert!(
            !text.contains("engine is currently busy"),
            "the engine's text came through: {text}"
        );
    }
    let attempts =
        a.busy_answers.load(Ordering::SeqCst) + b.busy_answers.load(Ordering::SeqCst) - before;
    assert_eq!(attempts, 6, "one attempt per replica per request");
    // Busy is not broken: both stay in rotation.
    for url in [a.url(), b.url()] {
        assert_eq!(
            replica_gauge(&gw, "sluice_upstream_replica_up", &url).await,
            Some(1.0)
        );
    }
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn failing_health_checks_eject_and_passing_ones_readmit() {
    let mut a = ScriptedUpstream::start().await;
    let b = ScriptedUpstream::start().await;
    let gw = Gateway::start_replicas(replicas_policy(vec![a.url(), b.url()], 4)).await;
    b.health.store(500, Ordering::Relaxed);
    let url = b.url();
    let ejected = gauge_becomes(&gw, "sluice_upstream_replica_up", &url, 0.0).await;
    assert!(ejected, "two failed checks eject b");
    // Everything goes to a while b is out.
    for _ in 0..3 {
        let resp = gw
            .client()
            .send("POST", "/v1/chat/completions", Some(&chat()))
            .await;
        drop(a.next(Duration::from_secs(5)).await.expect("to a").tx);
        let _ = resp.into_body().collect().await;
    }
    b.health.store(200, Ordering::Relaxed);
    let back = gauge_becomes(&gw, "sluice_upstream_replica_up", &url, 1.0).await;
    assert!(back, "a passing check after the ejection brings b back");
    gw.shutdown().await;
}

const VLLM_BUSY: &str = "# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 8.0\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 5.0\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4\n";
const SGLANG_IDLE: &str = "sglang:num_running_reqs{model_name=\"m\"} 1\n\
sglang:num_queue_reqs{model_name=\"m\"} 0\n\
sglang:token_usage{model_name=\"m\"} 0.2\n";

#[tokio::test]
async fn an_engine_that_reports_a_queue_takes_no_more_until_it_drains() {
    let (mut vllm, mut sglang) = (
        ScriptedUpstream::start().await,
        ScriptedUpstream::start().await,
    );
    *vllm.metrics.lock().expect("lock") = Some(VLLM_BUSY.into());
    *sglang.metrics.lock().expect("lock") = Some(SGLANG_IDLE.into());
    let gw = Gateway::start_replicas(replicas_policy(vec![vllm.url(), sglang.url()], 4)).await;
    let url = vllm.url();
    let saturated = gauge_becomes(&gw, "sluice_upstream_replica_saturated", &url, 1.0).await;
    assert!(saturated, "5 waiting > engine_waiting_max 2");
    assert_eq!(
        replica_gauge(&gw, "sluice_upstream_replica_engine_waiting", &url).await,
        Some(5.0)
    );
    for _ in 0..3 {
        let resp = gw
            .client()
            .send("POST", "/v1/chat/completions", Some(&chat()))
            .await;
        drop(
            sglang
                .next(Duration::from_secs(5))
                .await
                .expect("to sglang")
                .tx,
        );
        let _ = resp.into_body().collect().await;
    }
    assert!(vllm.next(Duration::from_millis(1)).await.is_none());
    // SGLang fills its KV cache too: no replica is available, so requests wait in the
    // gateway's queue rather than inside an engine...
    *sglang.metrics.lock().expect("lock") = Some(SGLANG_IDLE.replace("} 0.2", "} 0.97"));
    assert!(
        eventually(Duration::from_secs(5), || gw
            .app
            .admission
            .snapshot()
            .active_max
            == 0)
        .await,
        "capacity follows the saturated replicas"
    );
    let c = gw.client();
    let waiting =
        tokio::spawn(async move { c.send("POST", "/v1/chat/completions", Some(&chat())).await });
    assert!(eventually(Duration::from_secs(5), || gw.app.admission.queued() == 1).await);
    // ...until vLLM's queue drains.
    *vllm.metrics.lock().expect("lock") = Some(VLLM_BUSY.replace("} 5.0", "} 0.0"));
    drop(
        vllm.next(Duration::from_secs(5))
            .await
            .expect("to vllm, drained")
            .tx,
    );
    let resp = waiting.await.expect("task");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_ne!(resp.headers()["x-sluice-queue-ms"], "0");
    let _ = resp.into_body().collect().await;
    // Metrics that stop answering go stale after 2 s: saturated.
    *vllm.metrics.lock().expect("lock") = None;
    let stale = gauge_becomes(&gw, "sluice_upstream_replica_saturated", &url, 1.0).await;
    assert!(stale, "stale metrics count as saturation");
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// An HTTPS upstream trusted through `upstream.ca`, reached with the upstream's own key, and
/// the model name mapped: the upstream here is a second gateway (real TLS, real key check).
#[tokio::test]
async fn an_https_upstream_with_its_own_ca_key_and_model_name() {
    let mut engine = ScriptedUpstream::start().await;
    let mut inner = policy(4, 16);
    inner.tenants.push(tenant("edge", "sk-upstream-key"));
    let upstream_gw = Gateway::start(inner, engine.upstream()).await;

    let var = "SLUICE_E2E_UPSTREAM_KEY";
    std::env::set_var(var, "sk-upstream-key");
    let mut p = replicas_policy(
        vec![format!("https://localhost:{}", upstream_gw.addr.port())],
        4,
    );
    p.upstream.ca = Some(certs().ca_cert.clone());
    p.upstream.health_path = "/healthz".into();
    p.upstream.api_key_env = Some(var.into());
    p.upstream
        .models
        .insert("smol".into(), "SmolLM2-135M-Instruct.Q4_1".into());
    let gw = Gateway::start_replicas(p).await;
    let mut body = chat();
    body["model"] = "smol".into();
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&body))
        .await;
    let arrival = engine
        .next(Duration::from_secs(5))
        .await
        .expect("through both gateways");
    assert_eq!(arrival.body["model"], "SmolLM2-135M-Instruct.Q4_1");
    drop(arrival.tx);
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = resp.into_body().collect().await;
    gw.shutdown().await;
    upstream_gw.shutdown().await;
}
