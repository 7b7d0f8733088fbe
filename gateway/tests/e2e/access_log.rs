//! A request's accounting by the real `sluice serve` process: one access line on its stderr for
//! each generation request, served or refused, with the caller, the outcome and the times; and
//! its tenant's counters on `/metrics`.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use sluice_gateway::policy::UpstreamKind;
use tokio::net::TcpStream;

use crate::common::{chat, eventually, policy, sha256_hex, tenant, ScriptedUpstream};
use crate::process::ServeProcess;

/// A chat request over plain HTTP/1.1 with `x-request-id: id` (and `Bearer key` when given):
/// its status, once its body was read to the end.
async fn post(addr: SocketAddr, id: &str, key: Option<&str>) -> StatusCode {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("host", addr.to_string())
        .header("x-request-id", id);
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let req = req
        .body(Full::new(Bytes::from(chat().to_string())))
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status();
    resp.into_body().collect().await.expect("body");
    status
}

/// `GET /metrics` over plain HTTP/1.1 (with `Bearer key` when given): the Prometheus text.
async fn metrics(addr: SocketAddr, key: Option<&str>) -> String {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::get(format!("http://{addr}/metrics")).header("host", addr.to_string());
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::new())).expect("request");
    let resp = send.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(body.to_vec()).expect("UTF-8")
}

/// The access line of request `id`, if logged yet.
fn access_line(lines: &Mutex<Vec<String>>, id: &str) -> Option<String> {
    let needle = format!("request_id=\"{id}\"");
    lines
        .lock()
        .expect("lock")
        .iter()
        .find(|l| l.contains("sluice::access") && l.contains(&needle))
        .cloned()
}

#[tokio::test]
async fn sluice_serve_accounts_each_request_in_an_access_line_and_its_tenants_counters() {
    let mut up = ScriptedUpstream::start().await;
    let up_url = up.url();
    let mut p = policy(4, 16);
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = vec![up.url()];
    p.tenants = vec![tenant("alice", "sk-alice")];
    p.admin.api_key_sha256 = Some(sha256_hex("sk-admin"));
    tokio::spawn(async move {
        while let Some(mut a) = up.arrivals.recv().await {
            let usage = json!({"choices": [{"index": 0, "delta": {"content": "Hi"}}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}});
            let text = format!("data: {usage}\n\ndata: [DONE]\n\n");
            let _ = a.tx.send_data(Bytes::from(text)).await;
        }
    });
    let dir = std::env::temp_dir().join(format!("sluice-access-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let gateway = ServeProcess::start(&p, &dir).await;
    let (addr, lines) = (gateway.addr, gateway.lines.clone());

    assert_eq!(post(addr, "acc-ok", Some("sk-alice")).await, StatusCode::OK);
    assert_eq!(
        post(addr, "acc-no-key", None).await,
        StatusCode::UNAUTHORIZED
    );
    let both =
        || access_line(&lines, "acc-ok").is_some() && access_line(&lines, "acc-no-key").is_some();
    assert!(
        eventually(Duration::from_secs(5), both).await,
        "no access lines: {:#?}",
        lines.lock().expect("lock")
    );

    let ok = access_line(&lines, "acc-ok").expect("logged");
    for field in [
        " INFO sluice::access: request ",
        " tenant=\"alice\" class=interactive path=/v1/chat/completions upstream=",
        " status=200 outcome=ok code=none prompt_tokens=",
        " output_tokens=3 queue_ms=0 ttft_ms=",
        " duration_ms=",
    ] {
        assert!(ok.contains(field), "{ok:?} lacks {field:?}");
    }
    assert!(
        ok.contains(&format!(" upstream=\"{up_url}\" status=200 ")),
        "{ok:?}"
    );
    assert!(
        !ok.contains('\u{1b}'),
        "colour codes off a terminal: {ok:?}"
    );
    let refused = access_line(&lines, "acc-no-key").expect("logged");
    assert!(
        refused.contains(" status=401 outcome=rejected code=invalid_api_key "),
        "{refused:?}"
    );
    for absent in ["tenant=", "queue_ms=", "ttft_ms="] {
        assert!(!refused.contains(absent), "{refused:?} has {absent:?}");
    }
    // One line each: the body's end and the guard do not both log.
    let count = |id: &str| {
        let needle = format!("request_id=\"{id}\"");
        let lines = lines.lock().expect("lock");
        lines
            .iter()
            .filter(|l| l.contains("sluice::access") && l.contains(&needle))
            .count()
    };
    assert_eq!((count("acc-ok"), count("acc-no-key")), (1, 1));

    // The tenant's counters, to a scrape with the admin key (without it, or with a tenant's
    // key, none: `/metrics` asks no key here, and a tenant must not read another's name): its
    // one request, its prompt as the gateway counted it on arrival (the access line's), the
    // upstream's 3 completion tokens. The request without a key belongs to no tenant.
    let prompt: u64 = ok
        .split(" prompt_tokens=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("prompt_tokens in the access line");
    assert!(prompt > 0, "{ok:?}");
    for key in [None, Some("sk-alice"), Some("sk-wrong")] {
        let open = metrics(addr, key).await;
        assert!(open.contains("sluice_requests_total{"), "{open}");
        assert!(!open.contains("sluice_tenant_"), "tenants shown to {key:?}");
    }
    let text = metrics(addr, Some("sk-admin")).await;
    for line in [
        "sluice_tenant_requests_total{tenant=\"alice\",outcome=\"ok\"} 1\n".to_owned(),
        "sluice_tenant_requests_total{tenant=\"alice\",outcome=\"rejected\"} 0\n".to_owned(),
        format!("sluice_tenant_prompt_tokens_total{{tenant=\"alice\"}} {prompt}\n"),
        "sluice_tenant_completion_tokens_total{tenant=\"alice\"} 3\n".to_owned(),
    ] {
        assert!(text.contains(&line), "/metrics lacks {line:?}");
    }
    let tenants: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_tenant_requests_total{"))
        .collect();
    assert_eq!(tenants.len(), 6, "alice's six outcomes alone: {tenants:#?}");
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
