//! Counting with the real model's tokenizer and chat template.

use std::sync::{Arc, OnceLock};

use serde_json::json;
use sluice_engine::model::default_model_path;

use super::*;

fn counter() -> Arc<PromptCounter> {
    static COUNTER: OnceLock<Arc<PromptCounter>> = OnceLock::new();
    COUNTER
        .get_or_init(|| Arc::new(PromptCounter::open(&default_model_path()).expect("the model")))
        .clone()
}

#[test]
fn chat_prompts_count_through_the_template() {
    let c = counter();
    let one = c
        .count(
            Endpoint::ChatCompletions,
            &json!({"messages": [{"role": "user", "content": "Hello"}]}),
        )
        .expect("count");
    let two = c
        .count(
            Endpoint::ChatCompletions,
            &json!({"messages": [{"role": "user", "content": "Hello Hello"}]}),
        )
        .expect("count");
    // The template adds the system prompt and role markers around the content.
    assert!(one > 10, "{one}");
    assert_eq!(two, one + 1);
    let tools = c
        .count(
            Endpoint::ChatCompletions,
            &json!({"messages": [{"role": "user", "content": "Hello"}],
                    "tools": [{"type": "function", "function": {"name": "get_weather",
                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}),
        )
        .expect("count");
    assert!(
        tools > one + 10,
        "tools are part of the prompt: {tools} vs {one}"
    );
}

#[test]
fn completion_prompts_count_text_and_token_ids() {
    let c = counter();
    let ids: Vec<u32> = (100..200).collect();
    assert_eq!(
        c.count(Endpoint::Completions, &json!({"prompt": ids}))
            .expect("count"),
        100
    );
}

/// Every prompt of llama.cpp's golden tokenizations counts as many tokens as llama.cpp made
/// (except those with special-token text, which `/v1/completions` reads as plain text).
#[test]
fn completion_counts_match_llama_cpp_golden_tokenizations() {
    let c = counter();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/tokenize.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("shared/golden/tokenize.jsonl");
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let rec: serde_json::Value = serde_json::from_str(line).expect("json");
        if rec["prompt"].as_str().is_some_and(|p| p.contains("<|")) {
            continue;
        }
        let want = rec["prompt_tokens"].as_array().expect("tokens").len();
        if want == 0 {
            // The engine refuses an empty prompt; so does the count.
            assert!(c
                .count(Endpoint::Completions, &json!({"prompt": ""}))
                .is_err());
            continue;
        }
        let want = rec["prompt_tokens"].as_array().expect("tokens").len();
        let got = c
            .count(Endpoint::Completions, &json!({"prompt": rec["prompt"]}))
            .expect("count");
        assert_eq!(got, want, "{}", rec["prompt"]);
        n += 1;
    }
    assert!(n >= 8, "{n} records");
}

#[test]
fn invalid_requests_are_400_naming_the_field() {
    let c = counter();
    let e = c
        .count(
            Endpoint::ChatCompletions,
            &json!({"messages": [{"role": "user", "content": 42}]}),
        )
        .expect_err("bad content");
    let GatewayError::InvalidRequest { param, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(param.as_deref(), Some("messages[0].content"));
    let e = c
        .count(Endpoint::Completions, &json!({"prompt": [99999999]}))
        .expect_err("out of vocabulary");
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
}

#[tokio::test]
async fn large_bodies_count_off_the_io_threads_with_the_same_result() {
    let c: Arc<dyn TokenCounter> = counter();
    let text = "word ".repeat(5000);
    let json = Json::new(Endpoint::Completions, json!({ "prompt": text }));
    assert!(approx_len(&json.value) > INLINE_BYTES);
    let direct = c.count(json.endpoint, &json.value).expect("count");
    let (n, back) = count(c, json.clone()).await.expect("count");
    assert_eq!(n, direct);
    assert_eq!(back, json);
}

/// A Hugging Face `tokenizer.json` and `tokenizer_config.json` holding the bundled model's
/// tokenizer and template (written from its GGUF) count every request as the GGUF does, except
/// that tools go to the template as vLLM gives them, and SmolLM2's template leaves them out
/// (the bundled engine writes its own tools prompt).
#[test]
fn a_tokenizer_json_counts_as_the_gguf_does() {
    use sluice_engine::model::gguf::GgufFile;
    let gguf = GgufFile::open(&default_model_path()).expect("the model");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&gguf).expect("template");
    let dir = std::env::temp_dir().join(format!("sluice-hf-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    tokenizer
        .inner()
        .save(dir.join("tokenizer.json"), false)
        .expect("tokenizer.json");
    let config = json!({
        "chat_template": template.source(),
        "bos_token": template.bos_token(),
        "eos_token": {"content": template.eos_token(), "special": true},
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("config");
    let (gguf_counter, hf_counter) = (counter(), PromptCounter::open(&dir).expect("hf"));
    let requests = [
        (
            Endpoint::ChatCompletions,
            json!({"messages": [{"role": "user", "content": "Hello"}]}),
        ),
        (
            Endpoint::ChatCompletions,
            json!({"messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Say <|im_end|> as text, café ünïcode 12345."}],
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
        ),
        (
            Endpoint::Completions,
            json!({"prompt": "The capital of France is <|im_start|>"}),
        ),
        (Endpoint::Completions, json!({"prompt": [1, 2, 3]})),
    ];
    let without_tools = |body: &serde_json::Value| {
        let mut b = body.clone();
        b.as_object_mut().map(|o| o.remove("tools"));
        b
    };
    for (endpoint, body) in &requests {
        assert_eq!(
            hf_counter.count(*endpoint, body).expect("hf count"),
            gguf_counter
                .count(*endpoint, &without_tools(body))
                .expect("gguf count"),
            "{body}"
        );
    }
    assert!(
        gguf_counter
            .count(requests[1].0, &requests[1].1)
            .expect("count")
            > hf_counter
                .count(requests[1].0, &requests[1].1)
                .expect("count"),
        "the engine's tools prompt is counted for the GGUF"
    );
    // Content parts are joined by newlines, and fields the engine would refuse are the
    // upstream's to judge.
    let parts = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}],
        "best_of": 2, "guided_regex": "a+"});
    let joined = json!({"messages": [{"role": "user", "content": "Hello\nthere"}]});
    assert_eq!(
        hf_counter
            .count(Endpoint::ChatCompletions, &parts)
            .expect("parts"),
        gguf_counter
            .count(Endpoint::ChatCompletions, &joined)
            .expect("joined")
    );
    // Malformed tool calls in the history are the upstream's to refuse: counted, never a
    // panic (they were indexed into once).
    for calls in [
        json!([1]),
        json!([{"function": "x"}]),
        json!([{"function": {"arguments": 3}}]),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": calls}]});
        assert!(
            hf_counter.count(Endpoint::ChatCompletions, &body).is_ok(),
            "{body}"
        );
    }
    let file = PromptCounter::open(&dir.join("tokenizer.json")).expect("the file itself");
    assert_eq!(
        file.count(requests[0].0, &requests[0].1).expect("count"),
        gguf_counter
            .count(requests[0].0, &requests[0].1)
            .expect("count")
    );
    // transformers 4.50 and later save the template as chat_template.jinja, which wins over a
    // tokenizer_config.json's (here a different one, which would count fewer tokens).
    let mut config = config;
    config["chat_template"] = json!("{{ messages[0]['content'] }}");
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("config");
    std::fs::write(dir.join("chat_template.jinja"), template.source()).expect("jinja");
    let jinja = PromptCounter::open(&dir).expect("hf with chat_template.jinja");
    for (endpoint, body) in &requests {
        assert_eq!(
            jinja.count(*endpoint, body).expect("hf count"),
            gguf_counter
                .count(*endpoint, &without_tools(body))
                .expect("gguf count"),
            "{body}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
