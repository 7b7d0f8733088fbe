//! What chat and completions share: building the [`GenerationRequest`], collecting the engine's
//! events into one answer, and streaming them as server-sent events.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedReceiver;

use super::constrain::Grammar;
use super::error::ApiError;
use super::logprobs::Scored;
use super::metrics::HttpMetrics;
use super::types::{ResponseMeta, Sampling, Usage};
use super::{Call, State};
use crate::api::{Engine, GenerationEvent, GenerationRequest};
use crate::generate::{Constraint, FinishReason, GenerationDefaults};
use crate::trace::TraceContext;

/// The default `max_tokens` is what is left of the context window, at most this.
pub(crate) const DEFAULT_MAX_TOKENS: usize = 4096;

/// A fresh id: `prefix` (e.g. `"chatcmpl-"`) and 24 random hex digits.
pub(crate) fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let a = h.finish();
    h.write_u64(a);
    let b = h.finish();
    format!("{prefix}{a:016x}{:08x}", b >> 32)
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A generation submitted for one API request: its events, the response's identity, and the
/// tracker that records its latencies. Both endpoints start here and finish through
/// [`Submitted::stream`] or [`Submitted::collect`].
pub(crate) struct Submitted {
    rx: UnboundedReceiver<GenerationEvent>,
    meta: ResponseMeta,
    tracker: Tracker,
}

impl Submitted {
    /// Builds the engine request for `ids` (`prompt_param` names the prompt's field in
    /// errors), submits it, and names the response `{id_prefix}…`.
    pub(crate) fn start(
        state: &State,
        call: &Call,
        ids: Vec<u32>,
        sampling: &Sampling,
        grammar: Option<Grammar>,
        prompt_param: &str,
        id_prefix: &str,
    ) -> Result<Self, ApiError> {
        let engine = &state.engine;
        let mut gen = build_request(
            engine.context_window(),
            &engine.defaults(),
            ids,
            sampling,
            call.trace,
            prompt_param,
        )?;
        let vocab = engine.tokenizer().vocab_size();
        if let Some(&(id, _)) = sampling
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= vocab)
        {
            return Err(ApiError::invalid(
                format!("logit_bias.{id}"),
                format!(
                    "logit_bias.{id}: token id {id} is outside the vocabulary ({vocab} tokens)"
                ),
            ));
        }
        gen.constraint = grammar.map(|g| compile(engine.as_ref(), &g)).transpose()?;
        let rx = engine.submit(gen)?;
        Ok(Self {
            rx,
            meta: ResponseMeta {
                id: new_id(id_prefix),
                created: unix_now(),
                model: engine.model_id().to_owned(),
            },
            tracker: Tracker::new(call.start, state.http.clone()),
        })
    }

    /// The server-sent-event response, its chunks made by the formatter `fmt` builds.
    pub(crate) fn stream<F: ChunkFormatter + 'static>(
        self,
        fmt: impl FnOnce(ResponseMeta) -> F,
    ) -> http::Response<super::body::Body> {
        super::sse_response(SseStream::new(
            self.rx,
            Box::new(fmt(self.meta)),
            self.tracker,
        ))
    }

    /// Waits for the whole generation.
    pub(crate) async fn collect(self) -> Result<(ResponseMeta, Finish), ApiError> {
        Ok((self.meta, collect(self.rx, self.tracker).await?))
    }
}

/// The engine request for `prompt`; `prompt_param` names the field in errors.
fn build_request(
    context_window: usize,
    defaults: &GenerationDefaults,
    prompt: Vec<u32>,
    s: &Sampling,
    trace: Option<TraceContext>,
    prompt_param: &str,
) -> Result<GenerationRequest, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            prompt_param,
            format!("{prompt_param}: must not be empty"),
        ));
    }
    let max_tokens = match s.max_tokens {
        Some(m) => m,
        None if prompt.len() >= context_window => {
            return Err(ApiError::context_length(
                prompt_param,
                format!(
                    "This model's maximum context length is {context_window} tokens, but the \
                     prompt has {} tokens, leaving no room for the completion",
                    prompt.len()
                ),
            ));
        }
        None => (context_window - prompt.len()).min(DEFAULT_MAX_TOKENS),
    };
    if s.min_tokens > max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!(
                "min_tokens: {} is more than max_tokens ({max_tokens})",
                s.min_tokens
            ),
        ));
    }
    let (sampling, shaping) = s.resolve(defaults);
    Ok(GenerationRequest {
        prompt,
        max_tokens,
        min_tokens: s.min_tokens,
        ignore_eos: s.ignore_eos,
        sampling,
        shaping,
        logprobs: s.logprobs,
        constraint: None,
        stop: s.stop.clone(),
        trace,
    })
}

/// The request's grammar, compiled; 400 with llguidance's reason when it cannot be.
fn compile(engine: &dyn Engine, g: &Grammar) -> Result<Constraint, ApiError> {
    let param = g.param;
    let Some(grammars) = engine.grammars() else {
        return Err(ApiError::unsupported(
            param,
            format!("{param}: this engine has no grammar support"),
        ));
    };
    grammars.compile(&g.spec).map_err(|e| {
        ApiError::invalid(param, format!("{param}: the grammar does not compile: {e}"))
            .with_code("invalid_grammar")
    })
}

