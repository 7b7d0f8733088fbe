//! The response body that holds the request's slot until the last byte is sent or the client
//! goes away — not just until the headers (what tower's `ConcurrencyLimit` does), since an LLM
//! response streams for seconds to minutes after its headers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::queue::Permit;
use crate::body::{BoxError, GatewayBody};
use crate::telemetry::Metrics;
use std::sync::Arc;

/// A body that frees its slot when it ends, fails, or is dropped; it records the upstream
/// time (slot granted → last byte).
#[derive(Debug)]
pub struct SlotBody {
    inner: GatewayBody,
    permit: Option<Permit>,
    metrics: Arc<Metrics>,
}

impl SlotBody {
    pub fn new(inner: GatewayBody, permit: Permit, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            permit: Some(permit),
            metrics,
        }
    }

    fn release(&mut self) {
        if let Some(p) = self.permit.take() {
            self.metrics
                .upstream_duration
                .observe(p.granted_at().elapsed());
        }
    }
}

impl Drop for SlotBody {
    fn drop(&mut self) {
        self.release();
    }
}

impl Body for SlotBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.release(),
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
