//! OpenAI request and response types.
//!
//! Requests are read from a `serde_json::Value` by [`super::parse`], which names the offending
//! field in every error; responses are plain `Serialize` structs.

use crate::generate::{GenerationDefaults, SamplingParams, Shaping};
use serde::Serialize;

use super::logprobs::{ChatLogprobs, CompletionLogprobs};

// ---------------------------------------------------------------------------------------------
// Requests

/// The generation fields chat and completions requests share.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sampling {
    /// `max_completion_tokens`, else `max_tokens`; `None`: what is left of the context window.
    pub max_tokens: Option<usize>,
    pub min_tokens: usize,
    pub ignore_eos: bool,
    /// `None`: the engine's default ([`crate::generate::GenerationDefaults`]).
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(n)`: log-probabilities with `n` alternatives per token.
    pub logprobs: Option<usize>,
    pub seed: Option<u64>,
    /// `response_format` (or vLLM's `guided_json` / `structured_outputs`).
    pub format: Option<Format>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A function call in an assistant message of the history.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HistoryToolCall {
    pub name: String,
    /// The JSON string OpenAI sends.
    pub arguments: String,
}

/// One message of a chat request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Message {
    pub role: Role,
    /// Text parts joined; `None` for an assistant message with only tool calls.
    pub content: Option<String>,
    pub tool_calls: Vec<HistoryToolCall>,
    /// The participant's name: rendered by the chat template, or refused (`prompt::chat_ids`).
    pub name: Option<String>,
}

/// What the output must be (structured outputs).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Format {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression (vLLM's `structured_outputs.regex`).
    Regex(String),
    /// One of these strings (vLLM's `structured_outputs.choice`).
    Choice(Vec<String>),
    /// A Lark grammar, as llguidance reads it (vLLM's `structured_outputs.grammar`).
    Lark(String),
}

impl Sampling {
    /// The request's sampling with `d` for what it leaves out.
    pub fn resolve(&self, d: &GenerationDefaults) -> (SamplingParams, Shaping) {
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            seed: self.seed,
        };
        let shaping = Shaping {
            min_p: self.min_p.unwrap_or(d.min_p),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            logit_bias: self.logit_bias.clone(),
        };
        (params, shaping)
    }
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// A function tool: its name and the tool object as the prompt shows it, JSON text
/// (`{"type":"function","function":{"name":...,"description":...,"parameters":...}}`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolDef {
    pub name: String,
    pub schema: String,
    /// The function's `parameters` (JSON schema), if given.
    pub parameters: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChatRequest {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    /// At most one call when false.
    pub parallel_tool_calls: bool,
    pub sampling: Sampling,
}

/// A completions prompt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CompletionRequest {
    pub prompt: Prompt,
    pub sampling: Sampling,
}

// ---------------------------------------------------------------------------------------------
// Responses

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// `id`, `created` and `model` of one response (the same on every chunk of a stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct FunctionCall {
    pub name: String,
    /// JSON text, as OpenAI sends it.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// A tool call in a streamed delta: a [`ToolCall`] with its index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ToolCallDelta {
    pub index: usize,
    #[serde(flatten)]
    pub call: ToolCall,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ChatChunk {
    /// A chunk with one choice (`usage` absent) or, with `choice: None`, the usage chunk.
    pub fn new(meta: &ResponseMeta, choice: Option<ChunkChoice>, usage: Option<Usage>) -> Self {
        Self {
            id: meta.id.clone(),
            object: "chat.completion.chunk",
            created: meta.created,
            model: meta.model.clone(),
            choices: choice.into_iter().collect(),
            usage,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A `text_completion`: the whole response, or one streamed chunk (`usage` only on the last).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl Completion {
    pub fn new(
        meta: &ResponseMeta,
        choice: Option<CompletionChoice>,
        usage: Option<Usage>,
    ) -> Self {
        Self {
            id: meta.id.clone(),
            object: "text_completion",
            created: meta.created,
            model: meta.model.clone(),
            choices: choice.into_iter().collect(),
            usage,
        }
    }
}
