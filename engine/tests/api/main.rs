//! The OpenAI API's sampling, log-probabilities and structured outputs against the real model,
//! through `sluice-engine serve` with three ranks on loopback (issue 21).

#[allow(dead_code)]
#[path = "../pipeline/harness.rs"]
mod harness;

mod schemas;
mod workloads;

use std::sync::OnceLock;

use serde_json::{json, Value};

use harness::{post_json, start, Server};

/// One three-rank server shared by every test of this binary.
fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(&["--ranks", "3", "--threads", "1", "--kv-tokens", "16384"]))
}

fn chat(body: &Value) -> Value {
    let (status, v) = post_json(&server().addr, "/v1/chat/completions", body);
    assert_eq!(status, 200, "{body}: {v}");
    v
}

/// Runs `f` over `items` on `n` threads at once, results in order.
fn concurrently<T: Sync, R: Send>(items: &[T], n: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    for (chunk, slots) in items.chunks(n).zip(out.chunks_mut(n)) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|item| s.spawn(|| f(item))).collect();
            for (slot, h) in slots.iter_mut().zip(handles) {
                *slot = Some(h.join().expect("thread"));
            }
        });
    }
    out.into_iter().map(|r| r.expect("ran")).collect()
}

fn content(v: &Value) -> &str {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
}

#[test]
fn the_readme_request_gets_english_with_the_default_sampling() {
    let body = json!({"messages": [{"role": "user", "content": "Write a haiku about queues."}],
                      "max_tokens": 64});
    for seed in [1, 2, 3] {
        let mut b = body.clone();
        b["seed"] = json!(seed);
        let v = chat(&b);
        let text = content(&v);
        let plain = text
            .chars()
            .filter(|c| c.is_ascii_alphabetic() || " ,.'!?\n-".contains(*c))
            .count();
        let words = text.split_whitespace().count();
        assert!(
            words >= 5 && plain as f64 >= 0.95 * text.chars().count() as f64,
            "seed {seed}: {text:?}"
        );
    }
}

#[test]
fn a_seed_gives_the_same_tokens_across_runs_and_batch_compositions() {
    let req = |prompt: &str, seed: Option<u64>| {
        let mut b = json!({"messages": [{"role": "user", "content": prompt}],
                           "max_tokens": 40, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                           "min_p": 0.0, "ignore_eos": true});
        if let Some(s) = seed {
            b["seed"] = json!(s);
        }
        b
    };
    let target = req("Tell me about the sea.", Some(42));
    let alone = content(&chat(&target)).to_owned();
    assert_eq!(content(&chat(&target)), alone, "the same seed twice");
    // Now beside three unseeded requests, in one batch.
    let mixed = [
        target.clone(),
        req("Name three colors.", None),
        req("What is a queue?", None),
        req("Count to ten.", None),
    ];
    let out = concurrently(&mixed, 4, |b| content(&chat(b)).to_owned());
    assert_eq!(out[0], alone, "the same seed in a batch of four");
    let other = content(&chat(&req("Tell me about the sea.", Some(43)))).to_owned();
    assert_ne!(other, alone, "another seed samples other tokens");
}

#[test]
fn logprobs_are_the_model_distribution_whole_and_streamed() {
    let body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                      "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 5});
    let v = chat(&body);
    let lp = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert!(!lp.is_empty(), "{v}");
    let mut text = Vec::new();
    for t in lp {
        let top = t["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 5);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t["token"], top[0]["token"], "{t}");
        let ps: Vec<f64> = top.iter().map(|x| x["logprob"].as_f64().unwrap()).collect();
        assert!(ps.windows(2).all(|w| w[0] >= w[1]), "{ps:?}");
        assert!(ps[0] <= 0.0 && ps.iter().map(|p| p.exp()).sum::<f64>() <= 1.0 + 1e-4);
        text.extend(
            t["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    assert_eq!(
        String::from_utf8(text).unwrap(),
        content(&v),
        "bytes spell the content"
    );
    // Completions: the same numbers in the other shape.
    let (_, c) = post_json(
        &server().addr,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                "logprobs": 3, "ignore_eos": true}),
    );
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6, "{c}");
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3, "{c}");
    // Streamed: every token's log-probability arrives, in order, with the same values.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, sse) = harness::http(
        &server().addr,
        "POST",
        "/v1/chat/completions",
        Some(&streamed),
    );
    assert_eq!(status, 200, "{sse}");
    let got: Vec<f64> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk"))
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|t| t["logprob"].as_f64().unwrap())
        .collect();
    let whole: Vec<f64> = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap())
        .collect();
    assert_eq!(got, whole, "{sse}");
}

