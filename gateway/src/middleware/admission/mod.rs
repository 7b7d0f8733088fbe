//! Admission control (stack layer 7): at most `active_max` requests active upstream, the rest
//! in a bounded FIFO queue, shed when it is full.
//!
//! - [`queue`]: the state and its rules (classes, the heavy-input lane).
//! - [`wait`]: waiting for a slot, with the deadline and cancellation.
//! - [`service`]: takes the slot, calls the upstream, puts the slot in the response body.
//! - [`slot`]: the response body holds the slot until its end.
//! - [`shed`]: readiness turned into an immediate `overloaded`.

mod drain;
mod layer;
mod queue;
mod service;
mod shed;
mod slot;
mod wait;

#[cfg(test)]
mod tests;

pub use layer::AdmissionLayer;
pub use queue::{Admission, Limits, Permit, Snapshot, Ticket};
pub use service::{Admit, QueueTime, QUEUE_MS_HEADER};
pub use shed::Shed;
pub use slot::slot_body;
pub use wait::{acquire, Admitted};
