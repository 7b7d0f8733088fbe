//! The one place where errors become HTTP statuses and OpenAI-shaped JSON bodies
//! (`{"error":{"message","type","param","code"}}`).

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use super::body::Body;
use crate::api::EngineError;

/// The largest request body the server reads (413 above it).
pub(crate) const BODY_LIMIT: usize = 4 << 20;

const INVALID: &str = "invalid_request_error";

/// An error answered to the client: a status and the OpenAI error object.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
    /// The `Allow` header of a 405.
    allow: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            allow: None,
        }
    }

    pub(crate) fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 400 about one field; `message` should start with the field's path.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID, message).with_param(param)
    }

    /// 400 `"{path}: expected {what}"`.
    pub fn expected(path: &str, what: &str) -> Self {
        Self::invalid(path, format!("{path}: expected {what}"))
    }

    /// 400 for a parameter this server does not support (e.g. `n: 2`, `logprobs: true`).
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(param, message).with_code("unsupported_parameter")
    }

    /// 400 for a body that is not JSON; serde_json's message names the line and column.
    pub fn bad_json(e: &serde_json::Error) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            INVALID,
            format!("the request body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")
    }

    /// 400 for a request body that could not be read (the client went away or sent garbage).
    pub fn unreadable_body(e: &dyn std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            INVALID,
            format!("could not read the request body: {e}"),
        )
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(param, message).with_code("context_length_exceeded")
    }

    pub fn not_found(method: &http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID,
            format!("Invalid URL ({method} {path})"),
        )
        .with_code("not_found")
    }

    pub fn method_not_allowed(method: &http::Method, path: &str, allow: &'static str) -> Self {
        let mut e = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            INVALID,
            format!("method {method} is not allowed on {path} (allowed: {allow})"),
        )
        .with_code("method_not_allowed");
        e.allow = Some(allow);
        e
    }

    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID,
            format!("the request body is larger than {} MiB", BODY_LIMIT >> 20),
        )
        .with_code("request_too_large")
    }

    /// 500 for a failure inside the server or the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
            .with_code("internal_error")
    }

    /// The JSON body: `{"error":{"message","type","param","code"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    pub fn into_response(self) -> Response<Body> {
        let mut resp = super::json_response(self.status, &self.to_json());
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Invalid { code, message } => {
                Self::new(StatusCode::BAD_REQUEST, INVALID, message).with_code(code)
            }
            EngineError::Unavailable(message) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                message,
            )
            .with_code("engine_unavailable"),
            EngineError::Internal(message) => Self::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses_and_codes() {
        let e = ApiError::from(EngineError::Invalid {
            code: "context_length_exceeded",
            message: "too long".into(),
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.to_json(),
            json!({"error": {"message": "too long", "type": "invalid_request_error",
                             "param": null, "code": "context_length_exceeded"}})
        );
        let e = ApiError::from(EngineError::Unavailable("rank 1 down".into()));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.kind, "engine_unavailable");
        assert_eq!(e.code.as_deref(), Some("engine_unavailable"));
        let e = ApiError::from(EngineError::Internal("boom".into()));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.kind, "server_error");
    }

    #[test]
    fn field_errors_name_the_field() {
        let e = ApiError::expected("messages[1].content", "a string");
        assert_eq!(e.message, "messages[1].content: expected a string");
        assert_eq!(e.param.as_deref(), Some("messages[1].content"));
    }
}
