//! Forwarding to the upstream (stack layer 8, the innermost service): the parsed request goes
//! out as JSON with its unused fields unchanged, and the upstream's response streams back
//! chunk by chunk as it arrives.
//!
//! - [`upstream`]: where requests go (the bundled engine, or OpenAI-compatible URLs).
//! - [`service`]: the forwarding service.

mod idle;
mod service;
pub mod upstream;

#[cfg(test)]
mod tests;

pub use service::{Forward, HttpClient};
pub use upstream::{BundledUpstream, StaticUpstream, Target, Upstream};
