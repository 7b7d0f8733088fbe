//! Structured outputs through llguidance (the grammar engine of llama.cpp, vLLM and SGLang):
//! a JSON schema, a regular expression or a Lark grammar becomes a [`Constraint`], which gives
//! each step's set of allowed tokens and follows the tokens sampled.
//!
//! [`Grammars`] is built once per engine from its tokenizer (the token trie llguidance walks);
//! compiling a request's grammar takes it and fails with llguidance's reason.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::model::tokenizer::Tokenizer;
use crate::transport::message::TokenMask;

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    JsonSchema(serde_json::Value),
    Regex(String),
    /// llguidance's Lark dialect (which embeds JSON schemas as `%json {...}`).
    Lark(String),
}

/// The engine's tokenizer as llguidance sees it.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one tokenizer.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// The token trie of `tokenizer`; the end of a constrained output is `eos` (the chat
    /// template's end of turn).
    pub fn new(tokenizer: Arc<Tokenizer>, eos: u32) -> Result<Self, String> {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_special(id) {
                    // llguidance's convention: special tokens start with 0xff.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend(bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh constraint for `spec`, or llguidance's reason it cannot compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint {
            matcher,
            vocab: self.factory.tok_env().tok_trie().vocab_size() as u32,
        })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    vocab: u32,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl PartialEq for Constraint {
    /// Constraints are never equal (each is its own state).
    fn eq(&self, _: &Self) -> bool {
        false
    }
}

impl Constraint {
    /// The tokens allowed next (only the end token once the grammar is complete), in the
    /// shortest form for the wire.
    pub fn mask(&mut self) -> Result<TokenMask, String> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let n_set = vob.num_set();
        let n = self.vocab as usize;
        let ids = |allowed: bool| {
            (0..n as u32)
                .filter(|&t| vob.is_allowed(t) == allowed)
                .collect::<Vec<u32>>()
        };
        Ok(if n_set <= 512 {
            TokenMask::Only(ids(true))
        } else if n - n_set <= 512 {
            TokenMask::Except {
                vocab: self.vocab,
                ids: ids(false),
            }
        } else {
            let mut words = vec![0u64; n.div_ceil(64)];
            vob.iter_set_entries(|i| {
                if i < n {
                    words[i / 64] |= 1 << (i % 64);
                }
            });
            TokenMask::Bits(words)
        })
    }

    /// Follows a sampled token.
    pub fn consume(&mut self, id: u32) -> Result<(), String> {
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::test_support::toy_tokenizer;
    use serde_json::json;

    fn grammars() -> (Grammars, Arc<Tokenizer>) {
        let tok = Arc::new(toy_tokenizer());
        let eos = tok.token_id("<|im_end|>").unwrap();
        (Grammars::new(tok.clone(), eos).unwrap(), tok)
    }

    #[test]
    fn schemas_llguidance_cannot_compile_say_why() {
        let (g, _) = grammars();
        for bad in [
            GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
            GrammarSpec::JsonSchema(json!({"type": "frobnicate"})),
            GrammarSpec::Regex("(a".into()),
            GrammarSpec::Lark("start: nothing_defined".into()),
        ] {
            let e = g.compile(&bad).expect_err(&format!("{bad:?} compiled"));
            assert!(!e.is_empty());
        }
    }

    #[test]
    fn a_constraint_allows_only_what_the_grammar_can_continue_with() {
        let (g, tok) = grammars();
        let mut c = g.compile(&GrammarSpec::Regex("yes|no".into())).unwrap();
        let allowed = |m: &TokenMask, id: u32| match m {
            TokenMask::Only(ids) => ids.contains(&id),
            TokenMask::Except { ids, .. } => !ids.contains(&id),
            TokenMask::Bits(w) => w[id as usize / 64] >> (id % 64) & 1 == 1,
        };
        let ids = |s: &str| tok.encode(s, false).unwrap();
        let m = c.mask().unwrap();
        assert!(allowed(&m, ids("y")[0]) && allowed(&m, ids("n")[0]));
        assert!(!allowed(&m, ids("x")[0]));
        for t in ids("no") {
            assert!(allowed(&c.mask().unwrap(), t));
            c.consume(t).unwrap();
        }
        assert!(
            c.is_stopped() || {
                let m = c.mask().unwrap();
                m == TokenMask::Only(vec![tok.token_id("<|im_end|>").unwrap()])
            }
        );
    }
}
