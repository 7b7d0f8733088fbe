use serde_json::{json, Value};

use super::{Script, TestServer, CONTEXT, MODEL};
use crate::api::{EngineError, GenerationEvent};
use crate::generate::FinishReason;

#[tokio::test]
async fn chat_completion_with_usage() {
    let s = TestServer::start(vec![]).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "anything", "messages": [{"role": "user", "content": "hi"}],
                    "user": "u-1", "metadata": {"x": "1"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"), "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "message": {"role": "assistant", "content": "Hello world"},
                "logprobs": null, "finish_reason": "stop"}])
    );
    let req = s.last_request();
    let n = req.prompt.len();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2})
    );
    assert!(s
        .last_prompt()
        .ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    // The template's special tokens were parsed (id 1 is `<|im_start|>`).
    assert_eq!(req.prompt[0], 1);
    // Defaults: the rest of the context window (capped at 4096), the engine's sampling defaults
    // (llama-server's here: temperature 0.8, top-p 0.95, top-k 40, min-p 0.05).
    assert_eq!(req.max_tokens, CONTEXT - n);
    assert_eq!(
        (
            req.sampling.temperature,
            req.sampling.top_p,
            req.sampling.top_k,
            req.shaping.min_p
        ),
        (0.8, 0.95, 40, 0.05)
    );
    assert_eq!(
        (req.min_tokens, req.ignore_eos, req.trace),
        (0, false, None)
    );
}

#[tokio::test]
async fn text_parts_and_sampling_fields_reach_the_engine() {
    let s = TestServer::start(vec![Script::Reply(vec!["x"], FinishReason::Length)]).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [
                        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": "\n",
                    "max_completion_tokens": 10, "max_tokens": 99, "min_tokens": 2, "ignore_eos": true,
                    "n": 1, "logprobs": false}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    let req = s.last_request();
    assert_eq!(
        (req.max_tokens, req.min_tokens, req.ignore_eos),
        (10, 2, true)
    );
    assert_eq!(req.sampling.temperature, 0.5);
    assert_eq!(req.sampling.top_p, 0.9);
    assert_eq!((req.sampling.top_k, req.sampling.seed), (40, Some(7)));
    assert_eq!(req.stop, vec!["\n".to_owned()]);
    assert_eq!(
        s.last_prompt(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
    );
}

fn chunk_delta(event: &str) -> Value {
    let v: Value = serde_json::from_str(event).unwrap();
    assert_eq!(v["object"], "chat.completion.chunk", "{v}");
    v
}

#[tokio::test]
async fn streaming_chunks_end_with_usage_and_done() {
    let s = TestServer::start(vec![]).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.headers["cache-control"], "no-cache");
    let events = r.events();
    assert_eq!(events.len(), 6, "{events:?}");
    let chunks: Vec<Value> = events[..5].iter().map(|e| chunk_delta(e)).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    assert!(chunks.iter().all(|c| c["id"] == id && c["model"] == MODEL));
    let choice = |i: usize| chunks[i]["choices"][0].clone();
    assert_eq!(
        choice(0)["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(choice(1)["delta"], json!({"content": "Hello"}));
    assert_eq!(choice(2)["delta"], json!({"content": " world"}));
    assert_eq!(choice(2)["finish_reason"], Value::Null);
    assert_eq!(choice(3)["delta"], json!({}));
    assert_eq!(choice(3)["finish_reason"], "stop");
    assert_eq!(chunks[4]["choices"], json!([]));
    let n = s.last_request().prompt.len();
    assert_eq!(
        chunks[4]["usage"],
        json!({"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2})
    );
    assert_eq!(events[5], "[DONE]");
}

#[tokio::test]
async fn streaming_without_usage_and_with_held_back_text() {
    let events = vec![
        GenerationEvent::Token {
            id: 5,
            text: "a".into(),
            logprob: None,
        },
        GenerationEvent::Token {
            id: 6,
            text: String::new(),
            logprob: None,
        },
        GenerationEvent::Finished {
            text: "b".into(),
            reason: FinishReason::Length,
            prompt_tokens: 3,
            completion_tokens: 2,
            timings: Default::default(),
        },
    ];
    let s = TestServer::start(vec![Script::Events(events)]).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await;
    let events = r.events();
    let deltas: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| chunk_delta(e)["choices"][0].clone())
        .collect();
    let contents: Vec<&str> = deltas
        .iter()
        .filter_map(|d| d["delta"]["content"].as_str())
        .collect();
    assert_eq!(contents, ["", "a", "b"]);
    assert_eq!(deltas.last().unwrap()["finish_reason"], "length");
    assert!(events.iter().all(|e| !e.contains("usage")), "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn engine_refusals_keep_their_status_and_code() {
    let s = TestServer::start(vec![
        Script::Refuse(EngineError::Unavailable("rank 1 is down".into())),
        Script::Refuse(EngineError::Invalid {
            code: "context_length_exceeded",
            message: "prompt plus max_tokens exceed the context window".into(),
        }),
        Script::Refuse(EngineError::Internal("boom".into())),
    ])
    .await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true});
    let e = s.post("/v1/chat/completions", &body).await.error(503);
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("engine_unavailable"), Some("engine_unavailable"))
    );
    assert_eq!(e["message"], "rank 1 is down");
    let e = s.post("/v1/chat/completions", &body).await.error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["type"], "invalid_request_error");
    let e = s.post("/v1/chat/completions", &body).await.error(500);
    assert_eq!(e["type"], "server_error");
}

#[tokio::test]
async fn a_prompt_filling_the_context_window_is_refused_without_max_tokens() {
    let s = TestServer::start(vec![]).await;
    let long = "x ".repeat(CONTEXT);
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await;
    let e = r.error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(s.engine.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn failure_mid_stream_is_an_error_event_then_done() {
    let events = vec![
        GenerationEvent::Token {
            id: 5,
            text: "Hel".into(),
            logprob: None,
        },
        GenerationEvent::Failed(EngineError::Unavailable("rank 1 went down".into())),
    ];
    let s = TestServer::start(vec![Script::Events(events.clone()), Script::Events(events)]).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true});
    let r = s.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(
        chunk_delta(&events[1])["choices"][0]["delta"]["content"],
        "Hel"
    );
    let err: Value = serde_json::from_str(&events[2]).unwrap();
    assert_eq!(err["error"]["message"], "rank 1 went down");
    assert_eq!(err["error"]["type"], "engine_unavailable");
    assert_eq!(events[3], "[DONE]");

    // Not streaming: the failure is the response.
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let e = s.post("/v1/chat/completions", &body).await.error(503);
    assert_eq!(e["message"], "rank 1 went down");
}

#[tokio::test]
async fn traceparent_reaches_the_engine_and_is_echoed() {
    let s = TestServer::start(vec![]).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            &body,
            &[("traceparent", tp)],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["traceparent"], tp);
    assert_eq!(s.last_request().trace.unwrap().to_string(), tp);
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            &body,
            &[("traceparent", "garbage")],
        )
        .await;
    assert!(r.headers.get("traceparent").is_none());
    assert_eq!(s.last_request().trace, None);
}
