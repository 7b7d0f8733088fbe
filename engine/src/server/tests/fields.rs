//! Nothing silently ignored: every field of OpenAI's chat and completions requests is
//! implemented, accepted and ignored by a documented choice, or refused with 400
//! `unsupported_parameter` naming it; so is any field the server does not know.

use serde_json::{json, Value};

use super::super::fields::{handling, names, Handling, CHAT, COMPLETIONS, MESSAGE};
use super::{Script, TestServer};
use crate::generate::{FinishReason, TokenLogprob};

/// OpenAI's chat completions request body, every field (API reference, 2026).
const OPENAI_CHAT: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

/// OpenAI's (legacy) completions request body, every field.
const OPENAI_COMPLETIONS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

/// A value of `field` that asks for something (refused fields) or is typical (ignored ones).
fn asking_value(field: &str) -> Value {
    match field {
        "store" | "echo" => json!(true),
        "service_tier" => json!("flex"),
        "modalities" => json!(["text", "audio"]),
        "audio" => json!({"voice": "alloy", "format": "wav"}),
        "reasoning_effort" | "verbosity" => json!("low"),
        "web_search_options" => json!({}),
        "functions" => json!([{"name": "f", "parameters": {"type": "object"}}]),
        "function_call" => json!("auto"),
        "best_of" => json!(3),
        "suffix" => json!("}"),
        "metadata" => json!({"k": "v"}),
        "prediction" => json!({"type": "content", "content": "x"}),
        _ => json!("some-id"),
    }
}

/// The value of a refused field that asks for nothing.
fn harmless_value(field: &str) -> Option<Value> {
    match field {
        "store" | "echo" => Some(json!(false)),
        "service_tier" => Some(json!("auto")),
        "modalities" => Some(json!(["text"])),
        "best_of" => Some(json!(1)),
        "suffix" => Some(json!("")),
        _ => None,
    }
}

fn base(path: &str) -> Value {
    if path == "/v1/chat/completions" {
        json!({"messages": [{"role": "user", "content": "hi"}]})
    } else {
        json!({"prompt": "hi"})
    }
}

#[test]
fn every_openai_field_has_a_documented_handling() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md"))
        .expect("docs/api.md");
    for (openai, table) in [(OPENAI_CHAT, CHAT), (OPENAI_COMPLETIONS, COMPLETIONS)] {
        for f in openai {
            assert!(handling(table, f).is_some(), "{f} is not in the table");
        }
        for f in names(table) {
            assert!(
                docs.contains(&format!("`{f}`")),
                "docs/api.md does not list `{f}`"
            );
        }
    }
    // The fields of one message, OpenAI's (every role's) among them.
    let message_keys: Vec<&str> = MESSAGE.iter().map(|&(k, _)| k).collect();
    for f in [
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "refusal",
        "audio",
        "function_call",
    ] {
        assert!(
            message_keys.contains(&f),
            "message field {f} is not in the table"
        );
    }
    for f in message_keys {
        assert!(
            docs.contains(&format!("`{f}`")),
            "docs/api.md does not list `{f}`"
        );
    }
}

#[tokio::test]
async fn refused_fields_name_themselves_and_ignored_ones_are_served() {
    let s = TestServer::start(vec![]).await;
    for (path, table) in [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", COMPLETIONS),
    ] {
        let mut served = 0;
        for f in names(table) {
            let h = handling(table, f).expect("listed");
            let mut body = base(path);
            body[f] = asking_value(f);
            match h {
                Handling::Refused { .. } => {
                    let e = s.post(path, &body).await.error(400);
                    assert_eq!(
                        (e["param"].as_str(), e["code"].as_str()),
                        (Some(f), Some("unsupported_parameter")),
                        "{path} {f}: {e}"
                    );
                    assert!(e["message"].as_str().unwrap().starts_with(f), "{e}");
                    if let Some(ok) = harmless_value(f) {
                        body[f] = ok;
                        assert_eq!(s.post(path, &body).await.status, 200, "{path} {f}");
                    }
                    // Null is the same as absent.
                    body[f] = Value::Null;
                    assert_eq!(s.post(path, &body).await.status, 200, "{path} {f}: null");
                }
                Handling::Ignored(_) => {
                    let r = s.post(path, &body).await;
                    assert_eq!(r.status, 200, "{path} {f}: {}", r.body);
                    served += 1;
                }
                Handling::Implemented => {}
            }
        }
        assert!(served >= 1, "{path}: no ignored field was tried");
        let mut body = base(path);
        body["frobnicate"] = json!(1);
        let e = s.post(path, &body).await.error(400);
        assert_eq!(e["param"], "frobnicate", "{e}");
        assert_eq!(e["code"], "unsupported_parameter", "{e}");
        let mut body = base(path);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true, "include_obfuscation": false});
        assert_eq!(s.post(path, &body).await.status, 200, "{path}");
        body["stream_options"] = json!({"include_everything": true});
        let e = s.post(path, &body).await.error(400);
        assert_eq!(e["param"], "stream_options.include_everything", "{e}");
    }
}

