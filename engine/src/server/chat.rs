//! `POST /v1/chat/completions`.

use super::body::Body;
use super::error::ApiError;
use super::generation::{to_json, ChunkFormatter, Finish, Submitted};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChunkChoice, Delta, ResponseMeta,
    ToolCall, ToolCallDelta,
};
use super::{chat_request, parse, prompt, tools, Call, State};
use crate::generate::FinishReason;
use http::Response;

pub(crate) async fn handle(state: &State, call: Call) -> Result<Response<Body>, ApiError> {
    let req = chat_request::parse(&parse::json(&call.body)?)?;
    let engine = &state.engine;
    let use_tools = tools::enabled(&req);
    let ids = prompt::chat_ids(&req, engine.tokenizer().as_ref(), engine.chat_template())?;
    let sub = Submitted::start(state, &call, ids, &req.sampling, "messages", "chatcmpl-")?;
    if req.sampling.stream {
        return Ok(sub.stream(|meta| ChatStream {
            meta,
            splitter: use_tools.then(tools::StreamSplitter::default),
            include_usage: req.sampling.include_usage,
        }));
    }
    let (meta, done) = sub.collect().await?;
    let reason = done.reason;
    let parsed = use_tools.then(|| tools::parse_output(&done.text));
    let (content, tool_calls) = match parsed {
        Some(p) if !p.calls.is_empty() => (p.content, p.calls),
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
            logprobs: None,
        }],
        usage: done.usage,
    };
    Ok(super::json_response(http::StatusCode::OK, &resp))
}

fn finish_reason(reason: FinishReason, calls: &[ToolCall]) -> &'static str {
    if calls.is_empty() {
        reason.as_str()
    } else {
        "tool_calls"
    }
}

/// The chunks of a streamed chat completion.
struct ChatStream {
    meta: ResponseMeta,
    /// Present when the request offers tools.
    splitter: Option<tools::StreamSplitter>,
    include_usage: bool,
}

impl ChatStream {
    fn chunk(&self, delta: Delta, finish_reason: Option<&'static str>) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        };
        to_json(&ChatChunk::new(&self.meta, Some(choice), None))
    }

    fn content(&self, text: String) -> String {
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

    fn text(&mut self, text: &str, out: &mut Vec<String>) {
        let text = match &mut self.splitter {
            Some(s) => s.push(text),
            None => text.to_owned(),
        };
        if !text.is_empty() {
            out.push(self.content(text));
        }
    }

    fn finish(&mut self, done: Finish, out: &mut Vec<String>) {
        let (rest, calls) = match self.splitter.take() {
            Some(s) => s.finish(&done.text),
            None => (done.text.clone(), Vec::new()),
        };
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
