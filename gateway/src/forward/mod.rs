//! Forwarding to the upstream (stack layer 8, the innermost service): the parsed request goes
//! out as JSON with its unused fields unchanged, and the upstream's response streams back
//! event by event (chunk by chunk for a plain body) as it arrives.
//!
//! - [`upstream`]: where requests go (the bundled engine, or OpenAI-compatible URLs).
//! - [`replicas`]: several OpenAI-compatible replicas: balancing, health, saturation.
//! - [`client`]: the HTTP(S) client to upstreams.
//! - [`connection`]: telling a pooled connection the upstream closed from a fresh one.
//! - [`service`]: the forwarding service.
//! - `idle`: the response body on its way back: the idle timeout, whole events, and the
//!   replica's health from how the stream ended.

pub mod client;
mod connection;
mod idle;
pub mod replicas;
mod service;
pub mod upstream;

#[cfg(test)]
mod tests;

pub use client::{http_client, HttpClient};
pub use replicas::ReplicaPool;
pub use service::Forward;
pub use upstream::{BundledUpstream, StaticUpstream, Target, Upstream};
