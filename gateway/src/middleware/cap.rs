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
        let policy = self.policy.current();
        let json = req.body_mut();
        let param = json.endpoint.prompt_param();
        let max = apply(&policy.policy.limits, param, prompt, &mut json.value)?;
        req.extensions_mut().insert(MaxTokens(max));
        Ok(())
    }
}

/// Checks `prompt` (the token count of the body's field `prompt_param`) against `limits` and
/// sets the body's completion budget; returns it.
pub fn apply(
    limits: &Limits,
    prompt_param: &'static str,
    prompt: usize,
    body: &mut Value,
) -> Result<usize, GatewayError> {
    if prompt > limits.input_tokens_max {
        return Err(GatewayError::InputTooLong {
            tokens: prompt,
            limit: limits.input_tokens_max,
            param: prompt_param,
        });
    }
    let window = limits.context_window;
    let key = if body
        .get("max_completion_tokens")
        .is_some_and(|v| !v.is_null())
    {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let asked = match body.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| GatewayError::InvalidRequest {
            param: Some(key.to_owned()),
            code: None,
            message: format!("{key}: expected a positive integer"),
        })?),
    };
    let max = match asked {
        Some(0) => {
            return Err(GatewayError::InvalidRequest {
                param: Some(key.to_owned()),
                code: None,
                message: format!("{key}: must be at least 1"),
            })
        }
        Some(m) => usize::try_from(m)
            .unwrap_or(usize::MAX)
            .min(limits.max_tokens_max),
        // The default is shortened to fit; an explicit value that does not fit is refused.
        None => limits
            .max_tokens_default
            .min(window.saturating_sub(prompt))
            .max(1),
    };
    if prompt + max > window {
        return Err(GatewayError::ContextWindow {
            prompt,
            max_tokens: max,
            window,
            param: if key == "max_tokens" {
                "max_tokens"
            } else {
                "max_completion_tokens"
            },
        });
    }
    // Written only when it changes (most requests name a value within the limits).
    if let Value::Object(o) = body {
        match o.get_mut(key) {
            Some(v) if v.as_u64() == Some(max as u64) => {}
            Some(v) => *v = Value::from(max),
            None => {
                o.insert(key.to_owned(), Value::from(max));
            }
        }
    }
    Ok(max)
}

#[cfg(test)]
mod tests;
