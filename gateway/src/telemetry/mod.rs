//! What the gateway measures: request outcomes (every accepted request ends in exactly one),
//! time waiting for admission apart from time upstream, tokens, policy reloads; rendered as
//! Prometheus text.
//!
//! - [`access`]: the access log, a line a request at its end.
//! - [`metrics`]: the counters and histograms, and `GET /metrics`.
//! - [`outcome`]: how a request ended, and the body that records it at its end.
//! - [`record`]: the facts the layers learn about a request on its way down.
//! - [`spans`]: the request's trace (`gateway.request`, `gateway.queue`, `gateway.upstream`).
//! - [`tenants`]: each tenant's requests and tokens.
//! - [`usage`]: reading the completion-token count out of a response.

pub mod access;
#[cfg(test)]
pub(crate) mod captured;
pub mod metrics;
pub mod outcome;
pub mod record;
pub mod spans;
pub mod tenants;
pub mod usage;

pub use metrics::Metrics;
pub use outcome::{Outcome, OutcomeGuard};
pub use record::RequestRecord;
pub use spans::{QueueOutcome, RequestTrace, UpstreamTrace};
pub use usage::UsageScanner;
