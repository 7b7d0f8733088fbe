//! `POST /v1/chat/completions`.

use super::body::Body;
use super::error::ApiError;
use super::generation::{to_json, ChunkFormatter, Finish, Submitted};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChunkChoice, Delta, ResponseMeta,
    ToolCall, ToolCallDelta,
};
use super::{chat_request, constrain, parse, prompt, tools, Call, State};
use std::sync::Arc;

use super::logprobs::{self, Scored};
use crate::generate::FinishReason;
use crate::model::tokenizer::Tokenizer;
use http::Response;

pub(crate) async fn handle(state: &State, call: Call) -> Result<Response<Body>, ApiError> {
    let req = chat_request::parse(&parse::json(&call.body)?)?;
    let engine = &state.engine;
    let use_tools = tools::enabled(&req);
    let ids = prompt::chat_ids(&req, engine.tokenizer().as_ref(), engine.chat_template())?;
    let grammar = constrain::chat(&req)?;
    let sub = Submitted::start(
        state,
        &call,
        ids,
        &req.sampling,
        grammar,
        "messages",
        "chatcmpl-",
    )?;
    let scorer = req.sampling.logprobs.map(|_| engine.tokenizer().clone());
    if req.sampling.stream {
        return Ok(sub.stream(|meta| ChatStream {
            meta,
            splitter: use_tools.then(tools::StreamSplitter::default),
            include_usage: req.sampling.include_usage,
            scorer,
            pending: Vec::new(),
            parallel: req.parallel_tool_calls,
        }));
    }
    let (meta, done) = sub.collect().await?;
    let reason = done.reason;
    let cut_off = reason == FinishReason::Length;
    let parsed = use_tools.then(|| tools::parse_output(&done.text, cut_off));
    let (content, tool_calls) = match parsed {
        Some(mut p) if !p.calls.is_empty() || p.cut_call => {
            if !req.parallel_tool_calls {
                p.calls.truncate(1);
            }
            (p.content, p.calls)
        }
        // Without tool calls the text is the content, as is.
        _ => (Some(done.text), Vec::new()),
    };
    let resp = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: vec![ChatChoice {
            index: 0,
            finish_reason: finish_reason(reason, &tool_calls),
            message: AssistantMessage {
                role: "assistant",
                content,
                tool_calls,
            },
            logprobs: scorer.map(|t| logprobs::chat(&t, &done.logprobs)),
        }],
        usage: done.usage,
    };
    Ok(super::json_response(http::StatusCode::OK, &resp))
}

/// OpenAI's finish reason: `length` whenever `max_tokens` (or the window) cut the output off,
/// tool calls or not (with parallel calls allowed, a small model may repeat its call until the
/// limit, and the last one is then unfinished); otherwise `tool_calls` when the answer holds
/// calls.
fn finish_reason(reason: FinishReason, calls: &[ToolCall]) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop if calls.is_empty() => "stop",
        FinishReason::Stop => "tool_calls",
    }
}

/// The chunks of a streamed chat completion.
struct ChatStream {
    meta: ResponseMeta,
    /// Present when the request offers tools.
    splitter: Option<tools::StreamSplitter>,
    include_usage: bool,
    /// Present when the request asked for log-probabilities.
    scorer: Option<Arc<Tokenizer>>,
    /// Log-probabilities not yet sent (their text is held back).
    pending: Vec<Scored>,
    /// `parallel_tool_calls`: false keeps the first call only.
    parallel: bool,
}

impl ChatStream {
    fn chunk(&mut self, delta: Delta, finish_reason: Option<&'static str>) -> String {
        let scored = std::mem::take(&mut self.pending);
        let logprobs = self
            .scorer
            .as_ref()
            .filter(|_| !scored.is_empty())
            .map(|t| logprobs::chat(t, &scored));
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason,
        };
        to_json(&ChatChunk::new(&self.meta, Some(choice), None))
    }

    fn content(&mut self, text: String) -> String {
        self.chunk(
            Delta {
                content: Some(text),
                ..Delta::default()
            },
            None,
        )
    }
}

impl ChunkFormatter for ChatStream {
    fn start(&mut self, out: &mut Vec<String>) {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            tool_calls: None,
        };
        out.push(self.chunk(delta, None));
    }

    fn text(&mut self, text: &str, logprobs: Vec<Scored>, out: &mut Vec<String>) {
        self.pending.extend(logprobs);
        let text = match &mut self.splitter {
            Some(s) => s.push(text),
            None => text.to_owned(),
        };
        if !text.is_empty() {
            out.push(self.content(text));
        }
    }

    fn finish(&mut self, done: Finish, out: &mut Vec<String>) {
        self.pending.extend(done.logprobs.iter().cloned());
        let (rest, mut calls) = match self.splitter.take() {
            Some(s) => s.finish(&done.text, done.reason == FinishReason::Length),
            None => (done.text.clone(), Vec::new()),
        };
        if !self.parallel {
            calls.truncate(1);
        }
        if !rest.is_empty() {
            out.push(self.content(rest));
        }
        let reason = finish_reason(done.reason, &calls);
        if !calls.is_empty() {
            let deltas = calls
                .into_iter()
                .enumerate()
                .map(|(index, call)| ToolCallDelta { index, call })
                .collect();
            let delta = Delta {
                tool_calls: Some(deltas),
                ..Delta::default()
            };
            out.push(self.chunk(delta, None));
        }
        out.push(self.chunk(Delta::default(), Some(reason)));
        if self.include_usage {
            out.push(to_json(&ChatChunk::new(&self.meta, None, Some(done.usage))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_answer_is_length_even_with_calls() {
        let calls = tools::parse_output(
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"na",
            true,
        )
        .calls;
        assert_eq!(calls.len(), 1);
        assert_eq!(finish_reason(FinishReason::Length, &calls), "length");
        assert_eq!(finish_reason(FinishReason::Stop, &calls), "tool_calls");
        assert_eq!(finish_reason(FinishReason::Stop, &[]), "stop");
        assert_eq!(finish_reason(FinishReason::Length, &[]), "length");
    }
}
