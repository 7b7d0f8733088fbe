use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;

use super::{within, Script, TestServer, CONTEXT, MODEL};
use crate::api::{GenerationEvent, Timings};
use crate::generate::FinishReason;

#[tokio::test]
async fn health_is_200_when_ok_and_503_otherwise() {
    let s = TestServer::start(vec![]).await;
    let r = s.get("/health").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 2);
    assert_eq!(v["ranks"][1]["layers"], json!([15, 29]));
    s.engine.healthy.store(false, Ordering::SeqCst);
    let r = s.get("/health").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "degraded");
    assert_eq!(r.json()["ranks"][1]["up"], false);
}

#[tokio::test]
async fn models_lists_the_engine_model() {
    let s = TestServer::start(vec![]).await;
    let v = s.get("/v1/models").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], CONTEXT);
}

#[tokio::test]
async fn metrics_use_vllm_names_and_count_latencies() {
    let s = TestServer::start(vec![]).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(s.post("/v1/chat/completions", &body).await.status, 200);
    let r = s.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let label = format!("model_name=\"{MODEL}\"");
    for line in [
        format!("vllm:num_requests_running{{{label}}} 1"),
        format!("vllm:num_requests_waiting{{{label}}} 0"),
        format!("vllm:kv_cache_usage_perc{{{label}}} 0.5"),
        format!("vllm:prompt_tokens_total{{{label}}} 10"),
        format!("vllm:generation_tokens_total{{{label}}} 20"),
        format!("vllm:request_success_total{{finished_reason=\"stop\",{label}}} 3"),
        format!("vllm:request_success_total{{finished_reason=\"length\",{label}}} 1"),
        format!("vllm:num_preemptions_total{{{label}}} 0"),
        "sluice_engine_rank_up{rank=\"1\"} 1".to_owned(),
        "sluice_engine_kv_tokens_capacity{rank=\"0\"} 4096".to_owned(),
        "sluice_engine_kv_tokens_used{rank=\"0\"} 64".to_owned(),
        "sluice_engine_weight_bytes{rank=\"0\"} 1000".to_owned(),
        "sluice_engine_kv_bytes{rank=\"1\"} 2000".to_owned(),
        format!("sluice_engine_requests_aborted_total{{{label}}} 0"),
        format!("sluice_engine_requests_failed_total{{{label}}} 0"),
        format!("sluice_engine_time_to_first_token_seconds_count{{{label}}} 1"),
        format!("sluice_engine_e2e_request_latency_seconds_count{{{label}}} 1"),
        "# TYPE sluice_engine_e2e_request_latency_seconds histogram".to_owned(),
        "# TYPE vllm:kv_cache_usage_perc gauge".to_owned(),
    ] {
        assert!(
            r.body.lines().any(|l| l == line),
            "missing {line:?} in\n{}",
            r.body
        );
    }
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let s = TestServer::start(vec![]).await;
    let stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get(format!("http://{}/v1/models", s.addr))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = within(sender.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = within(resp.into_body().collect()).await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains(MODEL));
    conn.abort();
}

#[tokio::test]
async fn a_client_leaving_mid_stream_aborts_the_request() {
    let s = TestServer::start(vec![Script::Hold(vec!["tok"])]).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}).to_string();
    let (resp, conn) = s.open("POST", "/v1/chat/completions", &body, &[]).await;
    let tx = s.held().await;
    let mut body = resp.into_body();
    let mut seen = String::new();
    while !seen.contains("tok") {
        let frame = within(body.frame()).await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap()));
    }
    assert!(!tx.is_closed());
    // The client goes away: its connection closes.
    drop(body);
    conn.abort();
    tokio::time::timeout(Duration::from_secs(1), tx.closed())
        .await
        .expect("the engine's receiver was not dropped within a second");
}

#[tokio::test]
async fn a_client_leaving_a_whole_response_request_aborts_it_too() {
    let s = TestServer::start(vec![Script::Hold(vec![])]).await;
    let addr = s.addr;
    let client = tokio::spawn(async move {
        let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
        super::send(addr, "POST", "/v1/chat/completions", &body, &[]).await
    });
    let tx = s.held().await;
    client.abort();
    tokio::time::timeout(Duration::from_secs(1), tx.closed())
        .await
        .expect("the engine's receiver was not dropped within a second");
}

#[tokio::test]
async fn graceful_shutdown_finishes_the_request_in_flight() {
    let mut s = TestServer::start(vec![Script::Hold(vec!["partial "])]).await;
    let addr = s.addr;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    let client =
        tokio::spawn(
            async move { super::send(addr, "POST", "/v1/chat/completions", &body, &[]).await },
        );
    let tx = s.held().await;
    s.shutdown();
    // The listener closes: new connections are refused.
    within(async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!s.task.is_finished() && !client.is_finished());
    tx.send(GenerationEvent::Finished {
        text: "done".into(),
        reason: FinishReason::Stop,
        prompt_tokens: 5,
        completion_tokens: 2,
        timings: Timings::default(),
    })
    .unwrap();
    let r = within(client).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "partial done");
    assert_eq!(v["usage"]["total_tokens"], 7);
    within(&mut s.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_closes_a_stream_still_open_after_the_drain_limit() {
    let drain = Duration::from_millis(300);
    let mut s = TestServer::start_with_drain(vec![Script::Hold(vec!["tok"])], drain).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}).to_string();
    // The client keeps its connection open but reads nothing; the engine never finishes.
    let (_resp, _conn) = s.open("POST", "/v1/chat/completions", &body, &[]).await;
    let tx = s.held().await;
    let stopping = std::time::Instant::now();
    s.shutdown();
    within(&mut s.task).await.unwrap().unwrap();
    assert!(stopping.elapsed() >= drain, "the stream had its drain time");
    // The stream was closed with the server: the engine's request is aborted.
    within(tx.closed()).await;
}
