//! `POST /v1/completions`.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::body::Body;
use super::error::ApiError;
use super::generation::{to_json, ChunkFormatter, Finish, Submitted};
use super::logprobs::{self, Scored};
use super::types::{Completion, CompletionChoice, ResponseMeta};
use super::{constrain, parse, prompt, Call, State};
use crate::model::tokenizer::Tokenizer;

pub(crate) async fn handle(state: &State, call: Call) -> Result<Response<Body>, ApiError> {
    let req = parse::completion_request(&parse::json(&call.body)?)?;
    let engine = &state.engine;
    let ids = prompt::completion_ids(req.prompt, engine.tokenizer().as_ref())?;
    let grammar = req.sampling.format.as_ref().map(constrain::format);
    let sub = Submitted::start(state, &call, ids, &req.sampling, grammar, "prompt", "cmpl-")?;
    let scorer = req.sampling.logprobs.map(|_| engine.tokenizer().clone());
    if req.sampling.stream {
        return Ok(sub.stream(|meta| CompletionStream {
            meta,
            include_usage: req.sampling.include_usage,
            scorer,
            offset: 0,
        }));
    }
    let (meta, done) = sub.collect().await?;
    let choice = CompletionChoice {
        index: 0,
        logprobs: scorer.map(|t| logprobs::completion(&t, &done.logprobs, 0)),
        text: done.text,
        finish_reason: Some(done.reason.as_str()),
    };
    let resp = Completion::new(&meta, Some(choice), Some(done.usage));
    Ok(super::json_response(StatusCode::OK, &resp))
}

/// The chunks of a streamed completion.
struct CompletionStream {
    meta: ResponseMeta,
    include_usage: bool,
    /// Present when the request asked for log-probabilities.
    scorer: Option<Arc<Tokenizer>>,
    /// Where the next token's text starts in the whole output.
    offset: usize,
}

impl CompletionStream {
    fn chunk(
        &mut self,
        text: String,
        scored: &[Scored],
        finish_reason: Option<&'static str>,
    ) -> String {
        let logprobs = self
            .scorer
            .as_ref()
            .filter(|_| !scored.is_empty())
            .map(|t| {
                let lp = logprobs::completion(t, scored, self.offset);
                self.offset += lp.tokens.iter().map(String::len).sum::<usize>();
                lp
            });
        let choice = CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason,
        };
        to_json(&Completion::new(&self.meta, Some(choice), None))
    }
}

impl ChunkFormatter for CompletionStream {
    fn start(&mut self, _out: &mut Vec<String>) {}

    fn text(&mut self, text: &str, logprobs: Vec<Scored>, out: &mut Vec<String>) {
        let chunk = self.chunk(text.to_owned(), &logprobs, None);
        out.push(chunk);
    }

    fn finish(&mut self, done: Finish, out: &mut Vec<String>) {
        if !done.text.is_empty() || !done.logprobs.is_empty() {
            let chunk = self.chunk(done.text, &done.logprobs, None);
            out.push(chunk);
        }
        let last = self.chunk(String::new(), &[], Some(done.reason.as_str()));
        out.push(last);
        if self.include_usage {
            out.push(to_json(&Completion::new(
                &self.meta,
                None,
                Some(done.usage),
            )));
        }
    }
}
