//! The gateway over real TLS in front of a scripted upstream.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::json;

use crate::common::{chat, eventually, policy, tenant, Client, Gateway, ScriptedUpstream};

fn tokens(n: usize) -> serde_json::Value {
    json!({"prompt": (0..n).map(|i| 100 + (i % 1000)).collect::<Vec<_>>(), "max_tokens": 1, "stream": true})
}

#[tokio::test]
async fn tls_serves_http1_and_h2_by_alpn() {
    let up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(4, 16), up.upstream()).await;
    for alpn in [&["h2"][..], &["http/1.1"][..]] {
        let c = Client::new(gw.addr, alpn);
        let resp = c.send("GET", "/healthz", None).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let want = if alpn[0] == "h2" {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(resp.version(), want);
    }
    let (status, _, body) = gw.client().json("GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    let (status, _, body) = gw.client().json("GET", "/readyz", None).await;
    assert_eq!(
        (status, body["ready"].clone()),
        (StatusCode::OK, json!(true))
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn exactly_the_input_cap_is_accepted_and_one_more_token_refused() {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(4, 16), up.upstream()).await;
    let c = gw.client();
    let over = c.post("/v1/completions", &tokens(8193)).await;
    assert_eq!(over.0, StatusCode::BAD_REQUEST);
    assert_eq!(over.2["error"]["code"], "context_length_exceeded");
    let msg = over.2["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("8193") && msg.contains("8192"), "{msg}");
    assert!(
        up.next(Duration::from_millis(100)).await.is_none(),
        "never sent upstream"
    );

    let c2 = c.clone();
    let at_cap = tokio::spawn(async move { c2.post("/v1/completions", &tokens(8192)).await });
    let arrival = up
        .next(Duration::from_secs(10))
        .await
        .expect("reaches the upstream");
    assert_eq!(arrival.body["prompt"].as_array().map(Vec::len), Some(8192));
    assert!(
        arrival.headers.contains_key("traceparent"),
        "the trace goes upstream"
    );
    assert!(arrival.headers.contains_key("x-request-id"));
    drop(arrival.tx);
    let (status, headers, _) = at_cap.await.expect("task");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-sluice-prompt-tokens"], "8192");
    assert_eq!(
        headers["x-sluice-max-tokens"], "1",
        "the request's own max_tokens"
    );
    assert_eq!(headers["x-sluice-queue-ms"], "0");
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_fifth_request_waits_and_reaches_the_upstream_only_when_a_slot_frees() {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(4, 16), up.upstream()).await;
    let c = gw.client();
    let mut streams = Vec::new();
    let mut arrivals = Vec::new();
    for _ in 0..4 {
        streams.push(c.send("POST", "/v1/chat/completions", Some(&chat())).await);
        arrivals.push(up.next(Duration::from_secs(5)).await.expect("admitted"));
    }
    let c5 = c.clone();
    let fifth =
        tokio::spawn(async move { c5.send("POST", "/v1/chat/completions", Some(&chat())).await });
    assert!(
        eventually(Duration::from_secs(5), || gw
            .app
            .admission
            .snapshot()
            .queued_interactive
            == 1)
        .await,
        "the fifth request queues"
    );
    assert!(
        up.next(Duration::from_millis(300)).await.is_none(),
        "not upstream while 4 are active"
    );
    // One stream ends: its slot goes to the fifth request.
    let done = arrivals.remove(0);
    let mut tx = done.tx;
    tx.send_data(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .expect("send");
    drop(tx);
    let first = streams
        .remove(0)
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&first[..], b"data: [DONE]\n\n");
    let fifth_arrival = up
        .next(Duration::from_secs(5))
        .await
        .expect("the fifth goes upstream");
    assert!(fifth_arrival.at >= done.at);
    drop(fifth_arrival.tx);
    let resp = fifth.await.expect("task");
    assert_eq!(resp.status(), StatusCode::OK);
    let queued: u64 = resp.headers()["x-sluice-queue-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("ms");
    assert!(
        queued >= 300,
        "it waited about as long as the stream it followed: {queued} ms"
    );
    drop(arrivals);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_full_queue_sheds_in_milliseconds() {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(1, 1), up.upstream()).await;
    let c = gw.client();
    let running = c.send("POST", "/v1/chat/completions", Some(&chat())).await;
    let _arrival = up.next(Duration::from_secs(5)).await.expect("admitted");
    let c2 = c.clone();
    let queued =
        tokio::spawn(async move { c2.send("POST", "/v1/chat/completions", Some(&chat())).await });
    assert!(
        eventually(Duration::from_secs(5), || gw
            .app
            .admission
            .snapshot()
            .queued_interactive
            == 1)
        .await
    );
    // Time only the request itself (the TLS connection is set up by `send`, so measure the
    // whole exchange: it must still be fast).
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (status, headers, body) = c.post("/v1/chat/completions", &chat()).await;
        took.push(t.elapsed());
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["code"], "overloaded");
        assert!(headers.contains_key("retry-after"));
    }
    took.sort();
    assert!(
        took[2] < Duration::from_millis(100),
        "median shed took {:?}",
        took[2]
    );
    // The two clients leave, so that shutdown has nothing to drain (else it waits out the
    // 30 s drain timeout).
    queued.abort();
    drop(running);
    gw.shutdown().await;
}

#[tokio::test]
async fn disconnects_free_the_queue_place_and_the_slot_and_abort_the_upstream() {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(1, 4), up.upstream()).await;
    let c = gw.client();
    let streaming = c.send("POST", "/v1/chat/completions", Some(&chat())).await;
    let arrival = up.next(Duration::from_secs(5)).await.expect("admitted");
    let c2 = c.clone();
    let queued =
        tokio::spawn(async move { c2.send("POST", "/v1/chat/completions", Some(&chat())).await });
    let adm = gw.app.admission.clone();
    assert!(
        eventually(Duration::from_secs(5), || adm.snapshot().queued_interactive
            == 1)
        .await
    );
    // The queued client goes away: it leaves the queue.
    queued.abort();
    assert!(
        eventually(Duration::from_secs(5), || adm.snapshot().queued_interactive
            == 0)
        .await,
        "a client that left is still queued"
    );
    // The streaming client goes away: the slot frees and the upstream stream is closed.
    drop(streaming);
    assert!(
        eventually(Duration::from_secs(5), || adm.snapshot().active == 0).await,
        "the slot was not freed"
    );
    let mut tx = arrival.tx;
    let mut closed = false;
    for _ in 0..50 {
        if tx
            .send_data(Bytes::from_static(b"data: {}\n\n"))
            .await
            .is_err()
        {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed, "the upstream request was not aborted");
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn keys_are_checked_and_errors_are_openai_shaped() {
    let up = ScriptedUpstream::start().await;
    let mut p = policy(4, 16);
    p.tenants.push(tenant("alice", "sk-test-alice"));
    let gw = Gateway::start(p, up.upstream()).await;
    let (status, _, body) = gw.client().post("/v1/chat/completions", &chat()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let bad = gw
        .client()
        .with_header("authorization", "Bearer sk-test-alicf");
    assert_eq!(
        bad.post("/v1/chat/completions", &chat()).await.0,
        StatusCode::UNAUTHORIZED
    );
    let good = gw
        .client()
        .with_header("authorization", "Bearer sk-test-alice");
    let (status, _, body) = good.json("POST", "/v1/chat/completions", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_json");
    let (status, _, body) = good
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "wizard", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "messages[0].role");
    let (status, headers, body) = good.json("GET", "/v1/chat/completions", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, _, body) = good.json("GET", "/nope", None).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    // Without an admin key the admin endpoint is not there, whatever the method.
    for method in ["GET", "POST"] {
        let (status, _, body) = good.json(method, "/admin/policy", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {body}");
    }
    for path in ["/ui", "/ui/stats"] {
        let (status, headers, _) = good.json("POST", path, None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(headers["allow"], "GET");
    }
    gw.assert_accounted().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn shutdown_drains_a_stream_in_flight() {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(4, 16), up.upstream()).await;
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&chat()))
        .await;
    let arrival = up.next(Duration::from_secs(5)).await.expect("admitted");
    let stopping = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!stopping.is_finished(), "shutdown waits for the stream");
    let mut tx = arrival.tx;
    tx.send_data(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .expect("send");
    drop(tx);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("the stream completes")
        .to_bytes();
    assert_eq!(&body[..], b"data: [DONE]\n\n");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("shutdown finishes once drained")
        .expect("task");
}

#[tokio::test]
async fn a_stalled_upstream_hits_the_idle_timeout_with_an_explicit_error() {
    let mut up = ScriptedUpstream::start().await;
    let mut p = policy(4, 16);
    p.upstream.idle_timeout = Duration::from_millis(500);
    let gw = Gateway::start(p, up.upstream()).await;
    let resp = gw
        .client()
        .send("POST", "/v1/chat/completions", Some(&chat()))
        .await;
    let arrival = up.next(Duration::from_secs(5)).await.expect("admitted");
    let mut tx = arrival.tx;
    tx.send_data(Bytes::from_static(b"data: {\"choices\":[]}\n\n"))
        .await
        .expect("send");
    // Then nothing: the stream ends with an error event, never a clean end.
    let t = Instant::now();
    let mut body = resp.into_body();
    let mut text = String::new();
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => text.push_str(&String::from_utf8_lossy(&f.into_data().unwrap_or_default())),
            Err(_) => break,
        }
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(text.contains("upstream_timeout"), "{text}");
    assert!(
        eventually(Duration::from_secs(5), || gw
            .app
            .admission
            .snapshot()
            .active
            == 0)
        .await,
        "the slot is freed"
    );
    assert_eq!(
        gw.app
            .metrics
            .outcome_total(sluice_gateway::telemetry::Outcome::Error),
        1
    );
    drop(tx);
    gw.assert_accounted().await;
    gw.shutdown().await;
}
