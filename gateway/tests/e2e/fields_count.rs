//! Exact counting with the engine's request fields (issue 21, item 5): whatever the engine adds
//! to the prompt for `tools` (each `tool_choice`) or for `response_format`, the gateway's
//! `x-sluice-prompt-tokens` equals the real bundled engine's `usage.prompt_tokens`.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use sluice_gateway::policy::Policy;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"]}}},
        {"type": "function", "function": {"name": "set_timer", "description": "Start a timer",
            "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1,
                           "maximum": 60}}, "required": ["minutes"]}}}
    ])
}

/// (what, path, body): one request per field that can change the prompt or the output.
fn requests() -> Vec<(&'static str, &'static str, Value)> {
    let user = |text: &str| json!([{"role": "user", "content": text}]);
    let chat = |extra: Value| {
        let mut b = json!({"messages": user("Weather in Paris, or a timer for 5 minutes?"),
                           "max_tokens": 24, "temperature": 0});
        if let (Some(b), Value::Object(extra)) = (b.as_object_mut(), extra) {
            b.extend(extra);
        }
        b
    };
    let named = json!({"type": "function", "function": {"name": "set_timer"}});
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                        "required": ["city"]});
    vec![
        ("chat", "/v1/chat/completions", chat(json!({}))),
        (
            "system and user",
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Name a colour."}], "max_tokens": 4}),
        ),
        (
            "tools",
            "/v1/chat/completions",
            chat(json!({"tools": tools()})),
        ),
        (
            "tool_choice auto",
            "/v1/chat/completions",
            chat(json!({"tools": tools(), "tool_choice": "auto"})),
        ),
        (
            "tool_choice none",
            "/v1/chat/completions",
            chat(json!({"tools": tools(), "tool_choice": "none"})),
        ),
        (
            "tool_choice required",
            "/v1/chat/completions",
            // One call: with parallel calls allowed the model repeats its call until
            // max_tokens, which ends "length" (as OpenAI reports a cut-off answer).
            chat(
                json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
                        "max_tokens": 48}),
            ),
        ),
        (
            "tool_choice named",
            "/v1/chat/completions",
            chat(
                json!({"tools": tools(), "tool_choice": named, "parallel_tool_calls": false,
                        "max_tokens": 48}),
            ),
        ),
        (
            "tool history",
            "/v1/chat/completions",
            json!({"tools": tools(), "max_tokens": 8, "messages": [
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]}),
        ),
        (
            "response_format json_object",
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"}})),
        ),
        (
            "response_format json_schema",
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "place", "schema": schema, "strict": true}}})),
        ),
        (
            "response_format text",
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "text"}})),
        ),
        (
            "completions",
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 4}),
        ),
        (
            "completions json_schema",
            "/v1/completions",
            json!({"prompt": "A city as JSON:", "max_tokens": 24, "response_format": {"type": "json_schema",
                "json_schema": {"name": "place", "schema": schema}}}),
        ),
        (
            "completions token ids",
            "/v1/completions",
            json!({"prompt": [504, 3458, 282, 4649, 314], "max_tokens": 4}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_counts_every_prompt_as_the_engine_does() {
    let _engine = crate::engine::exclusive().await;
    let (sup, gw) = crate::engine::start(Policy::default(), Duration::from_secs(120)).await;
    let c = gw.client();
    for (what, path, body) in requests() {
        let (status, headers, v) = c.post(path, &body).await;
        assert_eq!(status, StatusCode::OK, "{what}: {v}");
        let counted: u64 = headers["x-sluice-prompt-tokens"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("a number");
        assert_eq!(
            Some(counted),
            v["usage"]["prompt_tokens"].as_u64(),
            "{what}: {v}"
        );
        if what.starts_with("tool_choice required") || what.starts_with("tool_choice named") {
            assert_eq!(
                v["choices"][0]["finish_reason"], "tool_calls",
                "{what}: {v}"
            );
        }
    }
    gw.assert_accounted().await;
    crate::engine::stop(sup, gw).await;
}
