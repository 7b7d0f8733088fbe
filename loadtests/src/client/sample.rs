//! What one request measured, and how it ended.

use std::time::Duration;

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A complete stream: `[DONE]` or a `finish_reason`, and no error event.
    Ok,
    /// A non-2xx response; `code` is the body's `error.code` (or `error.type`) when it has one.
    Http {
        status: u16,
        code: Option<String>,
        message: String,
    },
    /// A `data: {"error": ...}` event in a 2xx stream.
    StreamError { code: String, message: String },
    /// No complete response within the request timeout.
    Timeout(Duration),
    /// Connecting, sending, or reading failed.
    Transport(String),
    /// The server sent something that is not an OpenAI response.
    Protocol(String),
    /// The stream ended without `[DONE]` or a `finish_reason`.
    Incomplete,
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok)
    }

    /// The key outcomes are counted under: `ok`, `http_503`, `http_503:overloaded`,
    /// `stream_error:internal_error`, `timeout`, `transport_error`, `protocol_error`,
    /// `incomplete_stream`.
    pub fn label(&self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Http {
                status,
                code: Some(code),
                ..
            } => format!("http_{status}:{code}"),
            Self::Http { status, .. } => format!("http_{status}"),
            Self::StreamError { code, .. } => format!("stream_error:{code}"),
            Self::Timeout(_) => "timeout".into(),
            Self::Transport(_) => "transport_error".into(),
            Self::Protocol(_) => "protocol_error".into(),
            Self::Incomplete => "incomplete_stream".into(),
        }
    }

    /// A human-readable detail for failures.
    pub fn message(&self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Http { message, .. } | Self::StreamError { message, .. } => message.clone(),
            Self::Timeout(t) => format!("no complete response within {t:?}"),
            Self::Transport(m) | Self::Protocol(m) => m.clone(),
            Self::Incomplete => "the stream ended without [DONE] or a finish_reason".into(),
        }
    }
}

/// A function call the server answered with, its streamed pieces joined.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The JSON text of the arguments, as sent (a string in the OpenAI API).
    pub arguments: String,
}

/// One request's measurements.
#[derive(Debug, Clone)]
pub struct Sample {
    pub outcome: Outcome,
    /// Send → first chunk with non-empty text or a tool call.
    pub ttft: Option<Duration>,
    /// Send → end of the response.
    pub e2e: Duration,
    /// `usage.completion_tokens`, when the server sent usage.
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens`, when the server sent usage.
    pub prompt_tokens: Option<u64>,
    /// Chunks with non-empty text.
    pub content_chunks: u64,
    /// The gateway's `x-sluice-queue-ms` response header.
    pub queue_ms: Option<f64>,
    /// A refusal's `Retry-After` (whole seconds), when it sent one.
    pub retry_after: Option<Duration>,
    /// How many times the request was sent again after a refusal; its times count from the
    /// first send.
    pub retries: u32,
    /// The generated text, kept so that needle answers can be scored.
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Sample {
    pub(crate) fn failed(outcome: Outcome, e2e: Duration) -> Self {
        Self {
            outcome,
            ttft: None,
            e2e,
            completion_tokens: None,
            prompt_tokens: None,
            content_chunks: 0,
            queue_ms: None,
            retry_after: None,
            retries: 0,
            text: String::new(),
            tool_calls: Vec::new(),
        }
    }

    /// Completion tokens: the server's usage when it sent one, else the content chunks.
    pub fn tokens(&self) -> u64 {
        self.completion_tokens.unwrap_or(self.content_chunks)
    }
}
