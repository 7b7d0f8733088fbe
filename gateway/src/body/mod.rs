//! The response body type every layer returns: boxed, so upstream streams and the gateway's
//! own JSON answers share one type.

pub mod output;
pub mod stall;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// Errors inside a response body (an upstream that broke off mid-stream).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: the upstream's stream, or a whole answer from the gateway.
pub type GatewayBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Whether a response is a server-sent-event stream.
pub fn is_sse(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A JSON response body.
pub fn json(value: &serde_json::Value) -> GatewayBody {
    full(value.to_string())
}

mod tap;

pub use tap::{Tap, TapBody};
