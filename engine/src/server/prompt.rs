//! The prompt a request runs on, tokenized exactly as this server tokenizes it.
//!
//! Public so that a gateway in front of the engine counts a request's prompt tokens with the
//! same code (chat template, tools, BOS) and gets the number the engine reports as
//! `usage.prompt_tokens`.

use serde_json::Value;

use super::error::ApiError;
use super::types::{ChatRequest, Prompt, Role};
use super::{chat_request, parse, tools};
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Encode;

/// The generation endpoints whose prompt can be counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`: messages (and tools) through the chat template.
    ChatCompletions,
    /// `POST /v1/completions`: a text prompt, or token ids used as given.
    Completions,
}

impl Endpoint {
    /// The endpoint served at `path`, if it is one of the generation endpoints.
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Self::ChatCompletions),
            "/v1/completions" => Some(Self::Completions),
            _ => None,
        }
    }

    /// The request field that holds the prompt (the `param` of prompt errors).
    pub fn prompt_param(self) -> &'static str {
        match self {
            Self::ChatCompletions => "messages",
            Self::Completions => "prompt",
        }
    }
}

/// Why a request's prompt could not be built: the same 400 the engine would answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PromptError {
    /// The offending field's path, e.g. `messages[1].content`.
    pub param: Option<String>,
    /// OpenAI's `code`, e.g. `unsupported_parameter`.
    pub code: Option<String>,
    pub message: String,
    /// True for a failure of the tokenizer itself rather than of the request.
    pub internal: bool,
}

impl From<ApiError> for PromptError {
    fn from(e: ApiError) -> Self {
        Self {
            internal: e.status.is_server_error(),
            param: e.param,
            code: e.code,
            message: e.message,
        }
    }
}

/// The token ids of the prompt of `body`, a parsed request to `endpoint`; validates the whole
/// request on the way, so a request this accepts is one the engine accepts.
pub fn prompt_ids(
    endpoint: Endpoint,
    body: &Value,
    tokenizer: &dyn Encode,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    let ids = match endpoint {
        Endpoint::ChatCompletions => chat_ids(&chat_request::parse(body)?, tokenizer, template)?,
        Endpoint::Completions => {
            completion_ids(parse::completion_request(body)?.prompt, tokenizer)?
        }
    };
    non_empty(endpoint, ids)
}

/// The token ids of `body`'s prompt as an OpenAI-compatible server that gives the request to
/// the model's own chat template builds it (vLLM, SGLang): the messages as given, text parts
/// joined with newlines and tool-call arguments as objects (vLLM's defaults), `tools` passed to
/// the template, which renders them or not. Unlike [`prompt_ids`] it judges no other field:
/// the upstream does.
pub fn upstream_prompt_ids(
    endpoint: Endpoint,
    body: &Value,
    tokenizer: &dyn Encode,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    let ids = match endpoint {
        Endpoint::ChatCompletions => {
            let Some(messages) = body.get("messages").and_then(Value::as_array) else {
                return Err(ApiError::expected("messages", "an array of messages").into());
            };
            let messages: Vec<Value> = messages.iter().map(upstream_message).collect();
            let tools = body
                .get("tools")
                .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
            let text = template
                .render_openai(&Value::Array(messages), tools, true)
                .map_err(|e| ApiError::invalid("messages", format!("messages: {e}")))?;
            let ids = tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            with_bos(tokenizer, ids)
        }
        Endpoint::Completions => {
            let Some(prompt) = body.get("prompt") else {
                return Err(ApiError::invalid("prompt", "prompt: required").into());
            };
            completion_ids(parse::prompt_value(prompt)?, tokenizer)?
        }
    };
    non_empty(endpoint, ids)
}

/// `ids`, unless the prompt is empty: then the error naming the endpoint's prompt field.
fn non_empty(endpoint: Endpoint, ids: Vec<u32>) -> Result<Vec<u32>, PromptError> {
    if ids.is_empty() {
        let param = endpoint.prompt_param();
        return Err(ApiError::invalid(param, format!("{param}: must not be empty")).into());
    }
    Ok(ids)
}

/// One message as vLLM gives it to a template: a list of content parts becomes their text
/// joined by newlines; a tool call's JSON `arguments` string becomes the object.
fn upstream_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(parts) = m.get("content").and_then(Value::as_array) {
        let text: Vec<&str> = parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect();
        m["content"] = Value::String(text.join("\n"));
    }
    // Looked up, never indexed: a malformed call is the upstream's to refuse, not a panic here.
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            let args = call
                .get_mut("function")
                .and_then(|f| f.get_mut("arguments"));
            if let Some(args) = args {
                if let Some(parsed) = args.as_str().and_then(|a| serde_json::from_str(a).ok()) {
                    *args = parsed;
                }
            }
        }
    }
    m
}

/// A chat request's prompt: its messages (tools rendered in) through the chat template.
pub(crate) fn chat_ids(
    req: &ChatRequest,
    tokenizer: &dyn Encode,
    template: &ChatTemplate,
) -> Result<Vec<u32>, ApiError> {
    check_names(req, template)?;
    let messages = tools::render_messages(req);
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid("messages", format!("messages: {e}")))?;
    let ids = tokenizer
        .encode(&text, true)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(with_bos(tokenizer, ids))
}

/// Refuses a message `name` the chat template would drop (it renders none for that role), so
/// that no name is silently ignored. A tool message's `name` (the tool's) is accepted: the
/// model's tool format matches results to calls by order and carries no names.
fn check_names(req: &ChatRequest, template: &ChatTemplate) -> Result<(), ApiError> {
    let mut rendered: Vec<(Role, bool)> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        if m.name.is_none() || m.role == Role::Tool {
            continue;
        }
        let role = m.role.as_str();
        let renders = match rendered.iter().find(|(r, _)| *r == m.role) {
            Some(&(_, b)) => b,
            None => {
                let b = template.renders_name(role);
                rendered.push((m.role, b));
                b
            }
        };
        if !renders {
            let path = format!("messages[{i}].name");
            return Err(ApiError::unsupported(
                &path,
                format!("{path}: not supported: this model's chat template renders no name on a message of role {role}"),
            ));
        }
    }
    Ok(())
}

/// A completion request's prompt.
pub(crate) fn completion_ids(prompt: Prompt, tokenizer: &dyn Encode) -> Result<Vec<u32>, ApiError> {
    match prompt {
        // Special-token text in a user's prompt is plain text.
        Prompt::Text(text) => {
            let ids = tokenizer
                .encode(&text, false)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(with_bos(tokenizer, ids))
        }
        // Token ids are used exactly as given.
        Prompt::Tokens(ids) => {
            let vocab = tokenizer.vocab_size();
            if let Some((i, t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    format!("prompt[{i}]"),
                    format!("prompt[{i}]: token id {t} is outside the vocabulary ({vocab} tokens)"),
                ));
            }
            Ok(ids)
        }
    }
}

/// `ids` with the tokenizer's BOS in front, when the model wants one and it is not there.
fn with_bos(tokenizer: &dyn Encode, mut ids: Vec<u32>) -> Vec<u32> {
    if let Some(bos) = tokenizer.bos_id().filter(|_| tokenizer.add_bos()) {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    ids
}
