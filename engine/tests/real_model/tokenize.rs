//! The tokenizer, streaming detokenizer and chat template of the real SmolLM2 GGUF, checked
//! against llama.cpp's golden tokenizations (`tokenize.jsonl`, `greedy.jsonl`).

use std::sync::{Arc, OnceLock};

use sluice_engine::model::chat::{ChatMessage, ChatTemplate};
use sluice_engine::model::detok::StreamDecoder;
use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::tokenizer::Tokenizer;

use crate::common::{golden_dir, model_path};

struct Loaded {
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
}

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let gguf =
            GgufFile::open(&model_path()).expect("open the bundled model (scripts/fetch-model.sh)");
        Loaded {
            tokenizer: Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer")),
            template: ChatTemplate::from_gguf(&gguf).expect("chat template"),
        }
    })
}

fn records(file: &str) -> Vec<serde_json::Value> {
    let path = golden_dir().join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden record is JSON"))
        .collect()
}

fn str_field<'a>(r: &'a serde_json::Value, key: &str) -> &'a str {
    r[key]
        .as_str()
        .unwrap_or_else(|| panic!("record lacks {key:?}: {r}"))
}

fn ids_field(r: &serde_json::Value, key: &str) -> Vec<u32> {
    r[key]
        .as_array()
        .unwrap_or_else(|| panic!("record lacks {key:?}: {r}"))
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .expect("token id")
        })
        .collect()
}

/// encode(prompt, parse_special = true) equals llama.cpp's tokens, and decoding gives the
/// prompt back, for every record of `file`.
fn check_golden_tokenization(file: &str) {
    let tk = &loaded().tokenizer;
    let recs = records(file);
    assert!(!recs.is_empty(), "{file} is empty");
    let mut failures = Vec::new();
    for r in &recs {
        let prompt = str_field(r, "prompt");
        let expected = ids_field(r, "prompt_tokens");
        let got = tk.encode(prompt, true).expect("encode");
        if got != expected {
            failures.push(format!(
                "{prompt:?}:\n  expected {expected:?}\n  got      {got:?}"
            ));
        }
        assert_eq!(
            tk.decode(&got, false).expect("decode"),
            prompt,
            "round trip"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} records of {file} differ:\n{}",
        failures.len(),
        recs.len(),
        failures.join("\n")
    );
    eprintln!(
        "{file}: {} of {} records match llama.cpp",
        recs.len(),
        recs.len()
    );
}

#[test]
fn tokenizer_metadata_of_the_real_model() {
    let tk = &loaded().tokenizer;
    assert_eq!(tk.vocab_size(), 49152);
    assert_eq!(tk.bos_id(), Some(1));
    assert_eq!(tk.eos_id(), 2);
    assert!(!tk.add_bos());
    assert_eq!(tk.token_id("<|endoftext|>"), Some(0));
    assert_eq!(tk.token_id("<|im_start|>"), Some(1));
    assert_eq!(tk.token_id("<|im_end|>"), Some(2));
    assert!(tk.stop_ids().contains(&2));
    assert!(tk.is_special(0) && tk.is_special(1) && tk.is_special(2) && !tk.is_special(17));
    assert_eq!(tk.token_bytes(198), Some(b"\n".to_vec()));
    assert_eq!(tk.inner().get_vocab_size(true), 49152);
}

#[test]
fn golden_tokenize_records_match_llama_cpp() {
    check_golden_tokenization("tokenize.jsonl");
}

#[test]
fn golden_greedy_prompts_match_llama_cpp() {
    check_golden_tokenization("greedy.jsonl");
}

#[test]
fn special_token_text_is_plain_without_parsing() {
    let tk = &loaded().tokenizer;
    let text = "<|im_start|>user\nhi<|im_end|>\n";
    let plain = tk.encode(text, false).expect("encode");
    assert!(plain.iter().all(|&id| !tk.is_special(id)), "{plain:?}");
    assert_eq!(tk.decode(&plain, false).expect("decode"), text);
    assert_eq!(
        tk.encode(text, true).expect("encode"),
        vec![1, 4093, 198, 6004, 2, 198]
    );
}

#[test]
fn chat_template_renders_the_golden_chatml_prompts() {
    let Loaded {
        tokenizer,
        template,
    } = loaded();
    let single = template
        .render(&[ChatMessage::new("user", "hi")], true)
        .expect("render");
    assert_eq!(
        single,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let prefix = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n";
    let suffix = "<|im_end|>\n<|im_start|>assistant\n";
    let mut checked = 0;
    for r in records("greedy.jsonl") {
        let prompt = str_field(&r, "prompt");
        if !prompt.starts_with("<|im_start|>") {
            continue;
        }
        let user = prompt
            .strip_prefix(prefix)
            .and_then(|p| p.strip_suffix(suffix))
            .unwrap_or_else(|| panic!("unexpected chat prompt shape: {prompt:?}"));
        let rendered = template
            .render(&[ChatMessage::new("user", user)], true)
            .expect("render");
        assert_eq!(rendered, prompt);
        assert_eq!(
            tokenizer.encode(&rendered, true).expect("encode"),
            ids_field(&r, "prompt_tokens")
        );
        checked += 1;
    }
    assert!(checked > 0, "greedy.jsonl has no ChatML prompt");
}

#[test]
fn stream_decoder_reproduces_the_golden_greedy_text() {
    let tk = &loaded().tokenizer;
    for r in records("greedy.jsonl") {
        let tokens = ids_field(&r, "greedy_tokens");
        let golden = str_field(&r, "greedy_text");
        for skip in [true, false] {
            let mut d = StreamDecoder::new(tk.clone()).skip_special(skip);
            let mut text = String::new();
            for &id in &tokens {
                if let Some(piece) = d.push(id) {
                    text.push_str(&piece);
                }
            }
            text.push_str(&d.flush());
            // llama.cpp's golden text renders the special tokens (`<|im_end|>` at the end).
            let expected = if skip {
                golden.replace("<|im_end|>", "")
            } else {
                golden.to_owned()
            };
            assert_eq!(text, expected, "skip_special = {skip}, tokens {tokens:?}");
            assert_eq!(tk.decode(&tokens, skip).expect("decode"), expected);
        }
    }
}
