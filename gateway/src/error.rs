//! The one place where a refused or failed request becomes an HTTP status, an OpenAI-shaped
//! JSON body (`{"error":{"message","type","param","code"}}`), headers and a log level.
//!
//! Every layer fails with a [`GatewayError`]; the server turns it into a response here and
//! nowhere else. `docs/api.md` lists each condition.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::body::{self, GatewayBody};
use crate::policy::Class;

/// Why a request's deadline cannot be met: the message says which, so that a refusal never
/// quotes a prediction inside the deadline without its reason.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unmeetable {
    /// The prediction, lengthened by `margin` for how late recent first tokens came, passes
    /// the deadline.
    Late { margin: Duration },
    /// Admitting it would make a request already waiting miss that request's own deadline.
    WouldDisplace,
    /// Admitting it would take the room held for a request told to come back before it
    /// (`crate::middleware::admission`'s holds), which would then miss its deadline.
    Held,
}

impl Unmeetable {
    fn explain(self, predicted: Duration) -> String {
        let predicted = ms(predicted);
        match self {
            Self::Late { margin } if ms(margin).is_zero() => {
                format!("the predicted time to first token is {predicted:?}")
            }
            Self::Late { margin } => format!(
                "the predicted time to first token is {predicted:?}, {:?} with the margin for \
                 how late recent first tokens came",
                ms(predicted + margin)
            ),
            Self::WouldDisplace => format!(
                "its predicted time to first token is {predicted:?}, but admitting it would make \
                 a request already waiting miss its own deadline"
            ),
            Self::Held => format!(
                "its predicted time to first token is {predicted:?}, but its room is held for a \
                 request told to come back before it"
            ),
        }
    }
}

/// Why a deadline in force is later than the one asked (the class's, or lower by header): the
/// prompt's own prediction on an idle upstream, `alone`, already passes `asked`, so the request
/// is held to a multiple of `alone` instead of being refused forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stretched {
    pub asked: Duration,
    /// Whether `asked` is the request's own (`x-sluice-ttft-deadline-ms`), not its class's.
    pub by_request: bool,
    pub alone: Duration,
}

impl Stretched {
    /// What a refusal says of the deadline it quotes (empty when it is the one asked).
    fn explain(stretched: Option<Self>) -> String {
        stretched.map_or_else(String::new, |s| {
            let whose = if s.by_request {
                "the request asked for"
            } else {
                "of its class"
            };
            format!(
                " (stretched from the {:?} {whose}: this prompt alone is predicted to take {:?})",
                ms(s.asked),
                ms(s.alone)
            )
        })
    }
}

/// What a `deadline_unmeetable` adds when its `Retry-After` is the line's cap.
const LINE_FULL: &str = " at the earliest: the requests told to come back before this one fill \
                          more than that (the server is over capacity)";

/// The `Retry-After` header's value for a wait of `after`: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(after: Duration) -> u64 {
    after.as_secs_f64().ceil().max(1.0) as u64
}

