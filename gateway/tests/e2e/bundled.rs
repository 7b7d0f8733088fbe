//! The gateway in front of the real bundled engine: three ranks, the real model, started and
//! supervised by the gateway as `sluice serve` does.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sluice_engine::trace::TraceContext;
use sluice_gateway::bundled::{BundledConfig, Supervisor};
use sluice_gateway::forward::BundledUpstream;
use sluice_gateway::policy::Policy;

use crate::common::Gateway;
use crate::otlp::{named, Collector};

/// The engine's `engine.request` hangs under the gateway's `gateway.upstream`, with
/// `engine.prefill` and `engine.decode` under it, inside the upstream span's time.
async fn assert_engine_joins_the_trace(collector: &Collector, trace: &TraceContext) {
    let names = [
        "gateway.request",
        "gateway.queue",
        "gateway.upstream",
        "engine.request",
        "engine.prefill",
        "engine.decode",
    ];
    let spans = collector.wait_for(&trace.trace_id, &names).await;
    let by = |n: &str| named(&spans, n);
    let (upstream, request) = (by("gateway.upstream"), by("engine.request"));
    assert_eq!(upstream.service, "sluice-gateway");
    assert_eq!(request.service, "sluice-engine");
    assert_eq!(request.span.parent_span_id, upstream.span.span_id);
    for child in ["engine.prefill", "engine.decode"] {
        assert_eq!(
            by(child).span.parent_span_id,
            request.span.span_id,
            "{child}"
        );
    }
    // Two processes' clocks: the same wall clock, read at different moments (2 ms slack).
    let slack = 2_000_000;
    assert!(request.span.start_time_unix_nano + slack >= upstream.span.start_time_unix_nano);
    assert!(request.span.end_time_unix_nano <= upstream.span.end_time_unix_nano + slack);
}

fn prompt_tokens(headers: &http::HeaderMap) -> u64 {
    headers["x-sluice-prompt-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_fronts_the_real_bundled_engine() {
    let _engine = crate::engine::exclusive().await;
    let bin = BundledConfig::locate_engine_bin().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = BundledConfig::new(bin, sluice_engine::model::default_model_path());
    cfg.ranks = 3;
    // The gateway exports its spans over gRPC, the engine its own over HTTP/protobuf, to one
    // collector: a request's spans from both processes make one trace.
    let collector = crate::otlp::export_gateway_spans();
    cfg.env = crate::otlp::config(collector.http, "http/protobuf", "unused")
        .child_env("sluice-engine")
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let sup = Arc::new(Supervisor::start(cfg).await.expect("engine"));
    sup.wait_ready(Duration::from_secs(180))
        .await
        .expect("engine ready");
    let gw = Gateway::start(
        Policy::default(),
        Arc::new(BundledUpstream::new(sup.clone()).expect("upstream")),
    )
    .await;
    let c = gw.client();
    let (status, _, ready) = c.json("GET", "/readyz", None).await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    // The engine's ranks are relayed in the gateway's /metrics.
    let (_, _, metrics) = c.json("GET", "/metrics", None).await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    for rank in 0..3 {
        let line = format!("sluice_engine_rank_up{{rank=\"{rank}\"}} 1");
        assert!(metrics.contains(&line), "no `{line}` in\n{metrics}");
    }

    // The gateway's count equals the engine's usage.prompt_tokens: chat, chat with tools,
    // text completion.
    let requests = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}], "max_tokens": 4, "temperature": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        ),
    ];
    for (path, body) in &requests {
        let (status, headers, v) = c.post(path, body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            Some(prompt_tokens(&headers)),
            v["usage"]["prompt_tokens"].as_u64(),
            "{path}: {v}"
        );
        assert_eq!(headers["x-sluice-queue-ms"], "0");
        assert!(v["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=4).contains(&n)));
    }

    // Streaming passes through chunk by chunk, ending with [DONE] and the usage.
    let body = json!({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16,
                      "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true});
    let resp = c.send("POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let counted = prompt_tokens(resp.headers());
    let trace = TraceContext::parse(resp.headers()["traceparent"].to_str().expect("ascii"))
        .expect("traceparent");
    let mut frames = 0;
    let mut text = String::new();
    let mut body = resp.into_body();
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.expect("frame").into_data() {
            frames += 1;
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    assert!(frames > 3, "the stream came in {frames} pieces");
    assert_engine_joins_the_trace(collector, &trace).await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["prompt_tokens"].as_u64(), Some(counted));
    assert_eq!(
        usage["usage"]["completion_tokens"].as_u64(),
        Some(16),
        "ignore_eos passed through"
    );

    // The input cap against the real engine: 8,193 tokens refused by the gateway, exactly
    // 8,192 accepted and run by the engine.
    let ids = |n: usize| {
        (0..n)
            .map(|i| 1000 + (i * 7919) % 40000)
            .collect::<Vec<_>>()
    };
    let (status, _, v) = c
        .post(
            "/v1/completions",
            &json!({"prompt": ids(8193), "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (status, headers, v) = c
        .post(
            "/v1/completions",
            &json!({"prompt": ids(8192), "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(prompt_tokens(&headers), 8192);
    assert_eq!(v["usage"]["prompt_tokens"], 8192);

    gw.assert_accounted().await;
    gw.shutdown().await;
    drop(c);
    if let Ok(sup) = Arc::try_unwrap(sup) {
        sup.shutdown().await;
    }
}
