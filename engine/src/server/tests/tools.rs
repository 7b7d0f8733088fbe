use serde_json::{json, Value};

use super::{Script, TestServer};
use crate::generate::FinishReason;

const CALL: &str = r#"<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>"#;

fn weather_request(stream: bool) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"}
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}],
        "stream": stream,
    })
}

fn assert_weather_call(call: &Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
}

/// A stream's choices (after checking it ends with `[DONE]`) and its content, joined.
fn streamed(events: &[String]) -> (Vec<Value>, String) {
    assert_eq!(events.last().unwrap(), "[DONE]");
    let choices: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0].clone())
        .collect();
    let content = choices
        .iter()
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    (choices, content)
}

#[tokio::test]
async fn tools_are_rendered_into_the_system_prompt_and_calls_parsed() {
    let s = TestServer::start(vec![Script::Reply(vec![CALL], FinishReason::Stop)]).await;
    let r = s
        .post("/v1/chat/completions", &weather_request(false))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = s.last_prompt();
    assert!(
        prompt.starts_with("<|im_start|>system\nBe brief.\n\n# Tools"),
        "{prompt}"
    );
    assert_eq!(prompt.matches("<|im_start|>system").count(), 1, "{prompt}");
    assert!(
        prompt.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\""),
        "{prompt}"
    );
    assert!(prompt.contains("\"required\":[\"city\"]"), "{prompt}");
    assert!(
        prompt.contains("<tool_call>\n{\"name\": <function-name>"),
        "{prompt}"
    );
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["message"]["tool_calls"].as_array().unwrap().len(), 1);
    assert_weather_call(&choice["message"]["tool_calls"][0]);
}

#[tokio::test]
async fn streamed_tool_calls_are_held_back_and_sent_at_the_end() {
    let pieces = vec![
        "Let me check.",
        " <tool",
        "_call>{\"name\":\"get_weather\",",
        "\"arguments\":{\"city\":\"Paris\"}}",
        "</tool_call>",
    ];
    let s = TestServer::start(vec![Script::Reply(pieces, FinishReason::Stop)]).await;
    let r = s.post("/v1/chat/completions", &weather_request(true)).await;
    let events = r.events();
    let (choices, content) = streamed(&events);
    assert_eq!(content, "Let me check. ");
    let calls: Vec<&Value> = choices
        .iter()
        .filter(|c| c["delta"].get("tool_calls").is_some())
        .collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    let call = &calls[0]["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_weather_call(call);
    assert_eq!(choices.last().unwrap()["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_call_cut_off_by_max_tokens_is_reported_as_openai_does_streamed_or_not() {
    let cut = vec![
        "Checking.",
        " <tool_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Par",
    ];
    let s = TestServer::start(vec![
        Script::Reply(cut.clone(), FinishReason::Length),
        Script::Reply(cut, FinishReason::Length),
    ])
    .await;
    let v = s
        .post("/v1/chat/completions", &weather_request(false))
        .await
        .json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], "Checking.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city": "Par"#);

    let events = s
        .post("/v1/chat/completions", &weather_request(true))
        .await
        .events();
    let (choices, content) = streamed(&events);
    assert_eq!(content, "Checking. ");
    let call = choices
        .iter()
        .find_map(|c| c["delta"].get("tool_calls"))
        .expect("the cut-off call is sent");
    assert_eq!(call[0]["function"]["name"], "get_weather");
    assert_eq!(call[0]["function"]["arguments"], r#"{"city": "Par"#);
    assert_eq!(choices.last().unwrap()["finish_reason"], "length");
}

#[tokio::test]
async fn unparseable_calls_and_tool_choice_none_stay_content() {
    let s = TestServer::start(vec![
        Script::Reply(vec!["<tool_call>{oops</tool_call>"], FinishReason::Stop),
        Script::Reply(vec![CALL], FinishReason::Stop),
    ])
    .await;
    let v = s
        .post("/v1/chat/completions", &weather_request(false))
        .await
        .json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "<tool_call>{oops</tool_call>"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());

    let mut req = weather_request(false);
    req["tool_choice"] = json!("none");
    let v = s.post("/v1/chat/completions", &req).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], CALL);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(!s.last_prompt().contains("<tools>"));
}

#[tokio::test]
async fn history_with_tool_calls_and_results_renders_as_tags() {
    let s = TestServer::start(vec![]).await;
    let mut req = weather_request(false);
    let history = req["messages"].as_array_mut().unwrap();
    history.push(
        json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
    );
    history.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "22C, sunny"}));
    history.push(json!({"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "UV 3"}]}));
    let r = s.post("/v1/chat/completions", &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = s.last_prompt();
    assert!(
        prompt.contains(
            "<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><|im_end|>\n\
             <|im_start|>user\n<tool_response>\n22C, sunny\n</tool_response>\n<tool_response>\nUV 3\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n"
        ),
        "{prompt}"
    );
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello world");
}

#[tokio::test]
async fn required_and_named_tool_choice_instruct_the_model() {
    let s = TestServer::start(vec![]).await;
    let mut req = weather_request(false);
    req["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    assert_eq!(s.post("/v1/chat/completions", &req).await.status, 200);
    assert!(s
        .last_prompt()
        .contains("You must call the function \"get_weather\"."));
    req["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    let e = s.post("/v1/chat/completions", &req).await.error(400);
    assert_eq!(e["param"], "tool_choice");
}