/// `d` to the millisecond, for messages (`4.143s`, not `4.143046706s`).
fn ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why the gateway answered a request itself instead of with the upstream's response.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GatewayError {
    #[error("no API key given (send `Authorization: Bearer <key>`)")]
    MissingApiKey,
    #[error("the API key is not valid")]
    InvalidApiKey,
    #[error(
        "rate limit reached for {tenant}: {rate} requests per second; retry after {retry_after:?}"
    )]
    RateLimited {
        tenant: String,
        rate: f64,
        retry_after: Duration,
    },
    #[error("token budget of {tenant} reached: {budget} tokens per minute, this request needs {needed}; retry after {retry_after:?}")]
    TokenBudget {
        tenant: String,
        budget: u64,
        needed: u64,
        retry_after: Duration,
    },
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("could not read the request body: {0}")]
    UnreadableBody(String),
    #[error("the request body stalled: no bytes for {0:?}")]
    BodyTimeout(Duration),
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// A field is wrong (the message starts with its path).
    #[error("{message}")]
    InvalidRequest {
        param: Option<String>,
        code: Option<String>,
        message: String,
    },
    #[error("the prompt has {tokens} tokens, more than the {limit} this server accepts (limits.input_tokens_max)")]
    InputTooLong {
        tokens: usize,
        limit: usize,
        /// The request field that holds the prompt (`messages` or `prompt`).
        param: &'static str,
    },
    #[error("the prompt has {prompt} tokens and {param} is {max_tokens}: {} in all, more than the context window of {window} tokens", prompt + max_tokens)]
    ContextWindow {
        prompt: usize,
        max_tokens: usize,
        window: usize,
        param: &'static str,
    },
    #[error("the server is at capacity ({} queue full); retry after {retry_after:?}", class.as_str())]
    Overloaded { class: Class, retry_after: Duration },
    #[error("the {} TTFT deadline of {:?}{} cannot be met: {}; retry after {:?}{}", class.as_str(), ms(*deadline), Stretched::explain(*stretched), why.explain(*predicted), ms(*retry_after), if *line_full { LINE_FULL } else { "" })]
    DeadlineUnmeetable {
        class: Class,
        /// Arrival → first token as the model predicts it, without the margin.
        predicted: Duration,
        /// The deadline in force: the one asked, or later where `stretched` says why.
        deadline: Duration,
        stretched: Option<Stretched>,
        retry_after: Duration,
        why: Unmeetable,
        /// The requests told to come back before it fill more than the longest wait the
        /// gateway tells: `retry_after` is that cap, not when it would fit.
        line_full: bool,
    },
    #[error("every engine replica is busy (it answered 503); retry after {retry_after:?}")]
    UpstreamBusy { retry_after: Duration },
    #[error("waited {waited:?} in the queue without getting a slot (admission.queue_wait_max)")]
    QueueTimeout { waited: Duration },
    #[error("the engine is not available: {0}")]
    EngineUnavailable(String),
    /// `[shared] fail = "closed"` and Redis is unreachable or slower than `shared.timeout`.
    #[error("the state shared between gateways is unavailable ({0}); [shared] fail = \"closed\" refuses requests until it is back")]
    SharedStateUnavailable(String),
    #[error("the upstream failed: {0}")]
    Upstream(String),
    #[error("the upstream sent nothing for {0:?}")]
    UpstreamTimeout(Duration),
    #[error("Invalid URL ({method} {path})")]
    NotFound { method: String, path: String },
    #[error("method {method} is not allowed on {path} (allowed: {allow})")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

/// How loudly a refusal is logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// The client's mistake.
    Debug,
    /// Policy doing its job (rate limits, queue timeouts). Shedding is logged at debug: under
    /// overload it happens thousands of times a second, and `/metrics` and the shedding alert
    /// already say it.
    Info,
    /// Something upstream or inside is wrong.
    Warn,
    Error,
}

