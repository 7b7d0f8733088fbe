//! The slot's lifetime: held until the response's last byte is sent or the client goes away —
//! not just until the headers (what tower's `ConcurrencyLimit` does), since an LLM response
//! streams for seconds to minutes after its headers.

use std::sync::Arc;

use http_body_util::BodyExt;

use super::queue::Permit;
use crate::body::{output, BoxError, GatewayBody, Tap, TapBody};
use crate::telemetry::Metrics;

/// `inner`, holding `permit` until it ends, fails or is dropped.
pub fn slot_body(inner: GatewayBody, permit: Permit, metrics: Arc<Metrics>) -> GatewayBody {
    TapBody::new(
        inner,
        Slot {
            permit: Some(permit),
            metrics,
            first: false,
        },
    )
    .boxed_unsync()
}

/// The held slot; its first output ends the prefill and times it (its first output, not its
/// first bytes: see [`output`]), each event with output counts as a token (for the tenant's
/// fair share and the decode fit); freeing it records the upstream duration (slot granted →
/// last byte).
#[derive(Debug)]
struct Slot {
    permit: Option<Permit>,
    metrics: Arc<Metrics>,
    /// The first token went by (the prefill budget was given back).
    first: bool,
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
    fn data(&mut self, data: &bytes::Bytes) {
        let Some(p) = &self.permit else { return };
        let out = output::scan(data);
        if !self.first && out.past_prefill() {
            self.first = true;
            if let Some(pair) = p.first_token() {
                self.metrics
                    .ttft_prediction_error
                    .observe_value(pair.relative_error().abs());
            }
        }
        if out.tokens > 0 {
            p.tokens(out.tokens);
        }
    }

    fn ended(&mut self, _result: Result<(), &BoxError>) {
        self.release();
    }

    fn dropped(&mut self, _complete: bool) {
        self.release();
    }
}
