//! The slot's lifetime: held until the response's last byte is sent or the client goes away —
//! not just until the headers (what tower's `ConcurrencyLimit` does), since an LLM response
//! streams for seconds to minutes after its headers.

use std::sync::Arc;

use http_body_util::BodyExt;

use super::queue::Permit;
use crate::body::{BoxError, GatewayBody, Tap, TapBody};
use crate::telemetry::Metrics;

/// `inner`, holding `permit` until it ends, fails or is dropped.
pub fn slot_body(inner: GatewayBody, permit: Permit, metrics: Arc<Metrics>) -> GatewayBody {
    TapBody::new(
        inner,
        Slot {
            permit: Some(permit),
            metrics,
        },
    )
    .boxed_unsync()
}

/// The held slot; freeing it records the upstream duration (slot granted → last byte).
#[derive(Debug)]
struct Slot {
    permit: Option<Permit>,
    metrics: Arc<Metrics>,
}

impl Slot {
    fn release(&mut self) {
        if let Some(p) = self.permit.take() {
            self.metrics
                .upstream_duration
                .observe(p.granted_at().elapsed());
        }
    }
}

impl Tap for Slot {
    fn ended(&mut self, _result: Result<(), &BoxError>) {
        self.release();
    }

    fn dropped(&mut self, _complete: bool) {
        self.release();
    }
}