/// What a [`GatewayError`] looks like on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorClass {
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code` (also the metrics label of the outcome).
    pub code: &'static str,
    pub level: LogLevel,
}

const INVALID: &str = "invalid_request_error";

impl GatewayError {
    /// Status, type, code and log level of each condition: the table in `docs/api.md`.
    pub fn class(&self) -> ErrorClass {
        use GatewayError::*;
        use LogLevel::*;
        let (status, kind, code, level) = match self {
            MissingApiKey | InvalidApiKey => {
                (StatusCode::UNAUTHORIZED, INVALID, "invalid_api_key", Info)
            }
            RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "rate_limit_exceeded",
                Info,
            ),
            TokenBudget { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "tokens_per_minute_exceeded",
                Info,
            ),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                INVALID,
                "request_too_large",
                Debug,
            ),
            UnreadableBody(_) => (StatusCode::BAD_REQUEST, INVALID, "unreadable_body", Debug),
            BodyTimeout(_) => (
                StatusCode::REQUEST_TIMEOUT,
                INVALID,
                "request_timeout",
                Debug,
            ),
            InvalidJson(_) => (StatusCode::BAD_REQUEST, INVALID, "invalid_json", Debug),
            InvalidRequest { .. } => (StatusCode::BAD_REQUEST, INVALID, "invalid_request", Debug),
            InputTooLong { .. } | ContextWindow { .. } => (
                StatusCode::BAD_REQUEST,
                INVALID,
                "context_length_exceeded",
                Debug,
            ),
            Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "overloaded",
                Debug,
            ),
            DeadlineUnmeetable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "deadline_unmeetable",
                Debug,
            ),
            UpstreamBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "overloaded",
                Info,
            ),
            QueueTimeout { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "queue_timeout",
                Info,
            ),
            EngineUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                "engine_unavailable",
                Warn,
            ),
            SharedStateUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "shared_state_unavailable",
                "shared_state_unavailable",
                Warn,
            ),
            Upstream(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "upstream_error",
                Warn,
            ),
            UpstreamTimeout(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                "upstream_timeout",
                Warn,
            ),
            NotFound { .. } => (StatusCode::NOT_FOUND, INVALID, "not_found", Debug),
            MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                INVALID,
                "method_not_allowed",
                Debug,
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                Error,
            ),
        };
        ErrorClass {
            status,
            kind,
            code,
            level,
        }
    }

    /// The `code` in the body: the request's own code when a field error carries one.
    pub fn code(&self) -> &str {
        match self {
            Self::InvalidRequest { code: Some(c), .. } => c,
            _ => self.class().code,
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            Self::InvalidRequest { param, .. } => param.as_deref(),
            Self::InputTooLong { param, .. } | Self::ContextWindow { param, .. } => Some(param),
            _ => None,
        }
    }

    /// How long the client should wait before trying again, when the policy knows.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. }
            | Self::TokenBudget { retry_after, .. }
            | Self::Overloaded { retry_after, .. }
            | Self::DeadlineUnmeetable { retry_after, .. }
            | Self::UpstreamBusy { retry_after } => Some(*retry_after),
            Self::QueueTimeout { .. }
            | Self::EngineUnavailable(_)
            | Self::SharedStateUnavailable(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> serde_json::Value {
        let class = self.class();
        json!({
            "error": {
                "message": self.to_string(),
                "type": class.kind,
                "param": self.param(),
                "code": self.code(),
            }
        })
    }

    /// The response: status, JSON body, `Retry-After` (whole seconds, at least 1) and `Allow`.
    pub fn into_response(self) -> Response<GatewayBody> {
        let class = self.class();
        let body = Bytes::from(self.to_json().to_string());
        let mut resp = Response::new(body::full(body));
        *resp.status_mut() = class.status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(after) = self.retry_after() {
            h.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(after)),
            );
        }
        if let Self::MethodNotAllowed { allow, .. } = self {
            h.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }

    /// Logs the refusal at its level.
    pub fn log(&self, request_id: &str) {
        let code = self.code();
        match self.class().level {
            LogLevel::Debug => tracing::debug!(request_id, code, "{self}"),
            LogLevel::Info => tracing::info!(request_id, code, "{self}"),
            LogLevel::Warn => tracing::warn!(request_id, code, "{self}"),
            LogLevel::Error => tracing::error!(request_id, code, "{self}"),
        }
    }
}

impl From<sluice_engine::server::prompt::PromptError> for GatewayError {
    fn from(e: sluice_engine::server::prompt::PromptError) -> Self {
        if e.internal {
            Self::Internal(e.message)
        } else {
            Self::InvalidRequest {
                param: e.param,
                code: e.code,
                message: e.message,
            }
        }
    }
}

#[cfg(test)]
mod tests;
