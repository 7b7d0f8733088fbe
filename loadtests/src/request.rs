//! The JSON bodies sent: streaming, greedy, usage in the last chunk.

use bytes::Bytes;
use serde_json::{json, Value};

/// A `/v1/completions` request of exactly `max_tokens` output tokens (`ignore_eos`): the
/// shape, not the model's taste, decides how long the answer is.
pub fn completion(model: &str, prompt: &str, max_tokens: usize) -> Bytes {
    let body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    Bytes::from(body.to_string())
}

/// A `/v1/chat/completions` request with one user message that stops where the model stops
/// (an answer is scored, its length is not the point); `extra` fields (`tools`,
/// `tool_choice`) are merged in.
pub fn chat(model: &str, user: &str, max_tokens: usize, extra: Value) -> Bytes {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let v: Value = serde_json::from_slice(&completion("m", "hi \"there\"", 128)).unwrap();
        assert_eq!(
            v,
            json!({"model": "m", "prompt": "hi \"there\"", "max_tokens": 128,
                "temperature": 0, "ignore_eos": true, "stream": true,
                "stream_options": {"include_usage": true}})
        );
        let v: Value =
            serde_json::from_slice(&chat("m", "q", 32, json!({"tool_choice": "required"})))
                .unwrap();
        assert_eq!(v["messages"], json!([{"role": "user", "content": "q"}]));
        assert_eq!(
            (v["max_tokens"].as_u64(), v["stream"].as_bool()),
            (Some(32), Some(true))
        );
        assert_eq!(v["tool_choice"], "required");
        assert!(v.get("ignore_eos").is_none());
    }
}
