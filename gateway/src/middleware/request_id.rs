//! Request id, W3C trace context and rescue (stack layer 1, the outermost).
//!
//! - Adds [`RequestId`] (the client's `x-request-id` when it is sane, else a new one) and
//!   [`RequestTrace`] (the caller's trace from `traceparent`, or a new one, with the gateway's
//!   own span id) to the request, and the [`RequestRecord`] the spans are built from.
//! - Turns every [`GatewayError`] from the layers below into its response (through
//!   [`GatewayError::into_response`], the one mapping) and logs it. A panic below (a bug) is
//!   caught and answered as 500 `internal_error`, so no accepted request goes unanswered.
//! - Sets `x-request-id` and `traceparent` on every response.
//! - Counts the request as accepted, and records how it ends ([`crate::telemetry::Outcome`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use sluice_engine::error::caught;
use sluice_engine::trace::new_id;
use tower::{Layer, Service, ServiceExt};

use crate::body::GatewayBody;
use crate::error::GatewayError;
use crate::telemetry::spans::{hex_into, traceparent};
use crate::telemetry::{Metrics, OutcomeGuard, RequestRecord, RequestTrace};
use crate::BoxFuture;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The request's id (an extension): printable ASCII, at most 128 bytes, kept as the header
/// value it is sent in (the client's own, shared, when it sent a sane one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The client's `x-request-id` when it is sane, else a new random one (32 hex digits).
    fn of<B>(req: &Request<B>) -> Self {
        let sane = |v: &&HeaderValue| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= 128 && b.iter().all(u8::is_ascii_graphic)
        };
        match req.headers().get(REQUEST_ID_HEADER).filter(sane) {
            Some(v) => Self(v.clone()),
            None => {
                let mut hex = [0u8; 32];
                hex_into(&new_id::<16>(), &mut hex);
                Self(HeaderValue::from_bytes(&hex).expect("hex digits are a header value"))
            }
        }
    }

    pub fn as_str(&self) -> &str {
        // Only printable ASCII gets in (see `of`).
        self.0.to_str().unwrap_or_default()
    }

    /// The id as a header value.
    pub fn header(&self) -> HeaderValue {
        self.0.clone()
    }
}

/// The layer.
#[derive(Clone, Debug, Default)]
pub struct RequestIdLayer {
    metrics: Arc<Metrics>,
}

impl RequestIdLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service.
#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B> Service<Request<B>> for RequestIdService<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<GatewayBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is decided per request, below (a refusal is an answer, not an error).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = RequestId::of(&req);
        let trace = RequestTrace::from_header(
            req.headers()
                .get("traceparent")
                .and_then(|v| v.to_str().ok()),
        );
        req.extensions_mut().insert(id.clone());
        req.extensions_mut().insert(trace);
        let record = RequestRecord::new(
            tokio::time::Instant::now(),
            trace,
            id.as_str(),
            req.uri().path(),
        );
        req.extensions_mut().insert(record.clone());
        let inner = self.inner.clone();
        let guard = OutcomeGuard::accept(self.metrics.clone(), record);
        Box::pin(async move {
            let answer = caught(inner.oneshot(req))
                .await
                .unwrap_or_else(|panic| Err(panicked(id.as_str(), &panic)));
            let mut resp = match answer {
                Ok(resp) => {
                    let status = resp.status();
                    resp.map(|b| guard.respond(b, status))
                }
                Err(e) => {
                    guard.refused(&e);
                    e.log(id.as_str());
                    e.into_response()
                }
            };
            let h = resp.headers_mut();
            h.insert(REQUEST_ID_HEADER, id.header());
            h.insert("traceparent", traceparent(&trace.span));
            Ok(resp)
        })
    }
}

/// The error a panic below this layer becomes; the panic's message goes to the log only.
fn panicked(request_id: &str, panic: &str) -> GatewayError {
    tracing::error!(request_id, panic, "a request's handling panicked");
    GatewayError::Internal(
        "the gateway failed on this request (logged under its x-request-id)".into(),
    )
}

#[cfg(test)]
mod tests;
