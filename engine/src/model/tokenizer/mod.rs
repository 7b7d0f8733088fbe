//! The model's tokenizer: byte-level BPE built in memory from the GGUF's `tokenizer.ggml.*`
//! metadata (there is no `tokenizer.json`), matching llama.cpp's tokenization of the same file.
//!
//! - Pre-tokenization follows `tokenizer.ggml.pre`: for `smollm` (and llama.cpp's other
//!   "digits one by one" types) every `\p{N}` character is its own piece, then GPT-2's
//!   byte-level regex splits the rest; for `gpt2` only the regex is used.
//! - Control tokens (type 3, e.g. `<|im_start|>`) and unknown tokens (type 2) are special added
//!   tokens: found in the text only when special-token parsing is on, skipped by
//!   `decode(.., skip_special = true)`. User-defined tokens (type 4) are non-special added
//!   tokens: always found in the text and always decoded, as in llama.cpp.
//! - No BOS is ever added by [`Tokenizer::encode`]; [`Tokenizer::add_bos`] tells whether the
//!   model wants one (SmolLM2 does not).

mod byte_level;
pub mod hf;
mod pieces;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

/// `tokenizer.ggml.pre` values whose pre-tokenization is "each digit alone, then GPT-2's regex"
/// (llama.cpp groups them together).
const DIGIT_SPLIT_PRE: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];
/// `tokenizer.ggml.pre` values that use GPT-2's regex alone.
const GPT2_PRE: &[&str] = &[
    "gpt-2",
    "gpt2",
    "phi-2",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
];

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenKind {
    /// 1: an ordinary BPE token, written in the byte-level alphabet.
    Normal,
    /// 4: text that is always matched literally and always decoded (non-special added token).
    UserDefined,
    /// 2 (unknown), 3 (control) and the rest (unused, byte): special tokens.
    Special,
}

impl TokenKind {
    fn from_type(t: i64) -> Self {
        match t {
            1 => Self::Normal,
            4 => Self::UserDefined,
            _ => Self::Special,
        }
    }
}

/// A byte-level BPE tokenizer read from a GGUF file.
///
/// Cheap to share behind an `Arc` (all methods take `&self`; the inner HF tokenizer is
/// `Send + Sync`).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Parses special tokens in the text.
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special-token text treated as plain text.
    plain: tokenizers::Tokenizer,
    kinds: Vec<TokenKind>,
    /// The bytes each token stands for, concatenated; token `i` is `bytes[ends[i-1]..ends[i]]`.
    bytes: Vec<u8>,
    ends: Vec<usize>,
    bos: Option<u32>,
    eos: u32,
    pad: Option<u32>,
    add_bos: bool,
    stop: Vec<u32>,
    /// The ids of the text between added tokens, remembered (both tokenizers share their
    /// pre-tokenizer and model, so a piece has the same ids under either).
    pieces: Arc<pieces::Pieces>,
}

fn tok_err(msg: impl Into<String>) -> Error {
    Error::Tokenizer(msg.into())
}

