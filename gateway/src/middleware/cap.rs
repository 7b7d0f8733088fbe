//! Input cap and context-window guard (stack layer 6).
//!
//! - A prompt above `limits.input_tokens_max` is refused: 400 `context_length_exceeded`
//!   naming both numbers.
//! - `max_tokens` (or `max_completion_tokens`) is defaulted to `limits.max_tokens_default`
//!   (shortened to fit the window) and lowered to `limits.max_tokens_max`.
//! - Prompt + `max_tokens` above `limits.context_window` is refused, also with
//!   `context_length_exceeded`.
//!
//! Adds the [`MaxTokens`] extension and writes the effective value into the body; the response
//! carries it in [`MAX_TOKENS_HEADER`], so a lowered `max_tokens` is never silent.

use std::sync::Arc;

use http::Request;
use serde_json::Value;
use sluice_engine::server::prompt::Endpoint;

use super::check::Check;
use super::count::PromptTokens;
use super::parse::Json;
use crate::error::GatewayError;
use crate::policy::{Limits, PolicyStore};

/// The response header that tells the client the completion budget the upstream got: its own
/// `max_tokens`, the policy's default, or `limits.max_tokens_max` where it asked for more.
pub const MAX_TOKENS_HEADER: &str = "x-sluice-max-tokens";

/// The completion budget the upstream gets (a request extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxTokens(pub usize);

/// Enforces the token limits of the policy in force.
#[derive(Clone, Debug)]
pub struct Cap {
    policy: Arc<PolicyStore>,
}

impl Cap {
    pub fn new(policy: Arc<PolicyStore>) -> Self {
        Self { policy }
    }
}

impl Check<Json> for Cap {
    fn check(&self, req: &mut Request<Json>) -> Result<(), GatewayError> {
        let prompt = req
            .extensions()
            .get::<PromptTokens>()
            .map(|p| p.0)
            .ok_or_else(|| GatewayError::Internal("the prompt was not counted".into()))?;
        let policy = self.policy.of(req.extensions());
        let json = req.body_mut();
        let max = apply(
            &policy.policy.limits,
            json.endpoint,
            prompt,
            &mut json.value,
        )?;
        req.extensions_mut().insert(MaxTokens(max));
        Ok(())
    }
}

/// The fields that bound a completion on `endpoint`, the one that rules first: chat takes
/// OpenAI's `max_completion_tokens` over the older `max_tokens`; completions has only
/// `max_tokens`.
fn budget_keys(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        Endpoint::Completions => &["max_tokens"],
    }
}

/// A budget field's value: `None` when absent or null, else a positive integer.
fn asked(body: &Value, key: &str) -> Result<Option<u64>, GatewayError> {
    let bad = |message: String| GatewayError::InvalidRequest {
        param: Some(key.to_owned()),
        code: None,
        message,
    };
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(0) => Err(bad(format!("{key}: must be at least 1"))),
            Some(m) => Ok(Some(m)),
            None => Err(bad(format!("{key}: expected a positive integer"))),
        },
    }
}

/// Checks `prompt` (the token count of `endpoint`'s prompt field) against `limits` and sets
/// the body's completion budget; returns it.
///
/// Every budget field the body names is checked and given the effective value, the one that
/// does not rule included: an upstream that reads the other field (vLLM's completions read only
/// `max_tokens`) can never run past the cap, the window or the token budget charged for it.
/// `max_completion_tokens` on completions is refused: OpenAI's completions have no such field,
/// and an upstream would ignore it.
pub fn apply(
    limits: &Limits,
    endpoint: Endpoint,
    prompt: usize,
    body: &mut Value,
) -> Result<usize, GatewayError> {
    if prompt > limits.input_tokens_max {
        return Err(GatewayError::InputTooLong {
            tokens: prompt,
            limit: limits.input_tokens_max,
            param: endpoint.prompt_param(),
        });
    }
    if endpoint == Endpoint::Completions
        && body
            .get("max_completion_tokens")
            .is_some_and(|v| !v.is_null())
    {
        return Err(GatewayError::InvalidRequest {
            param: Some("max_completion_tokens".to_owned()),
            code: Some("unsupported_parameter".into()),
            message: "max_completion_tokens: not a completions field; use max_tokens".into(),
        });
    }
    let keys = budget_keys(endpoint);
    let mut ruling = None;
    for &key in keys {
        if let Some(m) = asked(body, key)? {
            ruling.get_or_insert((key, m));
        }
    }
    let window = limits.context_window;
    let (key, max) = match ruling {
        Some((key, m)) => (
            key,
            usize::try_from(m)
                .unwrap_or(usize::MAX)
                .min(limits.max_tokens_max),
        ),
        // The default is shortened to fit; an explicit value that does not fit is refused.
        None => (
            keys[keys.len() - 1],
            limits
                .max_tokens_default
                .min(window.saturating_sub(prompt))
                .max(1),
        ),
    };
    if prompt + max > window {
        return Err(GatewayError::ContextWindow {
            prompt,
            max_tokens: max,
            window,
            param: key,
        });
    }
    // Written only where it changes (most requests name a value within the limits).
    if let Value::Object(o) = body {
        for &k in keys {
            match o.get_mut(k) {
                Some(v) if v.as_u64() == Some(max as u64) => {}
                Some(v) if k == key || !v.is_null() => *v = Value::from(max),
                Some(_) => {}
                None if k == key => {
                    o.insert(k.to_owned(), Value::from(max));
                }
                None => {}
            }
        }
    }
    Ok(max)
}

#[cfg(test)]
mod tests;