#[test]
fn logit_bias_and_penalties_change_what_is_sampled() {
    let body = json!({"messages": [{"role": "user", "content": "Say yes or no."}],
                      "max_tokens": 12, "temperature": 0, "logprobs": true});
    let v = chat(&body);
    let first = v["choices"][0]["logprobs"]["content"][0]["bytes"].clone();
    // Ban every token the greedy answer used: the answer changes.
    let tokenize = harness::engine_cmd()
        .args(["tokenize", "--json", "--model"])
        .arg(harness::model_path())
        .args(["--text", content(&v)])
        .output()
        .expect("tokenize");
    let t: Value = serde_json::from_slice(&tokenize.stdout).expect("tokenize JSON");
    let bias: serde_json::Map<String, Value> = t["tokens"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    let mut banned = body.clone();
    banned["logit_bias"] = Value::Object(bias);
    let b = chat(&banned);
    assert_ne!(
        b["choices"][0]["logprobs"]["content"][0]["bytes"], first,
        "{v} vs {b}"
    );
    // A long greedy answer repeats tokens; a strong presence penalty makes it repeat fewer.
    let long = json!({"messages": [{"role": "user", "content": "List the numbers from 1 to 30."}],
                      "max_tokens": 60, "temperature": 0, "ignore_eos": true});
    let distinct = |v: &Value| {
        let words: std::collections::HashSet<&str> = content(v).split_whitespace().collect();
        words.len()
    };
    let plain = chat(&long);
    let mut pen = long.clone();
    pen["presence_penalty"] = json!(2.0);
    pen["frequency_penalty"] = json!(1.0);
    let penalized = chat(&pen);
    assert_ne!(content(&plain), content(&penalized));
    let mut rep = long.clone();
    rep["repetition_penalty"] = json!(1.5);
    assert_ne!(content(&plain), content(&chat(&rep)));
    assert!(distinct(&penalized) >= distinct(&plain) / 2, "{penalized}");
}

#[test]
fn twenty_schemas_give_json_that_validates() {
    let run = workloads::schemas(&server().addr);
    assert_eq!(run.total, 20);
    eprintln!("structured outputs: {} of 20 valid", run.valid);
    assert!(run.failures.is_empty(), "{:#?}", run.failures);
}

#[test]
fn twenty_required_tool_calls_parse_and_validate() {
    let run = workloads::required_tool_calls(&server().addr);
    assert_eq!(run.total, 20);
    eprintln!("tool_choice required: {} of 20 valid", run.valid);
    assert!(
        run.valid >= 19,
        "{} of 20 valid: {:#?}",
        run.valid,
        run.failures
    );
}

/// The two workloads on this engine and on the OpenAI-compatible server at
/// `$SLUICE_API_PEER` (`host:port`, e.g. llama-server with `--jinja`), side by side
/// (docs/capacity.md): valid answers, latency, completion tokens. Run by hand:
/// `SLUICE_API_PEER=127.0.0.1:8081 cargo test --release -p sluice-engine --test api --
/// --ignored side_by_side --nocapture`. The engine's own rates are held to the tests' bars.
#[test]
#[ignore = "needs a peer server at $SLUICE_API_PEER"]
fn side_by_side() {
    let peer = std::env::var("SLUICE_API_PEER").expect("SLUICE_API_PEER=host:port");
    let mut ours = None;
    for (target, addr) in [("sluice-engine", server().addr.clone()), ("peer", peer)] {
        for (name, run) in [
            ("json_schema", workloads::schemas(&addr)),
            (
                "tool_choice required",
                workloads::required_tool_calls(&addr),
            ),
        ] {
            let (p50, p95) = run.p50_p95();
            eprintln!(
                "| {name} | {target} | {}/{} | {p50:.2} / {p95:.2} | {:.0} |",
                run.valid,
                run.total,
                run.completion_tokens as f64 / run.total as f64
            );
            for f in run.failures.iter().take(3) {
                eprintln!(
                    "  {target} {name}: {}",
                    f.chars().take(300).collect::<String>()
                );
            }
            if target == "sluice-engine" {
                ours.get_or_insert_with(Vec::new).push(run.valid);
            }
        }
    }
    assert_eq!(ours, Some(vec![20, 20]));
}

/// `tool_choice: "auto"`: the model may answer in prose, but once it writes `<tool_call>` the
/// rest is constrained, so every call it starts is a valid call of one of the tools (a call cut
/// by `max_tokens` is reported, not failed). SmolLM2-135M rarely calls unasked, so most prompts
/// ask for a call in words; two ask for prose. `max_tokens` is that of the schema workload: room
/// for the longest call the toolbox admits (`send_email`'s 320 characters of strings), so a cut
/// call is the model's doing, not the test's.
#[test]
fn auto_tool_calls_once_started_parse_and_validate() {
    let tools = schemas::tool_cases()[0].1.clone();
    // Each prompt at two seeds: whether a sampled answer starts a call is the model's coin, and
    // seed 2 found the trigger completed inside a token (`></` after `<tool_call`).
    let cases: Vec<(&str, u64)> = schemas::auto_prompts()
        .into_iter()
        .flat_map(|p| [(p, 1), (p, 2)])
        .collect();
    let results = concurrently(&cases, 4, |&(prompt, seed)| {
        chat(&json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 400,
            "seed": seed,
            "tools": tools,
            "tool_choice": "auto",
        }))
    });
    let (mut calls, mut prose, mut cut, mut bad) = (0, 0, 0, Vec::new());
    for ((prompt, seed), v) in cases.iter().zip(&results) {
        let choice = &v["choices"][0];
        // A call cut off by max_tokens is reported in tool_calls, with the arguments so far.
        let started = content(v).contains("<tool_call>")
            || choice["message"]["tool_calls"]
                .as_array()
                .is_some_and(|c| !c.is_empty());
        match (choice["finish_reason"].as_str(), started) {
            (Some("tool_calls"), _) if workloads::calls_validate(&tools, choice) => calls += 1,
            (Some("stop"), false) => prose += 1,
            (Some("length"), true) => cut += 1,
            (Some("length"), false) => prose += 1,
            _ => bad.push(format!("{prompt} (seed {seed}): {v}")),
        }
    }
    eprintln!(
        "tool_choice auto: {calls} valid calls, {prose} prose, {cut} cut by max_tokens, {} broken",
        bad.len()
    );
    assert!(bad.is_empty(), "calls started but not valid: {bad:#?}");
    // Whether a sampled answer starts a call is the model's coin: of the 20 asked, it called 13
    // times at avx2 and 5 at avx512bf16 (bf16 attention rounds differently); at seed 1 alone, 6
    // of 10 at avx2, avx512 and avx512vnni, 3 at avx512bf16.
    assert!(calls >= 3 && prose >= 1, "{calls} calls, {prose} prose");
}
