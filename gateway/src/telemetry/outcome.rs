//! How a request ended. Every request the stack accepts ends in exactly one outcome, recorded
//! once: by the error that refused it, by its response body's end, or — when the client went
//! away first — by the guard or body dropped unfinished.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};

use super::Metrics;
use crate::body::{BoxError, GatewayBody};
use crate::error::GatewayError;

/// The ways a request ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The whole response was sent, with a success status.
    Completed,
    /// Refused with an error response the client can act on (4xx: auth, limits, bad input).
    Rejected,
    /// Shed by admission (503 `overloaded`).
    Shed,
    /// Waited past `queue_wait_max` (503 `queue_timeout`).
    TimedOut,
    /// The client went away first.
    Cancelled,
    /// The upstream or the gateway failed (5xx other than shedding, or a broken stream).
    Failed,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Self::Completed,
        Self::Rejected,
        Self::Shed,
        Self::TimedOut,
        Self::Cancelled,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Rejected => "rejected",
            Self::Shed => "shed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }

    /// The outcome of a refusal.
    pub fn of_error(e: &GatewayError) -> Self {
        match e {
            GatewayError::Overloaded { .. } => Self::Shed,
            GatewayError::QueueTimeout { .. } => Self::TimedOut,
            e if e.class().status.is_client_error() => Self::Rejected,
            _ => Self::Failed,
        }
    }

    /// The outcome of a response with `status` whose body was sent whole.
    pub fn of_status(status: StatusCode) -> Self {
        if status.is_success() {
            Self::Completed
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            // The upstream shed it (an engine with its own queue limit).
            Self::Shed
        } else if status.is_client_error() {
            Self::Rejected
        } else {
            Self::Failed
        }
    }
}

/// Records `Cancelled` if dropped before [`OutcomeGuard::disarm`]: the client went away while
/// its request was still being admitted or waiting for the upstream's headers.
#[derive(Debug)]
pub struct OutcomeGuard {
    metrics: Option<Arc<Metrics>>,
}

impl OutcomeGuard {
    /// Counts the request as accepted.
    pub fn accept(metrics: Arc<Metrics>) -> Self {
        metrics.accepted();
        Self {
            metrics: Some(metrics),
        }
    }

    /// The request's fate is now someone else's to record.
    pub fn disarm(mut self) -> Arc<Metrics> {
        // `metrics` is always set until here: `disarm` consumes the guard.
        self.metrics.take().unwrap_or_default()
    }
}

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        if let Some(m) = self.metrics.take() {
            m.ended(Outcome::Cancelled);
        }
    }
}

/// A response body that records the request's outcome when it ends, fails or is dropped.
#[derive(Debug)]
pub struct OutcomeBody {
    inner: GatewayBody,
    status: StatusCode,
    metrics: Option<Arc<Metrics>>,
}

impl OutcomeBody {
    pub fn new(inner: GatewayBody, status: StatusCode, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            status,
            metrics: Some(metrics),
        }
    }

    fn end(&mut self, outcome: Outcome) {
        if let Some(m) = self.metrics.take() {
            m.ended(outcome);
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
                let o = Outcome::of_status(self.status);
                self.end(o);
            }
            Poll::Ready(Some(Err(_))) => self.end(Outcome::Failed),
            _ => {}
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
        let outcome = if self.inner.is_end_stream() {
            Outcome::of_status(self.status)
        } else {
            Outcome::Cancelled
        };
        self.end(outcome);
    }
}
