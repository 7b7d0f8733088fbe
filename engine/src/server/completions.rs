//! `POST /v1/completions`.

use http::{Response, StatusCode};

use super::body::Body;
use super::error::ApiError;
use super::generation::{to_json, ChunkFormatter, Finish, Submitted};
use super::types::{Completion, CompletionChoice, ResponseMeta};
use super::{parse, prompt, Call, State};

pub(crate) async fn handle(state: &State, call: Call) -> Result<Response<Body>, ApiError> {
    let req = parse::completion_request(&parse::json(&call.body)?)?;
    let engine = &state.engine;
    let ids = prompt::completion_ids(req.prompt, engine.tokenizer().as_ref())?;
    let sub = Submitted::start(state, &call, ids, &req.sampling, "prompt", "cmpl-")?;
    if req.sampling.stream {
        return Ok(sub.stream(|meta| CompletionStream {
            meta,
            include_usage: req.sampling.include_usage,
        }));
    }
    let (meta, done) = sub.collect().await?;
    let choice = CompletionChoice {
        index: 0,
        text: done.text,
        logprobs: None,
        finish_reason: Some(done.reason.as_str()),
    };
    let resp = Completion::new(&meta, Some(choice), Some(done.usage));
    Ok(super::json_response(StatusCode::OK, &resp))
}

/// The chunks of a streamed completion.
struct CompletionStream {
    meta: ResponseMeta,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(&self, text: String, finish_reason: Option<&'static str>) -> String {
        let choice = CompletionChoice {
            index: 0,
            text,
            logprobs: None,
            finish_reason,
        };
        to_json(&Completion::new(&self.meta, Some(choice), None))
    }
}

impl ChunkFormatter for CompletionStream {
    fn start(&mut self, _out: &mut Vec<String>) {}

    fn text(&mut self, text: &str, out: &mut Vec<String>) {
        out.push(self.chunk(text.to_owned(), None));
    }

    fn finish(&mut self, done: Finish, out: &mut Vec<String>) {
        if !done.text.is_empty() {
            out.push(self.chunk(done.text, None));
        }
        out.push(self.chunk(String::new(), Some(done.reason.as_str())));
        if self.include_usage {
            out.push(to_json(&Completion::new(
                &self.meta,
                None,
                Some(done.usage),
            )));
        }
    }
}
