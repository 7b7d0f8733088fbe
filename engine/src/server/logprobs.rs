//! OpenAI's `logprobs` shapes: chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`
//! and completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::generate::TokenLogprob;
use crate::model::tokenizer::Tokenizer;

/// One generated token and its log-probabilities.
pub(crate) type Scored = (u32, TokenLogprob);

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ContentLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ChatLogprobs {
    pub content: Vec<ContentLogprob>,
    pub refusal: Option<()>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

/// A token's bytes and its text (lossy where it is part of a character).
fn token(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's shape.
pub(crate) fn chat(tok: &Tokenizer, scored: &[Scored]) -> ChatLogprobs {
    let content = scored
        .iter()
        .map(|(id, lp)| {
            let (text, bytes) = token(tok, *id);
            ContentLogprob {
                token: text,
                logprob: lp.logprob,
                bytes,
                top_logprobs: lp
                    .top
                    .iter()
                    .map(|&(t, logprob)| {
                        let (token, bytes) = token(tok, t);
                        TopLogprob {
                            token,
                            logprob,
                            bytes,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: None,
    }
}

/// Completions' shape; `offset` is the text offset of the first token.
pub(crate) fn completion(tok: &Tokenizer, scored: &[Scored], offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs {
        tokens: Vec::new(),
        token_logprobs: Vec::new(),
        top_logprobs: Vec::new(),
        text_offset: Vec::new(),
    };
    let mut at = offset;
    for (id, lp) in scored {
        let (text, _) = token(tok, *id);
        out.text_offset.push(at);
        at += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(t, l)| (token(tok, t).0, Value::from(l)))
                .collect(),
        );
    }
    out
}
