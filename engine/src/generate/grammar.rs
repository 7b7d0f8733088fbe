//! Structured outputs through llguidance (the grammar engine of llama.cpp, vLLM and SGLang):
//! a JSON schema, a regular expression or a Lark grammar becomes a [`Constraint`], which gives
//! each step's set of allowed tokens and follows the tokens sampled.
//!
//! [`Grammars`] is built once per engine from its tokenizer (the token trie llguidance walks);
//! compiling a request's grammar takes it and fails with llguidance's reason.
//!
//! A grammar can wait for a trigger ([`GrammarSpec::After`], llama.cpp's lazy grammars): the
//! output is free until the trigger text appears in it; from the trigger's first byte on, the
//! output must match the grammar. While it waits, the only tokens refused are those that would
//! complete the trigger and go on with text the grammar refuses (`></` after `<tool_call`): such
//! a token, sampled free, used to end the answer there.
//!
//! Grammars that write JSON (a schema, tool calls) bound their numbers' digits ([`NumberBound`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::numbers::{leading_digits, NumberBound};
use crate::model::tokenizer::Tokenizer;
use crate::transport::message::TokenMask;

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    JsonSchema(serde_json::Value),
    Regex(String),
    /// llguidance's Lark dialect (which embeds JSON schemas as `%json {...}`).
    Lark(String),
    /// A Lark grammar of `<tool_call>` blocks whose text besides its `%json` values has no
    /// quotes or digits: compiled as [`GrammarSpec::Lark`], with JSON's number bound.
    ToolCalls(String),
    /// Free text until `trigger` appears in the output; from there on, `then` (which starts
    /// with the trigger's text).
    After {
        trigger: String,
        then: Box<GrammarSpec>,
    },
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
    /// Each token's leading digits, for [`NumberBound`].
    leading: Arc<[u8]>,
    /// Per trigger, the tokens that can complete it ([`Waiting::closers`]), found once.
    closers: Mutex<HashMap<Vec<u8>, Closers>>,
}

/// Tokens with their bytes.
type Closers = Arc<[(u32, Vec<u8>)]>;

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
        let leading = leading_digits(words.iter().map(Vec::as_slice));
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self {
            factory,
            leading,
            closers: Mutex::default(),
        })
    }

    /// A fresh constraint for `spec`, or llguidance's reason it cannot compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(l) | GrammarSpec::ToolCalls(l) => {
                TopLevelGrammar::from_lark(l.clone())
            }
            GrammarSpec::After { trigger, then } => {
                let mut c = self.compile(then)?;
                let trigger = trigger.as_bytes().to_vec();
                let closers = self.closers_of(&trigger);
                c.waiting = Some(Waiting {
                    trigger,
                    seen: Vec::new(),
                    closers,
                });
                return Ok(c);
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        let json = matches!(spec, GrammarSpec::JsonSchema(_) | GrammarSpec::ToolCalls(_));
        Ok(Constraint {
            matcher,
            env: self.factory.tok_env().clone(),
            waiting: None,
            numbers: json.then(|| NumberBound::new(self.leading.clone())),
        })
    }
}

impl Grammars {
    /// The tokens holding `trigger`'s last byte, with their bytes: a scan of the vocabulary the
    /// first time a trigger is seen (every `tool_choice: auto` request has the same one).
    fn closers_of(&self, trigger: &[u8]) -> Closers {
        let mut cache = self.closers.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(trigger.to_vec())
            .or_insert_with(|| {
                let trie = self.factory.tok_env().tok_trie();
                let Some(last) = trigger.last() else {
                    return Arc::new([]);
                };
                (0..trie.vocab_size() as u32)
                    .filter_map(|t| {
                        let bytes = trie.decode_ext(&[t], false);
                        bytes.contains(last).then_some((t, bytes))
                    })
                    .collect()
            })
            .clone()
    }
}

/// The output so far of a constraint that waits for its trigger.
#[derive(Clone, Debug)]
struct Waiting {
    trigger: Vec<u8>,
    /// The output's last bytes (fewer than the trigger's, unless the trigger is in them).
    seen: Vec<u8>,
    /// The tokens holding the trigger's last byte (those that can complete it), with their bytes.
    closers: Closers,
}

