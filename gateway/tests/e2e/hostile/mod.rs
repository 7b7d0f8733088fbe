//! Hostile and malformed input over real TLS: the catalogue (`catalogue.rs`) of requests the
//! gateway must refuse with its documented error, and the connection-level abuse (`conn.rs`):
//! slow headers, TLS garbage, old TLS versions, oversized headers, HTTP/2 stream floods. After
//! each, the gateway still serves, every accepted request is accounted for, and the logs hold
//! no key and no prompt text above debug.

mod catalogue;
mod conn;
mod logs;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_gateway::policy::Policy;

use crate::common::{policy, sha256_hex, tenant, Client, Gateway, ScriptedUpstream};
use catalogue::{Case, Want, ADMIN_KEY, BODY_LIMIT, KEY, PROMPT, WRONG_KEY};
use logs::Logs;

/// One tenant, an admin key, a small body limit.
pub(super) fn hostile_policy() -> Policy {
    let mut p = policy(4, 16);
    p.tenants.push(tenant("tenant", KEY));
    p.admin.api_key_sha256 = Some(sha256_hex(ADMIN_KEY));
    p.server.body_limit_bytes = BODY_LIMIT;
    p
}

/// A gateway whose upstream answers every request at once with `data: [DONE]`; the bodies it
/// was sent are kept.
async fn gateway() -> (Gateway, Arc<Mutex<Vec<Value>>>) {
    gateway_with(hostile_policy()).await
}

/// As [`gateway`], with `policy`.
async fn gateway_with(policy: Policy) -> (Gateway, Arc<Mutex<Vec<Value>>>) {
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy, up.upstream()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Some(mut a) = up.arrivals.recv().await {
            keep.lock().expect("seen").push(a.body);
            let _ =
                a.tx.send_data(Bytes::from_static(b"data: [DONE]\n\n"))
                    .await;
        }
    });
    (gw, seen)
}

/// The gateway still answers a good request with the tenant's key.
async fn still_serves(gw: &Gateway) {
    let c = gw
        .client()
        .with_header("authorization", &format!("Bearer {KEY}"));
    let (status, _, v) = c.post("/v1/chat/completions", &crate::common::chat()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// What is wrong with the answer to `case` (nothing when it is the documented one).
async fn check(c: &Client, case: &Case, seen: &Mutex<Vec<Value>>) -> Vec<String> {
    let headers: Vec<(&str, &[u8])> = case.headers.iter().map(|(k, v)| (*k, &v[..])).collect();
    let body = Bytes::from(case.body.clone());
    let resp = match c.raw(case.method, case.path, &headers, body).await {
        Ok(r) => r,
        Err(e) => return vec![format!("no answer: {e}")],
    };
    let status = resp.status();
    let ctype = resp.headers().get("content-type").cloned();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut wrong = Vec::new();
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            wrong.push(format!("{what} (got {status} {v})"));
        }
    };
    match case.want {
        Want::Refused(want_status, code) => {
            expect(
                status.as_u16() == want_status,
                &format!("status {want_status}"),
            );
            expect(v["error"]["code"] == code, &format!("code {code}"));
            expect(
                ctype.as_ref().map(|h| h.as_bytes()) == Some(&b"application/json"[..]),
                "JSON",
            );
            let message = v["error"]["message"].as_str().unwrap_or_default();
            expect(message.len() > 10, "a clear message");
            expect(v["error"]["type"].is_string(), "a type");
            expect(v["error"].get("param").is_some(), "a param");
            for secret in [KEY, ADMIN_KEY, WRONG_KEY] {
                expect(!message.contains(secret), "no key echoed");
            }
        }
        Want::Clamped => {
            expect(status == StatusCode::OK, "200");
            let last = seen
                .lock()
                .expect("seen")
                .last()
                .cloned()
                .unwrap_or_default();
            expect(
                last["max_tokens"] == 4096,
                "max_tokens clamped to 4096 upstream",
            );
        }
    }
    wrong
}

#[tokio::test]
async fn the_catalogue_gets_documented_errors_and_nothing_leaks() {
    let (logs, _guard) = Logs::capture();
    let (gw, seen) = gateway().await;
    let cases = catalogue::cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut failures = Vec::new();
    for alpn in ["h2", "http/1.1"] {
        let c = Client::new(gw.addr, &[alpn]);
        for case in &cases {
            let found = tokio::time::timeout(Duration::from_secs(10), check(&c, case, &seen))
                .await
                .unwrap_or_else(|_| vec!["no answer within 10 s".into()]);
            failures.extend(
                found
                    .into_iter()
                    .map(|f| format!("{alpn}, {}: {f}", case.name)),
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    still_serves(&gw).await;
    gw.assert_accounted().await;
    gw.shutdown().await;
    logs.assert_clean(&[KEY, ADMIN_KEY, WRONG_KEY], &[PROMPT]);
}