#[tokio::test]
async fn sampling_fields_reach_the_engine() {
    let s = TestServer::start(vec![]).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.2,
        "logit_bias": {"7": -100, "9": 2.5}, "min_p": 0.1, "top_k": -1, "temperature": 0,
        "logprobs": true, "top_logprobs": 3});
    assert_eq!(s.post("/v1/chat/completions", &body).await.status, 200);
    let req = s.last_request();
    let sh = &req.shaping;
    assert_eq!(
        (
            sh.frequency_penalty,
            sh.presence_penalty,
            sh.repetition_penalty,
            sh.min_p
        ),
        (0.5, -0.25, 1.2, 0.1)
    );
    let mut bias = sh.logit_bias.clone();
    bias.sort_by_key(|b| b.0);
    assert_eq!(bias, vec![(7, -100.0), (9, 2.5)]);
    assert_eq!((req.sampling.top_k, req.sampling.temperature), (0, 0.0));
    assert_eq!(req.logprobs, Some(3));
    let body = json!({"prompt": "hi", "logprobs": 0});
    assert_eq!(s.post("/v1/completions", &body).await.status, 200);
    assert_eq!(s.last_request().logprobs, Some(0));
}

fn scored_reply() -> Script {
    use crate::api::GenerationEvent;
    let tok = |id: u32, text: &str, lp: f32| GenerationEvent::Token {
        id,
        text: text.into(),
        logprob: Some(TokenLogprob {
            logprob: lp,
            top: vec![(id, lp), (5, -3.0)],
        }),
    };
    Script::Events(vec![
        tok(72, "H", -0.5),
        tok(105, "", -0.25),
        GenerationEvent::Finished {
            text: "i".into(),
            reason: FinishReason::Stop,
            prompt_tokens: 3,
            completion_tokens: 2,
            timings: Default::default(),
        },
    ])
}

/// How many tokens the chunks' arrays at `pointer` list, all chunks together.
fn streamed_tokens(events: &[String], pointer: &str) -> usize {
    events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c.pointer(pointer).and_then(Value::as_array).map(Vec::len))
        .sum()
}

#[tokio::test]
async fn logprobs_come_back_in_openai_shapes_whole_and_streamed() {
    let s = TestServer::start(vec![
        scored_reply(),
        scored_reply(),
        scored_reply(),
        scored_reply(),
    ])
    .await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                      "top_logprobs": 2});
    let v = s.post("/v1/chat/completions", &chat).await.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[0]["logprob"], -0.5);
    let top = content[0]["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert!(
        top[1]["token"].is_string() && top[1]["bytes"].is_array(),
        "{v}"
    );
    // Streamed: the logprobs of held-back text come with the text.
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let events = s.post("/v1/chat/completions", &streamed).await.events();
    let n = streamed_tokens(&events, "/choices/0/logprobs/content");
    assert_eq!(n, 2, "{events:?}");
    let comp = json!({"prompt": "hi", "logprobs": 2});
    let v = s.post("/v1/completions", &comp).await.json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.25]), "{v}");
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
    assert!(lp["top_logprobs"][0].is_object(), "{v}");
    let mut streamed = comp.clone();
    streamed["stream"] = json!(true);
    let events = s.post("/v1/completions", &streamed).await.events();
    let n = streamed_tokens(&events, "/choices/0/logprobs/tokens");
    assert_eq!(n, 2, "{events:?}");
}