impl Waiting {
    /// Takes a token's bytes; the output from the trigger on once it has appeared.
    fn push(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        self.seen.extend_from_slice(bytes);
        let n = self.trigger.len();
        if let Some(at) = self.trigger_in(&self.seen) {
            return Some(self.seen.split_off(at));
        }
        let keep = self.seen.len().min(n.saturating_sub(1));
        self.seen.drain(..self.seen.len() - keep);
        None
    }

    /// Where the trigger first appears in `bytes`.
    fn trigger_in(&self, bytes: &[u8]) -> Option<usize> {
        bytes
            .windows(self.trigger.len())
            .position(|w| w == self.trigger)
    }

    /// The tokens that would complete the trigger now and go on with text `matcher` (the
    /// grammar, from the trigger's first byte) refuses.
    fn refused(&self, matcher: &mut Matcher, env: &TokEnv) -> Vec<u32> {
        let n = self.trigger.len();
        let mut joined = Vec::new();
        let mut out = Vec::new();
        for (id, bytes) in self.closers.iter() {
            joined.clear();
            joined.extend_from_slice(&self.seen);
            joined.extend_from_slice(bytes);
            let Some(at) = self.trigger_in(&joined) else {
                continue;
            };
            // A token that ends with the trigger leaves the grammar at its own start.
            if joined.len() > at + n {
                let ids = env.tokenize_bytes(&joined[at..]);
                if matcher
                    .validate_tokens(&ids)
                    .map_or(true, |k| k < ids.len())
                {
                    out.push(*id);
                }
            }
        }
        out
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    env: TokEnv,
    /// Set while the grammar waits for its trigger.
    waiting: Option<Waiting>,
    /// Set where the grammar writes JSON.
    numbers: Option<NumberBound>,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            env: self.env.clone(),
            waiting: self.waiting.clone(),
            numbers: self.numbers.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("waiting", &self.waiting.is_some())
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
    /// shortest form for the wire; while the grammar waits for its trigger, `None` (any token)
    /// unless some token would complete the trigger into text the grammar refuses.
    pub fn mask(&mut self) -> Result<Option<TokenMask>, String> {
        if let Some(waiting) = &self.waiting {
            let ids = waiting.refused(&mut self.matcher, &self.env);
            let vocab = self.env.tok_trie().vocab_size() as u32;
            return Ok((!ids.is_empty()).then_some(TokenMask::Except { vocab, ids }));
        }
        let mut vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        if let Some(numbers) = &self.numbers {
            numbers.apply(&mut vob);
        }
        let n_set = vob.num_set();
        let vocab = self.env.tok_trie().vocab_size() as u32;
        let n = vocab as usize;
        let ids = |allowed: bool| {
            (0..n as u32)
                .filter(|&t| vob.is_allowed(t) == allowed)
                .collect::<Vec<u32>>()
        };
        Ok(Some(if n_set <= 512 {
            TokenMask::Only(ids(true))
        } else if n - n_set <= 512 {
            TokenMask::Except {
                vocab,
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
        }))
    }

    /// Follows a sampled token. Where it completes the trigger, the grammar takes the output
    /// from the trigger's first byte on.
    pub fn consume(&mut self, id: u32) -> Result<(), String> {
        let Some(waiting) = &mut self.waiting else {
            self.matcher.consume_token(id).map_err(|e| e.to_string())?;
            if let Some(numbers) = &mut self.numbers {
                numbers.push(&self.env.tok_trie().decode_ext(&[id], false));
            }
            return Ok(());
        };
        let Some(from_trigger) = waiting.push(&self.env.tok_trie().decode_ext(&[id], false)) else {
            return Ok(());
        };
        self.waiting = None;
        let ids = self.env.tokenize_bytes(&from_trigger);
        self.matcher
            .consume_tokens(&ids)
            .map_err(|e| e.to_string())?;
        if let Some(numbers) = &mut self.numbers {
            numbers.push(&from_trigger);
        }
        Ok(())
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.waiting.is_none() && self.matcher.is_stopped()
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

    /// Whether `m` allows `id`.
    fn allowed(m: &TokenMask, id: u32) -> bool {
        match m {
            TokenMask::Only(ids) => ids.contains(&id),
            TokenMask::Except { ids, .. } => !ids.contains(&id),
            TokenMask::Bits(w) => w[id as usize / 64] >> (id % 64) & 1 == 1,
        }
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
        let ids = |s: &str| tok.encode(s, false).unwrap();
        let m = c.mask().unwrap().unwrap();
        assert!(allowed(&m, ids("y")[0]) && allowed(&m, ids("n")[0]));
        assert!(!allowed(&m, ids("x")[0]));
        for t in ids("no") {
            assert!(allowed(&c.mask().unwrap().unwrap(), t));
            c.consume(t).unwrap();
        }
        assert!(
            c.is_stopped() || {
                let m = c.mask().unwrap().unwrap();
                m == TokenMask::Only(vec![tok.token_id("<|im_end|>").unwrap()])
            }
        );
    }

    #[test]
    fn a_token_completing_the_trigger_into_refused_text_is_masked_while_waiting() {
        use crate::model::tokenizer::test_support::{byte_id, merged_id};
        let (g, _) = grammars();
        let spec = GrammarSpec::After {
            trigger: "hel".into(),
            then: Box::new(GrammarSpec::Regex("hel(p|m)".into())),
        };
        let mut c = g.compile(&spec).unwrap();
        // `hell` and `hello` would complete the trigger and go on with `l`, which `hel(p|m)`
        // refuses; the rest is free.
        let m = c.mask().unwrap().expect("two tokens refused");
        assert!(!allowed(&m, merged_id("hell")) && !allowed(&m, merged_id("hello")));
        assert!(allowed(&m, merged_id("he")) && allowed(&m, byte_id(b'x')));
        c.consume(merged_id("he")).unwrap();
        // After `he`: `l` ends the trigger (allowed), `ll` and `ld` run past it into refused text.
        let m = c.mask().unwrap().expect("tokens refused");
        assert!(allowed(&m, byte_id(b'l')));
        assert!(!allowed(&m, merged_id("ll")) && !allowed(&m, merged_id("ld")));
        c.consume(byte_id(b'l')).unwrap();
        let m = c.mask().unwrap().expect("constrained after the trigger");
        assert!(allowed(&m, byte_id(b'p')) && !allowed(&m, byte_id(b'l')));
    }

    #[test]
    fn a_triggered_grammar_is_free_until_its_trigger_then_holds_from_the_trigger_on() {
        let (g, tok) = grammars();
        let spec = GrammarSpec::After {
            trigger: "<a>".into(),
            then: Box::new(GrammarSpec::Regex("<a>(yes|no)</a>".into())),
        };
        let ids = |s: &str| tok.encode(s, false).unwrap();
        let mut c = g.compile(&spec).unwrap();
        // Free text, the trigger split over tokens, then only the grammar's continuations.
        for t in ids("hello there <") {
            assert_eq!(c.mask().unwrap(), None);
            c.consume(t).unwrap();
        }
        for t in ids("a>") {
            assert_eq!(c.mask().unwrap(), None);
            c.consume(t).unwrap();
        }
        let m = c.mask().unwrap().expect("constrained after the trigger");
        assert!(allowed(&m, ids("y")[0]) && !allowed(&m, ids("x")[0]));
        assert!(!c.is_stopped());
        // Text after the trigger that the grammar refuses is an error.
        let mut c = g.compile(&spec).unwrap();
        c.consume(ids("ok ")[0]).unwrap();
        let bad = ids("<a>x");
        let r: Result<(), String> = bad.iter().try_for_each(|&t| c.consume(t));
        assert!(r.is_err());
    }

    #[test]
    fn a_schema_number_ends_after_sixteen_digits_a_part() {
        let (g, tok) = grammars();
        let spec = GrammarSpec::JsonSchema(json!({"type": "object",
            "properties": {"v": {"type": "number"}}, "required": ["v"],
            "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}}));
        let mut c = g.compile(&spec).unwrap();
        let ids = |s: &str| tok.encode(s, false).unwrap();
        let allows = |c: &mut Constraint, s: &str| allowed(&c.mask().unwrap().unwrap(), ids(s)[0]);
        for t in ids("{\"v\":1234567890123456") {
            c.consume(t).unwrap();
        }
        assert!(!allows(&mut c, "7") && allows(&mut c, ".") && allows(&mut c, "}"));
        for t in ids(".999999999999999") {
            c.consume(t).unwrap();
        }
        assert!(allows(&mut c, "9"));
        c.consume(ids("9")[0]).unwrap();
        assert!(!allows(&mut c, "9") && allows(&mut c, "e") && allows(&mut c, "}"));
    }
}