/// Records the server-side latencies of one request.
#[derive(Debug)]
pub(crate) struct Tracker {
    start: Instant,
    seen_token: bool,
    metrics: Arc<HttpMetrics>,
}

impl Tracker {
    pub fn new(start: Instant, metrics: Arc<HttpMetrics>) -> Self {
        Self {
            start,
            seen_token: false,
            metrics,
        }
    }

    fn token(&mut self) {
        if !self.seen_token {
            self.seen_token = true;
            self.metrics.ttft.observe(self.start.elapsed());
        }
    }

    fn finished(&mut self) {
        self.token();
        self.metrics.e2e.observe(self.start.elapsed());
    }
}

/// The end of a generation.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Finish {
    /// The whole text (collected) or the last piece still held back (streamed).
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    /// The tokens' log-probabilities (collected: all; streamed: those not yet sent).
    pub logprobs: Vec<Scored>,
}

fn ended_early() -> ApiError {
    ApiError::internal("the engine ended the request without a result")
}

/// Waits for the whole generation.
async fn collect(
    mut rx: UnboundedReceiver<GenerationEvent>,
    mut tracker: Tracker,
) -> Result<Finish, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenerationEvent::Token {
                id,
                text: piece,
                logprob,
            } => {
                tracker.token();
                text.push_str(&piece);
                logprobs.extend(logprob.map(|l| (id, l)));
            }
            GenerationEvent::Finished {
                text: rest,
                reason,
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                tracker.finished();
                text.push_str(&rest);
                return Ok(Finish {
                    text,
                    reason,
                    usage: Usage::new(prompt_tokens, completion_tokens),
                    logprobs,
                });
            }
            GenerationEvent::Failed(e) => return Err(e.into()),
        }
    }
    Err(ended_early())
}

/// Turns a generation into the JSON chunks of one endpoint. Each pushed string is one event.
pub(crate) trait ChunkFormatter: Send + Sync + 'static {
    /// The chunks sent before any token (chat: the role).
    fn start(&mut self, out: &mut Vec<String>);
    /// A piece of generated text (never empty) and the log-probabilities of the tokens that
    /// made it (when asked for).
    fn text(&mut self, text: &str, logprobs: Vec<Scored>, out: &mut Vec<String>);
    /// The last chunks: remaining text, `finish_reason`, then usage when asked for.
    fn finish(&mut self, finish: Finish, out: &mut Vec<String>);
}

/// A `text/event-stream` body: `data: {chunk}\n\n` per chunk, an error event if the engine
/// fails, and `data: [DONE]\n\n` at the end. Owns the engine's receiver, so dropping it (the
/// client disconnected) aborts the request.
pub(crate) struct SseStream {
    rx: Option<UnboundedReceiver<GenerationEvent>>,
    fmt: Box<dyn ChunkFormatter>,
    tracker: Tracker,
    chunks: Vec<String>,
    buf: String,
    /// Log-probabilities of tokens whose text is still held back.
    logprobs: Vec<Scored>,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseStream")
            .field("open", &self.rx.is_some())
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}

impl SseStream {
    pub fn new(
        rx: UnboundedReceiver<GenerationEvent>,
        mut fmt: Box<dyn ChunkFormatter>,
        tracker: Tracker,
    ) -> Self {
        let mut chunks = Vec::new();
        fmt.start(&mut chunks);
        let mut s = Self {
            rx: Some(rx),
            fmt,
            tracker,
            chunks,
            buf: String::new(),
            logprobs: Vec::new(),
        };
        s.flush_chunks();
        s
    }

    fn flush_chunks(&mut self) {
        for chunk in self.chunks.drain(..) {
            self.buf.push_str("data: ");
            self.buf.push_str(&chunk);
            self.buf.push_str("\n\n");
        }
    }

    fn end(&mut self, error: Option<ApiError>) {
        if let Some(e) = error {
            self.chunks.push(e.to_json().to_string());
        }
        self.chunks.push("[DONE]".to_owned());
        self.rx = None;
    }

    pub fn is_done(&self) -> bool {
        self.rx.is_none() && self.buf.is_empty()
    }

    /// The next bytes to send; `None` after `[DONE]`.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if !self.buf.is_empty() {
                return Poll::Ready(Some(Bytes::from(std::mem::take(&mut self.buf))));
            }
            let Some(rx) = self.rx.as_mut() else {
                return Poll::Ready(None);
            };
            match std::task::ready!(rx.poll_recv(cx)) {
                Some(GenerationEvent::Token { id, text, logprob }) => {
                    self.tracker.token();
                    self.logprobs.extend(logprob.map(|l| (id, l)));
                    if !text.is_empty() {
                        let lp = std::mem::take(&mut self.logprobs);
                        self.fmt.text(&text, lp, &mut self.chunks);
                    }
                }
                Some(GenerationEvent::Finished {
                    text,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    ..
                }) => {
                    self.tracker.finished();
                    let finish = Finish {
                        text,
                        reason,
                        usage: Usage::new(prompt_tokens, completion_tokens),
                        logprobs: std::mem::take(&mut self.logprobs),
                    };
                    self.fmt.finish(finish, &mut self.chunks);
                    self.end(None);
                }
                Some(GenerationEvent::Failed(e)) => self.end(Some(e.into())),
                None => self.end(Some(ended_early())),
            }
            self.flush_chunks();
        }
    }
}

/// Serializes a response type (these never fail to serialize).
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
