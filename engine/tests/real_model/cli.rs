//! The exact command line that later checks use, on the real model.

use std::process::Command;

use serde_json::Value;

use crate::common::model_path;

fn engine(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-engine"))
        .args(args)
        .args(["--threads", "2"])
        .output()
        .expect("run sluice-engine");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model() -> String {
    model_path().to_string_lossy().into_owned()
}

#[test]
fn tokenize_prints_token_ids() {
    let (ok, out, err) = engine(&[
        "tokenize",
        "--model",
        &model(),
        "--text",
        "<|im_start|>user\nhi<|im_end|>\n",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(v["tokens"], serde_json::json!([1, 4093, 198, 6004, 2, 198]));
}

#[test]
fn generate_prints_the_documented_fields() {
    let (ok, out, err) = engine(&[
        "generate",
        "--model",
        &model(),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        v["prompt_tokens"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(v["tokens"].as_array().expect("tokens").len(), 4);
    assert_eq!(
        v["tokens"][0], 7042,
        "greedy first token is \" Paris\" as in llama.cpp"
    );
    assert!(v["text"].as_str().expect("text").starts_with(" Paris"));
    assert!(v["prefill_tok_s"].as_f64().expect("prefill") > 0.0);
    assert!(v["decode_tok_s"].as_f64().expect("decode") > 0.0);
}

#[test]
fn generate_chat_stops_at_end_of_turn() {
    let (ok, out, err) = engine(&[
        "generate",
        "--model",
        &model(),
        "--chat",
        "--prompt",
        "Say hello.",
        "--max-tokens",
        "64",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        v["prompt_tokens"][0], 1,
        "the chat template starts with <|im_start|>"
    );
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(
        v["tokens"].as_array().and_then(|t| t.last()),
        Some(&Value::from(2)),
        "ends with <|im_end|>"
    );
    assert!(!v["text"].as_str().expect("text").contains("<|im_end|>"));
}

#[test]
fn score_prints_positions_and_perplexity() {
    let (ok, out, err) = engine(&[
        "score",
        "--model",
        &model(),
        "--tokens",
        "504,3575,282,4649,314,7042",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    let pos = v["positions"].as_array().expect("positions");
    assert_eq!(pos.len(), 6);
    assert_eq!(pos[4]["argmax"], 7042);
    assert_eq!(pos[4]["top5"].as_array().expect("top5").len(), 5);
    assert_eq!(pos[4]["top5"][0][0], 7042);
    assert!(pos[4]["next_logprob"].as_f64().expect("logprob") < 0.0);
    assert!(pos[5]["next_logprob"].is_null());
    let ppl = v["perplexity"].as_f64().expect("perplexity");
    assert!(ppl > 1.0 && ppl < 1e4, "{ppl}");
}

#[test]
fn errors_are_one_clear_line() {
    let (ok, _, err) = engine(&["generate", "--model", "/nonexistent.gguf", "--prompt", "x"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("fetch-model"), "{err}");
    let (ok, _, err) = engine(&[
        "generate",
        "--device",
        "cuda",
        "--model",
        &model(),
        "--prompt",
        "x",
    ]);
    assert!(!ok);
    assert!(err.contains("cuda") && !err.contains("panicked"), "{err}");
    let (ok, _, err) = engine(&[
        "score",
        "--model",
        &model(),
        "--tokens",
        "99999999",
        "--json",
    ]);
    assert!(!ok);
    assert!(
        err.contains("outside the vocabulary") && !err.contains("panicked"),
        "{err}"
    );
}

/// A reader that closes the pipe early (`| head`) ends the command quietly: status 0 and no
/// panic, as any Unix filter does.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::process::Stdio;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(100);
    for args in [
        vec!["tokenize", "--text", text.as_str(), "--json"],
        vec![
            "generate",
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "8",
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-engine"))
            .args(&args)
            .args(["--model", &model(), "--threads", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sluice-engine");
        // The reader goes before a byte is read.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {:?} {err}", args[0], out.status);
        assert!(!err.contains("panicked"), "{}: {err}", args[0]);
    }
}
