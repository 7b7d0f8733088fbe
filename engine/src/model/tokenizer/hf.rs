//! A Hugging Face tokenizer (`tokenizer.json`, with the chat template and special tokens of the
//! `tokenizer_config.json` beside it, or the `chat_template.jinja` that transformers 4.50 and
//! later save instead), for counting prompts exactly as a server in front of the same model does
//! (vLLM and SGLang load these files through transformers, which prefers the `.jinja` file).

use std::path::Path;

use serde_json::Value;

use super::Encode;
use crate::error::{Error, Result};
use crate::model::chat::ChatTemplate;

/// The tokenizer of a `tokenizer.json`.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    /// Parses special-token text.
    inner: tokenizers::Tokenizer,
    /// Treats special-token text as plain text.
    plain: tokenizers::Tokenizer,
    bos: Option<u32>,
    add_bos: bool,
}

fn tok_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{}: {e}", path.display()))
}

impl HfTokenizer {
    /// Reads `path`, a `tokenizer.json` (or a directory holding one), and the chat template next
    /// to it: `chat_template.jinja` where there is one, else the `tokenizer_config.json`'s.
    pub fn open(path: &Path) -> Result<(Self, ChatTemplate)> {
        let (json, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (path.to_path_buf(), dir)
        };
        let inner = tokenizers::Tokenizer::from_file(&json).map_err(|e| tok_err(&json, e))?;
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        // Whatever the post-processor puts before an empty text is the BOS a prompt gets
        // (what vLLM's `add_special_tokens=True` does for a completion).
        let bos = inner
            .encode("", true)
            .map_err(|e| tok_err(&json, e))?
            .get_ids()
            .first()
            .copied();
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = std::fs::read(&config_path)
            .map_err(|e| tok_err(&config_path, e))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| tok_err(&config_path, e)))?;
        let jinja = dir.join("chat_template.jinja");
        let source = match std::fs::read_to_string(&jinja) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => chat_template(&config)
                .ok_or_else(|| {
                    tok_err(
                        &config_path,
                        "no chat_template (and no chat_template.jinja)",
                    )
                })?,
            Err(e) => return Err(tok_err(&jinja, e)),
        };
        let token = |key: &str| -> String {
            match &config[key] {
                Value::String(s) => s.clone(),
                Value::Object(o) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                _ => String::new(),
            }
        };
        let template = ChatTemplate::new(&source, &token("bos_token"), &token("eos_token"))?;
        Ok((
            Self {
                inner,
                plain,
                bos,
                add_bos: bos.is_some(),
            },
            template,
        ))
    }
}

/// `chat_template`: a string, or a list of `{name, template}` whose `default` is taken.
fn chat_template(config: &Value) -> Option<String> {
    match &config["chat_template"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .or_else(|| list.first())
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}

impl Encode for HfTokenizer {
    fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tk = if parse_special {
            &self.inner
        } else {
            &self.plain
        };
        let enc = tk
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    fn add_bos(&self) -> bool {
        self.add_bos
    }
}