/// An optional token-id key: absent is `None`, present must be a valid id.
fn optional_id(gguf: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>> {
    let Some(value) = gguf.metadata().get(key) else {
        return Ok(None);
    };
    let id = value.as_u64().ok_or_else(|| Error::MetadataType {
        key: key.to_owned(),
        expected: "unsigned integer",
    })?;
    match u32::try_from(id) {
        Ok(id) if (id as usize) < n_vocab => Ok(Some(id)),
        _ => Err(tok_err(format!(
            "{key} = {id} is outside the vocabulary ({n_vocab} tokens)"
        ))),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the GGUF's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(tok_err(format!(
                "unsupported tokenizer model {model:?} (supported: \"gpt2\", byte-level BPE)"
            )));
        }
        let pre = match gguf.metadata().get("tokenizer.ggml.pre") {
            Some(v) => v.as_str().ok_or_else(|| Error::MetadataType {
                key: "tokenizer.ggml.pre".into(),
                expected: "string",
            })?,
            None => "gpt2",
        };
        let split_digits = if DIGIT_SPLIT_PRE.contains(&pre) {
            true
        } else if GPT2_PRE.contains(&pre) {
            false
        } else {
            return Err(tok_err(format!(
                "unsupported pre-tokenizer {pre:?} (supported: {} and {})",
                DIGIT_SPLIT_PRE.join(", "),
                GPT2_PRE.join(", ")
            )));
        };

        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let n_vocab = tokens.len();
        if n_vocab == 0 || u32::try_from(n_vocab).is_err() {
            return Err(tok_err(format!("bad vocabulary size {n_vocab}")));
        }
        let kinds: Vec<TokenKind> = if gguf.metadata().contains_key("tokenizer.ggml.token_type") {
            let types = gguf.get_i64_array("tokenizer.ggml.token_type")?;
            if types.len() != n_vocab {
                return Err(tok_err(format!(
                    "tokenizer.ggml.token_type has {} entries for {n_vocab} tokens",
                    types.len()
                )));
            }
            types.into_iter().map(TokenKind::from_type).collect()
        } else {
            vec![TokenKind::Normal; n_vocab]
        };
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| {
                        tok_err(format!(
                            "merge {m:?} is not two tokens separated by a space"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;

        let eos = optional_id(gguf, "tokenizer.ggml.eos_token_id", n_vocab)?
            .ok_or_else(|| Error::MissingMetadata("tokenizer.ggml.eos_token_id".into()))?;
        let bos = optional_id(gguf, "tokenizer.ggml.bos_token_id", n_vocab)?;
        let pad = optional_id(gguf, "tokenizer.ggml.padding_token_id", n_vocab)?;
        let add_bos = match gguf.metadata().get("tokenizer.ggml.add_bos_token") {
            Some(crate::model::gguf::MetaValue::Bool(b)) => *b,
            Some(_) => {
                return Err(Error::MetadataType {
                    key: "tokenizer.ggml.add_bos_token".into(),
                    expected: "bool",
                })
            }
            None => false,
        };

        // Later duplicates win, as in llama.cpp's text -> id map.
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| ((*t).to_owned(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| tok_err(format!("cannot build the BPE model: {e}")))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let pre_tokenizer: PreTokenizerWrapper = if split_digits {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        } else {
            byte_level.into()
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevel::default()));
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k != TokenKind::Normal)
            .map(|(t, k)| AddedToken::from((*t).to_owned(), *k == TokenKind::Special))
            .collect();
        inner.add_tokens(&added);
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);

        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(n_vocab);
        for (t, k) in tokens.iter().zip(&kinds) {
            match k {
                TokenKind::Normal => bytes.extend(byte_level::decode_piece(t)),
                TokenKind::UserDefined | TokenKind::Special => {
                    bytes.extend_from_slice(t.as_bytes())
                }
            }
            ends.push(bytes.len());
        }

        let mut stop = vec![eos];
        for text in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"] {
            if let Some(id) = tokens.iter().position(|t| *t == text) {
                let id = id as u32;
                if kinds[id as usize] == TokenKind::Special && !stop.contains(&id) {
                    stop.push(id);
                }
            }
        }

        Ok(Self {
            inner,
            plain,
            kinds,
            bytes,
            ends,
            bos,
            eos,
            pad,
            add_bos,
            stop,
            pieces: Arc::default(),
        })
    }

    /// Tokenizes `text`. With `parse_special`, special-token text such as `<|im_start|>` becomes
    /// that token; without, it is tokenized as ordinary text. Never adds a BOS token.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tk = if parse_special {
            &self.inner
        } else {
            &self.plain
        };
        self.pieces.encode(tk, text)
    }

    /// Turns ids back into text (the tokens' bytes, concatenated, decoded as UTF-8 with invalid
    /// sequences replaced by U+FFFD). With `skip_special`, special tokens give no text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut out = Vec::new();
        for &id in ids {
            let piece = self.piece(id).ok_or_else(|| {
                tok_err(format!(
                    "token id {id} is outside the vocabulary ({})",
                    self.vocab_size()
                ))
            })?;
            if !(skip_special && self.is_special(id)) {
                out.extend_from_slice(piece);
            }
        }
        Ok(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The raw bytes token `id` stands for (special and user-defined tokens: their text);
    /// `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.piece(id).map(<[u8]>::to_vec)
    }

    /// [`Tokenizer::token_bytes`] without the copy.
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// Number of tokens in the vocabulary (ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.kinds.len()
    }

    /// `tokenizer.ggml.bos_token_id`, when the GGUF has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id` (required).
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// `tokenizer.ggml.padding_token_id`, when the GGUF has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// `tokenizer.ggml.add_bos_token` (false when absent). [`Tokenizer::encode`] never adds BOS
    /// itself; a caller that honours this flag prepends [`Tokenizer::bos_id`].
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is a special (control, unknown, unused) token: skipped by
    /// `decode(.., true)` and by a [`StreamDecoder`](crate::model::detok::StreamDecoder) that
    /// skips specials. False for ordinary and user-defined tokens and for unknown ids.
    pub fn is_special(&self, id: u32) -> bool {
        self.kinds.get(id as usize) == Some(&TokenKind::Special)
    }

    /// The id of the token whose vocabulary string is `text` (special tokens by their text,
    /// e.g. `"<|im_end|>"`; ordinary tokens in the byte-level alphabet, e.g. `"Ġthe"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The end-of-generation tokens: EOS first, then whichever of the special tokens
    /// `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>` the vocabulary has (as
    /// llama.cpp's end-of-generation set). For SmolLM2: `[2, 0]` (`<|im_end|>` is the EOS).
    pub fn stop_ids(&self) -> Vec<u32> {
        self.stop.clone()
    }

    /// Whether `id` ends generation (one of [`Tokenizer::stop_ids`]).
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }

    /// The Hugging Face tokenizer inside (special tokens parsed), e.g. to count tokens.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// What building a prompt needs from a tokenizer: the GGUF's ([`Tokenizer`]) or a Hugging Face
/// `tokenizer.json`'s ([`hf::HfTokenizer`], for counting in front of another server).
pub trait Encode: Send + Sync + std::fmt::Debug {
    /// The ids of `text`; with `parse_special`, special-token text becomes that token. Never
    /// adds BOS.
    fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>>;
    /// Ids are `0..vocab_size()`.
    fn vocab_size(&self) -> usize;
    fn bos_id(&self) -> Option<u32>;
    /// Whether a prompt starts with BOS.
    fn add_bos(&self) -> bool;
}

impl Encode for Tokenizer {
    fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        Tokenizer::encode(self, text, parse_special)
    }

    fn vocab_size(&self) -> usize {
        Tokenizer::vocab_size(self)
    }

    fn bos_id(&self) -> Option<u32> {
        Tokenizer::bos_id(self)
    }

    fn add_bos(&self) -> bool {
        Tokenizer::add_bos(self)
    }
}
