//! Admission control (stack layer 7): at most `active_max` requests active upstream and
//! `prefill_tokens_max` prompt tokens in prefill, the rest in a bounded queue (shed when it is
//! full), each request admitted only if its predicted time to first token meets its deadline.
//!
//! - [`queue`]: the state and its rules (classes, the heavy-input lane, the prefill budget).
//! - [`predictive`]: the predicted time to first token, deadlines, and the cost model's
//!   refit from every stream ([`flight`] follows each).
//! - [`fair`]: the virtual token counters that order a class's tenants.
//! - [`line`]: the `Retry-After` of a refusal, a place in line behind those refused before it.
//! - [`wait`]: waiting for a slot, with the deadline and cancellation.
//! - [`service`]: takes the slot, calls the upstream, puts the slot in the response body.
//! - [`slot`]: the response body holds the slot until its end; [`output`] tells which of its
//!   pieces carry generated tokens.
//! - [`shed`]: readiness turned into an immediate `overloaded`.

mod drain;
mod fair;
mod flight;
mod hold;
mod layer;
mod line;
mod predictive;
mod queue;
mod service;
mod shed;
mod slot;
mod wait;

#[cfg(test)]
mod agree_tests;
#[cfg(test)]
mod predictive_tests;
#[cfg(test)]
mod replay_tests;
#[cfg(test)]
mod tests;

pub use layer::AdmissionLayer;
pub use predictive::PredictionView;
pub use queue::{Admission, Limits, Permit, Snapshot, Ticket, UpstreamStart};
pub use service::{
    Admit, QueueTime, DEADLINE_MS_HEADER, PREDICTED_TTFT_MS_HEADER, QUEUE_MS_HEADER,
};
pub use shed::Shed;
pub use slot::{slot_body, WRITE_STALL};
pub use wait::{acquire, Admitted};
