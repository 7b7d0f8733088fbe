//! Faults in the real bundled engine: a rank killed mid-stream, then rank 0 itself. The
//! streams in flight end with an explicit error event within 2 s, `/readyz` flips, new
//! requests get 503 `engine_unavailable` at once, and the supervisor brings the engine back
//! while the gateway keeps running.

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use sluice_gateway::policy::Policy;

use crate::common::{Client, Gateway};
use crate::engine::{children, listening, sigkill};

/// The bound on a cut stream's error event, after the kill.
const ERROR_EVENT_WITHIN: Duration = Duration::from_secs(2);

/// A long stream, read until its first content chunk.
async fn stream_started(c: &Client) -> (Incoming, String) {
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                      "stream": true, "max_tokens": 2000, "ignore_eos": true});
    let resp = c.send("POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut text = String::new();
    while !text.contains("\"content\"") {
        let frame = body.frame().await.expect("a first chunk").expect("frame");
        if let Ok(d) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    (body, text)
}

/// Reads the rest of a stream; it must end with an error event then `[DONE]` within
/// [`ERROR_EVENT_WITHIN`] of `killed`.
async fn ends_with_error_event(mut body: Incoming, mut text: String, killed: Instant, what: &str) {
    let rest = async {
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => {
                    if let Ok(d) = f.into_data() {
                        text.push_str(&String::from_utf8_lossy(&d));
                    }
                }
                Err(e) => panic!("{what}: the stream was cut without an error event: {e}\n{text}"),
            }
        }
        text
    };
    let text = tokio::time::timeout(ERROR_EVENT_WITHIN * 5, rest)
        .await
        .unwrap_or_else(|_| panic!("{what}: the stream did not end"));
    let took = killed.elapsed();
    assert!(
        took <= ERROR_EVENT_WITHIN,
        "{what}: ended {took:?} after the kill"
    );
    let tail: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    let n = tail.len();
    assert!(n >= 2, "{what}: {text}");
    assert!(
        tail[n - 2].contains("\"error\""),
        "{what}: no error event before [DONE]:\n{text}"
    );
    assert_eq!(tail[n - 1], "data: [DONE]", "{what}");
    eprintln!("{what}: error event {took:?} after the kill");
}

async fn status(c: &Client, path: &str) -> StatusCode {
    c.json("GET", path, None).await.0
}

/// Waits for `/readyz` to answer `want`, at most `limit`; how long it took.
async fn readyz_becomes(c: &Client, want: StatusCode, limit: Duration) -> Duration {
    let started = Instant::now();
    while status(c, "/readyz").await != want {
        assert!(started.elapsed() < limit, "/readyz never became {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// While the engine is down a request is answered 503 `engine_unavailable`, at once.
async fn refused_at_once(c: &Client) {
    let started = Instant::now();
    let body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4});
    let (status, _, v) = c.post("/v1/chat/completions", &body).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["code"], "engine_unavailable", "{v}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// Kills `victim` under two streams; checks the streams, `/readyz` and the refusal.
async fn kill_under_streams(gw: &Gateway, victim: u32, what: &str) {
    let c = gw.client();
    let a = stream_started(&c).await;
    let b = stream_started(&c).await;
    sigkill(victim);
    let killed = Instant::now();
    let (ra, rb) = tokio::join!(
        ends_with_error_event(a.0, a.1, killed, what),
        ends_with_error_event(b.0, b.1, killed, what),
    );
    let ((), ()) = (ra, rb);
    readyz_becomes(&c, StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(10)).await;
    eprintln!(
        "{what}: /readyz 503 by {:?} after the kill",
        killed.elapsed()
    );
    refused_at_once(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_ranks_end_streams_with_an_error_and_the_engine_comes_back() {
    let _engine = crate::engine::exclusive().await;
    let (sup, gw) = crate::engine::start(Policy::default(), Duration::from_secs(60)).await;
    let c = gw.client();

    // A pipeline rank (a child of rank 0).
    let rank0 = sup.child_pid().expect("rank 0 runs");
    let ranks = children(rank0);
    assert_eq!(ranks.len(), 2, "ranks 1 and 2 under rank 0: {ranks:?}");
    // Every rank listens on loopback only (the API on rank 0, the pipeline links on all).
    for pid in std::iter::once(rank0).chain(ranks.iter().copied()) {
        let addrs = listening(pid);
        assert!(
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()),
            "{pid}: {addrs:?}"
        );
    }
    kill_under_streams(&gw, ranks[0], "rank kill").await;
    let down = Instant::now();
    readyz_becomes(&c, StatusCode::OK, Duration::from_secs(240)).await;
    eprintln!("rank kill: ready again {:?} later", down.elapsed());
    assert_ne!(sup.child_pid(), Some(rank0), "the engine was restarted");
    let (status, _, v) = c
        .post(
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // Rank 0 itself: the gateway's connection to it is cut mid-stream.
    let rank0 = sup.child_pid().expect("rank 0 runs");
    kill_under_streams(&gw, rank0, "rank 0 kill").await;
    let down = Instant::now();
    readyz_becomes(&c, StatusCode::OK, Duration::from_secs(240)).await;
    eprintln!("rank 0 kill: ready again {:?} later", down.elapsed());
    let (status, _, v) = c
        .post(
            "/v1/completions",
            &json!({"prompt": "One, two,", "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    gw.assert_accounted().await;
    crate::engine::stop(sup, gw).await;
}
