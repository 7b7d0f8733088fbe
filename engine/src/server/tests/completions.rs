use serde_json::{json, Value};

use super::{Script, TestServer, MODEL};
use crate::generate::FinishReason;

#[tokio::test]
async fn completion_with_usage_and_plain_special_text() {
    let s = TestServer::start(vec![]).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "<|im_start|>hello", "max_tokens": 5}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"), "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "text": "Hello world", "logprobs": null, "finish_reason": "stop"}])
    );
    let req = s.last_request();
    let n = req.prompt.len();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2})
    );
    // Special-token text in a user prompt is plain text: no `<|im_start|>` token (id 1).
    assert!(!req.prompt.contains(&1), "{:?}", req.prompt);
    assert_eq!(s.last_prompt(), "<|im_start|>hello");
    assert_eq!(req.max_tokens, 5);
}

#[tokio::test]
async fn prompt_forms() {
    let s = TestServer::start(vec![]).await;
    let r = s
        .post("/v1/completions", &json!({"prompt": [1, 2, 200]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.last_request().prompt, vec![1, 2, 200]);
    let r = s
        .post("/v1/completions", &json!({"prompt": [[7, 8]]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.last_request().prompt, vec![7, 8]);
    let r = s
        .post("/v1/completions", &json!({"prompt": ["hello"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.last_prompt(), "hello");
}

#[tokio::test]
async fn prompt_errors() {
    let s = TestServer::start(vec![]).await;
    for (body, param, needle) in [
        (json!({}), "prompt", "prompt: required"),
        (json!({"prompt": ["a", "b"]}), "prompt", "only one prompt"),
        (json!({"prompt": 5}), "prompt", "prompt: expected a string"),
        (
            json!({"prompt": [1, "x"]}),
            "prompt[1]",
            "prompt[1]: expected a token id",
        ),
        (
            json!({"prompt": [1, 999999]}),
            "prompt[1]",
            "outside the vocabulary",
        ),
        (json!({"prompt": ""}), "prompt", "prompt: must not be empty"),
        (json!({"prompt": "hi", "echo": true}), "echo", "echo"),
        (
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
            "logprobs: at most 20, got 21",
        ),
        (json!({"prompt": "hi", "n": 3}), "n", "n = 1"),
    ] {
        let e = s.post("/v1/completions", &body).await.error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e}"
        );
    }
    assert!(s.engine.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn streamed_completion() {
    let s = TestServer::start(vec![
        Script::Reply(vec!["a", "b"], FinishReason::Length),
        Script::Reply(vec!["c"], FinishReason::Stop),
    ])
    .await;
    let r = s
        .post("/v1/completions", &json!({"prompt": "x", "stream": true}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.len(), 4, "{events:?}");
    let chunks: Vec<Value> = events[..3]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "text_completion" && c.get("usage").is_none()));
    let texts: Vec<&str> = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["a", "b", ""]);
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3], "[DONE]");

    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "x", "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    let events = r.events();
    assert_eq!(events.len(), 4, "{events:?}");
    let usage: Value = serde_json::from_str(&events[2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 1);
    assert_eq!(events[3], "[DONE]");
}