/// Objects inside the request are held to the same rule as its top level: an unknown key is
/// refused with 400 `unsupported_parameter` naming its path, a known one with a wrong value with
/// 400 naming it, and the shapes OpenAI documents are served.
#[tokio::test]
async fn nested_objects_refuse_unknown_keys() {
    let s = TestServer::start(vec![]).await;
    let user = json!({"role": "user", "content": "hi"});
    let tool = |function: Value| json!([{"type": "function", "function": function}]);
    let f = json!({"name": "f", "parameters": {"type": "object"}});
    let chat = |extra: Value| {
        let mut body = json!({"messages": [user]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (body, param, code) in [
        (
            chat(json!({"response_format": {"type": "json_object", "schema": {"type": "object"}}})),
            "response_format.schema",
            Some("unsupported_parameter"),
        ),
        (
            chat(json!({"response_format": {"type": "text", "strict": true}})),
            "response_format.strict",
            Some("unsupported_parameter"),
        ),
        (
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "schemma": {}}}}),
            ),
            "response_format.json_schema.schemma",
            Some("unsupported_parameter"),
        ),
        (
            chat(json!({"structured_outputs": {"json_object": "true"}})),
            "structured_outputs.json_object",
            None,
        ),
        (
            chat(json!({"tools": [{"type": "function", "function": f, "strict": true}]})),
            "tools[0].strict",
            Some("unsupported_parameter"),
        ),
        (
            chat(json!({"tools": tool(json!({"name": "f", "examples": []}))})),
            "tools[0].function.examples",
            Some("unsupported_parameter"),
        ),
        (
            chat(json!({"tools": tool(json!({"name": "f", "strict": "yes"}))})),
            "tools[0].function.strict",
            None,
        ),
        (
            chat(
                json!({"tools": tool(f.clone()), "tool_choice": {"type": "function", "function": {"name": "f"}, "force": true}}),
            ),
            "tool_choice.force",
            Some("unsupported_parameter"),
        ),
        (
            chat(
                json!({"tools": tool(f.clone()), "tool_choice": {"type": "function", "function": {"name": "f", "arguments": "{}"}}}),
            ),
            "tool_choice.function.arguments",
            Some("unsupported_parameter"),
        ),
        (
            chat(
                json!({"tools": tool(f.clone()), "tool_choice": {"type": "custom", "function": {"name": "f"}}}),
            ),
            "tool_choice.type",
            None,
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]}]}),
            "messages[0].content[0].cache_control",
            Some("unsupported_parameter"),
        ),
        // Both budgets given: max_completion_tokens wins, but max_tokens must still be valid.
        (
            chat(json!({"max_completion_tokens": 10, "max_tokens": -1})),
            "max_tokens",
            None,
        ),
        (
            chat(json!({"max_completion_tokens": 10, "max_tokens": 0})),
            "max_tokens",
            None,
        ),
        (
            chat(json!({"max_completion_tokens": 10, "max_tokens": 2.5})),
            "max_tokens",
            None,
        ),
    ] {
        let e = s.post("/v1/chat/completions", &body).await.error(400);
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some(param), code),
            "{body}: {e}"
        );
        assert!(e["message"].as_str().unwrap().starts_with(param), "{e}");
    }
    assert!(s.engine.requests.lock().unwrap().is_empty());
    // What OpenAI documents is served: `strict` on a function (the calls are grammar-constrained
    // anyway), a named tool_choice with its type, every key of json_schema, text parts.
    for body in [
        chat(
            json!({"tools": tool(json!({"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true})),
                    "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ),
        chat(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "description": "d", "schema": {"type": "object"}, "strict": true}}}),
        ),
        chat(json!({"response_format": {"type": "json_object"}})),
        chat(json!({"structured_outputs": {"json_object": false}})),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
    ] {
        let r = s.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{body}: {}", r.body);
    }
}
