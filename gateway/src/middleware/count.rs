//! Token counting (stack layer 5): the prompt is counted with the model's own tokenizer after
//! the chat template (tools included), built the way the upstream builds it, so the count equals
//! its `usage.prompt_tokens`: with a GGUF, the bundled engine's code (its tools prompt); with a
//! Hugging Face folder (vLLM, SGLang), the request handed to that folder's template as those
//! servers do. Adds the [`PromptTokens`] extension.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use sluice_engine::model::chat::ChatTemplate;
use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::tokenizer::hf::HfTokenizer;
use sluice_engine::model::tokenizer::{Encode, Tokenizer};
use sluice_engine::server::prompt::{prompt_ids, upstream_prompt_ids, Endpoint};
use tower::{Layer, Service, ServiceExt};

use super::parse::Json;
use crate::error::GatewayError;
use crate::telemetry::RequestRecord;
use crate::BoxFuture;

/// The response header with the prompt's token count taken on arrival.
pub const PROMPT_TOKENS_HEADER: &str = "x-sluice-prompt-tokens";

/// Bodies larger than this are counted on the blocking pool, off the I/O threads.
const INLINE_BYTES: usize = 16 << 10;

/// A request's prompt length in tokens (a request extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptTokens(pub usize);

/// Counts the prompt tokens of a parsed request.
pub trait TokenCounter: Send + Sync + 'static {
    /// The prompt's length; an error when the request cannot be rendered into a prompt.
    fn count(&self, endpoint: Endpoint, body: &serde_json::Value) -> Result<usize, GatewayError>;
}

/// Counts with a model's own tokenizer and chat template: a GGUF's, or a Hugging Face
/// `tokenizer.json` with its `tokenizer_config.json` (the files vLLM and SGLang load).
#[derive(Debug)]
pub struct PromptCounter {
    tokenizer: Box<dyn Encode>,
    template: ChatTemplate,
    rendering: Rendering,
}

/// Who builds the prompt from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rendering {
    /// The bundled engine: its own tools prompt, its field checks.
    Engine,
    /// A server that hands the request to the model's template (vLLM, SGLang).
    Template,
}

impl PromptCounter {
    /// Reads the tokenizer and chat template at `path`: a `.gguf` (the weights stay unread),
    /// or a `tokenizer.json` or a directory holding one.
    pub fn open(path: &std::path::Path) -> Result<Self, sluice_engine::Error> {
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if !is_gguf && (path.is_dir() || path.extension().is_some_and(|e| e == "json")) {
            let (tokenizer, template) = HfTokenizer::open(path)?;
            return Ok(Self {
                tokenizer: Box::new(tokenizer),
                template,
                rendering: Rendering::Template,
            });
        }
        let gguf = GgufFile::open(path)?;
        Ok(Self {
            tokenizer: Box::new(Tokenizer::from_gguf(&gguf)?),
            template: ChatTemplate::from_gguf(&gguf)?,
            rendering: Rendering::Engine,
        })
    }
}

impl PromptCounter {
    /// The prompt's length as `rendering` builds it from this tokenizer and template, whichever
    /// the files were opened for (the `request` fuzz target drives both).
    pub(crate) fn count_as(
        &self,
        rendering: Rendering,
        endpoint: Endpoint,
        body: &serde_json::Value,
    ) -> Result<usize, GatewayError> {
        let build = match rendering {
            Rendering::Engine => prompt_ids,
            Rendering::Template => upstream_prompt_ids,
        };
        Ok(build(endpoint, body, self.tokenizer.as_ref(), &self.template)?.len())
    }
}

impl TokenCounter for PromptCounter {
    fn count(&self, endpoint: Endpoint, body: &serde_json::Value) -> Result<usize, GatewayError> {
        self.count_as(self.rendering, endpoint, body)
    }
}

/// The layer.
#[derive(Clone)]
pub struct CountLayer {
    counter: Arc<dyn TokenCounter>,
}

impl std::fmt::Debug for CountLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountLayer").finish_non_exhaustive()
    }
}

impl CountLayer {
    pub fn new(counter: Arc<dyn TokenCounter>) -> Self {
        Self { counter }
    }
}

impl<S> Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            counter: self.counter.clone(),
        }
    }
}

/// Counts, then calls the inner service.
#[derive(Clone)]
pub struct Count<S> {
    inner: S,
    counter: Arc<dyn TokenCounter>,
}

impl<S> std::fmt::Debug for Count<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Count").finish_non_exhaustive()
    }
}

impl<S> Service<Request<Json>> for Count<S>
where
    S: Service<Request<Json>, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = GatewayError;
    type Future = BoxFuture<Result<S::Response, GatewayError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Json>) -> Self::Future {
        let counter = self.counter.clone();
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (mut parts, json) = req.into_parts();
            let (tokens, json) = count(counter, json).await?;
            if let Some(r) = parts.extensions.get::<RequestRecord>() {
                r.set_prompt_tokens(tokens);
            }
            parts.extensions.insert(PromptTokens(tokens));
            inner.oneshot(Request::from_parts(parts, json)).await
        })
    }
}

/// Counts `json`'s prompt, on the blocking pool when the body is large.
async fn count(counter: Arc<dyn TokenCounter>, json: Json) -> Result<(usize, Json), GatewayError> {
    // The size it came in, else a cheap estimate: the serialized length of its strings.
    let size = match json.received {
        0 => approx_len(&json.value),
        n => n,
    };
    if size <= INLINE_BYTES {
        let n = counter.count(json.endpoint, &json.value)?;
        return Ok((n, json));
    }
    tokio::task::spawn_blocking(move || {
        let n = counter.count(json.endpoint, &json.value)?;
        Ok((n, json))
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("token counting failed: {e}")))?
}

/// Roughly how many bytes of text `v` holds.
fn approx_len(v: &serde_json::Value) -> usize {
    use serde_json::Value::*;
    match v {
        String(s) => s.len(),
        Array(a) => a.iter().map(approx_len).sum::<usize>() + a.len(),
        Object(o) => o.iter().map(|(k, v)| k.len() + approx_len(v)).sum(),
        _ => 8,
    }
}

#[cfg(test)]
mod tests;
