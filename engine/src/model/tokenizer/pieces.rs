//! Remembered token ids of the text between added tokens.
//!
//! The tokenizer splits a text at its added (special and user-defined) tokens first, then
//! pre-tokenizes and tokenizes each piece between them on its own. With the GGUF tokenizer's
//! pre-tokenizer (byte-level, digits split or not: neither looks beyond its piece) and no
//! normalizer, a piece's ids depend on its text alone, so they can be remembered. Prompts repeat
//! their pieces: a chat template puts each message between special tokens, and every turn of a
//! conversation sends the earlier ones again, as do shared system prompts and tool lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use super::tok_err;
use crate::error::Result;

/// Pieces longer than this are tokenized every time (and not kept).
const PIECE_MAX: usize = 64 << 10;
/// The text kept at most; past it the memory starts again empty.
const BYTES_MAX: usize = 16 << 20;

/// The ids of pieces seen before.
#[derive(Default)]
pub struct Pieces {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    ids: HashMap<Box<str>, Arc<[u32]>>,
    bytes: usize,
}

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Pieces")
            .field("pieces", &seen.ids.len())
            .field("bytes", &seen.bytes)
            .finish()
    }
}

impl Pieces {
    /// `text`'s ids under `tk`, as `tk.encode_fast(text, false)` gives them.
    pub fn encode(&self, tk: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
        let split = tk
            .get_added_vocabulary()
            .extract_and_normalize(tk.get_normalizer(), text);
        let mut ids = Vec::new();
        for (piece, _, tokens) in split.get_splits(OffsetReferential::Original, OffsetType::None) {
            match tokens {
                // An added token.
                Some(t) => ids.extend(t.iter().map(|t| t.id)),
                None => ids.extend_from_slice(&self.piece(tk, piece)?),
            }
        }
        Ok(ids)
    }

    fn piece(&self, tk: &tokenizers::Tokenizer, piece: &str) -> Result<Arc<[u32]>> {
        if let Some(ids) = self.lock().ids.get(piece) {
            return Ok(ids.clone());
        }
        let ids: Arc<[u32]> = tokenize(tk, piece)?.into();
        if piece.len() <= PIECE_MAX {
            let mut seen = self.lock();
            if seen.bytes + piece.len() > BYTES_MAX {
                *seen = Seen::default();
            }
            seen.bytes += piece.len();
            seen.ids.insert(piece.into(), ids.clone());
        }
        Ok(ids)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One piece's ids: pre-tokenized and tokenized as the tokenizer does each piece.
fn tokenize(tk: &tokenizers::Tokenizer, piece: &str) -> Result<Vec<u32>> {
    let mut pre = PreTokenizedString::from(piece);
    if let Some(p) = tk.get_pre_tokenizer() {
        p.pre_tokenize(&mut pre)
            .map_err(|e| tok_err(format!("encode: {e}")))?;
    }
    pre.tokenize(|n| tk.get_model().tokenize(n.get()))
        .map_err(|e| tok_err(format!("encode: {e}")))?;
    Ok(pre
        .get_splits(OffsetReferential::Original, OffsetType::None)
        .into_iter()
        .flat_map(|(_, _, tokens)| tokens.iter().flatten().map(|t| t.id))
        .collect())
}
