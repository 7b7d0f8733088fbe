//! Predictive admission against the real bundled engine: a cold model admits a short request
//! and says what it predicts, the model refits from real streams, and a deadline the engine
//! cannot meet is refused at once with `Retry-After`, its room held until it comes back then.

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sluice_gateway::body::output;
use sluice_gateway::policy::Policy;

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.trim().parse().ok()
    })
}

fn stream(content: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "stream": true,
           "max_tokens": max_tokens, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictive_admission_on_the_real_engine() {
    let _engine = crate::engine::exclusive().await;
    let mut policy = Policy::default();
    policy.admission.hold_for_returns = true;
    // One slot: a short request cannot go ahead of the long prompt below (with more, it would
    // prefill first, as the next test shows).
    policy.admission.active_max = 1;
    let (sup, gw) = crate::engine::start(policy, Duration::from_secs(120)).await;
    let c = gw.client();

    // Cold: a short request is admitted and carries its prediction.
    let sent = Instant::now();
    let resp = c
        .send("POST", "/v1/chat/completions", Some(&stream("Hello", 8)))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let predicted: u64 = resp.headers()["x-sluice-predicted-ttft-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("ms");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
    assert!(predicted < 2000, "cold prediction {predicted} ms");
    eprintln!(
        "cold: predicted {predicted} ms, whole answer {:?}",
        sent.elapsed()
    );

    // Six more streams: the model refits from each.
    for i in 0..6 {
        let (status, _, v) = c
            .post(
                "/v1/chat/completions",
                &stream(&format!("Count to {i}."), 16),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (_, _, m) = c.json("GET", "/metrics", None).await;
    let m = m.as_str().unwrap_or_default().to_owned();
    let fitted = metric(
        &m,
        "sluice_cost_model_observations_total{model=\"prefill\"}",
    );
    assert!(fitted.is_some_and(|n| n >= 7.0), "{m}");
    // The first token is the first content event, not the engine's role event (which made
    // this +1042% before): +14% on 2026-12-01 at load average 8. Half a miss is the margin for
    // a loaded CI machine; the target (±25%) is checked without it in `replay_tests`.
    let median = metric(&m, "sluice_ttft_prediction_median_error_ratio");
    eprintln!("after 7 streams: median error {median:?}");
    assert!(median.is_some_and(|e| e.abs() <= 0.5), "{m}");

    // A long prompt holds the slot; a short one asking for 1 ms cannot be served in time:
    // refused at once, with a Retry-After, never queued.
    let long_prompt = "the quick brown fox jumps over the lazy dog ".repeat(250);
    let long = {
        let c = c.clone();
        tokio::spawn(async move {
            c.post("/v1/chat/completions", &stream(&long_prompt, 4))
                .await
        })
    };
    prefilling(&gw, 1000, "the long prompt is prefilling").await;
    let strict = c.clone().with_header("x-sluice-ttft-deadline-ms", "1");
    let asked = Instant::now();
    let (status, headers, v) = strict.post("/v1/chat/completions", &stream("Hi", 4)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["code"], "deadline_unmeetable", "{v}");
    assert!(asked.elapsed() < Duration::from_secs(1), "refused at once");
    // Its room is held until it comes back at the time it was told, without the strict
    // deadline (the same tenant, prompt and max_tokens take the hold): then it is served.
    assert_eq!(gw.app.admission.snapshot().holds, 1);
    let told: u64 = headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    tokio::time::sleep(Duration::from_secs(told).saturating_sub(asked.elapsed())).await;
    let (status, _, v) = c.post("/v1/chat/completions", &stream("Hi", 4)).await;
    assert_eq!(status, StatusCode::OK, "back after {told} s: {v}");
    assert_eq!(gw.app.admission.snapshot().holds, 0);
    let (status, _, v) = long.await.expect("long");
    assert_eq!(status, StatusCode::OK, "{v}");

    // A deadline that is not a number is the client's mistake.
    let bad = c.clone().with_header("x-sluice-ttft-deadline-ms", "soon");
    let (status, _, v) = bad.post("/v1/chat/completions", &stream("Hi", 4)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "x-sluice-ttft-deadline-ms");
    crate::engine::stop(sup, gw).await;
}

/// Waits until more than `tokens` prompt tokens are admitted and not past their prefill.
async fn prefilling(gw: &crate::common::Gateway, tokens: usize, what: &str) {
    let admission = &gw.app.admission;
    let seen = crate::common::eventually(Duration::from_secs(10), || {
        admission.snapshot().prefill_tokens > tokens
    });
    assert!(seen.await, "{what}");
}

/// The first content event of a streamed answer: when it came (from `sent`), and the answer's
/// predicted time to first token.
async fn first_token(c: crate::common::Client, content: String) -> (Duration, u64) {
    let sent = Instant::now();
    let resp = c
        .send("POST", "/v1/chat/completions", Some(&stream(&content, 4)))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let predicted = resp.headers()["x-sluice-predicted-ttft-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("ms");
    // The gateway's own test of an event with output (the role event before the prefill has
    // none).
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            if output::scan(&data).tokens > 0 {
                let took = sent.elapsed();
                while body.frame().await.is_some() {}
                return (took, predicted);
            }
        }
    }
    panic!("the stream ended without output");
}

/// The shipped policy starts the bundled engine with the least prefill left first, and
/// predicts that order: a short prompt sent while two long ones prefill (one chunk of each in
/// the pipeline at once, so it cannot slip in beside them) is told, and gets, its first token
/// before theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_prompt_goes_ahead_of_long_ones_prefilling_on_the_real_engine() {
    let _engine = crate::engine::exclusive().await;
    let (sup, gw) = crate::engine::start(Policy::default(), Duration::from_secs(120)).await;
    let c = gw.client();
    let started = Instant::now();
    let long_prompt =
        |word: &str| format!("{word} the quick brown fox jumps over the lazy dog ").repeat(300);
    let longs: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|w| tokio::spawn(first_token(c.clone(), long_prompt(w))))
        .collect();
    prefilling(&gw, 5000, "the long prompts are prefilling").await;
    let asked = started.elapsed();
    let (short, short_told) = first_token(c.clone(), "Hi".into()).await;
    for long in longs {
        let (long, long_told) = long.await.expect("long");
        eprintln!(
            "long: first token {long:?} (told {long_told} ms); short, sent {asked:?} later: \
             {short:?} (told {short_told} ms)"
        );
        assert!(
            asked + short < long,
            "the short one's first token came first"
        );
        assert!(
            asked + Duration::from_millis(short_told) < Duration::from_millis(long_told),
            "and it was told so"
        );
    }
    crate::engine::stop(sup, gw).await;
}
