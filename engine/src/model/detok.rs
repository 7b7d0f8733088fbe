//! Streaming detokenization: text out as tokens come in, never splitting a UTF-8 character.
//!
//! Byte-level BPE tokens are byte strings, and a character such as "é" or "🎉" may be spread
//! over several tokens. [`StreamDecoder`] gathers the tokens' bytes, emits the longest prefix
//! that is complete UTF-8 and holds back an unfinished character until the bytes that complete
//! it arrive. Bytes that can never become valid UTF-8 are emitted as U+FFFD, as
//! [`String::from_utf8_lossy`] would: the concatenation of everything [`StreamDecoder::push`]
//! returned and [`StreamDecoder::flush`] equals `String::from_utf8_lossy` of all the tokens'
//! bytes (special tokens left out when they are skipped).

use std::sync::Arc;

use crate::model::tokenizer::Tokenizer;

/// Turns a stream of token ids into a stream of text pieces.
///
/// Holds an `Arc<Tokenizer>` so that it can live in a generation task of its own (it is `Send`
/// and `'static`); one decoder per sequence.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    /// Bytes received but not yet emitted: at most an unfinished UTF-8 character (< 4 bytes)
    /// between calls.
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder that skips special tokens (`<|im_end|>` produces no text).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            tokenizer,
            skip_special: true,
            pending: Vec::new(),
        }
    }

    /// Whether special tokens are skipped (the default) or produce their text.
    pub fn skip_special(mut self, skip: bool) -> Self {
        self.skip_special = skip;
        self
    }

    /// The tokenizer this decoder reads tokens' bytes from.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Feeds one token; returns the text it completes, or `None` when there is none yet (a
    /// skipped special token, or bytes of a character still unfinished). An id outside the
    /// vocabulary contributes nothing.
    pub fn push(&mut self, id: u32) -> Option<String> {
        if self.skip_special && self.tokenizer.is_special(id) {
            return None;
        }
        self.pending.extend_from_slice(self.tokenizer.piece(id)?);
        let text = self.take_complete();
        (!text.is_empty()).then_some(text)
    }

    /// Feeds several tokens; returns the text they complete (possibly empty).
    pub fn push_all(&mut self, ids: &[u32]) -> String {
        ids.iter().filter_map(|&id| self.push(id)).collect()
    }

    /// Ends the stream: returns what is held back, an unfinished character becoming U+FFFD.
    /// The decoder is then empty and may be reused.
    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Drops what is held back.
    pub fn reset(&mut self) {
        self.pending.clear();
    }

    /// Removes and returns the decodable part of `pending`, leaving only a trailing unfinished
    /// character; invalid sequences before it become U+FFFD.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is the prefix `from_utf8` checked: never lossy here.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::test_support::{byte_id, merged_id, toy_tokenizer};

    fn decoder() -> StreamDecoder {
        StreamDecoder::new(Arc::new(toy_tokenizer()))
    }

    #[test]
    fn holds_back_a_split_character_until_complete() {
        let mut d = decoder();
        let party = "🎉".as_bytes();
        assert_eq!(d.push(merged_id("hello")), Some("hello".to_owned()));
        assert_eq!(d.push(byte_id(b' ')), Some(" ".to_owned()));
        for &b in &party[..3] {
            assert_eq!(d.push(byte_id(b)), None);
            assert!(d.has_pending());
        }
        assert_eq!(d.push(byte_id(party[3])), Some("🎉".to_owned()));
        assert!(!d.has_pending());
        // "é" split in two byte tokens, then a token completing it and adding more text.
        assert_eq!(d.push(byte_id(0xC3)), None);
        assert_eq!(d.push(byte_id(0xA9)), Some("é".to_owned()));
        assert_eq!(d.push(merged_id("Ã©")), Some("é".to_owned()));
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn emits_the_valid_prefix_and_keeps_the_rest() {
        let mut d = decoder();
        assert_eq!(d.push(byte_id(b'a')), Some("a".to_owned()));
        assert_eq!(d.push(byte_id(0xF0)), None);
        assert_eq!(d.push(byte_id(0x9F)), None);
        // Unfinished at the end of the stream: lossy.
        assert_eq!(d.flush(), "\u{FFFD}");
        assert!(!d.has_pending());
        // A byte that breaks the unfinished character: both come out, the broken part as U+FFFD.
        assert_eq!(d.push(byte_id(0xC3)), None);
        assert_eq!(d.push(byte_id(b'x')), Some("\u{FFFD}x".to_owned()));
        // A lone continuation byte is never valid: emitted at once as U+FFFD.
        assert_eq!(d.push(byte_id(0xA9)), Some("\u{FFFD}".to_owned()));
    }

    #[test]
    fn special_tokens_skipped_by_default() {
        let mut d = decoder();
        assert_eq!(d.push(1), None);
        assert_eq!(d.push(merged_id("hello")), Some("hello".to_owned()));
        assert_eq!(d.push(2), None);
        assert_eq!(
            d.push(3),
            Some("<tool>".to_owned()),
            "user-defined tokens are text"
        );
        let mut d = decoder().skip_special(false);
        assert_eq!(d.push(merged_id("hello")), Some("hello".to_owned()));
        assert_eq!(d.push(2), Some("<|im_end|>".to_owned()));
        assert_eq!(d.push(1_000_000), None);
    }

    #[test]
    fn stream_equals_lossy_decoding_of_all_bytes() {
        let tk = Arc::new(toy_tokenizer());
        // A deterministic pseudo-random walk over byte tokens (UTF-8 lead, continuation and
        // ASCII bytes mixed) and a few merged and special tokens.
        let interesting: Vec<u32> = [
            0x41u8, 0x20, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x8E, 0x89, 0xFF, 0x80,
        ]
        .iter()
        .map(|&b| byte_id(b))
        .chain([merged_id("Ã©"), merged_id("hello"), 0, 2])
        .collect();
        let mut state = 0x2545_F491_u64;
        for _ in 0..200 {
            let len = (state % 12) as usize;
            let mut ids = Vec::new();
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ids.push(interesting[(state % interesting.len() as u64) as usize]);
            }
            for skip in [true, false] {
                let mut d = StreamDecoder::new(tk.clone()).skip_special(skip);
                let mut streamed = String::new();
                for &id in &ids {
                    if let Some(piece) = d.push(id) {
                        assert!(!piece.is_empty());
                        streamed.push_str(&piece);
                    }
                }
                streamed.push_str(&d.flush());
                assert_eq!(streamed, tk.decode(&ids, skip).expect("decode"), "{ids:?}");
            }
        }
    }
}
