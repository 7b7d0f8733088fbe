//! What the engine's front end (the OpenAI server) and its scheduler say to each other.
//!
//! A [`GenerationRequest`] goes in; [`GenerationEvent`]s come out on a channel, ending with
//! exactly one `Finished` or `Failed`. Dropping the receiver aborts the request and frees its
//! KV blocks.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::generate::{
    Constraint, FinishReason, GenerationDefaults, Grammars, SamplingParams, Shaping, TokenLogprob,
};
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Tokenizer;
use crate::trace::TraceContext;

/// One generation, already tokenized.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// End-of-turn tokens are suppressed until this many tokens were generated.
    pub min_tokens: usize,
    /// Keep generating through end-of-turn tokens (load testing).
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
    /// Logit bias, penalties and min-p.
    pub shaping: Shaping,
    /// `Some(n)`: each token's log-probability and its `n` most likely alternatives'.
    pub logprobs: Option<usize>,
    /// The grammar the output must follow (structured outputs, constrained tool calls).
    pub constraint: Option<Constraint>,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// The caller's W3C trace context; the engine's spans join that trace.
    pub trace: Option<TraceContext>,
}

/// Timings of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// From arrival until the request was first scheduled.
    pub queue: Duration,
    /// From first scheduling until the first token.
    pub prefill: Duration,
    /// From the first token until the end.
    pub decode: Duration,
}

/// What happens to a request, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    /// One generated token and the text it completes (empty while a multi-byte character or
    /// a possible stop string is held back).
    Token {
        id: u32,
        text: String,
        /// When the request asked for log-probabilities.
        logprob: Option<TokenLogprob>,
    },
    /// The end: the last text still held back (if any), why it ended, and the exact counts.
    Finished {
        text: String,
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        timings: Timings,
    },
    /// The request failed after it was accepted (e.g. a rank went down).
    Failed(EngineError),
}

/// Why a request was refused or failed, with a stable code for the HTTP layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Refused before any work: bad parameters (HTTP 400).
    #[error("{message}")]
    Invalid { code: &'static str, message: String },
    /// The engine cannot serve now: a rank is down or it is shutting down (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// An accepted request failed inside the engine (HTTP 500).
    #[error("{0}")]
    Internal(String),
}

/// One rank as `/health` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankHealth {
    pub rank: usize,
    /// First and last block, inclusive.
    pub layers: [usize; 2],
    pub up: bool,
    pub kv_tokens_total: usize,
    pub kv_tokens_used: usize,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
}

/// `/health`: `ok` when every rank is up, `degraded` while some are, `down` when none can serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Health {
    pub status: &'static str,
    pub ranks: Vec<RankHealth>,
}

/// Counters and gauges for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub num_requests_running: usize,
    pub num_requests_waiting: usize,
    /// Fraction of KV blocks in use, 0..=1.
    pub kv_cache_usage: f64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished_stop: u64,
    pub requests_finished_length: u64,
    pub requests_aborted: u64,
    pub requests_failed: u64,
    pub preemptions_total: u64,
    pub ranks: Vec<RankHealth>,
}

/// The engine as the OpenAI server sees it.
pub trait Engine: Send + Sync + 'static {
    /// The model id `/v1/models` lists and responses carry.
    fn model_id(&self) -> &str;
    fn tokenizer(&self) -> &Arc<Tokenizer>;
    fn chat_template(&self) -> &ChatTemplate;
    /// Prompt plus max_tokens may not exceed this.
    fn context_window(&self) -> usize;
    /// Starts a request. Refusals (context window, engine down) come back here, before any work.
    fn submit(
        &self,
        req: GenerationRequest,
    ) -> Result<tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>, EngineError>;
    fn health(&self) -> Health;
    fn metrics(&self) -> MetricsSnapshot;
    /// What a request gets for the sampling fields it leaves out.
    fn defaults(&self) -> GenerationDefaults {
        GenerationDefaults::default()
    }
    /// The grammar compiler for structured outputs; `None` refuses them.
    fn grammars(&self) -> Option<&Grammars> {
        None
    }
}
