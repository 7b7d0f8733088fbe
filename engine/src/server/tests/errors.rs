use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{within, TestServer};

#[tokio::test]
async fn bad_json_names_the_position() {
    let s = TestServer::start(vec![]).await;
    let r = s
        .send("POST", "/v1/chat/completions", "{\"messages\": [}", &[])
        .await;
    let e = r.error(400);
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], serde_json::Value::Null);
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("not valid JSON") && msg.contains("line 1 column 15"),
        "{msg}"
    );
    let e = s
        .send("POST", "/v1/chat/completions", "[1]", &[])
        .await
        .error(400);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("must be a JSON object"),
        "{e}"
    );
}

#[tokio::test]
async fn what_clients_echo_back_from_an_assistant_message_is_accepted_when_empty() {
    let s = TestServer::start(vec![]).await;
    let echoed = json!({
        "role": "assistant", "content": "Hi!", "refusal": null, "annotations": [],
        "audio": null, "function_call": null, "tool_calls": [], "reasoning_content": null,
    });
    let body = json!({"messages": [
        {"role": "user", "content": "hi"}, echoed, {"role": "user", "content": "again"},
        // A tool result's tool name (LangChain sends it): the tool format carries none.
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    ]});
    let r = s.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn a_panic_under_a_handler_is_a_500_and_the_server_goes_on() {
    let s = TestServer::start(vec![super::Script::Panic]).await;
    let user = json!({"messages": [{"role": "user", "content": "hi"}]});
    let e = s.post("/v1/chat/completions", &user).await.error(500);
    assert_eq!(e["code"], "internal_error");
    assert_eq!(e["type"], "server_error");
    assert!(
        !e["message"].as_str().unwrap().contains("scripted bug"),
        "{e}"
    );
    let r = s.post("/v1/chat/completions", &user).await;
    assert_eq!(r.status, 200, "the next request is served");
}

#[tokio::test]
async fn validation_errors_name_the_field() {
    let s = TestServer::start(vec![]).await;
    let user = json!({"role": "user", "content": "hi"});
    for (body, param, message) in [
        (json!({"messages": "hi"}), "messages", "messages: expected an array of messages"),
        (json!({}), "messages", "messages: required"),
        (json!({"messages": []}), "messages", "messages: must contain at least one message"),
        (
            json!({"messages": [user, {"role": "user", "content": 5}]}),
            "messages[1].content",
            "messages[1].content: expected a string or an array of text parts",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
            "messages[0].content[0].type",
            "messages[0].content[0].type: only \"text\" content parts are supported, got \"image_url\"",
        ),
        (json!({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role", "unknown role \"robot\""),
        (json!({"messages": [{"role": "user"}]}), "messages[0].content", "messages[0].content: required"),
        (json!({"messages": [user], "n": 2}), "n", "n: only n = 1 is supported, got 2"),
        (json!({"messages": [user], "logprobs": 1}), "logprobs", "logprobs: expected a boolean"),
        (json!({"messages": [user], "top_logprobs": 3}), "top_logprobs", "top_logprobs: requires logprobs: true"),
        (json!({"messages": [user], "logprobs": true, "top_logprobs": 21}), "top_logprobs", "top_logprobs: at most 20, got 21"),
        (json!({"messages": [user], "frequency_penalty": 3}), "frequency_penalty", "frequency_penalty: must be in [-2, 2]"),
        (json!({"messages": [user], "min_p": 1.5}), "min_p", "min_p: must be in [0, 1]"),
        (json!({"messages": [user], "logit_bias": {"x": 1}}), "logit_bias.x", "the key must be a token id"),
        (json!({"messages": [user], "logit_bias": {"5": 101}}), "logit_bias.5", "logit_bias.5: must be in [-100, 100]"),
        (json!({"messages": [user], "logit_bias": {"999999": 1}}), "logit_bias.999999", "outside the vocabulary"),
        (json!({"messages": [user], "response_format": {"type": "xml"}}), "response_format.type", "expected \"text\", \"json_object\" or \"json_schema\""),
        (json!({"messages": [user], "response_format": {"type": "json_schema"}}), "response_format.json_schema", "response_format.json_schema: required"),
        (json!({"messages": [user], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}}), "response_format", "the grammar does not compile"),
        (json!({"messages": [user], "response_format": {"type": "json_object"}, "guided_json": {"type": "object"}}), "guided_json", "only one of response_format and guided_json"),
        (json!({"messages": [user], "structured_outputs": {"regex": "(", "json": {}}}), "structured_outputs", "exactly one of"),
        (json!({"messages": [user], "structured_outputs": {"regex": "(a"}}), "structured_outputs", "the grammar does not compile"),
        (
            json!({"messages": [user], "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
            "stop: at most 4 stop sequences are allowed, got 5",
        ),
        (json!({"messages": [user], "stop": [1]}), "stop[0]", "stop[0]: expected a string"),
        (json!({"messages": [user], "temperature": "hot"}), "temperature", "temperature: expected a number"),
        (json!({"messages": [user], "temperature": 3}), "temperature", "temperature: must be in [0, 2]"),
        (json!({"messages": [user], "top_p": 0}), "top_p", "top_p: must be in (0, 1]"),
        (json!({"messages": [user], "max_tokens": 0}), "max_tokens", "max_tokens: must be at least 1"),
        (json!({"messages": [user], "max_tokens": -3}), "max_tokens", "max_tokens: expected a non-negative integer"),
        (json!({"messages": [user], "max_tokens": 2, "min_tokens": 3}), "min_tokens", "min_tokens: 3 is more"),
        (json!({"messages": [user], "stream": "yes"}), "stream", "stream: expected a boolean"),
        (json!({"messages": [user], "stream_options": {"include_usage": true}}), "stream_options", "include_usage needs stream: true"),
        (json!({"messages": [user], "model": 3}), "model", "model: expected a string"),
        (json!({"messages": [user], "tools": [{"type": "function", "function": {}}]}), "tools[0].function.name", "tools[0].function.name: required"),
        (json!({"messages": [user], "tool_choice": "sometimes"}), "tool_choice", "tool_choice: expected"),
        (json!({"messages": [user], "tool_choice": "required"}), "tool_choice", "needs at least one tool"),
        (json!({"messages": [user], "tools": [], "tool_choice": "required"}), "tool_choice", "needs at least one tool"),
        // Inside a message: no unknown key, nothing a role cannot carry, no name the template
        // would drop (SmolLM2's renders none), no echoed field with content.
        (json!({"messages": [{"role": "user", "content": "x", "mood": "happy"}]}), "messages[0].mood", "messages[0].mood: unrecognized request argument"),
        (json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}), "messages[0].tool_calls", "only assistant messages make tool calls"),
        (json!({"messages": [{"role": "user", "content": "x", "tool_call_id": "call_1"}]}), "messages[0].tool_call_id", "only tool messages answer a tool call"),
        (json!({"messages": [{"role": "user", "content": "x", "name": "alice"}]}), "messages[0].name", "renders no name on a message of role user"),
        (json!({"messages": [user, {"role": "assistant", "content": "x", "name": "bot"}, user]}), "messages[1].name", "renders no name on a message of role assistant"),
        (json!({"messages": [user, {"role": "assistant", "content": "", "refusal": "I can't"}]}), "messages[1].refusal", "a refusal in the history is not rendered"),
        (json!({"messages": [user, {"role": "assistant", "content": "x", "audio": {"id": "a"}}]}), "messages[1].audio", "this model has no audio"),
        (json!({"messages": [user, {"role": "assistant", "content": "x", "function_call": {"name": "f"}}]}), "messages[1].function_call", "use `tool_calls`"),
        (json!({"messages": [{"role": "user", "content": "x", "name": 7}]}), "messages[0].name", "messages[0].name: expected a string"),
    ] {
        let e = s.post("/v1/chat/completions", &body).await.error(400);
        assert_eq!(e["type"], "invalid_request_error", "{body}");
        assert_eq!(e["param"], param, "{body}: {e}");
        let got = e["message"].as_str().unwrap();
        assert!(got.contains(message), "{body}: {got:?} does not contain {message:?}");
    }
    assert!(s.engine.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods() {
    let s = TestServer::start(vec![]).await;
    let e = s.get("/v1/nope").await.error(404);
    assert_eq!(e["message"], "Invalid URL (GET /v1/nope)");
    assert_eq!(e["type"], "invalid_request_error");
    let r = s.get("/v1/chat/completions").await;
    let e = r.error(405);
    assert_eq!(r.headers["allow"], "POST");
    assert!(e["message"].as_str().unwrap().contains("GET"), "{e}");
    let r = s.send("POST", "/health", "", &[]).await;
    r.error(405);
    assert_eq!(r.headers["allow"], "GET");
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let s = TestServer::start(vec![]).await;
    // Only the headers: the server answers without reading a body.
    let mut stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 5000000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    within(stream.read_to_end(&mut buf)).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"code\":\"request_too_large\""), "{text}");
}
