//! How a request ended. Every request the stack accepts ends in exactly one outcome, recorded
//! once: by the error that refused it, by its response body's end, or — when the client went
//! away first — by the guard or the body dropped unfinished.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};

use super::record::RequestRecord;
use super::usage::UsageScanner;
use super::Metrics;
use crate::body::{BoxError, GatewayBody};
use crate::error::GatewayError;

/// The ways a request ends (the `outcome` label of `sluice_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The whole response was sent, with a success status.
    Ok,
    /// Refused with an error the client can act on (4xx: auth, limits, bad input).
    Rejected,
    /// Shed by admission (503 `overloaded`), or by an upstream's own 503.
    Shed,
    /// Waited past `queue_wait_max` (503 `queue_timeout`).
    Timeout,
    /// The client went away first.
    Cancelled,
    /// The upstream or the gateway failed (5xx other than shedding, or a broken stream).
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Self::Ok,
        Self::Rejected,
        Self::Shed,
        Self::Timeout,
        Self::Cancelled,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Shed => "shed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }

    /// The outcome of a refusal.
    pub fn of_error(e: &GatewayError) -> Self {
        match e {
            GatewayError::Overloaded { .. } => Self::Shed,
            GatewayError::QueueTimeout { .. } => Self::Timeout,
            e if e.class().status.is_client_error() => Self::Rejected,
            _ => Self::Error,
        }
    }

    /// The outcome of a response with `status` whose body was sent whole.
    pub fn of_status(status: StatusCode) -> Self {
        if status.is_success() {
            Self::Ok
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            Self::Shed
        } else if status.is_client_error() {
            Self::Rejected
        } else {
            Self::Error
        }
    }
}

/// The `code` label of an upstream response with `status`.
fn status_code_label(status: StatusCode) -> &'static str {
    if status.is_success() {
        "none"
    } else {
        "upstream_error"
    }
}

/// Records `Cancelled` if dropped before [`OutcomeGuard::disarm`]: the client went away while
/// its request was still being admitted or waiting for the upstream's headers.
#[derive(Debug)]
pub struct OutcomeGuard {
    end: Option<(Arc<Metrics>, RequestRecord)>,
}

impl OutcomeGuard {
    /// Counts the request as accepted.
    pub fn accept(metrics: Arc<Metrics>, record: RequestRecord) -> Self {
        metrics.accepted();
        Self {
            end: Some((metrics, record)),
        }
    }

    /// The request ended with an error response.
    pub fn refused(mut self, e: &GatewayError) {
        if let Some((m, r)) = self.end.take() {
            let facts = r.facts();
            m.ended(Outcome::of_error(e), e.code(), facts.class);
        }
    }

    /// The response started: its body records the end.
    pub fn respond(mut self, body: GatewayBody, status: StatusCode) -> OutcomeBody {
        let (metrics, record) = match self.end.take() {
            Some(end) => end,
            None => (
                Arc::default(),
                RequestRecord::new(tokio::time::Instant::now()),
            ),
        };
        OutcomeBody {
            inner: body,
            status,
            end: Some((metrics, record)),
            usage: UsageScanner::default(),
            seen_data: false,
            stream_error: false,
        }
    }
}

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        if let Some((m, r)) = self.end.take() {
            m.ended(Outcome::Cancelled, "none", r.facts().class);
        }
    }
}

/// A response body that records the request's outcome, durations and tokens when it ends,
/// fails or is dropped.
#[derive(Debug)]
pub struct OutcomeBody {
    inner: GatewayBody,
    status: StatusCode,
    end: Option<(Arc<Metrics>, RequestRecord)>,
    usage: UsageScanner,
    seen_data: bool,
    /// The stream carried an error event (`data: {"error": ...}`): it failed, even if it then
    /// ended cleanly with `[DONE]`.
    stream_error: bool,
}

impl OutcomeBody {
    /// The outcome and code of a body that ended cleanly.
    fn clean_end(&self) -> (Outcome, &'static str) {
        if self.stream_error {
            (Outcome::Error, "stream_error")
        } else {
            (
                Outcome::of_status(self.status),
                status_code_label(self.status),
            )
        }
    }

    fn end(&mut self, outcome: Outcome, code: &str) {
        let Some((m, r)) = self.end.take() else {
            return;
        };
        let facts = r.facts();
        m.ended(outcome, code, facts.class);
        m.request_duration.observe(facts.arrived.elapsed());
        if let Some(n) = facts.prompt_tokens {
            m.input_tokens.observe_value(n as f64);
        }
        if let Some(n) = self.usage.completion_tokens() {
            m.output_tokens.observe_value(n as f64);
        }
    }
}

impl Body for OutcomeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                let (o, code) = self.clean_end();
                self.end(o, code);
            }
            Poll::Ready(Some(Err(_))) => self.end(Outcome::Error, "upstream_broke_off"),
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    let d = d.clone();
                    if !self.seen_data {
                        self.seen_data = true;
                        if let Some((m, r)) = &self.end {
                            m.time_to_first_token.observe(r.facts().arrived.elapsed());
                        }
                    }
                    self.usage.push(&d);
                    if d.starts_with(b"data: {\"error\"") {
                        self.stream_error = true;
                    }
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for OutcomeBody {
    fn drop(&mut self) {
        // A body that is complete but was never polled to its end (hyper stops once it has
        // sent `Content-Length` bytes) ended normally; otherwise the client left mid-stream.
        if self.inner.is_end_stream() {
            let (o, code) = self.clean_end();
            self.end(o, code);
        } else {
            self.end(Outcome::Cancelled, "none");
        }
    }
}
