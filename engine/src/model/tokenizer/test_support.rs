//! A toy GGUF tokenizer for unit tests (here, in `detok` and in `chat`).

use super::byte_level::encode_bytes;
use super::Tokenizer;
use crate::model::gguf::writer::GgufWriter;
use crate::model::gguf::{GgufFile, MetaValue};

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, verbatim.
pub(crate) const SMOLLM_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Ids 0-2 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (control), 3 is `<tool>`
/// (user-defined), byte `b` is token `BYTE0 + b`, then the merged tokens of [`MERGES`].
pub(crate) const BYTE0: u32 = 4;
pub(crate) const MERGES: &[&str] = &[
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ã ©", "1 2",
];

/// The id of the merged token `text` (byte-level form) in the toy vocabulary.
pub(crate) fn merged_id(text: &str) -> u32 {
    let i = MERGES
        .iter()
        .position(|m| m.replace(' ', "") == text)
        .unwrap_or_else(|| panic!("no merged token {text:?}"));
    BYTE0 + 256 + i as u32
}

/// The id of the single-byte token for `b`.
pub(crate) fn byte_id(b: u8) -> u32 {
    BYTE0 + u32::from(b)
}

fn strings(items: impl IntoIterator<Item = String>) -> MetaValue {
    MetaValue::Array(items.into_iter().map(MetaValue::String).collect())
}

/// A toy GGUF with the given `tokenizer.ggml.model` and `tokenizer.ggml.pre`.
pub(crate) fn toy_gguf_with(model: &str, pre: &str) -> GgufFile {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut types = vec![3, 3, 3, 4];
    for b in 0..=255u8 {
        tokens.push(encode_bytes(&[b]));
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("tokenizer.ggml.model", MetaValue::String(model.into()))
        .meta("tokenizer.ggml.pre", MetaValue::String(pre.into()))
        .meta("tokenizer.ggml.tokens", strings(tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        )
        .meta(
            "tokenizer.ggml.merges",
            strings(MERGES.iter().map(|m| (*m).to_owned())),
        )
        .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1))
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2))
        .meta("tokenizer.ggml.padding_token_id", MetaValue::U32(2))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
        .meta(
            "tokenizer.chat_template",
            MetaValue::String(SMOLLM_TEMPLATE.into()),
        );
    GgufFile::from_bytes(w.to_bytes()).expect("toy GGUF parses")
}

/// The toy GGUF, SmolLM-style (`gpt2` model, `smollm` pre-tokenizer).
pub(crate) fn toy_gguf() -> GgufFile {
    toy_gguf_with("gpt2", "smollm")
}

/// The toy tokenizer.
pub(crate) fn toy_tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&toy_gguf()).expect("toy tokenizer builds")
}
