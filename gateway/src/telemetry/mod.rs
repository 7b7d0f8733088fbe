//! What the gateway measures: request outcomes (every accepted request ends in exactly one),
//! queue time apart from upstream time, policy reloads; rendered as Prometheus text.
//!
//! - [`metrics`]: the counters and histograms.
//! - [`outcome`]: how a request ended, and the body that records it at its end.

pub mod metrics;
pub mod outcome;

pub use metrics::Metrics;
pub use outcome::{Outcome, OutcomeBody, OutcomeGuard};
