//! Abuse below the request: slow headers, bytes that are not TLS, a TLS 1.1 hello, oversized
//! headers, and HTTP/2 stream floods and resets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::catalogue::{KEY, PROMPT};
use super::{gateway, gateway_with, hostile_policy, still_serves};
use crate::common::{certs, Client, Gateway};

/// The server's bound on a TLS handshake and on a request's headers.
const HEADER_TIMEOUT: Duration = sluice_gateway::server::HANDSHAKE_TIMEOUT;

/// Reads until the peer closes (or fails); what it sent, and when it closed.
async fn until_closed(
    mut s: impl tokio::io::AsyncRead + Unpin,
    limit: Duration,
) -> (Vec<u8>, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (got, end.ok().map(|()| start.elapsed()))
}

fn connector(alpn: &[u8]) -> TlsConnector {
    let mut cfg = (*sluice_gateway::tls::client_config(&certs().ca_cert).expect("cfg")).clone();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(cfg))
}

/// Slowloris: headers a byte at a time, and a TLS handshake never begun. Both connections are
/// closed once the header bound passes (with 5 s of slack for a loaded machine).
#[tokio::test]
async fn slow_headers_and_silent_connections_are_closed() {
    let (gw, _) = gateway().await;
    let addr = gw.addr;
    let silent = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        until_closed(tcp, HEADER_TIMEOUT + Duration::from_secs(5)).await
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let tls = connector(b"http/1.1")
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (mut rd, mut wr) = tokio::io::split(tls);
    let trickle = tokio::spawn(async move {
        let _ = wr
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n")
            .await;
        for _ in 0..60 {
            if wr.write_all(b"x-slow: y\r\n").await.is_err() || wr.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let limit = HEADER_TIMEOUT + Duration::from_secs(5);
    let (_, closed) = until_closed(&mut rd, limit).await;
    trickle.abort();
    let closed = closed.expect("the slow-header connection was never closed");
    assert!(
        closed >= HEADER_TIMEOUT - Duration::from_secs(1),
        "closed after {closed:?}"
    );
    let (_, closed) = silent.await.expect("task");
    let closed = closed.expect("the silent connection was never closed");
    assert!(
        closed >= HEADER_TIMEOUT - Duration::from_secs(1),
        "closed after {closed:?}"
    );
    // The handshake never begun is counted; the slow headers came after a good one.
    assert_eq!(failed_handshakes(&gw, "timeout").await, 1);
    assert_eq!(failed_handshakes(&gw, "refused").await, 0);
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// The gateway's `/metrics`.
async fn metrics(gw: &Gateway) -> String {
    let metrics = gw.client().send("GET", "/metrics", None).await;
    let text = http_body_util::BodyExt::collect(metrics.into_body())
        .await
        .expect("metrics")
        .to_bytes();
    String::from_utf8_lossy(&text).into_owned()
}

/// `sluice_tls_handshakes_failed_total{reason}` on the gateway's `/metrics`.
async fn failed_handshakes(gw: &Gateway, reason: &str) -> u64 {
    let text = metrics(gw).await;
    let line = format!("sluice_tls_handshakes_failed_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("no {line} in {text}"))
        .parse()
        .expect("a count")
}

/// A ClientHello offering only TLS 1.1 (with suites the server has).
fn tls11_client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x02]; // client_version TLS 1.1
    hello.extend_from_slice(&[0x5a; 32]); // random
    hello.push(0); // no session id
                   // ECDHE-ECDSA/RSA with AES-GCM, as TLS 1.2 would offer them.
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x2b, 0xc0, 0x2f]);
    hello.extend_from_slice(&[0x01, 0x00]); // null compression; no extensions
    let mut hs = vec![0x01, 0x00];
    hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    hs.extend_from_slice(&hello);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// Plain HTTP, random bytes and a TLS 1.1 hello on the TLS port: closed at once, never an
/// HTTP answer; TLS 1.1 gets a fatal alert.
#[tokio::test]
async fn tls_garbage_and_tls11_are_refused() {
    let (gw, _) = gateway().await;
    let junk: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let inputs: [(&str, Vec<u8>); 3] = [
        (
            "plain HTTP",
            b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n".to_vec(),
        ),
        ("64 KiB of noise", junk),
        ("a TLS 1.1 hello", tls11_client_hello()),
    ];
    for (name, bytes) in inputs {
        let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
        let _ = tcp.write_all(&bytes).await;
        let (got, closed) = until_closed(tcp, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "{name}: left open");
        assert!(
            !got.windows(5).any(|w| w == b"HTTP/"),
            "{name}: answered HTTP"
        );
        if name == "a TLS 1.1 hello" {
            // A fatal alert record (rustls says handshake_failure, 40; protocol_version,
            // 70, would do as well).
            assert_eq!(got.first(), Some(&0x15), "{name}: {got:?}");
            assert!(
                matches!(got.get(5..7), Some([2, 40 | 70])),
                "{name}: {got:?}"
            );
        }
    }
    assert_eq!(failed_handshakes(&gw, "refused").await, 3);
    assert_eq!(failed_handshakes(&gw, "timeout").await, 0);
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// Headers past the server's bounds — 128 KiB in one header, 200 headers over HTTP/1.1, a
/// 32 KiB header over HTTP/2 — are refused (431, or the stream refused), never served.
#[tokio::test]
async fn oversized_headers_are_refused() {
    let (gw, _) = gateway().await;
    let big = vec![b'a'; 128 << 10];
    let many: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("x-h{i}"), b"v".to_vec()))
        .collect();
    let h2_big = vec![b'a'; 32 << 10];
    type Headers = Vec<(String, Vec<u8>)>;
    let attempts: [(&str, &str, Headers); 3] = [
        (
            "128 KiB header, HTTP/1.1",
            "http/1.1",
            vec![("x-big".into(), big)],
        ),
        ("200 headers, HTTP/1.1", "http/1.1", many),
        (
            "32 KiB header, HTTP/2",
            "h2",
            vec![("x-big".into(), h2_big)],
        ),
    ];
    for (name, alpn, headers) in attempts {
        let c = Client::new(gw.addr, &[alpn]);
        let h: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
        match c.raw("GET", "/healthz", &h, Bytes::new()).await {
            Ok(resp) => assert_eq!(
                resp.status(),
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "{name}"
            ),
            Err(e) => eprintln!("{name}: refused at the protocol: {e}"),
        }
    }
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// One HTTP/2 connection: 300 concurrent streaming requests (past the 200-stream limit and the
/// queue), all reset mid-flight, then 500 requests reset as soon as sent. Afterwards no slot
/// or queue place is held, each accepted request has one outcome, and the gateway serves.
#[tokio::test]
async fn http2_floods_and_resets_leave_nothing_held() {
    let (gw, _) = gateway().await;
    let send = crate::common::h2_connection(gw.addr).await;
    let body = serde_json::json!({"messages": [{"role": "user", "content": PROMPT}], "stream": true, "max_tokens": 4}).to_string();
    let request = || {
        Request::post(format!(
            "https://localhost:{}/v1/chat/completions",
            gw.addr.port()
        ))
        .header("authorization", format!("Bearer {KEY}"))
        .body(Full::new(Bytes::from(body.clone())))
        .expect("request")
    };
    let mut flood = Vec::new();
    for _ in 0..300 {
        let mut s = send.clone();
        let req = request();
        flood.push(tokio::spawn(async move { s.send_request(req).await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for f in &flood {
        f.abort();
    }
    for _ in 0..500 {
        let mut s = send.clone();
        drop(s.send_request(request()));
    }
    let admission = gw.app.admission.clone();
    let idle = crate::common::eventually(Duration::from_secs(10), || {
        let snap = admission.snapshot();
        snap.active == 0 && snap.queued_interactive + snap.queued_batch == 0
    })
    .await;
    assert!(
        idle,
        "slots or queue places still held: {:?}",
        gw.app.admission.snapshot()
    );
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// Idle connections do not pile up: an HTTP/2 connection with nothing in flight for
/// `server.idle_timeout` is closed (GOAWAY), while one whose stream is still open stays, and
/// closes in turn once its stream has ended and the limit has passed again.
#[tokio::test]
async fn idle_http2_connections_are_closed_but_never_under_a_stream() {
    let limit = Duration::from_millis(400);
    let mut up = crate::common::ScriptedUpstream::start().await;
    let mut policy = super::hostile_policy();
    policy.server.idle_timeout = limit;
    let gw = crate::common::Gateway::start(policy, up.upstream()).await;

    let mut idle = crate::common::h2_connection(gw.addr).await;
    let get = Request::get("https://localhost/healthz")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = idle.send_request(get).await.expect("answer");
    assert_eq!(resp.status(), StatusCode::OK);

    let mut busy = crate::common::h2_connection(gw.addr).await;
    let post = Request::post("https://localhost/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(crate::common::chat().to_string())))
        .expect("request");
    let stream = tokio::spawn(async move {
        let resp = busy.send_request(post).await.expect("answer");
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("body")
            .to_bytes();
        (busy, body)
    });
    let mut arrival = up
        .arrivals
        .recv()
        .await
        .expect("the stream reached the upstream");
    arrival
        .tx
        .send_data(Bytes::from_static(b"data: {}\n\n"))
        .await
        .expect("chunk");

    tokio::time::sleep(limit * 3).await;
    assert!(idle.is_closed(), "the idle connection is still open");
    assert!(!stream.is_finished(), "the stream ended early");

    // The stream ends; its connection is idle from then on.
    arrival
        .tx
        .send_data(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .expect("chunk");
    drop(arrival);
    // Later requests get an answer at once.
    tokio::spawn(async move {
        while let Some(mut a) = up.arrivals.recv().await {
            let _ =
                a.tx.send_data(Bytes::from_static(b"data: [DONE]\n\n"))
                    .await;
        }
    });
    let (busy, body) = stream.await.expect("task");
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    assert!(!busy.is_closed(), "closed as soon as the stream ended");
    tokio::time::sleep(limit * 3).await;
    assert!(busy.is_closed(), "the connection stayed open once idle");
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// A client silent after the TLS handshake (no byte of HTTP/1.1, or HTTP/2's preface and
/// settings and then nothing) is closed once the header bound passes, not after the whole idle
/// limit (75 s): hyper's header timeout only starts once it has seen enough to pick a protocol.
#[tokio::test]
async fn a_client_silent_after_the_handshake_is_closed_at_the_header_bound() {
    let (gw, _) = gateway().await;
    let mut silent = Vec::new();
    for (alpn, first) in [
        (&b"http/1.1"[..], &b""[..]),
        (
            &b"h2"[..],
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"[..],
        ),
    ] {
        let addr = gw.addr;
        silent.push(tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let name = ServerName::try_from("localhost").expect("name");
            let mut tls = connector(alpn).connect(name, tcp).await.expect("handshake");
            tls.write_all(first).await.expect("write");
            tls.flush().await.expect("flush");
            until_closed(tls, HEADER_TIMEOUT + Duration::from_secs(5)).await
        }));
    }
    for s in silent {
        let (_, closed) = s.await.expect("task");
        let closed = closed.expect("a silent connection was never closed");
        assert!(
            closed >= HEADER_TIMEOUT - Duration::from_secs(1),
            "closed after {closed:?}"
        );
    }
    still_serves(&gw).await;
    gw.shutdown().await;
}

/// `server.max_connections` = 2, both held by clients silent before TLS: a third client's
/// request waits in the listen backlog, and is served as soon as one of them leaves (long
/// before the 10 s handshake bound would have freed a slot). `/metrics` counts the wait.
#[tokio::test]
async fn past_max_connections_a_client_waits_for_a_close() {
    let mut policy = hostile_policy();
    policy.server.max_connections = 2;
    let (gw, _) = gateway_with(policy).await;
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = gw
        .client()
        .with_header("authorization", &format!("Bearer {KEY}"));
    let request = tokio::spawn(async move {
        client
            .post("/v1/chat/completions", &crate::common::chat())
            .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!request.is_finished(), "served past the limit");
    let freed = Instant::now();
    drop(silent.remove(0));
    let (status, _, v) = tokio::time::timeout(HEADER_TIMEOUT / 2, request)
        .await
        .expect("served once a slot was freed")
        .expect("request task");
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(freed.elapsed() < HEADER_TIMEOUT / 2);
    drop(silent);
    let text = metrics(&gw).await;
    assert!(text.contains("sluice_connections_max 2"), "{text}");
    let waits: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_connections_limit_waits_total "))
        .expect("the waits counter")
        .parse()
        .expect("a count");
    assert!(waits >= 1, "waits {waits}");
    gw.shutdown().await;
}

/// `server.probe_listen`: with the clients' listener at `server.max_connections` (one, held by
/// a client silent before TLS), the probe listener still answers `/healthz`, `/readyz` and
/// `/metrics` at once, over the same TLS, and nothing else: no generation, no admin, no page.
#[tokio::test]
async fn probes_are_answered_on_their_own_listener_past_max_connections() {
    let mut policy = hostile_policy();
    policy.server.max_connections = 1;
    policy.server.probe_listen = Some("127.0.0.1:0".parse().expect("address"));
    let (gw, seen) = gateway_with(policy).await;
    let silent = TcpStream::connect(gw.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probes = Client::new(
        gw.probe_addr.expect("a probe listener"),
        &["h2", "http/1.1"],
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _, v) =
            tokio::time::timeout(HEADER_TIMEOUT / 2, probes.json("GET", path, None))
                .await
                .unwrap_or_else(|_| {
                    panic!("{path} not answered while the clients' listener is full")
                });
        assert_eq!(status, StatusCode::OK, "{path}: {v}");
    }
    let (_, _, metrics) = probes.json("GET", "/metrics", None).await;
    let metrics = metrics.as_str().expect("Prometheus text");
    assert!(metrics.contains("sluice_connections_open 1\n"), "{metrics}");
    assert!(metrics.contains("sluice_connections_max 1\n"), "{metrics}");
    // The probe listener's own count: this client's connection, under its own limit.
    assert!(
        metrics.contains("sluice_probe_connections_open 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "sluice_probe_connections_max {}\n",
            sluice_gateway::server::PROBE_CONNECTIONS
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_probe_connections_limit_waits_total 0\n"),
        "{metrics}"
    );
    // Each tenant's counters go to the probe listener's scrapes (no key asked there either).
    assert!(
        metrics.contains("# TYPE sluice_tenant_requests_total counter\n"),
        "{metrics}"
    );
    let chat = crate::common::chat();
    for (method, path, want) in [
        ("POST", "/v1/chat/completions", StatusCode::NOT_FOUND),
        ("POST", "/v1/completions", StatusCode::NOT_FOUND),
        ("GET", "/v1/models", StatusCode::NOT_FOUND),
        ("GET", "/admin/policy", StatusCode::NOT_FOUND),
        ("GET", "/ui", StatusCode::NOT_FOUND),
        ("POST", "/healthz", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let probes = probes
            .clone()
            .with_header("authorization", &format!("Bearer {KEY}"));
        let (status, _, v) = probes.json(method, path, Some(&chat)).await;
        assert_eq!(status, want, "{method} {path}: {v}");
        assert!(
            v["error"]["message"].is_string(),
            "an OpenAI-shaped error: {v}"
        );
    }
    assert!(
        seen.lock().expect("seen").is_empty(),
        "nothing reached the upstream"
    );
    drop(silent);
    still_serves(&gw).await;
    gw.shutdown().await;
}
