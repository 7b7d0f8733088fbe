//! The slot's lifetime: held until the response's last byte is sent or the client goes away —
//! not just until the headers (what tower's `ConcurrencyLimit` does), since an LLM response
//! streams for seconds to minutes after its headers — or until the client stops reading it for
//! [`WRITE_STALL`] ([`crate::body::stall`]): a client that keeps its window shut held its slot
//! for as long as it kept the connection.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::BodyExt;

use super::queue::Permit;
use crate::body::stall::{watch_writes, OnStall};
use crate::body::{output, BoxError, GatewayBody, Tap, TapBody};
use crate::telemetry::Metrics;

/// How long a client may leave a response's next bytes untaken before its slot is given back.
pub const WRITE_STALL: Duration = Duration::from_secs(60);

/// `inner`, holding `permit` until it ends, fails or is dropped, or its client stops reading;
/// then `also` runs too (what the stages inside gave the response to give back).
pub fn slot_body(
    inner: GatewayBody,
    permit: Permit,
    metrics: Arc<Metrics>,
    also: Option<OnStall>,
) -> GatewayBody {
    let held = Arc::new(Mutex::new(Some(permit)));
    let slot = Slot {
        permit: held.clone(),
        metrics: metrics.clone(),
        first: false,
    };
    let body = TapBody::new(inner, slot).boxed_unsync();
    watch_writes(body, WRITE_STALL, move || {
        if take(&held).is_some() {
            tracing::info!(
                "a client took none of its response for {WRITE_STALL:?}: its slot is given back"
            );
        }
        if let Some(also) = also {
            also.run();
        }
    })
}

/// The permit, once.
fn take(held: &Mutex<Option<Permit>>) -> Option<Permit> {
    held.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The held slot; its first output ends the prefill and times it (its first output, not its
/// first bytes: see [`output`]), each event with output counts as a token (for the tenant's
/// fair share and the decode fit); freeing it records the upstream duration (slot granted →
/// last byte).
#[derive(Debug)]
struct Slot {
    permit: Arc<Mutex<Option<Permit>>>,
    metrics: Arc<Metrics>,
    /// The first token went by (the prefill budget was given back).
    first: bool,
}

impl Slot {
    fn release(&mut self) {
        if let Some(p) = take(&self.permit) {
            self.metrics
                .upstream_duration
                .observe(p.granted_at().elapsed());
        }
    }
}

impl Tap for Slot {
    fn data(&mut self, data: &bytes::Bytes) {
        let held = self.permit.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(p) = held.as_ref() else { return };
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
